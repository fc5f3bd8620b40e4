"""Benchmark (not a test): what a model reload costs the traffic shapes fleets run, on Triton 2.51 (issue 33, finding 5).

One real tritonserver (explicit model control) serves the rig's python model ``echo``, an ensemble ``ens`` whose one
step is ``echo``, a BLS model ``bls`` that answers through a call of ``echo``, and a stateful model ``seq``
(sequence_batching; it answers the running sum of its sequence). For each shape, each round: --threads client threads
(tritonclient.http, one connection each) send requests flat out and check every answer; after --lead seconds the
model named by the shape is reloaded as triton_backend_pool does it (backend_pool.reload_model: its own configuration
with a new ``tritonops_shm_reload`` parameter), and the loop goes on for --tail seconds after the load answered.

    plain       requests to echo,   echo reloaded
    ensemble    requests to ens,    echo (its step) reloaded
    bls_caller  requests to bls,    bls (the caller) reloaded
    bls_callee  requests to bls,    echo (the model it calls) reloaded
    sequence    sequences of --length requests to seq (START on the first, the sum checked on each), seq reloaded

A request fails when it raises or answers wrong (a sequence whose state was lost: its running sum restarts). Printed
per shape: requests, failed, and the most frequent failure texts, summed over --rounds rounds
(docs/backend-pools.md, "What a reload costs").

Run from the collection copy (make collection; build/ansible_collections/tritonops/shm), as root.
Usage: python tests/bench/bench_reload_shapes.py [--rounds 3] [--threads 2] [--shapes plain,sequence] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import re
import sys
import threading
import time

import benchenv  # noqa: F401  pylint: disable=unused-import
import numpy as np  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.tritonops.shm.plugins.module_utils.run import backend_pool
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient  # noqa: E402

# shape -> (the model requests go to, the model reloaded)
SHAPES = {
    'plain': ('echo', 'echo'),
    'ensemble': ('ens', 'echo'),
    'bls_caller': ('bls', 'bls'),
    'bls_callee': ('bls', 'echo'),
    'sequence': ('seq', 'seq'),
}
_IDS = itertools.count(1000)


def echo_once(client: httpclient.InferenceServerClient, model: str) -> str:
    """One request; '' when answered right, else what went wrong."""
    data = np.arange(16, dtype=np.uint8)
    inp = httpclient.InferInput('INPUT0', [16], 'UINT8')
    inp.set_data_from_numpy(data)
    out = client.infer(model, [inp]).as_numpy('OUTPUT0')
    return '' if np.array_equal(out, data) else 'wrong answer'


class Loop:
    """Client threads sending requests flat out; each answer and failure is counted, with its text."""

    def __init__(self, url: str, threads: int, model: str, length: int) -> None:
        self.url, self.model, self.length = url, model, length
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered = 0
        self.failures: collections.Counter = collections.Counter()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _thread in range(threads)]

    def count(self, err: str) -> None:
        with self.lock:
            self.answered += 1
            if err:
                self.failures[re.sub(r'[0-9]+', 'N', err)[:160]] += 1  # one text per kind, not per sequence

    def run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30.0, connection_timeout=30.0)
        while not self.stop.is_set():
            if self.model == 'seq':
                self.sequence(client)
                continue
            try:
                err = echo_once(client, self.model)
            except Exception as exc:  # noqa: BLE001  pylint: disable=broad-except
                err = str(exc)
            self.count(err)
        client.close()

    def sequence(self, client: httpclient.InferenceServerClient) -> None:
        """One sequence of self.length requests (values 1..length): each answer must be the running sum."""
        seq_id, total = next(_IDS), 0
        for k in range(1, self.length + 1):
            total += k
            inp = httpclient.InferInput('INPUT0', [1], 'INT32')
            inp.set_data_from_numpy(np.array([k], dtype=np.int32))
            try:
                out = client.infer(
                    'seq', [inp], sequence_id=seq_id, sequence_start=k == 1, sequence_end=k == self.length
                ).as_numpy('OUTPUT0')
                err = '' if int(out[0]) == total else 'wrong answer: the sequence lost its state'
            except Exception as exc:  # noqa: BLE001  pylint: disable=broad-except
                err = str(exc)
            self.count(err)
            if err:
                return  # the sequence is broken: the client starts a new one

    def __enter__(self) -> Loop:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def one_round(server: tritonrig.TritonServer, shape: str, args: argparse.Namespace) -> dict:
    target, reloaded = SHAPES[shape]
    host = server.url.split('://', 1)[1]
    with Loop(host, args.threads, target, args.length) as loop:
        time.sleep(args.lead)
        t0 = time.monotonic()
        with TritonClient(server.url) as api:
            backend_pool.reload_model(api, reloaded, timeout=120)
        load_s = time.monotonic() - t0
        time.sleep(args.tail)
    return {
        'load_s': round(load_s, 3),
        'requests': loop.answered,
        'failed': sum(loop.failures.values()),
        'failures': dict(loop.failures.most_common(3)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--length', type=int, default=10, help='requests per sequence')
    parser.add_argument('--lead', type=float, default=2.0)
    parser.add_argument('--tail', type=float, default=2.0)
    parser.add_argument('--shapes', default=','.join(SHAPES))
    parser.add_argument('--quick', action='store_true', help='1 round')
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    shapes = [s for s in args.shapes.split(',') if s]
    server = tritonrig.TritonServer(models=('echo', 'ens', 'bls', 'seq'), shm_size='256m').start()
    figures: dict = {'threads': args.threads, 'length': args.length, 'rounds': args.rounds, 'shapes': {}}
    try:
        figures['version'] = server.version()
        for shape in shapes:
            rounds = [one_round(server, shape, args) for _round in range(args.rounds)]
            failures: collections.Counter = collections.Counter()
            for r in rounds:
                failures.update(r['failures'])
            total = {
                'requests': sum(r['requests'] for r in rounds),
                'failed': sum(r['failed'] for r in rounds),
                'failures': dict(failures.most_common(3)),
                'load_s': sorted(r['load_s'] for r in rounds)[len(rounds) // 2],
            }
            figures['shapes'][shape] = {'rounds': rounds, 'total': total}
            print(f'{shape}: {json.dumps(total)}', flush=True)
    finally:
        server.cleanup()
    path = write_results('reload_shapes.json', figures)
    print(f'figures: {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
