"""The modules' transports against hostile servers on 127.0.0.1 (issue 26, finding 9): bounded time and size, clean errors.

Every HTTP path the modules use is driven: requests (TritonClient as it is), the kept-alive connection
(use_keep_alive) and the bulk selector path (unregister_many). The servers are real sockets that trickle,
declare a huge chunk, stream for ever, or answer a status Triton would never send (tests/fakes/loopback.py,
shared with the integration tests); gRPC gets the unit tests' fake Triton (tests/fakes/fake_triton.py)
slow, too large or malformed.
"""

from __future__ import annotations

import time

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import MalformedAnswer, TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.wire import http_reader, triton_grpc, triton_http
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient
from ansible_collections.tritonops.shm.tests.fakes import loopback
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import GrpcFront, Triton
from ansible_collections.tritonops.shm.tests.fakes.loopback import canned, endless, http_json

MiB = 1 << 20


@pytest.fixture
def hostile():
    """hostile(answer) -> a loopback.Peer answering every request with answer, then closing the connection."""
    servers = []

    def start(answer) -> loopback.Peer:
        servers.append(loopback.Peer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# A status answer one byte at a time, 0.2 s apart: each wait is short, the whole never ends in time.
trickle = loopback.trickle(b'HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n' + b'[' + b' ' * 99998 + b']', 0.2)


PATHS = ['requests', 'keep_alive', 'bulk']


def call(path: str, url: str, timeout: float = 1.0):
    """The call the path makes: a status read (requests, keep_alive) or a bulk unregister of 10 regions."""
    client = TritonClient(url, timeout=timeout)
    if path == 'requests':
        return lambda: client.status('system')
    assert client.use_keep_alive()
    if path == 'keep_alive':
        return lambda: client.status('system')

    def bulk():
        for answer in client.unregister_many('system', [f'r{i}' for i in range(10)]):
            if answer.error is not None:
                raise answer.error

    return bulk


def timed_failure(fn) -> tuple[TritonError, float]:
    start = time.monotonic()
    with pytest.raises(TritonError) as err:
        fn()
    return err.value, time.monotonic() - start


@pytest.mark.parametrize('path', PATHS)
def test_a_trickled_answer_is_cut_at_the_timeout_as_a_whole(hostile, path):
    # before: each byte came within the timeout, so the call ran for the whole trickle (20,000 s here)
    server = hostile(trickle)
    err, took = timed_failure(call(path, server.url, timeout=1.0))
    assert 'no answer within 1.0s (timeout)' in err.msg and server.url in err.msg, err.msg
    assert took < 2.0, took


@pytest.mark.parametrize('path', PATHS)
def test_a_huge_chunk_streamed_for_ever_is_refused_by_its_size(hostile, path):
    server = hostile(endless(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffff\r\n'))
    err, took = timed_failure(call(path, server.url, timeout=5.0))
    assert f'larger than {triton_http.MAX_ANSWER_BYTES} bytes' in err.msg or 'request failed' in err.msg, err.msg
    assert server.url in err.msg and took < 4.0, (err.msg, took)


@pytest.mark.parametrize('path', PATHS)
def test_an_answer_to_the_end_of_the_connection_is_cut_at_the_cap(hostile, path, monkeypatch):
    monkeypatch.setattr(triton_http, 'MAX_ANSWER_BYTES', 2 * MiB)
    server = hostile(endless(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n'))
    err, took = timed_failure(call(path, server.url, timeout=5.0))
    assert f'larger than {2 * MiB} bytes' in err.msg and server.url in err.msg, err.msg
    assert took < 4.0, took


@pytest.mark.parametrize('path', ['requests', 'keep_alive'])
def test_a_content_length_past_the_cap_is_refused_before_the_body(hostile, path):
    server = hostile(canned(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n[' % (triton_http.MAX_ANSWER_BYTES + 1)))
    err, took = timed_failure(call(path, server.url, timeout=5.0))
    assert f'larger than {triton_http.MAX_ANSWER_BYTES} bytes' in err.msg and took < 4.0, (err.msg, took)


MALFORMED = [
    ([{'name': 5, 'key': '/a', 'offset': 0, 'byte_size': 1}], 'region 0 has name 5, expected a string'),
    ([{'key': '/a', 'offset': 0, 'byte_size': 1}], 'region 0 has name missing, expected a string'),
    ([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 'x'}], "has byte_size 'x', expected an integer"),
    ([{'name': 'a', 'key': '/a', 'offset': True, 'byte_size': 1}], 'has offset True, expected an integer'),
    ([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': -1}], 'has byte_size -1, expected an integer'),
    ([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 10**400}], 'has byte_size 1000000000'),
    ([{'name': 'a', 'key': None, 'offset': 0, 'byte_size': 1}], 'has key None, expected a string'),
    ([{'name': 'a\x1b[31m', 'key': 7, 'offset': 0, 'byte_size': 1}], 'has key 7, expected a string'),
]


@pytest.mark.parametrize('path', ['requests', 'keep_alive'])
@pytest.mark.parametrize('regions, why', MALFORMED)
def test_a_malformed_status_is_a_clean_error_naming_the_server(hostile, path, regions, why):
    server = hostile(canned(http_json(regions)))
    err, _took = timed_failure(call(path, server.url))
    assert isinstance(err, MalformedAnswer) and why in err.msg, err.msg
    assert f'read system shared memory status at {server.url}/v2/systemsharedmemory/status' in err.msg
    assert err.failure()['url'] == f'{server.url}/v2/systemsharedmemory/status' and '\x1b' not in err.msg


@pytest.mark.parametrize(
    'metadata',
    [
        {'name': 'triton', 'version': 5, 'extensions': []},
        {'name': 'triton', 'version': '2.51.0', 'extensions': [1, 2]},
        {'name': 'triton', 'version': '2.51.0', 'extensions': 'system_shared_memory'},
    ],
)
def test_malformed_metadata_is_a_clean_error(hostile, metadata):
    server = hostile(canned(http_json(metadata)))
    err, _took = timed_failure(TritonClient(server.url).server_metadata)
    assert isinstance(err, MalformedAnswer) and 'not Triton server metadata' in err.msg and server.url in err.msg


def test_the_reader_refuses_what_is_not_strict_http():
    for data, why in (
        (b'HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n', 'not HTTP'),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n', 'both'),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n', 'bad Content-Length'),
        (b'HTTP/1.1 200 OK\r\n folded\r\n\r\n', 'bad header line'),
        (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\nzz\r\n', 'bad chunk size'),
        (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n', 'bad trailer'),
    ):
        with pytest.raises(http_reader.HttpError, match=why):
            http_reader.ResponseReader(MiB).feed(data)
    # trailers are read, and the answer ends after them
    reader = http_reader.ResponseReader(MiB)
    resp = reader.feed(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\nX-T: 1\r\n\r\n')
    assert resp.body == b'[]' and reader.leftover == b''


# -- gRPC: the deadline bounds the whole call, the receive size is capped, a bad message is a clean error


@pytest.fixture
def grpc_server():
    """grpc_server(mode) -> the URL of a fake Triton whose status is slow (3 s), large (2,000 regions) or garbage."""
    fronts = []

    def start(mode: str) -> str:
        model = Triton()
        for i in range(2000 if mode == 'large' else 1):
            model.list(f'r{i:05d}', byte_size=4096)
        front = GrpcFront(model)
        if mode == 'slow':
            front.slow['SystemSharedMemoryStatus'] = 3
        if mode == 'garbage':
            front.garbage.add('SystemSharedMemoryStatus')
        fronts.append(front)
        return front.url

    yield start
    for front in fronts:
        front.close()


def test_grpc_deadline_size_cap_and_a_malformed_answer_are_clean_errors(grpc_server, monkeypatch):
    err, took = timed_failure(lambda: TritonGrpcClient(grpc_server('slow'), timeout=1.0).status('system'))
    assert 'no answer within 1.0s (timeout)' in err.msg and took < 2.5, (err.msg, took)
    monkeypatch.setattr(triton_grpc, '_MAX_MESSAGE', 10000)
    url = grpc_server('large')
    err, _took = timed_failure(lambda: TritonGrpcClient(url).status('system'))
    assert 'the answer is larger than 10000 bytes' in err.msg and url in err.msg, err.msg
    url = grpc_server('garbage')
    err, _took = timed_failure(lambda: TritonGrpcClient(url).status('system'))
    assert url in err.msg and err.transport == 'grpc', err.msg


ANSWER = b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]'


def test_a_reader_remembers_its_last_small_answer_only_when_asked():
    """The bulk unregister's connection reuses the parse of an answer that repeats; the poller's readers (memo=False)
    keep no copy of the last answer, which at 10,000 servers had cost about 30 MiB (docs/performance.md)."""
    kept = http_reader.ResponseReader(1 << 20)
    first = kept.feed(ANSWER)
    kept.start()
    assert kept.feed(ANSWER) is first  # the same bytes again: the same answer, not parsed again
    plain = http_reader.ResponseReader(1 << 20, memo=False)
    first = plain.feed(ANSWER)
    plain.start()
    again = plain.feed(ANSWER)
    assert again == first and again is not first
    assert plain._memo == (b'', None)  # pylint: disable=protected-access
