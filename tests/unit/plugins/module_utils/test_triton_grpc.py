"""Unit tests for module_utils/wire/triton_grpc.py: gRPC URLs, metadata, and the mapping of every failure to a TritonError.

Calls go over real gRPC to the unit tests' fake Triton (tests/fakes/fake_triton.py: an in-process
grpcio server with Triton's own messages, tritonclient.grpc.service_pb2), scripted for the answers a real
Triton never gives (no version, a method it does not implement, an answer slower than the timeout,
in use on demand) and to see what reached it (metadata, request fields). Everything a real
Triton answers is tested against a real one in tests/integration/test_grpc.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

grpc = pytest.importorskip('grpc')
service_pb2 = pytest.importorskip('tritonclient.grpc.service_pb2')
service_pb2_grpc = pytest.importorskip('tritonclient.grpc.service_pb2_grpc')

# pylint: disable=wrong-import-position
from ansible_collections.tritonops.shm.plugins.module_utils.errors import ModelControlRefused, Restricted, TritonError  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.wire import tls, triton_grpc
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import is_grpc_url  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient  # noqa: E402
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import GrpcFront, Triton  # noqa: E402

IN_USE = "Cannot unregister shared memory region 'r', it is currently in use."


@pytest.fixture
def served():
    """(front, url): the unit tests' fake Triton (2.51, tests/fakes/fake_triton.py) over gRPC, python model 'grow'."""
    model = Triton()
    model.models['grow'] = {'backend': 'python'}
    front = GrpcFront(model)
    try:
        yield front, front.url
    finally:
        front.close()


# -- URLs and metadata --------------------------------------------------------------------------


@pytest.mark.parametrize(
    'url,base,host,port',
    [
        ('grpc://127.0.0.1:8001', 'grpc://127.0.0.1:8001', '127.0.0.1', 8001),
        ('GRPC://triton.example:9001/', 'grpc://triton.example:9001', 'triton.example', 9001),
        ('grpcs://triton.example', 'grpcs://triton.example:8001', 'triton.example', 8001),
        ('grpc://[::1]:8001', 'grpc://[::1]:8001', '::1', 8001),
    ],
)
def test_url_forms(url, base, host, port):
    client = TritonGrpcClient(url, ca_path=None)
    assert (client.base, client.host, client.port) == (base, host, port)
    assert is_grpc_url(url)


@pytest.mark.parametrize('url', ['http://127.0.0.1:8001', '127.0.0.1:8001', 'grpcx://h:1', '', None])
def test_other_urls_are_not_grpc(url):
    assert not is_grpc_url(url)


@pytest.mark.parametrize(
    'url,why',
    [
        ('grpc://127.0.0.1:8001/v2', 'no path'),
        ('grpc://user:pw@127.0.0.1:8001', 'no path, query or user'),
        ('grpc://127.0.0.1:99999', 'invalid port'),
        ('grpc://:8001', 'is not a grpc:// or grpcs:// URL'),
    ],
)
def test_bad_grpc_urls_are_refused(url, why):
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url)
    assert why in err.value.msg


def test_grpcs_without_verification_is_refused_with_the_way_out():
    with pytest.raises(TritonError) as err:
        TritonGrpcClient('grpcs://127.0.0.1:8001', validate_certs=False)
    assert 'validate_certs=false is not possible' in err.value.msg and 'ca_path' in err.value.msg


def test_headers_become_metadata_and_reach_the_server(served):
    script, url = served
    client = TritonGrpcClient(url, headers={'Authorization': 'Bearer t0k', 'X-Team': 'ml'})
    client.status('system')
    assert script.calls[0][2]['authorization'] == 'Bearer t0k' and script.calls[0][2]['x-team'] == 'ml'


