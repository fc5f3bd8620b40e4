# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The HTTP transport: Triton's shared-memory, health and repository APIs over HTTP(S), standard library only.

Private to the tritonops.shm collection: no stability promise to other code.
TritonClient implements client.Client for ``http://`` and ``https://`` URLs (and URLs without a
scheme). It owns one kept-alive HTTP/1.1 connection (a socket, wrapped in TLS for https, through an
HTTP proxy when the environment names one), the timeouts, the headers and the region names in URL
paths; every answer is read by http_reader (strict HTTP/1.1), and every failure becomes a TritonError
whose message names the URL. There is one path: single calls and a bulk unregister of thousands of
regions go over the same connection, one request in flight (Triton 2.51 does not answer pipelined
requests).

Every request is bounded as a whole: ``timeout`` seconds from connecting to the last byte of the answer
(a server trickling its answer is cut at that deadline), and at most client.MAX_ANSWER_BYTES of body
(a larger answer fails naming the URL, before its bytes are read). A redirect is refused: the URL
must be Triton's own endpoint.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import ssl
import string
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError, UnaddressableName
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.wire import time_limit
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import (
    HTTP,
    MAX_ANSWER_BYTES,
    Answer,
    Client,
    Library,
    UnregisterBatch,
    check_metadata,
    check_regions,
    error_from_answer,
    host_port,
    index_entry,
    record_kind,
    short,
    snippet,
    split_url,
    wire_of,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import (
    WireConfig,
    hide,
    http_headers,
    secrets,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.http_reader import (
    HttpError,
    Response,
    ResponseReader,
    escape,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.tls import TlsFileError, loaded_context

# Characters a URL path segment may carry as they are (RFC 3986 pchar, plus '%' kept raw).
_SEGMENT_SAFE = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%")


def region_segment(name: str) -> str:
    """The region name as a URL path segment, sent byte for byte.

    Triton's HTTP endpoint does not percent-decode region names: registering
    ``a%20b`` creates a region literally named ``a%20b``. So a name is sent as it
    is, and a name with characters a path segment cannot carry (space, ``#``,
    ``?``, ``/``, non-ASCII, controls) cannot be addressed over HTTP at all
    (such regions can only come from gRPC clients, and a ``grpc://`` URL handles
    them, see triton_grpc): that raises UnaddressableName before anything is sent.
    """
    if name and _SEGMENT_SAFE.issuperset(name):
        return name
    bad = sorted({c for c in name if c not in _SEGMENT_SAFE})
    if not name or bad:
        chars = ', '.join(repr(c) for c in bad) or 'nothing'
        raise UnaddressableName(
            f"region name {name!r} cannot be addressed over Triton's HTTP API: it contains {chars}, and "
            'Triton does not decode percent-encoding in region names (use names of letters, digits and '
            '-._~ only). Such a region comes from a gRPC client: a grpc:// URL of the same server (its '
            'gRPC port, 8001 by default) can unregister and clean it'
        )
    return name


def model_segment(name: str) -> str:
    """A model name as a URL path segment: sent as it is, like region names (see region_segment)."""
    bad = sorted({c for c in name if c not in _SEGMENT_SAFE})
    if not name or bad:
        chars = ', '.join(repr(c) for c in bad) or 'nothing'
        raise UnaddressableName(
            f"model name {name!r} cannot be addressed over Triton's HTTP API: it contains {chars}; "
            'a grpc:// URL of the same server can'
        )
    return name


def region_path(kind: str, name: str) -> str:
    """The URL path of one region (see region_segment)."""
    return f'/v2/{_kind_root(kind)}/region/{region_segment(name)}'


def _kind_root(kind: str) -> str:
    return record_kind(kind).http_root


class Proxy(NamedTuple):
    """An HTTP proxy from the environment (http_proxy, https_proxy, all_proxy, no_proxy), as requests and curl read it."""

    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization value for a user:password in the proxy URL


def environment_proxy(scheme: str, host: str, port: int) -> Proxy | None:
    """The proxy the environment names for this URL, None for none (or when no_proxy covers the host).

    Read only when a ``*_proxy`` variable is set: urllib.request (which knows the rules, no_proxy's
    included) is imported only then.
    """
    if not any(name.lower().endswith('_proxy') for name in os.environ):
        return None
    import urllib.request  # pylint: disable=import-outside-toplevel  # only with a proxy variable set

    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme) or proxies.get('all')
    if not url or urllib.request.proxy_bypass_environment(host_port(host, port), proxies):
        return None
    if '://' not in url:
        url = f'http://{url}'
    parts = urlsplit(url)
    if parts.scheme.lower() != 'http' or not parts.hostname:
        raise TritonError(
            f'the {scheme}_proxy of the environment is not an http:// proxy URL; only HTTP proxies are '
            'supported (unset it, or list the Triton host in no_proxy)'
        )
    authorization = None
    if parts.username is not None:
        credentials = f'{unquote(parts.username)}:{unquote(parts.password or "")}'.encode()
        authorization = 'Basic ' + base64.b64encode(credentials).decode('ascii')
    return Proxy(parts.hostname, parts.port or 80, authorization)


class _Stale(OSError):
    """The server closed the kept-alive connection before any byte of the answer (it may do so when idle)."""


class _Timeout(OSError):
    """The deadline of the request passed; ``connecting`` when no connection was made by then."""

    def __init__(self, connecting: bool) -> None:
        super().__init__('timeout')
        self.connecting = connecting


class Connection:
    """One kept-alive HTTP/1.1 connection to one server (plain or TLS, direct or through a proxy); one request at a time.

    exchange() sends a request and reads its answer with http_reader by a deadline. An idle connection that the
    server closed is opened again and the request sent once more (Triton's shared-memory calls are idempotent:
    unregister, and register of a spec it has). Raises _Timeout, HttpError, ssl.SSLError or OSError; the caller
    turns each into a TritonError.
    """

    def __init__(self, host: str, port: int, tls: Any, proxy: Proxy | None, hidden: Sequence[str] = ()) -> None:
        self.host = host
        self.port = port
        self.tls = tls  # a callable returning the ssl.SSLContext (built at the first connect), or None
        self.proxy = proxy
        self.sock: socket.socket | None = None
        self.reader = ResponseReader(MAX_ANSWER_BYTES, hidden=hidden)  # hidden: secrets never in its errors

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def exchange(self, request: bytes, deadline: float) -> Response:
        for attempt in (1, 2):
            fresh = self.sock is None
            try:
                return self._exchange(request, deadline)
            except _Stale:
                self.close()
                if fresh or attempt == 2:
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError('unreachable')

    @staticmethod
    def _left(deadline: float, connecting: bool = False) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout(connecting)
        return remaining

    def _connect(self, deadline: float) -> socket.socket:
        address = (self.proxy.host, self.proxy.port) if self.proxy else (self.host, self.port)
        try:
            sock = socket.create_connection(address, timeout=self._left(deadline, True))
        except socket.timeout:
            raise _Timeout(True) from None
        except OSError as exc:
            raise ConnectionError(str(exc)) from exc  # refused, unreachable, no such host: never "stale"
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                if self.proxy is not None:
                    self._tunnel(sock, deadline)
                sock.settimeout(self._left(deadline, True))
                sock = self.tls().wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        return sock

    def _tunnel(self, sock: socket.socket, deadline: float) -> None:
        """CONNECT through the proxy to host:port (https through a proxy); HttpError when the proxy refuses."""
        target = host_port(self.host, self.port)
        auth = f'Proxy-Authorization: {self.proxy.authorization}\r\n' if self.proxy.authorization else ''
        sock.settimeout(self._left(deadline, True))
        sock.sendall(f'CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n'.encode('latin-1'))
        reader = ResponseReader(0)
        while not reader.status:
            sock.settimeout(self._left(deadline, True))
            data = sock.recv(65536)
            if not data:
                raise HttpError('the proxy closed the connection instead of answering CONNECT')
            try:
                reader.feed(data)
            except HttpError:
                if not reader.status:  # a body where a tunnel's answer has none: only the head counts here
                    raise
        if not 200 <= reader.status < 300:
            raise HttpError(f'the proxy refused to connect to {target}: {reader.status} {escape(reader.reason, 80)}')

    def _exchange(self, request: bytes, deadline: float) -> Response:
        reader = self.reader
        reader.start()
        try:
            if self.sock is None:
                self.sock = self._connect(deadline)
            sock = self.sock
            sock.settimeout(self._left(deadline))
            sock.sendall(request)
            while True:
                sock.settimeout(self._left(deadline))
                data = sock.recv(65536)
                if not data:
                    if not reader.seen:
                        raise _Stale('the server closed the connection')
                    resp = reader.eof()
                    self.close()
                    return resp
                resp = reader.feed(data)
                if resp is not None:
                    if not resp.keep_alive or reader.leftover:
                        self.close()  # closed by the server, or bytes nobody asked for: this connection is done
                    return resp
        except socket.timeout:
            raise _Timeout(False) from None
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError) as exc:
            if reader.seen:
                raise
            raise _Stale(str(exc)) from exc


class TritonClient(Client):
    """HTTP(S) client for one Triton server: one kept-alive connection per module run."""

    transport = HTTP

    def __init__(self, url: str | WireConfig, **options: Any) -> None:
        wire = wire_of(url, options)
        url = (wire.url or '').strip()
        if '://' not in url:
            url = f'http://{url}'
        parsed = split_url(
            url,
            ('http', 'https'),
            f'url {url!r} is not an http(s) URL of a Triton server '
            '(e.g. http://127.0.0.1:8000; grpc://127.0.0.1:8001 for gRPC)',
        )
        self.base = url.rstrip('/')
        self.host = parsed.host
        self.port = parsed.port or (443 if parsed.scheme == 'https' else 80)
        self.scheme = parsed.scheme
        self.timeout = wire.timeout
        self.validate_certs = bool(wire.tls.verify)
        self.requests_made = 0
        self._hidden = secrets(
            wire
        )  # never in a message, not even cut short (Ansible's no_log hides whole values only)
        self.proxy = environment_proxy(self.scheme, self.host, self.port)
        self._context: ssl.SSLContext | None = None
        self._tls = wire.tls._replace(verify=self.validate_certs)
        host = (
            host_port(self.host, parsed.port) if parsed.port else (f'[{self.host}]' if ':' in self.host else self.host)
        )
        sent = http_headers(wire._replace(url=url), host, 'application/json')
        if self.proxy is not None and self.proxy.authorization and self.scheme == 'http':
            sent['Proxy-Authorization'] = self.proxy.authorization
        try:
            self._head = ''.join(f'{k}: {v}\r\n' for k, v in sent.items()).encode('latin-1')
        except UnicodeEncodeError:
            raise TritonError(
                'headers: a header name or value has a character HTTP cannot carry (only Latin-1 text); '
                'the value is not shown, nothing was sent',
                url=self.base,
                transport=self.transport,
            ) from None
        # a proxy is sent the whole URL (absolute form); a server or a CONNECT tunnel the path alone
        self._prefix = f'http://{host}' if self.proxy is not None and self.scheme == 'http' else ''
        self._path = parsed.parts.path.rstrip('/')  # a URL with a path (behind a reverse proxy) keeps it
        tls = self._tls_context if self.scheme == 'https' else None
        self._conn = Connection(self.host, self.port, tls, self.proxy, self._hidden)

    @classmethod
    def library(cls) -> Library:
        return Library('Python standard library')  # nothing beyond it

    def _tls_context(self) -> ssl.SSLContext:
        return self._context  # built by _exchange before the first connect

    def use_keep_alive(self) -> bool:
        """Every request already goes over one kept-alive connection (True)."""
        return True

    def close(self) -> None:
        """Close the kept-alive connection (a later request connects again)."""
        self._conn.close()

    # -- transport -----------------------------------------------------------------

    def _request_bytes(self, method: str, path: str, body: bytes | None) -> bytes:
        if any(c in path for c in ' \r\n\t') or not path.startswith('/'):
            raise ValueError(f'invalid request path {path!r}')  # the callers build paths with region_segment
        extra = b'Content-Type: application/json\r\n' if body is not None else b''
        body = body or b''
        return (
            f'{method} {self._prefix}{self._path}{path} HTTP/1.1\r\n'.encode('ascii')
            + self._head
            + extra
            + f'Content-Length: {len(body)}\r\n\r\n'.encode('ascii')
            + body
        )

    def request(
        self, method: str, path: str, body: dict | None = None, what: str | None = None, expect_json: bool = True
    ) -> tuple[int, Any]:
        """Send one request; return (status, decoded JSON or None). Raise TritonError on any failure."""
        self.requests_made += 1
        url = self.base + path
        what = what or f'{method} {path}'
        data = json.dumps(body).encode('utf-8') if body is not None else None
        resp = self._exchange(self._request_bytes(method, path, data), what, url)
        return self._decode(resp, what, url, expect_json)

    def _exchange(self, request: bytes, what: str, url: str) -> Response:
        """The answer to request within self.timeout as a whole; TritonError naming what and url when none came."""
        timeout = time_limit.bound(self.timeout, f'{what} at {url}')  # no later than the call's own time limit
        if self.scheme == 'https' and self._context is None:
            try:
                self._context = loaded_context(*self._tls)
            except TlsFileError as exc:
                raise self.error(f'{what} at {url}: {exc}', url) from exc
        try:
            return self._conn.exchange(request, time.monotonic() + timeout)
        except _Timeout as exc:
            if exc.connecting:
                raise self.error(f'{what} at {url}: connection timed out after {timeout}s', url) from None
            raise self.error(f'{what} at {url}: no answer within {timeout}s (timeout)', url) from None
        except HttpError as exc:
            raise self.error(f'{what} at {url}: {exc}', url) from exc
        except ssl.SSLCertVerificationError as exc:
            raise self.error(f'{what} at {url}: TLS verification failed: {short(exc)}', url) from exc
        except ssl.SSLError as exc:
            hint = ''
            if 'WRONG_VERSION_NUMBER' in str(exc) or 'wrong version number' in str(exc):
                hint = ' (the port does not speak TLS: use http:// for it, or grpc:// for a gRPC port without TLS)'
            raise self.error(f'{what} at {url}: TLS failed: {short(exc)}{hint}', url) from exc
        except (_Stale, ConnectionError, socket.gaierror) as exc:
            hint = ''
            if self.scheme == 'https' and ('UNEXPECTED_EOF' in str(exc) or 'violation of protocol' in str(exc)):
                hint = ' (the server closed the connection in the TLS handshake: if this port serves plain HTTP, use http://)'
            raise self.error(
                f'{what} at {url}: cannot connect to Triton (refused or unreachable): {short(exc)}{hint}', url
            ) from exc
        except OSError as exc:
            raise self.error(
                f'{what} at {url}: cannot connect to Triton (refused or unreachable): {short(exc)}', url
            ) from exc

    def _decode(self, resp: Response, what: str, url: str, expect_json: bool) -> tuple[int, Any]:
        data = None
        decode_error = None
        if resp.body:
            try:
                data = json.loads(resp.body)
            except ValueError as exc:
                decode_error = exc
        status = resp.status
        if status >= 400:
            server_error = None
            if isinstance(data, dict) and isinstance(data.get('error'), str):
                server_error = hide(data['error'], self._hidden)
            raise error_from_answer(
                f'{what} at {url}',
                f'HTTP {status}',
                server_error or _text(resp.body, self._hidden) or hide(resp.reason, self._hidden),
                server_error,
                url=url,
                status=status,
                transport=self.transport,
            )
        if 300 <= status < 400:
            location = _header(resp.headers, b'location')
            to = f' to {escape(location, 200)}' if location else ''
            raise TritonError(
                f'{what} at {url}: HTTP {status}: the server redirects{to}; redirects are not followed: give '
                "the URL of Triton's own HTTP endpoint",
                url=url,
                status=status,
                transport=self.transport,
            )
        if expect_json and decode_error is not None:
            where = (
                ": check the port (Triton's HTTP port is 8000 by default) and the path of any proxy in front of it"
                if _is_html(resp)
                else ''
            )
            raise TritonError(
                f'{what} at {url}: the response is not Triton JSON (is another web server on this port?): '
                f'{_text(resp.body, self._hidden)}{where}',
                url=url,
                status=status,
                transport=self.transport,
            )
        return status, data

    def _json_list(self, kind: str, path: str, what: str) -> list[dict]:
        _status, data = self.request('GET', path, what=what)
        url = self.base + path
        if not isinstance(data, list) or not all(isinstance(i, dict) for i in data):
            raise self.error(f'{what} at {url}: expected a JSON list of regions, got {snippet(json.dumps(data))}', url)
        return check_regions(kind, data, f'{what} at {url}', url, self.transport)

    @staticmethod
    def unaddressable(name: str) -> str | None:
        """None when a region of this name can be addressed over HTTP; else why not (see region_segment)."""
        try:
            region_segment(name)
        except UnaddressableName as exc:
            return exc.msg
        return None

    # -- server ---------------------------------------------------------------------

    def server_metadata(self) -> dict:
        _status, data = self.request('GET', '/v2', what='read server metadata')
        if not isinstance(data, dict) or 'version' not in data:
            url = f'{self.base}/v2'
            raise self.error(
                f'read server metadata at {url}: the response is not Triton server metadata: '
                f'{snippet(json.dumps(data))}',
                url,
            )
        return check_metadata(data, f'read server metadata at {self.base}/v2', f'{self.base}/v2', self.transport)

    def _health(self, which: str) -> bool:
        """GET /v2/health/live or /ready: 200 is live/ready (a 4xx/5xx answer raises, so: not)."""
        status, _data = self.request('GET', f'/v2/health/{which}', what=f'health {which}', expect_json=False)
        return status == 200

    # -- model repository -------------------------------------------------------------

    def repository_index(self) -> list[dict]:
        """POST /v2/repository/index."""
        _status, data = self.request('POST', '/v2/repository/index', body={}, what='read the model repository index')
        if not isinstance(data, list) or not all(isinstance(m, dict) and 'name' in m for m in data):
            url = f'{self.base}/v2/repository/index'
            raise self.error(
                f'read the model repository index at {url}: expected a JSON list of models, got '
                f'{snippet(json.dumps(data))}',
                url,
            )
        return [index_entry(m['name'], m.get('version'), m.get('state'), m.get('reason')) for m in data]

    def model_config(self, name: str) -> dict:
        """GET /v2/models/NAME/config."""
        _status, data = self.request(
            'GET', f'/v2/models/{model_segment(name)}/config', what=f"read the config of model '{name}'"
        )
        if not isinstance(data, dict) or 'name' not in data:
            url = f'{self.base}/v2/models/{name}/config'
            raise self.error(
                f"read the config of model '{name}' at {url}: not a model configuration: {snippet(json.dumps(data))}",
                url,
            )
        return data

    def load_model(self, name: str, config: dict | None = None, timeout: float | None = None) -> None:
        """POST /v2/repository/models/NAME/load, answered when the model (every version) is loaded."""
        body = {} if config is None else {'parameters': {'config': json.dumps(config)}}
        saved, self.timeout = self.timeout, timeout or self.timeout
        try:
            self.request(
                'POST',
                f'/v2/repository/models/{model_segment(name)}/load',
                body=body,
                what=f"load model '{name}'",
                expect_json=False,
            )
        finally:
            self.timeout = saved

    # -- shared memory --------------------------------------------------------------

    def status(self, kind: str) -> list[dict]:
        return self._json_list(kind, f'/v2/{_kind_root(kind)}/status', f'read {kind} shared memory status')

    def register(self, kind: str, name: str, values: dict) -> None:
        body = {n: ({'b64': values[n]} if t == records.HANDLE else values[n]) for n, t in record_kind(kind).register}
        self.request(
            'POST',
            f'{region_path(kind, name)}/register',
            body=body,
            what=f"register {kind} region '{name}'",
            expect_json=False,
        )

    def unregister(self, kind: str, name: str) -> None:
        self.request(
            'POST',
            f'{region_path(kind, name)}/unregister',
            what=f"unregister {kind} region '{name}'",
            expect_json=False,
        )

    def unregister_many(self, kind: str, names: Iterable[str]) -> UnregisterBatch:
        """One after the other over the kept-alive connection (Triton 2.51 does not answer pipelined requests)."""
        return _Unregisters(self, kind, names)


class _Unregisters(UnregisterBatch):
    """A bulk unregister over the client's one connection: what client.unregister does, with the request's constant
    parts built once (thousands of regions: docs/performance.md)."""

    def __iter__(self) -> Iterator[Answer]:
        client, kind = self.client, self.kind
        root = f'/v2/{_kind_root(kind)}/region/'
        first = f'POST {client._prefix}{client._path}{root}'.encode('ascii')  # pylint: disable=protected-access
        rest = b'/unregister HTTP/1.1\r\n' + client._head + b'Content-Length: 0\r\n\r\n'  # pylint: disable=protected-access
        for name in self.names:
            if self.stopped:
                return
            try:
                segment = region_segment(name)
                client.requests_made += 1
                what = f"unregister {kind} region '{name}'"
                url = f'{client.base}{root}{segment}/unregister'
                resp = client._exchange(first + segment.encode('ascii') + rest, what, url)  # pylint: disable=protected-access
                if resp.status >= 300:
                    client._decode(resp, what, url, False)  # pylint: disable=protected-access
            except TritonError as exc:
                yield Answer(name, exc)
            else:
                yield Answer(name, None)


_TAG = re.compile(r'<[^<>]{0,512}>')  # bounded: a hostile page of 4 KiB costs at most a few million steps


def _is_html(resp: Response) -> bool:
    """Whether an answer is an HTML page (its content type, or a body that starts with a tag): Triton answers JSON."""
    return 'html' in _header(resp.headers, b'content-type').lower() or resp.body.lstrip()[:1] == b'<'


def _text(body: bytes, hidden: Sequence[str] = ()) -> str:
    """The start of an answer's body on one line, for a message; an HTML page as its text, without its markup; each
    of hidden shown as ******** before the cut."""
    text = body[:4096].decode('utf-8', 'replace')
    if text.lstrip()[:1] == '<':
        return 'an HTML page: ' + snippet(hide(' '.join(_TAG.sub(' ', text).split()), hidden) or '(no text)')
    return snippet(hide(body.decode('utf-8', 'replace'), hidden))


def _header(headers: bytes, name: bytes) -> str:
    """The value of the header name (lower case) in an answer's checked header lines, '' when absent."""
    for line in headers.split(b'\r\n'):
        key, _sep, value = line.partition(b':')
        if key.strip().lower() == name:
            return value.strip().decode('latin-1')
    return ''
