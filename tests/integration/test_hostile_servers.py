"""The real modules, run by ansible-playbook, against hostile HTTP servers on 127.0.0.1 (issue 26, finding 9).

A hostile server answers /v2 as Triton does, then answers the status with what Triton never sends:
one byte every 0.5 s, a chunk declared 0x7fffffff bytes long followed by bytes for ever, a body that
never ends, malformed JSON statuses. Each task must fail with a message naming the URL, no traceback,
within its timeout (plus Ansible's start-up), however long the server would go on.
"""

from __future__ import annotations

import json
import time

import ansible_helpers
import loopback
from loopback import canned, endless, http_json, routed, trickle

INFO = 'tritonops.shm.triton_shm_info'
METADATA = {'name': 'triton', 'version': '2.51.0', 'extensions': ['system_shared_memory']}
STATUS = '/v2/systemsharedmemory/status'


def hostile(status: loopback.Respond) -> loopback.Peer:
    """A peer answering GET /v2 as Triton (kept alive), and the status with status (then closing)."""
    return loopback.Peer(routed({STATUS: status}, canned(http_json(METADATA), keep=True)))


def bad(body: object) -> loopback.Respond:
    """A status Triton never sends: body as JSON."""
    return canned(http_json(body))


CASES = {
    'trickle': (
        trickle(b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]' + b' ' * 10000, 0.5),
        'no answer within 3.0s (timeout)',
    ),
    'huge_chunk': (
        endless(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffff\r\n'),
        'larger than 67108864 bytes',
    ),
    'endless_body': (
        endless(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[  '),
        'larger than 67108864 bytes',
    ),
    'name_5': (
        bad([{'name': 5, 'key': '/a', 'offset': 0, 'byte_size': 4096}]),
        'region 0 has name 5, expected a string',
    ),
    'no_name': (bad([{'key': '/a', 'offset': 0, 'byte_size': 4096}]), 'region 0 has name missing'),
    'not_dicts': (bad(['a', 1]), 'expected a JSON list of regions'),
    'byte_size_str': (bad([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': '4k'}]), "has byte_size '4k'"),
    'byte_size_401': (bad([{'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 10**400}]), 'has byte_size 1000'),
    'offset_bool': (bad([{'name': 'a', 'key': '/a', 'offset': False, 'byte_size': 1}]), 'has offset False'),
}


def test_hostile_status_answers_fail_cleanly_and_in_time():
    servers = {name: hostile(status) for name, (status, _why) in CASES.items()}
    try:
        tasks = [
            {'name': name, INFO: {'url': srv.url, 'timeout': 3}, 'register': 'r', 'ignore_errors': True}
            for name, srv in servers.items()
        ]
        play = [
            {
                'name': 'hostile servers',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'tasks': tasks,
            }
        ]
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