@pytest.mark.parametrize(
    'headers,why',
    [
        ({'Bad Name': 'v'}, "header 'Bad Name' cannot be sent"),
        ({'grpc-timeout': 'v'}, "header 'grpc-timeout' cannot be sent"),
        ({'x-key-bin': 'v'}, 'binary'),
        ({'authorization': 'Bearer s3cr3t\n'}, "the value of header 'authorization' cannot be sent"),
        ({'authorization': 'Bearer s3cr3t\u00e9'}, "the value of header 'authorization' cannot be sent"),
    ],
)
def test_headers_grpc_cannot_carry_are_refused_without_showing_the_value(headers, why):
    with pytest.raises(TritonError) as err:
        TritonGrpcClient('grpc://127.0.0.1:8001', headers=headers)
    assert why in err.value.msg and 's3cr3t' not in err.value.msg


# -- the calls ----------------------------------------------------------------------------------


def test_status_has_the_http_shape_ordered_by_name(served):
    script, url = served
    script.model.list('b b', '/b', 4096)
    script.model.list('a#1', '/a', 8192, offset=64)
    assert TritonGrpcClient(url).status('system') == [
        dict(name='a#1', key='/a', offset=64, byte_size=8192),
        dict(name='b b', key='/b', offset=0, byte_size=4096),
    ]
    with pytest.raises(ValueError):
        TritonGrpcClient(url).status('tpu')


def test_one_channel_for_every_call_and_names_sent_as_they_are(served):
    script, url = served
    client = TritonGrpcClient(url)
    assert client.use_keep_alive() is True
    client.register('system', 'my region#1', dict(key='/k', offset=0, byte_size=4096))
    client.unregister('system', 'ünï/x')
    client.register(
        'cuda', 'gpu', dict(raw_handle=base64.b64encode(b'\x01\x02handle').decode(), device_id=0, byte_size=1024)
    )
    channel = client._channel  # pylint: disable=protected-access
    client.status('system')
    assert client._channel is channel and client.requests_made == 4  # pylint: disable=protected-access
    reg, unreg, cuda = (c[1] for c in script.calls[:3])
    assert (reg.name, reg.key, reg.byte_size) == ('my region#1', '/k', 4096)
    assert unreg.name == 'ünï/x'
    assert (cuda.raw_handle, cuda.device_id, cuda.byte_size) == (b'\x01\x02handle', 0, 1024)


def test_an_empty_name_is_never_sent(served):
    """Over gRPC an empty name means every region."""
    script, url = served
    client = TritonGrpcClient(url)
    for call in (
        lambda: client.unregister('system', ''),
        lambda: client.register('system', '', dict(key='/k', offset=0, byte_size=1)),
    ):
        with pytest.raises(TritonError) as err:
            call()
        assert err.value.unaddressable is True and 'every region' in err.value.msg
    assert client.unaddressable('') and client.unaddressable('a b#/ü') is None
    assert script.calls == []


def test_a_raw_handle_that_is_not_base64_is_refused(served):
    script, url = served
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url).register('cuda', 'gpu', dict(raw_handle='not base64!', device_id=0, byte_size=1024))
    assert 'raw_handle is not base64' in err.value.msg and script.calls == []


# -- errors -------------------------------------------------------------------------------------


def test_server_errors_carry_the_code_and_triton_s_own_message(served):
    script, url = served
    script.fail['SystemSharedMemoryUnregister'] = (grpc.StatusCode.INTERNAL, IN_USE)
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url).unregister('system', 'r')
    exc = err.value
    assert exc.msg == f"unregister system region 'r' at {url}: gRPC INTERNAL: {IN_USE}"
    assert (exc.url, exc.status, exc.server_error, exc.in_use) == (url, 'INTERNAL', IN_USE, True)


def test_health_is_false_on_an_error_answer_or_not_ready(served):
    script, url = served
    script.model.ready = False
    script.fail['ServerLive'] = (grpc.StatusCode.INTERNAL, 'shutting down')
    client = TritonGrpcClient(url)
    assert client.health('ready') is False and client.health('live') is False


def test_metadata_without_a_version_is_not_triton(served):
    script, url = served
    script.model.version = ''
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url).server_metadata()
    assert 'not Triton server metadata' in err.value.msg


def test_a_grpc_server_that_is_not_triton_says_so(served):
    script, url = served
    script.missing.add('CudaSharedMemoryStatus')  # a server without that method
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url).status('cuda')
    assert 'gRPC UNIMPLEMENTED' in err.value.msg and "is this Triton's gRPC port?" in err.value.msg


