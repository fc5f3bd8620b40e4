"""Every connection option changes what a server receives, over HTTP, over gRPC and through the event source.

test_connection_options.py holds the copies of the options to their names; this holds their behaviour. It iterates
connection.OPTIONS: each option is set, on its own, to a value other than its default, and the server (the unit tests'
fake Triton, tests/fakes/fake_triton.py, on loopback, over TLS where the option is a TLS parameter) sees something
else: the request reaches another server (the address), a header or metadata arrives (the headers), the handshake
succeeds or fails or presents the client's certificate (a TLS parameter), a slow server is given up on sooner or later
(the timeout). The probe is chosen by the option's ``wire``, not by its name, so a new option is probed as soon as it
is in the table, and an option without a wire, or one a transport ignores, fails here.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, Callable, NamedTuple

import pytest

pytest.importorskip('grpc')
pytest.importorskip('tritonclient.grpc.service_pb2')

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), 'extensions', 'eda'))

# pylint: disable=wrong-import-position
from test_triton_shm_source import collect, make_ca, make_cert, source  # noqa: E402

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient  # noqa: E402
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient  # noqa: E402
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import GrpcFront, GrpcTls, HttpFront, Triton  # noqa: E402

TRANSPORTS = ('http', 'grpc', 'source')
SLOW = 5.0  # seconds a slow server holds its answer (it lets go when it is closed)


class Seen(NamedTuple):
    """One status request made with some options: what the client got ('ok' or the error) and what each server saw
    (per server, the headers or metadata of each request, names in lower case)."""

    result: str
    reached: list[list[dict]]
    seconds: float


@pytest.fixture(scope='module')
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp('pki'))
    ca = make_ca(d, 'ca')
    server = make_cert(d, 'server', ca)
    client = make_cert(d, 'client', ca, server=False)
    both = os.path.join(d, 'client-and-key.pem')
    with open(both, 'w') as out:
        for part in (client['cert'], client['key']):
            with open(part) as f:
                out.write(f.read())
    return {'ca': ca['cert'], 'cert': server['cert'], 'key': server['key'], 'client_cert': client['cert'],
            'client_key': client['key'], 'client_both': both}  # fmt: skip


def front(transport: str, pki: dict | None = None, mtls: bool = False, slow: bool = False) -> Any:
    """The fake Triton over transport's protocol (the source polls either): TLS with pki, a client certificate asked
    for with mtls, the status held SLOW seconds with slow."""
    model = Triton()
    model.list('r', '/r')
    client_ca = pki['ca'] if pki and mtls else None
    if transport == 'grpc' or transport == 'source-grpc':
        srv = GrpcFront(model, GrpcTls(pki['key'], pki['cert'], client_ca) if pki else None)
        if slow:
            srv.slow['SystemSharedMemoryStatus'] = SLOW
        return srv
    tls = None
    if pki:
        import ssl  # pylint: disable=import-outside-toplevel

        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(pki['cert'], pki['key'])
        if client_ca:
            tls.verify_mode = ssl.CERT_REQUIRED
            tls.load_verify_locations(client_ca)
    return HttpFront(model, tls=tls, delay=SLOW if slow else 0.0)


def reached(srv: Any) -> list[dict]:
    if isinstance(srv, GrpcFront):
        return [{k.lower(): v for k, v in call.metadata.items()} for call in srv.calls]
    return [{k.lower(): v for k, v in r.headers.items()} for r in srv.requests]


def status(transport: str, options: dict, servers: list) -> Seen:
    """One system status read of options['url'] over transport (http, grpc: the module's client from its params;
    source: one poll of the event source), what each of servers saw."""
    started = time.monotonic()
    if transport == 'source':
        server = {'host': 'probe', **{k: v for k, v in options.items() if v is not None}}
        try:
            event = asyncio.run(collect({'servers': [server], 'interval': 60}, 1))[0]['triton_shm']
            result = 'ok' if event['status'] == 'up' else event['error']
        except source.ConfigError as exc:  # connection.OptionError, as the source names it
            result = f'refused: {exc}'
    else:
        params = {name: option.default for name, option in connection.OPTIONS.items()}
        params.update(options)
        transport_class = TritonGrpcClient if connection.is_grpc(params['url']) else TritonClient
        try:
            with transport_class.from_params(params) as client:
                client.status('system')
            result = 'ok'
        except TritonError as exc:
            result = exc.msg
    return Seen(result, [reached(s) for s in servers], time.monotonic() - started)


def protocol(transport: str, grpc_source: bool) -> str:
    """The fake's protocol for transport: the source polls HTTP, or gRPC with grpc_source."""
    return 'source-grpc' if transport == 'source' and grpc_source else transport


