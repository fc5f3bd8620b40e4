"""Bounded soak: live inference traffic while the cleanup role runs again and again, and clients keep dying.

On one real tritonserver (echo python model, private /dev/shm):

- LIVE tritonclient processes run inferences in a loop through their own system
  shared-memory regions (NAME for the input, NAME_out for the output) and check
  every answer (tests/rig/client.py --mode infer);
- a leaker keeps starting more such clients and SIGKILLing them mid-traffic
  (their regions stay registered: stale, or dangling when the client's resource
  tracker unlinked the file);
- the cleanup role tritonops.shm.shm_cleanup (mode stale) runs repeatedly next to
  them, with real ansible-playbook runs.

When the time or the run count is up, leaking stops, one last cleanup runs, the
live clients are stopped, and the figures are printed (and returned):
inferences attempted and failed (goal 0), live regions removed (goal 0), leaked
regions left after the last run (goal 0). Stops by itself.

    python tests/bench/soak.py [--duration 120] [--max-runs 30] [--live 3] [--json FILE]

(`make soak` runs it from the collection copy.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TESTS, 'rig'))
sys.path.insert(0, os.path.join(TESTS, 'integration'))

import ansible_helpers  # noqa: E402  pylint: disable=wrong-import-position
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position

STATS = re.compile(r'STATS ok=(\d+) failed=(\d+)')
KIB = 1024


def cleanup_play(server):
    return [
        {
            'name': 'soak cleanup',
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'roles': [
                {
                    'role': 'tritonops.shm.shm_cleanup',
                    'vars': {
                        'shm_cleanup_url': server.url,
                        'shm_cleanup_mode': 'stale',
                        'shm_cleanup_in_use_timeout': 5,
                    },
                }
            ],
        }
    ]


def _final_stats(client):
    """(ok, failed, error lines) from a stopped infer client's output."""
    ok = failed = 0
    for line in client.lines:
        m = STATS.search(line)
        if m:
            ok, failed = int(m.group(1)), int(m.group(2))
    errors = [line for line in client.lines if line.startswith(('ERROR', 'MISMATCH'))]
    return ok, failed, errors


class Leaker(threading.Thread):
    """Start infer clients and SIGKILL them mid-traffic, until stopped."""

    def __init__(self, server, byte_size, interval, pause):
        super().__init__(daemon=True)
        self.pause = pause
        self.server = server
        self.byte_size = byte_size
        self.interval = interval
        self.stop_event = threading.Event()
        self.leaked = []  # region names leaked
        self.errors = []

    def run(self):
        k = 0
        while not self.stop_event.is_set():
            name = 'leak%d' % k
            try:
                client = self.server.client(name, byte_size=self.byte_size, mode='infer', pause=self.pause)
                self.stop_event.wait(0.3)  # let it run some inferences, then kill it mid-traffic
                client.kill(keep_file=(k % 3 != 2))  # every third one dangling: its tracker unlinks the file
                self.leaked += [name, name + '_out']
            except Exception as exc:  # keep leaking; report at the end  pylint: disable=broad-except
                self.errors.append('%s: %s' % (name, exc))
            k += 1
            self.stop_event.wait(self.interval)


