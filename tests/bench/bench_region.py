"""Benchmark (not a test): cleaning N leaked regions with triton_shm_region, tritonclient, and uri + file.

The scene is the real failure: one real tritonclient process creates and registers N
system regions (4 KiB each) in a real tritonserver's private /dev/shm and is SIGKILLed
with its process group, so N stale regions with their files are left behind. Each
contender then cleans a fresh scene of its own:

- module:       one ansible-playbook task ``state: absent, stale: true``, run with N=0 and
                with N leaked regions in the same run; per region = (T_N - T_0) / N, so
                ansible's and the module's start-up cost is excluded;
- module process: the module as its own Python process (no Ansible controller), N=0 and N;
- module work:  the same work in this process (RegionOps: plan with the /proc pass,
                unregister loop, re-check and unlink), with its parts timed;
- tritonclient: NVIDIA tritonclient.http in one Python process, per region
                ``unregister_system_shared_memory(name)`` + ``os.unlink(path)`` (no safety check);
- uri loop:     an Ansible playbook looping ``ansible.builtin.uri`` (POST .../unregister) and
                ``ansible.builtin.file`` (state: absent) over M regions, with M=0 and M=10;
                per region = (T_M - T_0) / M.

Goals (issue 4): module >= 100x faster per region than the uri loop; module per region
<= 1.5x tritonclient per region. Every figure is taken --repeat times, interleaved; the
goals are judged on the best run of each (a shared, loaded host only ever adds time),
and medians are printed beside them. Prints the figures and writes
bench-results/bench_region.json.
Usage: python tests/bench/bench_region.py [--count 1000] [--uri-count 10] [--repeat 5] [--uri-repeat 3]
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
from typing import NamedTuple

# benchenv puts the rig, the integration helpers and the collection on sys.path
import benchenv  # noqa: F401  pylint: disable=unused-import
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from ansible_helpers import ansible_playbook  # noqa: E402  pylint: disable=wrong-import-position
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

try:
    from ansible_collections.tritonops.shm.plugins.module_utils.run import region_ops
    from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient  # noqa: E402
except ImportError as exc:
    sys.exit('run from the collection copy (make bench, or build/ansible_collections/tritonops/shm): %s' % exc)

MODULE = 'tritonops.shm.triton_shm_region'
MODULE_PY = 'ansible_collections.tritonops.shm.plugins.modules.triton_shm_region'


def leak_many(server, prefix, count, byte_size):
    """COUNT stale regions from one real tritonclient (the rig's leak_many), checked registered."""
    if count == 0:
        return []
    names = server.leak_many(prefix, count, byte_size=byte_size)
    missing = set(names) - set(server.system_regions())
    if missing:
        raise RuntimeError('%d leaked regions are not registered' % len(missing))
    return names


# one client holds two descriptors per region: at most this many regions per client
LEAK_CHUNK = 4000


def leak_chunked(server, prefix: str, count: int, byte_size: int = 4096) -> list[str]:
    """COUNT stale regions from as many clients as the descriptor limit needs (PREFIX_PART_i), checked registered."""
    names = []
    for part, first in enumerate(range(0, count, LEAK_CHUNK)):
        names += leak_many(server, f'{prefix}_{part}', min(LEAK_CHUNK, count - first), byte_size)
    return names


def check_clean(server, names, who):
    left = set(names) & set(server.system_regions())
    files = set(names) & set(server.shm_files())
    if left or files:
        raise RuntimeError('%s left %d regions and %d files behind' % (who, len(left), len(files)))


def play(tasks):
    plays = [{'name': 'bench', 'hosts': 'localhost', 'connection': 'local', 'gather_facts': False, 'tasks': tasks}]
    started = time.perf_counter()
    res = ansible_playbook(plays)
    elapsed = time.perf_counter() - started
    if res.rc != 0:
        raise RuntimeError('playbook failed: %r\n%s' % (res, res.stdout[-3000:]))
    return elapsed, res


def module_run(server, names):
    elapsed, res = play([{'name': 'clean', MODULE: dict(url=server.url, state='absent', stale=True)}])
    result = res.task('clean')
    if sorted(result['unregistered']) != sorted(names) or len(result['removed_files']) != len(names):
        raise RuntimeError(
            'module did not clean exactly the leaked regions: %d unregistered, %d removed, expected %d'
            % (len(result['unregistered']), len(result['removed_files']), len(names))
        )
    check_clean(server, names, 'module')
    return elapsed


class ModuleRun(NamedTuple):
    """One module process: wall seconds, peak RSS (MiB) and CPU seconds (user + sys) of that process alone."""

    wall: float
    rss_mib: float
    cpu: float


def module_process(
    server: tritonrig.TritonServer, names: list[str], workdir: str, url: str | None = None, root: str | None = None
) -> ModuleRun:
    """The module as a plain Python process on url (root: the collections root to import it from; default this one)."""
    url = url or server.url
    args_path = os.path.join(workdir, 'args.json')
    with open(args_path, 'w') as f:
        json.dump({'ANSIBLE_MODULE_ARGS': {'url': url, 'state': 'absent', 'stale': True}}, f)
    roots = [root] if root else [p for p in sys.path if os.path.isdir(os.path.join(p, 'ansible_collections'))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(roots))
    out_path = os.path.join(workdir, 'out.json')
    with open(out_path, 'w') as out:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, '-m', MODULE_PY, args_path], stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=workdir
        )
        _pid, _status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
    proc.returncode = 0  # reaped by wait4
    with open(out_path) as f:
        text = f.read()
    result = json.loads(text[text.index('{') :])
    if result.get('failed') or sorted(result['unregistered']) != sorted(names):
        raise RuntimeError(f'module process on {url} did not clean exactly the leaked regions: {text[:2000]}')
    check_clean(server, names, 'module process')
    return ModuleRun(elapsed, usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime)


