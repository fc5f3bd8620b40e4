"""A CUDA IPC client of Triton, run as a process of its own by tests/gpu.

    python cuda_client.py URL NAME BYTES [--fork]

Allocates BYTES on GPU 0, registers its IPC handle as the CUDA region NAME over Triton's HTTP API, prints one JSON line
({"pid", "child", "via"}) and sleeps until killed. With --fork, a child forked after the registration keeps the CUDA
context: once the parent is killed, NVML goes on listing the parent's pid (the guide's zombie). The memory comes from
CuPy, else PyTorch, else the CUDA runtime the Triton wheel bundles (ctypes, the library in TRITONRIG_CUDART): none of
them is a dependency of the collection.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import sys
import time
import urllib.request


def _cupy(size: int) -> tuple:
    import cupy  # pylint: disable=import-outside-toplevel

    memory = cupy.cuda.alloc(size)
    return 'cupy', memory, bytes(cupy.cuda.runtime.ipcGetMemHandle(memory.ptr))


def _torch(size: int) -> tuple:
    import torch  # pylint: disable=import-outside-toplevel

    tensor = torch.empty(size, dtype=torch.uint8, device='cuda:0')
    shared = tensor.untyped_storage()._share_cuda_()  # (device, IPC handle, size, offset, ...)
    if shared[3] != 0:
        raise RuntimeError('PyTorch placed the tensor inside a larger allocation: its IPC handle is not the region')
    return 'torch', tensor, bytes(shared[1])


def _cudart(size: int) -> tuple:
    lib = ctypes.CDLL(os.environ['TRITONRIG_CUDART'])
    pointer = ctypes.c_void_p()
    handle = (ctypes.c_char * 64)()
    for call, args in (
        ('cudaMalloc', (ctypes.byref(pointer), ctypes.c_size_t(size))),
        ('cudaIpcGetMemHandle', (handle, pointer)),
    ):
        rc = getattr(lib, call)(*args)
        if rc != 0:
            raise RuntimeError(f'{call} returned {rc}')
    return 'cudart', pointer, bytes(handle)


def allocate(size: int) -> tuple:
    errors = []
    for way in (_cupy, _torch, _cudart):
        try:
            return way(size)
        except Exception as exc:  # pylint: disable=broad-except  # the next way
            errors.append(f'{way.__name__[1:]}: {exc}')
    raise SystemExit('no CUDA allocation: ' + '; '.join(errors))


def main() -> None:
    url, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    via, keep, handle = allocate(size)
    body = {'raw_handle': {'b64': base64.b64encode(handle).decode()}, 'device_id': 0, 'byte_size': size}
    request = urllib.request.Request(
        f'{url}/v2/cudasharedmemory/region/{name}/register',
        data=json.dumps(body).encode(),
        method='POST',
        headers={'Content-Type': 'application/json'},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
    child = 0
    if '--fork' in sys.argv[4:]:
        child = os.fork()
        if child == 0:
            while True:  # the child keeps the context (and the memory) of its parent
                time.sleep(3600)
    print(json.dumps({'pid': os.getpid(), 'child': child, 'via': via}), flush=True)
    while keep is not None:
        time.sleep(3600)


if __name__ == '__main__':
    main()
