# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the GPUs as NVML sees them, read through ctypes (no Python package needed).

read() returns every GPU of the host: its NVML index, its device minor number (``/dev/nvidiaN``), its UUID, whether
MIG is on, and its compute processes (``nvmlDeviceGetComputeRunningProcesses_v3``: the processes with a CUDA context
on it, by **host** pid, also for a process in its own PID namespace; an NVML-only process such as nvidia-smi or
dcgm-exporter is not one). Any failure (no ``libnvidia-ml.so.1``, no driver, not permitted) is a reading with an
``error`` and no GPU: the CUDA rule then decides nothing (classification.cuda_record).

Facts behind it: ../shared/CUDA-FACTS.md (an H200, driver 580): the calls below all return 0 as root, and a pid
NVML lists that /proc no longer has means a descendant still holds that context (a zombie client).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NamedTuple

LIBRARY = 'libnvidia-ml.so.1'
SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_INSUFFICIENT_SIZE = 7
VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory when the driver cannot say (Windows WDDM, some MIG setups)
UUID_BYTES = 96
MAX_PROCESSES = 4096  # per GPU: more contexts than this on one GPU is not a state anyone runs


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t (the _v3 calls): the layout CUDA-FACTS.md recorded."""

    _fields_ = [
        ('pid', ctypes.c_uint),
        ('usedGpuMemory', ctypes.c_ulonglong),
        ('gpuInstanceId', ctypes.c_uint),
        ('computeInstanceId', ctypes.c_uint),
    ]


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


def _processes(lib: Any, handle: Any) -> tuple:
    count = ctypes.c_uint(0)
    rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None)
    while rc == ERROR_INSUFFICIENT_SIZE:
        if count.value > MAX_PROCESSES:
            raise NvmlError(f'nvmlDeviceGetComputeRunningProcesses_v3 lists {count.value} processes')
        size = count.value + 8  # room for contexts created between the two calls
        infos = (ProcessInfo * size)()
        count = ctypes.c_uint(size)
        rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos)
        if rc == SUCCESS:
            out = [
                GpuProcess(int(i.pid), None if i.usedGpuMemory == VALUE_NOT_AVAILABLE else int(i.usedGpuMemory))
                for i in infos[: count.value]
            ]
            return tuple(sorted(out))
    _check(lib, rc, 'nvmlDeviceGetComputeRunningProcesses_v3')
    return ()  # count 0: no context on this GPU


def _mig(lib: Any, handle: Any) -> bool:
    current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
    rc = lib.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending))
    if rc == ERROR_NOT_SUPPORTED:
        return False
    _check(lib, rc, 'nvmlDeviceGetMigMode')
    return bool(current.value)


def read(load: Callable[[str], Any] = ctypes.CDLL) -> Reading:
    """Every GPU NVML sees, with its compute processes; a Reading with error when NVML cannot be read."""
    try:
        lib = load(LIBRARY)
    except OSError as exc:
        return Reading(
            (), f'NVML cannot be loaded ({LIBRARY}: {exc}): no NVIDIA driver here, or not on the loader path'
        )
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