def module_work(server, names, client=None):
    """RegionOps in this process, with its parts timed through a wrapping client (default: HTTP to server.url)."""
    client = client or TritonClient(server.url)
    client.use_keep_alive()  # as the module does
    spent = dict(unregister=0.0)
    real_unregister = client.unregister

    def timed_unregister(kind, name):
        started = time.perf_counter()
        try:
            return real_unregister(kind, name)
        finally:
            spent['unregister'] += time.perf_counter() - started

    client.unregister = timed_unregister
    params = dict(
        state='absent',
        kind='system',
        name=[],
        stale=True,
        all=False,
        orphan_files=False,
        orphan_patterns=[],
        min_age=300,
        exclude=[],
        remove_file=True,
        in_use_timeout=10,
        server_pid=None,
        shm_dir=None,
    )
    ops = region_ops.RegionOps(client, params)
    marks = {}
    real_remove = ops._remove_files  # pylint: disable=protected-access

    def timed_remove(*a):
        marks['remove_start'] = time.perf_counter()
        try:
            return real_remove(*a)
        finally:
            marks['remove_end'] = time.perf_counter()

    ops._remove_files = timed_remove  # pylint: disable=protected-access
    real_read = ops.read

    def timed_read(*a, **kw):
        started = time.perf_counter()
        snap = real_read(*a, **kw)
        marks['plan_inventory'] = time.perf_counter() - started
        return snap

    ops.read = timed_read
    started = time.perf_counter()
    ops.absent()
    ops.result()
    total = time.perf_counter() - started
    if sorted(ops.unregistered) != sorted(names) or len(ops.removed_files) != len(names):
        raise RuntimeError('RegionOps did not clean exactly the leaked regions')
    check_clean(server, names, 'RegionOps')
    return dict(
        total_s=total,
        inventory_s=marks['plan_inventory'],
        unregister_s=spent['unregister'],
        recheck_and_unlink_s=marks['remove_end'] - marks['remove_start'],
        requests=client.requests_made,
    )


