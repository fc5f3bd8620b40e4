"""Benchmark (not a test): what reloading a python model costs live traffic on Triton 2.51 (issue 27).

One real tritonserver (explicit model control) serves the rig's ``grow`` model. Each round:

1. one request of --large bytes grows the model's python backend pool (it never shrinks);
2. --threads client threads (tritonclient.http, one connection each) send small requests in a loop
   (--small bytes each, flat out) and count answers and failures with their text;
3. after --lead seconds, the model is reloaded as triton_backend_pool does it (backend_pool.reload_model: ``POST
   /v2/repository/models/grow/load`` with the model's own configuration and a new ``tritonops_shm_reload`` parameter;
   a load without a change is a no-op on 2.51) while the loop runs;
4. the loop goes on for --tail seconds after the old pool file is gone.

--method unload-load instead unloads the model and loads it again (what a reload without a configuration change
takes on 2.51), for comparison: the model is gone between the two calls.

Per round: failed and answered requests (during the whole loop and inside the reload window, from the
load call to the old file's removal), the load call's time, how long after its answer the old pool file
was still there, the pool's bytes before and after, and the shm filesystem's peak use during the reload
(old and new pools exist together). Figures are the medians of --rounds rounds (docs/performance.md).

Run from the collection copy (make collection; build/ansible_collections/tritonops/shm), as root.
Usage: python tests/bench/bench_pool_reload.py [--rounds 5] [--threads 2] [--large 32m] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
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

MODEL = 'grow'


def size_arg(text: str) -> int:
    units = {'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30}
    text = text.strip().lower()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def pools(server: tritonrig.TritonServer) -> dict[str, int]:
    out = {}
    for name in os.listdir(server.shm_dir):
        if name.startswith('triton_python_backend_shm_region_'):
            try:
                out[name] = os.stat(os.path.join(server.shm_dir, name)).st_size
            except FileNotFoundError:
                pass
    return out


def infer(client: httpclient.InferenceServerClient, size: int) -> None:
    inp = httpclient.InferInput('SIZE', [1], 'INT64')
    inp.set_data_from_numpy(np.array([size], dtype=np.int64))
    client.infer(MODEL, [inp])


class Loop:
    """Client threads sending small requests flat out; each answer and failure is kept with its time."""

    def __init__(self, url: str, threads: int, size: int) -> None:
        self.url, self.size = url, size
        self.stop = threading.Event()
        self.events: list[tuple[float, bool, str]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _thread in range(threads)]

    def run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30.0, connection_timeout=30.0)
        while not self.stop.is_set():
            err = ''
            try:
                infer(client, self.size)
            except Exception as exc:  # noqa: BLE001  pylint: disable=broad-except
                err = str(exc)[:200]
            with self.lock:
                self.events.append((time.monotonic(), not err, err))
        client.close()

    def __enter__(self) -> Loop:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def one_round(server: tritonrig.TritonServer, args: argparse.Namespace) -> dict:
    host = server.url.split('://', 1)[1]
    client = httpclient.InferenceServerClient(host)
    infer(client, args.large)
    before = pools(server)
    if len(before) != 1:
        raise RuntimeError(f'expected one pool file, found {before}')
    old_name, before_bytes = next(iter(before.items()))
    peak_used = 0
    with Loop(host, args.threads, args.small) as loop:
        time.sleep(args.lead)
        t0 = time.monotonic()
        if args.method == 'unload-load':
            tritonrig.http_json(
                f'{server.url}/v2/repository/models/{MODEL}/unload', method='POST', body={}, timeout=120
            )
            while any(
                m['state'] == 'READY'
                for m in tritonrig.http_json(f'{server.url}/v2/repository/index', method='POST', body={})[1]
                if m['name'] == MODEL
            ):
                time.sleep(0.01)
            tritonrig.http_json(f'{server.url}/v2/repository/models/{MODEL}/load', method='POST', body={}, timeout=120)
        else:
            with TritonClient(server.url) as api:
                backend_pool.reload_model(api, MODEL, timeout=120)
        t1 = time.monotonic()
        while old_name in pools(server) and time.monotonic() - t1 < 30:
            peak_used = max(peak_used, server.shm_usage()['used_bytes'])
            time.sleep(0.01)
        t2 = time.monotonic()
        time.sleep(args.tail)
    after = pools(server)
    events = loop.events
    window = [e for e in events if t0 <= e[0] <= t2]
    failures = collections.Counter(e[2] for e in events if not e[1])
    return {
        'load_s': round(t1 - t0, 3),
        'old_file_left_s': round(t2 - t1, 3),
        'old_file_gone': old_name not in after,
        'before_bytes': before_bytes,
        'after_bytes': sum(after.values()),
        'peak_used_bytes': peak_used,
        'requests': len(events),
        'failed': sum(1 for e in events if not e[1]),
        'window_requests': len(window),
        'window_failed': sum(1 for e in window if not e[1]),
        'failures': dict(failures.most_common(5)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--large', type=size_arg, default=size_arg('32m'))
    parser.add_argument('--small', type=size_arg, default=1024)
    parser.add_argument('--lead', type=float, default=1.0)
    parser.add_argument('--tail', type=float, default=1.0)
    parser.add_argument('--method', choices=('reload', 'unload-load'), default='reload')
    parser.add_argument('--quick', action='store_true', help='2 rounds')
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 2
    server = tritonrig.TritonServer(models=(MODEL,), shm_size='512m').start()
    rounds = []
    try:
        version = server.version()
        for i in range(args.rounds):
            r = one_round(server, args)
            print(f'round {i + 1}: {json.dumps(r)}', flush=True)
            rounds.append(r)
    finally:
        server.cleanup()
    med = {
        k: statistics.median(r[k] for r in rounds)
        for k in (
            'load_s',
            'old_file_left_s',
            'before_bytes',
            'after_bytes',
            'peak_used_bytes',
            'requests',
            'failed',
            'window_requests',
            'window_failed',
        )
    }
    figures = {
        'version': version,
        'method': args.method,
        'threads': args.threads,
        'large': args.large,
        'small': args.small,
        'rounds': rounds,
        'median': med,
        'failed_total': sum(r['failed'] for r in rounds),
        'old_file_gone_all': all(r['old_file_gone'] for r in rounds),
    }
    print(
        json.dumps(
            {'median': med, 'failed_total': figures['failed_total'], 'old_file_gone_all': figures['old_file_gone_all']},
            indent=1,
        )
    )
    path = write_results('pool_reload.json' if args.method == 'reload' else 'pool_reload_unload.json', figures)
    print(f'figures: {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
