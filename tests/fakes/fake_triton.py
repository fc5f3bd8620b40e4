"""The unit tests' one fake Triton: a versioned model of its shared-memory API, served over HTTP and gRPC.

No wheel bundles a server newer than 2.51, so ``Triton`` plays each version as upstream's
shared_memory_manager.cc, http_server.cc and grpc_server.cc make it answer (2.48 to 2.74):

- 2.48, 2.49: an unregister of a region in use is accepted at once (no refusal);
- 2.50 to 2.52: refused while in use, "Cannot unregister ... it is currently in use." (INTERNAL);
- 2.53 and later: deferred: accepted, listed until its requests finish, one log line;
- 2.58: byte_size + offset past 2**64 - 1 is refused (INVALID_ARG);
- 2.60: keys with the python backend's reserved prefix are refused, 2.61 after stripping leading slashes,
  and a key of slashes only is invalid;
- 2.68: register/unregister refused unless --allow-client-shm=true (``client_shm``), UNSUPPORTED;
- 2.73 tritonfrontend (``frontend``): no shared memory at all, every call UNAVAILABLE.

``restricted=(KEY, VALUE)`` puts the shared-memory API behind a header, as ``--http-restricted-api`` and
``--grpc-restricted-protocol`` do: HTTP 403 "This API is restricted, expecting header 'KEY'", gRPC UNAVAILABLE
"This protocol is restricted, expecting header 'triton-grpc-protocol-KEY'".

``HttpFront`` serves the model over a loopback socket (tests/fakes/loopback.py: keep-alive, chunked
answers, idle and per-answer closes) and lets a test put any answer, hostile ones included, on a route;
``GrpcFront`` serves it with grpcio and tritonclient's messages, with scripted codes, slow, missing and
malformed methods (over TLS with ``tls``, a GrpcTls). The collection's real clients talk to both; each records what
reached it.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from concurrent import futures
from typing import Callable, NamedTuple

from ansible_collections.tritonops.shm.tests.fakes import loopback

KIB = 1024
SIZE_MAX = 2**64 - 1
PREFIX = 'triton_python_backend_shm_region_'
EXTENSIONS = ('system_shared_memory', 'cuda_shared_memory')

# The servers' own texts, byte for byte (the version that introduced each in the comment).
IN_USE = "Cannot unregister shared memory region '{}', it is currently in use."  # 2.50
DEFERRED_LOG = "Shared memory region '{}' will be unregistered after in-flight requests complete."  # 2.53, log
OVERFLOW = (
    'Integer overflow detected: byte_size ({}) + offset ({}) exceeds maximum value ({}) '  # 2.58
    "for region '{}'"
)
RESERVED = (
    "cannot register shared memory region '{}' with key '{}' as the key contains the reserved "  # 2.60
    f"prefix '{PREFIX}'"
)
INVALID_KEY = "cannot register shared memory region '{}' - invalid shm key '{}'"  # 2.61
CLIENT_SHM_OFF = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."  # 2.68
UNSUPPORTED = 'Shared memory is not supported in this server configuration.'  # 2.73 frontend
ALREADY = "shared memory region '{}' already in manager"
RESTRICTED_HTTP = "This API is restricted, expecting header '{}'"
RESTRICTED_GRPC = "This protocol is restricted, expecting header '{}'"
GRPC_HEADER_PREFIX = 'triton-grpc-protocol-'
MODEL_CONTROL = 'explicit model load / unload is not allowed if polling is enabled'

# Triton's error codes as each transport carries them (TRITONSERVER_ERROR_* -> HTTP status, gRPC status code name)
INTERNAL = (500, 'INTERNAL')
INVALID_ARG = (400, 'INVALID_ARGUMENT')
ALREADY_EXISTS = (400, 'ALREADY_EXISTS')
UNSUPPORTED_CODE = (501, 'UNIMPLEMENTED')
UNAVAILABLE = (503, 'UNAVAILABLE')


class Refusal(Exception):
    """The server's error answer: codes (HTTP status, gRPC status code name) and its text."""

    def __init__(self, codes: tuple[int, str], text: str) -> None:
        super().__init__(text)
        self.codes = codes
        self.text = text


