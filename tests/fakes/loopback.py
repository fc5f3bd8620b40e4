"""Loopback HTTP peers for the tests: one socket server, and the answers a hostile or broken server sends.

A ``Peer`` listens on 127.0.0.1 (optionally with TLS), serves each connection in its own thread, reads the
HTTP/1.1 requests off it and hands each to ``respond(conn, request)``, which writes whatever it wants and
says whether the connection stays open for the next request. The unit tests' fake Triton
(tests/fakes/fake_triton.py) answers through it; the hostile-server tests, unit and integration, hand it the
answers below: a trickle, a body or a chunk that never ends, canned bytes, silence.

Standard library only: the integration tests import it by path (their conftest puts tests/fakes on sys.path),
the unit tests as ``ansible_collections.tritonops.shm.tests.fakes.loopback``.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from typing import Callable, NamedTuple, TypeVar

HEAD_LIMIT = 65536
REASONS = {
    200: 'OK',
    301: 'Moved',
    400: 'Bad Request',
    401: 'Unauthorized',
    403: 'Forbidden',
    404: 'Not Found',
    409: 'Conflict',
    500: 'Internal Server Error',
    501: 'Not Implemented',
    502: 'Bad Gateway',
    503: 'Service Unavailable',
}


class Request(NamedTuple):
    """One request as it came: the head's lines (request line first), its headers as sent, its body, the peer."""

    method: str
    path: str
    version: str
    head: list[str]
    headers: dict[str, str]
    body: bytes
    peer: tuple

    def header(self, name: str) -> str | None:
        """The value of header name, whatever its case."""
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


class Conn:
    """One accepted connection: its socket, the peer's address and the server's stop event."""

    def __init__(self, sock: socket.socket, peer: tuple, stop: threading.Event) -> None:
        self.sock = sock
        self.peer = peer
        self.stop = stop
        self._buf = b''

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_request(self, idle: float | None = None) -> Request | None:
        """The next request, or None when the client closed, idled past idle seconds or sent no HTTP."""
        self.sock.settimeout(idle)
        try:
            while b'\r\n\r\n' not in self._buf:
                part = self.sock.recv(65536)
                if not part or len(self._buf) > HEAD_LIMIT:
                    return None
                self._buf += part
            raw, _sep, self._buf = self._buf.partition(b'\r\n\r\n')
            lines = raw.decode('latin-1').split('\r\n')
            method, path, version = (lines[0].split(' ', 2) + ['', ''])[:3]
            headers = dict(line.split(':', 1) for line in lines[1:] if ':' in line)
            headers = {k.strip(): v.strip() for k, v in headers.items()}
            length = int(next((v for k, v in headers.items() if k.lower() == 'content-length'), 0) or 0)
            while len(self._buf) < length:
                part = self.sock.recv(65536)
                if not part:
                    return None
                self._buf += part
            body, self._buf = self._buf[:length], self._buf[length:]
        except (OSError, ValueError):
            return None
        finally:
            if self.sock.fileno() >= 0:
                self.sock.settimeout(None)
        return Request(method, path, version, [line.strip() for line in lines], headers, body, self.peer)


Respond = Callable[[Conn, Request], bool]
_Server = TypeVar('_Server', bound='Closing')


