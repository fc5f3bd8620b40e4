"""The event source tritonops.shm.triton_shm against a queue, with fake servers on loopback.

The unit tests' one fake Triton (tests/fakes/fake_triton.py) answers the status over HTTP(S),
and loopback peers (tests/fakes/loopback.py) what a real tritonserver cannot be made to answer
here: garbage, errors, silence. main() runs as a task, as ansible-rulebook runs it; the tests
read the queue, then cancel it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import socket
import ssl
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
SOURCE_PATH = os.path.join(COLLECTION, 'extensions', 'eda', 'plugins', 'event_source', 'triton_shm.py')
sys.path.insert(0, os.path.join(COLLECTION, 'tests', 'integration'))

from proxy_helpers import make_ca, make_cert  # noqa: E402  pylint: disable=wrong-import-position

if COLLECTION.split(os.sep)[-3:] == ['ansible_collections', 'tritonops', 'shm']:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION))))
# pylint: disable=wrong-import-position
from ansible_collections.tritonops.shm.tests.fakes import loopback  # noqa: E402
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import GrpcFront, HttpFront, Reply, Triton  # noqa: E402

_SPEC = importlib.util.spec_from_file_location('triton_shm_source', SOURCE_PATH)
source = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(source)

MiB = 1 << 20
STATUS = '/v2/systemsharedmemory/status'
REGIONS = [
    {'name': 'a', 'key': '/a', 'offset': 0, 'byte_size': 4 * MiB},
    {'name': 'b', 'key': '/b', 'offset': 0, 'byte_size': 2 * MiB},
]


def closed_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def triton(regions: list[dict] | None = None, answer: Reply | loopback.Respond | None = None, **options) -> HttpFront:
    """The fake Triton (2.51) listing regions (REGIONS) over HTTP(S) (options: HttpFront's); answer replaces its status."""
    model = Triton()
    for r in REGIONS if regions is None else regions:
        model.list(r['name'], r['key'], r['byte_size'], r['offset'])
    front = HttpFront(model, **options)
    if answer is not None:
        front.answers[('GET', STATUS)] = answer
    return front


def raw_server(reply: bytes | None) -> loopback.Peer:
    """A peer that writes reply (bytes, or None: says nothing) to whoever asks, then closes."""
    return loopback.Peer(loopback.silent() if reply is None else loopback.canned(reply))


def echo(status: int, text_of) -> loopback.Respond:
    """Answer status with text_of(request) as its body (a server echoing the request back)."""

    def respond(conn: loopback.Conn, request: loopback.Request) -> bool:
        body = text_of(request)  # bytes as they are: a server echoing the header's bytes back
        conn.send(loopback.http_answer(status, body if isinstance(body, bytes) else body.encode(), 'text/plain'))
        return True

    return respond


async def collect(args, count, timeout=15.0):
    """Run main(queue, args) as a task until count events reached the queue; cancel it; return them."""
    queue = asyncio.Queue()
    task = asyncio.create_task(source.main(queue, args))
    events = []
    try:
        while len(events) < count:
            getter = asyncio.ensure_future(queue.get())
            done, _pending = await asyncio.wait({getter, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                if task in done:
                    task.result()  # raises the source's error
                raise AssertionError('only %d of %d events within %ss: %s' % (len(events), count, timeout, events))
            events.append(getter.result())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return events


def run(coro):
    return asyncio.run(coro)


def test_up_server_event_with_percent_polled_every_interval():
    async def scenario():
        with triton() as fake:
            args = {
                'servers': [{'host': 't1', 'url': fake.url, 'shm_bytes': 16 * MiB, 'headers': {'X-Token': 'abc'}}],
                'interval': 0.05,
                'threshold_percent': 80,
            }
            return fake, await collect(args, 3)

    fake, events = run(scenario())
    assert events[0] == {
        'triton_shm': {
            'host': 't1',
            'url': fake.url,
            'status': 'up',
            'regions': 2,
            'registered_bytes': 6 * MiB,
            'registered_percent': 37.5,
            'shm_bytes': 16 * MiB,
            'threshold_percent': 80.0,
            'holders_complete': None,
        },
        'meta': {'hosts': 't1'},
    }
    assert events[1] == events[2] == events[0]
    # read-only: only GETs of the status, with the configured header
    assert [(r.method, r.path) for r in fake.requests] == [('GET', STATUS)] * len(fake.requests)
    assert len(fake.requests) >= 3 and fake.requests[0].header('X-Token') == 'abc'
    assert fake.requests[0].header('Accept') == 'application/json'


def test_a_long_answer_is_read_whole():
    regions = [
        {'name': 'client_%05d' % i, 'key': '/client_%05d' % i, 'offset': 0, 'byte_size': 4096} for i in range(20000)
    ]  # about 1.5 MB: many reads

    async def scenario():
        with triton(regions) as fake:
            return await collect({'servers': [{'host': 'big', 'url': fake.url}], 'interval': 60}, 1)

    data = run(scenario())[0]['triton_shm']
    assert (data['status'], data['regions'], data['registered_bytes']) == ('up', 20000, 20000 * 4096), data


def test_an_endless_answer_is_cut_at_the_limit(monkeypatch):
    monkeypatch.setattr(source.poll, 'MAX_ANSWER_BYTES', 100000)

    async def scenario():
        with triton(answer=Reply.json(['x' * 1000] * 200)) as fake:
            return await collect({'servers': [{'host': 'huge', 'url': fake.url}], 'interval': 60}, 1)

    data = run(scenario())[0]['triton_shm']
    assert data['status'] == 'down' and 'larger than 100000 bytes' in data['error']


def test_percent_only_with_shm_bytes_and_threshold_only_with_percent():
    async def scenario():
        with triton([]) as empty, triton() as fake:
            args = {
                'servers': [
                    {'host': 'nosize', 'url': fake.url},
                    {'host': 'empty', 'url': empty.url + '/', 'shm_bytes': MiB, 'threshold_percent': 10},
                ],
                'interval': 60,
            }
            return await collect(args, 2)

    by_host = dict((e['triton_shm']['host'], e['triton_shm']) for e in run(scenario()))
    assert 'registered_percent' not in by_host['nosize'] and 'threshold_percent' not in by_host['nosize']
    assert by_host['nosize']['registered_bytes'] == 6 * MiB
    assert by_host['empty'] == {
        'host': 'empty',
        'url': by_host['empty']['url'],
        'status': 'up',
        'regions': 0,
        'registered_bytes': 0,
        'registered_percent': 0.0,
        'shm_bytes': MiB,
        'threshold_percent': 10.0,
        'holders_complete': None,
    }


def test_down_server_gives_a_down_event_every_poll_and_one_warning(caplog):
    url = 'http://127.0.0.1:%d' % closed_port()
    caplog.set_level(logging.INFO)
    events = run(collect({'servers': [{'host': 'gone', 'url': url, 'shm_bytes': MiB}], 'interval': 0.05}, 3))
    for event in events:
        data = event['triton_shm']
        assert data['status'] == 'down' and 'cannot connect to Triton' in data['error'] and url in data['error']
        assert set(data) == {'host', 'url', 'status', 'error', 'holders_complete'} and event['meta'] == {
            'hosts': 'gone'
        }
        assert data['holders_complete'] is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and 'gone: Triton is down' in warnings[0].getMessage()


def http(body, status='200 OK', length=None):
    return b'HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s' % (
        status.encode(),
        len(body) if length is None else length,
        body,
    )


@pytest.mark.parametrize(
    'reply, reason',
    [
        (b'\x00\x01garbage that is not HTTP\r\n\r\n', 'not HTTP'),
        (b'SSH-2.0-OpenSSH_9.2\r\n', 'not HTTP'),
        (http(b'<html>hello, nginx!</html>\n'), 'not Triton JSON'),
        (http(b'{"a": 1}'), 'expected a JSON list of regions'),
        (http(b'["a", 1]'), "not a Triton system shared memory status: region 0 is 'a'"),
        (http(b'[{"name": "a", "byte_size": -1}]'), 'region 0 has key missing, expected a string'),
        (
            http(b'[{"name": "a", "key": "/a", "offset": 0, "byte_size": -1}]'),
            'region 0 has byte_size -1, expected an integer from 0 to 2**64 - 1',
        ),
        (
            http(b'[{"name": "a", "key": "/a", "offset": 0, "byte_size": true}]'),
            'region 0 has byte_size True, expected an integer',
        ),
        # the modules refuse what the event source refuses: a size as a string is not Triton's uint64
        (
            http(b'[{"name": "a", "key": "/a", "offset": 0, "byte_size": "4096"}]'),
            "region 0 has byte_size '4096', expected an integer",
        ),
        (http(b'{"error": "boom"}', status='500 Internal Server Error'), 'HTTP 500: {"error": "boom"}'),
        (http(b'[{"name"', length=1000), 'the answer was cut short'),
    ],
)
def test_garbage_answers_are_down_with_the_reason(reply, reason):
    async def scenario():
        with raw_server(reply) as raw:
            return raw, await collect(
                {'servers': [{'host': 'odd', 'url': raw.url, 'shm_bytes': MiB}], 'interval': 60, 'timeout': 2}, 1
            )

    raw, events = run(scenario())
    data = events[0]['triton_shm']
    assert data['status'] == 'down' and reason in data['error'] and raw.url in data['error'], data
    assert 'regions' not in data and 'registered_percent' not in data


def test_silent_server_times_out_without_blocking_the_loop():
    async def scenario():
        ticks = []

        async def ticker():
            while True:
                ticks.append(1)
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        with raw_server(None) as silent, triton() as fake:
            args = {
                'servers': [{'host': 'silent', 'url': silent.url}, {'host': 'ok', 'url': fake.url}],
                'interval': 60,
                'timeout': 1,
            }
            events = await collect(args, 2)
        tick.cancel()
        return events, len(ticks)

    events, ticks = run(scenario())
    by_host = dict((e['triton_shm']['host'], e['triton_shm']) for e in events)
    assert by_host['silent']['status'] == 'down' and 'no answer within 1.0s (timeout)' in by_host['silent']['error']
    assert by_host['ok']['status'] == 'up'
    # the loop kept running other tasks during the 1 s wait (a blocking call would give ~0 ticks)
    assert ticks >= 30


def test_secrets_never_reach_events_or_logs(caplog):
    secret, password = 's3cr3t-t0ken', 'pa55w0rd'

    # a hostile or misconfigured server echoing the request (and its credentials) back
    echo_headers = echo(403, lambda request: 'denied: %s %s' % (request.header('X-Api-Key'), password))

    async def scenario():
        with triton(answer=echo_headers) as fake:
            url = fake.url.replace('://', '://admin:%s@' % password)
            return fake, await collect(
                {'servers': [{'host': 'h', 'url': url}], 'interval': 60, 'headers': {'X-Api-Key': secret}}, 1
            )

    caplog.set_level(logging.DEBUG)
    fake, events = run(scenario())
    text = json.dumps(events) + '\n'.join(r.getMessage() for r in caplog.records)
    assert 'HTTP 403' in text and '***@127.0.0.1' in text
    assert 's3cr3t' not in text and password not in text
    first = fake.requests[0]
    assert first.header('X-Api-Key') == secret and first.header('Authorization').startswith('Basic ')


SECRET = 'S3cr3tT0k3nValue0123456789'


@pytest.mark.parametrize(
    'headers, url_user, body_of',
    [
        # a 401 text that echoes the token alone, without its scheme word
        ({'Authorization': f'Bearer {SECRET}'}, '', lambda request: f'invalid token {SECRET}'),
        # the whole header value where the 120-character snippet cuts it: no part of it may show
        ({'Authorization': f'Bearer {SECRET}'}, '', lambda request: 'x' * 97 + ' ' + request.header('Authorization')),
        # the Basic credentials of the URL, cut the same way
        ({}, 'admin:Sup3rSecretPassw0rd@', lambda request: 'y' * 100 + ' ' + request.header('Authorization')),
    ],
    ids=['token-alone', 'cut-header', 'cut-basic'],
)
def test_a_secret_echoed_alone_or_cut_by_the_snippet_never_shows(headers, url_user, body_of):
    async def scenario():
        with triton(answer=echo(500, body_of)) as fake:
            url = fake.url.replace('://', f'://{url_user}')
            return await collect({'servers': [{'host': 'h', 'url': url, 'headers': headers}], 'interval': 60}, 1)

    error = run(scenario())[0]['triton_shm']['error']
    assert 'HTTP 500' in error and '********' in error, error
    for secret in (SECRET, 'Sup3rSecretPassw0rd', 'YWRtaW46U3VwM3JTZWNyZXRQYXNzdzByZA=='):
        assert not any(secret[:n] in error for n in range(6, len(secret) + 1)), (secret, error)


LATIN1_SECRET = 'Sécrèt-Tökèn-Välue-0123456789'


def test_a_secret_beyond_ascii_echoed_as_its_bytes_never_shows():
    """A header goes out in Latin-1: a server echoing its bytes gives a body that reads, as UTF-8, with U+FFFD where
    the secret has a character beyond ASCII; that form is hidden too (it read as S\ufffdcr\ufffdt-... before)."""

    async def scenario():
        reply = echo(500, lambda request: b'bad token ' + request.header('Authorization').encode('latin-1'))
        with triton(answer=reply) as fake:
            servers = [{'host': 'h', 'url': fake.url, 'headers': {'Authorization': f'Bearer {LATIN1_SECRET}'}}]
            return await collect({'servers': servers, 'interval': 60}, 1)

    error = run(scenario())[0]['triton_shm']['error']
    assert 'HTTP 500' in error and 'bad token' in error and '********' in error, error
    assert 'lue-0123' not in error and 'k\ufffdn' not in error and '\\ufffd' not in error, error


@pytest.mark.parametrize(
    'reply',
    [
        b'x' * 50 + f' {SECRET}\r\n\r\n'.encode(),  # not HTTP: its first 60 bytes are shown
        b'HTTP/1.1 200 OK\r\n' + b'y' * 70 + f' {SECRET}\r\n\r\n'.encode(),  # a bad header line: 80 shown
    ],
    ids=['not-http', 'bad-header'],
)
def test_a_secret_in_an_answer_the_reader_refuses_never_shows_even_cut(reply):
    async def scenario():
        with raw_server(reply) as peer:
            server = {'host': 'h', 'url': peer.url, 'headers': {'Authorization': f'Bearer {SECRET}'}}
            return await collect({'servers': [server], 'interval': 60}, 1)

    error = run(scenario())[0]['triton_shm']['error']
    assert 'not HTTP' in error and '***' in error, error
    assert not any(SECRET[:n] in error for n in range(6, len(SECRET) + 1)), error


@pytest.mark.parametrize(
    'args, message',
    [
        ({}, 'servers must be a non-empty list'),
        ({'servers': []}, 'servers must be a non-empty list'),
        ({'servers': ['t1']}, 'must be a dict'),
        ({'servers': [{'host': 'all', 'url': 'http://a:1'}]}, "not 'all', not a pattern"),
        ({'servers': [{'host': 'web*', 'url': 'http://a:1'}]}, 'not a pattern'),
        ({'servers': [{'host': 'a,b', 'url': 'http://a:1'}]}, 'not a pattern'),
        ({'servers': [{'host': '!a', 'url': 'http://a:1'}]}, 'not a pattern'),
        ({'servers': [{'url': 'http://a:1'}]}, 'host must be one inventory host name'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1'}, {'host': 'a', 'url': 'http://b:1'}]}, 'listed twice'),
        ({'servers': [{'host': 'a'}]}, 'url is required'),
        ({'servers': [{'host': 'a', 'url': 'ftp://a:1'}]}, 'not an http(s) URL'),
        ({'servers': [{'host': 'a', 'url': 'http://a:99999'}]}, 'invalid port'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1', 'shm_bytes': -1}]}, 'shm_bytes must be greater than 0'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1', 'shm_bytes': 'lots'}]}, 'shm_bytes must be a number'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1', 'shm': 1}]}, 'unknown keys shm'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1'}], 'interval': 0}, 'interval must be greater than 0'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1'}], 'interval': 'nan'}, 'interval must be a finite number'),
        ({'servers': [{'host': 'a', 'url': 'http://a:1'}], 'timeout': 'x'}, 'timeout must be a number'),
        (
            {'servers': [{'host': 'a', 'url': 'http://a:1', 'validate_certs': 'maybe'}]},
            'validate_certs must be a boolean',
        ),
        (
            {'servers': [{'host': 'a', 'url': 'https://a:1', 'ca_path': '/nonexistent/ca.pem'}]},
            # the modules' wording (tls.LOAD_FAILED), one for every HTTPS transport
            'cannot load the TLS files (ca_path, client_cert, client_key): ',
        ),
    ],
)
def test_bad_arguments_fail_before_polling(args, message):
    with pytest.raises(source.ConfigError, match=message.replace('(', r'\(').replace(')', r'\)').replace('*', r'\*')):
        source.parse_args(args)


