"""The gRPC transport (grpc:// and grpcs:// URLs) on real tritonservers and real tritonclient.grpc clients.

- A server with both endpoints: info and cleanup over http:// and grpc:// give the same
  results for healthy, stale, dangling and orphan; names HTTP cannot carry are skipped over
  HTTP with a reason that names grpc://, and cleaned over gRPC.
- A server started with --allow-http=false: info, stale cleanup and the cleanup playbook
  (the shm_cleanup role) through grpc://; "my region#1" registered by a real
  tritonclient.grpc client that is then SIGKILLed is reported and cleaned, a live gRPC
  client's region is kept.
- gRPC over TLS (--grpc-use-ssl, client certificates required) with certificates from CAs
  made in the test: our CA + client certificate works (also as a ca_path directory and one
  PEM file holding certificate and key), another CA fails clearly, no client certificate
  fails, validate_certs=false is refused with the reason.
"""

from __future__ import annotations

import base64
import json
import os

import ansible_helpers
import proxy_helpers
import pytest
import tritonrig

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
KiB = 4096
AGED = 2.0  # seconds: the orphan's min_age; `both` waits until it is older (tritonrig.wait_older)
UNADDRESSABLE = {'a b': '/un_space', 'x#y': '/un_hash', 'ünï': '/un_unicode', 's/l': '/un_slash'}
VOLATILE = ('age_s', 'scanned_at', 'url', 'located_by')
SECRET = 'Bearer s3cr3t-grpc-metadata-do-not-log'


def play(tasks, check_tasks=()):
    return [
        {
            'name': 'grpc',
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'tasks': [dict(t, register='r', ignore_errors=True, check_mode=t['name'] in check_tasks) for t in tasks],
        }
    ]


def no_failure(*results):
    for r in results:
        assert not r.get('failed'), r
        text = json.dumps(r)
        assert 'Traceback' not in text and 'Module failed' not in text, text


def stable(value):
    """A result without what differs between two runs (ages, scan time, the URL itself), regions ordered by name."""
    if isinstance(value, dict):
        return dict((k, stable(v)) for k, v in value.items() if k not in VOLATILE)
    if isinstance(value, list):
        items = [stable(v) for v in value]
        if all(isinstance(i, dict) and 'name' in i for i in items):
            items.sort(key=lambda i: i['name'])
        return items
    return value


def names(items, key='name'):
    return sorted(i[key] for i in items if key in i)


# -- both endpoints: the same answers over HTTP and gRPC ----------------------------------------


@pytest.fixture
def both(tmp_path):
    """Healthy, stale, dangling, orphan (plain names, HTTP clients) + stale regions with names only gRPC can carry."""
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=(), grpc=True)
    server.start()
    try:
        orphan = server.write_file('client_orphan', KiB)  # first: it ages while the clients start
        server.client('healthy', byte_size=KiB)
        server.leak('stale', byte_size=KiB)
        server.leak('dangling', byte_size=KiB, keep_file=False)
        with server.grpc_client() as client:
            for name, key in UNADDRESSABLE.items():
                server.write_file(key, KiB)  # the file a gRPC client left behind: nobody holds it
                client.register_system_shared_memory(name, key, KiB)
        tritonrig.wait_older([orphan], AGED)
        yield server
    finally:
        server.stop()