class Drop(Exception):
    """No answer at all: the connection goes (HTTP) or the call fails UNAVAILABLE 'Socket closed' (gRPC)."""


def region(name: str, key: str | None = None, byte_size: int = 64 * KIB, offset: int = 0) -> dict:
    """A system region as the status lists it."""
    return dict(name=name, key=key or f'/{name}', offset=offset, byte_size=byte_size)


class Triton:
    """Triton's shared memory manager (and model repository) as version `version` behaves; one state, both fronts.

    Scenes set the state directly: ``list()`` a region, ``in_flight[name]`` requests keep it busy (refusals left before
    2.53, status reads before it goes from 2.53; -1 for ever), ``drop_after`` answers before every call is dropped.
    What happened is kept: ``calls`` (shared-memory calls by name), ``log``, ``seen`` ((name, its file existed when the
    unregister came), with ``shm_dir``), ``peers`` (who unregistered), ``loads`` ((model, config)).
    """

    def __init__(
        self,
        version: str = '2.51.0',
        client_shm: bool = True,
        frontend: bool = False,
        restricted: tuple[str, str] | None = None,
        extensions: tuple[str, ...] = EXTENSIONS,
        shm_dir: str | None = None,
        model_control: str = 'explicit',
    ) -> None:
        self.version = version
        self.client_shm = client_shm  # 2.68+: --allow-client-shm=true given
        self.frontend = frontend  # 2.73+: started through the tritonfrontend bindings
        self.restricted = restricted  # (header, value) the shared-memory API needs
        self.extensions = list(extensions)
        self.shm_dir = shm_dir
        self.model_control = model_control  # 'explicit' accepts loads; 'poll' and 'none' refuse them
        self.live = True
        self.ready = True
        self.regions: dict[str, dict] = {}
        self.cuda: dict[str, dict] = {}
        self.models: dict[str, dict] = {}  # name -> config
        self.in_flight: dict[str, int] = {}
        self.drop_after: int | None = None
        self.answered = 0
        self.lock = threading.Lock()
        self.log: list[str] = []
        self.calls: list[str] = []
        self.seen: list[tuple[str, bool]] = []
        self.peers: set = set()
        self.loads: list[tuple[str, str | None]] = []

    @property
    def v(self) -> tuple[int, int]:
        parts = [int(p) for p in self.version.split('.')[:2] if p.isdigit()]
        return (parts + [0, 0])[0], (parts + [0, 0])[1]

    # -- the scene -------------------------------------------------------------------------------------------

    def list(self, name: str, key: str | None = None, byte_size: int = 64 * KIB, offset: int = 0) -> dict:
        """Put a system region in the manager, as a client's register would have."""
        self.regions[name] = region(name, key, byte_size, offset)
        return self.regions[name]

    # -- the API -------------------------------------------------------------------------------------------

    def metadata(self) -> dict:
        return dict(name='triton', version=self.version, extensions=list(self.extensions))

    def restriction(self, transport: str) -> tuple[str, str] | None:
        """(header the transport must carry, its value) when the shared-memory API is restricted."""
        if self.restricted is None:
            return None
        key, value = self.restricted
        return (key if transport == 'http' else GRPC_HEADER_PREFIX + key), value

    def refuse_restricted(self, transport: str, sent: str | None) -> None:
        """Raise the server's refusal when the header the restriction needs was not sent with its value."""
        needed = self.restriction(transport)
        if needed is not None and sent != needed[1]:
            if transport == 'http':
                raise Refusal((403, 'UNAVAILABLE'), RESTRICTED_HTTP.format(needed[0]))
            raise Refusal((403, 'UNAVAILABLE'), RESTRICTED_GRPC.format(needed[0]))

    def _shm_call(self, method: str) -> None:
        self.calls.append(method)
        if self.frontend:
            raise Refusal(UNAVAILABLE, UNSUPPORTED)
        if method != 'status' and self.v >= (2, 68) and not self.client_shm:
            raise Refusal(UNSUPPORTED_CODE, CLIENT_SHM_OFF)

    def status(self, kind: str = 'system') -> list[dict]:
        with self.lock:
            self._shm_call('status')
            if kind == 'cuda':
                return [dict(r) for _n, r in sorted(self.cuda.items())]
            leaving = [n for n, r in self.regions.items() if r.get('leaving')]
            for name in leaving:  # its requests finished: gone
                if self.in_flight.get(name) == 0:
                    del self.regions[name], self.in_flight[name]
            out = [{k: v for k, v in r.items() if k != 'leaving'} for r in self.regions.values()]
            for name in leaving:  # one status read later, one step closer (-1: never)
                if self.in_flight.get(name, 0) > 0:
                    self.in_flight[name] -= 1
            return sorted(out, key=lambda r: r['name'])

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        with self.lock:
            self._shm_call('register')
            check = key.lstrip('/') if self.v >= (2, 61) else key
            if self.v >= (2, 61) and not check:
                raise Refusal(INVALID_ARG, INVALID_KEY.format(name, key))
            if self.v >= (2, 60) and check.startswith(PREFIX):
                raise Refusal(INVALID_ARG, RESERVED.format(name, key))
            if name in self.regions:
                raise Refusal(ALREADY_EXISTS, ALREADY.format(name))
            if self.v >= (2, 58) and byte_size > SIZE_MAX - offset:
                raise Refusal(INVALID_ARG, OVERFLOW.format(byte_size, offset, SIZE_MAX, name))
            self.regions[name] = region(name, key, byte_size, offset)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        with self.lock:
            self._shm_call('register')
            if name in self.cuda:
                raise Refusal(ALREADY_EXISTS, ALREADY.format(name))
            self.cuda[name] = dict(name=name, device_id=device_id, byte_size=byte_size, raw_handle=raw_handle)

    def unregister(self, kind: str, name: str, peer: object = None) -> None:
        with self.lock:
            self._shm_call('unregister')
            if kind == 'cuda':
                self.cuda.pop(name, None)
                return
            self.peers.add(peer)
            if self.shm_dir is not None:
                key = self.regions.get(name, {}).get('key', name).lstrip('/')
                self.seen.append((name, os.path.exists(os.path.join(self.shm_dir, key))))
            if self.drop_after is not None and self.answered >= self.drop_after:
                raise Drop(name)
            self.answered += 1
            busy = self.in_flight.get(name, 0)
            if name not in self.regions or not busy or self.v < (2, 50):
                self.regions.pop(name, None)
                self.in_flight.pop(name, None)
                return
            if self.v >= (2, 53):  # accepted; the region stays listed until its requests finish
                self.regions[name]['leaving'] = True
                self.log.append(DEFERRED_LOG.format(name))
                return
            if busy > 0:  # 2.50 - 2.52: refused while busy
                self.in_flight[name] = busy - 1
            raise Refusal(INTERNAL, IN_USE.format(name))

    def repository_index(self) -> list[dict]:
        return [dict(name=name, version='1', state='READY') for name in sorted(self.models)]

    def model_config(self, name: str) -> dict:
        if name not in self.models:
            raise Refusal((400, 'NOT_FOUND'), f"Request for unknown model: '{name}' is not found")
        return dict(name=name, **self.models[name])

    def load(self, name: str, config: str | None) -> None:
        if self.model_control != 'explicit':
            raise Refusal(UNAVAILABLE, MODEL_CONTROL)
        self.loads.append((name, config))