def test_header_with_a_line_break_is_refused_without_echoing_its_value():
    with pytest.raises(source.ConfigError) as err:
        source.parse_args({'servers': [{'host': 'a', 'url': 'http://a:1'}], 'headers': {'X-Key': 'hunter2\r\nX: y'}})
    assert 'X-Key' in str(err.value) and 'hunter2' not in str(err.value)


def test_per_server_options_override_the_global_ones():
    servers, interval = source.parse_args(
        {
            'servers': [
                {'host': 'a', 'url': '127.0.0.1:8000', 'timeout': 3, 'headers': {'X': '1'}},
                {'host': 'b', 'url': 'http://u:p@127.0.0.2:8000/', 'threshold_percent': '90'},
            ],
            'interval': '5',
            'timeout': 7,
            'headers': {'X': 'global'},
            'threshold_percent': 80,
        }
    )
    assert interval == 5.0
    assert (servers[0]['url'], servers[0]['timeout'], servers[0]['headers']) == (
        'http://127.0.0.1:8000',
        3.0,
        {'X': '1'},
    )
    assert (servers[1]['timeout'], servers[1]['headers'], servers[1]['threshold_percent']) == (
        7.0,
        {'X': 'global'},
        90.0,
    )
    assert servers[1]['shown_url'] == 'http://***@127.0.0.2:8000' and servers[0]['ssl'] is None


