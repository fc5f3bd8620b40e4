"""Unit tests for the bulk unregister (issue 22): several unregisters at once over HTTP and gRPC, the same safety rules.

The transports are the real ones (TritonClient over its kept-alive connections, TritonGrpcClient over
one channel), against the unit tests' fake Triton (tests/fakes/fake_triton.py, as 2.51) on loopback,
for what a real server cannot do on demand: refuse one region as in use among many, drop the
connection part-way through a batch. Files are real, holders come from the real /proc scan (see test_region_ops).
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.wire import http_reader, triton_http
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import Triton, serve
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_region_ops import (  # fixtures: conftest
    FakeClock,
    make_file,
    run,
)

COUNT = 60
pytestmark = pytest.mark.usefixtures('complete_scan')


@pytest.fixture
def http_triton():
    """start(model, transport='http') -> the URL of the model served over transport; closed after the test."""
    fronts = []

    def start(model: Triton, transport: str = 'http') -> str:
        fronts.append(serve(model, transport))
        return fronts[-1].url

    yield start
    for front in fronts:
        front.close()


def _client(transport: str, url: str):
    if transport == 'http':
        client = TritonClient(url)
        assert client.use_keep_alive()
        return client
    return TritonGrpcClient(url)


def _scene(shm_dir: str, in_use: dict | None = None, drop_after: int | None = None) -> tuple[Triton, list[str]]:
    """Triton 2.51 with COUNT regions and their files; in_use: name -> refusals before it goes; drop_after: answers."""
    names = [f'r{i:03d}' for i in range(COUNT)]
    shared = Triton('2.51.0', shm_dir=shm_dir)
    for n in names:
        make_file(shm_dir, n, size=4096)
        shared.list(n, byte_size=4096)
    shared.in_flight.update(in_use or {})
    shared.drop_after = drop_after
    return shared, names


@pytest.fixture(params=['http', 'grpc'])
def transport(request, http_triton):
    return request.param, lambda model: http_triton(model, request.param)


def test_many_unregisters_go_out_at_once_and_each_file_goes_only_after_its_own_unregister(transport, shm, server_proc):
    kind, start = transport
    shared, names = _scene(shm)
    res = run(_client(kind, start(shared)), shm, server_proc.pid, stale=True)
    assert res['unregistered'] == names  # in the order selected, whatever order the answers came in
    assert sorted(os.path.basename(p) for p in res['removed_files']) == names
    assert os.listdir(shm) == [] and shared.status() == []
    assert sorted(n for n, _existed in shared.seen) == names  # one unregister per region
    assert all(existed for _n, existed in shared.seen)  # no file unlinked before its region's unregister
    if kind == 'http':
        assert len(shared.peers) == 1  # one kept-alive connection for the whole batch


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
    shared, names = _scene(shm, in_use={'r005': 10**6})
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
    assert failed.value.status is None  # no answer: the transport failed
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
    from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import RegionOps  # pylint: disable=import-outside-toplevel
    from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_region_ops import params  # pylint: disable=import-outside-toplevel

    shared, names = _scene(shm, drop_after=30)
    ops = RegionOps(_client('http', http_triton(shared)), params(shm, server_proc.pid, stale=True), serialise=False)
    with pytest.raises(TritonError):
        ops.run()
    done = ops.result(finished=False)
    assert len(done['unregistered']) == 30 and len(done['removed_files']) == 30
    assert set(done['unregistered']) == set(names) - {r['name'] for r in shared.status()}
    assert done['unregistered'] == sorted(done['unregistered'])


@pytest.mark.parametrize(
    'data,expected',
    [
        (b'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n', (200, 'OK', b'', False)),
        (
            b'HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}',
            (400, 'Bad Request', b'{}', True),
        ),
        (
            b'HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n',
            (400, 'Bad Request', b'{}', False),
        ),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab', None),  # incomplete: wait for more
        (b'HTTP/1.1 200 OK\r\nContent-', None),
    ],
)
def test_answers_are_parsed_as_http_says(data, expected):
    # a complete answer uses the whole buffer (the one reader of every HTTP path: http_reader)
    resp, used = http_reader.read_one(data, triton_http.MAX_ANSWER_BYTES)
    got = resp and (resp.status, resp.reason, resp.body, not resp.keep_alive)
    assert got == expected and used == (len(data) if expected else 0)


def test_what_is_not_an_http_answer_is_refused():
    with pytest.raises(ValueError):
        http_reader.read_one(b'SSH-2.0-OpenSSH\r\n\r\n', triton_http.MAX_ANSWER_BYTES)