def test_same_results_over_http_and_grpc_and_grpc_cleans_what_http_cannot(both):
    http, grpc = both.url, 'grpc://' + both.grpc_url
    info = dict(orphan_patterns=['client_*'], min_age=AGED)
    clean = dict(state='absent', stale=True, orphan_files=True, orphan_patterns=['client_*'], min_age=AGED)
    res = ansible_helpers.ansible_playbook(
        play(
            [
                {'name': 'info http', INFO: dict(info, url=http)},
                {'name': 'info grpc', INFO: dict(info, url=grpc)},
                {'name': 'check http', REGION: dict(clean, url=http)},
                {'name': 'check grpc', REGION: dict(clean, url=grpc)},
                {'name': 'clean http', REGION: dict(clean, url=http)},
                {'name': 'clean grpc', REGION: dict(clean, url=grpc)},
                {'name': 'again grpc', REGION: dict(clean, url=grpc)},
                {'name': 'after grpc', INFO: dict(info, url=grpc)},
            ],
            check_tasks=('check http', 'check grpc'),
        )
    )
    tasks = (
        'info http',
        'info grpc',
        'check http',
        'check grpc',
        'clean http',
        'clean grpc',
        'again grpc',
        'after grpc',
    )
    r = dict((n, res.task(n)) for n in tasks)
    no_failure(*r.values())
    states = dict((x['name'], x['state']) for x in r['info grpc']['system_regions'])
    assert states == dict(
        [('healthy', 'healthy'), ('stale', 'stale'), ('dangling', 'dangling')] + [(n, 'stale') for n in UNADDRESSABLE]
    ), states
    assert [f['name'] for f in r['info grpc']['files'] if f['category'] == 'orphan'] == ['client_orphan']
    # the same report, region by region and file by file, whichever the transport
    assert stable(r['info grpc']) == stable(r['info http'])
    assert r['info grpc']['server']['url'] == grpc and r['info http']['server']['url'] == http
    # HTTP: the plain stale and dangling regions and the orphan; the others skipped with the way out
    reclaim = sorted(['stale', 'dangling'])
    assert r['check http']['unregistered'] == reclaim and r['clean http']['unregistered'] == reclaim
    skipped = dict((s['name'], s['reason']) for s in r['clean http']['skipped_items'] if 'name' in s)
    assert sorted(skipped) == sorted(UNADDRESSABLE)
    assert all('grpc://' in why and "cannot be addressed over Triton's HTTP API" in why for why in skipped.values()), (
        skipped
    )
    # gRPC: what HTTP did plus the names HTTP cannot carry, predicted exactly by check mode
    assert r['check grpc']['unregistered'] == sorted(reclaim + list(UNADDRESSABLE))
    assert sorted(map(os.path.basename, r['check grpc']['removed_files'])) == sorted(
        list(map(os.path.basename, r['check http']['removed_files'])) + [k[1:] for k in UNADDRESSABLE.values()]
    )
    assert sorted(r['clean grpc']['unregistered']) == sorted(UNADDRESSABLE) and r['clean grpc']['changed'] is True
    assert sorted(os.path.basename(p) for p in r['clean grpc']['removed_files']) == sorted(
        k[1:] for k in UNADDRESSABLE.values()
    )
    assert [s for s in r['clean grpc']['skipped_items'] if 'name' in s] == []
    assert r['again grpc']['changed'] is False and r['again grpc']['unregistered'] == []
    assert [x['name'] for x in r['after grpc']['system_regions']] == ['healthy']
    assert set(both.system_regions()) == {'healthy'}
    assert both.shm_files() == ['healthy']


# -- HTTP turned off: only gRPC --------------------------------------------------------------


@pytest.fixture
def grpc_only(tmp_path):
    """--allow-http=false; "my region#1" from a killed tritonclient.grpc client, a live gRPC client, a dangling one."""
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=(), http=False)
    server.start()
    try:
        assert server.url.startswith('grpc://') and server.http_port is None
        server.leak('my region#1', key='/my_region_1', byte_size=KiB)
        server.client('live grpc', key='/live_grpc', byte_size=KiB)
        server.leak('gone', key='/gone', byte_size=KiB, keep_file=False)
        yield server
    finally:
        server.stop()


