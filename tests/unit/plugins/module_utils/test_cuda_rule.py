"""The CUDA rule (classification.gpu_state) on the shapes CUDA-FACTS.md recorded on an H200, and its evidence
(gpu.read_evidence) read from a /proc tree laid out as that machine's was. No GPU here: NVML answers are recorded."""

from __future__ import annotations

import os
import stat
import types

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.host import gpu, nvml
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import gpu_record, gpu_state

MIB = 1 << 20
SERVER, STUB, CLIENT, SMI, CHILD = 100, 101, 200, 300, 400
UVM_MAP = b'7f0000000000-7f0000200000 rw-s 00000000 00:05 12 /dev/nvidia-uvm\n'
CTL_MAP = b'7f2000000000-7f2000001000 rw-s 00000000 00:05 13 /dev/nvidiactl\n'
SHM_MAP = b'7f1000000000-7f1000001000 rw-s 00000000 00:1a 77 /dev/shm/input0\n'
# fact 11's table, as maps: a context maps /dev/nvidiactl (27 lines) and /dev/nvidia-uvm (1); its forked child, the
# zombie, maps /dev/nvidiactl and no /dev/nvidia-uvm; a process that only counted the devices maps /dev/nvidiactl once
CONTEXT_MAPS = CTL_MAP * 27 + UVM_MAP
CHILD_MAPS = CTL_MAP * 27
COUNT_MAPS = CTL_MAP


def proc_tree(root, procs, fds=None):
    """A /proc of {pid: (comm, ppid, maps bytes or None for unreadable, environ)}; fds: {pid: [the minors of the
    /dev/nvidiaN it holds open]} (character devices 195:N made under root), or None for an fd table that cannot be
    read."""
    for pid, minors in (fds or {}).items():
        d = os.path.join(root, str(pid), 'fd')
        os.makedirs(d)
        for n, minor in enumerate(minors or ()):
            node = os.path.join(root, f'nvidia{minor}')
            if not os.path.exists(node):
                os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(195, minor))
            os.symlink(node, os.path.join(d, str(n + 3)))
        if minors is None:
            os.chmod(d, 0)
    for pid, (comm, ppid, maps, environ) in procs.items():
        d = os.path.join(root, str(pid))
        os.makedirs(d, exist_ok=True)
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
    """NVML: gpus as (index, [(pid, used)]), minor = index, one GPU-UUID each (GPU-<index>)."""
    return nvml.Reading(
        tuple(nvml.Gpu(i, i, f'GPU-{i}', False, tuple(nvml.GpuProcess(p, u) for p, u in procs)) for i, procs in gpus),
        error,
    )


H200 = {  # the server (a context: maps uvm), its stub (no NVIDIA files), nvidia-smi (no context, maps none)
    SERVER: ('tritonserver', 1, CONTEXT_MAPS + SHM_MAP, b'PATH=/usr/bin\0'),
    STUB: ('triton_python_b', SERVER, SHM_MAP, b''),
    SMI: ('nvidia-smi', 1, b'', b''),
}


def snap(evidence, pid=SERVER, namespace='initial'):
    return types.SimpleNamespace(pid=pid, pid_namespace=namespace, gpu=evidence)


def evidence(tmp_path, procs, nvml_reading, fds=None):
    return gpu.read_evidence(SERVER, proc_tree(tmp_path, procs, fds), lambda: nvml_reading)


def test_a_killed_clients_region_is_stale_once_only_the_server_holds_a_context(tmp_path):
    # facts 5 and 9: after the SIGKILL, NVML charges the region to tritonserver, the only context on the GPU
    ev = evidence(tmp_path, H200, reading((0, [(SERVER, 1606 * MIB)])))
    assert ev.family == frozenset({SERVER, STUB}) and ev.uvm_mappers == ()
    state, why, owners = gpu_state(snap(ev), 0)
    assert (state, owners) == ('stale', []) and 'no process but the server has a CUDA context on GPU 0' in why
    rec = gpu_record(snap(ev), dict(name='gpu0', device_id=0, byte_size=1 << 30))
    assert rec['reclaimable'] is True and rec['holders'] == []


