"""Benchmark (not a test): CPU per host of the collection's plays, next to a one-task triton_shm_info play.

Once schedules run cleanup and report every few minutes across a fleet, what each host
costs per run decides whether they can. In ONE run, on the same hosts: a fleet of H real
tritonservers (models=(), private 16 MiB /dev/shm each) on 127.0.1.1..H, each its own
inventory host (ansible_connection local, -f 8, pipelining on). Measured: CPU seconds of
the whole ansible-playbook process tree (this process's children's rusage: the
controller, its forks and every module process), divided by H, median of R runs, the
plays in alternation so they see the same load:

  ping          ansible.builtin.ping                      (Ansible's own floor per task)
  info          one tritonops.shm.triton_shm_info task    (the reference: 1x)
  report        tritonops.shm.report
  cleanup-noop  tritonops.shm.cleanup, nothing to do
  cleanup-leaks tritonops.shm.cleanup, L leaked regions per host (re-leaked before each run)

Goals (issue 14): cleanup-noop <= 1.3x info, cleanup-leaks <= 2x, report <= 1.3x.
Prints the figures, writes bench-results/cost.json.
Usage: python tests/bench/bench_cost.py [--hosts 4] [--leaks 3] [--repeat 3] [--forks 8]
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

import yaml

import benchenv  # noqa: F401  pylint: disable=unused-import

import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from bench_fleet import leak, write_inventory, BIN, COLLECTIONS_PATH  # noqa: E402  pylint: disable=wrong-import-position
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

GOALS = {'report': 1.3, 'cleanup-noop': 1.3, 'cleanup-leaks': 2.0}
PLAYS = ('ping', 'info', 'report', 'cleanup-noop', 'cleanup-leaks')


def write_plays(workdir):
    """The two reference plays, as a user would write them; the others are the collection's playbooks."""
    plays = {
        'ping': [{'name': 'ping', 'hosts': 'triton', 'gather_facts': False,
                  'tasks': [{'name': 'Ping', 'ansible.builtin.ping': None}]}],
        'info': [{'name': 'info', 'hosts': 'triton', 'gather_facts': False,
                  'tasks': [{'name': 'Query', 'tritonops.shm.triton_shm_info': {'url': '{{ triton_url }}'}}]}],
    }
    paths = {}
    for name, play in plays.items():
        paths[name] = os.path.join(workdir, name + '.yml')
        with open(paths[name], 'w') as f:
            yaml.safe_dump(play, f, sort_keys=False)
    paths['report'] = 'tritonops.shm.report'
    paths['cleanup-noop'] = paths['cleanup-leaks'] = 'tritonops.shm.cleanup'
    return paths


def cpu_run(playbook, inventory, forks):
    """Run ansible-playbook; return (CPU seconds of its whole process tree, stats per host)."""
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_PATH, ANSIBLE_PIPELINING='1',
               ANSIBLE_STDOUT_CALLBACK='ansible.posix.json', ANSIBLE_LOAD_CALLBACK_PLUGINS='1',
               ANSIBLE_LOCALHOST_WARNING='False', ANSIBLE_INVENTORY_UNPARSED_WARNING='False',
               PATH=BIN + os.pathsep + os.environ.get('PATH', ''))
    cmd = [os.path.join(BIN, 'ansible-playbook'), '-i', inventory, '-f', str(forks), playbook,
           '-e', json.dumps({'prometheus_textfile_dir': ''})]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit('%s failed (rc %d):\n%s\n%s' % (playbook, proc.returncode, proc.stdout[-3000:], proc.stderr[-2000:]))
    return cpu, json.loads(proc.stdout[proc.stdout.index('{'):])['stats']


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--hosts', type=int, default=4)
    parser.add_argument('--leaks', type=int, default=3)
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--forks', type=int, default=8)
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix='tritonops-bench-cost-')
    fleet = tritonrig.Fleet(args.hosts, workdir=workdir, shm_size='16m', models=())
    runs = dict((play, []) for play in PLAYS)
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
                cpu, stats = cpu_run(paths[play], inventory, args.forks)
                if play.startswith('cleanup'):
                    changed = sum(1 for s in fleet.servers if stats[s.name]['changed'])
                    want = len(fleet.servers) if play == 'cleanup-leaks' else 0
                    left = [s.name for s in fleet.servers if s.system_regions()]
                    if changed != want or left:
                        raise SystemExit('%s: changed %d hosts (expected %d), regions left on %s' % (play, changed, want, left))
                if _run:
                    runs[play].append(cpu / args.hosts)
    finally:
        fleet.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    per_host = dict((play, statistics.median(times)) for play, times in runs.items())
    ratios = dict((play, per_host[play] / per_host['info']) for play in PLAYS)
    print('CPU per host of the whole ansible-playbook process tree, %d real servers as %d hosts, -f %d, pipelining, median of %d:'
          % (args.hosts, args.hosts, args.forks, args.repeat))
    print('  %-14s %8s  %8s  %s' % ('play', 'CPU/host', 'vs info', 'goal'))
    for play in PLAYS:
        goal = GOALS.get(play)
        verdict = ('<= %.1fx: %s' % (goal, 'met' if ratios[play] <= goal else 'MISSED')) if goal else ''
        print('  %-14s %7.2fs  %7.2fx  %s' % (play, per_host[play], ratios[play], verdict))
    out = dict(benchmark='cost', hosts=args.hosts, leaks_per_host=args.leaks, repeat=args.repeat, forks=args.forks,
               pipelining=True, cpus=os.cpu_count(), python=platform.python_version(),
               loadavg_before=[round(x, 2) for x in loadavg_before], loadavg_after=[round(x, 2) for x in os.getloadavg()],
               cpu_per_host_s=dict((k, round(v, 3)) for k, v in per_host.items()),
               cpu_per_host_runs_s=dict((k, [round(t, 3) for t in v]) for k, v in runs.items()),
               ratio_vs_info=dict((k, round(v, 2)) for k, v in ratios.items()),
               goals=GOALS, goals_met=dict((k, ratios[k] <= g) for k, g in GOALS.items()))
    print('  figures written to %s' % write_results('cost.json', out))
    return 0


if __name__ == '__main__':
    sys.exit(main())
