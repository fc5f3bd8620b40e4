"""Benchmark (not a test): triton_shm_info on a busy host, next to a bare ``grep -l /dev/shm /proc/*/maps``.

Builds the issue's host: a real tritonserver with N registered system regions (files
created in its private /dev/shm and registered over HTTP, as a client would; no client
holds them, so every one needs the full classification) and M extra processes
(``sleep``, started here and killed after, by pid). Then times, median of R runs each:

- grep:     ``grep -l /dev/shm /proc/*/maps`` over the same processes (the bare floor);
- work:     the module's work in this process (health, metadata, region status, /proc
            pass, classification) - what the goal of <= 2x grep is about. grep and work
            run in alternation, so both see the same load; the ratio is the median of
            the per-pair ratios (and min/min, the least noisy estimate on a busy host);
- process:  the module as its own Python process (interpreter start and imports included);
- ansible:  one ansible-playbook task (adds the controller's fixed overhead), unless --no-ansible.

Prints the figures and writes them as JSON to bench-results/info.json.
Usage: python tests/bench/bench_info.py [--processes 2000] [--regions 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# benchenv puts the rig, the integration helpers and the collection on sys.path
import benchenv  # noqa: F401  pylint: disable=unused-import
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

try:
    from ansible_collections.tritonops.shm.plugins.module_utils.host import holders, snapshot
    from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, results
    from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient  # noqa: E402
except ImportError as exc:
    sys.exit('run from the collection copy (make bench, or build/ansible_collections/tritonops/shm): %s' % exc)

MODULE = 'ansible_collections.tritonops.shm.plugins.modules.triton_shm_info'


def timed(func):
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def median_time(func, repeat):
    times = []
    for _run in range(repeat):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def register_regions(server, count, size):
    for i in range(count):
        name = 'bench_%04d' % i
        with open(server.shm_path(name), 'wb') as f:
            f.write(b'\1' * size)
        server.api(
            '/v2/systemsharedmemory/region/%s/register' % name, 'POST', dict(key='/' + name, offset=0, byte_size=size)
        )


def start_sleepers(count):
    procs = []
    try:
        for _i in range(count):
            procs.append(
                subprocess.Popen(
                    ['sleep', '3600'], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
    except BaseException:
        stop_sleepers(procs)
        raise
    return procs


def stop_sleepers(procs):
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def grep_pass():
    # the shell expands /proc/*/maps; grep's status is 1 for processes that vanish or match nothing
    subprocess.run(
        ['sh', '-c', 'grep -l /dev/shm /proc/*/maps'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )


def module_work(url):
    # what triton_shm_info's run() does, with the same client setup
    client = TritonClient(url)
    client.use_keep_alive()
    client.health('live')
    client.health('ready')
    snap = snapshot.read_server(client)
    return snap, results.info_result(snap, classification.classify(snap))


def scan_only(inv):
    targets = set((e['dev'], e['inode']) for e in inv.entries if e['type'] == 'file')
    return holders.scan(targets)


def module_process(args_path, env):
    proc = subprocess.run(
        [sys.executable, '-m', MODULE, args_path], capture_output=True, text=True, env=env, check=False
    )
    result = json.loads(proc.stdout[proc.stdout.index('{') :])
    if result.get('failed'):
        raise RuntimeError('module failed: %s' % result['msg'])
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--processes', type=int, default=2000, help='extra processes (sleep)')
    parser.add_argument('--regions', type=int, default=1000, help='registered system regions')
    parser.add_argument('--region-bytes', type=int, default=4096)
    parser.add_argument('--repeat', type=int, default=9)
    parser.add_argument('--no-ansible', action='store_true', help='skip the ansible-playbook figure')
    args = parser.parse_args(argv)

    workdir = tempfile.mkdtemp(prefix='bench-info-')
    server = tritonrig.TritonServer(
        workdir=workdir, shm_size='%dm' % max(64, 2 * args.regions * args.region_bytes // (1 << 20) + 16), models=()
    )
    sleepers = []
    figures = dict(
        benchmark='info',
        processes_extra=args.processes,
        regions=args.regions,
        region_bytes=args.region_bytes,
        repeat=args.repeat,
        host=dict(cpus=os.cpu_count(), kernel=platform.release(), python=platform.python_version()),
    )
    try:
        t0 = time.perf_counter()
        server.start()
        register_regions(server, args.regions, args.region_bytes)
        sleepers = start_sleepers(args.processes)
        figures['setup_s'] = round(time.perf_counter() - t0, 2)
        figures['proc_entries'] = sum(1 for n in os.listdir('/proc') if n.isdigit())

        inv, result = module_work(server.url)  # warm-up, and a check that the scene is what we think
        summary = result['summary']
        if summary['system_regions'] != args.regions or summary['stale_regions'] != args.regions:
            raise RuntimeError('unexpected scene: %s' % summary)
        figures['scanned_processes'] = inv.scan.processes
        figures['unreadable_processes'] = result['unreadable_processes']

        grep_pass()
        figures['loadavg_before'] = [round(x, 2) for x in os.getloadavg()]
        pairs = [(timed(grep_pass), timed(lambda: module_work(server.url))) for _run in range(args.repeat)]
        figures['grep_runs_s'] = [g for g, _w in pairs]
        figures['work_runs_s'] = [w for _g, w in pairs]
        figures['grep_s'] = statistics.median(figures['grep_runs_s'])
        figures['work_s'] = statistics.median(figures['work_runs_s'])
        figures['grep_min_s'] = min(figures['grep_runs_s'])
        figures['work_min_s'] = min(figures['work_runs_s'])
        figures['work_over_grep'] = round(statistics.median(w / g for g, w in pairs), 2)
        figures['work_over_grep_min'] = round(figures['work_min_s'] / figures['grep_min_s'], 2)
        figures['scan_s'] = median_time(lambda: scan_only(inv), args.repeat)[0]

        args_path = os.path.join(workdir, 'args.json')
        with open(args_path, 'w') as f:
            json.dump(dict(ANSIBLE_MODULE_ARGS=dict(url=server.url)), f)
        roots = [p for p in sys.path if os.path.isdir(os.path.join(p, 'ansible_collections'))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(roots))
        module_process(args_path, env)
        figures['process_s'], figures['process_runs_s'] = median_time(
            lambda: module_process(args_path, env), args.repeat
        )

        if not args.no_ansible:
            import ansible_helpers  # pylint: disable=import-outside-toplevel

            runs = max(1, min(3, args.repeat))
            figures['ansible_s'], figures['ansible_runs_s'] = median_time(
                lambda: ansible_helpers.run_module('tritonops.shm.triton_shm_info', dict(url=server.url)), runs
            )
    finally:
        stop_sleepers(sleepers)
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)

    for key in [k for k in figures if k.endswith('_s') and not k.endswith('_runs_s')]:
        figures[key] = round(figures[key], 4)
    for key in [k for k in figures if k.endswith('_runs_s')]:
        figures[key] = [round(t, 4) for t in figures[key]]
    figures['loadavg_after'] = [round(x, 2) for x in os.getloadavg()]
    figures['process_over_grep'] = round(figures['process_s'] / figures['grep_s'], 2)
    figures['goal'] = 'work <= 2 x grep (median of per-pair ratios)'
    figures['goal_met'] = figures['work_over_grep'] <= 2.0

    print(
        'triton_shm_info on %d /proc entries (%d extra processes), %d registered regions, median of %d:'
        % (figures['proc_entries'], args.processes, args.regions, args.repeat)
    )
    print('  grep -l /dev/shm /proc/*/maps   %8.3f s   (min %.3f)' % (figures['grep_s'], figures['grep_min_s']))
    print(
        '  module work (in process)        %8.3f s   (min %.3f)   %.2fx grep (min/min %.2fx); its /proc pass %.3f s'
        % (
            figures['work_s'],
            figures['work_min_s'],
            figures['work_over_grep'],
            figures['work_over_grep_min'],
            figures['scan_s'],
        )
    )
    print(
        '  module as a process             %8.3f s   %.2fx grep' % (figures['process_s'], figures['process_over_grep'])
    )
    if 'ansible_s' in figures:
        print('  ansible-playbook task           %8.3f s' % figures['ansible_s'])
    print(
        '  goal (work <= 2x grep): %s   load average before/after: %s / %s'
        % ('met' if figures['goal_met'] else 'MISSED', figures['loadavg_before'], figures['loadavg_after'])
    )
    path = write_results('info.json', figures)
    print('  figures written to %s' % path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