def test_a_live_client_leaves_every_region_of_its_gpu_unknown_and_is_named(tmp_path):
    procs = {**H200, CLIENT: ('python3', 1, UVM_MAP, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB), (CLIENT, 1542 * MIB)])))
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and 'python3 (pid 200)' in why
    assert [(o.pid, o.comm) for o in owners] == [(CLIENT, 'python3')] and 'CUDA context on GPU 0 (NVML)' in owners[
        0
    ].why


def test_a_dead_pid_nvml_still_lists_is_a_zombie_and_its_child_a_zombie_candidate(tmp_path):
    """Fact 11: the forked child keeps the dead parent's context; NVML lists the parent's pid, gone from /proc. The
    child maps /dev/nvidiactl and no /dev/nvidia-uvm, and NVML does not list it (issue 43, goal 1): it is named as a
    zombie candidate, never by a uvm mapping it does not have."""
    procs = {**H200, CHILD: ('python3', 1, CHILD_MAPS, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB), (699, 582 * MIB)])))
    assert ev.uvm_mappers == () and ev.ctl_mappers == (CHILD,)
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and why.startswith('1 zombie(s), 1 zombie candidate(s) and 2 process(es)'), why
    assert owners[0].pid == CHILD and owners[0].candidate and not owners[0].zombie
    assert 'maps /dev/nvidiactl without /dev/nvidia-uvm' in owners[0].why
    assert owners[1].pid == 699 and owners[1].zombie and not owners[1].candidate


def test_a_zombie_candidate_keeps_a_region_unknown_even_when_nvml_shows_no_zombie(tmp_path):
    """Issue 43, goal 1: a candidate is never a reason to call anything stale; it keeps regions unknown. Before, the
    child (no uvm mapping, not listed) was invisible, and with NVML listing only the server the region was stale."""
    procs = {**H200, CHILD: ('python3', 1, CHILD_MAPS, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 1606 * MIB)])))
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and [o.pid for o in owners] == [CHILD] and 'zombie candidate' in why, why
    # a process that only counted the devices maps /dev/nvidiactl too: named, and the region kept
    procs = {**H200, CLIENT: ('counter', 1, COUNT_MAPS, b'')}
    ev = evidence(tmp_path / 'b', procs, reading((0, [(SERVER, 1606 * MIB)])))
    assert gpu_state(snap(ev), 0)[0] == 'unknown'


def test_an_nvml_only_process_is_no_owner_but_a_uvm_mapper_nvml_misses_is(tmp_path):
    # fact 8: nvidia-smi holds the device files and maps nothing of them; a context holder maps /dev/nvidia-uvm
    ev = evidence(tmp_path, H200, reading((0, [(SERVER, 582 * MIB)])))
    assert gpu_state(snap(ev), 0)[0] == 'stale'
    procs = {**H200, CLIENT: ('hidden', 1, UVM_MAP, b'')}
    ev = evidence(tmp_path / 'b', procs, reading((0, [(SERVER, 582 * MIB)])))
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and [o.pid for o in owners] == [CLIENT]


def test_a_process_whose_maps_cannot_be_read_counts_only_when_nvml_lists_it(tmp_path):
    procs = {**H200, CLIENT: ('other', 1, None, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB)])))
    assert gpu_state(snap(ev), 0)[0] == 'stale'
    ev = evidence(tmp_path / 'b', procs, reading((0, [(SERVER, 582 * MIB), (CLIENT, 600 * MIB)])))
    assert gpu_state(snap(ev), 0)[0] == 'unknown'


def test_the_servers_own_descendants_never_count(tmp_path):
    procs = {**H200, STUB: ('triton_python_b', SERVER, CONTEXT_MAPS, b'')}  # a KIND_GPU stub with a framework
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB), (STUB, 300 * MIB)])))
    assert gpu_state(snap(ev), 0)[0] == 'stale'


def test_several_gpus_are_judged_together(tmp_path):
    """A server that reaches both GPUs (their device files and contexts not read, CUDA_VISIBLE_DEVICES unset): a region
    may be on either, so the client on GPU 1 counts, and NVML lists the server on GPU 0 only (blind on GPU 1)."""
    procs = {**H200, CLIENT: ('python3', 1, CONTEXT_MAPS, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB)]), (1, [(CLIENT, 900 * MIB)])))
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and 'the server reaches 2 GPUs' in why and [o.pid for o in owners] == [CLIENT], why


