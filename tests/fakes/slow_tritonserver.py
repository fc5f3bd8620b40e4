"""A slow Triton as a process of its own: the unit tests' fake (fake_triton.Triton over HttpFront) answering every
request after --delay seconds, its process named tritonserver and its port on its command line (--http-port), so that
the node agent lists it as a server of the node (tests/integration/test_node_agent_round.py).

Run with the collection on PYTHONPATH: ``python slow_tritonserver.py --http-port PORT --delay 6 [REGION ...]``. It
prints READY once it listens on 127.0.0.1:PORT and serves until it is killed.
"""

from __future__ import annotations

import argparse
import ctypes
import threading

from ansible_collections.tritonops.shm.tests.fakes.fake_triton import HttpFront, Triton

PR_SET_NAME = 15


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--http-port', dest='port', type=int, required=True)  # as tritonserver's: the agent reads it
    parser.add_argument('--delay', type=float, default=6.0)
    parser.add_argument('regions', nargs='*')
    args = parser.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_NAME, b'tritonserver', 0, 0, 0)
    model = Triton()
    for name in args.regions:
        model.list(name)
    HttpFront(model, delay=args.delay, port=args.port)
    print('READY', flush=True)
    threading.Event().wait()


if __name__ == '__main__':
    main()