def tritonclient_loop(server, names, grpc=False):
    """NVIDIA's tritonclient (tritonclient.grpc with grpc=True, at server.grpc_url), unregister + unlink per region."""
    if grpc:
        import tritonclient.grpc as api  # pylint: disable=import-outside-toplevel

        client = api.InferenceServerClient(server.grpc_url)
    else:
        import tritonclient.http as api  # pylint: disable=import-outside-toplevel

        client = api.InferenceServerClient(server.url.split('://', 1)[1])
    paths = [server.shm_path(n) for n in names]
    started = time.perf_counter()
    for name, path in zip(names, paths):
        client.unregister_system_shared_memory(name)
        os.unlink(path)
    elapsed = time.perf_counter() - started
    client.close()
    check_clean(server, names, 'tritonclient.%s loop' % ('grpc' if grpc else 'http'))
    return elapsed


def uri_loop(server, names):
    tasks = [
        {
            'name': 'unregister',
            'ansible.builtin.uri': {
                'url': server.url + '/v2/systemsharedmemory/region/{{ item }}/unregister',
                'method': 'POST',
                'status_code': 200,
            },
            'loop': names,
        },
        {
            'name': 'remove the file',
            'ansible.builtin.file': {'path': server.shm_dir + '/{{ item }}', 'state': 'absent'},
            'loop': names,
        },
    ]
    elapsed, _res = play(tasks)
    check_clean(server, names, 'uri loop')
    return elapsed


def median(values):
    return statistics.median(values) if values else None


