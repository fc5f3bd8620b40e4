"""The CUDA rule (classification.cuda_state) on the shapes CUDA-FACTS.md recorded on an H200, and its evidence
(gpu.read_evidence) read from a /proc tree laid out as that machine's was. No GPU here: NVML answers are recorded."""

from __future__ import annotations

import os
import types

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils import gpu, nvml
from ansible_collections.tritonops.shm.plugins.module_utils.classification import cuda_record, cuda_state

MIB = 1 << 20
SERVER, STUB, CLIENT, SMI, CHILD = 100, 101, 200, 300, 400
UVM_MAP = b'7f0000000000-7f0000200000 rw-s 00000000 00:05 12 /dev/nvidia-uvm\n'
SHM_MAP = b'7f1000000000-7f1000001000 rw-s 00000000 00:1a 77 /dev/shm/input0\n'


def proc_tree(root, procs):
    """A /proc of {pid: (comm, ppid, maps bytes or None for unreadable, environ)}."""
    for pid, (comm, ppid, maps, environ) in procs.items():
        d = os.path.join(root, str(pid))
        os.makedirs(d)
        fields = ['S', str(ppid)] + ['0'] * 17 + ['12345'] + ['0'] * 10
        with open(os.path.join(d, 'stat'), 'w') as f:
            f.write(f'{pid} ({comm}) ' + ' '.join(fields) + '\n')
        with open(os.path.join(d, 'comm'), 'w') as f:
            f.write(comm + '\n')
        if maps is not None:
            with open(os.path.join(d, 'maps'), 'wb') as f:
                f.write(maps)
        with open(os.path.join(d, 'environ'), 'wb') as f:
            f.write(environ)
    return str(root)


def reading(*gpus, error=None):
    """NVML: gpus as (index, [(pid, used)]), one GPU-UUID each."""
    return nvml.Reading(
        tuple(nvml.Gpu(i, i, f'GPU-{i}', False, tuple(nvml.GpuProcess(p, u) for p, u in procs)) for i, procs in gpus),
        error,
    )


H200 = {  # the server (maps uvm), its stub (no NVIDIA files), a live CuPy client, nvidia-smi (no context)
    SERVER: ('tritonserver', 1, UVM_MAP + SHM_MAP, b'PATH=/usr/bin\0'),
    STUB: ('triton_python_b', SERVER, SHM_MAP, b''),
    SMI: ('nvidia-smi', 1, b'', b''),
}


def snap(evidence, pid=SERVER, namespace='initial'):
    return types.SimpleNamespace(pid=pid, pid_namespace=namespace, gpu=evidence)


def evidence(tmp_path, procs, nvml_reading):
    return gpu.read_evidence(SERVER, proc_tree(tmp_path, procs), lambda: nvml_reading)


def test_a_killed_clients_region_is_stale_once_only_the_server_holds_a_context(tmp_path):
    # facts 5 and 9: after the SIGKILL, NVML charges the region to tritonserver, the only context on the GPU
    ev = evidence(tmp_path, H200, reading((0, [(SERVER, 1606 * MIB)])))
    assert ev.family == frozenset({SERVER, STUB}) and ev.uvm_mappers == ()
    state, why, owners = cuda_state(snap(ev), 0)
    assert (state, owners) == ('stale', []) and 'no process but the server has a CUDA context on GPU 0' in why
    rec = cuda_record(snap(ev), dict(name='gpu0', device_id=0, byte_size=1 << 30))
    assert rec['reclaimable'] is True and rec['holders'] == []


def test_a_live_client_leaves_every_region_of_its_gpu_unknown_and_is_named(tmp_path):
    procs = {**H200, CLIENT: ('python3', 1, UVM_MAP, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB), (CLIENT, 1542 * MIB)])))
    state, why, owners = cuda_state(snap(ev), 0)
    assert state == 'unknown' and 'python3 (pid 200)' in why
    assert [(o.pid, o.comm) for o in owners] == [(CLIENT, 'python3')] and 'CUDA context on GPU 0 (NVML)' in owners[
        0
    ].why


def test_a_dead_pid_nvml_still_lists_is_a_zombie_named_as_such(tmp_path):
    # fact 11: the forked child keeps the dead parent's context; NVML lists the parent's pid, gone from /proc
    procs = {**H200, CHILD: ('python3', 1, UVM_MAP, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB), (699, 582 * MIB)])))
    state, why, owners = cuda_state(snap(ev), 0)
    assert state == 'unknown' and why.startswith('1 zombie(s) and 2 process(es)')
    assert owners[0].pid == CHILD and 'nvidia-uvm' in owners[0].why, 'the /proc signal names the child'
    assert owners[1].pid == 699 and owners[1].why.startswith('zombie')


def test_an_nvml_only_process_is_no_owner_but_a_uvm_mapper_nvml_misses_is(tmp_path):
    # fact 8: nvidia-smi holds the device files and maps nothing of them; a context holder maps /dev/nvidia-uvm
    ev = evidence(tmp_path, H200, reading((0, [(SERVER, 582 * MIB)])))
    assert cuda_state(snap(ev), 0)[0] == 'stale'
    procs = {**H200, CLIENT: ('hidden', 1, UVM_MAP, b'')}
    ev = evidence(tmp_path / 'b', procs, reading((0, [(SERVER, 582 * MIB)])))
    state, why, owners = cuda_state(snap(ev), 0)
    assert state == 'unknown' and [o.pid for o in owners] == [CLIENT]


