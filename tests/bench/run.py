"""Run every benchmark (tests/bench/bench_*.py) in turn; each prints its figures and writes JSON to bench-results/.

Benchmarks are not tests: they measure and report, they do not pass or fail on a time.
Usage: python tests/bench/run.py [NAME ...]   (NAME: bench_NAME.py, e.g. ``info``; default all)
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(HERE))


def results_dir():
    """Where figures go: $BENCH_RESULTS_DIR, else bench-results/ of the checkout (also when run from its build/ copy)."""
    if os.environ.get('BENCH_RESULTS_DIR'):
        path = os.environ['BENCH_RESULTS_DIR']
    else:
        root = COLLECTION
        parts = root.split(os.sep)
        if parts[-4:-3] == ['build'] and parts[-3:] == ['ansible_collections', 'tritonops', 'shm']:
            root = os.sep.join(parts[:-4])  # make collection copies the checkout to build/: report into the checkout
        path = os.path.join(root, 'bench-results')
    os.makedirs(path, exist_ok=True)
    return path


def write_results(filename, figures):
    """Write a benchmark's figures as JSON into results_dir(); return the path."""
    path = os.path.join(results_dir(), filename)
    with open(path, 'w') as f:
        json.dump(figures, f, indent=2, sort_keys=True)
    return path


def _load(filename):
    try:
        with open(os.path.join(results_dir(), filename)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def print_goals():
    """The cost goals (issue 14), from this run's cost.json and info.json when they were written."""
    cost, info = _load('cost.json'), _load('info.json')
    rows = []
    if cost:
        for play, goal in sorted(cost['goals'].items()):
            rows.append(('%s CPU/host vs a one-task triton_shm_info play' % play, cost['ratio_vs_info'][play], goal))
    if info:
        rows.append(('triton_shm_info work vs grep -l /dev/shm /proc/*/maps (median of %d)' % info['repeat'],
                     info['work_over_grep'], 2.0))
    if rows:
        print('== goals')
        for what, ratio, goal in rows:
            print('  %-75s %5.2fx  goal <= %.1fx: %s' % (what, ratio, goal, 'met' if ratio <= goal else 'MISSED'))


def main(argv):
    wanted = set(argv)
    benches = sorted(glob.glob(os.path.join(HERE, 'bench_*.py')))
    if wanted:
        benches = [b for b in benches if os.path.basename(b)[len('bench_'):-len('.py')] in wanted]
        if not benches:
            print('no benchmark named %s in %s' % (', '.join(sorted(wanted)), HERE), file=sys.stderr)
            return 2
    env = dict(os.environ, BENCH_RESULTS_DIR=results_dir())
    failed = []
    for bench in benches:
        name = os.path.basename(bench)
        print('== %s' % name, flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, bench], env=env, cwd=COLLECTION)
        print('== %s: exit %d after %.1fs' % (name, rc, time.monotonic() - started), flush=True)
        if rc:
            failed.append(name)
    print_goals()
    if failed:
        print('benchmarks that did not complete: %s' % ', '.join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
