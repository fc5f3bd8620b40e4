"""The stub NVML (stub_nvml.c) for the integration tests: built with ``cc -shared -fPIC``, configured by a text file
(``Config``), and the NVIDIA device files of CUDA-FACTS.md's fact 11 faked in a private mount namespace
(``fake_dev_command``).

How the modules load it: nvml.py calls ``ctypes.CDLL('libnvidia-ml.so.1')`` first, which the dynamic loader resolves
through ``LD_LIBRARY_PATH``; a test sets that (``env()``) only for the Ansible process it starts, whose modules
inherit it. Nothing in the collection knows the stub, so nothing lets a user make root load a library of theirs.

The configuration is rewritten whole (a new file renamed over the old one, under a lock) and the stub reads it again
on every call: the test moves a killed client's charge to the server (fact 5), the fake tritonserver
(cuda_tritonserver.py) lowers its own charge when a CUDA region is unregistered (fact 6).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, 'stub_nvml.c')
LIBRARY = 'libnvidia-ml.so.1'
MIB = 1 << 20
GIB = 1 << 30
H200_TOTAL = 143771 * MIB  # the H200's memory as NVML reports it
SERVER_BASE = 582 * MIB  # tritonserver's own context with no region (CUDA-FACTS.md, fact 5)


def build(directory: str) -> str:
    """Compile the stub into directory (as libnvidia-ml.so.1); the directory, for LD_LIBRARY_PATH."""
    cc = shutil.which('cc') or shutil.which('gcc')
    if cc is None:
        raise RuntimeError('no C compiler (cc) to build the stub NVML')
    os.makedirs(directory, exist_ok=True)
    out = os.path.join(directory, LIBRARY)
    subprocess.run([cc, '-shared', '-fPIC', '-O1', '-o', out, SOURCE], check=True)
    return directory


def env(directory: str, config: str) -> dict:
    """The environment that makes a process (and the modules it starts) load the stub with config."""
    path = os.environ.get('LD_LIBRARY_PATH')
    return {'LD_LIBRARY_PATH': directory + (os.pathsep + path if path else ''), 'NVML_STUB_CONFIG': config}


class Gpu(NamedTuple):
    index: int
    uuid: str
    minor: int | None = None  # /dev/nvidiaN; None: the index
    no_minor: bool = False  # nvmlDeviceGetMinorNumber answers NOT_SUPPORTED
    mig: bool | None = False  # None: nvmlDeviceGetMigMode not supported
    total: int = H200_TOTAL


def h200_uuid(index: int) -> str:
    """A UUID in NVIDIA's form, one per index."""
    return f'GPU-4f1e7a2c-9b3d-5e6f-8a7b-{index:012x}'


class Config:
    """The stub's configuration file: GPUs, the entry size, and compute processes {(gpu index, pid): bytes}."""

    def __init__(self, path: str, gpus: list[Gpu], entry_size: int = 24) -> None:
        self.path = path
        self.gpus = gpus
        self.entry_size = entry_size
        self.write({})

    @classmethod
    def h200(cls, path: str, count: int = 1, entry_size: int = 24) -> Config:
        """count H200s (one GPU: the machine of CUDA-FACTS.md; 8: an HGX H200 node), MIG supported and off."""
        return cls(path, [Gpu(i, h200_uuid(i)) for i in range(count)], entry_size)

    def _text(self, procs: dict) -> str:
        lines = [f'entry_size {self.entry_size}']
        for g in self.gpus:
            minor = 'na' if g.no_minor else (g.index if g.minor is None else g.minor)
            mig = 'na' if g.mig is None else int(g.mig)
            lines.append(f'gpu {g.index} {minor} {g.uuid} {mig} {g.total}')
        for (index, pid), used in procs.items():
            lines.append(f'proc {index} {pid} {"na" if used is None else used}')
        return '\n'.join(lines) + '\n'

    def write(self, procs: dict) -> None:
        with open(self.path + '.lock', 'a') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._replace(procs)

    def _replace(self, procs: dict) -> None:
        tmp = f'{self.path}.{os.getpid()}.tmp'
        with open(tmp, 'w') as f:
            f.write(self._text(procs))
        os.replace(tmp, self.path)

    def update(self, change: Callable[[dict], None]) -> dict:
        """Read the processes, let change edit them ({(gpu, pid): bytes}), write them back; one writer at a time."""
        with open(self.path + '.lock', 'a') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            procs = read_procs(self.path)
            change(procs)
            self._replace(procs)
            return procs

    def procs(self) -> dict:
        return read_procs(self.path)

    def charge(self, gpu: int, pid: int, used: int | None) -> None:
        """NVML lists a context of pid on gpu, charged used bytes (None: not available)."""
        self.update(lambda procs: procs.update({(gpu, pid): used}))

    def end(self, gpu: int, pid: int, heir: tuple[int, int] | None = None, moved: int = 0) -> None:
        """pid's context on gpu ends; moved bytes of it go to heir's charge ((gpu, pid): the server that imported a
        killed client's region holds that memory now, CUDA-FACTS.md, fact 5)."""

        def ended(procs: dict) -> None:
            del procs[gpu, pid]
            if heir is not None:
                procs[heir] = (procs.get(heir) or 0) + moved

        self.update(ended)


