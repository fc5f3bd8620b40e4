# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the holder evidence of CUDA regions (who may still own a CUDA region's memory).

A CUDA region has no file: its client is a process with a CUDA context on the region's GPU. Two signals that do not
depend on each other, read once per snapshot (read_evidence), beside the server process and its descendants (its
own backend stubs), which never count:

1. NVML's compute processes on each GPU (nvml.py): every process with a context, by host pid. A pid NVML lists that
   /proc no longer has is a **zombie**: a descendant of a dead client keeps its context (and its memory) alive.
2. The /proc scan: a process that maps ``/dev/nvidia-uvm`` has a context (an NVML-only process such as nvidia-smi or
   dcgm-exporter holds the device files but maps none). The scan cannot tell which GPU, so it counts for every one.
   A process whose maps cannot be read and that NVML does not list has no context.

classification.cuda_record turns the evidence into a state (docs/cuda.md has the rule and its limits). The GPUs
considered for a region are its device's alone only when the server's device ordinal is proven to name one NVML GPU
(one GPU, no MIG, CUDA_VISIBLE_DEVICES unset or naming that GPU); otherwise every GPU (conservative).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils import nvml, procfs
from ansible_collections.tritonops.shm.plugins.module_utils.containers import identity

UVM = b'/dev/nvidia-uvm'
# nvidia-cuda-mps-control and nvidia-cuda-mps-server: /proc/PID/comm keeps the first 15 bytes of a name
MPS_COMM = 'nvidia-cuda-mps'
ZOMBIE = 'zombie'  # how an owner's why begins when NVML lists a pid /proc has no more


class Owner(NamedTuple):
    """A process that may own a CUDA region: a context holder, or a zombie (NVML lists it, /proc has it no more)."""

    pid: int
    comm: str | None
    why: str
    container: dict | None = None

    @property
    def zombie(self) -> bool:
        """NVML lists a context for this pid, and /proc has it no more."""
        return self.why.startswith(ZOMBIE)

    def as_dict(self) -> dict:
        out: dict = {'pid': self.pid, 'comm': self.comm, 'why': self.why}
        if self.container is not None:
            out['container'] = self.container
        return out


class Evidence(NamedTuple):
    """What was read to judge the CUDA regions of one server (read_evidence)."""

    reading: nvml.Reading  # NVML, as read first
    family: frozenset  # the server and its descendants (its backend stubs): never owners
    uvm_mappers: tuple  # pids outside family that map /dev/nvidia-uvm (the /proc signal)
    visible_devices: str | None  # the server's CUDA_VISIBLE_DEVICES (None: unset or unreadable)
    mps: bool  # an MPS control daemon or server runs on the host
    comms: dict  # {pid: comm} of the owners' candidates
    containers: dict  # {pid: containers.Identity.as_dict()} of those in a container
    alive: frozenset  # the pids /proc had when it was scanned (after NVML was read)

    def gpus_for(self, device_id: object) -> tuple[tuple, str | None]:
        """(the NVML GPUs a region on device_id may live on, why it is every GPU or None when proven)."""
        gpus = self.reading.gpus
        if len(gpus) != 1:
            return gpus, f'{len(gpus)} GPUs: the device ordinal is not proven to name one of them, every GPU counts'
        only = gpus[0]
        if self.visible_devices not in (None, '', '0', only.uuid):
            return gpus, f'CUDA_VISIBLE_DEVICES={self.visible_devices} for the server'
        if device_id != 0:
            return gpus, f'device_id {device_id} on a one-GPU host'
        return gpus, None

    def owners(self, gpus: Iterable[nvml.Gpu]) -> list[Owner]:
        """The possible owners of a region on gpus: NVML contexts outside the family (zombies when /proc lacks
        them), then the /proc signal's mappers of /dev/nvidia-uvm, by pid."""
        found: dict = {}
        for g in gpus:
            for p in g.processes:
                if p.pid in self.family or p.pid in found:
                    continue
                if p.pid in self.alive:
                    why = f'has a CUDA context on GPU {g.index} (NVML)'
                else:
                    why = (
                        f'{ZOMBIE}: NVML lists a CUDA context on GPU {g.index} for this pid, gone from /proc '
                        '(a descendant keeps it alive: find and stop it)'
                    )
                found[p.pid] = why
        for pid in self.uvm_mappers:
            found.setdefault(pid, 'maps /dev/nvidia-uvm (a CUDA context; NVML does not list it)')
        return [Owner(pid, self.comms.get(pid), why, self.containers.get(pid)) for pid, why in sorted(found.items())]