def test_a_process_whose_maps_cannot_be_read_counts_only_when_nvml_lists_it(tmp_path):
    procs = {**H200, CLIENT: ('other', 1, None, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB)])))
    assert cuda_state(snap(ev), 0)[0] == 'stale'
    ev = evidence(tmp_path / 'b', procs, reading((0, [(SERVER, 582 * MIB), (CLIENT, 600 * MIB)])))
    assert cuda_state(snap(ev), 0)[0] == 'unknown'


def test_the_servers_own_descendants_never_count(tmp_path):
    procs = {**H200, STUB: ('triton_python_b', SERVER, UVM_MAP, b'')}  # a KIND_GPU stub with a framework
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB), (STUB, 300 * MIB)])))
    assert cuda_state(snap(ev), 0)[0] == 'stale'


def test_several_gpus_are_judged_together(tmp_path):
    procs = {**H200, CLIENT: ('python3', 1, UVM_MAP, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB)]), (1, [(CLIENT, 900 * MIB)])))
    state, why, _owners = cuda_state(snap(ev), 0)
    assert state == 'unknown' and '2 GPUs: the device ordinal is not proven' in why


def test_cuda_visible_devices_and_a_foreign_ordinal_are_said(tmp_path):
    procs = {**H200, SERVER: ('tritonserver', 1, UVM_MAP, b'CUDA_VISIBLE_DEVICES=GPU-7\0')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB)])))
    state, why, _owners = cuda_state(snap(ev), 0)
    assert state == 'stale' and 'CUDA_VISIBLE_DEVICES=GPU-7' in why  # one GPU: every GPU is that one
    ev = evidence(tmp_path / 'b', H200, reading((0, [(SERVER, 582 * MIB)])))
    assert 'device_id 7 on a one-GPU host' in cuda_state(snap(ev), 7)[1]  # Triton 2.51 accepts device_id 7


@pytest.mark.parametrize(
    'case, expected',
    [
        ('no nvml', 'NVML cannot be loaded'),
        ('not located', 'server process was not found'),
        ('other namespace', "outside the host's initial PID namespace"),
        ('not read', 'the GPUs were not read'),
        ('no gpu', 'NVML lists no GPU'),
        ('mig', 'MIG is on'),
        ('mps', 'MPS runs on this host'),
    ],
)
def test_every_way_the_rule_cannot_decide_is_unknown_with_its_reason(tmp_path, case, expected):
    good = reading((0, [(SERVER, 582 * MIB)]))
    procs = dict(H200)
    if case == 'mps':
        procs[CLIENT] = ('nvidia-cuda-mps', 1, UVM_MAP, b'')  # nvidia-cuda-mps-server, as comm truncates it
    ev = evidence(tmp_path, procs, good)
    s = snap(ev)
    if case == 'no nvml':
        s.gpu = ev._replace(reading=nvml.Reading((), 'NVML cannot be loaded (libnvidia-ml.so.1: not found)'))
    elif case == 'not located':
        s.pid = None
    elif case == 'other namespace':
        s.pid_namespace = 'other'
    elif case == 'not read':
        s.gpu = None
    elif case == 'no gpu':
        s.gpu = ev._replace(reading=nvml.Reading(()))
    elif case == 'mig':
        s.gpu = ev._replace(reading=nvml.Reading((good.gpus[0]._replace(mig=True),)))
    state, why, owners = cuda_state(s, 0)
    assert state == 'unknown' and expected in why, why
    rec = cuda_record(s, dict(name='g', device_id=0, byte_size=MIB))
    assert rec['reclaimable'] is False and rec['state'] == 'unknown'


def _documented(key):
    import ast

    import yaml

    root = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
    with open(os.path.join(root, 'plugins', 'modules', 'triton_shm_info.py')) as f:
        tree = ast.parse(f.read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == 'RETURN')
    return yaml.safe_load(node.value.value)[key]['contains']


def test_per_gpu_facts_name_the_charge_the_bytes_by_state_the_holders_and_the_zombies(tmp_path):
    """Issue 34, goal 3: triton_shm_info's gpus (results.gpu_facts) and the summary's CUDA bytes by state."""
    from ansible_collections.tritonops.shm.plugins.module_utils import results

    procs = {**H200, CHILD: ('python3', 1, UVM_MAP, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 1606 * MIB), (699, 582 * MIB)])))
    s = snap(ev)
    cuda = [
        cuda_record(s, dict(name='killed', device_id=0, byte_size=1024 * MIB)),
        cuda_record(s, dict(name='other', device_id=0, byte_size=2 * MIB)),
    ]
    (facts,) = results.gpu_facts(s, cuda)
    assert facts['server_bytes'] == 1606 * MIB and facts['cuda_region_bytes'] == {'stale': 0, 'unknown': 1026 * MIB}
    assert [h['pid'] for h in facts['context_holders']] == [CHILD, 699] and facts['zombies'] == [699]
    assert set(facts) == set(_documented('gpus'))
    summary = results.summarize([], cuda, [], None)
    assert (summary['cuda_unknown_regions'], summary['cuda_unknown_bytes']) == (2, 1026 * MIB)
    assert (summary['cuda_stale_regions'], summary['cuda_stale_bytes']) == (0, 0)
    # the zombie's child stopped: the region is stale, its bytes counted as such
    ev = evidence(tmp_path / 'after', H200, reading((0, [(SERVER, 1606 * MIB)])))
    stale = [cuda_record(snap(ev), dict(name='killed', device_id=0, byte_size=1024 * MIB))]
    (facts,) = results.gpu_facts(snap(ev), stale)
    assert facts['cuda_region_bytes'] == {'stale': 1024 * MIB, 'unknown': 0} and facts['zombies'] == []
    assert results.summarize([], stale, [], None)['cuda_stale_bytes'] == 1024 * MIB
    assert results.gpu_facts(snap(None), stale) is None
