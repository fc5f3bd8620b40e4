"""Benchmark (not a test): CPU per host of the collection's plays, next to a one-task triton_shm_info play.

Once schedules run cleanup and report every few minutes across a fleet, what each host
costs per run decides whether they can. In ONE run, on the same hosts: a fleet of H real
tritonservers (models=(), private 16 MiB /dev/shm each) on 127.0.1.1..H, each its own
inventory host (ansible_connection local, -f 8, pipelining on). Measured: CPU seconds of
the whole ansible-playbook process tree (this process's children's rusage: the
controller, its forks and every module process), divided by H, median of R runs (6: on a
shared 2-core machine one run's CPU moves by 10-20%, a median of 3 by about 10%), the plays in
alternation so they see the same load:

  ping          ansible.builtin.ping                      (Ansible's own floor per task)
  info          one tritonops.shm.triton_shm_info task    (the reference: 1x)
  report        tritonops.shm.report
  cleanup-noop  tritonops.shm.cleanup, nothing to do
  cleanup-leaks tritonops.shm.cleanup, L leaked regions per host (re-leaked before each run)

The playbooks run with their defaults and a node_exporter textfile directory present (a temporary
directory as prometheus_textfile_dir, what a monitored host has); --textfile absent gives a directory
that does not exist, --textfile off turns the metrics off (""). With the directory present, every run
must leave one report and one cleanup file per host in it.

Goals (issues 20 and 28, textfile directory present): cleanup-noop <= 1.3x info, cleanup-leaks <= 1.5x, report <= 1.2x.
Prints the figures, writes bench-results/cost.json.
Usage: python tests/bench/bench_cost.py [--hosts 4] [--leaks 3] [--repeat 6] [--forks 8] [--textfile present|absent|off]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile

import benchenv  # noqa: F401  pylint: disable=unused-import
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
import yaml
from bench_fleet import BIN, COLLECTIONS_PATH, leak, write_inventory  # noqa: E402  pylint: disable=wrong-import-position
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

GOALS = {'report': 1.2, 'cleanup-noop': 1.3, 'cleanup-leaks': 1.5}
PLAYS = ('ping', 'info', 'report', 'cleanup-noop', 'cleanup-leaks')


def write_plays(workdir: str) -> dict:
    """The two reference plays, as a user would write them; the others are the collection's playbooks."""
    plays = {
        'ping': [
            {
                'name': 'ping',
                'hosts': 'triton',
                'gather_facts': False,
                'tasks': [{'name': 'Ping', 'ansible.builtin.ping': None}],
            }
        ],
        'info': [
            {
                'name': 'info',
                'hosts': 'triton',
                'gather_facts': False,
                'tasks': [{'name': 'Query', 'tritonops.shm.triton_shm_info': {'url': '{{ triton_url }}'}}],
            }
        ],
    }
    paths = {}
    for name, play in plays.items():
        paths[name] = os.path.join(workdir, name + '.yml')
        with open(paths[name], 'w') as f:
            yaml.safe_dump(play, f, sort_keys=False)
    paths['report'] = 'tritonops.shm.report'
    paths['cleanup-noop'] = paths['cleanup-leaks'] = 'tritonops.shm.cleanup'
    return paths


def cpu_run(playbook: str, inventory: str, forks: int, textfile_dir: str | None) -> tuple:
    """Run ansible-playbook; return (CPU seconds of its whole process tree, stats per host)."""
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_PATH,
        ANSIBLE_PIPELINING='1',
        ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
        ANSIBLE_LOAD_CALLBACK_PLUGINS='1',
        ANSIBLE_LOCALHOST_WARNING='False',
        ANSIBLE_INVENTORY_UNPARSED_WARNING='False',
        PATH=BIN + os.pathsep + os.environ.get('PATH', ''),
    )
    cmd = [os.path.join(BIN, 'ansible-playbook'), '-i', inventory, '-f', str(forks), playbook]
    if textfile_dir is not None:
        cmd += ['-e', json.dumps({'prometheus_textfile_dir': textfile_dir})]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f'{playbook} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}')
    return cpu, json.loads(proc.stdout[proc.stdout.index('{') :])['stats']