def test_http_off_info_and_stale_cleanup_through_grpc(grpc_only):
    url = grpc_only.url
    new = dict(url=url, name='new region#2', key='/new2', byte_size=KiB, create_file=True)
    res = ansible_helpers.ansible_playbook(
        play(
            [
                {'name': 'info', INFO: dict(url=url, headers={'Authorization': SECRET})},
                {'name': 'check', REGION: dict(url=url, state='absent', stale=True)},
                {'name': 'after check', INFO: dict(url=url)},
                {'name': 'clean', REGION: dict(url=url, state='absent', stale=True)},
                {'name': 'again', REGION: dict(url=url, state='absent', stale=True)},
                {'name': 'register', REGION: new},
                {'name': 'register again', REGION: new},
                {'name': 'check regions', INFO: dict(url=url)},
                {
                    'name': 'unregister it',
                    REGION: dict(url=url, state='absent', name=['new region#2'], headers={'Authorization': SECRET}),
                },
                {
                    'name': 'cuda register',
                    REGION: dict(
                        url=url,
                        kind='cuda',
                        name=['gpu one'],
                        raw_handle=base64.b64encode(b'\0' * 64).decode(),
                        device_id=0,
                        byte_size=KiB,
                    ),
                },
                {'name': 'cuda all', REGION: dict(url=url, kind='cuda', state='absent', all=True)},
                {'name': 'http url', INFO: dict(url='http://%s:%d' % (grpc_only.host, grpc_only.grpc_port))},
            ],
            check_tasks=('check',),
        )
    )
    info, check, clean, again, http = (res.task(n) for n in ('info', 'check', 'clean', 'again', 'http url'))
    no_failure(info, check, res.task('after check'), clean, again)
    assert info['server']['live'] is True and info['server']['ready'] is True and info['server']['pid'] == grpc_only.pid
    states = dict((x['name'], x['state']) for x in info['system_regions'])
    assert states == {'my region#1': 'stale', 'live grpc': 'healthy', 'gone': 'dangling'}
    assert check['changed'] is True and check['unregistered'] == ['gone', 'my region#1']
    assert stable(res.task('after check')['system_regions']) == stable(info['system_regions']), (
        'check mode changed nothing'
    )
    assert clean['changed'] is True and sorted(clean['unregistered']) == ['gone', 'my region#1']
    assert [os.path.basename(p) for p in clean['removed_files']] == ['my_region_1'] and clean['freed_bytes'] >= KiB
    assert again['changed'] is False
    assert set(grpc_only.system_regions()) == {'live grpc'}
    assert grpc_only.shm_files() == ['live_grpc']
    # a name HTTP cannot carry, registered and unregistered by the module over gRPC
    reg, again, regions, gone = (res.task(n) for n in ('register', 'register again', 'check regions', 'unregister it'))
    no_failure(reg, again, regions, gone)
    assert reg['changed'] is True and reg['registered'] == ['new region#2'] and again['changed'] is False
    assert [(x['key'], x['byte_size']) for x in regions['system_regions'] if x['name'] == 'new region#2'] == [
        ('/new2', KiB)
    ]
    assert gone['unregistered'] == ['new region#2'] and [os.path.basename(p) for p in gone['removed_files']] == ['new2']
    assert set(grpc_only.system_regions()) == {'live grpc'} and grpc_only.shm_files() == ['live_grpc']
    assert SECRET not in res.stdout and SECRET not in res.stderr, 'headers (gRPC metadata) never logged'
    # CUDA over gRPC: status (none here), and this GPU-less server's own refusal, as over HTTP
    assert info['cuda_regions'] == [] and res.task('cuda all')['changed'] is False
    cuda = res.task('cuda register')
    assert cuda.get('failed') is True and cuda['msg'].startswith("register cuda region 'gpu one' at %s: gRPC " % url), (
        cuda
    )
    assert cuda['failure']['server_error'] == 'failed to register shared memory region: invalid args', cuda['failure']
    # pointing http:// at the gRPC port fails with a clear message, not a traceback
    assert http.get('failed') is True and 'Traceback' not in http['msg'], http


