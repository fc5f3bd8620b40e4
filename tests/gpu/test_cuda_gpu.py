"""The CUDA rule and its reclaim on a real GPU (issue 34, goal 5): the scenes of ../shared/CUDA-FACTS.md, replayed.

Each test starts the wheel's tritonserver on the GPU, real CUDA IPC clients (cuda_client.py) and, where it matters, an
NVML-only process; it asserts what an operator checks: the regions' states and owners in triton_shm_info, what the
cleanup unregistered, and the GPU memory NVML shows back (freed_gpu_bytes, and the server's charge read here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from ansible_helpers import ansible_playbook, run_module  # tests/integration

from ansible_collections.tritonops.shm.plugins.module_utils.host import gpu, nvml

MIB = 1 << 20
INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'


def info(server) -> dict:
    res = run_module(INFO, dict(url=server.url))
    assert not res.get('failed'), res
    return res


def regions(res: dict) -> dict:
    return {r['name']: r for r in res['cuda_regions']}


def charge(server) -> int:
    """What NVML charges to the server now (all GPUs)."""
    value = gpu.server_charge(nvml.read(), server.pid)
    assert value is not None
    return value


def until_stale(server, names: list, timeout: float = 30.0) -> dict:
    """triton_shm_info once every region of names is stale, within timeout seconds: a killed client's context is torn
    down by the driver after the kill, and NVML lists it until then. Fails with each region's state and reason."""
    deadline = time.monotonic() + timeout
    while True:
        res = info(server)
        seen = regions(res)
        if all(seen.get(n, {}).get('state') == 'stale' for n in names):
            return res
        if time.monotonic() > deadline:
            states = {n: (seen.get(n, {}).get('state'), seen.get(n, {}).get('state_reason')) for n in names}
            raise AssertionError(f'not stale {timeout:.0f} s after the kill: {states}')
        time.sleep(0.5)


def settled(server, at_most: int, timeout: float = 15.0) -> int:
    """The server's charge once it is at most at_most bytes (the memory came back), or the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        now = charge(server)
        if now <= at_most or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def cleanup(server, **extra) -> dict:
    """The cleanup playbook with its defaults (the suite runs as root: no become, a GPU machine may have no sudo); the
    host's record (the AWX artifact)."""
    inventory = {'all': {'children': {'triton': {'hosts': {'gpu': dict(
        ansible_connection='local', ansible_python_interpreter=sys.executable, triton_url=server.url)}}}}}  # fmt: skip
    res = ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inventory,
        extra_vars=dict(prometheus_textfile_dir='', triton_become=False, **extra),  # root already: no sudo needed
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )
    assert res.data is not None, res.stdout[-3000:]
    return res.data['global_custom_stats']['tritonops_shm_cleanup']['gpu']


def test_a_killed_client_is_stale_once_no_other_context_remains_and_the_cleanup_gives_its_memory_back(
    triton, clients, nvml_only
):
    live = clients(triton, 'cuda_live', 64 * MIB)
    killed = clients(triton, 'cuda_killed', 256 * MIB)
    print(f'CUDA clients through {live.via}')
    killed.kill()
    seen = regions(info(triton))
    # a live client has a context on the same GPU: it might own either region, so neither is stale; it is named
    assert seen['cuda_live']['state'] == seen['cuda_killed']['state'] == 'unknown'
    owners = {h['pid'] for h in seen['cuda_killed']['holders']}
    assert live.pid in owners and nvml_only.pid not in owners, seen['cuda_killed']
    live.kill()  # the live one leaves without unregistering
    res = until_stale(triton, ['cuda_live', 'cuda_killed'])
    assert res['summary']['cuda_stale_bytes'] == 320 * MIB and res['gpus'][0]['zombies'] == []
    assert nvml_only.pid not in {h['pid'] for g in res['gpus'] for h in g['context_holders']}
    before = charge(triton)
    assert before >= 320 * MIB and res['gpus'][0]['server_bytes'] >= 320 * MIB  # charged to tritonserver (fact 5)
    record = cleanup(triton)
    assert sorted(record['done']['cuda_unregistered']) == ['cuda_killed', 'cuda_live'], record
    assert record['done']['freed_gpu_bytes'] >= 320 * MIB * 0.99, record
    assert regions(info(triton)) == {}
    assert settled(triton, before - 320 * MIB) <= before - 320 * MIB
    again = cleanup(triton)
    assert again['changed'] is False and again['done']['cuda_unregistered'] == []


