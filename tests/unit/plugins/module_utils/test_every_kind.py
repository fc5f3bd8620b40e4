"""One call per host (issue 41, goal 7): triton_shm_region state=absent kind=all cleans every kind the server offers.

The system part runs as kind=system does (regions, files, inventory, threshold); then, under the same per-server lock
and on the same connection, the CUDA part runs as kind=cuda does with the same selectors. The status and unregister
answers come from test_region_ops' FakeTriton; NVML reads the H200's recorded shapes (test_cuda_reclaim's reader).
"""

from __future__ import annotations

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.host import runlock
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import run_steps
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import EveryKind
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_cuda_reclaim import reader
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_region_ops import (
    FakeClock,
    FakeTriton,
    make_file,
    params,
    region,
)

MIB = 1 << 20
pytestmark = pytest.mark.usefixtures('complete_scan')  # this sandbox's init cannot be read (conftest)


def every(fake, shm, pid, check_mode=False, **kw):
    clock = FakeClock()
    warnings = []
    op = EveryKind(
        fake,
        params(shm, pid, **dict(dict(kind='all', stale=True, inventory=True), **kw)),
        check_mode=check_mode,
        warn=warnings.append,
        sleep=clock.sleep,
        clock=clock.clock,
        read_nvml=reader(fake, pid),
    )
    return op, warnings


def scene(shm):
    make_file(shm, 'sys_dead')
    return FakeTriton(
        shm,
        regions=[region('sys_dead')],
        cuda=[dict(name='cuda_dead', device_id=0, byte_size=1024 * MIB)],
    )


def test_one_call_cleans_the_system_regions_then_the_cuda_regions_under_one_lock(shm, cuda_server_proc, monkeypatch):
    fake = scene(shm)
    taken = []
    real_acquire = runlock.ServerLock.acquire

    def acquire(self):
        taken.append(self.path)
        return real_acquire(self)

    monkeypatch.setattr(runlock.ServerLock, 'acquire', acquire)
    op, warnings = every(fake, shm, cuda_server_proc.pid)
    result = run_steps(op, False)
    assert result['unregistered'] == ['sys_dead'] and result['removed_files'] == [f'{shm}/sys_dead'], result
    assert result['kinds']['cuda']['unregistered'] == ['cuda_dead'], result['kinds']
    assert result['kinds']['cuda']['freed_gpu_bytes'] == 1024 * MIB
    assert result['changed'] is True and fake.regions == {} and fake.cuda == {}
    assert len(taken) == 1, taken  # the CUDA part runs under the system part's lock, never a second one
    assert [c for c in fake.calls if c[0] == 'unregister'] == [
        ('unregister', 'system', 'sys_dead', True),
        ('unregister', 'cuda', 'cuda_dead', None),
    ]
    assert 'before' in result and 'before' not in result['kinds']['cuda']  # the inventory is the system part's
    assert warnings == []
    op, _w = every(fake, shm, cuda_server_proc.pid)
    again = run_steps(op, False)
    assert again['changed'] is False and again['kinds']['cuda']['changed'] is False


def test_check_mode_reports_both_kinds_and_changes_nothing(shm, cuda_server_proc):
    fake = scene(shm)
    op, _w = every(fake, shm, cuda_server_proc.pid, check_mode=True)
    result = run_steps(op, True)
    assert result['changed'] is True
    assert result['unregistered'] == ['sys_dead'] and result['kinds']['cuda']['unregistered'] == ['cuda_dead']
    assert set(fake.regions) == {'sys_dead'} and set(fake.cuda) == {'cuda_dead'}
    assert not [c for c in fake.calls if c[0] == 'unregister']


def test_a_server_without_cuda_shared_memory_gets_no_cuda_part(shm, cuda_server_proc, monkeypatch):
    fake = scene(shm)
    monkeypatch.setattr(
        fake, 'server_metadata', lambda: dict(name='triton', version='2.51.0', extensions=['system_shared_memory'])
    )
    op, _w = every(fake, shm, cuda_server_proc.pid)
    result = run_steps(op, False)
    assert result['kinds'] == {} and result['unregistered'] == ['sys_dead']
    assert ('status', 'cuda') not in fake.calls and set(fake.cuda) == {'cuda_dead'}


def test_only_the_cuda_part_changing_is_a_change(shm, cuda_server_proc):
    fake = FakeTriton(shm, cuda=[dict(name='cuda_dead', device_id=0, byte_size=MIB)])
    op, _w = every(fake, shm, cuda_server_proc.pid)
    result = run_steps(op, False)
    assert result['unregistered'] == [] and result['kinds']['cuda']['unregistered'] == ['cuda_dead']
    assert result['changed'] is True


def test_a_failing_cuda_part_names_itself_and_keeps_what_the_system_part_did(shm, cuda_server_proc):
    fake = scene(shm)
    fake.fail_unregister_at = 2  # the system unregister succeeds, the CUDA one loses the connection
    op, _w = every(fake, shm, cuda_server_proc.pid)
    with pytest.raises(TritonError, match=r'^cuda regions, after the system regions were done: unregister cuda'):
        run_steps(op, False)
    partial = op.result(op.outcome, finished=False)
    assert partial['unregistered'] == ['sys_dead'] and partial['removed_files'] == [f'{shm}/sys_dead']
    assert 'cuda' in partial['kinds'] and partial['kinds']['cuda']['unregistered'] == []


@pytest.mark.parametrize(
    'selector',
    [
        dict(orphan_files=True, orphan_patterns=['orphan_*'], min_age=0),
        dict(backend_leftovers=True),
        dict(families=['nccl']),
        dict(suspect=True),
    ],
    ids=['orphan_files', 'backend_leftovers', 'families', 'suspect'],
)
def test_file_selectors_alone_clean_the_files_and_leave_the_cuda_regions_alone(
    shm, cuda_server_proc, wait_older, selector
):
    """The selectors of the shm directory's files are the system part's: the CUDA part selects no region by them
    (LATER_PART), so it has nothing to do. It must neither fail the call after the system part did its work (a
    ParameterError 'needs a selector' on every run) nor unregister a CUDA region the user did not select."""
    path = make_file(shm, 'orphan_1')
    wait_older([path], 0)
    fake = FakeTriton(shm, cuda=[dict(name='cuda_live', device_id=0, byte_size=MIB)])
    op, _w = every(fake, shm, cuda_server_proc.pid, **dict(selector, stale=False))
    result = run_steps(op, False)
    assert result['kinds'] == {}, result['kinds']
    assert set(fake.cuda) == {'cuda_live'} and ('status', 'cuda') not in fake.calls
    if 'orphan_files' in selector:
        assert result['removed_files'] == [path], result
