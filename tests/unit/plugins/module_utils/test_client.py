"""Unit tests for module_utils/wire/client.py: the one interface of both transports and what they share.

The helpers are pure and tested on literal values. The interface is tested on the two real
transports (constructed, never connected: their calls are tested against servers in
test_triton_http.py and test_triton_grpc.py) and on a minimal implementation written here.
"""

from __future__ import annotations

import inspect

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ParameterError,
    RegionInUse,
    RegionNotFound,
    TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import (
    CLIENT_SHM_HINT,
    Client,
    Library,
    check_headers,
    check_health,
    check_kind,
    check_url,
    error_from_answer,
    host_port,
    is_grpc_url,
    short,
    snippet,
    split_url,
    url_scheme,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import (
    WireConfig,
    has_userinfo,
    redact_url,
    secrets,
    url_secrets,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.http_reader import escape
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient

# what the modules and module_utils call on a client (triton_shm_info, triton_shm_region, inventory, region_ops)
INTERFACE = {
    'library',
    'server_metadata',
    '_health',
    'status',
    'register',
    'unregister',
    'unaddressable',
    'use_keep_alive',
    'close',
    'repository_index',
    'model_config',
    'load_model',
}
CLIENT_SHM_OFF = "Client shared memory is disabled. Start the server with '--allow-client-shm=true'"


# -- the interface ----------------------------------------------------------------------------------


def test_the_interface_is_declared_once_as_abstract_methods():
    assert Client.__abstractmethods__ == frozenset(INTERFACE)
    with pytest.raises(TypeError):
        Client()  # pylint: disable=abstract-class-instantiated


@pytest.mark.parametrize(
    'transport,url,name',
    [
        (TritonClient, 'http://127.0.0.1:8000', 'http'),
        (TritonGrpcClient, 'grpc://127.0.0.1:8001', 'grpc'),
    ],
)
def test_both_transports_implement_all_of_it(transport, url, name):
    if transport is TritonGrpcClient:
        pytest.importorskip('grpc')
    assert issubclass(transport, Client) and not transport.__abstractmethods__
    assert transport.transport == name and transport.library().ok
    for method in INTERFACE:  # the same parameters as declared, so callers cannot depend on one transport
        assert (
            inspect.signature(getattr(transport, method)).parameters.keys()
            == inspect.signature(getattr(Client, method)).parameters.keys()
        ), method
    with transport.from_params(dict(url=url, timeout=None)) as client:
        assert (client.timeout, client.requests_made, client.scheme) == (10.0, 0, name)
        assert client.base == url and client.host == '127.0.0.1'
    client.close()  # idempotent


def test_an_implementation_missing_a_call_cannot_be_built():
    class Partial(Client):  # pylint: disable=abstract-method
        transport = 'http'

        def server_metadata(self):
            return {}

    with pytest.raises(TypeError, match='abstract'):
        Partial()  # pylint: disable=abstract-class-instantiated


class Minimal(Client):
    """The least a transport writes: every call, health's answer raising what a server says."""

    transport = 'test'
    base = 'test://h:1'

    def __init__(self, answer=None):
        self.answer = answer
        self.closed = 0

    @classmethod
    def library(cls):
        return Library('nothing')

    def server_metadata(self):
        return {}

    def _health(self, which):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def status(self, kind):
        return []

    def register(self, kind, name, values):
        pass

    def unregister(self, kind, name):
        pass

    def repository_index(self):
        return []

    def model_config(self, name):
        return {'name': name}

    def load_model(self, name, config=None, timeout=None):
        pass

    @staticmethod
    def unaddressable(name):
        return None

    def use_keep_alive(self):
        return False

    def close(self):
        self.closed += 1


@pytest.mark.parametrize(
    'answer,healthy',
    [
        (True, True),
        (False, False),
        (TritonError('health ready at test://h:1: HTTP 503: not ready', status=503), False),
        (TritonError('health ready at test://h:1: gRPC INTERNAL: shutting down', status='INTERNAL'), False),
    ],
)
def test_health_is_false_for_an_error_answer(answer, healthy):
    assert Minimal(answer).health('ready') is healthy


def test_health_without_an_answer_raises_and_refuses_unknown_checks():
    with pytest.raises(TritonError, match='refused'):
        Minimal(TritonError('health live at test://h:1: cannot connect to Triton (refused or unreachable)')).health(
            'live'
        )
    with pytest.raises(ValueError, match="unknown health check 'started'"):
        Minimal(True).health('started')


def test_a_client_is_a_context_manager_that_closes_itself_also_on_errors():
    client = Minimal()
    with pytest.raises(RuntimeError):
        with client as same:
            assert same is client
            raise RuntimeError('boom')
    assert client.closed == 1


def test_errors_a_client_raises_name_its_transport():
    err = Minimal().error('read server metadata at test://h:1/v2: the response is not Triton server metadata')
    assert (type(err), err.url, err.status, err.transport) == (TritonError, 'test://h:1', None, 'test')
    assert err.failure() == dict(url='test://h:1', status=None, server_error=None, transport='test')
    assert Minimal().error('x', url='test://h:1/v2').url == 'test://h:1/v2'


def test_the_library_check_is_one_value():
    assert Library('requests').ok is True
    missing = Library('tritonclient[grpc]', 'Traceback ...', reason='for grpc:// and grpcs:// URLs')
    assert (missing.ok, missing.error, missing.reason) == (False, 'Traceback ...', 'for grpc:// and grpcs:// URLs')


# -- the helpers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'url,scheme,grpc',
    [
        ('grpc://127.0.0.1:8001', 'grpc', True),
        ('  GRPCS://triton:8001', 'grpcs', True),
        ('http://127.0.0.1:8000', 'http', False),
        ('127.0.0.1:8001', '', False),
        ('', '', False),
        (None, '', False),
    ],
)
def test_the_scheme_picks_the_transport(url, scheme, grpc):
    assert url_scheme(url) == scheme
    assert is_grpc_url(url) is grpc


@pytest.mark.parametrize(
    'url,expected',
    [
        ('http://127.0.0.1:8000/x', ('http', '127.0.0.1', 8000)),
        ('HTTPS://[::1]', ('https', '::1', None)),
    ],
)
def test_split_url(url, expected):
    parsed = split_url(url, ('http', 'https'), 'refused')
    assert (parsed.scheme, parsed.host, parsed.port) == expected


@pytest.mark.parametrize(
    'url,why',
    [
        ('ftp://h:1', 'not one of ours'),
        ('http://', 'not one of ours'),
        ('http://h:99999', "url 'http://h:99999' has an invalid port"),
        ('http://h:port', "url 'http://h:port' has an invalid port"),
        # a character a request line or Host header cannot carry: a clear refusal, never a UnicodeEncodeError
        ('http://h:8000/\u00e4', "has the character '\u00e4', which a request cannot carry: percent-encode it"),
        ('http://trit\u00f3n:8000', "has the character '\u00f3'"),
        ('http://h:8000/a b', "has the character ' '"),
        ('http://h:8000/\x7f', "has the character '\\x7f'"),
    ],
)
def test_split_url_refuses_with_a_message_that_names_the_url(url, why):
    with pytest.raises(TritonError) as err:
        split_url(url, ('http', 'https'), 'not one of ours')
    assert why in err.value.msg and err.value.url == url


@pytest.mark.parametrize(
    'host,port,target', [('127.0.0.1', 8001, '127.0.0.1:8001'), ('::1', 8001, '[::1]:8001'), ('triton', 1, 'triton:1')]
)
def test_host_port(host, port, target):
    assert host_port(host, port) == target


def test_text_helpers_cut_long_texts():
    assert short('x' * 300) == 'x' * 300 and short('x' * 301) == 'x' * 300 + '...'
    assert short(ValueError('bad')) == 'bad'
    assert snippet('  <html>\n<body>  ') == '<html> <body>'
    assert snippet('y' * 201) == 'y' * 200 + '...' and snippet(None) == ''


def test_kind_checks():
    assert check_kind('system') == 'system' and check_kind('cuda') == 'cuda' and check_health('live') == 'live'
    with pytest.raises(ValueError, match="unknown shared memory kind 'gpu'"):
        check_kind('gpu')


# -- the server's own text, the same decision for both transports ----------------------------------


@pytest.mark.parametrize('code,status,transport', [('HTTP 400', 400, 'http'), ('gRPC INTERNAL', 'INTERNAL', 'grpc')])
@pytest.mark.parametrize(
    'server_error,cls',
    [
        ("Cannot unregister shared memory region 'r', it is currently in use.", RegionInUse),
        ("Unable to find system shared memory region: 'r'", RegionNotFound),
        ('failed to register shared memory region: invalid args', TritonError),
        (None, TritonError),
    ],
)
def test_error_from_answer_decides_the_condition_from_the_servers_text(code, status, transport, server_error, cls):
    err = error_from_answer(
        "unregister system region 'r' at U",
        code,
        server_error or 'Bad Gateway',
        server_error,
        url='U',
        status=status,
        transport=transport,
        hint=' (a hint)',
    )
    assert type(err) is cls  # pylint: disable=unidiomatic-typecheck
    assert err.msg == f"unregister system region 'r' at U: {code}: {server_error or 'Bad Gateway'} (a hint)"
    assert err.failure() == dict(url='U', status=status, server_error=server_error, transport=transport)


@pytest.mark.parametrize(
    'code,status', [('HTTP 400', 400), ('gRPC UNIMPLEMENTED', 'UNIMPLEMENTED'), ('gRPC INTERNAL', 'INTERNAL')]
)
def test_client_shm_disabled_gets_the_way_out_instead_of_the_transports_hint(code, status):
    err = error_from_answer(
        'read system shared memory status at U',
        code,
        CLIENT_SHM_OFF,
        CLIENT_SHM_OFF,
        url='U',
        status=status,
        transport='x',
        hint=" (is this Triton's gRPC port?)",
    )
    assert err.msg == f'read system shared memory status at U: {code}: {CLIENT_SHM_OFF}; {CLIENT_SHM_HINT}'
    assert 'triton_server_allow_client_shm' in err.msg and '--allow-client-shm=true' in CLIENT_SHM_HINT


# -- credentials: never in a URL, never echoed from a header (issue 26, finding 10) ----------------


@pytest.mark.parametrize(
    'url, shown',
    [
        ('http://user:s3cret@h:8000', 'http://***@h:8000'),
        ('https://tok3n@h:8443/prefix?x=1#f', 'https://***@h:8443/prefix?x=1#f'),
        ('grpc://u:p%40ss@[::1]:8001', 'grpc://***@[::1]:8001'),
        ('http://a@b@h:1/p@q', 'http://***@h:1/p@q'),
    ],
)
def test_a_url_with_credentials_is_refused_and_shown_without_them(url, shown):
    assert has_userinfo(url) and redact_url(url) == shown
    with pytest.raises(ParameterError) as exc:
        check_url(url)
    assert shown in exc.value.msg and 'headers' in exc.value.msg
    for secret in url_secrets(url):
        assert secret not in exc.value.msg


@pytest.mark.parametrize('url', ['http://h:8000', 'h:8000', 'http://h:8000/p@q', 'http://h:8000/?a=b@c', None, ''])
def test_a_url_without_credentials_passes_as_it_is(url):
    assert not has_userinfo(url) and redact_url(url) == url
    check_url(url)


def test_url_secrets_are_the_password_as_written_and_decoded():
    assert url_secrets('http://user:p%40ss-x@h:1') == ['p%40ss-x', 'p@ss-x', 'user:p%40ss-x']
    assert url_secrets('http://h:1') == []


def test_secrets_are_each_header_value_and_its_credential_longest_first():
    headers = {'Authorization': 'Bearer t0k3n-value', 'X-Basic': 'basic YWRtaW46cGFzc3dvcmQ=', 'X-Key': 'k3y k3y k3y'}
    found = secrets(WireConfig('http://h:1', 10.0, None, headers))
    assert found == sorted(found, key=len, reverse=True)
    assert set(found) == {
        'Bearer t0k3n-value',
        't0k3n-value',
        'basic YWRtaW46cGFzc3dvcmQ=',
        'YWRtaW46cGFzc3dvcmQ=',
        'admin:password',
        'password',
        'k3y k3y k3y',  # not SCHEME CREDENTIAL: only the whole value
    }


def test_escape_hides_secrets_before_it_cuts():
    hidden = ['Bearer t0k3n-value', 't0k3n-value']
    assert escape(b'x' * 95 + b' t0k3n-value', 100, hidden) == 'x' * 95 + ' ****...'
    assert escape('Bearer t0k3n-value!', 100, hidden) == '********!'


SECRET = 'Bearer s3cr3t-value'


@pytest.mark.parametrize(
    'headers, named',
    [
        ({'Authorization': SECRET + '\n'}, 'Authorization'),  # a YAML block scalar "|"
        ({'Authorization': SECRET + '\r\nX-Evil: 1'}, 'Authorization'),
        ({'X-Token': 's3cr3t\x00-value'}, 'X-Token'),
        ({'X-Token': ' s3cr3t-value'}, 'X-Token'),
        ({'X-Token': 's3cr3t-value\x1b[2J'}, 'X-Token'),
        ({'Bad Name': 's3cr3t-value'}, "'Bad?Name'"),
        ({'X-Tok:en': 's3cr3t-value'}, "'X-Tok?en'"),
        ({'': 's3cr3t-value'}, "''"),
        ({'X-Token': 's3cr3t-\u4e2d'}, 'X-Token'),  # not Latin-1: the two transports would send other bytes
        ({'X-Token': 's3cr3t-\x85value'}, 'X-Token'),  # a C1 control (NEL)
    ],
)
def test_a_bad_header_is_refused_by_name_and_its_value_never_shown(headers, named):
    with pytest.raises(ParameterError) as exc:
        check_headers(headers)
    assert named in exc.value.msg and 's3cr3t' not in exc.value.msg and 'nothing was sent' in exc.value.msg


def test_good_headers_pass():
    check_headers({'Authorization': SECRET, 'X-Api-Key': 'a\tb', "x-!#$%&'*+-.^_`|~": 'v'})
    check_headers(None)


@pytest.mark.parametrize('transport', [TritonClient, TritonGrpcClient])
def test_a_url_outside_ascii_is_refused_by_both_transports_before_any_request(transport):
    scheme = 'grpc' if transport is TritonGrpcClient else 'http'
    with pytest.raises(TritonError, match='which a request cannot carry'):
        transport(f'{scheme}://trit\u00f3n:8001', timeout=1)


def test_a_url_outside_ascii_is_refused_by_the_event_source_at_start_naming_the_server():
    from ansible_collections.tritonops.shm.extensions.eda.plugins.event_source import triton_shm

    for url in ('http://127.0.0.1:8000/\u00e4', 'grpc://trit\u00f3n:8001'):
        with pytest.raises(triton_shm.ConfigError, match=r'servers\[0\] \(h1\): url .* which a request cannot carry'):
            triton_shm.parse_args({'servers': [{'host': 'h1', 'url': url}]})


@pytest.mark.parametrize(
    'value, shown',
    [
        ('Sécrèt-Tökèn-42', 'S\ufffdcr\ufffdt-T\ufffdk\ufffdn-42'),  # Latin-1 bytes that are no UTF-8
        ('Ã©Ã¨', 'éè'),  # Latin-1 bytes that happen to be UTF-8: two characters that give the secret back
        ('ééé', None),  # U+FFFD alone: nothing of the secret shows, and hiding it would garble every message
    ],
)
def test_a_secret_beyond_ascii_is_hidden_as_a_utf8_body_shows_its_latin1_bytes(value, shown):
    from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection

    hidden = connection.secrets(connection.wire_config({'url': 'http://h:8000', 'headers': {'X-Key': value}}))
    echo = value.encode('latin-1').decode('utf-8', 'replace')  # a server echoing the header's bytes in its body
    assert echo == (shown or echo)
    assert value in hidden and (shown in hidden if shown else echo not in hidden)
    if shown:
        assert connection.hide(f'bad key {echo}.', hidden) == 'bad key ********.'


def test_a_header_value_too_short_to_be_a_secret_does_not_garble_messages():
    from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection

    wire = connection.wire_config(
        {'url': 'http://h:8000', 'headers': {'X-Priority': '1', 'Authorization': 'Bearer s3cr'}}
    )
    hidden = connection.secrets(wire)
    assert '1' not in hidden and 'Bearer s3cr' in hidden and 's3cr' in hidden
    assert connection.hide('HTTP 401 from model 1: s3cr', hidden) == 'HTTP 401 from model 1: ********'
