"""A live client whose main thread has exited (issue 40, goal 1), on the real rig.

The client (tests/rig/leader_exit.c) maps its region's file, closes the descriptor after mmap (the usual C idiom) or
keeps it, registers the region with the real tritonserver, starts a worker thread that keeps writing into it, and ends
its main thread with pthread_exit. The kernel then shows /proc/PID/maps empty and /proc/PID/fd bare, with no error; the
worker's view is under /proc/PID/task/TID/. Before the fix, a stale cleanup (URL only, root) unregistered the region
and removed the file under the running worker. A client SIGKILLed beside it is the positive control: its region is
stale and reclaimed in the same run.
"""

from __future__ import annotations

import os

import pytest
import tritonrig
from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20


def _start(triton, tmp_path, fd_mode, own_pid_namespace):
    program = tritonrig.build_leader_exit(str(tmp_path))
    prefix = ['nsenter', '--mount', '--target', str(triton.pid)]
    if own_pid_namespace:  # a client container's shape: its own PID namespace, the server's /dev/shm
        prefix += ['unshare', '--pid', '--fork', '--kill-child']
    client = tritonrig.LeaderExitClient(program, '/dev/shm/leader', MIB, fd_mode, prefix=prefix)
    status, body = triton.api(
        '/v2/systemsharedmemory/region/leader/register', 'POST', {'key': '/leader', 'offset': 0, 'byte_size': MIB}
    )
    assert status == 200, body
    return client


@pytest.mark.parametrize(
    ('fd_mode', 'own_pid_namespace'),
    [('close', False), ('keep', False), ('close', True)],
    ids=['fd-closed', 'fd-kept', 'own-pid-namespace'],
)
def test_a_client_whose_main_thread_exited_keeps_its_region_and_file(triton, tmp_path, fd_mode, own_pid_namespace):
    client = _start(triton, tmp_path, fd_mode, own_pid_namespace)
    try:
        triton.leak('dead', byte_size=MIB)
        assert client.leader_gone() and client.alive
        info = run_module(INFO, {'url': triton.url})
        assert not info.get('failed'), info
        regions = {r['name']: r for r in info['system_regions']}
        assert regions['leader']['state'] == 'healthy', regions['leader']
        assert client.pid in [h['pid'] for h in regions['leader']['holders']], regions['leader']
        assert regions['dead']['state'] == 'stale', regions['dead']

        result = run_module(REGION, {'url': triton.url, 'state': 'absent', 'stale': True})
        assert not result.get('failed'), result
        assert result['unregistered'] == ['dead'], result
        assert 'leader' in triton.system_regions() and 'leader' in triton.shm_files()
        assert os.path.getsize(triton.shm_path('leader')) == MIB and client.alive
        again = run_module(REGION, {'url': triton.url, 'state': 'absent', 'stale': True})
        assert again['changed'] is False and 'leader' in triton.system_regions(), again
    finally:
        client.stop()
