"""The real alert chain, end to end, with no human: leak -> report -> node_exporter -> Prometheus -> Alertmanager
-> ansible-rulebook -> cleanup -> report -> the alert resolves.

A real tritonserver with a live client and two killed ones (stale regions); the report playbook writes the
textfile; a real node_exporter exposes it; a real Prometheus loads the collection's alert rules (as shipped, only
each `for` shortened to 1 s) and scrapes and evaluates every second; a real Alertmanager (group_wait 0) sends the
alert with its bearer token to the webhook of the rulebook tritonops.shm.self_heal_alertmanager, which runs the
cleanup playbook. Every service is on a loopback port the test chose, with its own data directory, stopped by pid.
The pool chain is the same with a python backend pool grown past its share of /dev/shm, the alert
TritonShmBackendPoolLarge and the opt-in rulebook tritonops.shm.self_heal_pools, which reloads the model.
"""

from __future__ import annotations

import secrets
import socket
import time
from typing import NamedTuple

import tritonrig
from ansible_helpers import PYTHON, ansible_playbook
from observability import (  # pylint: disable=unused-import
    Alertmanager,
    NodeExporter,
    Prometheus,
    rules_with_short_for,
    services,  # noqa: F401  the fixture
    wait_for,
)
from test_self_healing import Rulebook

MiB = 1 << 20


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(('127.0.0.1', port)) == 0


class Chain(NamedTuple):
    """The services of one alert chain, started and ready."""

    inventory: dict
    rulebook: Rulebook
    alertmanager: Alertmanager
    prometheus: Prometheus


def chain(server, rulebook_name: str, services, tmp_path) -> Chain:
    """Host t1 (the server; the report's textfile in tmp_path/textfile) -> node_exporter -> Prometheus (the
    collection's rules, each `for` 1 s) -> Alertmanager -> the webhook of the rulebook rulebook_name."""
    prom_dir = tmp_path / 'textfile'
    prom_dir.mkdir()
    hosts = {
        't1': dict(
            ansible_connection='local',
            ansible_python_interpreter=PYTHON,
            triton_url=server.url,
            prometheus_textfile_dir=str(prom_dir),
        )
    }
    inventory = {'all': {'children': {'triton': {'hosts': hosts}}}}
    token = secrets.token_hex(16)
    webhook = tritonrig.free_port()
    rulebook = services(
        Rulebook(
            tmp_path,
            rulebook_name,
            hosts,
            {'self_heal_hosts': ['t1'], 'self_heal_webhook_port': webhook, 'self_heal_webhook_token': token},
        )
    )
    alertmanager = services(Alertmanager(tmp_path, f'http://127.0.0.1:{webhook}/alerts', token))
    node = services(NodeExporter(tmp_path, prom_dir))
    prometheus = services(
        Prometheus(
            tmp_path,
            [f'127.0.0.1:{node.port}'],
            rule_files=(rules_with_short_for(tmp_path),),
            alertmanager_urls=(alertmanager.url,),
        )
    )
    for service in (alertmanager, node, prometheus):
        service.wait_ready()
    rulebook.wait('the webhook listens', lambda: listening(webhook), 90)
    return Chain(inventory, rulebook, alertmanager, prometheus)


def report_until_resolved(inventory: dict, prometheus: Prometheus, what: str, scraped: str, alert: str) -> None:
    """Run the report playbook, wait until Prometheus has scraped what it shows (the query scraped answers), then
    until the alert is neither firing nor pending."""
    res = ansible_playbook('tritonops.shm.report', inventory=inventory)
    assert res.rc == 0, res
    wait_for(f'{what} scraped', lambda: prometheus.query(scraped), 30)
    wait_for(
        f'{alert} resolves',
        lambda: not prometheus.alerts(alert) and not prometheus.alerts(alert, 'pending'),
        30,
    )


