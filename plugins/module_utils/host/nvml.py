# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the GPUs as NVML sees them, read through ctypes (no Python package needed).

read() returns every GPU of the host: its NVML index, its device minor number (``/dev/nvidiaN``), its UUID, whether
MIG is on, and its compute processes (``nvmlDeviceGetComputeRunningProcesses_v3``: the processes with a CUDA context
on it, by **host** pid, also for a process in its own PID namespace; an NVML-only process such as nvidia-smi or
dcgm-exporter is not one). Any failure (no ``libnvidia-ml.so.1``, no driver, not permitted) is a reading with an
``error`` and no GPU: the CUDA rule then decides nothing (classification.gpu_record).

Facts behind it: ../shared/CUDA-FACTS.md (an H200, driver 580): the calls below all return 0 as root, and a pid
NVML lists that /proc no longer has means a descendant still holds that context (a zombie client).

An answer is trusted only when it is plausible. ``_v3`` entries are 24 bytes with driver 580, but some R535 drivers
write a 32-byte entry (an extra field), which a fixed 24-byte layout misreads as garbage pids (and a buffer sized for
24-byte entries overflows): the buffer has room for 32-byte entries and is filled with a sentinel, the entries are
decoded with both sizes, and only a size that fits what was written (every pid one Linux can have, 1 to
PID_MAX_LIMIT; plausible charges; every entry's instance ids written; nothing written past the last entry) is taken.
When neither size, or both with different answers, fit, the reading is an error (so every CUDA region is
``unknown``), never a list of pids.

The library is looked for on the loader path first, then where drivers are installed in practice (LIBRARY_DIRS:
the distributions' library directories, the container toolkit's ``/usr/local/nvidia``, the GPU Operator's driver
root ``/run/nvidia/driver``, and a host root mounted at ``/host``). Those are loaded into a process that runs as
root: a file outside the loader path is loaded only when it and every directory above it belong to root (or to the
user running the module) and no one else can write them (a sticky directory such as /tmp excepted).
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

LIBRARY = 'libnvidia-ml.so.1'
SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_INSUFFICIENT_SIZE = 7
VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory when the driver cannot say (Windows WDDM, some MIG setups)
UUID_BYTES = 96
MAX_PROCESSES = 4096  # per GPU: more contexts than this on one GPU is not a state anyone runs
# nvmlProcessInfo_v3_t as CUDA-FACTS.md recorded it ({uint pid; ulonglong usedGpuMemory; uint gpuInstanceId; uint
# computeInstanceId}, 24 bytes), and the 32-byte entry some R535 drivers write (one more 8-byte field)
ENTRY_SIZES = (24, 32)
ENTRY = struct.Struct('=I4xQ')  # pid, padding, usedGpuMemory: the start of either entry
SENTINEL = b'\xa5'  # what the entries' buffer holds before the call: what stays so was not written
PID_MAX_LIMIT = 1 << 22  # the largest pid_max Linux allows (64-bit): a larger pid is garbage
MAX_USED_BYTES = 1 << 50  # 1 PiB: no GPU has that much memory, so a larger charge is garbage
LIBRARY_DIRS = (
    '/usr/lib/x86_64-linux-gnu',
    '/usr/lib/aarch64-linux-gnu',
    '/usr/lib64',
    '/usr/lib',
    '/usr/local/nvidia/lib64',  # the NVIDIA container toolkit's and device plugin's mount (the H200 of CUDA-FACTS.md)
    '/usr/local/nvidia/lib',
    '/run/nvidia/driver/usr/lib/x86_64-linux-gnu',  # the GPU Operator's driver container root, seen from the host
    '/run/nvidia/driver/usr/lib/aarch64-linux-gnu',
    '/run/nvidia/driver/usr/lib64',
    '/host/usr/lib/x86_64-linux-gnu',  # a pod that mounts the host's root at /host
    '/host/usr/lib/aarch64-linux-gnu',
    '/host/usr/lib64',
    '/host/run/nvidia/driver/usr/lib/x86_64-linux-gnu',
    '/host/run/nvidia/driver/usr/lib64',
)


class GpuProcess(NamedTuple):
    """A process with a CUDA context on a GPU: its host pid and the GPU memory NVML charges to it (None: unknown)."""

    pid: int
    used_bytes: int | None


class Gpu(NamedTuple):
    index: int
    minor: int | None  # /dev/nvidiaN; None when NVML cannot say
    uuid: str
    mig: bool  # MIG mode on: a CUDA ordinal then names a MIG instance, not this GPU
    processes: tuple  # GpuProcess, by pid

    def charged(self, pid: int) -> int | None:
        """The GPU memory NVML charges to pid on this GPU (0 when it lists no context of pid; None: not known)."""
        found = [p.used_bytes for p in self.processes if p.pid == pid]
        if not found:
            return 0
        return None if None in found else sum(found)


class Reading(NamedTuple):
    gpus: tuple  # Gpu, by index
    error: str | None = None  # why NVML could not be read (then gpus is empty)


class NvmlError(Exception):
    pass


def _check(lib: Any, rc: int, call: str) -> None:
    if rc != SUCCESS:
        text = ''
        fn = getattr(lib, 'nvmlErrorString', None)
        if fn is not None:
            try:
                fn.restype = ctypes.c_char_p  # a library function: its answer is a C string
            except AttributeError:
                pass
            try:
                text = (fn(rc) or b'').decode('utf-8', 'replace')
            except (TypeError, ValueError, AttributeError):
                pass
        raise NvmlError(f'{call} returned {rc}' + (f' ({text})' if text else ''))


def _decode(raw: bytes, count: int, size: int) -> tuple | None:
    """The entries of raw read as count entries of size bytes, or None when that cannot be what the driver wrote: a
    pid Linux cannot have, a charge no GPU can hold, an entry whose instance ids were never written, or bytes written
    past the last entry (raw was filled with SENTINEL before the call)."""
    if raw[count * size :].strip(SENTINEL):
        return None
    out = []
    for i in range(count):
        pid, used = ENTRY.unpack_from(raw, i * size)
        if not 0 < pid <= PID_MAX_LIMIT or (used != VALUE_NOT_AVAILABLE and used > MAX_USED_BYTES):
            return None
        if not raw[i * size + 16 : i * size + 24].strip(SENTINEL):
            return None
        out.append(GpuProcess(pid, None if used == VALUE_NOT_AVAILABLE else used))
    return tuple(sorted(out))


def entries(raw: bytes, count: int) -> tuple:
    """The processes of a _v3 answer of count entries in raw, whichever entry size the driver wrote (ENTRY_SIZES):
    the one size whose entries are all plausible; NvmlError when none is, or when two sizes give different answers."""
    if count * max(ENTRY_SIZES) > len(raw):
        raise NvmlError(
            f'nvmlDeviceGetComputeRunningProcesses_v3 reports {count} entries, more than it was given room for'
        )
    found = {size: _decode(raw, count, size) for size in ENTRY_SIZES}
    answers = {v for v in found.values() if v is not None}
    if len(answers) == 1:
        return answers.pop()
    if not answers:
        pids = sorted({ENTRY.unpack_from(raw, i * size)[0] for size in ENTRY_SIZES for i in range(count)})[:8]
        why = f'implausible entries (pids {pids}) with every entry size {ENTRY_SIZES}'
    else:
        why = f'entries that read differently with each entry size {ENTRY_SIZES}'
    raise NvmlError(f'nvmlDeviceGetComputeRunningProcesses_v3 returned {why}: its answer is not trusted')


def _processes(lib: Any, handle: Any) -> tuple:
    count = ctypes.c_uint(0)
    rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None)
    while rc == ERROR_INSUFFICIENT_SIZE:
        if count.value > MAX_PROCESSES:
            raise NvmlError(f'nvmlDeviceGetComputeRunningProcesses_v3 lists {count.value} processes')
        size = count.value + 8  # room for contexts created between the two calls
        buf = (ctypes.c_ubyte * (size * max(ENTRY_SIZES)))()  # room for the larger entry: a driver writing 32 bytes
        ctypes.memset(buf, SENTINEL[0], ctypes.sizeof(buf))
        count = ctypes.c_uint(size)
        rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), buf)
        if rc == SUCCESS:
            if count.value > size:
                raise NvmlError(
                    f'nvmlDeviceGetComputeRunningProcesses_v3 reports {count.value} entries in room for {size}'
                )
            return entries(bytes(buf), count.value)
    _check(lib, rc, 'nvmlDeviceGetComputeRunningProcesses_v3')
    return ()  # count 0: no context on this GPU


