"""The poller tritonops.shm.triton_shm against hostile servers on 127.0.0.1 (issue 26: findings 11 and 1).

Each server is a real TCP server on loopback (tests/fakes/loopback.py, shared with the module tests)
that answers the status request with what a hostile or broken server sends: a chunk it declares huge
and then streams, a chunk-size line or a trailer that never ends, a byte_size of 401 digits, escape
codes, figures that cannot be true. main() runs as a task, as
ansible-rulebook runs it; memory is measured with tracemalloc, CPU with the process clock.
"""

from __future__ import annotations

import json
import logging
import time
import tracemalloc

import pytest
from test_triton_shm_source import MiB, collect, loopback, run, source  # noqa: E402  pylint: disable=import-error

HEAD_CHUNKED = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n'


def one_event(first: bytes, block: bytes = b'', limit: int = 0, timeout: float = 3.0, shm_bytes: int | None = None):
    """(the first event for a server that sends first then block, tracemalloc peak bytes, CPU seconds, wall seconds)."""

    async def scenario():
        with loopback.Peer(loopback.endless(first, block, limit)) as srv:
            server = {'host': 'evil', 'url': srv.url}
            if shm_bytes:
                server['shm_bytes'] = shm_bytes
            return await collect({'servers': [server], 'interval': 60, 'timeout': timeout}, 1, timeout=timeout + 10)

    tracemalloc.start()
    cpu, wall = time.process_time(), time.monotonic()
    try:
        events = run(scenario())
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return events[0]['triton_shm'], peak, time.process_time() - cpu, time.monotonic() - wall


def test_a_huge_declared_chunk_streamed_forever_is_refused_at_its_size_line():
    # finding 11: 7fffffff, then bytes for ever; before: the poller held all of it (1.5 GB seen), no event till the timeout
    data, peak, _cpu, wall = one_event(HEAD_CHUNKED + b'7fffffff\r\n', b'x' * 65536, limit=200 * MiB)
    assert data['status'] == 'down' and 'larger than %d bytes' % source.poll.MAX_ANSWER_BYTES in data['error'], data
    assert peak < 8 * MiB, peak
    assert wall < 2.5, wall  # refused at once, not at the 3 s timeout


def test_many_small_chunks_past_the_cap_hold_no_more_than_the_cap(monkeypatch):
    monkeypatch.setattr(source.poll, 'MAX_ANSWER_BYTES', 4 * MiB)
    chunk = b'10000\r\n' + b'x' * 65536 + b'\r\n'
    data, peak, _cpu, _wall = one_event(HEAD_CHUNKED, chunk, limit=64 * MiB, timeout=5)
    assert data['status'] == 'down' and 'larger than %d bytes' % (4 * MiB) in data['error'], data
    assert peak < 4 * MiB + 4 * MiB, peak  # the cap, plus the chunks joined once and a read or two


@pytest.mark.parametrize(
    'first, block, why',
    [
        (HEAD_CHUNKED, b'1' * 65536, 'a chunk-size line is longer than 1024 bytes'),
        (
            HEAD_CHUNKED + b'2\r\n[]\r\n0\r\n',
            b'X-Trailer: ' + b'y' * 65536,
            'the trailers of the answer is longer than',
        ),
        (
            b'HTTP/1.1 200 OK\r\nX-Header: ',
            b'z' * 65536,
            'the head of the answer (status line and headers) is longer than',
        ),
    ],
)
def test_lines_that_never_end_are_cut_at_their_bound_without_burning_a_cpu(first, block, why):
    # finding 11: a chunk-size line that never ends burned a CPU (each read searched the whole line again)
    data, peak, cpu, wall = one_event(first, block, limit=256 * MiB, timeout=5)
    assert data['status'] == 'down' and why in data['error'], data
    assert wall < 3 and cpu < 2.5, (wall, cpu)
    assert peak < 4 * MiB, peak


def test_bare_lf_and_a_chunk_without_its_crlf_are_refused():
    for first, why in (
        (b'HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\n[]', 'not HTTP'),
        (HEAD_CHUNKED + b'2\r\n[]XX0\r\n\r\n', 'a chunk does not end where its size says'),
    ):
        data, _peak, _cpu, _wall = one_event(first)
        assert data['status'] == 'down' and why in data['error'], data


