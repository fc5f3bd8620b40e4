# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the holder evidence of CUDA regions (who may still own a CUDA region's memory).

A CUDA region has no file: its client is a process with a CUDA context on the region's GPU. Two signals that do not
depend on each other, read once per snapshot (read_evidence), beside the server process and its descendants (its
own backend stubs), which never count:

1. NVML's compute processes on each GPU (nvml.py): every process with a context, by host pid. A pid NVML lists that
   /proc no longer has is a **zombie**: a descendant of a dead client keeps its context (and its memory) alive.
2. The /proc scan (CUDA-FACTS.md, fact 11's table): a process that maps ``/dev/nvidia-uvm`` has a context (an
   NVML-only process such as nvidia-smi or dcgm-exporter holds the device files but maps none). A process that maps
   ``/dev/nvidiactl`` but not ``/dev/nvidia-uvm`` and that NVML does not list is a **zombie candidate**: the forked
   child that keeps a dead client's context has that shape (it keeps the context's descriptors, not its uvm mapping);
   so has a process that only counted the devices. Candidates are named and keep regions ``unknown``; they are never
   a reason to call anything stale. A process whose maps cannot be read and that NVML does not list has no context.

**The positive control.** tritonserver is a context process itself: NVML lists it and it maps ``/dev/nvidia-uvm``.
Where NVML does not list the server on a GPU, or the scan does not see the server's uvm mapping, the detectors are
blind there (a driver or platform without one of the signals), and no region on that GPU is stale
(Evidence.blind).

**Which GPUs a region may live on** (Evidence.placement). A process can have a context only on a GPU whose device
file (``/dev/nvidiaN``) it holds open, and the server imports a region (``cudaIpcOpenMemHandle``, with peer access
across GPUs) into a context of its own on the GPU that holds the memory. So a region of the server lives on a GPU the
server *reaches*: one whose device file it holds, named by its ``CUDA_VISIBLE_DEVICES`` (GPU UUIDs), where NVML lists
its own context. When the server reaches one GPU (a pod or container given one GPU, ``CUDA_VISIBLE_DEVICES`` naming
one device and the server's context on it), every region is proven to be on that GPU and contexts on other GPUs do
not count. Otherwise every GPU the server reaches counts. A region's ``device_id`` names an NVML GPU (its UUID in the
outputs) only when that is proven: the server reaches that one GPU (ordinal 0), or ``CUDA_VISIBLE_DEVICES`` gives the
ordinal's GPU by UUID. CUDA indexes in ``CUDA_VISIBLE_DEVICES`` are the CUDA runtime's order, not NVML's: they prove
nothing by themselves. A context of an owner counts on the GPUs NVML lists it on; a process NVML does not list, on
every GPU whose device file it holds (every GPU when its descriptors cannot be read).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.host import nvml, procfs
from ansible_collections.tritonops.shm.plugins.module_utils.host.containers import identity

UVM = b'/dev/nvidia-uvm'
CTL = b'/dev/nvidiactl'
NVIDIA_MAJOR = 195  # /dev/nvidiaN is 195:N; 195:254 is nvidia-modeset and 195:255 nvidiactl
GPU_MINORS = range(254)
# nvidia-cuda-mps-control and nvidia-cuda-mps-server: /proc/PID/comm keeps the first 15 bytes of a name
MPS_COMM = 'nvidia-cuda-mps'
ZOMBIE = 'zombie'  # how an owner's why begins when NVML lists a pid /proc has no more
CANDIDATE = 'zombie candidate'  # how it begins for a process with a context's descriptors and no uvm mapping


class Owner(NamedTuple):
    """A process that may own a CUDA region: a context holder, a zombie (NVML lists it, /proc has it no more), or a
    zombie candidate (the /proc shape of a dead client's forked child)."""

    pid: int
    comm: str | None
    why: str
    container: dict | None = None

    @property
    def zombie(self) -> bool:
        """NVML lists a context for this pid, and /proc has it no more."""
        return self.why.startswith(f'{ZOMBIE}:')

    @property
    def candidate(self) -> bool:
        """It maps /dev/nvidiactl without /dev/nvidia-uvm and NVML does not list it: maybe a zombie's child."""
        return self.why.startswith(CANDIDATE)

    def as_dict(self) -> dict:
        out: dict = {'pid': self.pid, 'comm': self.comm, 'why': self.why}
        if self.container is not None:
            out['container'] = self.container
        return out


