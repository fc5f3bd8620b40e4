"""Benchmark (not a test): the cleanup's cost at 3,000 regions against the build before the safety work (issue 26).

Goal (issue 26): ``triton_shm_region state=absent stale=true`` cleaning N stale regions costs within 1.1x of the
build before issues 25-27 (BASE_REF, the landed main those issues were filed against), in wall time and in CPU.

One real tritonserver 2.51. Before each run one real tritonclient registers N regions of 4 KiB and is SIGKILLed with
its process group (the rig's leak_many). The module runs as its own process (as AnsiballZ runs it, no controller),
imported from the base tree (``git archive BASE_REF`` of this checkout) or from this copy, in pairs whose order
alternates (base new, new base, ...). Each pair gives a ratio new / base; the medians of the pairs' ratios are
printed next to the goal. A checkout without git history cannot build the base: the bench says so and exits 2.
Usage: python tests/bench/bench_vs_base.py [--count 3000] [--pairs 16] [--base REF]
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
from bench_region import MODULE_PY, leak_chunked, module_process  # noqa: E402  pylint: disable=wrong-import-position
from run import checkout, write_results  # noqa: E402  pylint: disable=wrong-import-position

BASE_REF = '20138424983d4bda22ed773789ac68f83a74f005'  # main before issues 25-27 (landed at stop 23)
GOAL = 1.1


def base_tree(ref: str, workdir: str) -> str:
    """A collections root holding tritonops.shm as it was at ref, from this checkout's history."""
    root = os.path.join(workdir, 'base')
    dest = os.path.join(root, 'ansible_collections', 'tritonops', 'shm')
    os.makedirs(dest)
    archive = subprocess.run(
        ['git', '-C', checkout(), 'archive', ref, 'plugins', 'meta', 'galaxy.yml'], capture_output=True, check=False
    )
    if archive.returncode:
        raise SystemExit(f'cannot build the base {ref} from {checkout()}: {archive.stderr.decode(errors="replace")}')
    subprocess.run(['tar', '-x', '-C', dest], input=archive.stdout, check=True)
    # the base's module must come from the base tree, not from this copy or an installed collection
    where = subprocess.run(
        [sys.executable, '-c', f'import {MODULE_PY} as m; print(m.__file__)'],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=root),
        cwd=workdir,
        check=True,
    ).stdout.strip()
    if not where.startswith(root + os.sep):
        raise SystemExit(f'the base module was imported from {where}, not from {root}')
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--count', type=int, default=3000, help='stale regions per run')
    parser.add_argument('--pairs', type=int, default=16, help='pairs of runs (base, new), order alternating')
    parser.add_argument('--base', default=BASE_REF, help='git ref of the base build')
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix='bench-vs-base-')
    try:
        base_root = base_tree(args.base, workdir)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    server = tritonrig.TritonServer(workdir=workdir, shm_size=f'{args.count * 4096 // (1 << 20) + 64}m', models=())
    loadavg = os.getloadavg()
    pairs = []
    try:
        server.start()
        for pair in range(args.pairs):
            runs = {}
            order = ('base', 'new') if pair % 2 == 0 else ('new', 'base')
            for build in order:
                names = leak_chunked(server, f'{build[0]}{pair}', args.count)
                runs[build] = module_process(
                    server, names, workdir, server.url, root=base_root if build == 'base' else None
                )
            pairs.append(
                dict(
                    order=list(order),
                    base_wall=runs['base'].wall,
                    new_wall=runs['new'].wall,
                    base_cpu=runs['base'].cpu,
                    new_cpu=runs['new'].cpu,
                    wall_ratio=runs['new'].wall / runs['base'].wall,
                    cpu_ratio=runs['new'].cpu / runs['base'].cpu,
                )
            )
            print(
                f'  pair {pair + 1} ({" then ".join(order)}): wall {runs["base"].wall:.2f} s -> {runs["new"].wall:.2f} s,'
                f' CPU {runs["base"].cpu:.2f} s -> {runs["new"].cpu:.2f} s',
                flush=True,
            )
    finally:
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    medians = {k: statistics.median(p[k] for p in pairs) for k in ('wall_ratio', 'cpu_ratio')}
    rows = [
        {
            'goal': f'cleanup of {args.count} stale regions, {what} new / base {args.base[:7]} <= {GOAL}x',
            'value': f'{medians[key]:.2f}x',
            'met': medians[key] <= GOAL,
        }
        for what, key in (('wall', 'wall_ratio'), ('CPU', 'cpu_ratio'))
    ]
    print(f'cleanup vs the base build, {args.pairs} pairs, load average {loadavg[0]:.1f} -> {os.getloadavg()[0]:.1f}:')
    for row in rows:
        print(f'  goal: {row["goal"]:72} {row["value"]:>7}  {"PASS" if row["met"] else "MISS"}')
    figures = dict(
        benchmark='vs_base',
        base=args.base,
        count=args.count,
        pairs=pairs,
        median=medians,
        issue26=rows,
        host=dict(cpus=os.cpu_count(), kernel=platform.release(), loadavg_start=loadavg, loadavg_end=os.getloadavg()),
    )
    print(f'  figures written to {write_results("bench_vs_base.json", figures)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
