"""Triton 2.50 to 2.73, each answering as that version does, over HTTP (status codes) and gRPC (status codes).

No wheel bundles a server newer than 2.51, so the behaviour of newer ones (from Triton's
src/shared_memory_manager.cc, http_server.cc and grpc/grpc_server.cc) is played by the unit
tests' one fake Triton (tests/fakes/fake_triton.py: a model of the server per version) served
twice on 127.0.0.1: over HTTP with Triton's routes and status codes, and over gRPC with
tritonclient's messages and Triton's status codes. The collection's real clients (triton_http.TritonClient,
triton_grpc.TritonGrpcClient) and RegionOps talk to them; files live in a real temporary shm
directory and a real process stands in for tritonserver.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip('grpc')
pytest.importorskip('tritonclient.grpc.service_pb2')

# pylint: disable=wrong-import-position
from ansible_collections.tritonops.shm.plugins.module_utils.errors import (  # noqa: E402
    ClientShmDisabled,
    ParameterError,
    RegionInUse,
    RegisterOverflow,
    ReservedKey,
    Restricted,
    ShmUnsupported,
    TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.host import snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, results
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import RegionOps  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import (  # noqa: E402
    CLIENT_SHM_HINT,
    OVERFLOW_HINT,
    RESERVED_KEY_HINT,
    SHM_UNSUPPORTED_HINT,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient  # noqa: E402
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import (  # noqa: E402
    CLIENT_SHM_OFF,
    DEFERRED_LOG,
    IN_USE,
    INTERNAL,
    INVALID_ARG,
    INVALID_KEY,
    KIB,
    OVERFLOW,
    PREFIX,
    RESERVED,
    RESTRICTED_GRPC,
    RESTRICTED_HTTP,
    SIZE_MAX,
    UNSUPPORTED,
    UNSUPPORTED_CODE,
    HttpFront,
    Triton,
)
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import (
    serve as serve_over,
)
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_region_ops import params as region_params

CLIENTS = {'http': TritonClient, 'grpc': TritonGrpcClient}


@pytest.fixture(params=['http', 'grpc'])
def serve(request):
    """serve(model) -> the collection's real client of that transport, talking to the model over it."""
    opened = []

    def start(model: Triton):
        front = serve_over(model, request.param)
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
    p = region_params(shm_dir, pid, **{'backend_patterns': None, **kw})
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


def listed(model: Triton, name: str, key: str | None = None, size: int = 64 * KIB) -> None:
    model.list(name, key, size)


def transport_code(client, codes: tuple) -> int | str:
    return codes[0] if client.transport == 'http' else codes[1]


# -- 2.50: in use, refused, retried ------------------------------------------------------------------


def test_2_50_in_use_is_retried_then_unregistered(serve, shm, server_proc):
    model = Triton('2.50.0')
    client = serve(model)
    make_file(shm, 'busy')
    listed(model, 'busy')
    model.in_flight['busy'] = 2  # refused twice, then the requests are done
    res = run(client, shm, server_proc.pid, name=['busy'])
    assert res['unregistered'] == ['busy'] and res['pending'] == [] and os.listdir(shm) == []
    assert model.calls.count('unregister') == 3


def test_2_50_in_use_past_the_timeout_is_skipped_with_the_servers_reason(serve, shm, server_proc):
    model = Triton('2.52.0')
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
    assert skipped['busy'] == f'still in use after 1s (requests in flight): {IN_USE.format("busy")}'


# -- 2.53: deferred unregister ----------------------------------------------------------------------


def test_2_53_deferred_unregister_waits_then_removes_the_file(serve, shm, server_proc):
    model = Triton('2.53.0')
    client = serve(model)
    path = make_file(shm, 'busy')
    listed(model, 'busy')
    model.in_flight['busy'] = 3  # listed for three more status reads after the unregister
    res = run(client, shm, server_proc.pid, name=['busy'])
    assert model.log == [DEFERRED_LOG.format('busy')], 'the server deferred it: its only trace is the log line'
    assert res['unregistered'] == ['busy'] and res['pending'] == [] and res['removed_files'] == [path]
    assert res['changed'] is True and res['warnings'] == [] and os.listdir(shm) == []


def test_2_53_deferred_past_the_timeout_is_pending_and_its_file_kept(serve, shm, server_proc):
    model = Triton('2.73.0')
    client = serve(model)
    path = make_file(shm, 'busy')
    listed(model, 'busy')
    model.in_flight['busy'] = -1  # requests that outlast in_use_timeout
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


# -- wedged: a region Triton will not let go, run after run (issue 42, goal 5) ----------------------------------


