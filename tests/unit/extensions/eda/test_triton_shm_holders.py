"""The poller's metrics_url: a heal that cannot act is not triggered (issue 25: "The poller does not trigger a heal
that cannot act").

Each test runs main() as a task, as ansible-rulebook runs it, against real HTTP servers on 127.0.0.1: a Triton status
and a /metrics page in the text format node_exporter serves (the textfile lines written by module_utils/outputs/metrics.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import pytest
from test_triton_shm_source import (
    COLLECTION,
    MiB,
    closed_port,
    collect,
    run,
    source,  # noqa: E402
    triton,
)  # pylint: disable=import-error

if COLLECTION.split(os.sep)[-3:] == ['ansible_collections', 'tritonops', 'shm']:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION))))
from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics
from ansible_collections.tritonops.shm.tests.fakes import loopback  # noqa: E402  pylint: disable=wrong-import-position


def report(host: str, url: str, complete: bool, pid_namespace: str = 'initial') -> str:
    """The textfile the report or the cleanup writes for (host, url): the real renderer of module_utils/outputs/metrics.py."""
    why = None if complete else "the module runs outside the host's initial PID namespace (pid_namespace other)"
    inv = {
        'holders_complete': complete,
        'pid_namespace': pid_namespace,
        'server': {'pid': 4242, 'shm_dir': '/dev/shm'},
        'holders_incomplete_reason': why,
    }
    return metrics.report_text({'reachable': True, **inv}, host, url)


def metrics_page(text: str, status: int = 200) -> loopback.Peer:
    """node_exporter's /metrics (any path) answering text with status."""
    return loopback.Peer(loopback.canned(loopback.http_answer(status, text.encode(), 'text/plain'), keep=True))


def by_host(events):
    return {e['triton_shm']['host']: e['triton_shm'] for e in events}


def test_the_texts_used_here_are_the_module_utils_ones():
    text = report('t1', 'http://u:p@127.0.0.1:8000', False, 'other')
    # metrics.py writes the URL with its user:password part redacted: the poller matches it without that part
    assert (
        'tritonops_shm_holders_complete{host="t1",triton_url="http://***@127.0.0.1:8000",pid_namespace="other",'
        'reason="pid_namespace"} 0\n'
    ) in text


def test_an_incomplete_host_gives_holders_complete_false_and_the_reason_a_complete_one_true(caplog):
    """t1's cleanup cannot see every holder (metric 0, written with a user:password URL); t2's can (1)."""
    caplog.set_level(logging.INFO)

    async def scenario():
        with triton() as triton1, triton() as triton2:
            port1 = triton1.url.rsplit(':', 1)[1]
            page = (
                report('t1', f'http://admin:s3cret@127.0.0.1:{port1}/', False, 'other')
                + report('t2', triton2.url, True)
                + report('other', triton1.url, True)  # another host's series for the same URL: not t1's
                + 'node_load1 0.5\n'
            )
            with metrics_page(page) as node:
                args = {
                    'servers': [
                        {
                            'host': 't1',
                            'url': triton1.url,
                            'shm_bytes': 8 * MiB,
                            'metrics_url': node.url,
                            'headers': {'Authorization': 'Bearer triton-only'},
                        },
                        {
                            'host': 't2',
                            'url': triton2.url + '/',
                            'shm_bytes': 8 * MiB,
                            'metrics_url': node.url + '/metrics',
                        },
                    ],
                    'interval': 0.05,
                    'threshold_percent': 50,
                }
                return node, await collect(args, 6)

    node, events = run(scenario())
    seen = by_host(events)
    assert seen['t1']['status'] == 'up' and seen['t1']['registered_percent'] == 75.0
    assert seen['t1']['holders_complete'] is False and seen['t1']['holders_incomplete_reason'] == 'pid_namespace'
    assert seen['t2']['holders_complete'] is True and 'holders_incomplete_reason' not in seen['t2']
    assert 'metrics_error' not in seen['t1'] and 'metrics_error' not in seen['t2']
    # the metrics page is read on every poll, at /metrics, without Triton's headers
    assert len(node.requests) >= 6 and {r.path for r in node.requests} == {'/metrics'}
    assert all(r.header('Authorization') is None for r in node.requests)
    warnings = [r.getMessage() for r in caplog.records if 'cannot see every holder' in r.getMessage()]
    assert warnings == ['t1: the cleanup there cannot see every holder (pid_namespace), no self-heal']