class Visible(NamedTuple):
    """The server's CUDA_VISIBLE_DEVICES: read or not, set or not, and its entries as CUDA takes them."""

    readable: bool = True
    value: str | None = None  # None: unset
    entries: tuple = ()  # the devices it names; empty when any entry is not understood (then it proves nothing)

    @classmethod
    def parse(cls, value: str | None) -> Visible:
        """Comma-separated indexes or GPU-/MIG- UUIDs (or their prefixes). An entry that is neither (CUDA stops there,
        and what it takes of other spellings is not this module's to guess) leaves no entry: nothing is narrowed."""
        if value is None:
            return cls()
        entries = tuple(item.strip() for item in value.split(','))
        if not all(item.isdigit() or item.startswith(('GPU-', 'MIG-')) for item in entries):
            entries = ()
        return cls(True, value, entries)

    def uuid_gpu(self, ordinal: object, gpus: Iterable[nvml.Gpu]) -> nvml.Gpu | None:
        """The one NVML GPU whose UUID the entry of ordinal gives (a GPU- UUID or its prefix), or None."""
        if not isinstance(ordinal, int) or not 0 <= ordinal < len(self.entries):
            return None
        entry = self.entries[ordinal]
        found = [g for g in gpus if entry.startswith('GPU-') and g.uuid.startswith(entry)]
        return found[0] if len(found) == 1 else None


class Placement(NamedTuple):
    """Where a region of the server may live (Evidence.placement)."""

    gpus: tuple  # the NVML GPUs its memory may be on: the server's reach (every GPU when not narrowed)
    gpu: nvml.Gpu | None  # the NVML GPU its device_id is proven to name, or None
    why: str | None  # why gpu is None, or why gpus is more than one GPU (None when proven)


