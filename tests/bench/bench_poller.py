"""Benchmark (not a test): the event source tritonops.shm.triton_shm watching a fleet of N servers.

The fleet: N server entries, each on its own loopback address 127.x.y.z. Most of them reach one of
2 real tritonservers (the rig; each with a few stale regions, so the answer is a real region list);
about --bad-percent of them are fakes on their own addresses, in equal parts:

- slow:    accepts the connection and reads the request, never answers;
- dead:    nothing listens (connection refused);
- garbage: HTTP 200 with a body that is not JSON.

Everything runs in a private network namespace (``unshare --net``, only ``lo`` in it): the servers
listen on every address of that namespace, which is loopback only, and the host's own tables see
none of the 10,000 connections. The source runs in its own process, fed by a consumer of an
``asyncio.Queue(1)`` as ansible-rulebook gives it; the fakes run in another process, so the
source's process CPU time is the source's (and the consumer's) alone.

Measured, for --rounds intervals: events per server category; false ``down`` (a live server
reported down); wrong ``up`` (a fake reported up); servers not polled every interval (a gap between
two of their events, or from the start to the first, above 1.5 intervals (plus the timeout for the
first), or too few events); CPU per server poll (process CPU time
/ events) per interval and for the intervals after the first (the first also opens every
connection); RSS at the end of every interval. Goals (issue 22): 0 false down, 0 wrong up, every
server polled every interval, <= 0.25 ms CPU per poll after the first interval, RSS <= 200 MiB and not
growing (last interval vs the second: at most max(4 MiB, 3 %)).

Bounded: it stops by itself after --rounds intervals (plus the timeout), kills what it started.
Usage: python tests/bench/bench_poller.py [--servers 10000] [--interval 30] [--timeout 10] [--rounds 4]
       [--bad-percent 5] [--source PATH] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import ipaddress
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(HERE))
SOURCE = os.path.join(COLLECTION, 'extensions', 'eda', 'plugins', 'event_source', 'triton_shm.py')
NETNS_ENV = 'TRITONOPS_BENCH_POLLER_NETNS'
GOAL_CPU_MS = 0.25
GOAL_RSS_MIB = 200
CATEGORIES = ('live', 'slow', 'dead', 'garbage')
GARBAGE = b'<html><body>It works!</body></html>\n'


def rss_mib() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / (1 << 20)


# ---- the fakes (their own process) ----


async def _fakes(slow_port: int, garbage_port: int) -> None:
    held = []

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        try:
            while await reader.read(65536):  # read what comes, answer nothing, until the client closes
                pass
        finally:
            held.remove(writer)
            writer.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answer = (
            f'HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {len(GARBAGE)}\r\n\r\n'.encode() + GARBAGE
        )
        try:
            while await reader.readuntil(b'\r\n\r\n'):
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    servers = [
        await asyncio.start_server(slow, '0.0.0.0', slow_port, backlog=4096),
        await asyncio.start_server(garbage, '0.0.0.0', garbage_port, backlog=4096),
    ]
    print('READY', flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


# ---- the source under test (its own process) ----


async def _run_source(config: dict) -> dict:
    spec = importlib.util.spec_from_file_location('triton_shm_under_bench', config['source'])
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    category = config['category']
    interval, rounds = config['interval'], config['rounds']
    queue: asyncio.Queue = asyncio.Queue(1)  # what ansible-rulebook gives a source
    loop = asyncio.get_running_loop()
    seen: dict[str, list] = {}  # host -> [up, down, first, last, longest gap]
    counts = {c: {'up': 0, 'down': 0} for c in CATEGORIES}
    errors: dict[str, str] = {}
    samples = []
    events = 0

    async def consume() -> None:
        nonlocal events
        while True:
            event = await queue.get()
            now = loop.time()
            events += 1
            data = event['triton_shm']
            host = data['host']
            kind = category[host]
            counts[kind][data['status']] += 1
            if data['status'] == 'down' and kind not in errors:
                errors[kind] = data['error'][:200]
            rec = seen.get(host)
            if rec is None:
                rec = seen[host] = [0, 0, now, now, 0.0]
            rec[0 if data['status'] == 'up' else 1] += 1
            rec[4] = max(rec[4], now - rec[3])
            rec[3] = now

    cpu0 = time.process_time()
    started = loop.time()
    task = asyncio.create_task(
        source.main(queue, {'servers': config['servers'], 'interval': interval, 'timeout': config['timeout']})
    )
    consumer = asyncio.create_task(consume())
    lag = [0.0]

    async def watch_lag() -> None:  # how late the event loop runs a 0.1 s timer: CPU starvation shows here
        while True:
            before = loop.time()
            await asyncio.sleep(0.1)
            lag[0] = max(lag[0], loop.time() - before - 0.1)

    watcher = asyncio.create_task(watch_lag())
    for number in range(1, rounds + 1):
        await asyncio.sleep(max(0.0, started + number * interval - loop.time()))
        samples.append(
            {
                't': round(loop.time() - started, 3),
                'events': events,
                'cpu_s': time.process_time() - cpu0,
                'rss_mib': round(rss_mib(), 1),
                'max_loop_lag_s': round(lag[0], 3),
            }
        )
        lag[0] = 0.0
        if task.done():
            break
    if not task.done():  # the last polls' answers (or timeouts)
        await asyncio.sleep(config['timeout'] + 1.0)
    crashed = repr(task.exception()) if task.done() and not task.cancelled() and task.exception() else None
    task.cancel()
    consumer.cancel()
    watcher.cancel()
    await asyncio.gather(task, consumer, watcher, return_exceptions=True)
    # every interval: each server's events must come at most 1.5 intervals apart, from the start to the end
    missed = {c: 0 for c in CATEGORIES}
    examples: dict[str, list] = {c: [] for c in CATEGORIES}
    min_events = rounds - (1 + int(config['timeout'] // interval))
    for host, kind in category.items():
        rec = seen.get(host)
        if (
            rec is None
            or rec[0] + rec[1] < min_events
            or rec[4] > 1.5 * interval
            or rec[2] - started > 1.5 * interval + config['timeout']
        ):
            missed[kind] += 1
            if len(examples[kind]) < 3:
                examples[kind].append(
                    {
                        'host': host,
                        'events': rec[0] + rec[1],
                        'first_s': round(rec[2] - started, 2),
                        'longest_gap_s': round(rec[4], 2),
                    }
                    if rec
                    else {'host': host, 'events': 0}
                )
    return {
        'counts': counts,
        'missed': missed,
        'missed_examples': examples,
        'samples': samples,
        'errors': errors,
        'crashed': crashed,
        'events': events,
        'min_events_per_server': min_events,
    }


# ---- the driver ----


def _in_netns(argv: list[str]) -> int:
    """Run this script again in a private network namespace with only lo up."""
    env = dict(os.environ, **{NETNS_ENV: '1'})
    cmd = [
        'unshare',
        '--net',
        '--',
        'sh',
        '-c',
        'ip link set lo up && exec "$0" "$@"',
        sys.executable,
        os.path.abspath(__file__),
    ] + argv
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait()


def addresses(first: str, count: int) -> list[str]:
    base = ipaddress.IPv4Address(first)
    return [str(base + i) for i in range(count)]


def bench(args: argparse.Namespace) -> dict:
    import benchenv  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    import tritonrig  # pylint: disable=import-outside-toplevel

    bad = int(round(args.servers * args.bad_percent / 100.0))
    per_kind = bad // 3
    live_count = args.servers - 3 * per_kind
    workdir = tempfile.mkdtemp(prefix='bench-poller-')
    tritons = [
        tritonrig.TritonServer(workdir=workdir, host='0.0.0.0', shm_size='16m', models=(), name=f'triton{i}')
        for i in range(2)
    ]
    fakes = None
    slow_port, garbage_port, dead_port = (tritonrig.free_port('0.0.0.0') for _port in range(3))
    try:
        for triton in tritons:
            triton.start()
            triton.leak_many('bench', args.regions)
        fakes = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), '--fakes', str(slow_port), str(garbage_port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        if fakes.stdout.readline().strip() != 'READY':
            raise RuntimeError('the fake servers did not start')
        servers, category = [], {}
        plan = [
            ('live', live_count, '127.1.0.1'),
            ('slow', per_kind, '127.2.0.1'),
            ('dead', per_kind, '127.3.0.1'),
            ('garbage', per_kind, '127.4.0.1'),
        ]
        for kind, count, first in plan:
            for i, addr in enumerate(addresses(first, count)):
                port = {
                    'live': tritons[i % 2].http_port,
                    'slow': slow_port,
                    'dead': dead_port,
                    'garbage': garbage_port,
                }[kind]
                host = f'{kind}-{addr.replace(".", "-")}'
                servers.append({'host': host, 'url': f'http://{addr}:{port}', 'shm_bytes': 16 << 20})
                category[host] = kind
        random.Random(22).shuffle(servers)  # the bad ones among the good, as in a real inventory
        config = {
            'source': args.source,
            'servers': servers,
            'category': category,
            'interval': args.interval,
            'timeout': args.timeout,
            'rounds': args.rounds,
        }
        config_path = os.path.join(workdir, 'config.json')
        with open(config_path, 'w') as f:
            json.dump(config, f)
        print(
            f'polling {args.servers} servers ({live_count} live on 2 tritonservers with {args.regions} regions each, '
            f'{per_kind} slow, {per_kind} dead, {per_kind} garbage) every {args.interval}s, timeout {args.timeout}s, '
            f'{args.rounds} intervals, source {os.path.relpath(args.source, COLLECTION)}; '
            f'load average {os.getloadavg()[0]:.1f}',
            flush=True,
        )
        limit = args.rounds * args.interval + args.timeout + 120
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), '--runner', config_path],
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f'the source process failed (rc {proc.returncode}): {proc.stderr[-3000:]}')
        if os.environ.get('BENCH_POLLER_PROFILE'):
            print(proc.stderr)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if fakes is not None:
            fakes.kill()
            fakes.wait(timeout=10)
        for triton in tritons:
            triton.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    result.update(
        servers=args.servers,
        live=live_count,
        slow=per_kind,
        dead=per_kind,
        garbage=per_kind,
        interval=args.interval,
        timeout=args.timeout,
        rounds=args.rounds,
        regions=args.regions,
        source=os.path.relpath(args.source, COLLECTION),
    )
    return result


def figures(result: dict) -> dict:
    samples = result['samples']
    per_round = []
    previous = {'events': 0, 'cpu_s': 0.0}
    for sample in samples:
        polls = sample['events'] - previous['events']
        per_round.append(
            {
                'polls': polls,
                'cpu_ms_per_poll': round((sample['cpu_s'] - previous['cpu_s']) * 1000 / polls, 4) if polls else None,
                'rss_mib': sample['rss_mib'],
                'max_loop_lag_s': sample['max_loop_lag_s'],
            }
        )
        previous = sample
    steady_polls = samples[-1]['events'] - samples[0]['events'] if len(samples) > 1 else 0
    steady_cpu = (samples[-1]['cpu_s'] - samples[0]['cpu_s']) * 1000 / steady_polls if steady_polls else None
    rss = [s['rss_mib'] for s in samples]
    growth = rss[-1] - rss[1] if len(rss) > 2 else 0.0
    counts, missed = result['counts'], result['missed']
    out = {
        'false_down': counts['live']['down'],
        'wrong_up': sum(counts[c]['up'] for c in CATEGORIES if c != 'live'),
        'not_polled_every_interval': sum(missed.values()),
        'cpu_ms_per_poll_after_first_interval': round(steady_cpu, 4) if steady_cpu is not None else None,
        'cpu_ms_per_poll_all': round(samples[-1]['cpu_s'] * 1000 / samples[-1]['events'], 4)
        if samples[-1]['events']
        else None,
        'rss_max_mib': max(rss),
        'rss_growth_mib': round(growth, 1),
        'per_round': per_round,
    }
    fleet = f'poller, {result["servers"]} servers every {result["interval"]:g} s'
    cpu_text = f'{steady_cpu:.3f} ms' if steady_cpu is not None else 'n/a'
    rss_ok = max(rss) <= GOAL_RSS_MIB and growth <= max(4.0, 0.03 * rss[1] if len(rss) > 1 else 0.0)
    rows = [
        (
            f'{fleet}: every server polled every interval',
            f'{out["not_polled_every_interval"]} missed',
            out['not_polled_every_interval'] == 0 and not result['crashed'],
        ),
        (f'{fleet}: false down for a live server == 0', str(out['false_down']), out['false_down'] == 0),
        (f'{fleet}: slow, dead, garbage servers reported up == 0', str(out['wrong_up']), out['wrong_up'] == 0),
        (
            f'{fleet}: CPU per server poll <= {GOAL_CPU_MS} ms',
            cpu_text,
            steady_cpu is not None and steady_cpu <= GOAL_CPU_MS,
        ),
        (f'{fleet}: RSS <= {GOAL_RSS_MIB} MiB, not growing', f'{max(rss):.0f} MiB, +{growth:.1f}', rss_ok),
    ]
    out['goals'] = {goal: met for goal, _value, met in rows}
    out['issue22'] = [{'goal': goal, 'value': value, 'met': met} for goal, value, met in rows]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['--fakes']:
        asyncio.run(_fakes(int(argv[1]), int(argv[2])))
        return 0
    if argv[:1] == ['--runner']:
        with open(argv[1]) as f:
            config = json.load(f)
        if os.environ.get('BENCH_POLLER_PROFILE'):
            import cProfile  # pylint: disable=import-outside-toplevel
            import pstats  # pylint: disable=import-outside-toplevel

            profile = cProfile.Profile()
            result = profile.runcall(asyncio.run, _run_source(config))
            pstats.Stats(profile, stream=sys.stderr).sort_stats('tottime').print_stats(30)
        else:
            result = asyncio.run(_run_source(config))
        print(json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--servers', type=int, default=10000)
    parser.add_argument('--interval', type=float, default=30.0)
    parser.add_argument('--timeout', type=float, default=10.0)
    parser.add_argument('--rounds', type=int, default=4, help='intervals to watch')
    parser.add_argument('--bad-percent', type=float, default=5.0, help='share of slow + dead + garbage servers')
    parser.add_argument('--regions', type=int, default=10, help='stale regions on each real tritonserver')
    parser.add_argument('--source', default=SOURCE, help='the event source file (e.g. an older version, to compare)')
    parser.add_argument(
        '--quick', action='store_true', help='a quick check: 500 servers, interval 3 s, timeout 1 s, 3 intervals'
    )
    parser.add_argument('--output', default='bench_poller.json', help='file name under bench-results/')
    args = parser.parse_args(argv)
    if args.quick:
        args.servers, args.interval, args.timeout, args.rounds = 500, 3.0, 1.0, 3
    args.source = os.path.abspath(args.source)
    if os.environ.get(NETNS_ENV) != '1':
        if os.geteuid() != 0:
            print('bench_poller needs root (a private network namespace, the rig)', file=sys.stderr)
            return 2
        return _in_netns(argv)
    sys.path.insert(0, HERE)
    from run import write_results  # pylint: disable=import-outside-toplevel

    loadavg = os.getloadavg()
    result = bench(args)
    result.update(
        figures(result),
        host=dict(
            cpus=os.cpu_count(),
            kernel=platform.release(),
            python=platform.python_version(),
            loadavg_start=loadavg,
            loadavg_end=os.getloadavg(),
        ),
    )
    counts = result['counts']
    for kind in CATEGORIES:
        example = f'; e.g. {result["errors"][kind]}' if kind in result['errors'] else ''
        print(
            f'  {kind:8} {counts[kind]["up"]:6d} up {counts[kind]["down"]:6d} down, '
            f'{result["missed"][kind]} not polled every interval{example}'
        )
    for number, rnd in enumerate(result['per_round'], 1):
        print(
            f'  interval {number}: {rnd["polls"]:6d} polls, {rnd["cpu_ms_per_poll"]} ms CPU per poll, RSS {rnd["rss_mib"]:.1f} MiB, '  # noqa: E501
            f'event loop late by up to {rnd["max_loop_lag_s"]:.3f} s'
        )
    for kind, examples in result['missed_examples'].items():
        if examples:
            print(f'  not polled every interval ({kind}), e.g.: {examples}')
    crashed = f'; the source crashed: {result["crashed"]}' if result['crashed'] else ''
    print(
        f'  CPU per poll after the first interval {result["cpu_ms_per_poll_after_first_interval"]} ms (all intervals '
        f'{result["cpu_ms_per_poll_all"]} ms); RSS max {result["rss_max_mib"]:.1f} MiB, growth {result["rss_growth_mib"]:.1f} MiB'
        f'{crashed}'
    )
    for row in result['issue22']:
        print(f'  goal: {row["goal"]:66} {row["value"]:>14}  {"PASS" if row["met"] else "MISS"}')
    print(f'  figures written to {write_results(args.output, result)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
