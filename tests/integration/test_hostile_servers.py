"""The real modules, run by ansible-playbook, against hostile HTTP servers on 127.0.0.1 (issue 26, finding 9).

A hostile server answers /v2 as Triton does, then answers the status with what Triton never sends:
one byte every 0.5 s, a chunk declared 0x7fffffff bytes long followed by bytes for ever, a body that
never ends, malformed JSON statuses. Each task must fail with a message naming the URL, no traceback,
within its timeout (plus Ansible's start-up), however long the server would go on.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import ansible_helpers

INFO = 'tritonops.shm.triton_shm_info'
METADATA = json.dumps({'name': 'triton', 'version': '2.51.0', 'extensions': ['system_shared_memory']}).encode()


def _http(body: bytes) -> bytes:
    return b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' % (len(body), body)


class Hostile:
    """Answers GET /v2 as Triton, and the status with status(conn, stop); one thread per connection."""

    def __init__(self, status) -> None:
        self.status = status
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(16)
        self.url = f'http://127.0.0.1:{self.sock.getsockname()[1]}'
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        buf = b''
        try:
            while not self.stop.is_set():
                while b'\r\n\r\n' not in buf:
                    part = conn.recv(65536)
                    if not part:
                        return
                    buf += part
                head, _sep, buf = buf.partition(b'\r\n\r\n')
                if b' /v2/systemsharedmemory/status ' in head.split(b'\r\n')[0] + b' ':
                    self.status(conn, self.stop)
                    return
                conn.sendall(_http(METADATA))
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def trickle(conn, stop):
    for byte in b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]' + b' ' * 10000:
        if stop.wait(0.5):
            return
        conn.sendall(bytes([byte]))


def forever(first):
    def status(conn, stop):
        conn.sendall(first)
        while not stop.is_set():
            conn.sendall(b'x' * 65536)
    return status


def canned(body):
    def status(conn, _stop):
        conn.sendall(_http(json.dumps(body).encode()))
    return status


CASES = {
    'trickle': (trickle, 'no answer within 3.0s (timeout)'),
    'huge_chunk': (forever(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffff\r\n'), 'larger than 67108864 bytes'),
    'endless_body': (forever(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[  '), 'larger than 67108864 bytes'),
    'name_5': (canned([{'name': 5, 'key': '/a', 'offset': 0, 'byte_size': 4096}]), 'region 0 has name 5, expected a string'),
    'no_name': (canned([{'key': '/a', 'offset': 0, 'byte_size': 4096}]), 'region 0 has name missing'),
    'not_dicts': (canned(['a', 1]), 'expected a JSON list of regions'),
    'byte_size_str': (canned([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': '4k'}]), "has byte_size '4k'"),
    'byte_size_401': (canned([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 10 ** 400}]), 'has byte_size 1000'),
    'offset_bool': (canned([{'name': 'a', 'key': '/a', 'offset': False, 'byte_size': 1}]), 'has offset False'),
}


def test_hostile_status_answers_fail_cleanly_and_in_time():
    servers = {name: Hostile(status) for name, (status, _why) in CASES.items()}
    try:
        tasks = [{'name': name, INFO: {'url': srv.url, 'timeout': 3}, 'register': 'r', 'ignore_errors': True}
                 for name, srv in servers.items()]
        play = [{'name': 'hostile servers', 'hosts': 'localhost', 'connection': 'local', 'gather_facts': False,
                 'tasks': tasks}]
        start = time.monotonic()
        res = ansible_helpers.ansible_playbook(play, timeout=600)
        took = time.monotonic() - start
    finally:
        for srv in servers.values():
            srv.close()
    for name, (_status, why) in CASES.items():
        result = res.task(name)
        text = json.dumps(result)
        assert result.get('failed') is True and why in result['msg'], (name, result)
        assert servers[name].url in result['msg'], (name, result['msg'])
        assert 'Traceback' not in text and 'Module failed' not in text, (name, text[-2000:])
    # 9 tasks, 3 of them bounded by the 3 s timeout; before: the trickle alone ran 10,000 x 0.5 s
    assert took < 90, took
