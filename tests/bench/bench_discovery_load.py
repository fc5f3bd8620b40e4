"""Benchmark (not a test): finding the tritonserver behind a published port on a busy host.

The scene, in private network and PID namespaces (``unshare --net --pid --mount-proc``: only ``lo``,
and ``/proc`` shows only this scene, so nothing here slows other work on the machine, and the
2,000 processes and 5,000 connections are exactly those below):

- one real tritonserver (the rig) on 127.0.0.1;
- two published-port-like forwarders in front of it (the host port belongs to the forwarder, as with
  docker-proxy, so the listening socket alone does not find Triton): a one-process forwarder like
  docker-proxy (this script, asyncio), and ``socat TCP-LISTEN:P,fork`` (a new process per connection,
  which discovery waits for);
- --connections established TCP loopback connections (both ends held by one helper process);
- --processes extra processes (``sleep``).

Measured: ``discovery.locate_server`` for each forwarder's port (the connection is followed through
it) and, for reference, for Triton's own port (the listening socket), first on the quiet scene,
then under the load; median and best of --repeat calls each. Goal (issue 22): behind a forwarder,
under load, <= 50 ms (median); judged for each forwarder.

--load-first starts the load before the server and the forwarders: they then come after every
other process in pid order, which a walk over the processes in pid order reaches last (the worst
case for discovery; no quiet scene then). Figures go to bench_discovery_load[_load_first].json.
To compare with another checkout, run this file from that checkout's collection copy (it imports
the discovery.py next to it).
Usage: python tests/bench/bench_discovery_load.py [--connections 5000] [--processes 2000] [--repeat 15] [--quick] [--load-first]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NS_ENV = 'TRITONOPS_BENCH_DISCOVERY_NS'
GOAL_MS = 50.0
WAYS = (
    ('proxy', 'a one-process forwarder (as docker-proxy)'),
    ('socat', 'socat fork (a new process per connection)'),
    ('direct', "Triton's own port (the listening socket)"),
)


def hold(count: int) -> None:
    """Open count loopback connections (both ends in this process), say READY, and keep them until killed."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen(4096)
    address = listener.getsockname()
    ends = []
    for _connection in range(count):
        client = socket.create_connection(address)
        server, _peer = listener.accept()
        ends += [client, server]
    print('READY', flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def forward(listen_port: int, target_port: int) -> None:
    """A docker-proxy-like forwarder: one process, every connection piped onward from it (no fork per connection)."""
    import asyncio  # pylint: disable=import-outside-toplevel

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection('127.0.0.1', target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def serve() -> None:
        server = await asyncio.start_server(handle, '127.0.0.1', listen_port)
        await server.serve_forever()

    asyncio.run(serve())


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(('127.0.0.1', port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f'nothing listens on 127.0.0.1:{port} after {timeout}s')


def established() -> int:
    with open('/proc/net/tcp') as f:
        return sum(1 for line in f if line.split()[3:4] == ['01'])


def measure(discovery, port: int, want_pid: int, repeat: int) -> dict:
    """Median and best time of locate_server for 127.0.0.1:port; every call must find want_pid."""
    times = []
    located_by = None
    for _call in range(repeat):
        started = time.perf_counter()
        location = discovery.locate_server('127.0.0.1', port, f'http://127.0.0.1:{port}')
        times.append(time.perf_counter() - started)
        if location.pid != want_pid:
            raise RuntimeError(f'locate_server found pid {location.pid} ({location.reason}), not {want_pid}')
        located_by = location.located_by
    return {
        'median_ms': round(statistics.median(times) * 1000, 2),
        'best_ms': round(min(times) * 1000, 2),
        'runs_ms': [round(t * 1000, 2) for t in times],
        'located_by': located_by,
    }


def scene(args: argparse.Namespace) -> dict:
    import benchenv  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    import tritonrig  # pylint: disable=import-outside-toplevel

    from ansible_collections.tritonops.shm.plugins.module_utils.host import discovery

    workdir = tempfile.mkdtemp(prefix='bench-discovery-')
    server = tritonrig.TritonServer(workdir=workdir, shm_size='16m', models=())
    started = []
    figures: dict = {}

    def start_load() -> None:
        holder = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), '--hold', str(args.connections)],
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(holder)
        if holder.stdout.readline().strip() != 'READY':
            raise RuntimeError('the connection holder did not start')
        for _process in range(args.processes):
            started.append(subprocess.Popen(['sleep', '3600'], stdin=subprocess.DEVNULL))

    try:
        if args.load_first:
            start_load()
        server.start()
        port = tritonrig.free_port()
        started.append(
            subprocess.Popen(
                ['socat', f'TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr', f'TCP:127.0.0.1:{server.http_port}'],
                stdin=subprocess.DEVNULL,
            )
        )
        proxy_port = tritonrig.free_port()
        started.append(
            subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), '--forward', str(proxy_port), str(server.http_port)],
                stdin=subprocess.DEVNULL,
            )
        )
        wait_port(port)
        wait_port(proxy_port)
        for label in ('loaded',) if args.load_first else ('quiet', 'loaded'):
            if label == 'loaded' and not args.load_first:
                start_load()
            scene_info = {
                'processes': len([p for p in os.listdir('/proc') if p.isdigit()]),
                'established_sockets': established(),
            }
            figures[label] = dict(
                scene_info,
                proxy=measure(discovery, proxy_port, server.pid, args.repeat),
                socat=measure(discovery, port, server.pid, args.repeat),
                direct=measure(discovery, server.http_port, server.pid, args.repeat),
            )
            print(
                f'  {label:6}: {scene_info["processes"]:5d} processes, {scene_info["established_sockets"]:6d} established '
                f'sockets: median (best) ms',
                flush=True,
            )
            for key, what in WAYS:
                fig = figures[label][key]
                print(
                    f'          {what:62} {fig["median_ms"]:8.2f} ({fig["best_ms"]:.2f})  {fig["located_by"]}',
                    flush=True,
                )
    finally:
        for proc in reversed(started):
            proc.kill()
        for proc in started:
            proc.wait(timeout=30)
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    return figures


