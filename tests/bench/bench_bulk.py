"""Benchmark (not a test): triton_shm_region bulk cleanup against NVIDIA's own client loops, and its scale (issue 22).

One real tritonserver serving HTTP and gRPC. Before each contender one real tritonclient process
registers N stale regions of 4 KiB and is SIGKILLed with its process group (the rig's leak_many).
Every round runs, in this order (the contenders alternate, so load drifts hit all of them):

- the module as its own process (as AnsiballZ runs it), ``state: absent, stale: true``, over
  http:// with N = 0 and N = --count; then ``tritonclient.http``'s loop (unregister + unlink per region);
- the same over grpc:// and ``tritonclient.grpc``'s loop;
- the module over http:// with N = --small and N = --large (scale), with its peak RSS (wait4's ru_maxrss
  of that one process).

Per region: module (T_N - T_0) / N (T_0: the best of 3 runs with nothing to clean), tritonclient loop
T_N / N. The ratios are the medians of the rounds' own ratios; a round whose small-N difference is not
positive (start-up noise) gives no scale ratio. Goals (issue 22): bulk HTTP at --count <= 1.0x tritonclient.http; bulk gRPC
<= 1.0x tritonclient.grpc; per region at --large within 1.2x of --small; peak RSS at --large <= 100 MiB.
Usage: python tests/bench/bench_bulk.py [--count 3000] [--small 1000] [--large 10000] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import benchenv  # noqa: F401  pylint: disable=unused-import
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from bench_region import leak_chunked, module_process, tritonclient_loop  # noqa: E402
from run import write_results  # noqa: E402  pylint: disable=wrong-import-position

GOALS = {'http': 1.0, 'grpc': 1.0, 'scale': 1.2, 'rss_mib': 100}


def start_up(server: tritonrig.TritonServer, workdir: str, url: str, runs: int = 3) -> float:
    """T_0: the module with nothing to clean, best of runs (start-up only ever adds time on a shared host)."""
    return min(module_process(server, [], workdir, url).wall for _run in range(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--count', type=int, default=3000, help='regions for the HTTP and gRPC comparisons')
    parser.add_argument('--small', type=int, default=1000, help='regions of the scale comparison, small end')
    parser.add_argument('--large', type=int, default=10000, help='regions of the scale comparison and the RSS figure')
    parser.add_argument('--repeat', type=int, default=3, help='rounds')
    parser.add_argument('--quick', action='store_true', help='a quick check: 300 / 100 / 1,000 regions, 1 round')
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.small, args.large, args.repeat = 300, 100, 1000, 1
    workdir = tempfile.mkdtemp(prefix='bench-bulk-')
    shm_mib = 2 * max(args.count, args.large) * 4096 // (1 << 20) + 64
    server = tritonrig.TritonServer(workdir=workdir, shm_size=f'{shm_mib}m', models=(), grpc=True)
    loadavg = os.getloadavg()
    rounds = []
    try:
        server.start()
        for rnd in range(1, args.repeat + 1):

            def leak(tag: str, count: int) -> list[str]:
                return leak_chunked(server, f'{tag}{rnd}', count)  # pylint: disable=cell-var-from-loop

            fig = {}
            for transport, url in (('http', server.url), ('grpc', server.grpc_scheme_url)):
                t0 = start_up(server, workdir, url)
                tn, _rss, _cpu = module_process(server, leak(transport[0] + 'm', args.count), workdir, url)
                loop = tritonclient_loop(server, leak(transport[0] + 't', args.count), grpc=transport == 'grpc')
                fig[f'{transport}_module_ms'] = (tn - t0) / args.count * 1000
                fig[f'{transport}_tritonclient_ms'] = loop / args.count * 1000
                fig[f'{transport}_ratio'] = fig[f'{transport}_module_ms'] / fig[f'{transport}_tritonclient_ms']
            t0 = start_up(server, workdir, server.url)
            small, _rss, _cpu = module_process(server, leak('s', args.small), workdir, server.url)
            large, rss, _cpu = module_process(server, leak('l', args.large), workdir, server.url)
            fig['small_ms'] = (small - t0) / args.small * 1000
            fig['large_ms'] = (large - t0) / args.large * 1000
            # T_small - T_0 is small next to the start-up's spread: a non-positive difference is noise, not a figure
            fig['scale_ratio'] = fig['large_ms'] / fig['small_ms'] if fig['small_ms'] > 0 else float('nan')
            fig['large_rss_mib'] = rss
            rounds.append({k: round(v, 4) for k, v in fig.items()})
            print(
                f'  round {rnd}: http {fig["http_module_ms"]:.3f} vs {fig["http_tritonclient_ms"]:.3f} ms '
                f'({fig["http_ratio"]:.2f}x), grpc {fig["grpc_module_ms"]:.3f} vs {fig["grpc_tritonclient_ms"]:.3f} ms '
                f'({fig["grpc_ratio"]:.2f}x), {args.large} vs {args.small}: {fig["large_ms"]:.3f} vs {fig["small_ms"]:.3f} ms '
                f'({fig["scale_ratio"]:.2f}x), peak RSS {rss:.1f} MiB',
                flush=True,
            )
    finally:
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    med = {
        k: round(statistics.median(r[k] for r in rounds if not math.isnan(r[k])), 4)
        if any(not math.isnan(r[k]) for r in rounds)
        else float('nan')
        for k in rounds[0]
    }
    med['large_rss_mib'] = max(r['large_rss_mib'] for r in rounds)
    goals = {
        f'bulk HTTP at {args.count} regions: module / tritonclient.http loop <= {GOALS["http"]:.1f}x': (
            med['http_ratio'],
            GOALS['http'],
        ),
        f'bulk gRPC at {args.count} regions: module / tritonclient.grpc loop <= {GOALS["grpc"]:.1f}x': (
            med['grpc_ratio'],
            GOALS['grpc'],
        ),
        f'per region at {args.large} / at {args.small} regions <= {GOALS["scale"]:.1f}x': (
            med['scale_ratio'],
            GOALS['scale'],
        ),
        f'module peak RSS at {args.large} regions <= {GOALS["rss_mib"]} MiB': (med['large_rss_mib'], GOALS['rss_mib']),
    }
    figures = dict(
        benchmark='bulk',
        count=args.count,
        small=args.small,
        large=args.large,
        repeat=args.repeat,
        rounds=rounds,
        median=med,
        goals={k: {'value': v, 'goal': g, 'met': v <= g} for k, (v, g) in goals.items()},  # nan: never met
        issue22=[
            {
                'goal': k,
                'value': 'n/a (noise)' if math.isnan(v) else f'{v:.1f} MiB' if 'RSS' in k else f'{v:.2f}x',
                'met': v <= g,
            }
            for k, (v, g) in goals.items()
        ],
        host=dict(
            cpus=os.cpu_count(),
            kernel=platform.release(),
            python=platform.python_version(),
            loadavg_start=loadavg,
            loadavg_end=os.getloadavg(),
        ),
    )
    print(
        f'bulk cleanup, {args.repeat} rounds (medians of the rounds), load average {loadavg[0]:.1f} -> {os.getloadavg()[0]:.1f}:'
    )
    for goal, (value, limit) in goals.items():
        print(f'  goal: {goal:72} {value:7.2f}  {"PASS" if value <= limit else "MISS"}')
    print(f'  figures written to {write_results("bench_bulk.json", figures)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