def test_a_leak_heals_through_prometheus_alertmanager_and_the_rulebook(make_triton, services, tmp_path):
    server = make_triton(models=(), shm_size='32m')
    live = server.client('live', byte_size=2 * MiB)
    inventory, rulebook, alertmanager, prometheus = chain(
        server, 'tritonops.shm.self_heal_alertmanager', services, tmp_path
    )
    assert prometheus.api('rules')['groups'][0]['rules'], 'the collection rules are loaded'

    # the leak: two clients killed with their process group leave stale regions and their files
    leaked = time.monotonic()
    for name in ('dead1', 'dead2'):
        server.leak(name, byte_size=4 * MiB)
    assert {'dead1', 'dead2', 'live'} <= set(server.system_regions())
    killed = time.monotonic()
    res = ansible_playbook('tritonops.shm.report', inventory=inventory)
    assert res.rc == 0, res
    reported = time.monotonic()

    firing = wait_for(
        'TritonShmStaleRegions fires', lambda: prometheus.alerts('TritonShmStaleRegions'), 60, log=prometheus.output
    )
    assert firing[0]['labels']['host'] == 't1' and firing[0]['labels']['triton_url'] == server.url
    fired = time.monotonic()
    rulebook.wait(
        'the stale regions and their files are gone',
        lambda: not {'dead1', 'dead2'} & (set(server.system_regions()) | set(server.shm_files())),
        120,
    )
    healed = time.monotonic()
    rulebook.wait('the cleanup run finished', lambda: rulebook.cleanups('t1') == 1, 60)
    # the live client's region and file are kept, and the client still works
    assert 'live' in server.system_regions() and 'live' in server.shm_files() and live.alive
    # the cleanup's outcome reaches Prometheus through the same textfile directory
    wait_for(
        'the cleanup outcome scraped',
        lambda: prometheus.query(
            'tritonops_shm_cleanup_last_success{host="t1"} == 1 and tritonops_shm_cleanup_last_freed_bytes >= 8 * 1048576'
        ),
        30,
    )

    sent_firing = alertmanager.notifications()[0]
    assert sent_firing >= 1, 'the firing alert was notified'
    # the next report shows it, and the alert resolves: in Prometheus, and as Alertmanager's resolved notification
    report_until_resolved(
        inventory,
        prometheus,
        'the report without stale regions',
        'tritonops_shm_regions{host="t1",state="stale"} == 0',
        'TritonShmStaleRegions',
    )
    # Alertmanager delivers its resolved notification to the webhook (the rulebook's alertmanager_alerts filter
    # drops resolved alerts before any rule: they clean nothing)
    wait_for(
        "Alertmanager's resolved notification delivered", lambda: alertmanager.notifications()[0] > sent_firing, 30
    )
    assert alertmanager.notifications()[1] == 0, 'every notification reached the webhook'
    resolved = time.monotonic()
    assert rulebook.cleanups('t1') == 1 and rulebook.events('t1', 'resolved') == 0  # one alert, one cleanup
    assert 'live' in server.system_regions() and live.alive
    print(
        f'leak -> healed {healed - leaked:.1f}s (clients killed {killed - leaked:.1f}s, report playbook '
        f'{reported - killed:.1f}s, alert firing {fired - reported:.1f}s after it, cleaned {healed - fired:.1f}s later); '
        f'leak -> resolved {resolved - leaked:.1f}s'
    )


def test_a_grown_pool_fires_its_alert_and_the_pools_rulebook_reloads_it(make_triton, services, tmp_path):
    """The pool chain (issue 27): a real python backend pool grown by one large request -> the report's textfile ->
    node_exporter -> Prometheus fires TritonShmBackendPoolLarge for that model only -> Alertmanager -> the opt-in
    rulebook tritonops.shm.self_heal_pools reloads the model -> its pool is small again, the next report shows it,
    and the alert resolves."""
    from test_triton_backend_pool import grow, pools  # pylint: disable=import-outside-toplevel

    server = make_triton(models=('grow', 'echo'), shm_size='64m', name='pool-chain')
    inventory, rulebook, alertmanager, prometheus = chain(server, 'tritonops.shm.self_heal_pools', services, tmp_path)

    grow(server, 24 * MiB)  # the grow model's one pool holds a 24 MiB answer: about 40% of the 64 MiB /dev/shm
    big = [name for name, size in pools(server).items() if size > 16 * MiB]
    others = [name for name in pools(server) if name not in big]
    assert len(big) == 1 and others, pools(server)
    grown = time.monotonic()
    res = ansible_playbook('tritonops.shm.report', inventory=inventory)
    assert res.rc == 0, res

    firing = wait_for(
        'TritonShmBackendPoolLarge fires',
        lambda: prometheus.alerts('TritonShmBackendPoolLarge'),
        60,
        log=prometheus.output,
    )
    assert [(a['labels']['model'], a['labels']['host']) for a in firing] == [('grow', 't1')], firing  # not echo
    assert float(firing[0]['value']) >= 25
    fired = time.monotonic()
    rulebook.wait('the grown pool is gone', lambda: not set(big) & set(pools(server)), 180)
    rulebook.wait('the cleanup run finished', lambda: rulebook.cleanups('t1') == 1, 60)
    reloaded = time.monotonic()
    assert max(pools(server).values()) <= 2 * MiB and set(others) <= set(pools(server)), pools(server)
    grow(server, 1024)  # the reloaded model answers

    report_until_resolved(
        inventory,
        prometheus,
        'the report with the small pool',
        'tritonops_shm_backend_pool_bytes{host="t1",model="grow"} <= 2 * 1048576',
        'TritonShmBackendPoolLarge',
    )
    assert alertmanager.notifications()[1] == 0, 'every notification reached the webhook'
    assert rulebook.cleanups('t1') == 1, 'one alert, one reload'
    print(
        f'pool grown -> alert firing {fired - grown:.1f}s (report included), reloaded {reloaded - fired:.1f}s later, '
        f'resolved {time.monotonic() - grown:.1f}s after the growth'
    )
