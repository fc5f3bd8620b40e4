# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The asyncio transport: one server's system shared-memory status (and a metrics page) without blocking a loop.

Private to the tritonops.shm collection: no stability promise to other code.

The modules' transports (triton_http, triton_grpc) block; the event source
(extensions/eda/plugins/event_source/triton_shm.py) watches 10,000 servers from one event loop, so it needs
one HTTP/1.1 connection per server kept open between polls as an asyncio.Protocol, and one grpc.aio channel per
gRPC server. Only that I/O lives here; what goes on the wire and what an answer means are the modules' own:
the request (connection.http_request), the strict reader (http_reader.ResponseReader, capped as the bytes come),
TLS (tls), a server's error answer (client.error_from_answer: a restricted API's refusal gets its way out), grpcio
(triton_grpc.load_grpc: imported at the first gRPC endpoint only) and the regions of a gRPC answer
(records.from_message). Every failure is a StatusError whose message starts with the endpoint (URL and path, or
URL and gRPC method) and says why; the wire's secrets in a server's text are hidden before it is cut (connection.secrets),
the URL and the rest are the caller's to redact.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from ansible_collections.tritonops.shm.plugins.module_utils.errors import RESTRICTED_TEXT, TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection, tls, triton_grpc
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import GRPC, HTTP, error_from_answer, snippet
from ansible_collections.tritonops.shm.plugins.module_utils.wire.http_reader import (
    MAX_HEAD_BYTES,
    HttpError,
    Response,
    ResponseReader,
    escape,
)

STATUS_PATH = '/v2/systemsharedmemory/status'
GRPC_METHOD = 'SystemSharedMemoryStatus'  # what a grpc:// server is asked (Triton's GRPCInferenceService)
# The most regions a status answer may hold, counted as its JSON objects ('{') before it is parsed: 100,000 regions
# are about 15 MiB, while 31 MiB of '{},' would parse into ~800 MiB of dicts and block the loop for seconds.
MAX_REGIONS = 200_000
SNIPPET = 120  # characters of what a server sent that an event's error shows


class StatusError(Exception):
    """This call of this endpoint has no answer to use; the message says where and why."""


class _Reconnect(StatusError):
    """A kept-alive connection was closed by the server before it answered: send again on a new one."""


