"""Benchmark (not a test): cleaning N leaked regions over gRPC, next to the HTTP path and tritonclient.grpc.

One real tritonserver serving HTTP and gRPC; before each contender one real tritonclient
process registers N system regions (4 KiB each) and is SIGKILLed with its process group,
so N stale regions with their files are left behind. Contenders, in the same run:

- module process, grpc:// and http://: triton_shm_region ``state: absent, stale: true`` as its
  own Python process (as AnsiballZ runs it), with N=0 and N; per region = (T_N - T_0) / N;
- module work, grpc and http: the same work in this process (RegionOps: plan with the /proc
  pass, unregister loop over one channel / one kept-alive connection, re-check and unlink);
- tritonclient.grpc loop: NVIDIA tritonclient.grpc in one process, per region
  ``unregister_system_shared_memory(name)`` + ``os.unlink(path)`` (no safety check);
- tritonclient.http loop: the same over HTTP, for reference.

Every figure is taken --repeat times (module process pairs --process-pairs times per round),
interleaved; best and median are printed. Writes
bench-results/bench_grpc.json.
Usage: python tests/bench/bench_grpc.py [--count 1000] [--repeat 3] [--process-pairs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import benchenv  # noqa: F401  pylint: disable=unused-import
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from bench_region import leak_many, module_process, module_work, tritonclient_loop  # noqa: E402
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--count', type=int, default=1000, help='leaked regions per run')
    parser.add_argument('--region-bytes', type=int, default=4096)
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument(
        '--process-pairs',
        type=int,
        default=3,
        help='module-process pairs (N=0, N) per transport and round: the noisiest figure',
    )
    args = parser.parse_args(argv)

    workdir = tempfile.mkdtemp(prefix='bench-grpc-')
    shm_mib = max(64, 2 * args.count * max(args.region_bytes, 4096) // (1 << 20) + 32)
    server = tritonrig.TritonServer(workdir=workdir, shm_size='%dm' % shm_mib, models=(), grpc=True)
    grpc_url = None
    figures = dict(
        benchmark='grpc',
        count=args.count,
        region_bytes=args.region_bytes,
        repeat=args.repeat,
        host=dict(
            cpus=os.cpu_count(),
            kernel=platform.release(),
            python=platform.python_version(),
            loadavg_start=os.getloadavg()[0],
        ),
    )
    runs = dict(
        grpc_process_0=[],
        grpc_process_n=[],
        http_process_0=[],
        http_process_n=[],
        grpc_work=[],
        http_work=[],
        tritonclient_grpc=[],
        tritonclient_http=[],
    )
    try:
        server.start()
        grpc_url = server.grpc_scheme_url
        for rnd in range(1, args.repeat + 1):

            def leak(tag):
                return leak_many(server, '%s%d' % (tag, rnd), args.count, args.region_bytes)  # pylint: disable=cell-var-from-loop

            for pair in range(args.process_pairs):
                for transport, url in (('grpc', grpc_url), ('http', server.url)):
                    runs['%s_process_0' % transport].append(module_process(server, [], workdir, url=url).wall)
                    runs['%s_process_n' % transport].append(
                        module_process(server, leak('%sp%d_' % (transport[0], pair)), workdir, url=url).wall
                    )
            runs['grpc_work'].append(module_work(server, leak('gw'), client=TritonGrpcClient(grpc_url)))
            runs['http_work'].append(module_work(server, leak('hw')))
            runs['tritonclient_grpc'].append(tritonclient_loop(server, leak('tg'), grpc=True))
            runs['tritonclient_http'].append(tritonclient_loop(server, leak('th')))
    finally:
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)

    n = args.count
    figures['runs_s'] = dict((k, [round(v, 4) for v in vals]) for k, vals in runs.items() if not k.endswith('_work'))
    figures['work_runs'] = dict(
        (t, [dict((k, round(v, 4)) for k, v in w.items()) for w in runs['%s_work' % t]]) for t in ('grpc', 'http')
    )
    for label, pick in (('best', min), ('median', statistics.median)):
        fig = {}
        for t in ('grpc', 'http'):
            pairs = [tn - t0 for tn, t0 in zip(runs['%s_process_n' % t], runs['%s_process_0' % t])]
            fig['%s_module_process_per_region_ms' % t] = (
                (
                    (min(runs['%s_process_n' % t]) - min(runs['%s_process_0' % t]))
                    if pick is min
                    else statistics.median(pairs)
                )
                / n
                * 1000
            )
            fig['%s_module_work_per_region_ms' % t] = pick([w['total_s'] for w in runs['%s_work' % t]]) / n * 1000
            fig['%s_module_unregister_per_region_ms' % t] = (
                pick([w['unregister_s'] for w in runs['%s_work' % t]]) / n * 1000
            )
            fig['tritonclient_%s_per_region_ms' % t] = pick(runs['tritonclient_%s' % t]) / n * 1000
        for level in ('process', 'work'):
            fig['grpc_%s_over_tritonclient_grpc' % level] = (
                fig['grpc_module_%s_per_region_ms' % level] / fig['tritonclient_grpc_per_region_ms']
            )
            fig['grpc_%s_over_http_%s' % (level, level)] = (
                fig['grpc_module_%s_per_region_ms' % level] / fig['http_module_%s_per_region_ms' % level]
            )
        figures[label] = dict((k, round(v, 4)) for k, v in fig.items())
    figures['host']['loadavg_end'] = os.getloadavg()[0]
    best, med = figures['best'], figures['median']

    print(
        'cleaning %d leaked regions (%d B each) per run over gRPC and HTTP, %d rounds, load average %.1f -> %.1f;'
        % (n, args.region_bytes, args.repeat, figures['host']['loadavg_start'], figures['host']['loadavg_end'])
    )
    print('  per region: best run (median)')

    def row(label, key, unit='ms', fmt='%8.3f'):
        print('  %-52s %s %s  (%s)' % (label, fmt % best[key], unit, (fmt % med[key]).strip()))

    row('module process, grpc://, (T_N - T_0) / N', 'grpc_module_process_per_region_ms')
    row('module process, http://, (T_N - T_0) / N', 'http_module_process_per_region_ms')
    row('module work in process, grpc', 'grpc_module_work_per_region_ms')
    row('module work in process, http', 'http_module_work_per_region_ms')
    row('  of which the unregister loop, grpc', 'grpc_module_unregister_per_region_ms')
    row('  of which the unregister loop, http', 'http_module_unregister_per_region_ms')
    row('tritonclient.grpc loop (unregister + unlink)', 'tritonclient_grpc_per_region_ms')
    row('tritonclient.http loop (unregister + unlink)', 'tritonclient_http_per_region_ms')
    row('module process grpc / tritonclient.grpc', 'grpc_process_over_tritonclient_grpc', unit='x', fmt='%8.2f')
    row('module work grpc / tritonclient.grpc', 'grpc_work_over_tritonclient_grpc', unit='x', fmt='%8.2f')
    row('module process grpc / module process http', 'grpc_process_over_http_process', unit='x', fmt='%8.2f')
    row('module work grpc / module work http', 'grpc_work_over_http_work', unit='x', fmt='%8.2f')
    path = write_results('bench_grpc.json', figures)
    print('  figures written to %s' % path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