@pytest.mark.parametrize('version', ['2.52.0', '2.53.0'])
def test_a_region_refused_or_deferred_three_runs_running_is_wedged_and_counted(
    serve, shm, server_proc, tmp_path, version
):
    """2.50 to 2.52 refuse the unregister while in use, 2.53 and later defer it; a reference leaked inside the server
    (server issue 7688) makes either last for good. Three stale cleanups that leave it registered make it wedged: the
    summary counts it and its bytes (what a restart frees), and the next run tries it once and waits for nothing."""
    model = Triton(version)
    client = serve(model)
    make_file(shm, 'stuck')
    listed(model, 'stuck')
    model.in_flight['stuck'] = -1
    locks = str(tmp_path / 'locks')

    def stale_run():
        p = region_params(shm, server_proc.pid, backend_patterns=None, stale=True, in_use_timeout=1, wedged_after=3)
        clock = Clock()
        op = RegionOps(client, p, warn=lambda m: None, sleep=clock.sleep, clock=clock.clock, lock_dir=locks)
        try:
            op.run()
            return op.result(), clock
        finally:
            op.release()

    def info():
        snap = snapshot.read_server(client, server_pid=server_proc.pid, shm_dir=shm, lock_dir=locks)
        return results.info_result(snap, classification.classify(snap, classification.Criteria.of(wedged_after=3)))

    for _run in range(3):
        res, clock = stale_run()
        assert res['removed_files'] == [] and os.listdir(shm) == ['stuck'], res
    summary = info()['summary']
    assert summary['wedged_regions'] == 1 and summary['stale_regions'] == 0, summary
    assert summary['wedged_bytes'] == 64 * KIB
    calls = model.calls.count('unregister')
    res, clock = stale_run()
    assert model.calls.count('unregister') == calls + 1 and clock.sleeps == [], 'tried once, nothing waited out'
    assert os.listdir(shm) == ['stuck'], 'never unlinked while registered'
    # the reference comes back (or the server restarts): the region goes, and the record with it
    model.in_flight['stuck'] = 0
    res, _clock = stale_run()
    assert res['removed_files'] and os.listdir(shm) == [] and info()['summary']['wedged_regions'] == 0


# -- 2.58: integer overflow ------------------------------------------------------------------------


def test_2_58_integer_overflow_is_its_own_clear_error(serve):
    model = Triton('2.58.0')
    client = serve(model)
    with pytest.raises(RegisterOverflow) as err:
        client.register('system', 'big', dict(key='/big', offset=1, byte_size=SIZE_MAX))
    text = OVERFLOW.format(SIZE_MAX, 1, SIZE_MAX, 'big')
    assert err.value.server_error == text and err.value.status == transport_code(client, INVALID_ARG)
    assert err.value.msg.endswith(f'{text}; {OVERFLOW_HINT}') and 'Triton 2.58' in err.value.msg
    assert 'big' not in model.regions


def test_before_2_58_the_same_register_is_not_an_overflow_error(serve):
    model = Triton('2.57.0')
    client = serve(model)
    client.register('system', 'big', dict(key='/big', offset=1, byte_size=SIZE_MAX))
    assert 'big' in model.regions


# -- 2.60 / 2.61: reserved prefix and invalid keys --------------------------------------------------


@pytest.mark.parametrize(
    'version, key, text',
    [
        ('2.60.0', f'{PREFIX}x', RESERVED),  # 2.60 compares the key as given: '/triton_python_…' passes there
        ('2.61.0', f'///{PREFIX}x', RESERVED),  # 2.61 strips leading slashes before the check
        ('2.61.0', '///', INVALID_KEY),
    ],
)
def test_the_servers_own_key_refusals_are_classified(serve, version, key, text):
    model = Triton(version)
    client = serve(model)
    with pytest.raises(ReservedKey) as err:
        client.register('system', 'sneaky', dict(key=key, offset=0, byte_size=KIB))
    assert err.value.server_error == text.format('sneaky', key)
    assert err.value.status == transport_code(client, INVALID_ARG)
    assert err.value.msg.endswith(f'; {RESERVED_KEY_HINT}')