def discovery_file() -> str:
    import benchenv  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel

    from ansible_collections.tritonops.shm.plugins.module_utils.host import discovery

    return discovery.__file__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['--hold']:
        hold(int(argv[1]))
        return 0
    if argv[:1] == ['--forward']:
        forward(int(argv[1]), int(argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--connections', type=int, default=5000, help='established TCP loopback connections')
    parser.add_argument('--processes', type=int, default=2000, help='extra processes (sleep)')
    parser.add_argument('--repeat', type=int, default=15)
    parser.add_argument('--quick', action='store_true', help='a quick check: 500 connections, 200 processes, 5 calls')
    parser.add_argument(
        '--load-first', action='store_true', help='start the load before the server and forwarders (the worst case)'
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.connections, args.processes, args.repeat = 500, 200, 5
    if os.environ.get(NS_ENV) != '1':
        if os.geteuid() != 0:
            print('bench_discovery_load needs root (namespaces, the rig)', file=sys.stderr)
            return 2
        env = dict(os.environ, **{NS_ENV: '1'})
        cmd = [
            'unshare',
            '--net',
            '--pid',
            '--fork',
            '--mount',
            '--mount-proc',
            '--',
            'sh',
            '-c',
            'ip link set lo up && exec "$0" "$@"',
            sys.executable,
            os.path.abspath(__file__),
        ] + argv
        return subprocess.call(cmd, env=env)
    sys.path.insert(0, HERE)
    from run import write_results  # pylint: disable=import-outside-toplevel

    loadavg = os.getloadavg()
    print(
        f'discovery under load: {args.connections} connections, {args.processes} processes, {args.repeat} calls each; '
        f'load average {loadavg[0]:.1f}{"; load started first" if args.load_first else ""}; {discovery_file()}',
        flush=True,
    )
    figures = scene(args)
    rows = []
    for key, what in WAYS[:2]:
        median = figures['loaded'][key]['median_ms']
        order = ', load started first' if args.load_first else ''
        rows.append(
            {
                'goal': f'discovery, {args.connections} connections + {args.processes} processes{order}, behind {what} '
                f'<= {GOAL_MS:.0f} ms',
                'value': f'{median:.1f} ms',
                'met': median <= GOAL_MS,
            }
        )
    out = dict(
        benchmark='discovery_load',
        connections=args.connections,
        processes=args.processes,
        repeat=args.repeat,
        load_first=args.load_first,
        discovery=discovery_file(),
        figures=figures,
        goals={row['goal']: row['met'] for row in rows},
        issue22=rows,
        host=dict(
            cpus=os.cpu_count(),
            kernel=platform.release(),
            python=platform.python_version(),
            loadavg_start=loadavg,
            loadavg_end=os.getloadavg(),
        ),
    )
    for row in rows:
        print(f'  goal: {row["goal"]:100} {row["value"]:>9}  {"PASS" if row["met"] else "MISS"}')
    name = 'bench_discovery_load_load_first.json' if args.load_first else 'bench_discovery_load.json'
    print(f'  figures written to {write_results(name, out)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