def test_tls_options_work_as_in_the_modules(tmp_path):
    ca = make_ca(str(tmp_path), 'ca')
    cert = make_cert(str(tmp_path), 'server', ca)
    client = make_cert(str(tmp_path), 'client', ca, server=False)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert['cert'], cert['key'])
    mtls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    mtls.load_cert_chain(cert['cert'], cert['key'])
    mtls.load_verify_locations(ca['cert'])
    mtls.verify_mode = ssl.CERT_REQUIRED

    async def scenario():
        with triton(tls=context) as fake, triton(tls=mtls) as strict:
            cases = {
                'untrusted': {'url': fake.url},
                'ca_path': {'url': fake.url, 'ca_path': ca['cert']},
                'ca_dir': {'url': fake.url, 'ca_path': str(tmp_path)},
                'no_verify': {'url': fake.url, 'validate_certs': False},
                'no_client_cert': {'url': strict.url, 'ca_path': ca['cert']},
                'client_cert': {
                    'url': strict.url,
                    'ca_path': ca['cert'],
                    'client_cert': client['cert'],
                    'client_key': client['key'],
                },
            }
            # a CA directory needs the hashed names openssl rehash makes
            subprocess.run(['openssl', 'rehash', str(tmp_path)], check=True, capture_output=True)
            servers = [dict(host=name, **opts) for name, opts in cases.items()]
            return await collect({'servers': servers, 'interval': 60, 'timeout': 5}, len(servers))

    by_host = dict((e['triton_shm']['host'], e['triton_shm']) for e in run(scenario()))
    assert 'TLS verification failed' in by_host['untrusted']['error']
    assert by_host['no_client_cert']['status'] == 'down'
    for name in ('ca_path', 'ca_dir', 'no_verify', 'client_cert'):
        assert by_host[name]['status'] == 'up' and by_host[name]['registered_bytes'] == 6 * MiB, by_host[name]


