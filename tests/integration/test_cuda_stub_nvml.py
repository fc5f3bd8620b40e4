"""Issue 43, goal 4: the whole CUDA path in make test, through a stub NVML (tests/fakes/stub_nvml.c).

No GPU here: the modules load the stub as libnvidia-ml.so.1 through the loader path (LD_LIBRARY_PATH of the Ansible
process, inherited by its modules; nothing in the collection knows the stub), configured with the shapes CUDA-FACTS.md
recorded (an H200 with driver 580, an R535 driver's 32-byte process entries, MIG, MPS, an 8-GPU node). The processes
are real: a fake tritonserver (tests/fakes/cuda_tritonserver.py, a CUDA context by its device files; its CUDA
unregister lowers its charge in the stub) and clients that hold the device files as fact 11's table says
(tests/fakes/nvidia_process.py), each in a private mount namespace whose /dev holds the fake device files. A test
writes what NVML says as the driver would: a client's context listed while it lives, a killed client's region charged
to the server (fact 5), a dead parent's pid kept while its forked child lives (fact 11).

triton_shm_info, triton_shm_region kind=cuda, the cleanup playbook (tritonops.shm.cleanup) and the metrics textfile
run through it. Before issue 43's CUDA changes (019cb61) the zombie's child was not named, the R535 entries gave a
garbage pid 0, and a context on another of 8 GPUs kept the server's region unknown: those tests fail there.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest
import tritonrig
from ansible_helpers import COLLECTIONS_PATH, PYTHON, ansible_playbook, run_module

if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)

from ansible_collections.tritonops.shm.tests.fakes import stub_nvml  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.tritonops.shm.tests.fakes.stub_nvml import MIB, SERVER_BASE, h200_uuid  # noqa: E402

FAKES = os.path.join(COLLECTIONS_PATH, 'ansible_collections', 'tritonops', 'shm', 'tests', 'fakes')
INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
CONTEXT = 300 * MIB  # a client's own context, beside its allocation
BOUND = 30  # seconds: a process's first line, a killed process gone


@pytest.fixture(scope='module')
def stub_dir(tmp_path_factory):
    return stub_nvml.build(str(tmp_path_factory.mktemp('stub-nvml')))


def _line(proc: subprocess.Popen, what: str) -> str:
    """The process's first line, within BOUND seconds; its stderr when there is none."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(BOUND):
            line = proc.stdout.readline()
            if line:
                return line
    proc.kill()
    proc.wait()
    raise AssertionError(f'{what} did not start within {BOUND} s: {proc.stderr.read()[-2000:]}')


def _gone(pid: int) -> None:
    """Wait, within BOUND seconds, until pid is gone from /proc or a zombie (its descriptors closed)."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            with open(f'/proc/{pid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X'):
                    return
        except OSError:
            return
        time.sleep(0.05)
    raise AssertionError(f'pid {pid} still runs {BOUND} s after SIGKILL')


class Proc:
    """A process this test started (pid) and the child it forked (child, 0: none)."""

    def __init__(self, popen: subprocess.Popen, pid: int, child: int = 0) -> None:
        self.popen, self.pid, self.child = popen, pid, child
        self.url = ''

    def kill(self) -> None:
        """SIGKILL, by pid; its forked child lives on (reparented)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(BOUND)

    def kill_child(self) -> None:
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
            _gone(self.child)
            self.child = 0