def _mig(lib: Any, handle: Any) -> bool:
    current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
    rc = lib.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending))
    if rc == ERROR_NOT_SUPPORTED:
        return False
    _check(lib, rc, 'nvmlDeviceGetMigMode')
    return bool(current.value)


def trusted(path: str, euid: int | None = None) -> str | None:
    """Why the library file at path may not be loaded into this process, or None: it and every directory above it
    (symbolic links resolved) must belong to root or euid, and no one else may write them (a sticky directory excepted:
    no one else can replace what it holds that belongs to root or euid)."""
    euid = os.geteuid() if euid is None else euid
    real = os.path.realpath(path)
    node = real
    while True:
        try:
            st = os.lstat(node)
        except OSError as exc:
            return f'{node}: {exc.strerror}'
        if node == real and not stat.S_ISREG(st.st_mode):
            return f'{real} is not a regular file'
        if st.st_uid not in (0, euid):
            return f'{node} belongs to uid {st.st_uid}'
        if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            return f'{node} may be written by others (mode {stat.S_IMODE(st.st_mode):o})'
        parent = os.path.dirname(node)
        if parent == node:
            return None
        node = parent


def load_library(load: Callable[[str], Any], dirs: Iterable[str] = LIBRARY_DIRS) -> Any:
    """NVML's library: from the loader path, else from the first of dirs that has a trusted one; OSError naming
    every place tried when there is none."""
    try:
        return load(LIBRARY)
    except OSError as exc:
        tried = [f'the loader path: {exc}']
    for d in dirs:
        path = os.path.join(d, LIBRARY)
        if not os.path.lexists(path):
            continue
        refusal = trusted(path)
        if refusal is not None:
            tried.append(f'{path} not loaded: {refusal}')
            continue
        try:
            return load(path)
        except OSError as exc:
            tried.append(f'{path}: {exc}')
    raise OSError('; '.join(tried) + f'; none in {", ".join(dirs)}')


