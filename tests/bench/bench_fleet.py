"""Benchmark (not a test): the report and cleanup playbooks on 16 hosts vs 1 host, in the same run.

A fleet of N real tritonservers (models=() to keep them light, private 16 MiB /dev/shm
each) on 127.0.1.1..N, each its own inventory host (ansible_connection local). Every
host gets L leaked regions: a file written in its /dev/shm and registered over HTTP, with
no client holding it (what a SIGKILLed client leaves), so cleanup has real work.

Timed with wall clock, median of R runs each (leaks re-created before every cleanup):
  report x 1 host, report x N hosts, cleanup x 1 host, cleanup x N hosts.
Strategy: linear (the default), forks = N (-f N), pipelining on. Information only: the
former goal (N hosts within 2x one host's time) is retired, on 2 cores it measures the CPU,
not the design; the cost goals are CPU per host (bench_cost.py). Also measured: CPU seconds of ansible-playbook and every module
process it ran; CPU / cores is the floor no strategy or fork count can beat on this machine.
Prints the figures, writes bench-results/bench_fleet.json.
Usage: python tests/bench/bench_fleet.py [--hosts 16] [--leaks 3] [--repeat 2]
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
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(COLLECTION, 'tests', 'rig'))
sys.path.insert(0, HERE)

import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

BIN = os.path.dirname(os.path.abspath(sys.executable))
COLLECTIONS_PATH = os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION)))


def leak(server, count, size=1 << 20):
    for i in range(count):
        name = 'bench_leak_%d' % i
        with open(server.shm_path(name), 'wb') as f:
            f.write(b'\1' * size)
        server.api(
            '/v2/systemsharedmemory/region/%s/register' % name, 'POST', dict(key='/' + name, offset=0, byte_size=size)
        )


def write_inventory(path, servers):
    hosts = dict(
        (s.name, dict(ansible_connection='local', ansible_python_interpreter=sys.executable, triton_url=s.url))
        for s in servers
    )
    with open(path, 'w') as f:
        yaml.safe_dump({'all': {'children': {'triton': {'hosts': hosts}}}}, f)


def run(playbook, inventory, forks):
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_PATH,
        ANSIBLE_PIPELINING='1',
        ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
        ANSIBLE_LOAD_CALLBACK_PLUGINS='1',
        ANSIBLE_LOCALHOST_WARNING='False',
        PATH=BIN + os.pathsep + os.environ.get('PATH', ''),
    )
    cmd = [
        os.path.join(BIN, 'ansible-playbook'),
        '-i',
        inventory,
        '-f',
        str(forks),
        'tritonops.shm.' + playbook,
        '-e',
        json.dumps({'prometheus_textfile_dir': ''}),
    ]
    started = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(
            '%s failed (rc %d):\n%s\n%s' % (playbook, proc.returncode, proc.stdout[-3000:], proc.stderr[-2000:])
        )
    stats = json.loads(proc.stdout[proc.stdout.index('{') :])['stats']
    return took, cpu, stats


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--hosts', type=int, default=16)
    parser.add_argument('--leaks', type=int, default=3)
    parser.add_argument('--repeat', type=int, default=2)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix='tritonops-bench-fleet-')
    fleet = tritonrig.Fleet(args.hosts, workdir=workdir, shm_size='16m', models=())
    figures = {}
    loadavg_before = os.getloadavg()
    try:
        started = time.perf_counter()
        fleet.start()
        print('started %d tritonservers in %.1fs' % (args.hosts, time.perf_counter() - started), flush=True)
        one = os.path.join(workdir, 'one.yml')
        many = os.path.join(workdir, 'many.yml')
        write_inventory(one, fleet.servers[:1])
        write_inventory(many, fleet.servers)
        for playbook in ('report', 'cleanup'):
            for label, inventory, servers in (('1', one, fleet.servers[:1]), (str(args.hosts), many, fleet.servers)):
                times = []
                cpus = []
                for _run in range(args.repeat):
                    for server in servers:
                        if not server.system_regions():  # cleanup removed them: leak again
                            leak(server, args.leaks)
                    took, cpu, stats = run(playbook, inventory, forks=args.hosts)
                    times.append(took)
                    cpus.append(cpu)
                    if playbook == 'cleanup':
                        left = [s.name for s in servers if s.system_regions()]
                        if left:
                            raise SystemExit('cleanup left regions on %s' % left)
                        changed = sum(1 for s in servers if stats[s.name]['changed'])
                        if changed != len(servers):
                            raise SystemExit('cleanup changed %d of %d hosts' % (changed, len(servers)))
                figures['%s_%s_hosts_s' % (playbook, label)] = round(statistics.median(times), 2)
                figures['%s_%s_hosts_runs_s' % (playbook, label)] = [round(t, 2) for t in times]
                figures['%s_%s_hosts_cpu_s' % (playbook, label)] = round(statistics.median(cpus), 2)
                print(
                    '%-8s %3s host(s): %6.2fs wall, %6.2fs CPU (ansible and modules; median of %d: %s)'
                    % (
                        playbook,
                        label,
                        statistics.median(times),
                        statistics.median(cpus),
                        len(times),
                        ', '.join('%.2f' % t for t in times),
                    ),
                    flush=True,
                )
    finally:
        fleet.cleanup()
    for playbook in ('report', 'cleanup'):
        ratio = figures['%s_%d_hosts_s' % (playbook, args.hosts)] / figures['%s_1_hosts_s' % playbook]
        figures['%s_ratio' % playbook] = round(ratio, 2)
        floor = figures['%s_%d_hosts_cpu_s' % (playbook, args.hosts)] / (os.cpu_count() or 1)
        figures['%s_cpu_floor_s' % playbook] = round(floor, 2)
        print(
            '%-8s %d hosts / 1 host = %.2fx (information; the wall-time goal is retired: on 2 cores it measures the '
            'CPU, not the design; see bench_cost.py); CPU-bound floor on %d CPU(s): %.2fs'
            % (playbook, args.hosts, ratio, os.cpu_count() or 1, floor)
        )
    out = dict(
        benchmark='fleet',
        hosts=args.hosts,
        leaks_per_host=args.leaks,
        repeat=args.repeat,
        strategy='linear',
        forks=args.hosts,
        pipelining=True,
        cpus=os.cpu_count(),
        loadavg_before=loadavg_before,
        loadavg_after=os.getloadavg(),
        python=platform.python_version(),
        figures=figures,
    )
    path = write_results('bench_fleet.json', out)
    print('wrote %s' % path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