def test_cuda_visible_devices_and_a_foreign_ordinal_are_said(tmp_path):
    procs = {**H200, SERVER: ('tritonserver', 1, CONTEXT_MAPS, b'CUDA_VISIBLE_DEVICES=GPU-7\0')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 582 * MIB)])))
    state, why, _owners = gpu_state(snap(ev), 0)
    assert state == 'stale' and 'on GPU 0 (NVML and /proc)' in why  # one GPU, the server's context on it
    ev = evidence(tmp_path / 'b', H200, reading((0, [(SERVER, 582 * MIB)])))
    assert 'device_id 7 on a one-GPU host' in gpu_state(snap(ev), 7)[1]  # Triton 2.51 accepts device_id 7
    assert gpu_record(snap(ev), dict(name='g', device_id=7, byte_size=MIB))['gpu_uuid'] is None


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
        procs[CLIENT] = ('nvidia-cuda-mps', 1, CONTEXT_MAPS, b'')  # nvidia-cuda-mps-server, as comm truncates it
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
    state, why, owners = gpu_state(s, 0)
    assert state == 'unknown' and expected in why, why
    rec = gpu_record(s, dict(name='g', device_id=0, byte_size=MIB))
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
    from ansible_collections.tritonops.shm.plugins.module_utils.rules import results

    procs = {**H200, CHILD: ('python3', 1, CHILD_MAPS, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 1606 * MIB), (699, 582 * MIB)])))
    s = snap(ev)
    cuda = [
        gpu_record(s, dict(name='killed', device_id=0, byte_size=1024 * MIB)),
        gpu_record(s, dict(name='other', device_id=0, byte_size=2 * MIB)),
    ]
    (facts,) = results.gpu_facts(s, cuda)
    assert facts['server_bytes'] == 1606 * MIB and facts['cuda_region_bytes'] == {'stale': 0, 'unknown': 1026 * MIB}
    assert [h['pid'] for h in facts['context_holders']] == [CHILD, 699] and facts['zombies'] == [699]
    assert set(facts) == set(_documented('gpus'))
    summary = results.summarize(dict(system=[], cuda=cuda), [], None)
    assert (summary['cuda_unknown_regions'], summary['cuda_unknown_bytes']) == (2, 1026 * MIB)
    assert (summary['cuda_stale_regions'], summary['cuda_stale_bytes']) == (0, 0)
    # the zombie's child stopped: the region is stale, its bytes counted as such
    ev = evidence(tmp_path / 'after', H200, reading((0, [(SERVER, 1606 * MIB)])))
    stale = [gpu_record(snap(ev), dict(name='killed', device_id=0, byte_size=1024 * MIB))]
    (facts,) = results.gpu_facts(snap(ev), stale)
    assert facts['cuda_region_bytes'] == {'stale': 1024 * MIB, 'unknown': 0} and facts['zombies'] == []
    assert results.summarize(dict(system=[], cuda=stale), [], None)['cuda_stale_bytes'] == 1024 * MIB
    assert results.gpu_facts(snap(None), stale) is None


# -- issue 40, goal 6: the positive control ---------------------------------------------------------------------------


def test_on_a_blind_platform_a_live_clients_region_is_unknown_never_stale(tmp_path):
    """A platform where NVML lists no process and CUDA maps no /dev/nvidia-uvm (a stub NVML, another driver): the live
    client shows in neither signal, and neither does the server's own context. Before, the region was stale and a
    stale cleanup unregistered it under the live client."""
    procs = {
        SERVER: ('tritonserver', 1, CTL_MAP + SHM_MAP, b''),  # no uvm mapping on this platform
        STUB: ('triton_python_b', SERVER, SHM_MAP, b''),
        CLIENT: ('python3', 1, b'', b''),  # a live CuPy client the detectors cannot see
    }
    ev = evidence(tmp_path, procs, reading((0, [])))
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and owners == [], why
    assert "cannot see the server's own context" in why and 'NVML does not list the server (pid 100) on GPU 0' in why
    assert gpu_record(snap(ev), dict(name='live', device_id=0, byte_size=MIB))['reclaimable'] is False


