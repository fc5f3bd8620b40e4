"""A GPU tritonserver as the stub NVML sees it: the unit tests' fake Triton (fake_triton.Triton over HttpFront, on
127.0.0.1) as a process named tritonserver that holds the NVIDIA device files as a CUDA context does
(nvidia_process.py, kind context: it maps /dev/nvidia-uvm, the /proc half of the CUDA rule's positive control), and
whose CUDA unregister gives the region's memory back: its charge in the stub's configuration falls by the region's
byte_size, to its own context's at least (CUDA-FACTS.md, fact 6). Whether NVML lists it is the test's to write.

Run inside stub_nvml.fake_dev_command, with the collection on PYTHONPATH:
``python cuda_tritonserver.py --http-port PORT --nvml-config PATH [--nvml-gpu N] [--base BYTES]``. It prints READY
once it listens and serves until it is killed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading

from ansible_collections.tritonops.shm.tests.fakes import nvidia_process, stub_nvml
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import HttpFront, Triton

PR_SET_NAME = 15


class GpuTriton(Triton):
    """The fake's model, whose CUDA unregister lowers the server's charge in the stub's configuration."""

    def __init__(self, config: str, gpu: int, base: int) -> None:
        super().__init__()
        self.config, self.gpu, self.base = config, gpu, base

    def unregister(self, kind: str, name: str, peer: object = None) -> None:
        size = int(self.cuda.get(name, {}).get('byte_size') or 0) if kind == 'cuda' else 0
        super().unregister(kind, name, peer)
        if size:
            stub_nvml.lower(self.config, os.getpid(), self.gpu, size, self.base)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--http-port', dest='port', type=int, required=True)
    parser.add_argument('--nvml-config', required=True)
    parser.add_argument('--nvml-gpu', type=int, default=0)
    parser.add_argument('--base', type=int, default=stub_nvml.SERVER_BASE)
    args = parser.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_NAME, b'tritonserver', 0, 0, 0)
    nvidia_process.hold('context', args.nvml_gpu)
    HttpFront(GpuTriton(args.nvml_config, args.nvml_gpu, args.base), port=args.port)
    print('READY', flush=True)
    threading.Event().wait()


if __name__ == '__main__':
    main()
