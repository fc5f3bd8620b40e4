"""The modules' transports against hostile servers on 127.0.0.1 (issue 26, finding 9): bounded time and size, clean errors.

Every HTTP path the modules use is driven: requests (TritonClient as it is), the kept-alive connection
(use_keep_alive) and the bulk selector path (unregister_many). The servers are real sockets that trickle,
declare a huge chunk, stream for ever, or answer a status Triton would never send; gRPC gets a grpcio
servicer that is slow, too large or malformed.
"""
from __future__ import annotations

import json
import socket
import threading
import time

from concurrent import futures

import grpc
import pytest

from tritonclient.grpc import service_pb2_grpc

from ansible_collections.tritonops.shm.plugins.module_utils import http_reader, triton_http, triton_grpc
from ansible_collections.tritonops.shm.plugins.module_utils.errors import MalformedAnswer, TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.triton_http import TritonClient
from ansible_collections.tritonops.shm.plugins.module_utils.triton_grpc import TritonGrpcClient
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.grpc_answers import grpc_status_response

MiB = 1 << 20


class Hostile:
    """A socket server on 127.0.0.1: for each request, answer(sock) writes whatever it wants, then the connection closes."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(16)
        self.url = f'http://127.0.0.1:{self.sock.getsockname()[1]}'
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            data = b''
            while b'\r\n\r\n' not in data:
                part = conn.recv(65536)
                if not part:
                    return
                data += part
            self.answer(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def hostile():
    servers = []

    def start(answer) -> Hostile:
        servers.append(Hostile(answer))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    """A status answer one byte at a time, 0.2 s apart: each wait is short, the whole never ends in time."""
    answer = b'HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n' + b'[' + b' ' * 99998 + b']'
    for byte in answer:
        if stop.wait(0.2):
            return
        conn.sendall(bytes([byte]))


def endless(first: bytes):
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(first)
        block = b'x' * 65536
        while not stop.is_set():
            conn.sendall(block)
    return answer


def canned(data: bytes):
    def answer(conn: socket.socket, _stop: threading.Event) -> None:
        conn.sendall(data)
    return answer


def http_json(body: object) -> bytes:
    raw = json.dumps(body).encode()
    return b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' % (len(raw), raw)


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
    ([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 10 ** 400}], 'has byte_size 1000000000'),
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


@pytest.mark.parametrize('metadata', [{'name': 'triton', 'version': 5, 'extensions': []},
                                      {'name': 'triton', 'version': '2.51.0', 'extensions': [1, 2]},
                                      {'name': 'triton', 'version': '2.51.0', 'extensions': 'system_shared_memory'}])
def test_malformed_metadata_is_a_clean_error(hostile, metadata):
    server = hostile(canned(http_json(metadata)))
    err, _took = timed_failure(TritonClient(server.url).server_metadata)
    assert isinstance(err, MalformedAnswer) and 'not Triton server metadata' in err.msg and server.url in err.msg


def test_the_reader_refuses_what_is_not_strict_http():
    for data, why in ((b'HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n', 'not HTTP'),
                      (b'HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n', 'both'),
                      (b'HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n', 'bad Content-Length'),
                      (b'HTTP/1.1 200 OK\r\n folded\r\n\r\n', 'bad header line'),
                      (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\nzz\r\n', 'bad chunk size'),
                      (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n', 'bad trailer')):
        with pytest.raises(http_reader.HttpError, match=why):
            http_reader.ResponseReader(MiB).feed(data)
    # trailers are read, and the answer ends after them
    reader = http_reader.ResponseReader(MiB)
    resp = reader.feed(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\nX-T: 1\r\n\r\n')
    assert resp.body == b'[]' and reader.leftover == b''


# -- gRPC: the deadline bounds the whole call, the receive size is capped, a bad message is a clean error

class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def SystemSharedMemoryStatus(self, request, context):  # noqa: N802 (grpc API)
        if self.mode == 'slow':
            time.sleep(3)
        regions = [{'name': f'r{i:05d}', 'key': f'/r{i:05d}', 'offset': 0, 'byte_size': 4096} for i in range(2000)]
        return grpc_status_response(regions if self.mode == 'large' else regions[:1])


def _garbage(request, context):  # noqa: ARG001
    return b'\xff\xff\xff\xff not a protobuf message'


@pytest.fixture
def grpc_server():
    servers = []

    def start(mode: str) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        if mode == 'garbage':
            method = grpc.unary_unary_rpc_method_handler(_garbage, request_deserializer=None, response_serializer=None)
            handler = grpc.method_handlers_generic_handler('inference.GRPCInferenceService',
                                                           {'SystemSharedMemoryStatus': method})
            server.add_generic_rpc_handlers((handler,))
        else:
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(mode), server)
        port = server.add_insecure_port('127.0.0.1:0')
        server.start()
        servers.append(server)
        return f'grpc://127.0.0.1:{port}'
    yield start
    for server in servers:
        server.stop(0)


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