class Scene:
    """The stub's configuration, the fake server and the NVIDIA processes of one test; every process killed by pid."""

    def __init__(self, tmp_path, stub_dir: str, config: stub_nvml.Config) -> None:
        self.tmp, self.config = tmp_path, config
        self.env = stub_nvml.env(stub_dir, config.path)
        self.started: list[Proc] = []
        self.gpus = len(config.gpus)

    def _start(self, command: list, env: dict | None = None) -> subprocess.Popen:
        dev = self.tmp / f'dev{len(self.started)}'
        dev.mkdir()
        return subprocess.Popen(
            stub_nvml.fake_dev_command(str(dev), self.gpus, command),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=COLLECTIONS_PATH, **(env or {})),
        )

    def server(self, gpu: int = 0, visible: str | None = None) -> Proc:
        """The fake tritonserver, its context on gpu listed by NVML (its own 582 MiB)."""
        port = tritonrig.free_port()
        cmd = [PYTHON, os.path.join(FAKES, 'cuda_tritonserver.py'), '--http-port', str(port)]
        cmd += ['--nvml-config', self.config.path, '--nvml-gpu', str(gpu)]
        popen = self._start(cmd, {'CUDA_VISIBLE_DEVICES': visible} if visible else None)
        proc = Proc(popen, popen.pid)
        self.started.append(proc)
        assert _line(popen, 'the fake tritonserver').strip() == 'READY'
        proc.url = f'http://127.0.0.1:{port}'
        self.config.charge(gpu, proc.pid, SERVER_BASE)
        return proc

    def process(self, kind: str, gpu: int = 0, fork: bool = False, comm: str | None = None) -> Proc:
        """A process holding the device files as kind does (nvidia_process.py); not listed by NVML."""
        cmd = [PYTHON, os.path.join(FAKES, 'nvidia_process.py'), kind, '--gpu', str(gpu)]
        cmd += (['--fork'] if fork else []) + (['--comm', comm] if comm else [])
        popen = self._start(cmd)
        line = json.loads(_line(popen, f'a {kind} process'))
        proc = Proc(popen, line['pid'], line['child'])
        self.started.append(proc)
        return proc

    def client(self, server: Proc, name: str, size: int, gpu: int = 0, fork: bool = False) -> Proc:
        """A CUDA client: a context on gpu listed by NVML with its allocation, its region registered by name."""
        proc = self.process('context', gpu, fork, comm='cuda_client')
        self.config.charge(gpu, proc.pid, CONTEXT + size)
        body = {'raw_handle': {'b64': 'AAAA'}, 'device_id': 0, 'byte_size': size}
        status, _answer = tritonrig.http_json(f'{server.url}/v2/cudasharedmemory/region/{name}/register', 'POST', body)
        assert status == 200
        return proc

    def crash(self, client: Proc, server: Proc, size: int, gpu: int = 0, server_gpu: int = 0) -> None:
        """SIGKILL a client: NVML lists it no more and charges its region to the server (fact 5)."""
        client.kill()
        self.config.end(gpu, client.pid, heir=(server_gpu, server.pid), moved=size)

    def regions(self, server: Proc) -> list:
        _status, listed = tritonrig.http_json(f'{server.url}/v2/cudasharedmemory/status')
        return sorted(r['name'] for r in listed)

    def info(self, server: Proc, **args) -> dict:
        res = run_module(INFO, dict(url=server.url, **args), env=self.env)
        assert not res.get('failed') and res['gpu_error'] is None, (res.get('msg'), res.get('module_stderr'), res)
        return res

    def reclaim(self, server: Proc) -> dict:
        res = run_module(REGION, dict(url=server.url, kind='cuda', state='absent', stale=True), env=self.env)
        assert not res.get('failed'), res
        return res

    def stop(self) -> None:
        for proc in reversed(self.started):
            proc.kill_child()
            proc.kill()


@pytest.fixture
def scene(tmp_path, stub_dir):
    made: list[Scene] = []

    def make(config: stub_nvml.Config) -> Scene:
        made.append(Scene(tmp_path, stub_dir, config))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def cuda(res: dict) -> dict:
    return {r['name']: r for r in res['cuda_regions']}


def pids(region: dict) -> dict:
    return {h['pid']: h['why'] for h in region['holders']}


def metrics(res: dict) -> list:
    """The lines of the textfile(s) triton_shm_info wrote."""
    out = []
    for path in res['metrics_files']:
        with open(path) as f:
            out += [line for line in f.read().splitlines() if not line.startswith('#')]
    return out


