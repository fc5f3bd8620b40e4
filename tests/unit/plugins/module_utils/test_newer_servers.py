"""Triton 2.50 to 2.73, each answering as that version does, over HTTP (status codes) and gRPC (status codes).

No wheel bundles a server newer than 2.51, so the behaviour of newer ones (from Triton's
src/shared_memory_manager.cc, http_server.cc and grpc/grpc_server.cc) is played by one model of
the server (``Versioned``) served twice on 127.0.0.1: a threaded http.server answering Triton's
HTTP routes with its codes, and a real grpcio server implementing tritonclient's
GRPCInferenceServiceServicer with its status codes. The collection's real clients
(triton_http.TritonClient, triton_grpc.TritonGrpcClient) and RegionOps talk to them; files live in
a real temporary shm directory and a real process stands in for tritonserver.
"""
from __future__ import annotations

import http.server
import json
import os
import threading
from concurrent import futures

import pytest

grpc = pytest.importorskip('grpc')
service_pb2 = pytest.importorskip('tritonclient.grpc.service_pb2')
service_pb2_grpc = pytest.importorskip('tritonclient.grpc.service_pb2_grpc')

# pylint: disable=wrong-import-position
from ansible_collections.tritonops.shm.plugins.module_utils import inventory  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.client import (  # noqa: E402
    CLIENT_SHM_HINT, OVERFLOW_HINT, RESERVED_KEY_HINT, SHM_UNSUPPORTED_HINT,
)
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.grpc_answers import grpc_status_response  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.errors import (  # noqa: E402
    ClientShmDisabled, ParameterError, RegionInUse, RegisterOverflow, ReservedKey, ShmUnsupported, TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.region_ops import RegionOps  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.triton_http import TritonClient  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.triton_grpc import TritonGrpcClient  # noqa: E402

KIB = 1024
SIZE_MAX = 2 ** 64 - 1
PREFIX = 'triton_python_backend_shm_region_'

# The servers' own texts, byte for byte (the version that introduced each in the comment).
IN_USE = "Cannot unregister shared memory region '{}', it is currently in use."                        # 2.50
DEFERRED_LOG = "Shared memory region '{}' will be unregistered after in-flight requests complete."       # 2.53 (log only)
OVERFLOW = ("Integer overflow detected: byte_size ({}) + offset ({}) exceeds maximum value ({}) "       # 2.58
            "for region '{}'")
RESERVED = ("cannot register shared memory region '{}' with key '{}' as the key contains the reserved "  # 2.60
            f"prefix '{PREFIX}'")
INVALID_KEY = "cannot register shared memory region '{}' - invalid shm key '{}'"                       # 2.61
CLIENT_SHM_OFF = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."  # 2.68
UNSUPPORTED = "Shared memory is not supported in this server configuration."                           # 2.73 tritonfrontend

# Triton's error codes as each transport carries them (TRITONSERVER_ERROR_* -> HTTP status, gRPC status code)
INTERNAL = (500, grpc.StatusCode.INTERNAL)
INVALID_ARG = (400, grpc.StatusCode.INVALID_ARGUMENT)
UNSUPPORTED_CODE = (501, grpc.StatusCode.UNIMPLEMENTED)
UNAVAILABLE = (503, grpc.StatusCode.UNAVAILABLE)


class Refusal(Exception):
    def __init__(self, codes: tuple, text: str) -> None:
        super().__init__(text)
        self.codes = codes
        self.text = text


class Versioned:
    """Triton's shared memory manager as version `version` behaves; one state, served over both transports."""

    def __init__(self, version: str, client_shm: bool = True, frontend: bool = False) -> None:
        self.version = version
        self.v = tuple(int(p) for p in version.split('.')[:2])
        self.client_shm = client_shm        # 2.68+: --allow-client-shm=true given
        self.frontend = frontend            # 2.73+: started through the tritonfrontend bindings
        self.regions: dict = {}
        self.in_flight: dict = {}           # name -> status reads (2.53+) or unregister attempts (2.50+) still busy; -1 forever
        self.lock = threading.Lock()
        self.log: list = []
        self.calls: list = []

    def _shm_call(self, method: str) -> None:
        self.calls.append(method)
        if self.frontend:
            raise Refusal(UNAVAILABLE, UNSUPPORTED)
        if method != 'status' and self.v >= (2, 68) and not self.client_shm:
            raise Refusal(UNSUPPORTED_CODE, CLIENT_SHM_OFF)

    def status(self) -> list:
        with self.lock:
            self._shm_call('status')
            leaving = [n for n, r in self.regions.items() if r.get('leaving')]
            for name in leaving:            # its requests finished: gone
                if self.in_flight.get(name) == 0:
                    del self.regions[name], self.in_flight[name]
            out = [{k: v for k, v in r.items() if k != 'leaving'} for r in self.regions.values()]
            for name in leaving:            # one status read later, one step closer (-1: never)
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
                raise Refusal((400, grpc.StatusCode.ALREADY_EXISTS), f"shared memory region '{name}' already in manager")
            if self.v >= (2, 58) and byte_size > SIZE_MAX - offset:
                raise Refusal(INVALID_ARG, OVERFLOW.format(byte_size, offset, SIZE_MAX, name))
            self.regions[name] = dict(name=name, key=key, offset=offset, byte_size=byte_size)

    def unregister(self, name: str) -> None:
        with self.lock:
            self._shm_call('unregister')
            busy = self.in_flight.get(name, 0)
            if name not in self.regions or not busy:
                self.regions.pop(name, None)
                self.in_flight.pop(name, None)
                return
            if self.v >= (2, 53):          # accepted; the region stays listed until its requests finish
                self.regions[name]['leaving'] = True
                self.log.append(DEFERRED_LOG.format(name))
                return
            if busy > 0:                   # 2.50 - 2.52: refused while busy
                self.in_flight[name] = busy - 1
            raise Refusal(INTERNAL, IN_USE.format(name))


class _HttpFront:
    """Triton's HTTP routes for the model, with its status codes."""

    def __init__(self, model: Versioned) -> None:
        outer_model = model

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status: int, body: object) -> None:
                data = json.dumps(body).encode() if body is not None else b''
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> None:
                length = int(self.headers.get('Content-Length') or 0)
                body = json.loads(self.rfile.read(length) or b'{}') if length else {}
                parts = self.path.strip('/').split('/')
                try:
                    if self.path == '/v2':
                        return self._send(200, dict(name='triton', version=outer_model.version,
                                                    extensions=['system_shared_memory', 'cuda_shared_memory']))
                    if self.path.startswith('/v2/health/'):
                        return self._send(200, None)
                    if self.path == '/v2/systemsharedmemory/status':
                        return self._send(200, outer_model.status())
                    if self.path == '/v2/cudasharedmemory/status':
                        return self._send(200, [])
                    if parts[:3] == ['v2', 'systemsharedmemory', 'region'] and parts[-1] == 'register':
                        outer_model.register(parts[3], body['key'], body.get('offset', 0), body['byte_size'])
                        return self._send(200, None)
                    if parts[:3] == ['v2', 'systemsharedmemory', 'region'] and parts[-1] == 'unregister':
                        outer_model.unregister(parts[3])
                        return self._send(200, None)
                    return self._send(404, {'error': 'Not Found'})
                except Refusal as exc:
                    return self._send(exc.codes[0], {'error': exc.text})

            do_GET = do_POST = _route  # noqa: N815 (http.server API)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}'
        threading.Thread(target=self.httpd.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _GrpcService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's gRPC service for the model, with its status codes."""

    def __init__(self, model: Versioned) -> None:
        self.model = model

    def _do(self, context: object, call: object) -> object:
        try:
            return call()
        except Refusal as exc:
            context.abort(exc.codes[1], exc.text)

    def ServerMetadata(self, request, context):  # noqa: N802 (grpc API)
        return service_pb2.ServerMetadataResponse(name='triton', version=self.model.version,
                                                  extensions=['system_shared_memory', 'cuda_shared_memory'])

    def ServerLive(self, request, context):  # noqa: N802
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=True)

    def SystemSharedMemoryStatus(self, request, context):  # noqa: N802
        regions = self._do(context, self.model.status)
        return grpc_status_response(regions)

    def CudaSharedMemoryStatus(self, request, context):  # noqa: N802
        return service_pb2.CudaSharedMemoryStatusResponse()

    def SystemSharedMemoryRegister(self, request, context):  # noqa: N802
        self._do(context, lambda: self.model.register(request.name, request.key, request.offset, request.byte_size))
        return service_pb2.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, request, context):  # noqa: N802
        self._do(context, lambda: self.model.unregister(request.name))
        return service_pb2.SystemSharedMemoryUnregisterResponse()