# -- one probe per wire part: each sets one option to a value other than its default, and shows the difference ------


def probe_address(transport: str, name: str, pki: dict, grpc_source: bool) -> None:
    """The URL decides which server the request reaches."""
    for first in (True, False):
        with front(protocol(transport, grpc_source)) as one, front(protocol(transport, grpc_source)) as other:
            target, idle = (one, other) if first else (other, one)
            seen = status(transport, {name: target.url}, [target, idle])
        assert seen.result == 'ok', seen
        assert seen.reached[0] and not seen.reached[1], f'{name}={target.url} over {transport}: {seen}'


def probe_timeout(transport: str, name: str, pki: dict, grpc_source: bool) -> None:
    """A slow server is given up on after timeout seconds: sooner with a shorter one."""
    with front(protocol(transport, grpc_source), slow=True) as slow:
        short = status(transport, {'url': slow.url, name: 0.3}, [slow])
        longer = status(transport, {'url': slow.url, name: 1.5}, [slow])
    for seen in (short, longer):
        assert 'timeout' in seen.result, (transport, seen)
    assert short.seconds < 1.2 <= longer.seconds < SLOW, (transport, short.seconds, longer.seconds)


def probe_headers(transport: str, name: str, pki: dict, grpc_source: bool) -> None:
    """The headers arrive: HTTP headers, gRPC metadata."""
    with front(protocol(transport, grpc_source)) as srv:
        plain = status(transport, {'url': srv.url}, [srv])
        sent = status(transport, {'url': srv.url, name: {'x-probe': 'p1'}}, [srv])
    assert plain.result == sent.result == 'ok', (plain, sent)
    assert 'x-probe' not in plain.reached[0][0] and sent.reached[0][-1].get('x-probe') == 'p1', (transport, sent)


def probe_header(transport: str, name: str, pki: dict, grpc_source: bool, header: str = '') -> None:
    """One header arrives under its own name (HTTP header, gRPC metadata)."""
    with front(protocol(transport, grpc_source)) as srv:
        plain = status(transport, {'url': srv.url}, [srv])
        sent = status(transport, {'url': srv.url, name: 'probe-value'}, [srv])
    assert plain.result == sent.result == 'ok', (plain, sent)
    assert sent.reached[0][-1].get(header.lower()) == 'probe-value' != plain.reached[0][0].get(header.lower())


def probe_verify(transport: str, name: str, pki: dict, grpc_source: bool) -> None:
    """validate_certs false: an untrusted certificate is accepted over HTTPS, refused as impossible over grpcs."""
    with front(protocol(transport, grpc_source), pki) as srv:
        checked = status(transport, {'url': srv.url}, [srv])
        unchecked = status(transport, {'url': srv.url, name: False}, [srv])
    assert checked.result != 'ok' and not checked.reached[0], checked
    if transport == 'grpc' or grpc_source:
        assert 'validate_certs' in unchecked.result and 'not possible' in unchecked.result, unchecked
    else:
        assert unchecked.result == 'ok' and unchecked.reached[0], unchecked


def probe_ca(transport: str, name: str, pki: dict, grpc_source: bool) -> None:
    """ca_path: the handshake trusts the server's CA; without it the request never reaches the server."""
    with front(protocol(transport, grpc_source), pki) as srv:
        system = status(transport, {'url': srv.url}, [srv])
        ours = status(transport, {'url': srv.url, name: pki['ca']}, [srv])
    assert system.result != 'ok' and not system.reached[0], system
    assert ours.result == 'ok' and ours.reached[0], ours