def _sockets_to(port: int) -> int:
    """The sockets this process holds open to a peer's port: its open socket inodes that the kernel's TCP tables list
    with that remote port (other tests' sockets, closing meanwhile, never count)."""
    inodes = set()
    for fd in os.listdir('/proc/self/fd'):
        try:
            link = os.readlink(f'/proc/self/fd/{fd}')
        except OSError:
            continue
        if link.startswith('socket:['):
            inodes.add(link[len('socket:[') : -1])
    found = 0
    for table in ('/proc/self/net/tcp', '/proc/self/net/tcp6'):
        try:
            with open(table, encoding='ascii') as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            found += int(fields[2].rsplit(':', 1)[1], 16) == port and fields[9] in inodes
    return found


def test_a_tls_answer_on_a_connection_not_kept_releases_its_socket_at_once(tmp_path):
    """A TLS peer that answers, then neither reads nor closes (it never sends its close_notify): the poll's socket is
    released when the answer is complete, not after asyncio's 30 s TLS shutdown (metrics requests, servers beyond the
    open-file budget)."""
    ca = make_ca(str(tmp_path), 'ca')
    cert = make_cert(str(tmp_path), 'server', ca)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert['cert'], cert['key'])
    answer = loopback.http_json(REGIONS)

    def answer_then_hold(conn: loopback.Conn, _request: loopback.Request) -> bool:
        conn.send(answer)
        conn.stop.wait(30)  # holds its end open, reading nothing
        return False

    async def scenario(peer):
        servers, _interval = source.parse_args(
            {'servers': [{'host': 'h', 'url': peer.url, 'ca_path': ca['cert'], 'timeout': 5}]}
        )
        target = source.poll.Target(servers[0], False)
        loop = asyncio.get_running_loop()
        port, lingering = int(peer.url.rsplit(':', 1)[1].split('/')[0]), []
        for _poll in range(3):
            event = await target.poll(loop)
            assert event['triton_shm']['status'] == 'up', event
            await asyncio.sleep(0.2)
            lingering.append(_sockets_to(port))  # the poll's own end; the peer's ends have the port as theirs
        return lingering

    with loopback.Peer(answer_then_hold, tls=context) as peer:
        assert run(scenario(peer)) == [0, 0, 0]


