"""Restricted APIs (issue 29) on a real Triton 2.51: the shm endpoints behind a header, over HTTP and gRPC.

One server started with ``--http-restricted-api=shared-memory:shm-key=VALUE`` and
``--grpc-restricted-protocol=shared-memory:shm-key=VALUE`` (2.51 parses ``API:KEY=VALUE``; its --help
shows a comma). Over HTTP it answers 403 ``This API is restricted, expecting header 'shm-key'``; over
gRPC UNAVAILABLE ``This protocol is restricted, expecting header 'triton-grpc-protocol-shm-key'``
(the key Triton checks in gRPC metadata carries that prefix). Stale regions are made as a dead
client leaves them: a file in the server's /dev/shm that nobody holds, registered (with the header).

- both modules over http:// and grpc://: with the header they read and clean; without it they fail
  with a message naming the ``headers`` option and the key, and change nothing;
- the cleanup playbook (tritonops.shm.cleanup) with ``-e shm_cleanup_headers``: cleans; without: fails naming it;
- the EDA poller (loaded as ansible-rulebook loads it, runpy.run_path) over http:// and grpc://: ``up``
  with the header, ``down`` without, its error naming ``headers`` and the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import urllib.error
import urllib.request

import ansible_helpers
import pytest
import tritonrig

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
KEY, VALUE = 'shm-key', 'r3stricted-s3cret'
GRPC_KEY = f'triton-grpc-protocol-{KEY}'
HEADERS = {'http': {KEY: VALUE}, 'grpc': {GRPC_KEY: VALUE}}
SOURCE = os.path.join(ansible_helpers.REPO, 'extensions', 'eda', 'plugins', 'event_source', 'triton_shm.py')


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    srv = tritonrig.TritonServer(
        workdir=str(tmp_path_factory.mktemp('restricted')),
        models=(),
        grpc=True,
        extra_args=(
            f'--http-restricted-api=shared-memory:{KEY}={VALUE}',
            f'--grpc-restricted-protocol=shared-memory:{KEY}={VALUE}',
        ),
    )
    srv.start()
    yield srv
    srv.cleanup()


def api(server, path, method='GET', headers=None):
    req = urllib.request.Request(
        server.url + path,
        method=method,
        data=b'{}' if method == 'POST' else None,
        headers=dict(headers or {}, **{'Content-Type': 'application/json'}),
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b'null')
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b'null')


def regions(server):
    status, data = api(server, '/v2/systemsharedmemory/status', headers={KEY: VALUE})
    assert status == 200, data
    return sorted(r['name'] for r in data)


def leak(server, name):
    """A region as a SIGKILLed client leaves it: its file (nobody holds it), registered under the header."""
    server.write_file(name, 4096)
    body = json.dumps({'key': f'/{name}', 'offset': 0, 'byte_size': 4096}).encode()
    req = urllib.request.Request(
        f'{server.url}/v2/systemsharedmemory/region/{name}/register',
        data=body,
        method='POST',
        headers={KEY: VALUE, 'Content-Type': 'application/json'},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_the_server_refuses_the_shm_api_without_the_header(server):
    assert api(server, '/v2/systemsharedmemory/status') == (
        403,
        {'error': f"This API is restricted, expecting header '{KEY}'"},
    )
    assert api(server, '/v2/systemsharedmemory/status', headers={KEY: 'wrong'})[0] == 403
    assert api(server, '/v2')[0] == 200, 'only shared-memory is restricted'


@pytest.mark.parametrize('transport', ['http', 'grpc'])
def test_both_modules_work_with_the_header_and_fail_naming_it_without(server, transport):
    url = server.url if transport == 'http' else server.grpc_scheme_url
    name = f'stale_{transport}'
    leak(server, name)
    key = KEY if transport == 'http' else GRPC_KEY
    flag = '--http-restricted-api' if transport == 'http' else '--grpc-restricted-protocol'
    for module, args in ((INFO, {}), (REGION, {'state': 'absent', 'stale': True})):
        refused = ansible_helpers.run_module(module, dict(args, url=url))
        assert refused.get('failed') is True, refused
        assert 'This ' in refused['msg'] and f"is restricted, expecting header '{key}'" in refused['msg'], refused[
            'msg'
        ]
        assert (
            flag in refused['msg'] and f'give it in the headers option, headers: {{{key}: <the value' in refused['msg']
        )
        assert refused['failure']['status'] == (403 if transport == 'http' else 'UNAVAILABLE'), refused['failure']
        assert 'cannot connect' not in refused['msg'] and VALUE not in json.dumps(refused)
        wrong = ansible_helpers.run_module(module, dict(args, url=url, headers={key: 'wrong'}))
        assert wrong.get('failed') is True and f"expecting header '{key}'" in wrong['msg'], wrong
    assert name in regions(server) and name in server.shm_files(), 'nothing changed without the header'
    info = ansible_helpers.run_module(INFO, {'url': url, 'headers': HEADERS[transport]})
    assert not info.get('failed'), info
    assert {r['name']: r['state'] for r in info['system_regions']}[name] == 'stale'
    clean = ansible_helpers.run_module(
        REGION, {'url': url, 'headers': HEADERS[transport], 'state': 'absent', 'stale': True}
    )
    assert not clean.get('failed') and clean['changed'] is True and clean['unregistered'] == [name], clean
    assert name not in regions(server) and name not in server.shm_files()
    again = ansible_helpers.run_module(
        REGION, {'url': url, 'headers': HEADERS[transport], 'state': 'absent', 'stale': True}
    )
    assert not again.get('failed') and again['changed'] is False, again
    assert VALUE not in json.dumps([info, clean, again]), 'the header value is never shown'


def test_the_cleanup_playbook_with_shm_cleanup_headers(server):
    leak(server, 'stale_playbook')
    inventory = {
        'all': {
            'children': {
                'triton': {
                    'hosts': {
                        'node': dict(
                            ansible_connection='local',
                            ansible_python_interpreter=ansible_helpers.PYTHON,
                            triton_url=server.url,
                        )
                    }
                }
            }
        }
    }
    refused = ansible_helpers.ansible_playbook(
        'tritonops.shm.cleanup', inventory=inventory, extra_vars={'prometheus_textfile_dir': ''}
    )
    assert refused.rc != 0, refused.stdout[-3000:]
    assert f"expecting header '{KEY}'" in refused.stdout and 'give it in the headers option' in refused.stdout
    assert 'stale_playbook' in regions(server) and 'stale_playbook' in server.shm_files()
    done = ansible_helpers.ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inventory,
        extra_vars={'prometheus_textfile_dir': '', 'shm_cleanup_headers': {KEY: VALUE}},
    )
    assert done.rc == 0, done.stdout[-4000:]
    assert 'stale_playbook' not in regions(server) and 'stale_playbook' not in server.shm_files()
    assert VALUE not in done.stdout + done.stderr + refused.stdout + refused.stderr


def poll_once(servers: list[dict]) -> dict:
    """One event per server from the source, loaded as ansible-rulebook loads it (runpy.run_path)."""
    main = runpy.run_path(SOURCE)['main']

    async def scenario() -> dict:
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(main(queue, {'servers': servers, 'interval': 60, 'timeout': 10}))
        events: dict = {}
        try:
            while len(events) < len(servers):
                event = await asyncio.wait_for(queue.get(), 60)
                events[event['triton_shm']['host']] = event['triton_shm']
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return events

    return asyncio.run(scenario())


def test_the_poller_over_http_and_grpc_with_and_without_the_header(server):
    leak(server, 'stale_poller')
    count = len(regions(server))
    events = poll_once(
        [
            {'host': 'http-key', 'url': server.url, 'headers': {KEY: VALUE}},
            {'host': 'http-none', 'url': server.url},
            {'host': 'grpc-key', 'url': server.grpc_scheme_url, 'headers': {GRPC_KEY: VALUE}},
            {'host': 'grpc-none', 'url': server.grpc_scheme_url},
        ]
    )
    for host in ('http-key', 'grpc-key'):
        assert events[host]['status'] == 'up' and events[host]['regions'] == count, events[host]
        assert events[host]['registered_bytes'] >= 4096
    for host, key in (('http-none', KEY), ('grpc-none', GRPC_KEY)):
        error = events[host]['error']
        assert events[host]['status'] == 'down' and f"is restricted, expecting header '{key}'" in error, error
        assert f'give it in the headers option, headers: {{{key}: <the value' in error, error
    assert 'HTTP 403' in events['http-none']['error'] and 'gRPC UNAVAILABLE' in events['grpc-none']['error']
    assert VALUE not in json.dumps(events)