def sample(lines: list, name: str, **labels: str) -> float | None:
    """The value of the sample of name whose labels include labels, or None."""
    for line in lines:
        series, _sep, value = line.rpartition(' ')
        if series.split('{')[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
            return float(value)
    return None


def test_h200_a_killed_clients_region_is_stale_once_no_other_context_remains_and_the_cleanup_gives_it_back(
    scene, tmp_path
):
    """The H200 of CUDA-FACTS.md (one GPU, driver 580): a live client keeps both regions unknown and is named, an
    NVML-only process (nvidia-smi, dcgm-exporter) never is; once the live one is killed too both are stale, the
    metrics show them on the GPU's UUID, and the cleanup playbook unregisters them and measures the memory back."""
    s = scene(stub_nvml.Config.h200(str(tmp_path / 'nvml.conf')))
    server = s.server()
    smi = s.process('nvml', comm='nvidia-smi')
    live = s.client(server, 'cuda_live', 64 * MIB)
    killed = s.client(server, 'cuda_killed', 256 * MIB)
    s.crash(killed, server, 256 * MIB)
    seen = cuda(s.info(server))
    assert seen['cuda_live']['state'] == seen['cuda_killed']['state'] == 'unknown', seen
    assert live.pid in pids(seen['cuda_killed']) and smi.pid not in pids(seen['cuda_killed']), seen
    assert server.pid not in pids(seen['cuda_killed'])

    s.crash(live, server, 64 * MIB)
    (tmp_path / 'textfiles').mkdir()
    res = s.info(server, metrics_dir=str(tmp_path / 'textfiles'), metrics_host='gpu-node')
    seen = cuda(res)
    assert seen['cuda_live']['state'] == seen['cuda_killed']['state'] == 'stale', seen
    (gpu0,) = res['gpus']
    assert gpu0['uuid'] == h200_uuid(0) and gpu0['server_bytes'] == SERVER_BASE + 320 * MIB, gpu0
    assert gpu0['cuda_region_bytes']['stale'] == 320 * MIB and gpu0['context_holders'] == [], gpu0
    assert {r['gpu_uuid'] for r in seen.values()} == {h200_uuid(0)}
    lines = metrics(res)
    assert sample(lines, 'tritonops_shm_cuda_region_bytes', device='0', uuid=h200_uuid(0), state='stale') == 320 * MIB
    assert sample(lines, 'tritonops_shm_gpu_server_bytes', device='0', uuid=h200_uuid(0)) == SERVER_BASE + 320 * MIB

    # the playbook's default become would go through sudo, which drops LD_LIBRARY_PATH: the test runs as root
    host = dict(ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=server.url)
    played = ansible_playbook(
        'tritonops.shm.cleanup',
        inventory={'all': {'children': {'triton': {'hosts': {'h200': host}}}}},
        extra_vars={'prometheus_textfile_dir': '', 'triton_become': False},
        env={**s.env, 'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )
    assert played.data, played
    record = played.data['global_custom_stats']['tritonops_shm_cleanup']['h200']
    assert sorted(record['done']['cuda_unregistered']) == ['cuda_killed', 'cuda_live'], record
    assert record['done']['freed_gpu_bytes'] == 320 * MIB, record
    assert s.regions(server) == [] and s.config.procs() == {(0, server.pid): SERVER_BASE}


def test_zombie_the_forked_child_is_named_and_the_region_reclaimed_once_it_is_stopped(scene, tmp_path):
    """Fact 11: a client killed after a fork; NVML lists the dead parent's pid (the zombie), the child keeps the
    context's descriptors and nvidiactl mappings but no uvm mapping: it is named a zombie candidate and the region
    stays registered until it is stopped (before issue 43: the child was not named)."""
    s = scene(stub_nvml.Config.h200(str(tmp_path / 'nvml.conf')))
    server = s.server()
    parent = s.client(server, 'cuda_zombie', 128 * MIB, fork=True)
    parent.kill()  # NVML keeps listing the dead parent: its child keeps the context (fact 11)
    res = s.info(server)
    region = cuda(res)['cuda_zombie']
    assert region['state'] == 'unknown' and 'zombie' in region['state_reason'], region
    assert res['gpus'][0]['zombies'] == [parent.pid], res['gpus']
    owners = pids(region)
    assert owners[parent.pid].startswith('zombie:'), owners
    assert parent.child in owners and owners[parent.child].startswith('zombie candidate'), owners
    kept = s.reclaim(server)
    assert kept['unregistered'] == [] and s.regions(server) == ['cuda_zombie'], kept

    parent.kill_child()  # the context ends; its region is the server's now (fact 5)
    s.config.end(0, parent.pid, heir=(0, server.pid), moved=128 * MIB)
    res = s.reclaim(server)
    assert res['unregistered'] == ['cuda_zombie'] and res['freed_gpu_bytes'] == 128 * MIB, res


def test_r535_32_byte_process_entries_are_read_as_the_driver_wrote_them(scene, tmp_path):
    """An R535 driver writes 32-byte nvmlProcessInfo_v3_t entries: the live client is the one owner, with no garbage
    pid beside it (before issue 43: a 24-byte reading gave a zombie pid 0), and the reclaim measures the memory back
    through the same entries."""
    s = scene(stub_nvml.Config.h200(str(tmp_path / 'nvml.conf'), entry_size=32))
    server = s.server()
    live = s.client(server, 'cuda_live', 64 * MIB)
    killed = s.client(server, 'cuda_killed', 32 * MIB)
    s.crash(killed, server, 32 * MIB)
    res = s.info(server)
    want = {live.pid: 'has a CUDA context on GPU 0 (NVML)'}
    assert {n: pids(r) for n, r in cuda(res).items()} == {'cuda_live': want, 'cuda_killed': want}, res['cuda_regions']
    assert res['gpus'][0]['zombies'] == [] and res['gpus'][0]['server_bytes'] == SERVER_BASE + 32 * MIB, res['gpus']

    s.crash(live, server, 64 * MIB)
    res = s.reclaim(server)
    assert sorted(res['unregistered']) == ['cuda_killed', 'cuda_live'] and res['freed_gpu_bytes'] == 96 * MIB, res


def test_eight_gpus_a_context_on_another_gpu_does_not_keep_the_servers_region_unknown(scene, tmp_path):
    """An HGX node of 8 H200s: the server's CUDA_VISIBLE_DEVICES names GPU 3 by UUID and NVML lists its context there;
    a trainer's 40 GiB context on GPU 5 is no owner of its region, which is stale once its client is killed, shown on
    GPU 3's UUID in gpus[] and the metrics, and reclaimed (before issue 43: unknown, every GPU counted)."""
    s = scene(stub_nvml.Config.h200(str(tmp_path / 'nvml.conf'), count=8))
    server = s.server(gpu=3, visible=h200_uuid(3))
    trainer = s.process('context', gpu=5, comm='trainer')
    s.config.charge(5, trainer.pid, 40 << 30)
    killed = s.client(server, 'cuda_killed', 128 * MIB, gpu=3)
    s.crash(killed, server, 128 * MIB, gpu=3, server_gpu=3)
    (tmp_path / 'textfiles').mkdir()
    res = s.info(server, metrics_dir=str(tmp_path / 'textfiles'), metrics_host='gpu-node')
    region = cuda(res)['cuda_killed']
    assert region['state'] == 'stale' and region['gpu_uuid'] == h200_uuid(3), region
    by_index = {g['index']: g for g in res['gpus']}
    assert sorted(by_index) == list(range(8)) and by_index[3]['server_bytes'] == SERVER_BASE + 128 * MIB
    assert by_index[3]['cuda_region_bytes']['stale'] == 128 * MIB
    assert [h['pid'] for h in by_index[5]['context_holders']] == [trainer.pid], by_index[5]
    lines = metrics(res)
    assert sample(lines, 'tritonops_shm_cuda_region_bytes', device='0', uuid=h200_uuid(3), state='stale') == 128 * MIB
    assert sample(lines, 'tritonops_shm_gpu_server_bytes', device='3', uuid=h200_uuid(3)) == SERVER_BASE + 128 * MIB

    res = s.reclaim(server)
    assert res['unregistered'] == ['cuda_killed'] and res['freed_gpu_bytes'] == 128 * MIB, res


def test_mig_and_mps_keep_a_killed_clients_region_unknown(scene, tmp_path):
    """With MIG on, or an MPS daemon on the host, a context cannot be told from the region's owner: unknown; with
    neither, the same region is stale and reclaimed (the control)."""
    path = str(tmp_path / 'nvml.conf')
    s = scene(stub_nvml.Config(path, [stub_nvml.Gpu(0, h200_uuid(0), mig=True)]))
    server = s.server()
    killed = s.client(server, 'cuda_killed', 16 * MIB)
    s.crash(killed, server, 16 * MIB)
    region = cuda(s.info(server))['cuda_killed']
    assert region['state'] == 'unknown' and region['state_reason'].startswith('MIG is on'), region

    procs = s.config.procs()
    s.config = stub_nvml.Config(path, [stub_nvml.Gpu(0, h200_uuid(0), mig=False)])
    s.config.write(procs)
    mps = s.process('nvml', comm='nvidia-cuda-mps-control')
    region = cuda(s.info(server))['cuda_killed']
    assert region['state'] == 'unknown' and region['state_reason'].startswith('MPS runs'), region

    mps.kill()
    res = s.reclaim(server)
    assert res['unregistered'] == ['cuda_killed'] and res['freed_gpu_bytes'] == 16 * MIB, res