class _GrpcFront:
    def __init__(self, model: Versioned) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_GrpcService(model), self.server)
        self.url = f"grpc://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def close(self) -> None:
        self.server.stop(0)


CLIENTS = {'http': TritonClient, 'grpc': TritonGrpcClient}
FRONTS = {'http': _HttpFront, 'grpc': _GrpcFront}


@pytest.fixture(params=['http', 'grpc'])
def serve(request):
    """serve(model) -> the collection's real client of that transport, talking to the model over it."""
    opened = []

    def start(model: Versioned):
        front = FRONTS[request.param](model)
        client = CLIENTS[request.param](front.url, timeout=5)
        opened.append((front, client))
        return client
    yield start
    for front, client in opened:
        client.close()
        front.close()


# server_proc, shm and complete_scan: conftest.py
pytestmark = pytest.mark.usefixtures('complete_scan')


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def ops(client, shm_dir, pid, **kw) -> tuple[RegionOps, list]:
    p = dict(state='absent', kind='system', name=[], key=None, offset=0, byte_size=None, create_file=False,
             raw_handle=None, device_id=None, stale=False, all=False, orphan_files=False, orphan_patterns=[],
             min_age=300, exclude=[], remove_file=True, in_use_timeout=10, server_pid=pid, shm_dir=shm_dir,
             reserved=False, backend_patterns=None, inventory=False)
    p.update(kw)
    warnings: list = []
    clock = Clock()
    return RegionOps(client, p, warn=warnings.append, sleep=clock.sleep, clock=clock.clock, serialise=False), warnings