def test_no_answer_within_the_timeout(served):
    script, url = served
    script.slow['ServerReady'] = 5
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url, timeout=0.3).health('ready')
    assert err.value.msg == f'health ready at {url}: no answer within 0.3s (timeout)' and err.value.status is None


def test_connection_refused_names_the_url_and_health_raises():
    with pytest.raises(TritonError) as err:
        TritonGrpcClient('grpc://127.0.0.1:1', timeout=2).health('live')
    assert err.value.msg.startswith(
        'health live at grpc://127.0.0.1:1: cannot connect to Triton (refused or unreachable)'
    )


def test_unreadable_tls_files_are_named(tmp_path):
    with pytest.raises(TritonError) as err:
        TritonGrpcClient('grpcs://127.0.0.1:8001', ca_path=str(tmp_path / 'missing.pem'))
    assert 'cannot read ca_path' in err.value.msg
    with pytest.raises(TritonError) as err:
        TritonGrpcClient('grpcs://127.0.0.1:8001', ca_path=str(tmp_path))
    assert 'without PEM certificates' in err.value.msg


def test_a_client_key_without_a_client_cert_is_refused_by_both_transports_and_the_event_source(tmp_path):
    """A key alone authenticates nothing: refused with the reason before anything is sent, never silently dropped."""
    from ansible_collections.tritonops.shm.extensions.eda.plugins.event_source import triton_shm
    from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError
    from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient

    key = tmp_path / 'client.key'
    key.write_text('-----BEGIN PRIVATE KEY-----\n')
    for transport, url in ((TritonGrpcClient, 'grpcs://127.0.0.1:8001'), (TritonClient, 'https://127.0.0.1:8000')):
        with pytest.raises(ParameterError, match='client_key is set without client_cert'):
            transport.from_params({'url': url, 'client_key': str(key)})
    server = {'host': 'h1', 'url': 'grpcs://127.0.0.1:8001', 'client_key': str(key)}
    with pytest.raises(triton_shm.ConfigError, match=r'servers\[0\] \(h1\): client_key is set without client_cert'):
        triton_shm.parse_args({'servers': [server]})


def test_a_client_key_without_a_client_cert_is_left_out_as_over_https(tmp_path):
    """grpcio aborts the whole process on a private key without a certificate chain: were a key alone to reach the
    channel's settings (connection.wire_config refuses it first), it is not passed."""
    key = tmp_path / 'client.key'
    key.write_text('-----BEGIN PRIVATE KEY-----\n')
    assert tls.grpc_pems(None, None, str(key)) == (None, None, None)
    both = tmp_path / 'both.pem'
    both.write_text('cert and key')
    assert tls.grpc_pems(None, str(both), None) == (None, b'cert and key', b'cert and key')


# Triton 2.68 and later without --allow-client-shm=true (the server's exact text; 2.51 here has no such switch)
CLIENT_SHM_OFF = "Client shared memory is disabled. Start the server with '--allow-client-shm=true'"


@pytest.mark.parametrize('code', ['UNIMPLEMENTED', 'INTERNAL'])
def test_client_shm_disabled_names_the_flag_and_the_role_variable_over_grpc_too(served, code):
    script, url = served
    script.fail['SystemSharedMemoryStatus'] = (getattr(grpc.StatusCode, code), CLIENT_SHM_OFF)
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url).status('system')
    msg = err.value.msg
    assert msg.startswith(f'read system shared memory status at {url}: gRPC {code}: {CLIENT_SHM_OFF}; ')
    assert (
        '--allow-client-shm=true' in msg
        and 'tritonops.shm.triton_server' in msg
        and 'triton_server_allow_client_shm' in msg
    )
    assert "is this Triton's gRPC port?" not in msg, 'it is Triton: the hint would mislead'
    assert (err.value.status, err.value.server_error) == (code, CLIENT_SHM_OFF)