def test_http_off_cleanup_playbook_through_grpc(grpc_only):
    inventory = {
        'all': {
            'children': {
                'triton': {
                    'hosts': {
                        'node': dict(
                            ansible_connection='local',
                            ansible_python_interpreter=ansible_helpers.PYTHON,
                            triton_url=grpc_only.url,
                        )
                    }
                }
            }
        }
    }
    res = ansible_helpers.ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inventory,
        extra_vars={'prometheus_textfile_dir': ''},
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )
    assert res.rc == 0, res.stdout[-4000:]
    outcome = res.data['global_custom_stats']['tritonops_shm_cleanup']['node']
    assert outcome['status'] == 'ok' and outcome['changed'] is True, outcome
    assert sorted(outcome['done']['unregistered']) == ['gone', 'my region#1']
    assert [os.path.basename(p) for p in outcome['done']['removed_files']] == ['my_region_1']
    assert set(grpc_only.system_regions()) == {'live grpc'}
    assert grpc_only.shm_files() == ['live_grpc']
    again = ansible_helpers.ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inventory,
        extra_vars={'prometheus_textfile_dir': ''},
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )
    assert again.rc == 0 and again.stats['node']['changed'] == 0, again.stats


# -- gRPC over TLS -------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path):
    d = str(tmp_path)
    ca, other = proxy_helpers.make_ca(d, 'test-ca'), proxy_helpers.make_ca(d, 'other-ca')
    cert = proxy_helpers.make_cert(d, 'triton', ca)
    os.mkdir(os.path.join(d, 'cas'))  # a ca_path directory: the other CA and ours
    for name, src in (('a-other.pem', other['cert']), ('b-ours.pem', ca['cert'])):
        with open(src) as f, open(os.path.join(d, 'cas', name), 'w') as out:
            out.write(f.read())
    client = proxy_helpers.make_cert(d, 'client', ca, server=False)
    tls = dict(
        cert=cert['cert'],
        key=cert['key'],
        ca=ca['cert'],
        root=ca['cert'],
        client_cert=client['cert'],
        client_key=client['key'],
    )
    server = tritonrig.TritonServer(workdir=d, models=(), grpc_tls=tls)
    server.start()
    try:
        server.leak('stale_behind_tls', byte_size=KiB)
        yield server, dict(ca=ca['cert'], other=other['cert'], client_cert=client['cert'], client_key=client['key'])
    finally:
        server.stop()


def test_grpcs_verified_with_our_ca_and_client_certificate(tls_server):
    server, pki = tls_server
    url = server.grpc_scheme_url
    assert url.startswith('grpcs://')
    mtls = dict(url=url, ca_path=pki['ca'], client_cert=pki['client_cert'], client_key=pki['client_key'])
    combined = os.path.join(
        os.path.dirname(pki['ca']), 'client-with-key.pem'
    )  # a client_cert file that holds the key too
    with open(combined, 'w') as out:
        for part in (pki['client_cert'], pki['client_key']):
            with open(part) as f:
                out.write(f.read())
    res = ansible_helpers.ansible_playbook(
        play(
            [
                {'name': 'ours', INFO: mtls},
                {
                    'name': 'one pem',
                    INFO: dict(url=url, ca_path=os.path.dirname(pki['ca']) + '/cas', client_cert=combined),
                },
                {'name': 'clean', REGION: dict(mtls, state='absent', stale=True)},
                {'name': 'other ca', INFO: dict(mtls, ca_path=pki['other'])},
                {'name': 'no client cert', INFO: dict(url=url, ca_path=pki['ca'])},
                {'name': 'no verify', INFO: dict(mtls, validate_certs=False)},
                {'name': 'plain grpc', INFO: dict(url='grpc://' + server.grpc_url)},
            ]
        )
    )
    ours, clean = res.task('ours'), res.task('clean')
    no_failure(ours, clean, res.task('one pem'))
    assert [x['state'] for x in ours['system_regions'] if x['name'] == 'stale_behind_tls'] == ['stale']
    assert clean['unregistered'] == ['stale_behind_tls'] and 'stale_behind_tls' not in server.system_regions()
    other = res.task('other ca')
    assert other.get('failed') is True and 'TLS verification failed' in other['msg'] and url in other['msg'], other
    for name in ('no client cert', 'plain grpc'):
        bad = res.task(name)
        assert bad.get('failed') is True and server.grpc_url in bad['msg'] and 'Traceback' not in bad['msg'], bad
    noverify = res.task('no verify')
    assert noverify.get('failed') is True and 'validate_certs=false is not possible' in noverify['msg'], noverify