def run(client, shm_dir, pid, **kw) -> dict:
    op, warnings = ops(client, shm_dir, pid, **kw)
    op.run()
    result = op.result()
    result['warnings'] = warnings
    return result


def make_file(shm_dir: str, name: str, size: int = 64 * KIB) -> str:
    path = os.path.join(shm_dir, name)
    with open(path, 'wb') as f:
        f.write(b'\1' * size)
    return path


def listed(model: Versioned, name: str, key: str | None = None, size: int = 64 * KIB) -> None:
    model.regions[name] = dict(name=name, key=key or f'/{name}', offset=0, byte_size=size)


def transport_code(client, codes: tuple) -> int | str:
    return codes[0] if client.transport == 'http' else codes[1].name


# -- 2.50: in use, refused, retried ------------------------------------------------------------------

def test_2_50_in_use_is_retried_then_unregistered(serve, shm, server_proc):
    model = Versioned('2.50.0')
    client = serve(model)
    make_file(shm, 'busy')
    listed(model, 'busy')
    model.in_flight['busy'] = 2      # refused twice, then the requests are done
    res = run(client, shm, server_proc.pid, name=['busy'])
    assert res['unregistered'] == ['busy'] and res['pending'] == [] and os.listdir(shm) == []
    assert model.calls.count('unregister') == 3


def test_2_50_in_use_past_the_timeout_is_skipped_with_the_servers_reason(serve, shm, server_proc):
    model = Versioned('2.52.0')
    client = serve(model)
    make_file(shm, 'busy')
    listed(model, 'busy')
    model.in_flight['busy'] = -1
    with pytest.raises(RegionInUse) as err:
        client.unregister('system', 'busy')
    assert err.value.status == transport_code(client, INTERNAL) and err.value.server_error == IN_USE.format('busy')
    res = run(client, shm, server_proc.pid, name=['busy'], in_use_timeout=1)
    assert res['unregistered'] == [] and res['pending'] == [] and os.listdir(shm) == ['busy']
    skipped = {s.get('name'): s['reason'] for s in res['skipped_items']}
    assert skipped['busy'] == f"still in use after 1s (requests in flight): {IN_USE.format('busy')}"


# -- 2.53: deferred unregister ----------------------------------------------------------------------

def test_2_53_deferred_unregister_waits_then_removes_the_file(serve, shm, server_proc):
    model = Versioned('2.53.0')
    client = serve(model)
    path = make_file(shm, 'busy')
    listed(model, 'busy')
    model.in_flight['busy'] = 3      # listed for three more status reads after the unregister
    res = run(client, shm, server_proc.pid, name=['busy'])
    assert model.log == [DEFERRED_LOG.format('busy')], 'the server deferred it: its only trace is the log line'
    assert res['unregistered'] == ['busy'] and res['pending'] == [] and res['removed_files'] == [path]
    assert res['changed'] is True and res['warnings'] == [] and os.listdir(shm) == []


