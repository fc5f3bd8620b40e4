"""Unit tests for the bulk unregister (issue 22): several unregisters at once over HTTP and gRPC, the same safety rules.

The transports are the real ones (TritonClient over its kept-alive connections, TritonGrpcClient over
one channel), against loopback servers that fake Triton's shared-memory API for what a real server
cannot do on demand: refuse one region as in use among many, drop the connection part-way through a
batch. Files are real, holders come from the real /proc scan (see test_region_ops).
"""
from __future__ import annotations

import http.server
import json
import os
import threading

from concurrent import futures

import grpc
import pytest

from tritonclient.grpc import service_pb2, service_pb2_grpc

from ansible_collections.tritonops.shm.plugins.module_utils import http_reader, triton_http
from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.triton_http import TritonClient
from ansible_collections.tritonops.shm.plugins.module_utils.triton_grpc import TritonGrpcClient
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.grpc_answers import grpc_status_response
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_region_ops import (  # fixtures server_proc, shm, complete_scan: conftest
    FakeClock, make_file, region, run,
)

IN_USE = "Cannot unregister shared memory region '%s', it is currently in use."
COUNT = 60
pytestmark = pytest.mark.usefixtures('complete_scan')


class Shared:
    """One server's regions, shared by the fake servers' threads; each unregister records whether its file still existed."""

    def __init__(self, shm_dir: str, names: list[str], in_use: dict | None = None, drop_after: int | None = None) -> None:
        self.shm_dir = shm_dir
        self.regions = {n: region(n, byte_size=4096) for n in names}
        self.in_use = dict(in_use or {})       # name -> refusals left
        self.drop_after = drop_after           # answer this many unregisters, then drop every connection
        self.answered = 0
        self.seen = []                         # (name, file existed when the unregister arrived)
        self.peers = set()
        self.lock = threading.Lock()

    def unregister(self, name: str, peer: object = None) -> str | None:
        """None (done), 'in use', or 'drop' (no answer)."""
        with self.lock:
            self.peers.add(peer)
            self.seen.append((name, os.path.exists(os.path.join(self.shm_dir, name))))
            if self.drop_after is not None and self.answered >= self.drop_after:
                return 'drop'
            self.answered += 1
            if self.in_use.get(name):
                self.in_use[name] -= 1
                return 'in use'
            self.regions.pop(name, None)
            return None

    def status(self) -> list[dict]:
        with self.lock:
            return [dict(self.regions[n]) for n in sorted(self.regions)]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        shared = self.server.shared
        if self.path == '/v2':
            self._json(200, {'name': 'triton', 'version': '2.51.0', 'extensions': ['system_shared_memory']})
        elif self.path == '/v2/systemsharedmemory/status':
            self._json(200, shared.status())
        else:
            self._json(404, {'error': 'not found'})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get('Content-Length') or 0))
        name = self.path.split('/')[-2]
        outcome = self.server.shared.unregister(name, self.client_address)
        if outcome == 'drop':
            self.close_connection = True
            self.connection.shutdown(2)
        elif outcome == 'in use':
            self._json(400, {'error': IN_USE % name})
        else:
            self._json(200, {})


@pytest.fixture
def http_triton():
    servers = []

    def start(shared: Shared) -> str:
        server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Handler)
        server.daemon_threads = True
        server.shared = shared
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f'http://127.0.0.1:{server.server_address[1]}'
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def ServerMetadata(self, request, context):  # noqa: N802 (grpc API)
        return service_pb2.ServerMetadataResponse(name='triton', version='2.51.0', extensions=['system_shared_memory'])

    def SystemSharedMemoryStatus(self, request, context):  # noqa: N802
        return grpc_status_response(self.shared.status())

    def SystemSharedMemoryUnregister(self, request, context):  # noqa: N802
        outcome = self.shared.unregister(request.name)
        if outcome == 'drop':
            context.abort(grpc.StatusCode.UNAVAILABLE, 'Socket closed')
        if outcome == 'in use':
            context.abort(grpc.StatusCode.INTERNAL, IN_USE % request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()


@pytest.fixture
def grpc_triton():
    servers = []

    def start(shared: Shared) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(shared), server)
        port = server.add_insecure_port('127.0.0.1:0')
        server.start()
        servers.append(server)
        return f'grpc://127.0.0.1:{port}'
    yield start
    for server in servers:
        server.stop(0)


def _client(transport: str, url: str):
    if transport == 'http':
        client = TritonClient(url)
        assert client.use_keep_alive()
        return client
    return TritonGrpcClient(url)


def _scene(shm_dir: str, **kw) -> tuple[Shared, list[str]]:
    names = [f'r{i:03d}' for i in range(COUNT)]
    for n in names:
        make_file(shm_dir, n, size=4096)
    return Shared(shm_dir, names, **kw), names


