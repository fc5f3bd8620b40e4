"""Issue 26 finding 14: the Alertmanager webhook rulebook, with a real ansible-rulebook and real HTTP posts on 127.0.0.1.

A wrong configuration ends the rulebook at start with the reason (it used to start and match nothing, or refuse
every alert without a word); an expired or resolved alert cleans nothing; what the sender wrote besides the
alert's name and host never reaches a rule or the cleanup playbook.
"""

from __future__ import annotations

import datetime
import socket
import time

import tritonrig

# rulebooks and servers are fixtures
from test_self_healing import Rulebook, alert, host_vars, post, rulebooks, servers  # noqa: F401  pylint: disable=unused-import

MiB = 1 << 20
RULEBOOK = 'tritonops.shm.self_heal_alertmanager'
TOKEN = 'tok-0123456789abcdef'


def ended(rb: Rulebook, timeout: float = 90) -> int:
    """The rulebook's exit status; it must end by itself."""
    rb.proc.wait(timeout=timeout)
    return rb.proc.returncode


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(('127.0.0.1', port)) == 0


def test_a_wrong_configuration_ends_the_rulebook_with_the_reason(servers, rulebooks, tmp_path):  # noqa: F811
    h1, _h2 = servers
    hosts = {'h1': host_vars(h1, tmp_path / 'prom-h1')}
    port = tritonrig.free_port()
    cases = [
        (
            {'self_heal_hosts': 'h1', 'self_heal_webhook_token': TOKEN},
            "self_heal_hosts must be a list of inventory host names, got the string 'h1': write [h1]",
        ),
        ({'self_heal_hosts': ['h1']}, 'self_heal_webhook_token is not set'),
        (
            {'self_heal_hosts': ['h1'], 'self_heal_webhook_token': 'short'},
            'self_heal_webhook_token must be a string of at least 16 characters',
        ),
        (
            {'self_heal_hosts': ['all'], 'self_heal_webhook_token': TOKEN},
            "not all, not a pattern or a group), got 'all'",
        ),
    ]
    for variables, reason in cases:
        rb = rulebooks(tmp_path, RULEBOOK, hosts, dict(variables, self_heal_webhook_port=port))
        assert ended(rb) == 1, rb.output()[-3000:]
        assert reason in rb.output(), rb.output()[-3000:]
        assert 'short' not in rb.output().split('Loading rulebook')[-1].replace(reason, ''), 'the token is not shown'
        assert not listening(port)


def rfc3339(delta_seconds: float) -> str:
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=delta_seconds)
    return when.strftime('%Y-%m-%dT%H:%M:%S.%f') + '123Z'  # Go writes nanoseconds


def test_expired_and_resolved_alerts_clean_nothing_and_only_name_and_host_get_through(servers, rulebooks, tmp_path):  # noqa: F811
    h1, h2 = servers
    for s in servers:
        s.leak('dead', byte_size=2 * MiB)
    port = tritonrig.free_port()
    hosts = {'h1': host_vars(h1, tmp_path / 'prom-h1'), 'h2': host_vars(h2, tmp_path / 'prom-h2')}
    rb = rulebooks(
        tmp_path,
        RULEBOOK,
        hosts,
        {'self_heal_hosts': ['h1', 'h2'], 'self_heal_webhook_port': port, 'self_heal_webhook_token': TOKEN},
    )
    url = f'http://127.0.0.1:{port}/alerts'
    rb.wait('the webhook listens', lambda: listening(port), 90)
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
    expired = dict(alert('TritonShmStaleRegions', 'h2'), endsAt=rfc3339(-2 * 3600))  # ended two hours ago, replayed
    resolved = dict(alert('TritonShmNearlyFull', 'h2', status='resolved'), endsAt=rfc3339(-5))
    unreadable = dict(alert('TritonShmStaleRegions', 'h2'), endsAt='yesterday')
    # a live alert whose sender adds what a rule or playbook must never trust
    live = alert('TritonShmStaleRegions', 'h1')
    live['endsAt'] = rfc3339(240)
    live['labels'].update(shm_cleanup_mode='all', target='all', extra='INJECTED-LABEL')
    live['annotations'] = {'summary': 'INJECTED-ANNOTATION {{ lookup("pipe", "id") }}'}
    assert post(url, dict(group, alerts=[expired, resolved, unreadable, live]), TOKEN) == 200
    rb.wait('the alerting host h1 is clean', lambda: 'dead' not in h1.system_regions(), 120)
    rb.wait('the cleanup run finished', lambda: rb.cleanups('h1') == 1, 60)
    time.sleep(2)
    out = rb.output()
    assert rb.cleanups('h2') == 0 and 'dead' in h2.system_regions() and 'dead' in h2.shm_files()
    assert out.count('PLAY [Clean up Triton shared memory]') == 1
    # the one event the rules saw is the reduced alert: name and host, no annotation, no other label
    events = out.split('[received event]')[1:]
    assert len(events) == 1, out[-4000:]
    assert "'alertname': 'TritonShmStaleRegions'" in events[0] and "'host': 'h1'" in events[0]
    assert 'INJECTED' not in out and 'shm_cleanup_mode' not in events[0]
