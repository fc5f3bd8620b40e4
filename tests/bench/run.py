"""Run every benchmark (tests/bench/bench_*.py) in turn; each prints its figures and writes JSON to bench-results/.

Benchmarks are not tests: they measure and report, they do not pass or fail on a time.
Usage: python tests/bench/run.py [NAME ...]   (NAME: bench_NAME.py, e.g. ``info``; default all)
"""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(HERE))


def checkout() -> str:
    """The checkout this copy was made from: make collection copies it to build/ (also when run from there)."""
    parts = COLLECTION.split(os.sep)
    if parts[-4:-3] == ['build'] and parts[-3:] == ['ansible_collections', 'tritonops', 'shm']:
        return os.sep.join(parts[:-4])
    return COLLECTION


def results_dir():
    """Where figures go: $BENCH_RESULTS_DIR, else bench-results/ of the checkout (also when run from its build/ copy)."""
    path = os.environ.get('BENCH_RESULTS_DIR') or os.path.join(checkout(), 'bench-results')
    os.makedirs(path, exist_ok=True)
    return path


def write_results(filename, figures):
    """Write a benchmark's figures as JSON into results_dir(); return the path."""
    path = os.path.join(results_dir(), filename)
    with open(path, 'w') as f:
        json.dump(figures, f, indent=2, sort_keys=True)
    return path


def _load(filename, since=None):
    """A benchmark's figures; None when missing, unreadable, or (since: a time.time()) written before since."""
    path = os.path.join(results_dir(), filename)
    try:
        if since is not None and os.stat(path).st_mtime < since:
            return None
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def print_goals():
    """The /proc reading goal (issue 14), from info.json when it was written (the cost goals: print_issue28_goals)."""
    info = _load('info.json')
    rows = []
    if info:
        rows.append(
            (
                'triton_shm_info work vs grep -l /dev/shm /proc/*/maps (median of %d)' % info['repeat'],
                info['work_over_grep'],
                2.0,
            )
        )
    if rows:
        print('== goals')
        for what, ratio, goal in rows:
            print('  %-75s %5.2fx  goal <= %.1fx: %s' % (what, ratio, goal, 'met' if ratio <= goal else 'MISSED'))


# issues 22 and 26: each benchmark writes its goals as rows {goal, value, met} under 'issue22' / 'issue26' in its JSON
GOAL_ROWS = {
    'issue 22': (
        ('bench_bulk.json', 'bulk cleanup (bench_bulk.py)'),
        ('bench_poller.json', 'poller at fleet size (bench_poller.py)'),
        ('bench_discovery_load.json', 'discovery under load (bench_discovery_load.py)'),
    ),
    'issue 26': (
        ('bench_vs_base.json', 'cleanup at 3,000 regions vs the build before issues 25-27 (bench_vs_base.py)'),
    ),
}


def print_goal_rows(issue: str, since: float | None = None) -> None:
    """Every goal of issue next to the figure this run measured, PASS or MISS; a benchmark that did not write is said so."""
    print(f'== {issue} goals (figures of this run)')
    key = issue.replace(' ', '')
    for filename, what in GOAL_ROWS[issue]:
        figures = _load(filename, since)
        if not figures or key not in figures:
            print(f'  {what}: not measured in this run')
            continue
        for row in figures[key]:
            print(f'  {row["goal"]:104} {row["value"]:>14}  {"PASS" if row["met"] else "MISS"}')


# issue 28: the cost goals (bench_cost.py: CPU per host of a play / a one-task triton_shm_info play, textfile directory
# present) and bulk HTTP unregister vs tritonclient.http's loop per region at 3,000 regions (bench_bulk.py)
ISSUE_28_COST = (
    ('cleanup-noop', 'cleanup with nothing to do', 1.3),
    ('cleanup-leaks', 'cleanup with 3 leaks', 1.5),
    ('report', 'report', 1.2),
)
ISSUE_28_BULK_GOAL = 1.0


class GoalRow(NamedTuple):
    """One line of the issue-28 summary: what, the measured ratio (None: not measured in this run), its goal, how."""

    what: str
    ratio: float | None
    goal: float
    how: str


def issue28_rows(since: float | None = None) -> list[GoalRow]:
    """The issue-28 ratios this run measured (cost.json, bench_bulk.json written since `since`), next to their goals."""
    rows = []
    cost = _load('cost.json', since) or {}
    ratios = cost.get('ratio_vs_info') or {}
    how = (
        f'bench_cost: {cost.get("hosts")} servers, {cost.get("leaks_per_host")} leaks/host, median of '
        f'{cost.get("repeat")}, textfile {cost.get("textfile")}'
        if cost
        else 'bench_cost.py did not write cost.json'
    )
    for play, what, goal in ISSUE_28_COST:
        rows.append(GoalRow(f'{what}: CPU per host / a one-task triton_shm_info play', ratios.get(play), goal, how))
    bulk = _load('bench_bulk.json', since) or {}
    ratio = (bulk.get('median') or {}).get('http_ratio')
    if isinstance(ratio, float) and math.isnan(ratio):
        ratio = None
    how = (
        f'bench_bulk: {bulk.get("count")} regions, median of {bulk.get("repeat")} rounds'
        if bulk
        else 'bench_bulk.py did not write bench_bulk.json'
    )
    rows.append(
        GoalRow(
            f"bulk HTTP unregister / tritonclient.http's loop, per region at {bulk.get('count', 3000):,} regions",
            ratio,
            ISSUE_28_BULK_GOAL,
            how,
        )
    )
    return rows


def print_issue28_goals(since: float | None = None) -> None:
    """The summary table `make bench` ends with: each issue-28 ratio next to its goal, met or MISSED."""
    print('== issue 28 goals (figures of this run)')
    print(f'  {"ratio":78} {"now":>6}  {"goal":>7}  {"":12}  measured by')
    for row in issue28_rows(since):
        now = 'n/a' if row.ratio is None else f'{row.ratio:.2f}x'
        verdict = 'not measured' if row.ratio is None else 'met' if row.ratio <= row.goal else 'MISSED'
        print(f'  {row.what:78} {now:>6}  <= {row.goal:.1f}x  {verdict:12}  {row.how}')


def main(argv):
    wanted = set(argv)
    benches = sorted(glob.glob(os.path.join(HERE, 'bench_*.py')))
    if wanted:
        benches = [b for b in benches if os.path.basename(b)[len('bench_') : -len('.py')] in wanted]
        if not benches:
            print('no benchmark named %s in %s' % (', '.join(sorted(wanted)), HERE), file=sys.stderr)
            return 2
    env = dict(os.environ, BENCH_RESULTS_DIR=results_dir())
    run_started = time.time()
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
    ran = {os.path.basename(b) for b in benches}
    for issue, files in GOAL_ROWS.items():
        if ran & {name.replace('.json', '.py') for name, _what in files}:
            print_goal_rows(issue, run_started)
    if ran & {'bench_cost.py', 'bench_bulk.py'}:
        print_issue28_goals(run_started)
    if failed:
        print('benchmarks that did not complete: %s' % ', '.join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