@pytest.fixture(params=['http', 'grpc'])
def transport(request, http_triton, grpc_triton, monkeypatch):
    start = http_triton if request.param == 'http' else grpc_triton
    return request.param, start


def test_many_unregisters_go_out_at_once_and_each_file_goes_only_after_its_own_unregister(transport, shm, server_proc):
    kind, start = transport
    shared, names = _scene(shm)
    res = run(_client(kind, start(shared)), shm, server_proc.pid, stale=True)
    assert res['unregistered'] == names                      # in the order selected, whatever order the answers came in
    assert sorted(os.path.basename(p) for p in res['removed_files']) == names
    assert os.listdir(shm) == [] and shared.status() == []
    assert sorted(n for n, _existed in shared.seen) == names   # one unregister per region
    assert all(existed for _n, existed in shared.seen)         # no file unlinked before its region's unregister
    if kind == 'http':
        assert len(shared.peers) == 1   # one kept-alive connection for the whole batch


def test_an_in_use_region_among_many_is_retried_with_backoff_and_the_others_go_on(transport, shm, server_proc):
    kind, start = transport
    shared, names = _scene(shm, in_use={'r017': 2})
    clock = FakeClock()
    res = run(_client(kind, start(shared)), shm, server_proc.pid, clock=clock, stale=True)
    assert res['unregistered'] == names and res['skipped_items'] == []
    assert [n for n, _e in shared.seen].count('r017') == 3 and len(clock.sleeps) == 2
    assert os.listdir(shm) == []


def test_an_always_in_use_region_among_many_is_kept_with_its_file(transport, shm, server_proc):
    kind, start = transport
    shared, names = _scene(shm, in_use={'r005': 10 ** 6})
    res = run(_client(kind, start(shared)), shm, server_proc.pid, stale=True, in_use_timeout=2)
    assert res['unregistered'] == [n for n in names if n != 'r005']
    assert os.listdir(shm) == ['r005']
    assert [s['name'] for s in res['skipped_items'] if 'name' in s] == ['r005']
    assert 'still in use after 2s' in res['skipped_items'][0]['reason']


def test_a_connection_dropped_mid_batch_reports_what_was_done_and_a_rerun_converges(transport, shm, server_proc):
    kind, start = transport
    shared, names = _scene(shm, drop_after=25)
    url = start(shared)
    with pytest.raises(TritonError) as failed:
        run(_client(kind, url), shm, server_proc.pid, stale=True)
    assert failed.value.status is None                        # no answer: the transport failed
    gone = set(names) - {r['name'] for r in shared.status()}
    assert len(gone) == 25
    # each file is there exactly when its region still is: removed for the 25 answered, kept for the rest
    assert set(os.listdir(shm)) == set(names) - gone
    shared.drop_after = None
    res = run(_client(kind, url), shm, server_proc.pid, stale=True)
    assert set(res['unregistered']) == set(names) - gone
    assert os.listdir(shm) == [] and shared.status() == []


def test_a_failure_part_way_through_a_batch_keeps_the_work_done_in_the_result(http_triton, shm, server_proc):  # noqa: F811
    """What RegionOps returns after a failure: the result of the work done (the module's failure carries it)."""
    from ansible_collections.tritonops.shm.plugins.module_utils.region_ops import RegionOps  # pylint: disable=import-outside-toplevel
    from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_region_ops import params  # pylint: disable=import-outside-toplevel
    shared, names = _scene(shm, drop_after=30)
    ops = RegionOps(_client('http', http_triton(shared)), params(shm, server_proc.pid, stale=True), serialise=False)
    with pytest.raises(TritonError):
        ops.run()
    done = ops.result(finished=False)
    assert len(done['unregistered']) == 30 and len(done['removed_files']) == 30
    assert set(done['unregistered']) == set(names) - {r['name'] for r in shared.status()}
    assert done['unregistered'] == sorted(done['unregistered'])


@pytest.mark.parametrize('data,expected', [
    (b'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n', (200, 'OK', b'', False)),
    (b'HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}', (400, 'Bad Request', b'{}', True)),
    (b'HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n', (400, 'Bad Request', b'{}', False)),
    (b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab', None),       # incomplete: wait for more
    (b'HTTP/1.1 200 OK\r\nContent-', None),
])
def test_answers_are_parsed_as_http_says(data, expected):
    # a complete answer uses the whole buffer (the one reader of every HTTP path: http_reader)
    resp, used = http_reader.read_one(data, triton_http.MAX_ANSWER_BYTES)
    got = resp and (resp.status, resp.reason, resp.body, not resp.keep_alive)
    assert got == expected and used == (len(data) if expected else 0)


def test_what_is_not_an_http_answer_is_refused():
    with pytest.raises(ValueError):
        http_reader.read_one(b'SSH-2.0-OpenSSH\r\n\r\n', triton_http.MAX_ANSWER_BYTES)