def per_region(runs_n, runs_0, count, pick):
    """best: (min T_N - min T_0) / N; median: the median of the rounds' own (T_N - T_0) / N (paired, same round)."""
    if pick is min:
        return (min(runs_n) - min(runs_0)) / count
    return median([tn - t0 for tn, t0 in zip(runs_n, runs_0)]) / count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--count', type=int, default=1000, help='leaked regions per module / tritonclient run')
    parser.add_argument('--uri-count', type=int, default=10, help='leaked regions per uri + file loop')
    parser.add_argument('--region-bytes', type=int, default=4096)
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--uri-repeat', type=int, default=3, help='rounds that also time the (slow) uri loop')
    parser.add_argument(
        '--process-repeat', type=int, default=10, help='rounds of the module-process pair (N=0, N), the noisiest figure'
    )
    args = parser.parse_args(argv)

    workdir = tempfile.mkdtemp(prefix='bench-region-')
    shm_mib = max(64, 2 * args.count * max(args.region_bytes, 4096) // (1 << 20) + 32)
    server = tritonrig.TritonServer(workdir=workdir, shm_size='%dm' % shm_mib, models=())
    figures = dict(
        benchmark='region',
        count=args.count,
        uri_count=args.uri_count,
        region_bytes=args.region_bytes,
        repeat=args.repeat,
        host=dict(
            cpus=os.cpu_count(),
            kernel=platform.release(),
            python=platform.python_version(),
            loadavg_start=os.getloadavg()[0],
        ),
    )
    runs = dict(module_0=[], module_n=[], process_0=[], process_n=[], tritonclient=[], uri_0=[], uri_m=[], work=[])
    try:
        server.start()
        for rnd in range(1, args.repeat + 1):

            def leak(tag, count):
                return leak_many(server, '%s%d' % (tag, rnd), count, args.region_bytes)  # pylint: disable=cell-var-from-loop

            runs['module_0'].append(module_run(server, []))
            runs['module_n'].append(module_run(server, leak('m', args.count)))
            for sub in range(max(1, args.process_repeat // args.repeat)):
                runs['process_0'].append(module_process(server, [], workdir).wall)
                runs['process_n'].append(module_process(server, leak('p%d_' % sub, args.count), workdir).wall)
            runs['work'].append(module_work(server, leak('w', args.count)))
            runs['tritonclient'].append(tritonclient_loop(server, leak('t', args.count)))
            if rnd <= args.uri_repeat:
                runs['uri_0'].append(uri_loop(server, []))
                runs['uri_m'].append(uri_loop(server, leak('u', args.uri_count)))
    finally:
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)

    n, m = args.count, args.uri_count
    figures['runs_s'] = dict((k, [round(v, 4) for v in vals]) for k, vals in runs.items() if k != 'work')
    figures['work_runs'] = [dict((k, round(v, 4)) for k, v in w.items()) for w in runs['work']]
    for label, pick in (('best', min), ('median', median)):
        work = dict((k, pick([w[k] for w in runs['work']])) for k in runs['work'][0])
        fig = dict(
            module_task_per_region_ms=per_region(runs['module_n'], runs['module_0'], n, pick) * 1000,
            module_process_per_region_ms=per_region(runs['process_n'], runs['process_0'], n, pick) * 1000,
            module_work_per_region_ms=work['total_s'] / n * 1000,
            module_work_parts_s=dict((k, round(v, 4)) for k, v in work.items() if k.endswith('_s')),
            module_unregister_per_region_ms=work['unregister_s'] / n * 1000,
            tritonclient_per_region_ms=pick(runs['tritonclient']) / n * 1000,
            uri_per_region_ms=per_region(runs['uri_m'], runs['uri_0'], m, pick) * 1000,
        )
        mod = fig['module_task_per_region_ms']
        fig['uri_over_module_task'] = fig['uri_per_region_ms'] / mod if mod > 0 else None
        fig['uri_over_module_process'] = fig['uri_per_region_ms'] / fig['module_process_per_region_ms']
        for level in ('task', 'process', 'work'):
            fig['module_%s_over_tritonclient' % level] = (
                fig['module_%s_per_region_ms' % level] / fig['tritonclient_per_region_ms']
            )
        figures[label] = dict((k, round(v, 4) if isinstance(v, float) else v) for k, v in fig.items())
    best = figures['best']
    med = figures['median']
    figures['host']['loadavg_end'] = os.getloadavg()[0]
    figures['goals'] = {
        'uri loop per region >= 100 x module process per region (median)': med['uri_over_module_process'] >= 100,
        'module process per region <= 1.5 x tritonclient per region (median)': med['module_process_over_tritonclient']
        <= 1.5,
        'module work per region <= 1.5 x tritonclient per region (best)': best['module_work_over_tritonclient'] <= 1.5,
    }

    print(
        'cleaning leaked regions (%d per run, %d B each), %d rounds (uri: %d, process pairs: %d), load average %.1f -> %.1f;'
        % (
            n,
            args.region_bytes,
            args.repeat,
            args.uri_repeat,
            len(runs['process_n']),
            figures['host']['loadavg_start'],
            figures['host']['loadavg_end'],
        )
    )
    print('  figures: best run (median; differences paired per round)')

    def row(label, key, unit='ms', fmt='%9.3f'):
        def show(value):
            return (fmt % value) if value is not None else '      n/a'

        print('  %-44s %s %s  (%s)' % (label, show(best[key]), unit, show(med[key]).strip()))

    row('module, ansible task, (T_N - T_0) / N', 'module_task_per_region_ms')
    row('module, its own process, (T_N - T_0) / N', 'module_process_per_region_ms')
    row('module work in process, per region', 'module_work_per_region_ms')
    print(
        '    parts (best): plan %.3f s, unregister loop %.3f s, re-check + unlink %.3f s'
        % (
            best['module_work_parts_s']['inventory_s'],
            best['module_work_parts_s']['unregister_s'],
            best['module_work_parts_s']['recheck_and_unlink_s'],
        )
    )
    row('tritonclient loop (unregister + unlink)', 'tritonclient_per_region_ms')
    row('uri + file loop, (T_M - T_0) / M', 'uri_per_region_ms', fmt='%9.1f')
    row('uri loop / module process', 'uri_over_module_process', unit='x', fmt='%9.1f')
    row('uri loop / module task', 'uri_over_module_task', unit='x', fmt='%9.1f')
    row('module process / tritonclient', 'module_process_over_tritonclient', unit='x', fmt='%9.2f')
    row('module work / tritonclient', 'module_work_over_tritonclient', unit='x', fmt='%9.2f')
    row('module task / tritonclient', 'module_task_over_tritonclient', unit='x', fmt='%9.2f')
    print('  (the ansible task figure is within the noise of ansible-playbook start-up on a shared host)')
    for goal, met in figures['goals'].items():
        print('  goal: %-60s %s' % (goal, 'met' if met else 'MISSED'))
    path = write_results('bench_region.json', figures)
    print('  figures written to %s' % path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