class Evidence(NamedTuple):
    """What was read to judge the CUDA regions of one server (read_evidence)."""

    reading: nvml.Reading  # NVML, as read first
    server_pid: int
    family: frozenset  # the server and its descendants (its backend stubs): never owners
    server_uvm: bool | None  # the server maps /dev/nvidia-uvm (None: its maps cannot be read): the positive control
    uvm_mappers: tuple  # pids outside family that map /dev/nvidia-uvm (the /proc signal)
    ctl_mappers: tuple  # pids outside family that map /dev/nvidiactl and not /dev/nvidia-uvm (zombie candidates)
    minors: dict  # {pid: frozenset of the /dev/nvidiaN minors it holds open, None: unreadable}: the server, unlisted
    visible: Visible  # the server's CUDA_VISIBLE_DEVICES
    mps: bool  # an MPS control daemon or server runs on the host
    comms: dict  # {pid: comm} of the owners' candidates
    containers: dict  # {pid: containers.Identity.as_dict()} of those in a container
    alive: frozenset  # the pids /proc had when it was scanned (after NVML was read)

    def server_gpus(self) -> tuple:
        """The GPUs NVML lists the server's own context on."""
        return tuple(g for g in self.reading.gpus if any(p.pid == self.server_pid for p in g.processes))

    def _held(self, pid: int, gpus: Iterable[nvml.Gpu]) -> tuple:
        """The gpus whose device file pid holds open; every one of them when that is not known, or when it holds none
        (a platform where contexts use no /dev/nvidiaN proves nothing by it)."""
        gpus = tuple(gpus)
        minors = self.minors.get(pid)
        if not minors or any(g.minor is None for g in gpus):
            return gpus
        return tuple(g for g in gpus if g.minor in minors)

    def reach(self) -> tuple[tuple, list]:
        """(the GPUs the server may hold a region's memory on, what narrowed them or could not)."""
        every, own = self.reading.gpus, self.server_gpus()
        reach, notes = self._held(self.server_pid, every), []
        if len(reach) < len(every):
            notes.append('the GPU device files the server holds')
        vis = self.visible
        if not vis.readable:
            notes.append("the server's CUDA_VISIBLE_DEVICES cannot be read")
        elif vis.value is not None:
            notes.append(f'CUDA_VISIBLE_DEVICES={vis.value} for the server')
            if vis.entries and all(e.startswith('GPU-') for e in vis.entries):
                reach = tuple(g for g in reach if any(g.uuid.startswith(e) for e in vis.entries))
            if len(vis.entries) == 1 and len(own) == 1 and own[0] in reach:
                reach = own  # the server's CUDA sees one device, and its own context says which
        reach = tuple(g for g in every if g in reach or g in own)  # where it has a context, it reaches
        return reach or every, notes

    def placement(self, device_id: object) -> Placement:
        """Where a region on device_id may live, and the NVML GPU its device_id names when that is proven."""
        reach, notes = self.reach()
        said = f' ({"; ".join(notes)})' if notes else ''
        if len(reach) == 1:
            if device_id == 0:
                return Placement(reach, reach[0], None)
            where = 'a one-GPU host' if len(self.reading.gpus) == 1 else f'a server that reaches one GPU{said}'
            return Placement(reach, None, f'device_id {device_id} on {where}')
        named = self.visible.uuid_gpu(device_id, reach) if self.visible.readable else None
        return Placement(
            reach,
            named,
            f'the server reaches {len(reach)} GPUs{said}: the device ordinal is not proven to name the GPU that holds '
            'the memory (peer access), every one counts',
        )

    def blind(self, gpus: Iterable[nvml.Gpu]) -> str | None:
        """The positive control: why the detectors cannot see the server's own context on gpus, or None when NVML
        lists the server on each of them and the /proc scan sees its uvm mapping (CUDA-FACTS.md, fact 11)."""
        own = self.server_gpus()
        missing = [g for g in gpus if g not in own]
        if missing:
            where = ', '.join(f'GPU {g.index}' for g in missing)
            return (
                f'NVML does not list the server (pid {self.server_pid}) on {where}: the detectors cannot see the '
                "server's own context there, so they cannot see a client's either"
            )
        if not self.server_uvm:
            how = 'its maps cannot be read' if self.server_uvm is None else 'it maps no /dev/nvidia-uvm'
            return (
                f"the /proc scan cannot see the server's own CUDA context ({how}): the detectors cannot see a "
                "client's either"
            )
        return None

    def owners(self, gpus: Iterable[nvml.Gpu]) -> list[Owner]:
        """The possible owners of a region on gpus, by pid: NVML's contexts there outside the family (zombies when
        /proc lacks them), then the processes NVML does not list that hold a device file of one of gpus (every one
        when unknown): mappers of /dev/nvidia-uvm, and zombie candidates."""
        gpus = tuple(gpus)
        found: dict = {}
        listed = {p.pid for g in self.reading.gpus for p in g.processes}
        for g in gpus:
            for p in g.processes:
                if p.pid in self.family or p.pid in found:
                    continue
                if p.pid in self.alive:
                    why = f'has a CUDA context on GPU {g.index} (NVML)'
                else:
                    why = (
                        f'{ZOMBIE}: NVML lists a CUDA context on GPU {g.index} for this pid, gone from /proc '
                        '(a descendant keeps it alive: find it by the NVIDIA device files it holds, docs/cuda.md)'
                    )
                found[p.pid] = why
        for pid in self.uvm_mappers:
            if pid not in listed and self._held(pid, gpus):
                found.setdefault(pid, 'maps /dev/nvidia-uvm (a CUDA context; NVML does not list it)')
        for pid in self.ctl_mappers:
            if pid not in listed and self._held(pid, gpus):
                found.setdefault(
                    pid,
                    f'{CANDIDATE}: maps /dev/nvidiactl without /dev/nvidia-uvm and NVML does not list it, as the '
                    "forked child that keeps a dead client's context does (or a process that only counted the GPUs)",
                )
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


def _visible_devices(pid: int, proc: str) -> Visible:
    try:
        environ = procfs.read_bytes(f'{proc}/{pid}/environ')
    except OSError:
        return Visible(readable=False)
    for item in environ.split(b'\0'):
        if item.startswith(b'CUDA_VISIBLE_DEVICES='):
            return Visible.parse(item.split(b'=', 1)[1].decode('utf-8', 'replace'))
    return Visible()


