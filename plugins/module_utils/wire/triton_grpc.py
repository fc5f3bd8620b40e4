# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gRPC transport: Triton's shared-memory and health APIs over gRPC.

Private to the tritonops.shm collection: no stability promise to other code.
TritonGrpcClient implements client.Client for ``grpc://HOST:PORT`` and ``grpcs://HOST:PORT`` URLs
(base.make_client picks it by the scheme), with the same results and the same errors as the HTTP
transport, over one channel for the whole module run. Region names are sent as they are: gRPC
carries any name, including those an HTTP path cannot (space, ``#``, ``/``, non-ASCII). It never
imports the HTTP transport (triton_http).

Needs ``grpcio`` and Triton's own protobuf messages, both from ``tritonclient[grpc]``
(docs/concepts.md says why); imported on first use, so HTTP URLs never pay for them.
"""

from __future__ import annotations

import base64
import binascii
import collections
import json
import traceback
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    MODEL_CONTROL_TEXT,
    RESTRICTED_TEXT,
    TritonError,
    UnaddressableName,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection, time_limit
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import (
    GRPC,
    GRPC_SCHEMES,
    MAX_ANSWER_BYTES,
    Answer,
    Client,
    Library,
    UnregisterBatch,
    check_kind,
    check_metadata,
    check_regions,
    error_from_answer,
    host_port,
    index_entry,
    record_kind,
    short,
    split_url,
    url_scheme,
    wire_of,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.tls import TlsFileError, grpc_pems

GRPC_REQUIREMENT = 'tritonclient[grpc]'
DEFAULT_GRPC_PORT = connection.DEFAULT_GRPC_PORT

_TLS_WORDS = ('ssl', 'tls', 'handshake', 'certificate')
_MAX_MESSAGE = MAX_ANSWER_BYTES  # a status of 100,000 regions is a few MiB; a larger answer: RESOURCE_EXHAUSTED
# Bulk unregisters: at most this many calls in flight on the one channel (docs/performance.md)
BULK_WINDOW = 64
_EMPTY_NAME = 'an empty region name is refused (over gRPC it would address every region)'


class _Lib:
    """grpcio and Triton's messages, imported on first use (HTTP URLs never pay for the import)."""

    grpc: Any = None
    pb: Any = None
    pb_grpc: Any = None
    error: str | None = None


def load_grpc() -> Library:
    """Import grpcio and tritonclient's protobuf messages once; the result says whether they are there (ok) or why not."""
    if _Lib.grpc is None and _Lib.error is None:
        try:
            import grpc  # pylint: disable=import-outside-toplevel
            from tritonclient.grpc import service_pb2, service_pb2_grpc  # pylint: disable=import-outside-toplevel
        except ImportError:
            _Lib.error = traceback.format_exc()
        else:
            _Lib.grpc, _Lib.pb, _Lib.pb_grpc = grpc, service_pb2, service_pb2_grpc
    return Library(GRPC_REQUIREMENT, _Lib.error, reason='for grpc:// and grpcs:// URLs')


def loaded() -> type[_Lib]:
    """grpcio (grpc), Triton's messages (pb) and services (pb_grpc) as load_grpc imported them (None before it did)."""
    return _Lib


def grpc_metadata(headers: dict | None) -> tuple[tuple[str, str], ...]:
    """The headers option as gRPC metadata (connection.grpc_metadata); TritonError naming the header, never its value."""
    try:
        return connection.grpc_metadata(headers)
    except connection.OptionError as exc:
        raise TritonError(str(exc)) from None


class Channel(NamedTuple):
    """What a channel to a grpc(s):// server is opened with: metadata (the headers), options, credentials (grpcs)."""

    metadata: tuple[tuple[str, str], ...]
    options: list[tuple[str, Any]]
    credentials: Any  # None for grpc://


def channel_of(wire: connection.WireConfig, base: str, max_message: int) -> Channel:
    """The Channel of wire, for the modules' client and the event source's (triton_aio); load_grpc() first.

    TritonError naming base for what grpcio cannot use: a header, the TLS files, validate_certs false over grpcs.
    """
    metadata = grpc_metadata(wire.headers)
    options = connection.grpc_channel_options(wire, max_message)
    if url_scheme(wire.url) != 'grpcs':
        return Channel(metadata, options, None)
    if not wire.tls.verify:
        raise TritonError(
            f'validate_certs=false is not possible with {base}: grpcio always verifies the server '
            'certificate. Set ca_path to the CA that issued it (or to the certificate itself when it is '
            'self-signed)',
            url=base,
        )
    try:
        pems = grpc_pems(wire.tls.ca, wire.tls.cert, wire.tls.key)
    except TlsFileError as exc:
        raise TritonError(str(exc), url=None) from exc
    return Channel(metadata, options, _Lib.grpc.ssl_channel_credentials(*pems))


class TritonGrpcClient(Client):
    """gRPC client for one Triton server: one channel per module run, the calls of client.Client."""

    transport = GRPC

    def __init__(self, url: str | connection.WireConfig, **options: Any) -> None:
        wire = wire_of(url, options)
        if not load_grpc().ok:
            raise RuntimeError(f'{GRPC_REQUIREMENT} is required')
        url = (wire.url or '').strip()
        parsed = split_url(
            url,
            GRPC_SCHEMES,
            f'url {url!r} is not a grpc:// or grpcs:// URL of a Triton server (e.g. grpc://127.0.0.1:8001)',
        )
        parts = parsed.parts
        if parts.path.strip('/') or parts.query or parts.fragment or parts.username or parts.password:
            raise TritonError(
                f'url {url!r}: a gRPC URL is grpc://HOST:PORT or grpcs://HOST:PORT, with no path, query or user',
                url=url,
            )
        self.scheme = parsed.scheme
        self.host = parsed.host
        self.port = parsed.port or DEFAULT_GRPC_PORT
        self.target = host_port(self.host, self.port)
        self.base = f'{self.scheme}://{self.target}'
        self.timeout = wire.timeout
        self._hidden = connection.secrets(wire)  # never in a message, not even cut short (no_log hides whole values)
        channel = channel_of(wire, self.base, _MAX_MESSAGE)
        self.metadata, self.options, self.credentials = channel.metadata, channel.options, channel.credentials
        self.requests_made = 0
        self._channel = None
        self._stub = None

    @classmethod
    def library(cls) -> Library:
        return load_grpc()

    def use_keep_alive(self) -> bool:
        """Every call already goes over the one channel of this client: nothing to switch."""
        return True

    def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None

    # -- transport -----------------------------------------------------------------

    def _service(self) -> Any:
        if self._stub is None:
            options = self.options
            if self.credentials is None:
                self._channel = _Lib.grpc.insecure_channel(self.target, options=options)
            else:
                self._channel = _Lib.grpc.secure_channel(self.target, self.credentials, options=options)
            self._stub = _Lib.pb_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    def call(self, method: str, request: Any, what: str, timeout: float | None = None) -> Any:
        """One RPC of Triton's GRPCInferenceService; every failure becomes a TritonError naming the URL."""
        self.requests_made += 1
        try:
            timeout = time_limit.bound(timeout or self.timeout, f'{what} at {self.base}')  # the call's time limit
            return getattr(self._service(), method)(request, timeout=timeout, metadata=self.metadata)
        except _Lib.grpc.RpcError as exc:
            raise self._rpc_error(exc, what) from exc

    def _rpc_error(self, exc: Any, what: str) -> TritonError:
        code = exc.code() if hasattr(exc, 'code') else None
        name = getattr(code, 'name', None) or 'UNKNOWN'
        details = connection.hide((exc.details() if hasattr(exc, 'details') else None) or str(exc), self._hidden)
        where = f'{what} at {self.base}'
        if name == 'DEADLINE_EXCEEDED':  # the deadline bounds the whole call, as timeout does over HTTP
            return self.error(f'{where}: no answer within {self.timeout}s (timeout)')
        if name == 'RESOURCE_EXHAUSTED' and 'larger than max' in details:
            return self.error(f'{where}: the answer is larger than {_MAX_MESSAGE} bytes: {short(details)}')
        if name == 'UNAVAILABLE' and (MODEL_CONTROL_TEXT in details or RESTRICTED_TEXT in details):
            # an answer: 2.51 refuses a load, and a restricted protocol without its header, this way
            return error_from_answer(
                where, f'gRPC {name}', short(details), details, url=self.base, status=name, transport=self.transport
            )
        if (
            name == 'UNAVAILABLE'
        ):  # no answer came from the server: the transport failed, as a connection error over HTTP
            low = details.lower()
            if 'http1' in low or 'http/1' in low:
                return self.error(
                    f'{where}: cannot connect to Triton over gRPC: {short(details)} (is this the HTTP port? '
                    'Triton serves gRPC on --grpc-port, 8001 by default)'
                )
            if self.scheme == 'grpcs' and any(w in low for w in _TLS_WORDS):
                return self.error(f'{where}: TLS verification failed: {short(details)}')
            hint = ''
            if 'socket closed' in low:
                hint = (
                    ' (the server closed the connection: with grpcs://, does it require a client certificate (client_cert, '
                    'client_key)?'
                    if self.scheme == 'grpcs'
                    else ' (the server closed the connection: is this port serving TLS (use grpcs://) or HTTP rather than gRPC?)'
                )
            return self.error(f'{where}: cannot connect to Triton (refused or unreachable): {short(details)}{hint}')
        hint = " (is this Triton's gRPC port?)" if name == 'UNIMPLEMENTED' else ''
        return error_from_answer(
            where,
            f'gRPC {name}',
            short(details),
            details,
            url=self.base,
            status=name,
            transport=self.transport,
            hint=hint,
        )

    # -- server ---------------------------------------------------------------------

    def server_metadata(self) -> dict:
        resp = self.call('ServerMetadata', _Lib.pb.ServerMetadataRequest(), 'read server metadata')
        if not resp.version:
            raise self.error(
                f'read server metadata at {self.base}: the answer is not Triton server metadata (no version)'
            )
        return check_metadata(
            {'name': resp.name, 'version': resp.version, 'extensions': list(resp.extensions)},
            f'read server metadata at {self.base}',
            self.base,
            self.transport,
        )

    def _health(self, which: str) -> bool:
        if which == 'live':
            return bool(self.call('ServerLive', _Lib.pb.ServerLiveRequest(), 'health live').live)
        return bool(self.call('ServerReady', _Lib.pb.ServerReadyRequest(), 'health ready').ready)

    # -- model repository -------------------------------------------------------------

    def repository_index(self) -> list[dict]:
        resp = self.call('RepositoryIndex', _Lib.pb.RepositoryIndexRequest(), 'read the model repository index')
        return [index_entry(m.name, m.version, m.state, m.reason) for m in resp.models]

    def model_config(self, name: str) -> dict:
        """ModelConfig, as the HTTP API's JSON (field names as in the protobuf; int64 values may come as strings)."""
        from google.protobuf import json_format  # pylint: disable=import-outside-toplevel

        what = f"read the config of model '{name}'"
        resp = self.call('ModelConfig', _Lib.pb.ModelConfigRequest(name=self._model(name, what)), what)
        return json_format.MessageToDict(resp.config, preserving_proto_field_name=True)

    def load_model(self, name: str, config: dict | None = None, timeout: float | None = None) -> None:
        what = f"load model '{name}'"
        req = _Lib.pb.RepositoryModelLoadRequest(model_name=self._model(name, what))
        if config is not None:
            req.parameters['config'].string_param = json.dumps(config)
        self.call('RepositoryModelLoad', req, what, timeout=timeout)

    @staticmethod
    def _model(name: str, what: str) -> str:
        if not name:
            raise UnaddressableName(f'{what}: an empty model name is refused')
        return name

    # -- shared memory --------------------------------------------------------------

    def status(self, kind: str) -> list[dict]:
        """The regions of kind, as the HTTP API lists them (the same keys), ordered by name."""
        what = f'read {check_kind(kind)} shared memory status'
        call = record_kind(kind).grpc_method('Status')
        resp = self.call(call, getattr(_Lib.pb, f'{call}Request')(), what)
        out = [records.from_message(records.KINDS[kind], r) for r in resp.regions.values()]
        return check_regions(
            kind, sorted(out, key=lambda r: r['name']), f'{what} at {self.base}', self.base, self.transport
        )

    @staticmethod
    def unaddressable(name: str) -> str | None:
        """None when a region of this name can be addressed (any name but the empty one); else why not."""
        return None if name else _EMPTY_NAME

    @staticmethod
    def _name(name: str, what: str) -> str:
        # over gRPC an empty name means *every* region: never send one by accident
        if not name:
            raise UnaddressableName(f'{what}: {_EMPTY_NAME}')
        return name

    def register(self, kind: str, name: str, values: dict) -> None:
        what = f"register {check_kind(kind)} region '{name}'"
        sent = {}
        for field, typ in record_kind(kind).register:
            sent[field] = values[field]
            if typ == records.HANDLE:
                try:
                    sent[field] = base64.b64decode(values[field], validate=True)
                except (binascii.Error, ValueError, TypeError) as exc:
                    raise self.error(f'{what}: {field} is not base64: {exc}') from exc
        call = record_kind(kind).grpc_method('Register')
        self.call(call, getattr(_Lib.pb, f'{call}Request')(name=self._name(name, what), **sent), what)

    def unregister(self, kind: str, name: str) -> None:
        what = f"unregister {check_kind(kind)} region '{name}'"
        call = record_kind(kind).grpc_method('Unregister')
        self.call(call, getattr(_Lib.pb, f'{call}Request')(name=self._name(name, what)), what)

    def unregister_many(self, kind: str, names: Iterable[str]) -> UnregisterBatch:
        """Up to BULK_WINDOW unregisters in flight at once on the one channel (futures)."""
        return _FutureUnregister(self, kind, names)


class _FutureUnregister(UnregisterBatch):
    """Unregisters as gRPC futures on the client's one channel, at most BULK_WINDOW in flight; answers in the order sent."""

    def __iter__(self) -> Iterator[Answer]:
        client, kind = self.client, self.kind
        call = record_kind(kind).grpc_method('Unregister')
        method = getattr(client._service(), call).future  # pylint: disable=protected-access
        make = getattr(_Lib.pb, f'{call}Request')
        pending: collections.deque = collections.deque()
        names = iter(self.names)
        while True:
            while not self.stopped and len(pending) < BULK_WINDOW:
                name = next(names, None)
                if name is None:
                    break
                what = f"unregister {check_kind(kind)} region '{name}'"
                if not name:
                    yield Answer(name, UnaddressableName(f'{what}: {_EMPTY_NAME}'))
                    continue
                timeout = time_limit.bound(client.timeout, what)
                pending.append((name, what, method(make(name=name), timeout=timeout, metadata=client.metadata)))
            if not pending:
                return
            name, what, future = pending.popleft()
            client.requests_made += 1
            try:
                future.result()
            except _Lib.grpc.RpcError as exc:
                yield Answer(name, client._rpc_error(exc, what))  # pylint: disable=protected-access
            else:
                yield Answer(name, None)
