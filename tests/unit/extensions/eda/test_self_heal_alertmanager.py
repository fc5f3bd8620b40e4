"""Unit tests for the Alertmanager rulebook's own plugins: the settings check (a source) and the alert filter."""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
PLUGINS = os.path.join(COLLECTION, 'extensions', 'eda', 'plugins')


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(PLUGINS, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


settings = load('self_heal_settings', 'event_source/self_heal_settings.py')
alerts = load('alertmanager_alerts', 'event_filter/alertmanager_alerts.py')
TOKEN = 'tok-0123456789abcdef'
NOW = datetime.datetime(2026, 12, 3, 12, 0, 0, tzinfo=datetime.timezone.utc)


# -- the settings, checked at start ---------------------------------------------------------------------


@pytest.mark.parametrize(
    'args, words',
    [
        ({'token': TOKEN, 'token_required': True}, 'self_heal_hosts is not set'),
        ({'hosts': 'h1', 'token': TOKEN}, "got the string 'h1': write [h1]"),
        ({'hosts': [], 'token': TOKEN}, 'must be a non-empty list'),
        ({'hosts': {'h1': 1}}, 'must be a non-empty list'),
        ({'hosts': ['h1', 'all']}, "got 'all'"),
        ({'hosts': ['web*']}, "got 'web*'"),
        ({'hosts': [1]}, 'got 1'),
        ({'hosts': ['h1'], 'token_required': True}, 'self_heal_webhook_token is not set'),
        ({'hosts': ['h1'], 'token': '', 'token_required': True}, 'self_heal_webhook_token is not set'),
        ({'hosts': ['h1'], 'token': 's3cret', 'token_required': True}, 'at least 16 characters'),
        ({'hosts': ['h1'], 'token': f' {TOKEN}s3cret', 'token_required': True}, 'without surrounding blanks'),
        ({'hosts': ['h1'], 'token': 12345678901234567, 'token_required': True}, 'must be a string'),
    ],
)
def test_a_wrong_setting_is_refused_by_name(args, words):
    with pytest.raises(settings.ConfigError) as exc:
        asyncio.run(settings.main(asyncio.Queue(), args))
    assert words in str(exc.value) and 's3cret' not in str(exc.value)


def test_good_settings_wait_and_put_nothing():
    async def run():
        queue = asyncio.Queue()
        task = asyncio.create_task(
            settings.main(queue, {'hosts': ['h1', 'gpu-2.example'], 'token': TOKEN, 'token_required': True})
        )
        await asyncio.sleep(0.2)
        assert not task.done() and queue.empty()
        task.cancel()

    asyncio.run(run())


# -- the alerts a rule may see -------------------------------------------------------------------------


def alert(status='firing', ends='0001-01-01T00:00:00Z', **labels):
    return {
        'status': status,
        'labels': {'alertname': 'TritonShmStaleRegions', 'host': 'h1', **labels},
        'annotations': {'summary': 'INJECTED'},
        'startsAt': '2026-12-03T11:00:00Z',
        'endsAt': ends,
        'generatorURL': 'http://prometheus:9090/graph?INJECTED',
        'fingerprint': 'abc',
    }


@pytest.mark.parametrize(
    'event, kept',
    [
        (alert(), True),  # firing, no end
        (alert(ends='2026-12-03T12:04:00.123456789Z'), True),  # firing, ends in the future (nanoseconds)
        (alert(ends='2026-12-03T11:59:30Z'), True),  # within the grace
        (alert(ends='2026-12-03T13:59:30+02:00'), True),  # an offset: 11:59:30 UTC, within the grace
        (alert(ends='2026-12-03T11:58:00Z'), False),  # expired
        (alert(ends='2026-12-03T10:00:00Z'), False),  # replayed two hours later
        (alert(status='resolved'), False),
        (alert(ends='yesterday'), False),  # unreadable: dropped
        (alert(ends=None), False),
        ({'status': 'firing'}, True),  # no endsAt: no end
        ('not an alert', False),
    ],
)
def test_only_firing_unexpired_alerts_are_kept(event, kept):
    assert bool(alerts.main(event, now=NOW)) is kept


def test_a_kept_alert_carries_only_name_host_and_times():
    event = alert(shm_cleanup_mode='all', target='all')
    event['labels']['host'] = 'h1'
    event['meta'] = {'source': {'name': 'alertmanager'}}
    (kept,) = alerts.main(event, now=NOW)
    assert kept == {
        'status': 'firing',
        'startsAt': '2026-12-03T11:00:00Z',
        'endsAt': '0001-01-01T00:00:00Z',
        'fingerprint': 'abc',
        'labels': {'alertname': 'TritonShmStaleRegions', 'host': 'h1'},
        'meta': {'source': {'name': 'alertmanager'}},
    }
    event['labels']['host'] = ['h1', 'h2']  # not a string: dropped, no host
    assert alerts.main(event, now=NOW)[0]['labels'] == {'alertname': 'TritonShmStaleRegions'}