@pytest.mark.parametrize(
    'page, status, error',
    [
        (None, 200, 'cannot connect to the metrics endpoint'),
        ('node_load1 0.5\n', 200, 'no tritonops_shm_holders_complete series for host t1'),
        ('oops', 500, 'HTTP 500'),
        ('\x00\xff garbage {{{ not="a metric" 0\n', 200, 'no tritonops_shm_holders_complete series'),
    ],
)
def test_an_unreachable_or_silent_metrics_page_leaves_completeness_unknown(page, status, error):
    async def scenario():
        with triton() as fake:
            if page is None:
                url = f'http://user:pw@127.0.0.1:{closed_port()}'
                return url, await collect(
                    {
                        'servers': [{'host': 't1', 'url': fake.url, 'shm_bytes': 8 * MiB, 'metrics_url': url}],
                        'interval': 0.05,
                    },
                    2,
                )
            with metrics_page(page, status) as node:
                return node.url, await collect(
                    {
                        'servers': [{'host': 't1', 'url': fake.url, 'shm_bytes': 8 * MiB}],
                        'metrics_url': node.url,
                        'interval': 0.05,
                    },
                    2,
                )

    url, events = run(scenario())
    for event in events:
        data = event['triton_shm']
        assert data['status'] == 'up' and data['registered_percent'] == 75.0
        assert data['holders_complete'] is None and error in data['metrics_error']
        assert 'pw' not in data['metrics_error'] and source.poll.redact_url(url) in data['metrics_error']


def test_a_silent_metrics_endpoint_never_holds_the_poll_past_its_timeout():
    async def scenario():
        with triton() as fake, loopback.Peer(loopback.silent()) as node:
            loop = asyncio.get_running_loop()
            started = loop.time()
            events = await collect(
                {
                    'servers': [{'host': 't1', 'url': fake.url, 'metrics_url': node.url}],
                    'timeout': 0.5,
                    'interval': 0.2,
                },
                2,
            )
            return loop.time() - started, events

    took, events = run(scenario())
    assert took < 3
    assert all(
        e['triton_shm']['status'] == 'up'
        and e['triton_shm']['holders_complete'] is None
        and 'no answer within 0.5s' in e['triton_shm']['metrics_error']
        for e in events
    )


def test_a_down_server_says_down_whatever_its_metrics():
    async def scenario():
        with metrics_page(report('t1', 'http://127.0.0.1:1', False, 'other')) as node:
            return await collect(
                {
                    'servers': [{'host': 't1', 'url': f'http://127.0.0.1:{closed_port()}', 'metrics_url': node.url}],
                    'interval': 0.05,
                },
                2,
            )

    for event in run(scenario()):
        assert event['triton_shm']['status'] == 'down' and 'registered_percent' not in event['triton_shm']