def test_every_failure_says_it_came_over_grpc(served):
    script, url = served
    script.fail['SystemSharedMemoryUnregister'] = (grpc.StatusCode.INTERNAL, IN_USE)
    with pytest.raises(TritonError) as err:
        TritonGrpcClient(url).unregister('system', 'r')
    assert err.value.failure() == dict(url=url, status='INTERNAL', server_error=IN_USE, transport='grpc')
    with pytest.raises(TritonError) as err:
        TritonGrpcClient('grpc://127.0.0.1:1', timeout=2).status('system')
    assert err.value.failure() == dict(url='grpc://127.0.0.1:1', status=None, server_error=None, transport='grpc')


def test_close_closes_the_channel_and_a_later_call_opens_a_new_one(served):
    _script, url = served
    with TritonGrpcClient(url) as client:
        assert client.health('live') is True
        channel = client._channel  # pylint: disable=protected-access
    assert client._channel is None  # pylint: disable=protected-access
    with pytest.raises(ValueError, match='closed channel'):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(), timeout=2)
    assert client.health('live') is True and client.requests_made == 2
    client.close()
    client.close()


def test_the_grpc_transport_imports_neither_the_http_one_nor_requests():
    root = os.path.dirname(
        os.path.dirname(
            os.path.dirname(
                os.path.dirname(
                    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(triton_grpc.__file__))))
                )
            )
        )
    )
    probe = (
        'import json, sys\n'
        f'sys.path.insert(0, {root!r})\n'
        'from ansible_collections.tritonops.shm.plugins.module_utils.wire import triton_grpc\n'
        "triton_grpc.TritonGrpcClient('grpc://127.0.0.1:8001')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('requests', 'urllib3', 'ansible_collections.')))))\n"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, '-c', probe], check=True, capture_output=True, text=True).stdout
    )
    assert 'ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc' in loaded, 'the probe imported it'
    assert 'ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http' not in loaded
    assert not [m for m in loaded if m.startswith(('requests', 'urllib3'))], loaded


# -- model repository (triton_backend_pool) -----------------------------------------------------


def test_repository_index_config_and_load_with_a_config(served):
    script, url = served
    client = TritonGrpcClient(url)
    assert client.repository_index() == [{'name': 'grow', 'version': '1', 'state': 'READY', 'reason': ''}]
    config = client.model_config('grow')
    assert config['name'] == 'grow' and config['backend'] == 'python'
    client.load_model('grow', config={'name': 'grow', 'parameters': {'p': {'string_value': '1'}}}, timeout=30)
    method, request, _meta = script.calls[-1]
    assert method == 'RepositoryModelLoad' and request.model_name == 'grow'
    assert json.loads(request.parameters['config'].string_param)['parameters'] == {'p': {'string_value': '1'}}


def test_a_load_refused_for_model_control_is_an_answer_not_a_connection_error(served):
    """Triton 2.51 refuses a load without explicit model control with UNAVAILABLE (measured), which otherwise means no answer."""
    script, url = served
    text = 'explicit model load / unload is not allowed if polling is enabled'
    script.model.model_control = 'poll'  # the model answers that text, UNAVAILABLE
    with pytest.raises(ModelControlRefused) as err:
        TritonGrpcClient(url).load_model('grow')
    assert err.value.status == 'UNAVAILABLE' and err.value.server_error == text
    assert 'cannot connect' not in err.value.msg


def test_a_restricted_protocol_without_its_header_names_the_headers_option_and_the_key(served):
    """Triton 2.51 started with --grpc-restricted-protocol=shared-memory:shm-key=V answers UNAVAILABLE with this text (measured)."""  # noqa: E501
    script, url = served
    script.model.restricted = ('shm-key', 'V')  # the model answers UNAVAILABLE with that text
    with pytest.raises(Restricted) as err:
        TritonGrpcClient(url).status('system')
    assert err.value.status == 'UNAVAILABLE' and err.value.header == 'triton-grpc-protocol-shm-key'
    assert 'cannot connect' not in err.value.msg and '--grpc-restricted-protocol' in err.value.msg
    assert 'give it in the headers option, headers: {triton-grpc-protocol-shm-key: <the value' in err.value.msg
