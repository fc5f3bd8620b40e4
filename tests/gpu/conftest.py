"""Fixtures of the GPU suite (make test-gpu): the wheel's tritonserver on a real NVIDIA GPU, CUDA IPC clients that are
real processes, an NVML-only process beside them. Without a GPU the session stops at once, says why and exits
non-zero; the suite is not part of make test (CI has no GPU: the CUDA rule is unit-tested on recorded shapes there)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'rig'))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'integration'))

import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from ansible_helpers import COLLECTIONS_PATH  # noqa: E402  pylint: disable=wrong-import-position

if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)

from ansible_collections.tritonops.shm.plugins.module_utils.host import nvml

MIB = 1 << 20


def pytest_sessionstart(session):
    if os.geteuid() != 0:
        pytest.exit(
            'the GPU suite (make test-gpu, run-gpu-suite) needs root (private /dev/shm namespaces, NVML and every process maps)',
            returncode=3,
        )
    reading = nvml.read()
    if reading.error or not reading.gpus:
        pytest.exit(
            'the GPU suite (make test-gpu, run-gpu-suite) needs an NVIDIA GPU and its driver: '
            + (reading.error or 'NVML lists no GPU'),
            returncode=3,
        )
    print(f'GPUs: {", ".join(f"{g.index} {g.uuid}" for g in reading.gpus)}')


@pytest.fixture
def triton(tmp_path):
    """The wheel's tritonserver (a GPU build) with a private /dev/shm and the rig's echo model, on the GPU: it must
    offer CUDA shared memory (fact 1 of CUDA-FACTS.md), or the suite tests nothing."""
    with contextlib.ExitStack() as stack:
        server = tritonrig.TritonServer(workdir=str(tmp_path), shm_size='64m', name='triton-gpu')
        stack.callback(server.stop)
        server.start()
        _status, metadata = tritonrig.http_json(server.url + '/v2')
        assert 'cuda_shared_memory' in metadata.get('extensions', []), (
            f'the server offers no CUDA shared memory: {metadata}'
        )
        yield server


class CudaClient:
    """One cuda_client.py process: pid, child (with fork), via (cupy, torch or cudart)."""

    def __init__(self, proc: subprocess.Popen, line: dict) -> None:
        self.proc, self.pid, self.child, self.via = proc, line['pid'], line['child'], line['via']

    def kill(self) -> None:
        """SIGKILL the client (not its child): its region stays registered, its memory charged to the server."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def kill_child(self) -> None:
        if self.child:
            os.kill(self.child, signal.SIGKILL)
            _reap(self.child)
            self.child = 0


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # not our child (the client's): wait until it is gone or a zombie (its context freed)
        for _attempt in range(600):
            try:
                with open(f'/proc/{pid}/stat') as f:
                    if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                        return
            except OSError:
                return
            time.sleep(0.05)


@pytest.fixture
def clients():
    """start(server, name, size, fork=False): a CUDA client that registered its region; every one killed at the end."""
    started: list[CudaClient] = []
    cudart = sorted(glob.glob(os.path.join(tritonrig.triton_paths()['libs'], 'libcudart*.so*')))
    env = dict(os.environ, TRITONRIG_CUDART=cudart[0] if cudart else 'libcudart.so.12')

    def start(server, name: str, size: int, fork: bool = False) -> CudaClient:
        cmd = [sys.executable, os.path.join(HERE, 'cuda_client.py'), server.url, name, str(size)] + (
            ['--fork'] if fork else []
        )
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        with selectors.DefaultSelector() as sel:  # its line within 60 s (a CUDA context and a registration)
            sel.register(proc.stdout, selectors.EVENT_READ)
            line = proc.stdout.readline() if sel.select(60) else ''
        if not line:
            proc.kill()
            proc.wait()
            raise AssertionError(f'the CUDA client did not register {name} within 60 s: {proc.stderr.read()[-2000:]}')
        client = CudaClient(proc, json.loads(line))
        started.append(client)
        return client

    yield start
    for client in started:
        client.kill_child()
        if client.proc.poll() is None:
            client.kill()


@pytest.fixture
def nvml_only():
    """A process that only initialised NVML (as nvidia-smi or dcgm-exporter do): device files, no CUDA context."""
    code = "import ctypes, sys, time; ctypes.CDLL('libnvidia-ml.so.1').nvmlInit_v2(); print('up', flush=True); time.sleep(3600)"
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'up'
    yield proc
    proc.kill()
    proc.wait()
