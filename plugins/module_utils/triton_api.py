# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The HTTP transport: Triton's shared-memory and health APIs over HTTP(S).

Private to the tritonops.shm collection: no stability promise to other code.
TritonClient implements client.Client for ``http://`` and ``https://`` URLs (and URLs without a
scheme). It owns the requests session, timeouts, TLS, headers and the region names in URL paths,
and turns every failure into a TritonError whose message names the URL. For bulk work
use_keep_alive() switches plain http to one kept-alive ``http.client`` connection.
"""
from __future__ import annotations

import json
import queue
import socket
import string
import threading
import traceback

from collections.abc import Iterable, Iterator
from http import client as http_client
from typing import Any

from ansible_collections.tritonops.shm.plugins.module_utils.client import (
    HTTP, Answer, Client, Library, UnregisterBatch, check_kind, error_from_answer, short, snippet, split_url,
)
from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError, UnaddressableName

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

# Bulk unregisters go over this many kept-alive connections at once (Triton's HTTP server answers on
# several worker threads; 2.51 does not answer pipelined requests): docs/performance.md has the figures.
BULK_CONNECTIONS = 4
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
                prepared = self.session.prepare_request(requests.Request(method, url, data=data, headers=headers))
                prepared.url = url  # byte for byte: requests would re-quote the path (e.g. turn %41 into A)
                # verify/cert passed explicitly: otherwise REQUESTS_CA_BUNDLE would override ca_path and validate_certs=false
                settings = self.session.merge_environment_settings(url, {}, None, self.session.verify, self.session.cert)
                resp = self.session.send(prepared, timeout=self.timeout, **settings)
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

    def _json_list(self, path: str, what: str) -> list[dict]:
        _status, data = self.request('GET', path, what=what)
        if not isinstance(data, list) or not all(isinstance(i, dict) for i in data):
            url = self.base + path
            raise self.error(f'{what} at {url}: expected a JSON list of regions, got {snippet(json.dumps(data))}', url)
        return data

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
        return data

    def _health(self, which: str) -> bool:
        """GET /v2/health/live or /ready: 200 is live/ready (a 4xx/5xx answer raises, so: not)."""
        status, _data = self.request('GET', f'/v2/health/{which}', what=f'health {which}', expect_json=False)
        return status == 200

    # -- shared memory --------------------------------------------------------------

    def status(self, kind: str) -> list[dict]:
        return self._json_list(f'/v2/{_kind_root(kind)}/status', f'read {kind} shared memory status')

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
        return _ConcurrentUnregister(self, kind, names)


class _ConcurrentUnregister(UnregisterBatch):
    """Unregisters sent by BULK_CONNECTIONS threads, each over its own kept-alive connection.

    Each thread takes the next name, sends its unregister and hands the answer to the iterating thread,
    which alone counts requests and hands the answers on: what is done with an answer (the in-use retry,
    the files) stays in one thread. stop() lets each thread finish the request it is sending.
    """

    def __init__(self, client: TritonClient, kind: str, names: list[str]) -> None:
        super().__init__(client, kind, names)
        self._next = iter(self.names)
        self._take = threading.Lock()
        self._answers: queue.SimpleQueue = queue.SimpleQueue()

    def _name(self) -> str | None:
        with self._take:
            return None if self.stopped else next(self._next, None)

    def _work(self, conn: _KeepAlive) -> None:
        client, kind = self.client, self.kind
        try:
            while True:
                name = self._name()
                if name is None:
                    return
                try:
                    client._send('POST', f'{region_path(kind, name)}/unregister', None,
                                 f"unregister {kind} region '{name}'", False, conn)  # pylint: disable=protected-access
                except TritonError as exc:
                    self._answers.put(Answer(name, exc))
                else:
                    self._answers.put(Answer(name, None))
        finally:
            conn.close()
            self._answers.put(None)

    def __iter__(self) -> Iterator[Answer]:
        template = self.client._keep_alive  # pylint: disable=protected-access
        threads = [threading.Thread(target=self._work, daemon=True,
                                    args=(_KeepAlive(template.host, template.port, template.timeout, template.headers),))
                   for _i in range(min(BULK_CONNECTIONS, len(self.names)))]
        for thread in threads:
            thread.start()
        running = len(threads)
        try:
            while running:
                answer = self._answers.get()
                if answer is None:
                    running -= 1
                    continue
                self.client.requests_made += 1
                yield answer
        finally:
            self.stop()
            for thread in threads:
                thread.join()


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
    """One persistent plain HTTP/1.1 connection (the standard library's http.client), for bulk calls.

    requests costs about 0.4 ms of Python per call, several times a loopback request to Triton;
    http.client over one kept-alive connection costs what tritonclient does. Failures are raised
    as the requests exceptions they correspond to, so TritonClient.request reports them exactly
    as for requests.
    """

    def __init__(self, host: str, port: int, timeout: float, headers: dict) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.headers = {k: v for k, v in headers.items()
                        if k.lower() not in ('host', 'content-length', 'connection', 'transfer-encoding')}
        self.conn: http_client.HTTPConnection | None = None

    @staticmethod
    def usable_headers(headers: dict) -> bool:
        """Header names and values http.client can send as they are (no line breaks, ASCII)."""
        for k, v in headers.items():
            text = f'{k}{v}'
            if '\r' in text or '\n' in text or any(ord(c) > 126 for c in text):
                return False
        return True

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def send(self, method: str, path: str, data: str | bytes | None = None, headers: dict | None = None,
             _retried: bool = False) -> _Response:
        if any(c in path for c in ' \r\n\t') or not path.startswith('/'):
            raise requests.exceptions.InvalidURL(f'invalid request path {path!r}')
        fresh = self.conn is None
        if fresh:
            self.conn = http_client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        body = data.encode('utf-8') if isinstance(data, str) else (data or b'')
        hdrs = dict(self.headers)
        hdrs.update(headers or {})
        hdrs['Content-Length'] = str(len(body))
        try:
            self.conn.request(method, path, body=body, headers=hdrs)
            resp = self.conn.getresponse()
            content = resp.read()
        except socket.timeout as exc:
            self.close()
            raise requests.exceptions.ReadTimeout('read timed out') from exc
        except (http_client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            # an idle kept-alive connection the server closed: reconnect once (Triton's
            # shared-memory calls are idempotent: register of an existing spec, unregister)
            self.close()
            if fresh or _retried:
                raise requests.exceptions.ConnectionError(exc) from exc
            return self.send(method, path, data, headers, _retried=True)
        except (OSError, http_client.HTTPException) as exc:
            self.close()
            raise requests.exceptions.ConnectionError(exc) from exc
        if resp.will_close:
            self.close()
        return _Response(resp.status, resp.reason, content)
