"""A process that holds the NVIDIA device files as CUDA-FACTS.md's fact 11 measured them on an H200, per kind:

| kind | fds /dev/nvidiaN | fds /dev/nvidia-uvm | maps /dev/nvidiactl | maps /dev/nvidiaN | maps /dev/nvidia-uvm |
| --- | --- | --- | --- | --- | --- |
| nvml (nvmlInit only: nvidia-smi, dcgm-exporter) | 1 | 2 | 0 | 0 | 0 |
| count (cudaGetDeviceCount only) | 4 | 2 | 1 | 2 | 0 |
| context (a CUDA context; tritonserver is one) | 20 | 2 | 27 | 3 | 1 |
| the forked child of a context process (--fork) | 20 | 2 | 27 | 3 | 0 |

Each also holds /dev/nvidiactl open (and an nvml process both nvidia-caps). Run inside stub_nvml.fake_dev_command
(the device files are regular files on a private tmpfs over /dev); whether NVML lists it is the stub's configuration,
the test's to write.

    python nvidia_process.py KIND [--gpu N] [--fork] [--comm NAME]

prints one JSON line ({"pid", "child"}) and waits until killed. With --fork, a child forked after the set-up keeps
every descriptor and mapping but the uvm one (the driver's mapping is not copied to a child: MADV_DONTFORK here).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import threading

PR_SET_NAME = 15
PAGE = mmap.PAGESIZE
# kind: (fds of /dev/nvidiaN, fds of /dev/nvidia-uvm, maps of nvidiactl, maps of /dev/nvidiaN, maps of nvidia-uvm)
SHAPES = {
    'nvml': (1, 2, 0, 0, 0),
    'count': (4, 2, 1, 2, 0),
    'context': (20, 2, 27, 3, 1),
}
KEPT: list = []  # every descriptor and mapping, for the process's life


def _maps(path: str, count: int, dontfork: bool = False) -> None:
    """count mappings of path, each of offset 0 (never merged into one line of /proc/PID/maps)."""
    fd = os.open(path, os.O_RDWR)
    for _n in range(count):
        m = mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        if dontfork:
            m.madvise(mmap.MADV_DONTFORK)
        KEPT.append(m)
    KEPT.append(fd)


def hold(kind: str, gpu: int = 0) -> None:
    """Open and map the device files as kind does (SHAPES)."""
    fds_gpu, fds_uvm, maps_ctl, maps_gpu, maps_uvm = SHAPES[kind]
    device = f'/dev/nvidia{gpu}'
    KEPT.append(os.open('/dev/nvidiactl', os.O_RDWR))
    KEPT.extend(os.open(device, os.O_RDWR) for _n in range(fds_gpu))
    KEPT.extend(os.open('/dev/nvidia-uvm', os.O_RDWR) for _n in range(fds_uvm))
    if kind == 'nvml':
        KEPT.extend(os.open(f'/dev/nvidia-caps/nvidia-cap{i}', os.O_RDONLY) for i in (1, 2))
    _maps('/dev/nvidiactl', maps_ctl)
    _maps(device, maps_gpu)
    _maps('/dev/nvidia-uvm', maps_uvm, dontfork=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('kind', choices=sorted(SHAPES))
    parser.add_argument('--gpu', type=int, default=0)
    parser.add_argument('--fork', action='store_true')
    parser.add_argument('--comm')
    args = parser.parse_args()
    if args.comm:
        ctypes.CDLL(None).prctl(PR_SET_NAME, args.comm.encode()[:15], 0, 0, 0)
    hold(args.kind, args.gpu)
    child = 0
    if args.fork:
        child = os.fork()
        if child == 0:
            threading.Event().wait()
            os._exit(0)
    print(json.dumps({'pid': os.getpid(), 'child': child}), flush=True)
    threading.Event().wait()


if __name__ == '__main__':
    main()