# -- HTTP ------------------------------------------------------------------------------------------------------


class Reply(NamedTuple):
    """A scripted HTTP answer for one route (what Triton never sends, or sends only on a bad day)."""

    status: int
    body: bytes | str = b''
    content_type: str | None = 'application/json'
    close: bool = False  # answer with Connection: close, then close

    @classmethod
    def json(cls, body: object, status: int = 200) -> Reply:
        return cls(status, json.dumps(body))


class HttpFront(loopback.Closing):
    """The model's HTTP API on 127.0.0.1, Triton's routes and status codes; each request is recorded.

    answers[(method, path)] replaces the model for that route: a Reply, or any loopback answer (hostile ones:
    loopback.silent(), trickle(), endless(), canned()). chunks > 0 sends every answer chunked; close_after_each
    closes each connection after its answer (a server dropping kept-alive connections), idle after that many
    idle seconds; delay holds each answer (``most_busy`` counts the answers in progress at once); headers go
    with every answer.
    """

    def __init__(
        self,
        model: Triton,
        tls: object = None,
        chunks: int = 0,
        close_after_each: bool = False,
        idle: float | None = None,
        delay: float = 0.0,
        port: int = 0,
    ) -> None:
        self.model = model
        self.chunks = chunks
        self.close_after_each = close_after_each
        self.delay = delay
        self.answers: dict[tuple[str, str], Reply | loopback.Respond] = {}
        self.headers: dict[str, str] = {}  # sent with every answer (a Location, a Server, ...)
        self.busy = 0
        self.most_busy = 0
        self.server = loopback.Peer(self._respond, tls=tls, idle=idle, port=port)
        self.url = self.server.url
        self.port = self.server.port

    @property
    def requests(self) -> list[loopback.Request]:
        return self.server.requests

    @property
    def connections(self) -> int:
        return self.server.connections

    @property
    def closed(self) -> int:
        return self.server.closed

    def by_connection(self) -> dict[tuple, list[loopback.Request]]:
        return self.server.by_connection()

    def close(self) -> None:
        self.server.close()

    def _respond(self, conn: loopback.Conn, request: loopback.Request) -> bool:
        answer = self.answers.get((request.method, request.path))
        if callable(answer):
            return answer(conn, request)
        with self.model.lock:
            self.busy += 1
            self.most_busy = max(self.most_busy, self.busy)
        try:
            if self.delay:
                conn.stop.wait(self.delay)
            if answer is None:
                try:
                    status, body = self._route(request)
                except Drop:
                    return False
                answer = Reply(status, body)
        finally:
            with self.model.lock:
                self.busy -= 1
        keep = (
            request.version == 'HTTP/1.1'
            and (request.header('Connection') or '').lower() != 'close'
            and not answer.close
        )
        body = answer.body.encode() if isinstance(answer.body, str) else answer.body
        headers = [f'{name}: {value}' for name, value in self.headers.items()] + ([] if keep else ['Connection: close'])
        conn.send(loopback.http_answer(answer.status, body, answer.content_type, tuple(headers), self.chunks))
        return keep and not self.close_after_each

    def _route(self, request: loopback.Request) -> tuple[int, bytes]:
        model, method, path = self.model, request.method, request.path
        parts = path.strip('/').split('/')
        body = json.loads(request.body) if request.body else {}
        try:
            if (method, path) == ('GET', '/v2'):
                return 200, json.dumps(model.metadata()).encode()
            if method == 'GET' and parts[:2] == ['v2', 'health'] and parts[2:] in (['live'], ['ready']):
                return (200 if getattr(model, parts[2]) else 400), b''
            if parts[:2] in (['v2', 'systemsharedmemory'], ['v2', 'cudasharedmemory']):
                kind = 'system' if parts[1] == 'systemsharedmemory' else 'cuda'
                needed = model.restriction('http')
                model.refuse_restricted('http', request.header(needed[0]) if needed else None)
                return 200, self._shm(kind, method, parts[2:], body, request.peer)
            if (method, path) == ('POST', '/v2/repository/index'):
                return 200, json.dumps(model.repository_index()).encode()
            if method == 'GET' and parts[:2] == ['v2', 'models'] and parts[3:] == ['config']:
                return 200, json.dumps(model.model_config(parts[2])).encode()
            if method == 'POST' and parts[:3] == ['v2', 'repository', 'models'] and parts[4:] == ['load']:
                model.load(parts[3], body.get('parameters', {}).get('config'))
                return 200, b''
        except Refusal as exc:
            return exc.codes[0], json.dumps({'error': exc.text}).encode()
        return 404, json.dumps({'error': 'Not Found'}).encode()

    def _shm(self, kind: str, method: str, rest: list[str], body: dict, peer: tuple) -> bytes:
        model = self.model
        if (method, rest) == ('GET', ['status']):
            return json.dumps([{k: v for k, v in r.items() if k != 'raw_handle'} for r in model.status(kind)]).encode()
        if method == 'POST' and len(rest) == 3 and rest[0] == 'region' and rest[2] == 'register':
            if kind == 'cuda':
                model.register_cuda(
                    rest[1], base64.b64decode(body['raw_handle']['b64']), body['device_id'], body['byte_size']
                )
            else:
                model.register(rest[1], body['key'], body.get('offset', 0), body['byte_size'])
            return b''
        if method == 'POST' and len(rest) == 3 and rest[0] == 'region' and rest[2] == 'unregister':
            model.unregister(kind, rest[1], peer)
            return b''
        raise Refusal((404, 'NOT_FOUND'), 'Not Found')