def test_2_53_deferred_past_the_timeout_is_pending_and_its_file_kept(serve, shm, server_proc):
    model = Versioned('2.73.0')
    client = serve(model)
    path = make_file(shm, 'busy')
    listed(model, 'busy')
    model.in_flight['busy'] = -1     # requests that outlast in_use_timeout
    res = run(client, shm, server_proc.pid, name=['busy'], in_use_timeout=2)
    assert res['pending'] == ['busy'] and res['unregistered'] == [] and res['changed'] is True
    assert res['removed_files'] == [] and os.listdir(shm) == ['busy'], 'never unlinked while listed'
    skipped = {s.get('name') or s.get('path'): s['reason'] for s in res['skipped_items']}
    assert skipped['busy'].startswith('pending: unregistered, but still listed by the server after 2s')
    assert skipped[path] == "region 'busy' is still registered"
    assert any("region 'busy' is pending" in w and '2s' in w for w in res['warnings'])
    assert [r['name'] for r in res['regions']] == ['busy']
    # a later run while it is still listed: unregistered again (accepted), gone once the requests finish, file removed
    model.in_flight['busy'] = 2
    again = run(client, shm, server_proc.pid, name=['busy'])
    assert again['unregistered'] == ['busy'] and again['pending'] == [] and again['removed_files'] == [path]
    assert os.listdir(shm) == []


# -- 2.58: integer overflow ------------------------------------------------------------------------

def test_2_58_integer_overflow_is_its_own_clear_error(serve):
    model = Versioned('2.58.0')
    client = serve(model)
    with pytest.raises(RegisterOverflow) as err:
        client.register_system('big', '/big', 1, SIZE_MAX)
    text = OVERFLOW.format(SIZE_MAX, 1, SIZE_MAX, 'big')
    assert err.value.server_error == text and err.value.status == transport_code(client, INVALID_ARG)
    assert err.value.msg.endswith(f'{text}; {OVERFLOW_HINT}') and 'Triton 2.58' in err.value.msg
    assert 'big' not in model.regions


def test_before_2_58_the_same_register_is_not_an_overflow_error(serve):
    model = Versioned('2.57.0')
    client = serve(model)
    client.register_system('big', '/big', 1, SIZE_MAX)
    assert 'big' in model.regions


# -- 2.60 / 2.61: reserved prefix and invalid keys --------------------------------------------------

@pytest.mark.parametrize('version, key, text', [
    ('2.60.0', f'{PREFIX}x', RESERVED),        # 2.60 compares the key as given: '/triton_python_…' passes there
    ('2.61.0', f'///{PREFIX}x', RESERVED),     # 2.61 strips leading slashes before the check
    ('2.61.0', '///', INVALID_KEY),
])
def test_the_servers_own_key_refusals_are_classified(serve, version, key, text):
    model = Versioned(version)
    client = serve(model)
    with pytest.raises(ReservedKey) as err:
        client.register_system('sneaky', key, 0, KIB)
    assert err.value.server_error == text.format('sneaky', key)
    assert err.value.status == transport_code(client, INVALID_ARG)
    assert err.value.msg.endswith(f'; {RESERVED_KEY_HINT}')


@pytest.mark.parametrize('key, why', [
    (f'/{PREFIX}x', 'Triton 2.60 and later refuse it as a reserved prefix'),
    (f'{PREFIX}x', 'Triton 2.60 and later refuse it as a reserved prefix'),
    (f'//{PREFIX}x', 'Triton 2.60 and later refuse it as a reserved prefix, 2.61 and later also after leading slashes'),
    ('/', "Triton 2.61 and later refuse it: '... - invalid shm key '/''"),
    ('////', "Triton 2.61 and later refuse it: '... - invalid shm key '////''"),
    ('/triton_vllm_backend_shm_region_0f3a', "a Python-based backend's files (here the vllm backend's)"),
])
def test_reserved_and_invalid_keys_are_refused_before_the_server_is_called(serve, shm, server_proc, key, why):
    model = Versioned('2.61.0')
    client = serve(model)
    with pytest.raises(ParameterError) as err:
        run(client, shm, server_proc.pid, state='present', name=['sneaky'], key=key, byte_size=KIB, create_file=True)
    assert why in err.value.msg and 'choose' in err.value.msg
    assert model.calls == [] and os.listdir(shm) == [], 'nothing was sent, nothing created'