class Closing:
    """A test server as a context manager: close() on the way out."""

    def __enter__(self: _Server) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class Peer(Closing):
    """An HTTP server on 127.0.0.1: respond(conn, request) answers each request; True keeps the connection open.

    idle: seconds a kept-alive connection may wait for its next request before the server closes it; port: the port
    to listen on (0: one the kernel picks).
    Counts the connections accepted and closed, and keeps every request in ``requests``.
    """

    def __init__(
        self, respond: Respond, tls: ssl.SSLContext | None = None, idle: float | None = None, port: int = 0
    ) -> None:
        self.respond = respond
        self.tls = tls
        self.idle = idle
        self.stop = threading.Event()
        self.requests: list[Request] = []
        self.connections = 0
        self.closed = 0
        self._socks: list[socket.socket] = []
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f'{"https" if self.tls else "http"}://127.0.0.1:{self.port}'

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, peer = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock, peer), daemon=True).start()

    def _serve(self, sock: socket.socket, peer: tuple) -> None:
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            self._socks.append(sock)
            conn = Conn(sock, peer, self.stop)
            while not self.stop.is_set():
                request = conn.read_request(self.idle)
                if request is None:
                    break
                self.requests.append(request)
                if not self.respond(conn, request):
                    break
        except (OSError, ssl.SSLError):
            pass
        finally:
            sock.close()
            self.closed += 1

    def by_connection(self) -> dict[tuple, list[Request]]:
        """The requests, per connection (the client's address)."""
        out: dict[tuple, list[Request]] = {}
        for request in self.requests:
            out.setdefault(request.peer, []).append(request)
        return out

    def close(self) -> None:
        """Stop accepting, wake every answer that waits, and close the open connections."""
        self.stop.set()
        self.sock.close()
        for sock in self._socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# -- answers: what to write ----------------------------------------------------------------------------------


def http_answer(
    status: int = 200,
    body: bytes = b'',
    content_type: str | None = 'application/json',
    headers: tuple = (),
    chunks: int = 0,
) -> bytes:
    """An HTTP/1.1 answer; chunks > 0 sends the body in that many chunks (Transfer-Encoding: chunked)."""
    head = [f'HTTP/1.1 {status} {REASONS.get(status, "Status")}']
    if content_type:
        head.append(f'Content-Type: {content_type}')
    head.extend(headers)
    if chunks:
        step = max(1, -(-len(body) // chunks))
        parts = [body[i : i + step] for i in range(0, len(body), step)]
        head.append('Transfer-Encoding: chunked')
        data = b''.join(b'%x\r\n%s\r\n' % (len(p), p) for p in parts) + b'0\r\n\r\n'
    else:
        head.append(f'Content-Length: {len(body)}')
        data = body
    return ('\r\n'.join(head) + '\r\n\r\n').encode('latin-1') + data


def http_json(body: object, status: int = 200) -> bytes:
    return http_answer(status, json.dumps(body).encode())


# -- answers: hostile ways to write them ---------------------------------------------------------------------


def canned(data: bytes, keep: bool = False) -> Respond:
    """Write data; close the connection after it unless keep."""

    def respond(conn: Conn, _request: Request) -> bool:
        conn.send(data)
        return keep

    return respond


def trickle(data: bytes, every: float) -> Respond:
    """Write data one byte every `every` seconds: each wait is short, the whole never ends in time."""

    def respond(conn: Conn, _request: Request) -> bool:
        for byte in data:
            if conn.stop.wait(every):
                break
            conn.send(bytes([byte]))
        return False

    return respond


def endless(first: bytes, block: bytes = b'x' * 65536, limit: int = 0) -> Respond:
    """Write first, then block until the server stops (or until limit bytes; then, or with no block, stall)."""

    def respond(conn: Conn, _request: Request) -> bool:
        conn.send(first)
        sent = 0
        while block and not conn.stop.is_set() and (not limit or sent < limit):
            conn.send(block)
            sent += len(block)
        conn.stop.wait()
        return False

    return respond


def silent(seconds: float | None = None) -> Respond:
    """Answer nothing: hold the connection for seconds (or until the server stops), then close it."""

    def respond(conn: Conn, _request: Request) -> bool:
        conn.stop.wait(seconds)
        return False

    return respond


def routed(routes: dict[str, Respond], default: Respond) -> Respond:
    """routes[path] answers that path, default every other."""

    def respond(conn: Conn, request: Request) -> bool:
        return routes.get(request.path, default)(conn, request)

    return respond


def until(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Wait up to seconds for check() to hold (a peer counts closes in its own threads)."""
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()