def tls_context(wire: connection.WireConfig, what: str) -> ssl.SSLContext | None:
    """The TLS context of an https:// wire (None for http://); OptionError naming what when its files cannot be read."""
    if urlsplit(wire.url).scheme != 'https':
        return None
    try:
        return tls.loaded_context(*wire.tls)
    except tls.TlsFileError as exc:
        raise connection.OptionError(f'{what}: {exc}') from None


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to one server: one request at a time, kept open between polls when it can be.

    Answers are read by the strict reader: every line and the body are bounded as the bytes come, so a server that
    declares a huge chunk or never ends a line is refused at once, holding no more than the caps.
    """

    def __init__(self, max_body: int, hidden: Sequence[str] = ()) -> None:
        self.max_body = max_body
        self.hidden = hidden  # the wire's secrets: never in the reader's errors
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.reader = ResponseReader(max_body, MAX_HEAD_BYTES, memo=False, hidden=hidden)  # memo: no copy of the last
        self.open = False
        self.used = False  # a request was answered on it: a close before the next answer may be a stale keep-alive

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def expect(self, waiter: asyncio.Future | None) -> None:
        self.waiter = waiter
        self.reader = ResponseReader(self.max_body, MAX_HEAD_BYTES, memo=False, hidden=self.hidden)

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted any more
            return
        try:
            answer = self.reader.feed(data)
        except HttpError as exc:
            self._finish(StatusError(str(exc)))
            self.close()
            return
        if answer is None:
            return
        self.used = True
        self._finish(answer)
        if self.reader.leftover or not answer.keep_alive:
            self.close()
        self.reader.start()  # a kept connection holds no answer between polls

    def _finish(self, result: Any) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if isinstance(result, Exception):
                waiter.set_exception(result)
            else:
                waiter.set_result(result)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.waiter is None:
            return
        if self.reader.seen:
            if exc is not None:
                self._finish(StatusError(f'the answer was cut short: {type(exc).__name__}: {exc}'))
                return
            try:
                self._finish(self.reader.eof())
            except HttpError as error:
                self._finish(StatusError(str(error)))
        elif self.used:
            self._finish(_Reconnect('the kept-alive connection was closed'))
        elif isinstance(exc, ssl.SSLError):
            self._finish(StatusError(f'TLS failed: {exc}'))
        else:
            reason = f'{type(exc).__name__}: {exc}' if exc else 'closed'
            self._finish(StatusError(f'the server closed the connection without an answer ({reason})'))

    def close(self) -> None:
        """Release the connection at once: its answer is complete (or will never be), so nothing is left to flush,
        and a TLS close would wait up to 30 s for a peer's close_notify that may never come (asyncio's
        ssl_shutdown_timeout), holding the socket, uncounted by the open-file budget."""
        self.open = False
        if self.transport is not None:
            self.transport.abort()

    def abort(self) -> None:
        self.open = False
        self.waiter = None
        if self.transport is not None:
            self.transport.abort()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())


class HttpEndpoint:
    """One GET over HTTP(S), answered within the wire's timeout: the connection kept open between calls (keep_alive)
    or a new one each time (with Connection: close)."""

    __slots__ = ('wire', 'path', 'name', 'address', 'ssl', 'request', 'keep_alive', 'max_body', 'conn', 'hidden')

    def __init__(
        self,
        wire: connection.WireConfig,
        path: str,
        accept: str,
        keep_alive: bool,
        max_body: int,
        context: ssl.SSLContext | None,
        name: str = 'Triton',
    ) -> None:
        """An endpoint of wire's URL and path; context is tls_context(wire) (read once, shared by the endpoints)."""
        self.wire = wire
        self.path = path
        self.name = name  # what 'cannot connect to NAME' names
        parts = urlsplit(wire.url)
        self.address = (parts.hostname, parts.port or (443 if parts.scheme == 'https' else 80))
        self.ssl = context
        self.request = connection.http_request(wire, path, accept, close=not keep_alive)
        self.keep_alive = keep_alive
        self.max_body = max_body
        self.conn: _Connection | None = None
        self.hidden = connection.secrets(wire)  # never in an error's text, not even cut short

    def where(self) -> str:
        return f'{self.wire.url}{self.path}'

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        host, port = self.address
        try:
            _transport, conn = await loop.create_connection(
                lambda: _Connection(self.max_body, self.hidden),
                host,
                port,
                ssl=self.ssl,
                server_hostname=host if self.ssl else None,
            )
        except ssl.SSLCertVerificationError as exc:
            raise StatusError(f'TLS verification failed: {exc}') from None
        except ssl.SSLError as exc:
            raise StatusError(f'TLS failed: {exc}') from None
        except OSError as exc:
            raise StatusError(f'cannot connect to {self.name} (refused or unreachable): {exc}') from None
        return conn

    async def fetch(self, loop: asyncio.AbstractEventLoop) -> Response:
        """The answer, read whole within the timeout; StatusError (without the endpoint) otherwise."""
        timeout = self.wire.timeout
        deadline = loop.time() + timeout
        for attempt in (1, 2):
            conn = self.conn
            if conn is None or not conn.open:
                self.conn = None
                try:
                    conn = await asyncio.wait_for(self._connect(loop), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    raise StatusError(f'no answer within {timeout}s (timeout)') from None
                if self.keep_alive:
                    self.conn = conn
            waiter = loop.create_future()
            conn.expect(waiter)
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                conn.transport.write(self.request)
                return await waiter
            except asyncio.TimeoutError:
                conn.abort()
                raise StatusError(f'no answer within {timeout}s (timeout)') from None
            except (OSError, RuntimeError) as exc:  # whatever else the transport raises: no answer, never the caller's
                conn.abort()
                raise StatusError(f'request failed: {type(exc).__name__}: {exc}') from None
            except _Reconnect:
                conn.abort()
                if attempt == 2:
                    raise StatusError('the server closed the connection without an answer') from None
            except BaseException:
                conn.abort()  # an error or a cancel: a late answer must not meet the next request
                raise
            finally:
                timer.cancel()
                if not self.keep_alive or not conn.open:
                    if self.conn is conn:
                        self.conn = None
                    if not self.keep_alive:
                        conn.close()
        raise AssertionError('unreachable')

    async def page(self, loop: asyncio.AbstractEventLoop) -> bytes:
        """The body of a 200 answer; StatusError 'HTTP CODE: text' for any other."""
        answer = await self.fetch(loop)
        if answer.status != 200:
            raise StatusError(f'HTTP {answer.status}: {self._shown(answer)}')
        return answer.body

    async def status(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The server's status answer as JSON (records.registered checks its form); StatusError naming the endpoint."""
        try:
            answer = await self.fetch(loop)
        except StatusError as exc:
            raise StatusError(f'{self.where()}: {exc}') from None
        if answer.status != 200:
            server_error = None
            if answer.status == 403:  # a restricted API's refusal: Triton's JSON error, and the way out
                try:
                    server_error = json.loads(answer.body)['error']
                except (ValueError, KeyError, TypeError):
                    pass
            detail = connection.hide(server_error, self.hidden) if isinstance(server_error, str) else None
            text = detail or self._shown(answer)
            code = f'HTTP {answer.status}'
            raise StatusError(
                str(error_from_answer(self.where(), code, text, detail, url=None, status=answer.status, transport=HTTP))
            )
        if answer.body.count(b'{') > MAX_REGIONS:  # refused before parsing: memory stays near the body's size
            raise StatusError(
                f'{self.where()}: the answer holds more than {MAX_REGIONS} JSON objects, more regions than this '
                f'source reads (at most {MAX_REGIONS})'
            )
        try:
            return json.loads(answer.body)
        except ValueError:
            raise StatusError(
                f'{self.where()}: the answer is not Triton JSON (is another web server on this port?): '
                + snippet(answer.body, SNIPPET, self.hidden)
            ) from None

    def _shown(self, answer: Response) -> str:
        """The start of an error answer's body (else its reason) for a message, the wire's secrets hidden first."""
        return snippet(answer.body, SNIPPET, self.hidden) or escape(answer.reason, SNIPPET, self.hidden)

    def close(self) -> None:
        """Close the connection; a later call opens a new one."""
        if self.conn is not None:
            self.conn.abort()
            self.conn = None


class GrpcSettings(NamedTuple):
    """How a grpc(s):// server is reached: its target, metadata (the headers, keys in lower case), channel options,
    credentials (None for grpc://)."""

    target: str
    metadata: tuple
    options: list
    credentials: Any


def grpc_settings(wire: connection.WireConfig, max_message: int, what: str) -> GrpcSettings:
    """The GrpcSettings of a wire (triton_grpc.channel_of, as the modules' client opens its channel); OptionError
    naming what when grpcio is missing or the options cannot be used."""
    library = triton_grpc.load_grpc()
    cause = None if library.ok else library.error.strip().splitlines()[-1]
    if cause is None:
        try:
            import grpc.aio  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        except ImportError as exc:
            cause = str(exc)
    if cause is not None:
        raise connection.OptionError(
            f"{what}: a grpc:// URL needs tritonclient[grpc] (grpcio and Triton's messages) where "
            f"ansible-rulebook runs: pip install 'tritonclient[grpc]' ({cause})"
        )
    target = connection.grpc_target(wire.url)
    try:
        channel = triton_grpc.channel_of(wire, f'{urlsplit(wire.url).scheme.lower()}://{target}', max_message)
    except TritonError as exc:
        raise connection.OptionError(f'{what}: {exc}') from None
    return GrpcSettings(target, channel.metadata, channel.options, channel.credentials)


class GrpcEndpoint:
    """SystemSharedMemoryStatus over one grpc.aio channel, kept open between calls (keep_alive) or not."""

    __slots__ = ('wire', 'settings', 'keep_alive', 'channel', 'stub')

    def __init__(self, wire: connection.WireConfig, settings: GrpcSettings, keep_alive: bool) -> None:
        self.wire = wire
        self.settings = settings
        self.keep_alive = keep_alive
        self.channel: Any = None
        self.stub: Any = None

    def where(self) -> str:
        return f'{self.wire.url} ({GRPC_METHOD})'

    async def status(self, loop: asyncio.AbstractEventLoop) -> list[dict]:  # pylint: disable=unused-argument
        """The server's system regions as dicts of the HTTP API's keys; StatusError naming the endpoint."""
        lib, settings, timeout = triton_grpc.loaded(), self.settings, self.wire.timeout
        grpc = lib.grpc
        if self.stub is None:
            if settings.credentials is None:
                self.channel = grpc.aio.insecure_channel(settings.target, options=settings.options)
            else:
                self.channel = grpc.aio.secure_channel(settings.target, settings.credentials, options=settings.options)
            self.stub = lib.pb_grpc.GRPCInferenceServiceStub(self.channel)
        try:
            answer = await self.stub.SystemSharedMemoryStatus(
                lib.pb.SystemSharedMemoryStatusRequest(), timeout=timeout, metadata=settings.metadata
            )
        except grpc.aio.AioRpcError as exc:
            name, details = exc.code().name, exc.details() or ''
            if name == 'DEADLINE_EXCEEDED':
                raise StatusError(f'{self.where()}: no answer within {timeout}s (timeout)') from None
            if name == 'UNAVAILABLE' and RESTRICTED_TEXT not in details:
                # a kept channel that could not connect stays in gRPC's reconnect backoff (up to 120 s), failing every
                # call meanwhile: dropped, so that the next poll connects afresh and sees a restarted server at once
                await self.close()
                text = f'cannot connect to Triton over gRPC (refused or unreachable): {details}'
                raise StatusError(f'{self.where()}: {text}') from None
            error = error_from_answer(
                self.where(), f'gRPC {name}', details, details, url=None, status=0, transport=GRPC
            )
            raise StatusError(str(error)) from None
        finally:
            if not self.keep_alive:
                await self.close()
        if len(answer.regions) > MAX_REGIONS:  # refused before each becomes a dict (as the HTTP answer's JSON is)
            raise StatusError(
                f'{self.where()}: the answer holds {len(answer.regions)} regions, more than this source reads '
                f'(at most {MAX_REGIONS})'
            )
        return [records.from_message(records.SYSTEM, r) for r in answer.regions.values()]

    async def close(self) -> None:
        """Close the channel; a later call opens a new one."""
        channel, self.channel, self.stub = self.channel, None, None
        if channel is not None:
            await channel.close()