def read_procs(path: str) -> dict:
    """The compute processes of a configuration file: {(gpu index, pid): bytes or None}."""
    out: dict = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts[:1] == ['proc']:
                out[int(parts[1]), int(parts[2])] = None if parts[3] == 'na' else int(parts[3])
    return out


def lower(path: str, pid: int, gpu: int, freed: int, floor: int) -> None:
    """What the fake server does when it unregisters a CUDA region: pid's charge on gpu falls by freed, to floor at
    least (its own context stays)."""
    with open(path + '.lock', 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path) as f:
            lines = f.read().splitlines()
        out = []
        for line in lines:
            parts = line.split()
            if parts[:3] == ['proc', str(gpu), str(pid)] and parts[3] != 'na':
                line = f'proc {gpu} {pid} {max(floor, int(parts[3]) - freed)}'
            out.append(line)
        tmp = f'{path}.{os.getpid()}.tmp'
        with open(tmp, 'w') as f:
            f.write('\n'.join(out) + '\n')
        os.replace(tmp, path)


# The device files of a host with the driver, as regular files on a private tmpfs mounted over /dev in a private mount
# namespace: gpu.py knows them by their paths in /proc/PID/maps (/dev/nvidia-uvm, /dev/nvidiactl); /dev/nvidiaN by
# device number only (195:N), which a regular file has not, so these processes hold no GPU's device file by number
# (gpu.py then counts every GPU for them, as on a platform without /dev/nvidiaN). /dev/shm is a tmpfs of its own, and
# /dev/null, zero, urandom the host's.
FAKE_DEV = r"""
set -e
dir=$1 gpus=$2
shift 2
mount -t tmpfs -o size=4m,mode=755 fakedev "$dir"
for f in nvidiactl nvidia-uvm nvidia-uvm-tools; do truncate -s 256k "$dir/$f"; done
i=0
while [ "$i" -lt "$gpus" ]; do truncate -s 256k "$dir/nvidia$i"; i=$((i + 1)); done
mkdir "$dir/nvidia-caps" "$dir/shm"
truncate -s 4k "$dir/nvidia-caps/nvidia-cap1" "$dir/nvidia-caps/nvidia-cap2"
mount -t tmpfs -o size=16m shm "$dir/shm"
for f in null zero urandom random; do touch "$dir/$f"; mount --bind "/dev/$f" "$dir/$f"; done
mount --move "$dir" /dev
exec "$@"
"""


PRIVATE_MOUNTS = ('unshare', '--mount', '--propagation', 'private')


def fake_dev_command(directory: str, gpus: int, command: list[str]) -> list[str]:
    """command run in a private mount namespace whose /dev holds the fake NVIDIA device files of gpus GPUs (directory:
    an empty directory to build them in, the mount point before it is moved over /dev). The command's pid is the
    returned command's pid (unshare and sh exec it)."""
    return [*PRIVATE_MOUNTS, 'sh', '-c', FAKE_DEV, 'fake-dev', directory, str(gpus), *command]