@pytest.mark.parametrize(
    'server_maps, listed, expected',
    [
        (CONTEXT_MAPS, False, 'NVML does not list the server (pid 100) on GPU 0'),  # NVML blind, /proc sees it
        (CTL_MAP * 27, True, "the /proc scan cannot see the server's own CUDA context (it maps no /dev/nvidia-uvm)"),
        (None, True, "the /proc scan cannot see the server's own CUDA context (its maps cannot be read)"),
    ],
)
def test_either_signal_blind_to_the_servers_own_context_keeps_every_region_unknown(
    tmp_path, server_maps, listed, expected
):
    procs = {**H200, SERVER: ('tritonserver', 1, server_maps, b'')}
    ev = evidence(tmp_path, procs, reading((0, [(SERVER, 1606 * MIB)] if listed else [])))
    state, why, _owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and expected in why, why


# -- issue 43, goal 3: several GPUs (8 GPUs, minor = NVML index, UUID GPU-<index>) ------------------------------------

EIGHT = range(8)


def eight(server_on=(3,), client_on=5, zombie_on=None):
    """NVML of an 8-GPU host: the server's context (582 MiB, plus a killed client's 1 GiB region) on server_on, a live
    client's context on client_on, a dead pid on zombie_on."""
    gpus = []
    for i in EIGHT:
        procs = [(SERVER, 1606 * MIB)] if i in server_on else []
        procs += [(CLIENT, 1542 * MIB)] if i == client_on else []
        procs += [(699, 582 * MIB)] if i == zombie_on else []
        gpus.append((i, procs))
    return reading(*gpus)


def _root_only():
    if os.geteuid() != 0:
        pytest.skip('makes character devices 195:N (mknod): root only')


def test_a_server_given_one_gpu_of_eight_judges_its_regions_on_that_gpu_alone(tmp_path):
    """A pod or container given GPU 3 (the toolkit mounts /dev/nvidia3 alone, CUDA_VISIBLE_DEVICES unset): the
    server holds /dev/nvidia3 and NVML lists its context there. A live client of another pod on GPU 5 does not keep
    its regions unknown; one on GPU 3 does. Before, every GPU counted and every region was unknown."""
    _root_only()
    procs = {**H200, CLIENT: ('python3', 1, CONTEXT_MAPS, b'')}
    fds = {SERVER: [3], CLIENT: [5]}
    ev = evidence(tmp_path, procs, eight(), fds)
    state, why, owners = gpu_state(snap(ev), 0)
    assert (state, owners) == ('stale', []) and 'on GPU 3 (NVML and /proc)' in why, why
    rec = gpu_record(snap(ev), dict(name='killed', device_id=0, byte_size=1024 * MIB))
    assert rec['reclaimable'] is True and rec['gpu_uuid'] == 'GPU-3'
    ev = evidence(tmp_path / 'same', procs, eight(client_on=3), {SERVER: [3], CLIENT: [3]})
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and [o.pid for o in owners] == [CLIENT] and 'GPU 3 (NVML)' in owners[0].why


@pytest.mark.parametrize(
    'visible, state, uuid',
    [
        ('GPU-3', 'stale', 'GPU-3'),  # by UUID
        ('GPU-3,GPU-', 'unknown', 'GPU-3'),  # two devices (a prefix of every UUID): ordinal 0 is GPU-3, memory anywhere
        ('3', 'stale', 'GPU-3'),  # one CUDA index, and NVML lists the server's context on one GPU: that one
        ('3,4', 'unknown', None),  # two devices: the ordinal is CUDA's order, not NVML's
        ('3,abc', 'unknown', None),  # an entry not understood: it proves nothing
        ('MIG-3c1e', 'stale', 'GPU-3'),  # one device (a MIG UUID on a GPU without MIG): the server's context says which
    ],
)
def test_cuda_visible_devices_and_the_servers_own_context_map_the_ordinal(tmp_path, visible, state, uuid):
    """The server holds every GPU's device file (its NVML metrics opened them all): CUDA_VISIBLE_DEVICES and the
    server's own context must prove the GPU."""
    _root_only()
    procs = {
        **H200,
        SERVER: ('tritonserver', 1, CONTEXT_MAPS, f'CUDA_VISIBLE_DEVICES={visible}\0'.encode()),
        CLIENT: ('python3', 1, CONTEXT_MAPS, b''),
    }
    ev = evidence(tmp_path, procs, eight(), {SERVER: list(EIGHT), CLIENT: [5]})
    got, why, _owners = gpu_state(snap(ev), 0)
    assert (got, gpu_record(snap(ev), dict(name='g', device_id=0, byte_size=MIB))['gpu_uuid']) == (state, uuid), why
    if state == 'unknown':
        assert f'CUDA_VISIBLE_DEVICES={visible} for the server' in why, why


