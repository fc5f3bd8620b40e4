"""Self-healing with a real ansible-rulebook process, real tritonservers and real killed clients.

Each test starts `ansible-rulebook -i INVENTORY -r tritonops.shm.self_heal[_alertmanager]
--vars VARS --print-events` as a subprocess in its own session, waits (bounded) for what a
user would check (regions and /dev/shm files, the rulebook's output), and stops it by pid.
Cleanup runs are counted from the PLAY RECAP lines of the cleanup playbook the rulebook runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import tritonrig
import yaml
from ansible_helpers import BIN, COLLECTIONS_PATH, PYTHON, ansible_env
from observability import (  # pylint: disable=unused-import
    NodeExporter,
    services,  # noqa: F401  the fixture
)

MiB = 1 << 20
SHM = 32 * MiB


class Rulebook:
    """One ansible-rulebook process; output in a file; stopped by pid (its session)."""

    def __init__(self, tmp_path, rulebook, hosts, variables):
        self.dir = tmp_path / ('rulebook-%d' % time.monotonic_ns())
        self.dir.mkdir()
        inventory = self.dir / 'inventory.yml'
        # hosts outside group triton: the rulebooks set target to the event's host
        inventory.write_text(yaml.safe_dump({'all': {'hosts': hosts}}))
        var_file = self.dir / 'vars.yml'
        var_file.write_text(yaml.safe_dump(variables))
        self.log = self.dir / 'rulebook.log'
        # unbuffered: ansible-rulebook prints each received event without flushing, and a block-buffered
        # log would hold an event back until the buffer fills (a resolved notification never showed)
        env = ansible_env({'ANSIBLE_STDOUT_CALLBACK': 'default', 'PYTHONUNBUFFERED': '1'})
        cmd = [
            os.path.join(BIN, 'ansible-rulebook'),
            '-i',
            str(inventory),
            '-r',
            rulebook,
            '--vars',
            str(var_file),
            '--print-events',
        ]
        with open(self.log, 'wb') as out:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.dir),
                start_new_session=True,
            )

    def output(self):
        return self.log.read_text(errors='replace')

    def cleanups(self, host):
        """How many cleanup playbook runs included host (its PLAY RECAP lines)."""
        return len(re.findall(r'^%s\s+: ok=' % re.escape(host), self.output(), re.M))

    def events(self, host, status='up'):
        """How many events of host with status the rulebook received (--print-events blocks)."""
        blocks = self.output().split('[received event]')[1:]
        return sum(1 for b in blocks if "'host': '%s'" % host in b and "'status': '%s'" % status in b)

    def wait(self, what, predicate, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert self.proc.poll() is None, 'ansible-rulebook exited with %s:\n%s' % (
                self.proc.returncode,
                self.output()[-4000:],
            )
            time.sleep(0.5)
        raise AssertionError('not within %ss: %s\n%s' % (timeout, what, self.output()[-4000:]))

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        else:
            try:  # children (ansible-playbook) of an exited rulebook
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def rulebooks():
    started = []

    def start(*args):
        started.append(Rulebook(*args))
        return started[-1]

    try:
        yield start
    finally:
        for rb in started:
            rb.stop()


@pytest.fixture
def servers(tmp_path):
    """Two servers with a 32 MiB private /dev/shm and no model (fast start), on 127.0.1.1 and 127.0.1.2."""
    fleet = tritonrig.Fleet(2, workdir=str(tmp_path), shm_size='32m', models=())
    try:
        yield fleet.start().servers
    finally:
        fleet.stop()


def host_vars(server, prom_dir, **extra):
    prom_dir.mkdir(exist_ok=True)
    return dict(
        ansible_connection='local',
        ansible_python_interpreter=PYTHON,
        triton_url=server.url,
        prometheus_textfile_dir=str(prom_dir),
        **extra,
    )


def closed_url():
    port = tritonrig.free_port()
    return 'http://127.0.0.1:%d' % port


def test_self_heal_cleans_a_host_over_the_threshold_and_never_a_down_one(servers, rulebooks, tmp_path):
    t1 = servers[0]
    live = t1.client('live', byte_size=4 * MiB)
    t1.leak('dead1', byte_size=4 * MiB)  # 8 MiB of 32 registered: 25%, below 50%
    down_url = closed_url()
    hosts = {
        # shm_cleanup_mode: all in the inventory: self-healing must still clean only stale regions
        't1': host_vars(t1, tmp_path / 'prom-t1', shm_cleanup_mode='all'),
        'tdown': dict(host_vars(t1, tmp_path / 'prom-tdown'), triton_url=down_url),
    }
    rb = rulebooks(
        tmp_path,
        'tritonops.shm.self_heal',
        hosts,
        {
            'triton_shm_servers': [
                {'host': 't1', 'url': t1.url, 'shm_bytes': SHM},
                {'host': 'tdown', 'url': down_url, 'shm_bytes': SHM},
            ],
            'self_heal_percent': 50,
            'self_heal_interval': 1,
        },
    )

    # below the threshold: polled several times, nothing runs
    rb.wait('3 polls of t1 and tdown', lambda: rb.events('t1') >= 3 and rb.events('tdown', 'down') >= 3, 90)
    assert 'dead1' in t1.system_regions() and 'dead1' in t1.shm_files()
    assert rb.cleanups('t1') == 0 and 'PLAY [Clean up Triton shared memory]' not in rb.output()

    # leak until the threshold: 16 MiB of 32 = 50%
    t1.leak('dead2', byte_size=4 * MiB)
    t1.leak('dead3', byte_size=4 * MiB)
    started = time.monotonic()
    rb.wait(
        'the stale regions and their files are gone',
        lambda: not {'dead1', 'dead2', 'dead3'} & (set(t1.system_regions()) | set(t1.shm_files())),
        120,
    )
    healed_after = time.monotonic() - started
    rb.wait('the cleanup run finished', lambda: rb.cleanups('t1') == 1, 60)

    # the live client's region and file are kept, the client still works
    assert 'live' in t1.system_regions() and 'live' in t1.shm_files() and live.alive
    # the down server gave events and a message, never a cleanup
    assert rb.cleanups('tdown') == 0 and not os.listdir(tmp_path / 'prom-tdown')
    assert re.search(r'tdown: Triton is down, no cleanup: .*cannot connect', rb.output())
    # the cleanup on t1 wrote its outcome
    [prom] = [p.read_text() for p in (tmp_path / 'prom-t1').glob('tritonops_shm_cleanup.t1.*.prom')]
    assert f'tritonops_shm_cleanup_last_unregistered_regions{{host="t1",triton_url="{t1.url}"}} 3\n' in prom
    print('healed %.1fs after the threshold was crossed' % healed_after)


def test_cooldown_one_cleanup_per_host_while_it_stays_over_the_threshold(servers, rulebooks, tmp_path):
    # live clients over the threshold on both hosts: the cleanup frees nothing, the throttle
    # (grouped by host) lets it run once per host and not again every poll
    clients = [s.client('busy', byte_size=20 * MiB) for s in servers]
    hosts = {'a': host_vars(servers[0], tmp_path / 'prom-a'), 'b': host_vars(servers[1], tmp_path / 'prom-b')}
    rb = rulebooks(
        tmp_path,
        'tritonops.shm.self_heal',
        hosts,
        {
            'triton_shm_servers': [
                {'host': 'a', 'url': servers[0].url, 'shm_bytes': SHM},
                {'host': 'b', 'url': servers[1].url, 'shm_bytes': SHM},
            ],
            'self_heal_percent': 50,
            'self_heal_interval': 1,
        },
    )
    rb.wait('one cleanup of each host', lambda: rb.cleanups('a') >= 1 and rb.cleanups('b') >= 1, 150)
    seen = rb.events('a')
    rb.wait('8 more polls over the threshold', lambda: rb.events('a') >= seen + 8, 60)
    assert (rb.cleanups('a'), rb.cleanups('b')) == (1, 1), rb.output()[-4000:]
    # one host at a time: the two runs did not overlap
    out = rb.output()
    assert out.count('PLAY [Clean up Triton shared memory]') == 2
    first, second = [m.start() for m in re.finditer(r'PLAY \[Clean up Triton shared memory\]', out)]
    assert 'PLAY RECAP' in out[first:second]
    for server, client in zip(servers, clients):
        assert 'busy' in server.system_regions() and 'busy' in server.shm_files() and client.alive


def post(url, payload, token=None):
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), method='POST', headers={'Content-Type': 'application/json'}
    )
    if token:
        req.add_header('Authorization', 'Bearer ' + token)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def alert(name, host, status='firing'):
    labels = {'alertname': name, 'instance': '%s:9100' % host, 'job': 'node', 'severity': 'warning'}
    if host is not None:
        labels['host'] = host
    return {
        'status': status,
        'labels': labels,
        'annotations': {'summary': name},
        'startsAt': '2026-01-01T00:00:00Z',
        'endsAt': '0001-01-01T00:00:00Z',
        'generatorURL': 'http://prometheus:9090/graph',
        'fingerprint': '%016x' % abs(hash((name, host))),
    }


def test_alertmanager_webhook_cleans_only_the_alerting_host(servers, rulebooks, tmp_path):
    h1, h2 = servers
    for s in servers:
        s.leak('dead', byte_size=2 * MiB)
    port = tritonrig.free_port()
    token = 'tok-%d' % time.monotonic_ns()
    hosts = {'h1': host_vars(h1, tmp_path / 'prom-h1'), 'h2': host_vars(h2, tmp_path / 'prom-h2')}
    rb = rulebooks(
        tmp_path,
        'tritonops.shm.self_heal_alertmanager',
        hosts,
        {'self_heal_hosts': ['h1', 'h2'], 'self_heal_webhook_port': port, 'self_heal_webhook_token': token},
    )
    url = 'http://127.0.0.1:%d/alerts' % port

    def listening():
        with socket.socket() as sock:
            return sock.connect_ex(('127.0.0.1', port)) == 0

    rb.wait('the webhook listens', listening, 90)

    group = {
        'version': '4',
        'groupKey': '{}:{}',
        'status': 'firing',
        'receiver': 'tritonops',
        'groupLabels': {},
        'commonLabels': {},
        'commonAnnotations': {},
        'externalURL': 'http://alertmanager:9093',
        'truncatedAlerts': 0,
    }
    # without the token: refused
    assert post(url, dict(group, alerts=[alert('TritonShmStaleRegions', 'h2')])) == 401
    # in one payload, in this order: alerts that must clean nothing, then the one for h1
    alerts = [
        alert('TritonShmStaleRegions', 'h2', status='resolved'),  # resolved
        alert('TritonShmMetricsStale', 'h2'),  # not a cleanup alert
        alert('TritonShmStaleRegions', 'all'),  # not an allowed host
        alert('TritonShmStaleRegions', 'h*'),  # a pattern
        alert('TritonShmStaleRegions', None),  # no host label
        alert('TritonShmNearlyFull', 'h1'),
    ]
    assert post(url, dict(group, alerts=alerts), token) == 200
    rb.wait(
        'the alerting host h1 is clean', lambda: 'dead' not in h1.system_regions() and 'dead' not in h1.shm_files(), 120
    )
    rb.wait('the cleanup run finished', lambda: rb.cleanups('h1') == 1, 60)
    time.sleep(2)
    # rules run in event order: every earlier alert was decided before h1's cleanup ran
    assert rb.cleanups('h2') == 0 and rb.output().count('PLAY [Clean up Triton shared memory]') == 1
    assert 'dead' in h2.system_regions() and 'dead' in h2.shm_files()


def test_a_host_whose_cleanup_cannot_see_every_holder_is_never_healed(servers, rulebooks, services, tmp_path):
    """Issue 25: the poller does not trigger a heal that cannot act.

    Both hosts are over the threshold with stale regions. node_exporter serves the textfiles of both hosts (one
    directory): t1's, as a report run inside a container writes it (holders_complete 0, pid_namespace other); t2's
    complete. With metrics_url, the rulebook cleans t2 and shows t1 with the reason, and never starts a cleanup on t1.
    """
    if COLLECTIONS_PATH not in sys.path:
        sys.path.insert(0, COLLECTIONS_PATH)
    from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics

    t1, t2 = servers
    prom = tmp_path / 'prom'
    prom.mkdir()
    for server, host, complete in ((t1, 't1', False), (t2, 't2', True)):
        inv = {
            'reachable': True,
            'holders_complete': complete,
            'pid_namespace': 'initial' if complete else 'other',
            'holders_incomplete_reason': None if complete else "outside the host's initial PID namespace",
            'server': {'pid': 1, 'shm_dir': '/dev/shm'},
        }
        metrics.write_textfile(
            str(prom), metrics.file_name(metrics.REPORT, host, server.url), metrics.report_text(inv, host, server.url)
        )
    node = services(NodeExporter(tmp_path, prom)).wait_ready()
    assert 'tritonops_shm_holders_complete{host="t1"' in node.metrics()
    for server in servers:
        server.client('live', byte_size=4 * MiB)
        for name in ('dead1', 'dead2', 'dead3'):
            server.leak(name, byte_size=4 * MiB)  # 16 MiB of 32: 50%
    hosts = {'t1': host_vars(t1, prom), 't2': host_vars(t2, prom)}
    rb = rulebooks(
        tmp_path,
        'tritonops.shm.self_heal',
        hosts,
        {
            'triton_shm_servers': [
                {'host': 't1', 'url': t1.url, 'shm_bytes': SHM, 'metrics_url': node.url},
                {'host': 't2', 'url': t2.url, 'shm_bytes': SHM, 'metrics_url': node.url + '/metrics'},
            ],
            'self_heal_percent': 50,
            'self_heal_interval': 1,
        },
    )
    rb.wait(
        't2 healed', lambda: not {'dead1', 'dead2', 'dead3'} & (set(t2.system_regions()) | set(t2.shm_files())), 120
    )
    rb.wait('the cleanup run of t2 finished', lambda: rb.cleanups('t2') == 1, 60)
    seen = rb.events('t1')
    rb.wait('5 more polls of t1 over the threshold', lambda: rb.events('t1') >= seen + 5, 60)
    out = rb.output()
    assert rb.cleanups('t1') == 0 and out.count('PLAY [Clean up Triton shared memory]') == 1, out[-4000:]
    assert {'dead1', 'dead2', 'dead3', 'live'} <= set(t1.system_regions()) & set(t1.shm_files())
    assert 'live' in t2.system_regions() and 'live' in t2.shm_files()
    assert "'holders_complete': False" in out and "'holders_incomplete_reason': 'pid_namespace'" in out
    assert re.search(r't1: the cleanup there cannot see every process .*\(pid_namespace\), no cleanup', out)
    assert len(re.findall(r't1: the cleanup there cannot see every process', out)) == 1  # throttled