def textfile_dir(workdir: str, mode: str) -> str | None:
    """prometheus_textfile_dir for the run: a directory that exists, one that does not, or "" (off)."""
    if mode == 'off':
        return ''
    path = os.path.join(workdir, 'textfile_collector')
    if mode == 'present':
        os.makedirs(path, mode=0o755)
    return path


def check_textfiles(path: str | None, mode: str, play: str, hosts: int) -> None:
    """With the directory present, the report and cleanup plays must have left one file per host."""
    if mode != 'present' or play not in ('report', 'cleanup-noop', 'cleanup-leaks'):
        return
    prefix = 'tritonops_shm.' if play == 'report' else 'tritonops_shm_cleanup.'
    found = [n for n in os.listdir(path) if n.startswith(prefix) and n.endswith('.prom')]
    if len(found) != hosts:
        raise SystemExit(f'{play}: {len(found)} {prefix}*.prom files in {path}, expected {hosts}')


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--hosts', type=int, default=4)
    parser.add_argument('--leaks', type=int, default=3)
    parser.add_argument('--repeat', type=int, default=6)
    parser.add_argument('--forks', type=int, default=8)
    parser.add_argument('--textfile', choices=('present', 'absent', 'off'), default='present')
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix='tritonops-bench-cost-')
    textfiles = textfile_dir(workdir, args.textfile)
    fleet = tritonrig.Fleet(args.hosts, workdir=workdir, shm_size='16m', models=())
    runs = {play: [] for play in PLAYS}
    loadavg_before = os.getloadavg()
    try:
        fleet.start()
        inventory = os.path.join(workdir, 'inventory.yml')
        write_inventory(inventory, fleet.servers)
        paths = write_plays(workdir)
        for _run in range(args.repeat + 1):  # the first round warms caches and is not counted
            for play in PLAYS:
                if play == 'cleanup-leaks':
                    for server in fleet.servers:
                        leak(server, args.leaks)
                cpu, stats = cpu_run(paths[play], inventory, args.forks, textfiles)
                check_textfiles(textfiles, args.textfile, play, args.hosts)
                if play.startswith('cleanup'):
                    changed = sum(1 for s in fleet.servers if stats[s.name]['changed'])
                    want = len(fleet.servers) if play == 'cleanup-leaks' else 0
                    left = [s.name for s in fleet.servers if s.system_regions()]
                    if changed != want or left:
                        raise SystemExit(f'{play}: changed {changed} hosts (expected {want}), regions left on {left}')
                if _run:
                    runs[play].append(cpu / args.hosts)
    finally:
        fleet.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    per_host = {play: statistics.median(times) for play, times in runs.items()}
    ratios = {play: per_host[play] / per_host['info'] for play in PLAYS}
    print(
        f'CPU per host of the whole ansible-playbook process tree, {args.hosts} real servers as {args.hosts} hosts, '
        f'-f {args.forks}, pipelining, textfile directory {args.textfile}, median of {args.repeat}:'
    )
    print(f'  {"play":14} {"CPU/host":>8}  {"vs info":>8}  goal')
    for play in PLAYS:
        goal = GOALS.get(play)
        verdict = f'<= {goal:.1f}x: {"met" if ratios[play] <= goal else "MISSED"}' if goal else ''
        print(f'  {play:14} {per_host[play]:7.2f}s  {ratios[play]:7.2f}x  {verdict}')
    out = dict(
        benchmark='cost',
        hosts=args.hosts,
        leaks_per_host=args.leaks,
        repeat=args.repeat,
        forks=args.forks,
        pipelining=True,
        textfile=args.textfile,
        cpus=os.cpu_count(),
        python=platform.python_version(),
        loadavg_before=[round(x, 2) for x in loadavg_before],
        loadavg_after=[round(x, 2) for x in os.getloadavg()],
        cpu_per_host_s={k: round(v, 3) for k, v in per_host.items()},
        cpu_per_host_runs_s={k: [round(t, 3) for t in v] for k, v in runs.items()},
        ratio_vs_info={k: round(v, 2) for k, v in ratios.items()},
        goals=GOALS,
        goals_met={k: ratios[k] <= g for k, g in GOALS.items()},
    )
    print(f'  figures written to {write_results("cost.json", out)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