# -- gRPC ------------------------------------------------------------------------------------------------------


class Call(NamedTuple):
    """One gRPC call as it reached the server: the method, the request message, its metadata."""

    method: str
    request: object
    metadata: dict


SHM_METHODS = (
    'SystemSharedMemoryStatus',
    'SystemSharedMemoryRegister',
    'SystemSharedMemoryUnregister',
    'CudaSharedMemoryStatus',
    'CudaSharedMemoryRegister',
    'CudaSharedMemoryUnregister',
)
GARBAGE = b'\xff\xff\xff\xff not a protobuf message'


class GrpcTls(NamedTuple):
    """A grpcs:// front's PEM files: its key and certificate, and the CA its clients' certificates must come from (None:
    it asks for none)."""

    key: str
    cert: str
    client_ca: str | None = None


def _pem(path: str) -> bytes:
    with open(path, 'rb') as f:
        return f.read()


class GrpcFront(loopback.Closing):
    """The model's gRPC service (inference.GRPCInferenceService) on 127.0.0.1, with Triton's messages and codes.

    Per method name: fail[m] = (grpc.StatusCode, details) answers that error; slow[m] = seconds waits first
    (until the front closes at most); missing holds methods answered UNIMPLEMENTED as a server without them
    does; garbage holds methods whose answer is not a protobuf message. Every call is kept in ``calls``.
    """

    def __init__(self, model: Triton, tls: GrpcTls | None = None, port: int = 0) -> None:
        """port: the port to listen on (0: one the kernel picks; another: a server back where one was)."""
        import grpc  # pylint: disable=import-outside-toplevel
        from tritonclient.grpc import service_pb2  # pylint: disable=import-outside-toplevel

        self.model = model
        self.grpc = grpc
        self.pb = service_pb2
        self.calls: list[Call] = []
        self.fail: dict[str, tuple[object, str]] = {}
        self.slow: dict[str, float] = {}
        self.missing: set[str] = set()
        self.garbage: set[str] = set()
        self.stop = threading.Event()
        service = service_pb2.DESCRIPTOR.services_by_name['GRPCInferenceService']
        handlers = {}
        for name, answer in self._methods().items():
            request_type = getattr(service_pb2, service.methods_by_name[name].input_type.name)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._wrap(name, answer),
                request_deserializer=request_type.FromString,
                response_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
        if tls is None:
            self.port = self.server.add_insecure_port(f'127.0.0.1:{port}')
        else:
            credentials = grpc.ssl_server_credentials(
                [(_pem(tls.key), _pem(tls.cert))],
                root_certificates=_pem(tls.client_ca) if tls.client_ca else None,
                require_client_auth=tls.client_ca is not None,
            )
            self.port = self.server.add_secure_port(f'127.0.0.1:{port}', credentials)
        self.url = f'{"grpc" if tls is None else "grpcs"}://127.0.0.1:{self.port}'
        self.server.start()

    def close(self) -> None:
        self.stop.set()
        self.server.stop(0)

    def _wrap(self, name: str, answer: Callable) -> Callable:
        codes = self.grpc.StatusCode

        def call(request: object, context: object) -> object:
            metadata = dict(context.invocation_metadata())
            self.calls.append(Call(name, request, metadata))
            if name in self.missing:
                context.abort(codes.UNIMPLEMENTED, 'Method not found!')
            if name in self.fail:
                code, details = self.fail[name]
                context.abort(code if isinstance(code, codes) else getattr(codes, code), details)
            if name in self.slow:
                self.stop.wait(self.slow[name])
            if name in self.garbage:
                return GARBAGE
            try:
                if name in SHM_METHODS:
                    needed = self.model.restriction('grpc')
                    self.model.refuse_restricted('grpc', metadata.get(needed[0]) if needed else None)
                return answer(request, context)
            except Refusal as exc:
                context.abort(getattr(codes, exc.codes[1]), exc.text)
            except Drop:
                context.abort(codes.UNAVAILABLE, 'Socket closed')
            return None

        return call

    def _methods(self) -> dict[str, Callable]:
        model, pb = self.model, self.pb

        def system_status(_request, _context):
            return status_response(model.status('system'))

        def cuda_status(_request, _context):
            resp = pb.CudaSharedMemoryStatusResponse()
            for r in model.status('cuda'):
                resp.regions[r['name']].name = r['name']
                resp.regions[r['name']].device_id = r['device_id']
                resp.regions[r['name']].byte_size = r['byte_size']
            return resp

        def index(_request, _context):
            resp = pb.RepositoryIndexResponse()
            for m in model.repository_index():
                resp.models.add(**m)
            return resp

        def config(request, _context):
            resp = pb.ModelConfigResponse()
            for key, value in model.model_config(request.name).items():
                setattr(resp.config, key, value)
            return resp

        def load(request, _context):
            given = request.parameters['config'].string_param if 'config' in request.parameters else None
            model.load(request.model_name, given)
            return pb.RepositoryModelLoadResponse()

        def done(message: type, work: Callable) -> Callable:
            def answer(request, context):
                work(request, context)
                return message()

            return answer

        return {
            'ServerLive': lambda _r, _c: pb.ServerLiveResponse(live=model.live),
            'ServerReady': lambda _r, _c: pb.ServerReadyResponse(ready=model.ready),
            'ServerMetadata': lambda _r, _c: pb.ServerMetadataResponse(**model.metadata()),
            'SystemSharedMemoryStatus': system_status,
            'SystemSharedMemoryRegister': done(
                pb.SystemSharedMemoryRegisterResponse,
                lambda r, _c: model.register(r.name, r.key, r.offset, r.byte_size),
            ),
            'SystemSharedMemoryUnregister': done(
                pb.SystemSharedMemoryUnregisterResponse, lambda r, c: model.unregister('system', r.name, c.peer())
            ),
            'CudaSharedMemoryStatus': cuda_status,
            'CudaSharedMemoryRegister': done(
                pb.CudaSharedMemoryRegisterResponse,
                lambda r, _c: model.register_cuda(r.name, r.raw_handle, r.device_id, r.byte_size),
            ),
            'CudaSharedMemoryUnregister': done(
                pb.CudaSharedMemoryUnregisterResponse, lambda r, c: model.unregister('cuda', r.name, c.peer())
            ),
            'RepositoryIndex': index,
            'ModelConfig': config,
            'RepositoryModelLoad': load,
        }


def status_response(regions: list[dict]) -> object:
    """Triton's SystemSharedMemoryStatusResponse for region dicts (name, key, offset, byte_size)."""
    from tritonclient.grpc import service_pb2  # pylint: disable=import-outside-toplevel

    resp = service_pb2.SystemSharedMemoryStatusResponse()
    for r in regions:
        resp.regions[r['name']].name = r['name']
        resp.regions[r['name']].key = r['key']
        resp.regions[r['name']].offset = r['offset']
        resp.regions[r['name']].byte_size = r['byte_size']
    return resp


FRONTS = {'http': HttpFront, 'grpc': GrpcFront}


def serve(model: Triton, transport: str) -> HttpFront | GrpcFront:
    """The model served over transport ('http' or 'grpc'); close() it after the test."""
    return FRONTS[transport](model)