def mapped_devices(maps: bytes) -> frozenset:
    """The NVIDIA device files (UVM, CTL) among the paths a /proc/PID/maps text maps, compared whole."""
    out: set = set()
    if UVM not in maps and CTL not in maps:
        return frozenset()  # most processes: no line to split
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5] in (UVM, CTL):
            out.add(parts[5])
    return frozenset(out)


def device_minors(pid: int, proc: str = '/proc') -> frozenset | None:
    """The minors of the GPU device files (/dev/nvidiaN, by device number) that pid holds open, through every live
    task's descriptor table when the leader's is bare; None when none can be read."""
    minors, read = set(), False
    for base in [f'{proc}/{pid}/fd'] + [f'{proc}/{pid}/task/{t}/fd' for t in procfs.other_tasks(pid, proc)]:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        read = True
        for name in names:
            try:
                st = os.stat(f'{base}/{name}')
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == NVIDIA_MAJOR and os.minor(st.st_rdev) in GPU_MINORS:
                minors.add(os.minor(st.st_rdev))
        if names and base == f'{proc}/{pid}/fd':
            break  # the leader's table is the process's
    return frozenset(minors) if read else None


def read_evidence(
    server_pid: int, proc: str = '/proc', read_nvml: Callable[[], nvml.Reading] | None = None
) -> Evidence:
    """One read of both signals for the server at server_pid (the module runs in the host's PID namespace)."""
    reading = (read_nvml or nvml.read)()
    parents, comms, devices, mps = {}, {}, {}, False
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
            devices[pid] = mapped_devices(procfs.read_maps(pid, proc))
        except OSError:
            pass  # cannot be inspected: it has no context unless NVML lists it
    family = _family(server_pid, parents)
    uvm = tuple(p for p, d in devices.items() if UVM in d and p not in family)
    ctl = tuple(p for p, d in devices.items() if CTL in d and UVM not in d and p not in family)
    listed = {p.pid for g in reading.gpus for p in g.processes}
    candidates = set(uvm) | set(ctl) | (listed - family)
    containers = {}
    for pid in candidates:
        found = identity(pid, proc)
        if found.found:
            containers[pid] = found.as_dict()
    unlisted = sorted(p for p in set(uvm) | set(ctl) if p not in listed)
    return Evidence(
        reading=reading,
        server_pid=server_pid,
        family=family,
        server_uvm=(UVM in devices[server_pid]) if server_pid in devices else None,
        uvm_mappers=uvm,
        ctl_mappers=ctl,
        minors={p: device_minors(p, proc) for p in [server_pid, *unlisted]},
        visible=_visible_devices(server_pid, proc),
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


# How far short of the unregistered regions' bytes the server's NVML charge may fall and still count as all back: one
# 2 MiB large page (the granularity of the GPU allocations NVML charges) plus 1% of the bytes (the server's own
# allocations, a request's workspace, that move while the charge is read). Measured: 1 GiB and 200 x 1 MiB came back
# exactly on the H200 (CUDA-FACTS.md, fact 6), well inside it.
SETTLE_PAGE = 2 << 20
SETTLE_FRACTION = 0.01


def settle_tolerance(expected: int) -> int:
    """The bytes by which what came back may fall short of expected and still be all of it (SETTLE_PAGE and
    SETTLE_FRACTION)."""
    return SETTLE_PAGE + int(expected * SETTLE_FRACTION)


def all_back(freed: int | None, expected: int) -> bool:
    """Whether freed bytes are the expected bytes back, within settle_tolerance (False when not measured)."""
    return freed is not None and freed >= expected - settle_tolerance(expected)


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
    server's charge fell by expected, within settle_tolerance (Triton closes the IPC handles; 1 GiB came back within 3 s
    on an H200, docs/cuda.md), or timeout seconds passed. Never raises: an NVML that cannot be read gives after None."""
    start = clock()
    after = None
    delay = 0.05
    while True:
        try:
            after = server_charge(read_nvml(), server_pid)
        except Exception:  # pylint: disable=broad-except  # a measure, never a failure of the cleanup
            after = None
        if before is None or after is None or all_back(before - after, expected) or clock() - start >= timeout:
            return Freed(before, after, round(clock() - start, 3))
        sleep(min(delay, max(0.0, timeout - (clock() - start))))
        delay = min(delay * 2, 1.0)
