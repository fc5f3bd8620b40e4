"""Unit tests for module_utils/wire/triton_http.py: URL handling and the mapping of every failure to a clear TritonError.

Requests go over real HTTP(S) to the unit tests' fake Triton (tests/fakes/fake_triton.py) on
loopback ports, which answers as Triton 2.51 and what a test scripts: the answers a real Triton
never gives (HTML, a list where a dict belongs, no version, ...) and the ones that are hard to get
from it on demand (in use, 500). A real TLS server with a certificate made by openssl covers
verification and client certificates.
The only fake below the HTTP layer is a connect timeout, which loopback cannot produce.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import threading
import time

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ModelControlRefused,
    Restricted,
    ShmFsError,
    TritonError,
    UnaddressableName,
)
from ansible_collections.tritonops.shm.plugins.module_utils.run import base
from ansible_collections.tritonops.shm.plugins.module_utils.wire import triton_grpc, triton_http
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient
from ansible_collections.tritonops.shm.tests.fakes import loopback
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import MODEL_CONTROL, HttpFront, Reply, Triton


@pytest.fixture
def serve():
    """serve(routes, tls=None, model=None) -> the fake Triton (2.51) over HTTP(S), routes[(method, path)] scripted.

    A route's answer is (status, content_type, body); every other route is the model's, as Triton answers it.
    """
    fronts = []

    def start(routes, tls=None, model=None):
        front = HttpFront(model or Triton(), tls=tls)
        front.answers.update({route: Reply(status, body, ctype) for route, (status, ctype, body) in routes.items()})
        fronts.append(front)
        return front

    yield start
    for front in fronts:
        front.close()


def jsonr(obj, status=200):
    return (status, 'application/json', json.dumps(obj))


# the text of Triton 2.51 (checked against the real server in tests/integration/test_triton_shm_region.py)
IN_USE = "Cannot unregister shared memory region '{}', it is currently in use."
METADATA = jsonr(dict(name='triton', version='2.51.0', extensions=['system_shared_memory']))


# -- URLs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'url,base,host,port,scheme',
    [
        ('127.0.0.1:8000', 'http://127.0.0.1:8000', '127.0.0.1', 8000, 'http'),
        ('http://127.0.0.1:8000/', 'http://127.0.0.1:8000', '127.0.0.1', 8000, 'http'),
        ('  http://localhost  ', 'http://localhost', 'localhost', 80, 'http'),
        ('https://triton.example.com', 'https://triton.example.com', 'triton.example.com', 443, 'https'),
        ('http://[::1]:8000', 'http://[::1]:8000', '::1', 8000, 'http'),
    ],
)
def test_url_forms(url, base, host, port, scheme):
    client = TritonClient(url)
    assert (client.base, client.host, client.port, client.scheme) == (base, host, port, scheme)


@pytest.mark.parametrize(
    'url,why',
    [
        ('ftp://127.0.0.1:8000', 'is not an http(s) URL'),
        ('http://', 'is not an http(s) URL'),
        ('', 'is not an http(s) URL'),
        ('http://127.0.0.1:99999', 'has an invalid port'),
        ('http://127.0.0.1:port', 'has an invalid port'),
    ],
)
def test_bad_urls_are_refused(url, why):
    with pytest.raises(TritonError) as err:
        TritonClient(url)
    assert why in err.value.msg


@pytest.mark.parametrize(
    'kind,name,path',
    [
        ('system', 'input0', '/v2/systemsharedmemory/region/input0'),
        ('system', 'a%41b', '/v2/systemsharedmemory/region/a%41b'),
        ('system', "r-1._~!$&'()*+,;=:@", "/v2/systemsharedmemory/region/r-1._~!$&'()*+,;=:@"),
        ('cuda', 'gpu', '/v2/cudasharedmemory/region/gpu'),
    ],
)
def test_region_path_sends_the_name_byte_for_byte(kind, name, path):
    assert triton_http.region_path(kind, name) == path


@pytest.mark.parametrize('name', ['a/b', 'a b', 'a?b', 'a#b', 'caf\u00e9', 'tab\t', ''])
def test_region_names_http_cannot_carry_are_refused_before_sending(name):
    with pytest.raises(TritonError) as err:
        triton_http.region_path('system', name)
    assert err.value.unaddressable is True
    assert "cannot be addressed over Triton's HTTP API" in err.value.msg


def test_region_path_refuses_an_unknown_kind():
    with pytest.raises(ValueError):
        triton_http.region_path('gpu', 'x')


# -- requests that work -----------------------------------------------------------------------------


def test_headers_status_and_register_bodies_reach_the_server(serve):
    model = Triton('2.51.0')
    model.list('r', byte_size=64)
    srv = serve({}, model=model)
    client = TritonClient(srv.url, headers={'Authorization': 'Bearer t0k', 'X-Num': 7})
    assert client.server_metadata()['version'] == '2.51.0'
    assert client.status('system') == [dict(name='r', key='/r', offset=0, byte_size=64)]
    client.register('system', 'a%41b', dict(key='/a_b', offset=16, byte_size=4096))
    client.unregister('system', 'a%41b')
    client.register('cuda', 'g', dict(raw_handle='aGFuZGxl', device_id=0, byte_size=1024))
    first = srv.requests[0].headers
    assert first['Authorization'] == 'Bearer t0k' and first['X-Num'] == '7' and first['Accept'] == 'application/json'
    reg = srv.requests[2]
    assert reg.path == '/v2/systemsharedmemory/region/a%41b/register', 'not re-quoted or decoded on the way'
    assert json.loads(reg.body) == dict(key='/a_b', offset=16, byte_size=4096)
    assert reg.headers['Content-Type'] == 'application/json'
    assert json.loads(srv.requests[4].body) == dict(raw_handle=dict(b64='aGFuZGxl'), device_id=0, byte_size=1024)
    assert client.requests_made == 5
    assert model.regions == {'r': dict(name='r', key='/r', offset=0, byte_size=64)} and list(model.cuda) == ['g']


def test_health_answers(serve):
    srv = serve(
        {
            ('GET', '/v2/health/live'): (200, None, b''),
            ('GET', '/v2/health/ready'): (503, 'application/json', '{"error":"not ready"}'),
        }
    )
    client = TritonClient(srv.url)
    assert client.health('live') is True
    assert client.health('ready') is False


# -- failures ------------------------------------------------------------------------------------------


def _fails(call, *needles):
    with pytest.raises(TritonError) as err:
        call()
    for needle in needles:
        assert needle in err.value.msg, (needle, err.value.msg)
    return err.value


def test_http_error_carries_the_servers_own_error(serve):
    srv = serve(
        {
            ('POST', '/v2/systemsharedmemory/region/busy/unregister'): jsonr(
                dict(error="Cannot unregister shared memory region 'busy', it is currently in use."), 400
            ),
            ('POST', '/v2/systemsharedmemory/region/nope/unregister'): jsonr(
                dict(error="Unable to find system shared memory region: 'nope'"), 400
            ),
        }
    )
    client = TritonClient(srv.url)
    url = srv.url + '/v2/systemsharedmemory/region/busy/unregister'
    err = _fails(
        lambda: client.unregister('system', 'busy'),
        f"unregister system region 'busy' at {url}: HTTP 400: Cannot unregister",
    )
    assert (err.status, err.url, err.in_use, err.not_found) == (400, url, True, False)
    assert err.as_dict() == dict(
        url=url, status=400, server_error="Cannot unregister shared memory region 'busy', it is currently in use."
    )
    err = _fails(lambda: client.unregister('system', 'nope'), 'Unable to find')
    assert (err.in_use, err.not_found) == (False, True)


# Triton 2.68 and later without --allow-client-shm=true (the server's exact text; 2.51 here has no such switch)
CLIENT_SHM_OFF = "Client shared memory is disabled. Start the server with '--allow-client-shm=true'"


@pytest.mark.parametrize(
    'call',
    [
        lambda c: c.status('system'),
        lambda c: c.register('system', 'in0', dict(key='/in0', offset=0, byte_size=1024)),
        lambda c: c.unregister('system', 'in0'),
    ],
)
def test_client_shm_disabled_names_the_flag_and_the_role_variable(serve, call):
    answer = jsonr(dict(error=CLIENT_SHM_OFF), 400)
    srv = serve(
        {
            ('GET', '/v2/systemsharedmemory/status'): answer,
            ('POST', '/v2/systemsharedmemory/region/in0/register'): answer,
            ('POST', '/v2/systemsharedmemory/region/in0/unregister'): answer,
        }
    )
    err = _fails(
        lambda: call(TritonClient(srv.url)),
        CLIENT_SHM_OFF,
        '--allow-client-shm=true',
        'tritonops.shm.triton_server',
        'triton_server_allow_client_shm',
    )
    assert err.server_error == CLIENT_SHM_OFF and err.status == 400


def test_http_error_without_json_quotes_the_body_or_the_reason(serve):
    srv = serve(
        {
            ('GET', '/v2'): (502, 'text/html', '<html><body>Bad Gateway from the proxy</body></html>'),
            ('GET', '/v2/systemsharedmemory/status'): (500, None, b''),
        }
    )
    client = TritonClient(srv.url)
    err = _fails(
        client.server_metadata,
        f'read server metadata at {srv.url}/v2: HTTP 502: an HTML page: Bad Gateway from the proxy',
    )
    assert err.server_error is None
    _fails(lambda: client.status('system'), 'HTTP 500: Internal Server Error')


TOKEN = 'S3cr3tT0k3nValue0123456789'


@pytest.mark.parametrize(
    'body',
    [
        f'invalid token {TOKEN}',  # the credential alone, without its scheme word
        'x' * 190 + f' Bearer {TOKEN}',  # the whole value where the 200-character snippet cuts it
        json.dumps({'error': f'token {TOKEN} refused'}),  # Triton's JSON error
    ],
    ids=['alone', 'cut', 'json'],
)
def test_http_error_never_shows_a_header_credential_even_alone_or_cut(serve, body):
    srv = serve({('GET', '/v2/systemsharedmemory/status'): (401, 'text/plain', body)})
    client = TritonClient(srv.url, headers={'Authorization': f'Bearer {TOKEN}'})
    with pytest.raises(TritonError) as caught:
        client.status('system')
    text = f'{caught.value.msg} {caught.value.server_error}'
    assert 'HTTP 401' in text and '********' in text, text
    assert not any(TOKEN[:n] in text for n in range(6, len(TOKEN) + 1)), text


def test_html_is_not_triton_json(serve):
    srv = serve({('GET', '/v2'): (200, 'text/html', '<!DOCTYPE html><title>Welcome to nginx!</title>' + 'x' * 500)})
    err = _fails(
        TritonClient(srv.url).server_metadata,
        f'at {srv.url}/v2: the response is not Triton JSON (is another web server on this port?)',
        'Welcome to nginx!',
    )
    assert '...:' in err.msg, 'long bodies are cut'
    assert err.status == 200


@pytest.mark.parametrize(
    'route,call,why',
    [
        (('GET', '/v2'), 'server_metadata', 'the response is not Triton server metadata'),
        (('GET', '/v2/systemsharedmemory/status'), 'status', 'expected a JSON list of regions'),
    ],
)
@pytest.mark.parametrize('body', [dict(name='triton'), ['not', 'dicts'], None])
def test_json_of_the_wrong_shape_is_refused(serve, route, call, why, body):
    if call == 'status' and body == dict(name='triton'):
        body = dict(regions=[])
    srv = serve({route: jsonr(body)})
    client = TritonClient(srv.url)
    fn = client.server_metadata if call == 'server_metadata' else (lambda: client.status('system'))
    _fails(fn, why, srv.url + route[1])


def test_connection_refused_names_the_url():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    client = TritonClient(f'http://127.0.0.1:{port}')
    err = _fails(
        client.server_metadata,
        f'read server metadata at http://127.0.0.1:{port}/v2: cannot connect to Triton (refused or unreachable)',
    )
    assert err.status is None
    with pytest.raises(TritonError):
        client.health('live')  # no answer at all is not "not live": it is an error


def test_a_server_that_never_answers_times_out():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen(4)
        url = f'http://127.0.0.1:{s.getsockname()[1]}'
        _fails(
            TritonClient(url, timeout=0.3).server_metadata,
            f'read server metadata at {url}/v2: no answer within 0.3s (timeout)',
        )


def test_connect_timeout_names_the_url(monkeypatch):
    client = TritonClient('http://127.0.0.1:9', timeout=2)

    def refuse(*_args, **_kwargs):
        raise socket.timeout('timed out')

    monkeypatch.setattr(triton_http.socket, 'create_connection', refuse)
    _fails(client.server_metadata, 'read server metadata at http://127.0.0.1:9/v2: connection timed out after 2s')


@pytest.mark.parametrize('status', [301, 302, 307, 308])
def test_a_redirect_is_refused_naming_where_it_leads(serve, status):
    srv = serve({('GET', '/v2/cudasharedmemory/status'): (status, None, b'')})
    srv.headers = {'Location': 'http://elsewhere.example/v2'}
    err = _fails(
        lambda: TritonClient(srv.url).status('cuda'),
        f'read cuda shared memory status at {srv.url}/v2/cudasharedmemory/status: HTTP {status}: the server '
        'redirects to http://elsewhere.example/v2; redirects are not followed',
    )
    assert err.status == status and [r.path for r in srv.requests] == ['/v2/cudasharedmemory/status']


# -- TLS, with a real certificate ------------------------------------------------------------------


@pytest.fixture(scope='module')
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp('certs')

    def openssl(*args):
        subprocess.run(['openssl'] + list(args), check=True, capture_output=True, cwd=str(d))

    openssl(
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-days',
        '2',
        '-subj',
        '/CN=test-ca',
        '-keyout',
        'ca.key',
        '-out',
        'ca.pem',
        '-addext',
        'basicConstraints=critical,CA:TRUE',
        '-addext',
        'keyUsage=keyCertSign',
    )
    openssl(
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-days',
        '2',
        '-subj',
        '/CN=wrong-ca',
        '-keyout',
        'wrong.key',
        '-out',
        'wrong.pem',
    )
    for name in ('server', 'client'):
        openssl(
            'req',
            '-newkey',
            'ec',
            '-pkeyopt',
            'ec_paramgen_curve:prime256v1',
            '-nodes',
            '-subj',
            f'/CN={name}',
            '-keyout',
            name + '.key',
            '-out',
            name + '.csr',
        )
        with open(str(d / (name + '.ext')), 'w') as f:
            f.write('subjectAltName=IP:127.0.0.1\n' if name == 'server' else 'extendedKeyUsage=clientAuth\n')
        openssl(
            'x509',
            '-req',
            '-in',
            name + '.csr',
            '-CA',
            'ca.pem',
            '-CAkey',
            'ca.key',
            '-CAcreateserial',
            '-days',
            '2',
            '-extfile',
            name + '.ext',
            '-out',
            name + '.pem',
        )
    return {n: str(d / n) for n in os.listdir(str(d))}


def _tls(certs, require_client=False):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs['server.pem'], certs['server.key'])
    if require_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(certs['ca.pem'])
    return ctx


def test_tls_certificate_is_verified_against_ca_path(serve, certs):
    srv = serve({('GET', '/v2'): METADATA}, tls=_tls(certs))
    url = srv.url
    _fails(
        TritonClient(url).server_metadata,
        f'read server metadata at {url}/v2: TLS verification failed',
        'certificate verify failed',
    )
    assert TritonClient(url, ca_path=certs['ca.pem']).server_metadata()['version'] == '2.51.0'
    assert (
        TritonClient(url, validate_certs=False).server_metadata()['version'] == '2.51.0'
    )  # the module warns (make_client)
    unverified = TritonClient(url, validate_certs=False, ca_path=certs['wrong.pem'])
    assert unverified.server_metadata()['version'] == '2.51.0', 'validate_certs false wins over ca_path'
    ca_dir = os.path.dirname(certs['ca.pem']) + '/hashed'
    os.makedirs(ca_dir, exist_ok=True)
    with open(certs['ca.pem'], 'rb') as src, open(f'{ca_dir}/ca.pem', 'wb') as dst:
        dst.write(src.read())
    subprocess.run(['openssl', 'rehash', ca_dir], check=True, capture_output=True)
    assert TritonClient(url, ca_path=ca_dir).server_metadata()['version'] == '2.51.0', 'a directory of CA certificates'
    _fails(
        TritonClient(url, ca_path=certs['server.csr']).server_metadata,
        'cannot load the TLS files (ca_path, client_cert, client_key): ',
    )


def test_tls_client_certificate(serve, certs):
    srv = serve({('GET', '/v2'): METADATA}, tls=_tls(certs, require_client=True))
    url = srv.url
    with pytest.raises(TritonError):
        TritonClient(url, ca_path=certs['ca.pem']).server_metadata()
    client = TritonClient(url, ca_path=certs['ca.pem'], client_cert=certs['client.pem'], client_key=certs['client.key'])
    assert client.server_metadata()['name'] == 'triton'


def test_an_encrypted_client_key_is_refused_without_asking_for_its_passphrase(serve, certs, tmp_path):
    """OpenSSL's own answer to an encrypted key is a passphrase prompt on the terminal: a module or the event source
    started from one would wait there for good. The key is refused, saying why, and nothing is asked."""
    encrypted = str(tmp_path / 'encrypted.key')
    subprocess.run(
        ['openssl', 'pkey', '-in', certs['client.key'], '-aes256', '-passout', 'pass:pw', '-out', encrypted],
        check=True,
        capture_output=True,
    )
    srv = serve({('GET', '/v2'): METADATA}, tls=_tls(certs, require_client=True))
    client = TritonClient(srv.url, ca_path=certs['ca.pem'], client_cert=certs['client.pem'], client_key=encrypted)
    _fails(
        client.server_metadata,
        'cannot load the TLS files (ca_path, client_cert, client_key): the client key is encrypted',
    )


# -- the keep-alive connection for bulk work (TritonClient.use_keep_alive), moved here from test_region_ops.py ------


@pytest.fixture
def front():
    """front(model, **options) -> the fake Triton over HTTP (fake_triton.HttpFront), counting connections."""
    fronts = []

    def make(model, **kw):
        fronts.append(HttpFront(model, **kw))
        return fronts[-1]

    yield make
    for f in fronts:
        f.close()


def _client(url, **kw):
    client = TritonClient(url, **kw)
    assert client.use_keep_alive() is True
    return client


def test_keep_alive_sends_many_requests_over_one_connection(front):
    model = Triton()
    model.list('a', byte_size=1)
    server = front(model)
    client = _client(server.url, headers={'X-Token': 'secret'})
    assert client.status('system') == [dict(name='a', key='/a', offset=0, byte_size=1)]
    client.register('system', 'a-b.c', dict(key='/k', offset=0, byte_size=4096))
    for i in range(5):
        client.unregister('system', f'r{i}')
    assert server.connections == 1 and len(server.requests) == 7
    head, body = server.requests[1].head, server.requests[1].body
    assert head[0] == 'POST /v2/systemsharedmemory/region/a-b.c/register HTTP/1.1'
    assert 'X-Token: secret' in head and f'Host: 127.0.0.1:{server.port}' in head
    assert json.loads(body) == dict(key='/k', offset=0, byte_size=4096)


def test_keep_alive_reads_chunked_answers_and_reconnects_after_close(front):
    model = Triton()
    model.list('a', byte_size=1)
    server = front(model, chunks=2)  # every answer in two chunks
    server.answers[('POST', '/v2/systemsharedmemory/region/x/unregister')] = Reply(200, close=True)
    client = _client(server.url)
    assert client.status('system')[0]['name'] == 'a'
    client.unregister('system', 'x')  # the server closes after this answer
    client.unregister('system', 'y')
    assert server.connections == 2


def test_keep_alive_survives_a_server_closing_idle_connections(front):
    server = front(Triton(), close_after_each=True)
    client = _client(server.url)
    for name in ('a', 'b', 'c'):
        time.sleep(0.05)
        client.unregister('system', name)
    assert server.connections == 3


def test_keep_alive_errors_read_like_requests_errors(front):
    model = Triton()
    model.list('busy')
    model.in_flight['busy'] = -1  # 2.51: refused as in use, INTERNAL (500)
    server = front(model)
    server.answers[('GET', '/v2/systemsharedmemory/status')] = Reply(404, '<html>nope</html>')
    client = _client(server.url)
    with pytest.raises(TritonError) as info:
        client.unregister('system', 'busy')
    assert info.value.in_use and info.value.status == 500
    assert (
        f"unregister system region 'busy' at {server.url}/v2/systemsharedmemory/region/busy/unregister: HTTP 500: "
        in info.value.msg
    )
    with pytest.raises(TritonError, match=r'HTTP 404: an HTML page: nope'):
        client.status('system')
    silent = front(Triton())
    silent.answers[('POST', '/v2/systemsharedmemory/region/a/unregister')] = loopback.silent(2)
    with pytest.raises(TritonError, match=r'no answer within 0.3s \(timeout\)'):
        _client(silent.url, timeout=0.3).unregister('system', 'a')
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    with pytest.raises(TritonError, match='cannot connect to Triton'):
        _client(f'http://127.0.0.1:{port}').unregister('system', 'a')


def test_every_url_is_kept_alive_and_an_environment_proxy_is_used_as_requests_did(serve, monkeypatch):
    for name in [n for n in os.environ if n.lower().endswith('_proxy')]:
        monkeypatch.delenv(name)
    assert TritonClient('https://127.0.0.1:8443').use_keep_alive() is True
    assert TritonClient('http://triton.example:8000').proxy is None, 'no proxy variable: connect directly'
    proxy = serve({('GET', 'http://triton.example:8000/v2'): METADATA})
    monkeypatch.setenv('HTTP_PROXY', f'http://op:s3cret@127.0.0.1:{proxy.port}')
    client = TritonClient('http://triton.example:8000')
    assert client.server_metadata()['version'] == '2.51.0'
    sent = proxy.requests[0]
    assert sent.path == 'http://triton.example:8000/v2' and sent.headers['Host'] == 'triton.example:8000'
    assert sent.headers['Proxy-Authorization'] == 'Basic b3A6czNjcmV0'
    monkeypatch.setenv('NO_PROXY', 'triton.example')
    assert TritonClient('http://triton.example:8000').proxy is None
    monkeypatch.setenv('HTTPS_PROXY', 'socks5://127.0.0.1:1080')
    with pytest.raises(TritonError, match='only HTTP proxies are supported'):
        TritonClient('https://triton.other:8443')


def test_https_through_an_environment_proxy_goes_through_a_connect_tunnel(serve, certs, monkeypatch):
    srv = serve({('GET', '/v2'): METADATA}, tls=_tls(certs))
    tunnels = []
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen(4)

    def pipe(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def tunnel():
        conn, _addr = listener.accept()
        head = b''
        while b'\r\n\r\n' not in head:
            head += conn.recv(4096)
        tunnels.append(head.split(b'\r\n')[0])
        upstream = socket.create_connection(('127.0.0.1', srv.port))
        conn.sendall(b'HTTP/1.1 200 Connection established\r\n\r\n')
        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
        pipe(conn, upstream)

    threading.Thread(target=tunnel, daemon=True).start()
    for name in [n for n in os.environ if n.lower().endswith('_proxy')]:
        monkeypatch.delenv(name)
    monkeypatch.setenv('https_proxy', f'http://127.0.0.1:{listener.getsockname()[1]}')
    try:
        assert TritonClient(srv.url, ca_path=certs['ca.pem']).server_metadata()['name'] == 'triton'
    finally:
        listener.close()
    assert tunnels == [f'CONNECT 127.0.0.1:{srv.port} HTTP/1.1'.encode()]


@pytest.mark.parametrize('keep_alive', [True, False])
def test_close_closes_the_connection_and_a_later_request_opens_a_new_one(front, keep_alive):
    server = front(Triton())
    client = _client(server.url) if keep_alive else TritonClient(server.url)
    with client:
        assert client.status('system') == [] and client.status('system') == []
        assert server.connections == 1 and server.closed == 0, 'kept alive until closed'
    assert loopback.until(lambda: server.closed == 1), 'close() closed it'
    assert client.status('system') == [] and server.connections == 2
    client.close()
    client.close()


def test_every_failure_says_it_came_over_http(serve):
    srv = serve(
        {('POST', '/v2/systemsharedmemory/region/busy/unregister'): jsonr(dict(error=IN_USE.format('busy')), 400)}
    )
    with pytest.raises(TritonError) as err:
        TritonClient(srv.url).unregister('system', 'busy')
    url = f'{srv.url}/v2/systemsharedmemory/region/busy/unregister'
    assert err.value.failure() == dict(url=url, status=400, server_error=IN_USE.format('busy'), transport='http')
    srv.close()
    with pytest.raises(TritonError) as err:
        TritonClient(srv.url).status('system')
    assert err.value.failure() == dict(
        url=f'{srv.url}/v2/systemsharedmemory/status', status=None, server_error=None, transport='http'
    )


# -- module glue -------------------------------------------------------------------------------------


class Failed(Exception):
    pass


class FakeModule:
    """The AnsibleModule parts the glue uses (warn, fail_json, no_log_values); fail_json stops like the real one."""

    def __init__(self, **params):
        self.no_log_values = set()
        self.params = dict(
            url='http://127.0.0.1:8000',
            timeout=10.0,
            validate_certs=True,
            ca_path=None,
            headers={},
            client_cert=None,
            client_key=None,
        )
        self.params.update(params)
        self.warnings = []
        self.failed = None

    def warn(self, msg):
        self.warnings.append(msg)

    def fail_json(self, **kwargs):
        self.failed = kwargs
        raise Failed(kwargs['msg'])


def test_connection_argument_spec_matches_the_doc_fragment():
    spec = base.connection_argument_spec()
    assert sorted(spec) == ['ca_path', 'client_cert', 'client_key', 'headers', 'timeout', 'url', 'validate_certs']
    assert spec['url']['required'] is True and spec['url']['fallback'][1] == ['TRITON_URL']
    assert spec['headers']['no_log'] is True
    assert sorted(base.shm_dir_argument_spec()) == sorted(
        list(spec) + ['server_pid', 'shm_dir', 'clients_share_pid_namespace']
    )


@pytest.mark.parametrize(
    'params,msg',
    [
        (dict(timeout=0), 'timeout must be a positive number of seconds, got 0'),
        (dict(timeout=-1.5), 'timeout must be a positive number of seconds, got -1.5'),
        (dict(url='ftp://x'), 'is not an http(s) URL'),
    ],
)
def test_make_client_refuses_bad_options(params, msg):
    module = FakeModule(**params)
    with pytest.raises(Failed):
        base.make_client(module)
    assert msg in module.failed['msg']


def test_make_client_warns_when_tls_is_not_verified():
    module = FakeModule(url='https://127.0.0.1:8443', validate_certs=False)
    client = base.make_client(module)
    assert client.validate_certs is False
    assert module.warnings == ['validate_certs is false: the TLS certificate of https://127.0.0.1:8443 is not verified']
    module = FakeModule(url='http://127.0.0.1:8000', validate_certs=False)
    base.make_client(module)
    assert module.warnings == []


def test_make_client_picks_the_transport_by_scheme():
    pytest.importorskip('grpc')
    assert isinstance(base.make_client(FakeModule(url='grpc://127.0.0.1:8001')), triton_grpc.TritonGrpcClient)
    assert isinstance(base.make_client(FakeModule(url='GRPCS://127.0.0.1:8001')), triton_grpc.TritonGrpcClient)
    assert isinstance(base.make_client(FakeModule(url='127.0.0.1:8000')), TritonClient)
    module = FakeModule(url='grpcs://127.0.0.1:8001', validate_certs=False)
    with pytest.raises(Failed):
        base.make_client(module)
    assert 'validate_certs=false is not possible with grpcs://127.0.0.1:8001' in module.failed['msg']


def test_make_client_without_the_grpc_library_says_what_to_install(monkeypatch):
    monkeypatch.setattr(triton_grpc._Lib, 'grpc', None)  # pylint: disable=protected-access
    monkeypatch.setattr(triton_grpc._Lib, 'error', 'Traceback ...\nModuleNotFoundError: No module named grpc')  # pylint: disable=protected-access
    module = FakeModule(url='grpc://127.0.0.1:8001')
    with pytest.raises(Failed):
        base.make_client(module)
    assert 'Failed to import the required Python library (tritonclient[grpc])' in module.failed['msg']
    assert 'for grpc:// and grpcs:// URLs' in module.failed['msg']
    assert 'No module named grpc' in module.failed['exception']
    with pytest.raises(RuntimeError):
        triton_grpc.TritonGrpcClient('grpc://127.0.0.1:8001')
    assert isinstance(base.make_client(FakeModule(url='http://127.0.0.1:8000')), TritonClient), 'HTTP does not need it'


def test_run_module_main_turns_errors_into_clear_failures():
    module = FakeModule()

    def triton_fails():
        raise TritonError(
            'unregister region at http://x: HTTP 400: busy', url='http://x', status=400, server_error='busy'
        )

    with pytest.raises(Failed):
        base.run_module_main(module, triton_fails, partial=lambda: dict(unregistered=['a']))
    assert module.failed == dict(
        msg='unregister region at http://x: HTTP 400: busy',
        unregistered=['a'],
        failure=dict(url='http://x', status=400, server_error='busy'),
    )

    def fs_fails():
        raise ShmFsError('cannot remove x from /dev/shm: Permission denied')

    with pytest.raises(Failed):
        base.run_module_main(module, fs_fails)
    assert module.failed == dict(msg='cannot remove x from /dev/shm: Permission denied')

    done = []
    base.run_module_main(module, lambda: done.append(1))
    assert done == [1]


def test_run_module_main_returns_which_transport_failed():
    module = FakeModule(url='grpc://x:8001')

    def grpc_fails():
        raise TritonError(
            "unregister system region 'r' at grpc://x:8001: gRPC INTERNAL: busy",
            url='grpc://x:8001',
            status='INTERNAL',
            server_error='busy',
            transport='grpc',
        )

    with pytest.raises(Failed):
        base.run_module_main(module, grpc_fails, partial=lambda: dict(unregistered=[]))
    assert module.failed == dict(
        msg="unregister system region 'r' at grpc://x:8001: gRPC INTERNAL: busy",
        unregistered=[],
        failure=dict(url='grpc://x:8001', status='INTERNAL', server_error='busy', transport='grpc'),
    )


def test_make_client_checks_the_transports_library_once(monkeypatch):
    calls = []
    real = TritonClient.library.__func__

    def counted(cls):
        calls.append(cls)
        return real(cls)

    monkeypatch.setattr(TritonClient, 'library', classmethod(counted))
    assert isinstance(base.make_client(FakeModule()), TritonClient) and calls == [TritonClient]


# -- model repository (triton_backend_pool) -----------------------------------------------------------


def test_repository_index_config_and_load_with_a_config(serve):
    model = Triton()
    model.models['grow'] = {'backend': 'python'}
    server = serve({}, model=model)
    client = TritonClient(server.url)
    assert client.repository_index() == [{'name': 'grow', 'version': '1', 'state': 'READY', 'reason': ''}]
    assert client.model_config('grow') == {'name': 'grow', 'backend': 'python'}
    client.load_model('grow', config={'name': 'grow', 'parameters': {'p': {'string_value': '1'}}}, timeout=30)
    sent = json.loads(server.requests[-1].body)
    assert json.loads(sent['parameters']['config']) == {'name': 'grow', 'parameters': {'p': {'string_value': '1'}}}
    assert client.timeout == 10.0  # the load's own timeout does not stay
    client.load_model('grow')
    assert json.loads(server.requests[-1].body) == {}


def test_a_load_refused_for_model_control_names_the_condition(serve):
    server = serve({}, model=Triton(model_control='poll'))  # Triton answers 503 (UNAVAILABLE)
    with pytest.raises(ModelControlRefused) as err:
        TritonClient(server.url).load_model('grow')
    assert err.value.status == 503 and err.value.server_error == MODEL_CONTROL


def test_model_names_a_path_cannot_carry_are_not_sent(serve):
    server = serve({})
    with pytest.raises(UnaddressableName):
        TritonClient(server.url).load_model('a/b')
    assert server.requests == []


# Triton 2.51 started with --http-restricted-api=shared-memory:shm-key=V, asked without the header (measured)
RESTRICTED = "This API is restricted, expecting header 'shm-key'"


@pytest.mark.parametrize(
    'call',
    [
        lambda c: c.status('system'),
        lambda c: c.unregister('system', 'r'),
        lambda c: c.register('system', 'r', dict(key='/r', offset=0, byte_size=64)),
    ],
)
def test_a_restricted_api_without_its_header_names_the_headers_option_and_the_key(serve, call):
    srv = serve({}, model=Triton(restricted=('shm-key', 'V')))  # the model answers 403 with Triton's text
    err = _fails(
        lambda: call(TritonClient(srv.url)),
        f'HTTP 403: {RESTRICTED}; the server was started with --http-restricted-api',
        'give it in the headers option, headers: {shm-key: <the value the server was started with>}',
        'shm_cleanup_headers',
    )
    assert (
        isinstance(err, Restricted) and err.header == 'shm-key' and err.status == 403 and err.server_error == RESTRICTED
    )


@pytest.mark.parametrize(
    'start, says',
    [
        # a gRPC server's first frame: SETTINGS (type 4) on stream 0, as Triton's gRPC port sends it
        (bytes.fromhex('000018040000000000000400400000000500ffffff'), ['speaks HTTP/2', 'grpc://HOST:PORT', '8000']),
        (bytes.fromhex('150301000202'), ['speaks TLS', 'https://']),  # a TLS alert to a clear-text request
        (bytes.fromhex('160303007a0200'), ['speaks TLS']),  # a TLS handshake record
        (b'SSH-2.0-OpenSSH_9.6\r\n', ['SSH-2.0-OpenSSH_9.6']),  # anything else: shown, escaped
    ],
)
def test_an_answer_that_is_not_http_says_what_speaks_on_the_port(start, says):
    from ansible_collections.tritonops.shm.plugins.module_utils.wire.http_reader import not_http

    text = not_http(start)
    assert all(s in text for s in says), text


def test_an_html_page_is_shown_as_its_text_and_a_hostile_one_costs_nothing(serve):
    page = '<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body><p>It works</p></body></html>'
    srv = serve({('GET', '/v2'): (200, 'text/html', page)})
    err = _fails(TritonClient(srv.url).server_metadata, 'an HTML page: Welcome to nginx! It works', 'check the port')
    assert '<' not in err.msg
    hostile = serve({('GET', '/v2'): (200, 'text/html', '<a' + 'x' * 100000 + '<' * 100000)})
    started = time.monotonic()
    _fails(TritonClient(hostile.url).server_metadata, 'not Triton JSON')
    assert time.monotonic() - started < 5