def _status(body: bytes, status: bytes = b'200 OK') -> bytes:
    return b'HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' % (status, len(body), body)


def test_a_401_digit_byte_size_gives_a_down_event_every_poll(caplog):
    # finding 11: OverflowError, no event at all ("Task exception was never retrieved" at every poll)
    body = json.dumps([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 10**400}]).encode()
    caplog.set_level(logging.DEBUG)
    data, _peak, _cpu, _wall = one_event(_status(body), shm_bytes=64 * MiB)
    assert data['status'] == 'down' and 'expected an integer from 0 to 2**64 - 1' in data['error'], data
    assert 'never retrieved' not in caplog.text


def test_more_regions_than_the_limit_are_refused_before_parsing():
    # 31 MiB of {},{},... under the 32 MiB cap parsed into ~800 MiB of dicts and blocked the loop for seconds
    assert source.poll.triton_aio.MAX_REGIONS == 200_000  # documented: docs/self-healing.md, the source's DOCUMENTATION
    body = b'[' + b'{},' * 200_000 + b'{}]'
    data, peak, _cpu, _wall = one_event(_status(body))
    assert data['status'] == 'down' and 'more regions than this source reads (at most 200000)' in data['error'], data
    assert peak < 8 * len(body), peak  # the body and its copies, never its objects


def test_escape_codes_and_cr_from_the_server_never_reach_events_or_logs_raw(caplog):
    caplog.set_level(logging.DEBUG)
    evil = b'{"error": "\x1b[2J\x1b[31mpwned\rfake log line\n2026-01-01 INFO all good"}'
    data, _peak, _cpu, _wall = one_event(_status(evil, b'500 Internal Server Error'))
    assert data['status'] == 'down' and '\\x1b[2J' in data['error'] and '\\r' in data['error'], data
    text = json.dumps(data) + caplog.text
    assert '\x1b' not in data['error'] and '\r' not in data['error'] and '\n' not in data['error']
    assert '\x1b' not in caplog.text and '\r' not in caplog.text
    data, _peak, _cpu, _wall = one_event(b'HTTP/1.1 200 \x1b]0;title\x07OK\r\nContent-Length: 2\r\n\r\n[]')
    assert data['status'] == 'down' and '\\x1b]0;title\\x07' in data['error'] and '\x1b' not in text


IMPLAUSIBLE = [
    ([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 1 << 40}], 64 * MiB, 'more than the whole shm filesystem'),
    ([{'name': n, 'key': '/' + n, 'offset': 0, 'byte_size': 40 * MiB} for n in 'ab'], 64 * MiB, '2 regions register'),
    ([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': (1 << 64) - 1}], None, 'more than can be'),
]


@pytest.mark.parametrize('regions, shm_bytes, why', IMPLAUSIBLE)
def test_figures_that_cannot_be_true_never_meet_the_self_heal_condition(regions, shm_bytes, why):
    # finding 1: a fake server's status became an `up` event with an absurd registered_percent (self-heal ran)
    data, _peak, _cpu, _wall = one_event(_status(json.dumps(regions).encode()), shm_bytes=shm_bytes)
    assert data['status'] == 'implausible' and why in data['error'], data
    assert 'registered_percent' not in data and 'threshold_percent' not in data and 'regions' not in data
    # the rulebook's condition: status "up", registered_percent and threshold_percent defined
    assert not (data['status'] == 'up' and 'registered_percent' in data)


def test_a_full_but_true_status_is_still_up_at_100_percent():
    regions = [{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 64 * MiB}]
    data, _peak, _cpu, _wall = one_event(_status(json.dumps(regions).encode()), shm_bytes=64 * MiB)
    assert (data['status'], data['registered_percent']) == ('up', 100.0), data


def test_the_pollers_connections_keep_no_copy_of_the_last_answer():
    """One connection per server, kept between polls: its reader must not hold the last answer (10,000 servers)."""
    conn = source.poll.triton_aio._Connection(source.poll.MAX_ANSWER_BYTES)  # pylint: disable=protected-access
    conn.expect(None)
    conn.reader.feed(b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]')
    assert conn.reader._memo == (b'', None)  # pylint: disable=protected-access