def probe_cert(transport: str, name: str, pki: dict, grpc_source: bool) -> None:
    """client_cert (a file with the key too): a server that asks for a client certificate gets it."""
    with front(protocol(transport, grpc_source), pki, mtls=True) as srv:
        without = status(transport, {'url': srv.url, 'ca_path': pki['ca']}, [srv])
        presented = status(transport, {'url': srv.url, 'ca_path': pki['ca'], name: pki['client_both']}, [srv])
    assert without.result != 'ok' and not without.reached[0], without
    assert presented.result == 'ok' and presented.reached[0], presented


def probe_key(transport: str, name: str, pki: dict, grpc_source: bool) -> None:
    """client_key: the key of a client_cert file without one; without it no certificate can be presented."""
    base = {'ca_path': pki['ca'], 'client_cert': pki['client_cert']}
    with front(protocol(transport, grpc_source), pki, mtls=True) as srv:
        keyless = status(transport, {'url': srv.url, **base}, [srv])
        keyed = status(transport, {'url': srv.url, **base, name: pki['client_key']}, [srv])
    assert keyless.result != 'ok' and not keyless.reached[0], keyless
    assert keyed.result == 'ok' and keyed.reached[0], keyed


PROBES: dict[tuple[str, str], Callable] = {
    (connection.ADDRESS, ''): probe_address,
    (connection.TIMEOUT, ''): probe_timeout,
    (connection.HEADERS, ''): probe_headers,
    (connection.TLS, 'verify'): probe_verify,
    (connection.TLS, 'ca'): probe_ca,
    (connection.TLS, 'cert'): probe_cert,
    (connection.TLS, 'key'): probe_key,
}


def probe_for(name: str) -> Callable:
    """The probe of option name's wire; a failure when it has none (an option must say how it is sent)."""
    wire = connection.OPTIONS[name].wire
    if wire is not None and wire.part == connection.HEADER and wire.name:
        return lambda *args: probe_header(*args, header=wire.name)
    if wire is None or tuple(wire) not in PROBES:
        pytest.fail(f'connection option {name} has no wire effect this test knows ({wire!r}): say how it is sent')
    return PROBES[tuple(wire)]


CASES = [(name, transport, False) for name in connection.OPTIONS for transport in TRANSPORTS]
CASES += [(name, 'source', True) for name in connection.OPTIONS]  # the source's own gRPC channel


@pytest.mark.parametrize(
    ('name', 'transport', 'grpc_source'),
    CASES,
    ids=[f'{n}-{t}{"-grpc" if g else ""}' for n, t, g in CASES],
)
def test_every_option_changes_what_the_server_receives(pki, name, transport, grpc_source):
    probe_for(name)(transport, name, pki, grpc_source)


@pytest.mark.parametrize(
    'transport,grpc_source', [('http', False), ('grpc', False), ('source', False), ('source', True)]
)
def test_one_user_agent_everywhere(transport, grpc_source):
    with front(protocol(transport, grpc_source)) as srv:
        seen = status(transport, {'url': srv.url}, [srv])
    agent = seen.reached[0][0]['user-agent']
    assert seen.result == 'ok' and agent.split(' ')[0] == connection.USER_AGENT == 'tritonops.shm', agent


def test_an_option_without_a_wire_is_refused(monkeypatch):
    monkeypatch.setitem(connection.OPTIONS, 'trial', connection.Option('str', 'x'))
    with pytest.raises(ValueError, match='trial does not say how it goes on the wire'):
        connection.wire_config({'url': 'http://127.0.0.1:1'})


def test_a_new_header_option_is_probed_and_sent(monkeypatch):
    """A header option added to the table alone reaches the servers over HTTP and through the source, and is probed."""
    for table in (connection.OPTIONS, source.poll.connection.OPTIONS):
        monkeypatch.setitem(table, 'trial', connection.Option('str', wire=connection.Wire('header', 'X-Trial')))
    monkeypatch.setattr(source.poll, 'PER_SERVER', (*source.poll.PER_SERVER, 'trial'))
    for transport in ('http', 'grpc', 'source'):
        probe_for('trial')(transport, 'trial', {}, False)