def test_a_live_clients_region_is_never_stale_and_check_mode_touches_nothing(triton, clients):
    live = clients(triton, 'cuda_live', 32 * MIB)
    res = run_module(REGION, dict(url=triton.url, kind='cuda', state='absent', stale=True))
    assert res['changed'] is False and res['unregistered'] == [] and res['freed_gpu_bytes'] is None, res
    live.kill()
    until_stale(triton, ['cuda_live'])
    checked = run_module(REGION, dict(url=triton.url, kind='cuda', state='absent', stale=True), check=True)
    assert (
        checked['changed'] is True and checked['unregistered'] == ['cuda_live'] and checked['freed_gpu_bytes'] is None
    )
    assert 'cuda_live' in regions(info(triton))


def test_a_zombie_child_is_named_and_its_region_reclaimed_once_it_is_stopped(triton, clients):
    parent = clients(triton, 'cuda_zombie', 128 * MIB, fork=True)
    parent.kill()
    res = info(triton)
    (gpu0,) = [g for g in res['gpus'] if g['index'] == 0]
    assert parent.pid in gpu0['zombies'], gpu0  # NVML lists the dead parent (fact 11)
    region = regions(res)['cuda_zombie']
    assert region['state'] == 'unknown' and 'zombie' in region['state_reason']
    # the /proc signal names the child: it maps /dev/nvidiactl and no /dev/nvidia-uvm (fact 11), a zombie candidate
    child = [h for h in region['holders'] if h['pid'] == parent.child]
    assert child and child[0]['why'].startswith('zombie candidate'), region['holders']
    parent.kill_child()
    until_stale(triton, ['cuda_zombie'])  # NVML lists the parent's pid until the driver has torn the context down
    res = run_module(REGION, dict(url=triton.url, kind='cuda', state='absent', stale=True))
    assert res['unregistered'] == ['cuda_zombie'] and res['freed_gpu_bytes'] >= 128 * MIB * 0.99, res


def _perf_analyzer() -> str:
    found = shutil.which('perf_analyzer') or shutil.which('perf_analyzer', path=os.path.dirname(sys.executable))
    if found is None:
        pytest.fail(
            'perf_analyzer not found: install the tritonclient 2.51 wheel with it (pip install "tritonclient[all]==2.51.0")'
        )
    return found


def _tail(path, size: int = 4000) -> str:
    with open(path, 'rb') as f:
        return f.read()[-size:].decode('utf-8', 'replace')


def test_perf_analyzer_regions_are_kept_while_it_runs_and_reclaimed_once_it_is_killed(triton, tmp_path):
    cmd = [_perf_analyzer(), '-m', 'echo', '-u', triton.url.split('://', 1)[1], '--shared-memory=cuda',
           '--shape', 'INPUT0:65536', '--concurrency-range', '1', '--measurement-interval', '120000']  # fmt: skip
    log = tmp_path / 'perf_analyzer.log'  # a file, not a pipe: a pipe nobody reads would stop it once full
    with open(log, 'wb') as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        live = regions(info(triton))
        while not live and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            live = regions(info(triton))
        if not live:
            why = f'exited with {proc.returncode}' if proc.poll() is not None else 'still running'
            pytest.fail(f'perf_analyzer registered no CUDA region within 60 s ({why}); its output:\n{_tail(log)}')
        assert all(r['state'] == 'unknown' for r in live.values()), live
        kept = run_module(REGION, dict(url=triton.url, kind='cuda', state='absent', stale=True))
        assert kept['unregistered'] == [], (kept, _tail(log))
    finally:
        proc.kill()
        proc.wait(30)
    until_stale(triton, sorted(live))
    res = run_module(REGION, dict(url=triton.url, kind='cuda', state='absent', stale=True))
    assert sorted(res['unregistered']) == sorted(live) and res['freed_gpu_bytes'] > 0, res
    assert regions(info(triton)) == {}