def test_runs_alone_with_a_mock_queue():
    """python triton_shm.py URL SHM_BYTES prints events (the source's __main__)."""
    url = 'http://127.0.0.1:%d' % closed_port()
    proc = subprocess.Popen(
        [sys.executable, SOURCE_PATH, url, '1024'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert "'host': 'localhost'" in line and "'status': 'down'" in line and url in line


# ---- fleet size: spreading, keep-alive, slow servers (issue 22) ----


def counting(delay: float = 0.0, chunked: bool = False, keepalive_timeout: float | None = None) -> HttpFront:
    """The fake Triton listing REGIONS, each answer held delay seconds, chunked, idle connections closed."""
    return triton(delay=delay, chunks=2 if chunked else 0, idle=keepalive_timeout)


async def run_for(args, seconds):
    """main(queue, args) as a task for seconds, the queue as ansible-rulebook makes it (size 1); (time, event) pairs."""
    queue = asyncio.Queue(1)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(source.main(queue, args))
    events = []
    deadline = loop.time() + seconds
    try:
        while loop.time() < deadline:
            try:
                event = await asyncio.wait_for(queue.get(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            events.append((loop.time(), event))
        assert not task.done(), task.exception()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return events


def by_host(events):
    out = {}
    for when, event in events:
        out.setdefault(event['triton_shm']['host'], []).append((when, event['triton_shm']))
    return out


def test_slow_and_dead_servers_delay_no_one_and_every_server_keeps_its_place():
    interval = 0.4

    async def scenario():
        with counting() as fast, raw_server(None) as silent:
            servers = [{'host': 'fast%02d' % i, 'url': fast.url} for i in range(30)]
            servers[5:5] = [
                {'host': 'silent', 'url': silent.url, 'timeout': 3},
                {'host': 'dead', 'url': 'http://127.0.0.1:%d' % closed_port()},
            ]
            return fast, await run_for({'servers': servers, 'interval': interval, 'timeout': 1}, 2.1)

    fast, events = run(scenario())
    hosts = by_host(events)
    for i in range(30):
        polls = hosts['fast%02d' % i]
        assert len(polls) in (5, 6) and all(d['status'] == 'up' for _t, d in polls), polls
        # each poll keeps its place on the server's schedule (k * interval from a start): one poll late under load
        # (its first, connecting on a loaded machine, came 0.27 s late in a CI lane) is no drift; a server that held
        # the loop up would shift every later poll, so more than one would be off the median place
        offsets = [t - k * interval for k, (t, _d) in enumerate(polls)]
        place = sorted(offsets)[len(offsets) // 2]
        assert sum(abs(o - place) >= interval * 0.5 for o in offsets) <= 1, offsets
    # the polls of one round are spread: 32 servers start 0.01 s apart, not all at once
    first = sorted(polls[0][0] for name, polls in hosts.items() if name.startswith('fast'))
    assert first[-1] - first[0] > 0.2
    assert [d['status'] for _t, d in hosts['dead']] == ['down'] * len(hosts['dead']) and len(hosts['dead']) >= 5
    # the silent server times out after 3 s, more than the run: no event yet, and it held no one up
    assert 'silent' not in hosts
    # one connection per server, kept open between polls
    assert len(fast.by_connection()) == 30 and all(len(reqs) >= 5 for reqs in fast.by_connection().values())


def test_a_timeout_longer_than_the_interval_never_polls_one_server_twice_at_once():
    async def scenario():
        with counting(delay=0.25) as slow:
            return slow, await run_for({'servers': [{'host': 'slow', 'url': slow.url}], 'interval': 0.1}, 1.2)

    slow, events = run(scenario())
    polls = by_host(events)['slow']
    assert slow.most_busy == 1
    assert 3 <= len(polls) <= 5 and all(d['status'] == 'up' for _t, d in polls), polls
    gaps = [b[0] - a[0] for a, b in zip(polls, polls[1:])]
    # one at a time (never under the answer's 0.25 s), back to back (the median: one poll late under load is no rule)
    assert all(gap > 0.2 for gap in gaps) and sorted(gaps)[len(gaps) // 2] < 0.4, gaps


def test_chunked_answers_and_a_server_closing_idle_connections_are_read_up():
    async def scenario():
        with counting(chunked=True) as chunked, counting(keepalive_timeout=0.05) as closing:
            args = {
                'servers': [
                    {'host': 'chunked', 'url': chunked.url, 'shm_bytes': 16 * MiB},
                    {'host': 'closing', 'url': closing.url, 'shm_bytes': 16 * MiB},
                ],
                'interval': 0.2,
            }
            return closing, await run_for(args, 0.9)

    closing, events = run(scenario())
    hosts = by_host(events)
    for name in ('chunked', 'closing'):
        assert len(hosts[name]) >= 4, hosts
        assert all(
            (d['status'], d['registered_bytes'], d['registered_percent']) == ('up', 6 * MiB, 37.5)
            for _t, d in hosts[name]
        ), hosts[name]
    assert len(closing.by_connection()) == len(hosts['closing'])  # it closed each one: a new one every poll


def test_a_kept_alive_connection_closed_under_the_request_is_sent_again_on_a_new_one():
    answer = http(json.dumps(REGIONS).encode())
    seen = []

    def first_only(conn: loopback.Conn, _request: loopback.Request) -> bool:
        # answers the first request of each connection, then closes it when the next one comes
        if conn.peer in seen:
            return False
        seen.append(conn.peer)
        conn.send(answer)
        return True

    async def scenario():
        with loopback.Peer(first_only) as server:
            return await run_for({'servers': [{'host': 'h', 'url': server.url}], 'interval': 0.1}, 0.55)

    polls = by_host(run(scenario()))['h']
    assert len(polls) >= 4 and all(d['status'] == 'up' and d['regions'] == 2 for _t, d in polls), polls
    assert len(seen) >= len(polls)


@pytest.mark.parametrize(
    'reply, status',
    [
        (b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n' + json.dumps(REGIONS).encode(), 'up'),
        (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx', 'transfer encoding this source does not read'),
        (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[]', 'cut short'),
        (b'HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n[]', 'bad Content-Length'),
        (b'HTTP/1.1 301 Moved\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n', 'HTTP 301: Moved'),
    ],
)
def test_answers_read_to_the_end_of_the_connection_and_odd_framings(reply, status):
    async def scenario():
        with raw_server(reply) as raw:
            return await collect({'servers': [{'host': 'h', 'url': raw.url}], 'interval': 60, 'timeout': 2}, 1)

    data = run(scenario())[0]['triton_shm']
    if status == 'up':
        assert (data['status'], data['regions'], data['registered_bytes']) == ('up', 2, 6 * MiB), data
    else:
        assert data['status'] == 'down' and status in data['error'], data


def test_basic_credentials_are_sent_and_never_shown(caplog):
    async def scenario():
        with triton(answer=echo(401, lambda request: 'who is %s?' % request.header('Authorization'))) as fake:
            url = fake.url.replace('://', '://us%40er:p%3Ass@')
            return fake, await collect({'servers': [{'host': 'h', 'url': url}], 'interval': 60}, 1)

    caplog.set_level(logging.DEBUG)
    fake, events = run(scenario())
    sent = fake.requests[0].header('Authorization')
    assert sent == 'Basic dXNAZXI6cDpzcw=='  # base64 of the decoded us@er:p:ss
    text = json.dumps(events) + '\n'.join(r.getMessage() for r in caplog.records)
    assert 'HTTP 401' in text and 'dXNAZXI6cDpzcw' not in text and 'p%3Ass' not in text


def test_beyond_the_open_file_limit_servers_get_a_new_connection_per_poll(monkeypatch):
    class Limits:
        RLIMIT_NOFILE, RLIM_INFINITY = 7, -1
        set_to = []

        @staticmethod
        def getrlimit(_which):
            return (258, 261)

        @classmethod
        def setrlimit(cls, _which, limits):
            cls.set_to.append(limits)

    monkeypatch.setattr(source, 'resource', Limits)

    async def scenario():
        with counting() as fast:
            servers = [{'host': 'h%d' % i, 'url': fast.url} for i in range(6)]
            return fast, await run_for({'servers': servers, 'interval': 0.3, 'timeout': 0.2}, 1.0)

    fast, events = run(scenario())
    assert Limits.set_to == [(261, 261)]  # raised to the hard limit, not beyond (6 servers + 256 wanted)
    assert all(d['status'] == 'up' for _t, d in sum(by_host(events).values(), []))
    # 261 - 256 reserved - at most 6 in flight: no server keeps its connection
    assert all(len(reqs) == 1 and reqs[0].header('Connection') == 'close' for reqs in fast.by_connection().values())


def test_rules_that_fall_behind_get_each_servers_latest_event_not_a_backlog():
    async def scenario():
        with counting() as fast:
            queue = asyncio.Queue(1)  # as ansible-rulebook gives it; nobody takes from it for 20 intervals
            task = asyncio.create_task(
                source.main(
                    queue, {'servers': [{'host': 'h%d' % i, 'url': fast.url} for i in range(3)], 'interval': 0.05}
                )
            )
            await asyncio.sleep(1.0)
            fast.delay = 60  # hold the answers while the queue drains: this fake answers from its own threads
            backlog = []
            while not queue.empty():
                backlog.append(queue.get_nowait())
                await asyncio.sleep(0)  # let the source hand over what it holds
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return fast, backlog

    fast, backlog = run(scenario())
    assert sum(len(reqs) for reqs in fast.by_connection().values()) >= 30  # the polls went on
    # one event in the queue, one on its way to it, then at most the newest of each server: no backlog of 60
    assert 3 <= len(backlog) <= 5, backlog
    assert len({e['triton_shm']['host'] for e in backlog[2:]}) == len(backlog) - 2


def test_grpc_urls_are_accepted_as_in_the_modules_and_their_options_checked(tmp_path):
    servers, _interval = source.parse_args(
        {
            'servers': [
                {'host': 'g1', 'url': 'grpc://127.0.0.1:8001', 'headers': {'Triton-GRPC-Protocol-Shm-Key': 'v'}},
                {'host': 'g2', 'url': 'grpcs://triton.example', 'ca_path': make_ca(str(tmp_path), 'ca')['cert']},
                {'host': 'h1', 'url': 'http://127.0.0.1:8000'},
            ]
        }
    )
    g1, g2, h1 = servers
    assert g1['grpc'].target == '127.0.0.1:8001' and g1['grpc'].metadata == (('triton-grpc-protocol-shm-key', 'v'),)
    assert g1['grpc'].credentials is None and g2['grpc'].target == 'triton.example:8001'
    assert g2['grpc'].credentials is not None and h1['grpc'] is None
    for item, why in (
        ({'url': 'grpc://a:1/v2'}, 'a gRPC URL is grpc://HOST:PORT'),
        ({'url': 'grpcs://a:1', 'validate_certs': False}, 'validate_certs=false is not possible with grpcs://a:1'),
        ({'url': 'grpc://a:1', 'headers': {'x-bin': 'v'}}, 'cannot be sent as gRPC metadata'),
        ({'url': 'grpcs://a:1', 'ca_path': str(tmp_path / 'missing.pem')}, 'cannot read ca_path'),
    ):
        with pytest.raises(source.ConfigError, match=why):
            source.parse_args({'servers': [dict(item, host='g')]})


def test_a_grpc_server_back_after_an_outage_is_up_at_the_next_poll():
    """A kept grpc.aio channel that failed to connect waits in gRPC's reconnect backoff (1 s, growing to 120 s) and
    fails every call meanwhile: a restarted server was reported down for seconds more. The channel is dropped on
    UNAVAILABLE, so the next poll connects afresh."""
    pytest.importorskip('grpc')
    port = closed_port()

    async def scenario():
        servers, _interval = source.parse_args({'servers': [{'host': 'g', 'url': f'grpc://127.0.0.1:{port}'}]})
        target = source.poll.Target(servers[0], True)
        loop = asyncio.get_running_loop()
        try:
            away = (await target.poll(loop))['triton_shm']
            with GrpcFront(Triton(), port=port):
                back = (await target.poll(loop))['triton_shm']
        finally:
            await target.close()
        return away, back

    away, back = run(scenario())
    assert away['status'] == 'down' and 'cannot connect to Triton over gRPC' in away['error'], away
    assert back['status'] == 'up', back


def test_a_grpc_answer_with_more_regions_than_the_limit_is_refused_before_its_regions_become_dicts(monkeypatch):
    """The HTTP answer's cap (MAX_REGIONS, counted before json.loads) holds over gRPC too: counted on the message."""
    pytest.importorskip('grpc')
    monkeypatch.setattr(source.poll.triton_aio, 'MAX_REGIONS', 3)
    triton = Triton()
    for n in 'abcd':
        triton.list(n, '/' + n, 16)
    made = []
    monkeypatch.setattr(source.poll.records, 'from_message', lambda kind, r: made.append(r) or {})

    async def scenario(url):
        servers, _interval = source.parse_args({'servers': [{'host': 'g', 'url': url}]})
        target = source.poll.Target(servers[0], False)
        return (await target.poll(asyncio.get_running_loop()))['triton_shm']

    with GrpcFront(triton) as front:
        data = run(scenario(front.url))
    assert data['status'] == 'down' and 'holds 4 regions, more than this source reads (at most 3)' in data['error']
    assert made == [], 'no region became a dict'