# -- 2.68: client shared memory off ----------------------------------------------------------------

def test_2_68_client_shm_off_is_one_clear_error_on_both_codes_and_status_still_works(serve, shm, server_proc):
    model = Versioned('2.68.0', client_shm=False)
    client = serve(model)
    assert client.status('system') == []
    for call in (lambda: client.register_system('r', '/r', 0, KIB), lambda: client.unregister('system', 'r')):
        with pytest.raises(ClientShmDisabled) as err:
            call()
        assert err.value.status == transport_code(client, UNSUPPORTED_CODE)
        assert err.value.server_error == CLIENT_SHM_OFF
        assert err.value.msg.endswith(f'{CLIENT_SHM_OFF}; {CLIENT_SHM_HINT}')
        assert "(is this Triton's gRPC port?)" not in err.value.msg
    make_file(shm, 'r')
    with pytest.raises(ClientShmDisabled):
        run(client, shm, server_proc.pid, state='present', name=['r'], key='/r', byte_size=KIB)
    # a read works: nothing registered, nothing to clean, changed=false
    res = run(client, shm, server_proc.pid, stale=True)
    assert res['changed'] is False and res['unregistered'] == []


def test_2_68_with_the_flag_registers(serve):
    model = Versioned('2.68.0', client_shm=True)
    client = serve(model)
    client.register_system('r', '/r', 0, KIB)
    assert [r['name'] for r in client.status('system')] == ['r']


# -- 2.73: tritonfrontend, no shared memory at all ---------------------------------------------------

@pytest.fixture
def http_only(request):
    front = []

    def start(model):
        f = _HttpFront(model)
        front.append(f)
        return TritonClient(f.url, timeout=5)
    yield start
    for f in front:
        f.close()


def test_2_73_frontend_is_reported_plainly_and_never_retried(http_only, shm, server_proc):
    model = Versioned('2.73.0', frontend=True)
    client = http_only(model)
    with pytest.raises(ShmUnsupported) as err:
        client.status('system')
    assert err.value.status == 503 and err.value.server_error == UNSUPPORTED
    assert err.value.msg.endswith(f'{UNSUPPORTED}; {SHM_UNSUPPORTED_HINT}') and 'not a leak' in err.value.msg
    # the region module: fails with that reason, one status call, nothing retried, nothing touched
    make_file(shm, 'client_1')
    model.calls.clear()
    with pytest.raises(ShmUnsupported) as err:
        run(client, shm, server_proc.pid, stale=True, orphan_files=True, orphan_patterns=['*'], min_age=0)
    assert model.calls == ['status'] and os.listdir(shm) == ['client_1']


def test_2_73_frontend_info_reports_instead_of_failing(http_only, shm, server_proc):
    model = Versioned('2.73.0', frontend=True)
    client = http_only(model)
    make_file(shm, 'client_1')
    snap = inventory.read_server(client, server_pid=server_proc.pid, shm_dir=shm, report_unsupported=True)
    result = inventory.info_result(snap, inventory.classify(snap, inventory.Criteria.of(['*'], min_age=0)))
    assert result['server']['shm_unsupported'].endswith(f'{UNSUPPORTED}; {SHM_UNSUPPORTED_HINT}')
    assert result['system_regions'] == [] and result['server']['version'] == '2.73.0'
    assert [(f['name'], f['category']) for f in result['files']] == [('client_1', 'foreign')], 'nothing is called orphan'
    assert any(UNSUPPORTED in w and 'no file is called orphan' in w for w in snap.warnings)
    with pytest.raises(ShmUnsupported):
        inventory.read_server(client, server_pid=server_proc.pid, shm_dir=shm)


def test_older_servers_answer_none_of_these(serve, shm, server_proc):
    """2.51 (the tested server) registers a reserved-prefix key and an overflowing size: only the collection refuses them."""
    model = Versioned('2.51.0')
    client = serve(model)
    client.register_system('a', f'/{PREFIX}x', 0, KIB)
    client.register_system('b', '/b', 1, SIZE_MAX)
    assert sorted(model.regions) == ['a', 'b']
    with pytest.raises(TritonError) as err:
        client.register_system('a', '/a', 0, KIB)
    assert err.type is TritonError and 'already in manager' in err.value.msg   # no subclass: a plain refusal