@pytest.mark.parametrize(
    'key, why',
    [
        (f'/{PREFIX}x', 'Triton 2.60 and later refuse it as a reserved prefix'),
        (f'{PREFIX}x', 'Triton 2.60 and later refuse it as a reserved prefix'),
        (
            f'//{PREFIX}x',
            'Triton 2.60 and later refuse it as a reserved prefix, 2.61 and later also after leading slashes',
        ),
        ('/', "Triton 2.61 and later refuse it: '... - invalid shm key '/''"),
        ('////', "Triton 2.61 and later refuse it: '... - invalid shm key '////''"),
        ('/triton_vllm_backend_shm_region_0f3a', "a Python-based backend's files (here the vllm backend's)"),
    ],
)
def test_reserved_and_invalid_keys_are_refused_before_the_server_is_called(serve, shm, server_proc, key, why):
    model = Triton('2.61.0')
    client = serve(model)
    with pytest.raises(ParameterError) as err:
        run(client, shm, server_proc.pid, state='present', name=['sneaky'], key=key, byte_size=KIB, create_file=True)
    assert why in err.value.msg and 'choose' in err.value.msg
    assert model.calls == [] and os.listdir(shm) == [], 'nothing was sent, nothing created'


# -- 2.68: client shared memory off ----------------------------------------------------------------


def test_2_68_client_shm_off_is_one_clear_error_on_both_codes_and_status_still_works(serve, shm, server_proc):
    model = Triton('2.68.0', client_shm=False)
    client = serve(model)
    assert client.status('system') == []
    for call in (
        lambda: client.register('system', 'r', dict(key='/r', offset=0, byte_size=KIB)),
        lambda: client.unregister('system', 'r'),
    ):
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
    model = Triton('2.68.0', client_shm=True)
    client = serve(model)
    client.register('system', 'r', dict(key='/r', offset=0, byte_size=KIB))
    assert [r['name'] for r in client.status('system')] == ['r']


# -- 2.73: tritonfrontend, no shared memory at all ---------------------------------------------------


@pytest.fixture
def http_only(request):
    front = []

    def start(model):
        f = HttpFront(model)
        front.append(f)
        return TritonClient(f.url, timeout=5)

    yield start
    for f in front:
        f.close()


def test_2_73_frontend_is_reported_plainly_and_never_retried(http_only, shm, server_proc):
    model = Triton('2.73.0', frontend=True)
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
    model = Triton('2.73.0', frontend=True)
    client = http_only(model)
    make_file(shm, 'client_1')
    snap = snapshot.read_server(client, server_pid=server_proc.pid, shm_dir=shm, report_unsupported=True)
    result = results.info_result(snap, classification.classify(snap, classification.Criteria.of(['*'], min_age=0)))
    assert result['server']['shm_unsupported'].endswith(f'{UNSUPPORTED}; {SHM_UNSUPPORTED_HINT}')
    assert result['system_regions'] == [] and result['server']['version'] == '2.73.0'
    assert [(f['name'], f['category']) for f in result['files']] == [('client_1', 'foreign')], (
        'nothing is called orphan'
    )
    assert any(UNSUPPORTED in w and 'no file is called orphan' in w for w in snap.warnings)
    with pytest.raises(ShmUnsupported):
        snapshot.read_server(client, server_pid=server_proc.pid, shm_dir=shm)


def test_older_servers_answer_none_of_these(serve, shm, server_proc):
    """2.51 (the tested server) registers a reserved-prefix key and an overflowing size: only the collection refuses them."""
    model = Triton('2.51.0')
    client = serve(model)
    client.register('system', 'a', dict(key=f'/{PREFIX}x', offset=0, byte_size=KIB))
    client.register('system', 'b', dict(key='/b', offset=1, byte_size=SIZE_MAX))
    assert sorted(model.regions) == ['a', 'b']
    with pytest.raises(TritonError) as err:
        client.register('system', 'a', dict(key='/a', offset=0, byte_size=KIB))
    assert err.type is TritonError and 'already in manager' in err.value.msg  # no subclass: a plain refusal


# -- restricted APIs: --http-restricted-api / --grpc-restricted-protocol=shared-memory:KEY=VALUE ------------------


def test_a_restricted_shm_api_refuses_without_its_header_and_answers_with_it(serve):
    model = Triton('2.51.0', restricted=('admin-key', 's3cret'))
    client = serve(model)
    header, value = model.restriction(client.transport)  # gRPC: 'triton-grpc-protocol-admin-key'
    with pytest.raises(TritonError) as err:
        client.status('system')
    text = (RESTRICTED_HTTP if client.transport == 'http' else RESTRICTED_GRPC).format(header)
    assert isinstance(err.value, Restricted) and err.value.header == header and err.value.server_error == text
    assert text in err.value.msg and model.calls == [], 'refused before the shared memory manager'
    assert client.server_metadata()['version'] == '2.51.0', 'only the shared-memory API is restricted'
    with type(client)(client.base, timeout=5, headers={header: value}) as allowed:
        allowed.register('system', 'r', dict(key='/r', offset=0, byte_size=KIB))
        assert [r['name'] for r in allowed.status('system')] == ['r']