@pytest.mark.parametrize(
    'line, host, url, expected',
    [
        (
            'tritonops_shm_holders_complete{host="a",triton_url="http://x:1",pid_namespace="other",reason="hidepid"} 0',
            'a',
            'http://x:1',
            (False, 'hidepid'),
        ),
        (
            'tritonops_shm_holders_complete{host="a",triton_url="x:1/",pid_namespace="initial",reason=""} 1',
            'a',
            'http://x:1',
            (True, None),
        ),
        (
            'tritonops_shm_holders_complete{host="a",triton_url="http://u:p@X:1",reason="shm_dir"} 0 1700000000000',
            'a',
            'http://x:1',
            (False, 'shm_dir'),
        ),
        ('tritonops_shm_holders_complete{triton_url="http://x:1",host="a"} 0', 'a', 'http://x:1', (False, 'unknown')),
        (
            'tritonops_shm_holders_complete{host="a",triton_url="http://***@x:1",reason="pid_namespace"} 0',
            'a',
            'http://user:pw@x:1/',
            (False, 'pid_namespace'),
        ),
        (
            'tritonops_shm_holders_complete{host="a",triton_url="https://x:1",reason="hidepid"} 0',
            'a',
            'http://x:1',
            (None, None),
        ),
        (
            'tritonops_shm_holders_complete{host="a",triton_url="http://x:2",reason="hidepid"} 0',
            'a',
            'http://x:1',
            (None, None),
        ),
        (
            'tritonops_shm_holders_complete{host="b",triton_url="http://x:1",reason="hidepid"} 0',
            'a',
            'http://x:1',
            (None, None),
        ),
        ('tritonops_shm_holders_complete_other{host="a",triton_url="http://x:1"} 0', 'a', 'http://x:1', (None, None)),
        ('# tritonops_shm_holders_complete{host="a",triton_url="http://x:1"} 0', 'a', 'http://x:1', (None, None)),
    ],
)
def test_which_series_count(line, host, url, expected):
    seen = source.poll.holders_from_metrics(line + '\n', host, url)
    assert (seen.complete, seen.reason) == expected


def test_one_series_at_zero_wins_over_others_at_one():
    page = report('a', 'http://x:1', True) + report('a', 'http://x:1/', False, 'other')
    assert source.poll.holders_from_metrics(page, 'a', 'http://x:1').complete is False


@pytest.mark.parametrize(
    'args, message',
    [
        (
            {'servers': [{'host': 'a', 'url': 'http://a:1', 'metrics_url': 'ftp://a:9100'}]},
            'metrics_url ftp://a:9100 is not',
        ),
        (
            {'servers': [{'host': 'a', 'url': 'http://a:1', 'metrics_url': 'http://a:99999'}]},
            'metrics_url http://a:99999 has',
        ),
        ({'servers': [{'host': 'a', 'url': 'http://a:1', 'metrics_url': 9100}]}, 'metrics_url must be'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1'}], 'metrics_url': ' '}, 'metrics_url must be'),
        (
            {'servers': [{'host': 'a', 'url': 'http://a:1', 'metrics_url': 'http://u:secret@a:99999'}]},
            r'\*\*\*@a:99999',
        ),
    ],
)
def test_bad_metrics_urls_fail_before_polling(args, message):
    with pytest.raises(source.ConfigError, match=message) as err:
        source.parse_args(args)
    assert 'secret' not in str(err.value)


def test_per_server_metrics_url_overrides_the_global_one_and_gets_metrics_by_default():
    servers, _interval = source.parse_args(
        {
            'servers': [
                {'host': 'a', 'url': 'http://a:1'},
                {'host': 'b', 'url': 'http://b:1', 'metrics_url': 'b:9100/m'},
            ],
            'metrics_url': 'https://node:9100',
        }
    )
    assert servers[0]['metrics']['url'] == 'https://node:9100/metrics'
    assert servers[1]['metrics']['url'] == 'http://b:9100/m'
    metrics = source.poll.Target(servers[0], True).metrics
    assert metrics.request.startswith(b'GET /metrics HTTP/1.1\r\n')
    assert source.parse_args({'servers': [{'host': 'a', 'url': 'http://a:1'}]})[0][0]['metrics'] is None


def test_the_rulebook_heals_only_when_holders_complete_is_not_false():
    """The self_heal rulebook's condition names holders_complete; the show rule shows an incomplete host."""
    import yaml  # pylint: disable=import-outside-toplevel

    with open(os.path.join(COLLECTION, 'extensions', 'eda', 'rulebooks', 'self_heal.yml'), encoding='utf-8') as f:
        [ruleset] = yaml.safe_load(f)
    heal, *others = ruleset['rules']
    assert 'event.triton_shm.holders_complete != false' in heal['condition']
    assert any('event.triton_shm.holders_complete == false' in rule['condition'] for rule in others)