def soak(
    duration=120.0,
    max_runs=30,
    live=3,
    byte_size=64 * KIB,
    leak_interval=0.5,
    pause=0.01,
    shm_size='64m',
    workdir=None,
    log=print,
):
    """Run the soak; return the figures (a dict)."""
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix='soak-')
    server = tritonrig.TritonServer(workdir=workdir, shm_size=shm_size)
    figures = dict(
        duration_s=None,
        pause_s=pause,
        cleanup_runs=0,
        cleanup_failed_runs=0,
        cleanup_run_s=[],
        live_clients=live,
        inferences_attempted=0,
        inferences_failed=0,
        live_regions_removed=0,
        leaked_regions=0,
        leaked_unregistered_by_cleanup=0,
        leaked_regions_left=0,
        leaked_files_left=0,
        failures=[],
    )
    started = time.monotonic()
    try:
        server.start()
        clients = [server.client('live%d' % i, byte_size=byte_size, mode='infer', pause=pause) for i in range(live)]
        live_names = set()
        for c in clients:
            live_names |= {c.name, c.name + '_out'}
        backend_before = set(server.backend_files())
        leaker = Leaker(server, byte_size, leak_interval, pause)
        leaker.start()
        removed_live = set()

        def one_run(label):
            t0 = time.monotonic()
            res = ansible_helpers.ansible_playbook(cleanup_play(server))
            elapsed = time.monotonic() - t0
            figures['cleanup_runs'] += 1
            figures['cleanup_run_s'].append(round(elapsed, 2))
            host = {}
            for _name, result in res.tasks():
                host = (result.get('ansible_facts') or {}).get('shm_cleanup_result', host)
            done = host.get('done') or {}
            figures['leaked_unregistered_by_cleanup'] += len(
                [n for n in done.get('unregistered', []) if n.startswith('leak')]
            )
            if res.rc != 0:
                figures['cleanup_failed_runs'] += 1
                failed = ['%s: %s' % (n, r.get('msg')) for n, r in res.tasks() if r.get('failed')]
                figures['failures'].append(
                    '%s: rc=%s %s' % (label, res.rc, json.dumps(host.get('error') or failed or res.stderr[-500:])[:800])
                )
            regions = server.system_regions()
            files = set(server.shm_files())
            gone = set(n for n in live_names if n not in regions or n not in files)
            removed_live.update(gone)
            log(
                'run %-6s %5.1fs rc=%s unregistered=%-3d registered now=%-3d live regions missing=%d'
                % (label, elapsed, res.rc, len(done.get('unregistered', [])), len(regions), len(gone))
            )

        while time.monotonic() - started < duration and figures['cleanup_runs'] < max_runs:
            one_run(str(figures['cleanup_runs'] + 1))
        leaker.stop_event.set()
        leaker.join(timeout=60)
        one_run('last')
        figures['duration_s'] = round(time.monotonic() - started, 1)
        regions = server.system_regions()
        files = set(server.shm_files())
        figures['leaked_regions'] = len(leaker.leaked)
        figures['leaked_regions_left'] = len([n for n in regions if n.startswith('leak')])
        figures['leaked_files_left'] = len([f for f in files if f.startswith('leak')])
        figures['live_regions_removed'] = len(removed_live)
        figures['backend_files_kept'] = backend_before <= set(server.backend_files())
        figures['failures'] += leaker.errors
        for c in clients:
            figures['live_clients_alive_at_end'] = figures.get('live_clients_alive_at_end', 0) + (1 if c.alive else 0)
            c.stop()  # SIGTERM: the client prints its final STATS line and exits
        time.sleep(0.5)
        for c in clients:
            ok, failed, errors = _final_stats(c)
            figures['inferences_attempted'] += ok + failed
            figures['inferences_failed'] += failed
            figures['failures'] += ['%s: %s' % (c.name, e) for e in errors[:5]]
    finally:
        server.stop()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    runs = figures['cleanup_run_s']
    figures['cleanup_run_s_median'] = round(statistics.median(runs), 2) if runs else None
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--duration', type=float, default=120.0, help='seconds of traffic and cleanup runs (default 120)'
    )
    parser.add_argument(
        '--max-runs', type=int, default=30, help='at most this many cleanup runs before the last one (default 30)'
    )
    parser.add_argument('--live', type=int, default=3, help='live inference clients (default 3)')
    parser.add_argument(
        '--pause', type=float, default=0.01, help='seconds each client waits between inferences (default 0.01)'
    )
    parser.add_argument('--json', help='also write the figures to this file')
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print('the soak needs root (the rig uses mount namespaces)', file=sys.stderr)
        return 2
    figures = soak(duration=args.duration, max_runs=args.max_runs, live=args.live, pause=args.pause)
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(figures, f, indent=2)
    goals = (
        figures['inferences_failed'] == 0
        and figures['live_regions_removed'] == 0
        and figures['leaked_regions_left'] == 0
        and figures['inferences_attempted'] > 0
    )
    print(
        'SOAK %s: %d inferences, %d failed; %d regions leaked, %d left; %d live regions removed; %d cleanup runs (median %ss)'
        % (
            'OK' if goals else 'FAILED',
            figures['inferences_attempted'],
            figures['inferences_failed'],
            figures['leaked_regions'],
            figures['leaked_regions_left'],
            figures['live_regions_removed'],
            figures['cleanup_runs'],
            figures['cleanup_run_s_median'],
        )
    )
    return 0 if goals else 1


if __name__ == '__main__':
    sys.exit(main())
