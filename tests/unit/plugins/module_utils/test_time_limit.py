"""A module call keeps its own time limit (time_limit.py, issue 40 goal 2): its requests are bounded by the time left,
none is sent after it, and the call stops by itself at it, with what it did, whoever waits for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.wire import time_limit
from ansible_collections.tritonops.shm.plugins.module_utils.wire.time_limit import TimeLimitReached
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import HttpFront, Triton

MODULE = 'ansible_collections.tritonops.shm.plugins.modules.triton_shm_info'


@pytest.fixture(autouse=True)
def no_limit_left():
    yield
    time_limit.stop()


def test_no_limit_leaves_each_request_its_own_timeout():
    time_limit.start(None)
    assert time_limit.left() is None and time_limit.bound(10.0, 'x') == 10.0


def test_a_request_gets_the_time_left_and_none_is_sent_after_it():
    front = HttpFront(Triton(), delay=5.0)
    try:
        client = TritonClient(front.url, timeout=10.0)
        time_limit.start(1.0)
        start = time.monotonic()
        with pytest.raises((TritonError, TimeLimitReached)):
            client.status('system')
        took = time.monotonic() - start
        assert took < 2.0, took  # not the request's 10 s, nor the 5 s delay
        sent = len(front.requests)
        time.sleep(max(0.0, time_limit.left() or 0.0) + 0.1)
        with pytest.raises(TimeLimitReached, match=r'time_limit=1s\) is reached: .* not sent'):
            time_limit.bound(10.0, 'read status at http://x')
        assert len(front.requests) == sent
    finally:
        time_limit.stop()
        front.close()


def test_the_call_is_interrupted_wherever_it_is_at_the_limit():
    time_limit.start(0.3)
    start = time.monotonic()
    with pytest.raises(TimeLimitReached, match='interrupted'):
        time.sleep(5)  # a scan, a backoff: anything that is not a request
    time_limit.stop()  # the hard exit armed for GRACE seconds later is disarmed
    assert time.monotonic() - start < 2.0


def _module(args: dict, timeout: float = 30) -> tuple[dict, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, '-m', MODULE],
        input=json.dumps({'ANSIBLE_MODULE_ARGS': args}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    )
    took = time.monotonic() - start
    return json.loads(proc.stdout.strip().splitlines()[-1]), took


def test_a_module_stops_by_itself_at_its_time_limit():
    """A server answering every request after 4 s, well inside the 10 s request bound: the module's process ends
    at its 2 s limit with the reason, instead of after every request (it goes on when nobody bounds it)."""
    front = HttpFront(Triton(), delay=4.0)
    try:
        result, took = _module({'url': front.url, 'time_limit': 2, 'shm_dir': '/nonexistent'})
        assert result.get('failed') and 'time_limit=2s) is reached' in result['msg'], result
        assert took < 6.0, took  # the module's start, then at most 2 s
        result, took = _module({'url': front.url, 'time_limit': 0})
        assert result.get('failed') and result['msg'] == 'time_limit must be a positive number of seconds, got 0'
    finally:
        front.close()
