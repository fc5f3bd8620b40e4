"""A real Triton client that owns a system shared-memory region.

Run inside the server's mount namespace (``nsenter --mount --target PID``) so
its /dev/shm is the server's. It creates the region with tritonclient's own
shared_memory utilities (shm_open + ftruncate + mmap), registers it over HTTP
(over gRPC with ``tritonclient.grpc`` when the URL is ``grpc://HOST:PORT``),
prints ``READY`` and then:

- ``--mode hold``: keeps the mapping and sleeps (a live client);
- ``--mode infer``: also creates ``NAME_out``/``KEY_out`` and runs inferences
  on the ``echo`` model through both regions in a loop, printing one line per
  second ``STATS ok=N failed=M``; stops cleanly on SIGTERM (a live, busy client).

SIGKILL it to leak the region: no unregister, no unlink.

``--register-when-gone REGION``: create the region unregistered, print ``READY``, poll
the server's status until REGION is not listed, register the region under the name
REGION and SIGKILL the own process group at once (no unregister, no unlink): a client
that leaks a region again while a cleanup runs.

``--count N`` (hold mode only) creates and registers N regions ``NAME_i`` with
keys ``KEY_i`` (i = 0..N-1) instead of one, over one connection: a quick
way to leak many regions at once (benchmarks, bulk tests).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import ModuleType
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm


def connect(url: str) -> tuple[Any, ModuleType]:
    """(client, the tritonclient module it comes from): gRPC for grpc:// URLs, HTTP otherwise."""
    if url.startswith('grpc://'):
        import tritonclient.grpc as grpcclient  # pylint: disable=import-outside-toplevel

        return grpcclient.InferenceServerClient(url.split('://', 1)[-1]), grpcclient
    return httpclient.InferenceServerClient(url.split('://', 1)[-1]), httpclient


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument('--url', required=True)
    parser.add_argument('--name', required=True)
    parser.add_argument('--key', required=True)
    parser.add_argument('--byte-size', type=int, required=True)
    parser.add_argument('--offset', type=int, default=0)
    parser.add_argument('--mode', choices=('hold', 'infer'), default='hold')
    parser.add_argument('--no-register', action='store_true')
    parser.add_argument(
        '--no-fill',
        action='store_true',
        help='leave the region sparse (default: write it, as a real client writes tensors)',
    )
    parser.add_argument(
        '--count', type=int, default=0, help='hold mode: create and register COUNT regions NAME_i / KEY_i'
    )
    parser.add_argument(
        '--pause', type=float, default=0.0, help='infer mode: seconds to wait between inferences (default 0: flat out)'
    )
    parser.add_argument(
        '--register-when-gone', metavar='REGION', help='register as REGION once it is gone from the status, then die'
    )
    parser.add_argument('--model', default='echo', help="infer mode: the echo model to ask (default 'echo')")
    args = parser.parse_args()
    if args.count:
        return hold_many(args)
    if args.register_when_gone:
        return register_when_gone(args)

    client, api = connect(args.url)
    handle = shm.create_shared_memory_region(args.name, args.key, args.offset + args.byte_size)
    out_handle = None
    if args.mode == 'infer':
        out_handle = shm.create_shared_memory_region(args.name + '_out', args.key + '_out', args.byte_size)
    if not args.no_fill:
        shm.set_shared_memory_region(handle, [np.ones(args.offset + args.byte_size, dtype=np.uint8)])
    if not args.no_register:
        client.register_system_shared_memory(args.name, args.key, args.byte_size, offset=args.offset)
        if out_handle is not None:
            client.register_system_shared_memory(args.name + '_out', args.key + '_out', args.byte_size)
    print('READY', flush=True)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    if args.mode == 'hold':
        while not stop:
            time.sleep(0.2)
        return 0

    data = (np.arange(args.byte_size, dtype=np.uint64) % 251).astype(np.uint8)
    shm.set_shared_memory_region(handle, [data], offset=args.offset)
    ok = failed = 0
    last = time.monotonic()
    while not stop:
        try:
            inp = api.InferInput('INPUT0', [args.byte_size], 'UINT8')
            inp.set_shared_memory(args.name, args.byte_size, offset=args.offset)
            out = api.InferRequestedOutput('OUTPUT0', **({'binary_data': True} if api is httpclient else {}))
            out.set_shared_memory(args.name + '_out', args.byte_size)
            client.infer(args.model, [inp], outputs=[out])
            got = shm.get_contents_as_numpy(out_handle, np.uint8, [args.byte_size])
            if np.array_equal(got, data):
                ok += 1
            else:
                failed += 1
                print('MISMATCH', flush=True)
        except Exception as exc:  # report every failure, keep going
            failed += 1
            print('ERROR %s' % str(exc).replace('\n', ' ')[:300], flush=True)
            time.sleep(0.05)
        if args.pause:
            time.sleep(args.pause)
        now = time.monotonic()
        if now - last >= 1:
            print('STATS ok=%d failed=%d' % (ok, failed), flush=True)
            last = now
    print('STATS ok=%d failed=%d' % (ok, failed), flush=True)
    return 0


def register_when_gone(args: argparse.Namespace) -> int:
    """Wait until args.register_when_gone is not registered, register it on our own region, die with our group."""
    client = httpclient.InferenceServerClient(args.url.split('://', 1)[-1])
    handle = shm.create_shared_memory_region(args.name, args.key, args.offset + args.byte_size)
    shm.set_shared_memory_region(handle, [np.ones(args.offset + args.byte_size, dtype=np.uint8)])
    print('READY', flush=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        names = [r['name'] for r in client.get_system_shared_memory_status()]
        if args.register_when_gone not in names:
            client.register_system_shared_memory(args.register_when_gone, args.key, args.byte_size, offset=args.offset)
            print('REGISTERED', flush=True)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        time.sleep(0.01)
    return 1


def hold_many(args: argparse.Namespace) -> int:
    """Create, fill and register args.count regions, print READY and hold them until SIGTERM."""
    if args.mode != 'hold':
        raise SystemExit('--count works with --mode hold only')
    client, _api = connect(args.url)
    handles = []
    for i in range(args.count):
        name, key = '%s_%d' % (args.name, i), '%s_%d' % (args.key, i)
        handle = shm.create_shared_memory_region(name, key, args.offset + args.byte_size)
        if not args.no_fill:
            shm.set_shared_memory_region(handle, [np.ones(args.offset + args.byte_size, dtype=np.uint8)])
        if not args.no_register:
            client.register_system_shared_memory(name, key, args.byte_size, offset=args.offset)
        handles.append(handle)
    print('READY', flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        time.sleep(0.2)
    return 0


if __name__ == '__main__':
    sys.exit(main())