def read(load: Callable[[str], Any] = ctypes.CDLL, dirs: Iterable[str] = LIBRARY_DIRS) -> Reading:
    """Every GPU NVML sees, with its compute processes; a Reading with error when NVML cannot be read or its answer is
    not plausible."""
    try:
        lib = load_library(load, dirs)
    except OSError as exc:
        return Reading((), f'NVML cannot be loaded ({LIBRARY}: {exc}): no NVIDIA driver here, or not where drivers are')
    try:
        _check(lib, lib.nvmlInit_v2(), 'nvmlInit_v2')
    except (NvmlError, AttributeError) as exc:
        return Reading((), f'NVML cannot be initialised: {exc}')
    try:
        count = ctypes.c_uint(0)
        _check(lib, lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), 'nvmlDeviceGetCount_v2')
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            _check(lib, lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), 'nvmlDeviceGetHandleByIndex_v2')
            minor = ctypes.c_uint(0)
            has_minor = lib.nvmlDeviceGetMinorNumber(handle, ctypes.byref(minor)) == SUCCESS
            uuid = ctypes.create_string_buffer(UUID_BYTES)
            _check(lib, lib.nvmlDeviceGetUUID(handle, uuid, UUID_BYTES), 'nvmlDeviceGetUUID')
            gpus.append(
                Gpu(
                    index=index,
                    minor=minor.value if has_minor else None,
                    uuid=uuid.value.decode('ascii', 'replace'),
                    mig=_mig(lib, handle),
                    processes=_processes(lib, handle),
                )
            )
        return Reading(tuple(gpus))
    except (NvmlError, AttributeError) as exc:
        return Reading((), f'NVML could not be read: {exc}')
    finally:
        try:
            lib.nvmlShutdown()
        except AttributeError:
            pass