def _family(server_pid: int, parents: dict) -> frozenset:
    """The server and every descendant, from {pid: ppid}."""
    children: dict = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {server_pid}, [server_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return frozenset(out)


def _visible_devices(pid: int, proc: str) -> str | None:
    try:
        environ = procfs.read_bytes(f'{proc}/{pid}/environ')
    except OSError:
        return None
    for item in environ.split(b'\0'):
        if item.startswith(b'CUDA_VISIBLE_DEVICES='):
            return item.split(b'=', 1)[1].decode('utf-8', 'replace')
    return None


def read_evidence(
    server_pid: int, proc: str = '/proc', read_nvml: Callable[[], nvml.Reading] | None = None
) -> Evidence:
    """One read of both signals for the server at server_pid (the module runs in the host's PID namespace)."""
    reading = (read_nvml or nvml.read)()
    parents, comms, mappers, mps = {}, {}, [], False
    pids = procfs.list_pids(proc)
    for pid in pids:
        lineage = procfs.lineage(pid, proc)
        if lineage is None:
            continue
        parents[pid] = lineage.ppid
        comm = procfs.read_comm(pid, proc)
        comms[pid] = comm
        mps = mps or (comm or '').startswith(MPS_COMM)
        try:
            if UVM in procfs.read_maps(pid, proc):
                mappers.append(pid)
        except OSError:
            pass  # cannot be inspected: it has no context unless NVML lists it
    family = _family(server_pid, parents)
    uvm = tuple(p for p in mappers if p not in family)
    candidates = set(uvm) | {p.pid for g in reading.gpus for p in g.processes if p.pid not in family}
    containers = {}
    for pid in candidates:
        found = identity(pid, proc)
        if found.found:
            containers[pid] = found.as_dict()
    return Evidence(
        reading=reading,
        family=family,
        uvm_mappers=uvm,
        visible_devices=_visible_devices(server_pid, proc),
        mps=mps,
        comms={p: comms.get(p) for p in candidates},
        containers=containers,
        alive=frozenset(pids),
    )


def server_charge(reading: nvml.Reading, server_pid: int) -> int | None:
    """The GPU memory NVML charges to the server on every GPU together (a dead client's CUDA region is charged to the
    server that imported it); None when NVML was not read or does not say."""
    if reading.error or not reading.gpus:
        return None
    total = 0
    for g in reading.gpus:
        charged = g.charged(server_pid)
        if charged is None:
            return None
        total += charged
    return total


class Freed(NamedTuple):
    """What an unregister gave back, measured: the server's NVML charge before and after, and the difference."""

    before: int | None
    after: int | None
    seconds: float

    @property
    def bytes(self) -> int | None:
        if self.before is None or self.after is None:
            return None
        return max(0, self.before - self.after)


def measure_freed(
    before: int | None,
    server_pid: int,
    expected: int,
    read_nvml: Callable[[], nvml.Reading],
    sleep: Callable[[float], object],
    clock: Callable[[], float],
    timeout: float,
) -> Freed:
    """The GPU memory that came back after CUDA regions of expected bytes were unregistered: NVML read again until the
    server's charge fell by expected (Triton closes the IPC handles; 1 GiB came back within 3 s on an H200, docs/cuda.md)
    or timeout seconds passed. Never raises: an NVML that cannot be read gives after None."""
    start = clock()
    after = None
    delay = 0.05
    while True:
        try:
            after = server_charge(read_nvml(), server_pid)
        except Exception:  # pylint: disable=broad-except  # a measure, never a failure of the cleanup
            after = None
        if before is None or after is None or before - after >= expected or clock() - start >= timeout:
            return Freed(before, after, round(clock() - start, 3))
        sleep(min(delay, max(0.0, timeout - (clock() - start))))
        delay = min(delay * 2, 1.0)