def test_a_server_on_every_gpu_cannot_prove_a_regions_gpu_and_names_the_ordinals_uuid_only(tmp_path):
    """A server that reaches all eight GPUs (contexts on each): a region's memory may be on any of them (peer access
    with a mislabelled device_id), so a live client anywhere keeps every region unknown; with UUIDs in
    CUDA_VISIBLE_DEVICES the ordinal still names its GPU in the outputs."""
    _root_only()
    uuids = ','.join(f'GPU-{i}' for i in reversed(EIGHT))
    procs = {
        **H200,
        SERVER: ('tritonserver', 1, CONTEXT_MAPS, f'CUDA_VISIBLE_DEVICES={uuids}\0'.encode()),
        CLIENT: ('python3', 1, CONTEXT_MAPS, b''),
    }
    ev = evidence(tmp_path, procs, eight(server_on=EIGHT), {SERVER: list(EIGHT), CLIENT: [5]})
    state, why, _owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and 'the server reaches 8 GPUs' in why, why
    assert gpu_record(snap(ev), dict(name='g', device_id=1, byte_size=MIB))['gpu_uuid'] == 'GPU-6'


def test_a_zombie_and_its_child_on_another_gpu_leave_a_proven_region_stale(tmp_path):
    """A dead client's context on GPU 5 (NVML lists its pid there) and its forked child, which holds /dev/nvidia5
    alone: a region proven on GPU 3 is stale, and GPU 5's facts name both. A child whose descriptors cannot be read
    may be anywhere: it keeps the region unknown."""
    _root_only()
    from ansible_collections.tritonops.shm.plugins.module_utils.rules import results

    procs = {**H200, CHILD: ('python3', 1, CHILD_MAPS, b'')}
    ev = evidence(tmp_path, procs, eight(client_on=None, zombie_on=5), {SERVER: [3], CHILD: [5]})
    rec = gpu_record(snap(ev), dict(name='killed', device_id=0, byte_size=1024 * MIB))
    assert rec['state'] == 'stale' and rec['gpu_uuid'] == 'GPU-3', rec['state_reason']
    facts = {f['index']: f for f in results.gpu_facts(snap(ev), [rec])}
    assert facts[5]['zombies'] == [699] and [h['pid'] for h in facts[5]['context_holders']] == [CHILD, 699]
    assert facts[3]['context_holders'] == [] and facts[3]['cuda_region_bytes']['stale'] == 1024 * MIB
    assert sum(f['cuda_region_bytes']['stale'] for f in facts.values()) == 1024 * MIB
    ev = evidence(tmp_path / 'b', procs, eight(client_on=None, zombie_on=5), {SERVER: [3], CHILD: None})
    state, why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and [o.pid for o in owners] == [CHILD] and 'zombie candidate' in why, why


def test_a_client_whose_main_thread_exited_still_holds_its_context(tmp_path):
    """Issue 40, goal 1, for the CUDA evidence: a live client whose thread-group leader has exited shows an empty
    /proc/PID/maps while its worker thread's view (/proc/PID/task/TID/maps) maps /dev/nvidia-uvm; NVML does not list it
    (an MPS client, a driver that lists nobody else). Before, the scan read the leader's empty view: no context, and
    the region was stale."""
    procs = {**H200, CLIENT: ('python3', 1, b'', b'')}
    root = proc_tree(tmp_path, procs)
    worker = os.path.join(root, str(CLIENT), 'task', str(CLIENT + 1))
    os.makedirs(worker)
    os.makedirs(os.path.join(root, str(CLIENT), 'task', str(CLIENT)))
    with open(os.path.join(worker, 'maps'), 'wb') as f:
        f.write(CONTEXT_MAPS)
    ev = gpu.read_evidence(SERVER, root, lambda: reading((0, [(SERVER, 1606 * MIB)])))
    assert ev.uvm_mappers == (CLIENT,)
    state, _why, owners = gpu_state(snap(ev), 0)
    assert state == 'unknown' and [o.pid for o in owners] == [CLIENT]
