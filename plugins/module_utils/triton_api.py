# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The HTTP transport: Triton's shared-memory and health APIs over HTTP(S).

Private to the tritonops.shm collection: no stability promise to other code.
TritonClient implements client.Client for ``http://`` and ``https://`` URLs (and URLs without a
scheme). It owns the requests session, timeouts, TLS, headers and the region names in URL paths,
and turns every failure into a TritonError whose message names the URL. For bulk work
use_keep_alive() switches plain http to one kept-alive connection read by http_reader.

Every request is bounded as a whole: ``timeout`` seconds from connecting to the last byte of the answer
(a server trickling its answer is cut at that deadline), and at most client.MAX_ANSWER_BYTES of body
(a larger answer fails naming the URL), on each path: requests, the kept-alive connection and the bulk
selector path.
"""
from __future__ import annotations

import json
import selectors
import socket
import string
import threading
import time
import traceback

from collections.abc import Iterable, Iterator
from typing import Any

from ansible_collections.tritonops.shm.plugins.module_utils.client import (
    HTTP, MAX_ANSWER_BYTES, Answer, Client, Library, UnregisterBatch, check_kind, check_metadata, check_regions,
    error_from_answer, host_port, index_entry, short, snippet, split_url,
)
from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError, UnaddressableName
from ansible_collections.tritonops.shm.plugins.module_utils.http_reader import HttpError, ResponseReader

REQUESTS_IMPORT_ERROR = None
try:
    import requests
    HAS_REQUESTS = True
except ImportError:
    HAS_REQUESTS = False
    REQUESTS_IMPORT_ERROR = traceback.format_exc()


# Characters a URL path segment may carry as they are (RFC 3986 pchar, plus '%' kept raw).
_SEGMENT_SAFE = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%")
_KIND_ROOT = {'system': 'systemsharedmemory', 'cuda': 'cudasharedmemory'}

# Bulk unregisters go over this many kept-alive connections at once, one request in flight on each
# (Triton 2.51 does not answer pipelined requests). One by default: when the server stalls part-way,
# every request in flight may have been done with its answer lost, and a lost answer leaves an
# unregistered file that a rerun with stale=true no longer claims (measured: 4 of 4 with 4 connections;
# tests/integration/test_triton_shm_region.py allows one). The saving over http.client comes from the
# one-thread parse (docs/performance.md).
BULK_CONNECTIONS = 1
# fewer regions than this are unregistered one after the other on the one kept-alive connection
BULK_MIN = 8


def region_segment(name: str) -> str:
    """The region name as a URL path segment, sent byte for byte.

    Triton's HTTP endpoint does not percent-decode region names: registering
    ``a%20b`` creates a region literally named ``a%20b``. So a name is sent as it
    is, and a name with characters a path segment cannot carry (space, ``#``,
    ``?``, ``/``, non-ASCII, controls) cannot be addressed over HTTP at all
    (such regions can only come from gRPC clients, and a ``grpc://`` URL handles
    them, see triton_grpc): that raises UnaddressableName before anything is sent.
    """
    bad = sorted({c for c in name if c not in _SEGMENT_SAFE})
    if not name or bad:
        chars = ', '.join(repr(c) for c in bad) or 'nothing'
        raise UnaddressableName(f"region name {name!r} cannot be addressed over Triton's HTTP API: it contains {chars}, and "
                                "Triton does not decode percent-encoding in region names (use names of letters, digits and "
                                "-._~ only). Such a region comes from a gRPC client: a grpc:// URL of the same server (its "
                                "gRPC port, 8001 by default) can unregister and clean it")
    return name


def model_segment(name: str) -> str:
    """A model name as a URL path segment: sent as it is, like region names (see region_segment)."""
    bad = sorted({c for c in name if c not in _SEGMENT_SAFE})
    if not name or bad:
        chars = ', '.join(repr(c) for c in bad) or 'nothing'
        raise UnaddressableName(f"model name {name!r} cannot be addressed over Triton's HTTP API: it contains {chars}; "
                                "a grpc:// URL of the same server can")
    return name


def region_path(kind: str, name: str) -> str:
    """The URL path of one region (see region_segment)."""
    return f'/v2/{_kind_root(kind)}/region/{region_segment(name)}'


def _kind_root(kind: str) -> str:
    return _KIND_ROOT[check_kind(kind)]


class TritonClient(Client):
    """HTTP(S) client for one Triton server, one requests session per module run."""

    transport = HTTP

    def __init__(self, url: str, timeout: float = 10.0, validate_certs: bool = True, ca_path: str | None = None,
                 headers: dict | None = None, client_cert: str | None = None, client_key: str | None = None) -> None:
        if not HAS_REQUESTS:
            raise RuntimeError('requests is required')
        url = (url or '').strip()
        if '://' not in url:
            url = f'http://{url}'
        parsed = split_url(url, ('http', 'https'), f'url {url!r} is not an http(s) URL of a Triton server '
                                                   '(e.g. http://127.0.0.1:8000; grpc://127.0.0.1:8001 for gRPC)')
        self.base = url.rstrip('/')
        self.host = parsed.host
        self.port = parsed.port or (443 if parsed.scheme == 'https' else 80)
        self.scheme = parsed.scheme
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({'Accept': 'application/json'})
        self.session.headers.update({str(k): str(v) for k, v in (headers or {}).items()})
        if ca_path and validate_certs:
            self.session.verify = ca_path
        else:
            self.session.verify = bool(validate_certs)
        if client_cert:
            self.session.cert = (client_cert, client_key) if client_key else client_cert
        self.requests_made = 0
        self._keep_alive: _KeepAlive | None = None

    @classmethod
    def library(cls) -> Library:
        return Library('requests', REQUESTS_IMPORT_ERROR)

    def use_keep_alive(self) -> bool:
        """Send the following requests over one persistent plain connection, when nothing needs requests.

        For bulk work (a thousand unregisters): requests' per-call machinery costs several times a
        loopback request. Applies to http:// URLs that no proxy setting covers; https and proxied URLs
        keep going through requests. Returns True when the keep-alive connection is used.
        """
        if self.scheme != 'http' or (self.session.trust_env and requests.utils.get_environ_proxies(self.base)):
            return False
        headers = dict(self.session.headers)
        headers['Accept-Encoding'] = 'identity'   # answers are read as they come, never decompressed
        if not _KeepAlive.usable_headers(headers):
            return False
        self._keep_alive = _KeepAlive(self.host, self.port, self.timeout, headers)
        return True

    def close(self) -> None:
        """Close the kept-alive connection and the session's pooled ones (a later request connects again)."""
        if self._keep_alive is not None:
            self._keep_alive.close()
        self.session.close()

    # -- transport -----------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, what: str | None = None,
                expect_json: bool = True) -> tuple[int, Any]:
        """Send one request; return (status, decoded JSON or None). Raise TritonError on any failure."""
        self.requests_made += 1
        return self._send(method, path, body, what, expect_json, self._keep_alive)

    def _send(self, method: str, path: str, body: dict | None, what: str | None, expect_json: bool,
              keep_alive: _KeepAlive | None) -> tuple[int, Any]:
        """request() over keep_alive (None: the requests session), without counting it."""
        url = self.base + path
        what = what or f'{method} {path}'
        data = headers = None
        if body is not None:
            data = json.dumps(body)
            headers = {'Content-Type': 'application/json'}
        try:
            if keep_alive is not None:
                resp = keep_alive.send(method, path, data, headers)
            else:
                resp = self._via_requests(method, url, data, headers)
        except HttpError as exc:
            raise self.error(f'{what} at {url}: {exc}', url) from exc
        except requests.exceptions.SSLError as exc:
            raise self.error(f'{what} at {url}: TLS verification failed: {exc}', url) from exc
        except requests.exceptions.ConnectTimeout as exc:
            raise self.error(f'{what} at {url}: connection timed out after {self.timeout}s: {exc}', url) from exc
        except requests.exceptions.ReadTimeout as exc:
            raise self.error(f'{what} at {url}: no answer within {self.timeout}s (timeout)', url) from exc
        except requests.exceptions.ConnectionError as exc:
            raise self.error(f'{what} at {url}: cannot connect to Triton (refused or unreachable): {short(exc)}', url) from exc
        except requests.exceptions.RequestException as exc:
            raise self.error(f'{what} at {url}: request failed: {short(exc)}', url) from exc
        except OSError as exc:
            # requests raises a bare OSError for a ca_path / client_cert it cannot read
            raise self.error(f'{what} at {url}: {short(exc)}', url) from exc
        return self._decode(resp, what, url, expect_json)

    def _via_requests(self, method: str, url: str, data: str | None, headers: dict | None) -> _Response:
        """One request through the requests session, within self.timeout as a whole and MAX_ANSWER_BYTES of body.

        requests bounds each wait for bytes, not the whole answer: a worker thread sends and reads, and the
        caller waits for it until the deadline (a worker still reading a trickle then is left to its own
        per-read timeout; it holds no more than the cap).
        """
        prepared = self.session.prepare_request(requests.Request(method, url, data=data, headers=headers))
        prepared.url = url  # byte for byte: requests would re-quote the path (e.g. turn %41 into A)
        # verify/cert passed explicitly: otherwise REQUESTS_CA_BUNDLE would override ca_path and validate_certs=false
        settings = self.session.merge_environment_settings(url, {}, None, self.session.verify, self.session.cert)
        settings['stream'] = True     # the body is read here, up to the cap
        deadline = time.monotonic() + self.timeout
        out: list = []

        def work() -> None:
            try:
                resp = self.session.send(prepared, timeout=self.timeout, **settings)
                try:
                    length = resp.headers.get('Content-Length') or ''
                    if length.isdigit() and int(length) > MAX_ANSWER_BYTES:
                        raise HttpError(f'the answer is larger than {MAX_ANSWER_BYTES} bytes (Content-Length {length})')
                    body = bytearray()
                    for part in resp.iter_content(65536):
                        body += part
                        if len(body) > MAX_ANSWER_BYTES:
                            raise HttpError(f'the answer is larger than {MAX_ANSWER_BYTES} bytes')
                        if time.monotonic() > deadline:
                            raise requests.exceptions.ReadTimeout('the whole answer took longer than the timeout')
                finally:
                    resp.close()
                out.append(_Response(resp.status_code, resp.reason, bytes(body)))
            except BaseException as exc:  # pylint: disable=broad-except  # re-raised by the caller
                out.append(exc)

        worker = threading.Thread(target=work, name='tritonops-shm-http', daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if not out:
            raise requests.exceptions.ReadTimeout('the whole answer took longer than the timeout')
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    def _decode(self, resp: Any, what: str, url: str, expect_json: bool) -> tuple[int, Any]:
        data = None
        decode_error = None
        if resp.content:
            try:
                data = resp.json()
            except ValueError as exc:
                decode_error = exc
        if resp.status_code >= 400:
            server_error = None
            if isinstance(data, dict) and isinstance(data.get('error'), str):
                server_error = data['error']
            raise error_from_answer(f'{what} at {url}', f'HTTP {resp.status_code}',
                                    server_error or snippet(resp.text) or resp.reason, server_error,
                                    url=url, status=resp.status_code, transport=self.transport)
        if expect_json and decode_error is not None:
            raise TritonError(f'{what} at {url}: the response is not Triton JSON (is another web server on this port?): '
                              f'{snippet(resp.text)}', url=url, status=resp.status_code, transport=self.transport)
        return resp.status_code, data

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
            raise self.error(f'read server metadata at {url}: the response is not Triton server metadata: '
                             f'{snippet(json.dumps(data))}', url)
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
            raise self.error(f'read the model repository index at {url}: expected a JSON list of models, got '
                             f'{snippet(json.dumps(data))}', url)
        return [index_entry(m['name'], m.get('version'), m.get('state'), m.get('reason')) for m in data]

    def model_config(self, name: str) -> dict:
        """GET /v2/models/NAME/config."""
        _status, data = self.request('GET', f'/v2/models/{model_segment(name)}/config', what=f"read the config of model '{name}'")
        if not isinstance(data, dict) or 'name' not in data:
            url = f'{self.base}/v2/models/{name}/config'
            raise self.error(f"read the config of model '{name}' at {url}: not a model configuration: "
                             f'{snippet(json.dumps(data))}', url)
        return data

    def load_model(self, name: str, config: dict | None = None, timeout: float | None = None) -> None:
        """POST /v2/repository/models/NAME/load, answered when the model (every version) is loaded."""
        body = {} if config is None else {'parameters': {'config': json.dumps(config)}}
        saved, self.timeout = self.timeout, timeout or self.timeout
        try:
            self.request('POST', f'/v2/repository/models/{model_segment(name)}/load', body=body,
                         what=f"load model '{name}'", expect_json=False)
        finally:
            self.timeout = saved

    # -- shared memory --------------------------------------------------------------

    def status(self, kind: str) -> list[dict]:
        return self._json_list(kind, f'/v2/{_kind_root(kind)}/status', f'read {kind} shared memory status')

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        body = {'key': key, 'offset': offset, 'byte_size': byte_size}
        self.request('POST', f"{region_path('system', name)}/register", body=body,
                     what=f"register system region '{name}'", expect_json=False)

    def register_cuda(self, name: str, raw_handle_b64: str, device_id: int, byte_size: int) -> None:
        body = {'raw_handle': {'b64': raw_handle_b64}, 'device_id': device_id, 'byte_size': byte_size}
        self.request('POST', f"{region_path('cuda', name)}/register", body=body,
                     what=f"register cuda region '{name}'", expect_json=False)

    def unregister(self, kind: str, name: str) -> None:
        self.request('POST', f'{region_path(kind, name)}/unregister',
                     what=f"unregister {kind} region '{name}'", expect_json=False)

    def unregister_many(self, kind: str, names: Iterable[str]) -> UnregisterBatch:
        """Over the kept-alive connection: BULK_CONNECTIONS connections at once (order does not matter to Triton)."""
        names = list(names)
        if self._keep_alive is None or len(names) < BULK_MIN:
            return UnregisterBatch(self, kind, names)
        return _SelectorUnregister(self, kind, names)


class _Conn:
    """One connection of a _SelectorUnregister: its socket, its reader, the region it waits for and until when."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.reader = ResponseReader(MAX_ANSWER_BYTES)
        self.name: str | None = None
        self.request = b''
        self.deadline = 0.0       # the answer must be whole by then (time.monotonic)
        self.reused = False      # an answer came over this socket already (the server may close it when idle)
        self.retried = False


def _parse_answer(buf: bytes) -> tuple[int, str, bytes, bool, int] | None:
    """(status, reason, body, close, length used) of the first complete HTTP/1.x answer in buf; None while incomplete.

    Read by http_reader (strict: CRLF, bounds, MAX_ANSWER_BYTES). An answer whose body runs to the end of the
    connection is given with the body not read (b'') and close set. ValueError (http_reader.HttpError) when buf
    is not an HTTP answer.
    """
    reader = ResponseReader(MAX_ANSWER_BYTES)
    resp = reader.feed(buf)
    if resp is not None:
        return resp.status, resp.reason, resp.body, not resp.keep_alive, len(buf) - len(reader.leftover)
    if reader.until_close:
        return reader.status, reader.reason, b'', True, len(buf)
    return None


class _SelectorUnregister(UnregisterBatch):
    """Unregisters over BULK_CONNECTIONS kept-alive connections at once, one request in flight on each, in one thread.

    Triton 2.51 does not answer pipelined requests, and threads cost more Python than they save on a loaded host
    (docs/performance.md): one thread waits on all the connections (selectors) and sends the next request on
    whichever answered. Answers are parsed here (status line, headers, Content-Length or chunked body); an error
    answer becomes the TritonError request() would raise. An idle connection the server closed is opened again
    and its request sent once more (unregister is idempotent), as _KeepAlive does.
    """

    def __init__(self, client: TritonClient, kind: str, names: list[str]) -> None:
        super().__init__(client, kind, names)
        keep_alive = client._keep_alive  # pylint: disable=protected-access
        self._address = (keep_alive.host, keep_alive.port)
        self._timeout = keep_alive.timeout
        lines = ''.join(f'{k}: {v}\r\n' for k, v in keep_alive.headers.items())
        self._tail = (f' HTTP/1.1\r\nHost: {host_port(keep_alive.host, keep_alive.port)}\r\n{lines}'
                      'Content-Length: 0\r\n\r\n').encode('ascii')
        self._names = iter(self.names)
        self._sel = selectors.DefaultSelector()

    def _what(self, name: str) -> str:
        return f"unregister {self.kind} region '{name}'"

    def _failure(self, name: str, text: str) -> Answer:
        url = f'{self.client.base}{region_path(self.kind, name)}/unregister'
        return Answer(name, self.client.error(f'{self._what(name)} at {url}: {text}', url))

    def _close(self, conn: _Conn) -> None:
        if conn.sock is not None:
            self._sel.unregister(conn.sock)
            conn.sock.close()
            conn.sock = None
        conn.reader.start()
        conn.reused = False

    def _send(self, conn: _Conn) -> Answer | None:
        """Send conn.request (connecting first when needed); an Answer when it could not be sent."""
        try:
            conn.reader.start()
            if conn.sock is None:
                conn.sock = socket.create_connection(self._address, timeout=max(0.001, conn.deadline - time.monotonic()))
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            conn.sock.sendall(conn.request)
        except OSError as exc:
            fresh = not conn.reused
            self._close(conn)
            if fresh or conn.retried:
                return self._failure(conn.name, f'cannot connect to Triton (refused or unreachable): {short(exc)}')
            conn.retried = True
            return self._send(conn)
        return None

    def _next(self, conn: _Conn) -> Iterator[Answer]:
        """Send the next name's unregister on conn (none after stop()); names a path cannot carry are answered at once."""
        while not self.stopped:
            name = next(self._names, None)
            if name is None:
                break
            try:
                path = f'{region_path(self.kind, name)}/unregister'
            except UnaddressableName as exc:
                yield Answer(name, exc)
                continue
            conn.name, conn.request, conn.retried = name, f'POST {path}'.encode('ascii') + self._tail, False
            conn.deadline = time.monotonic() + self._timeout
            failed = self._send(conn)
            if failed is None:
                return
            yield failed
            return
        self._close(conn)

    def _read(self, conn: _Conn) -> Iterator[Answer]:
        try:
            data = conn.sock.recv(65536)
        except OSError as exc:
            data, error = b'', short(exc)
        else:
            error = 'the server closed the connection'
        try:
            if data:
                resp = conn.reader.feed(data)
            elif conn.reader.seen:
                resp = conn.reader.eof()     # the end of an answer that runs to the close, or HttpError: cut short
            else:
                resp = None
        except HttpError as exc:
            self._close(conn)
            yield self._failure(conn.name, str(exc))
            return
        if not data and resp is None:
            if conn.reused and not conn.retried:
                self._close(conn)
                conn.retried = True
                failed = self._send(conn)
                if failed is not None:
                    yield failed
                return
            self._close(conn)
            yield self._failure(conn.name, f'cannot connect to Triton (refused or unreachable): {error}')
            return
        if resp is None:
            return
        conn.reused = True
        if not resp.keep_alive or conn.reader.leftover or not data:
            self._close(conn)     # closed by the server, or bytes nobody asked for: this connection is done
        answer = Answer(conn.name, None)
        if resp.status >= 300:
            url = f'{self.client.base}{region_path(self.kind, conn.name)}/unregister'
            try:
                self.client._decode(_Response(resp.status, resp.reason, resp.body), self._what(conn.name), url, False)  # pylint: disable=protected-access
            except TritonError as exc:
                answer = Answer(conn.name, exc)
        self.client.requests_made += 1
        yield answer
        yield from self._next(conn)

    def __iter__(self) -> Iterator[Answer]:
        conns = [_Conn() for _i in range(min(BULK_CONNECTIONS, len(self.names)))]
        try:
            for conn in conns:
                yield from self._next(conn)
            while self._sel.get_map():
                waiting = [key.data for key in self._sel.get_map().values()]
                wait = min(conn.deadline for conn in waiting) - time.monotonic()
                events = self._sel.select(max(0.0, wait)) if wait > 0 else []
                if not events:     # each request is bounded as a whole: a trickling answer is cut at its deadline
                    for conn in waiting:
                        self._close(conn)
                        yield self._failure(conn.name, f'no answer within {self._timeout}s (timeout)')
                    return
                for key, _mask in events:
                    if key.data.sock is not None:
                        yield from self._read(key.data)
        finally:
            for conn in conns:
                self._close(conn)
            self._sel.close()


class _Response:
    """The parts of a requests.Response that TritonClient reads, for the keep-alive connection."""

    def __init__(self, status_code: int, reason: str, content: bytes) -> None:
        self.status_code = status_code
        self.reason = reason
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode('utf-8', 'replace')

    def json(self) -> Any:
        return json.loads(self.content.decode('utf-8'))


class _KeepAlive:
    """One persistent plain HTTP/1.1 connection for bulk calls: a socket, and answers read by http_reader.

    requests costs about 0.4 ms of Python per call, several times a loopback request to Triton. Each
    request is bounded as a whole (timeout seconds from connecting to the answer's last byte) and its
    body by MAX_ANSWER_BYTES. Failures are raised as the requests exceptions they correspond to (and
    http_reader.HttpError for an answer that is not HTTP or too large), so TritonClient.request reports
    them exactly as for requests.
    """

    def __init__(self, host: str, port: int, timeout: float, headers: dict) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.headers = {k: v for k, v in headers.items()
                        if k.lower() not in ('host', 'content-length', 'connection', 'transfer-encoding')}
        self._head = ''.join(f'{k}: {v}\r\n' for k, v in self.headers.items())
        self.sock: socket.socket | None = None
        self.reader = ResponseReader(MAX_ANSWER_BYTES)

    @staticmethod
    def usable_headers(headers: dict) -> bool:
        """Header names and values that can be sent as they are (no line breaks, ASCII)."""
        for k, v in headers.items():
            text = f'{k}{v}'
            if '\r' in text or '\n' in text or any(ord(c) > 126 for c in text):
                return False
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def send(self, method: str, path: str, data: str | bytes | None = None, headers: dict | None = None) -> _Response:
        if any(c in path for c in ' \r\n\t') or not path.startswith('/'):
            raise requests.exceptions.InvalidURL(f'invalid request path {path!r}')
        body = data.encode('utf-8') if isinstance(data, str) else (data or b'')
        extra = ''.join(f'{k}: {v}\r\n' for k, v in (headers or {}).items())
        request = (f'{method} {path} HTTP/1.1\r\nHost: {host_port(self.host, self.port)}\r\n{self._head}{extra}'
                   f'Content-Length: {len(body)}\r\n\r\n').encode('latin-1') + body
        deadline = time.monotonic() + self.timeout
        for attempt in (1, 2):
            fresh = self.sock is None
            try:
                return self._exchange(request, deadline)
            except _Stale as exc:
                # an idle kept-alive connection the server closed: reconnect once (Triton's
                # shared-memory calls are idempotent: register of an existing spec, unregister)
                self.close()
                if fresh or attempt == 2:
                    raise requests.exceptions.ConnectionError(exc.__cause__ or exc) from exc
            except socket.timeout as exc:
                self.close()
                raise requests.exceptions.ReadTimeout('read timed out') from exc
            except HttpError:
                self.close()
                raise
            except OSError as exc:
                self.close()
                raise requests.exceptions.ConnectionError(exc) from exc
        raise AssertionError('unreachable')

    def _exchange(self, request: bytes, deadline: float) -> _Response:
        """Send request and read its answer by deadline (socket.timeout after it); _Stale when the server closed first."""
        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout('the whole answer took longer than the timeout')
            return remaining
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=left())
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = self.reader
        reader.start()
        try:
            self.sock.settimeout(left())
            self.sock.sendall(request)
            while True:
                self.sock.settimeout(left())
                data = self.sock.recv(65536)
                if not data:
                    if not reader.seen:
                        raise _Stale('the server closed the connection')
                    resp = reader.eof()
                    self.close()
                    break
                resp = reader.feed(data)
                if resp is not None:
                    if not resp.keep_alive or reader.leftover:
                        self.close()
                    break
        except (BrokenPipeError, ConnectionResetError) as exc:
            if reader.seen:
                raise
            raise _Stale(str(exc)) from exc
        return _Response(resp.status, resp.reason, resp.body)


class _Stale(OSError):
    """The server closed the kept-alive connection before any byte of the answer."""
