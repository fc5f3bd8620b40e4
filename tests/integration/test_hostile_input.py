"""Hostile or wrong input, on a real tritonserver: names HTTP cannot carry, `%` names, huge sizes, wrong types.

Keys with `..`/several components/NUL, symlinks and FIFOs in the shm dir, byte_size
0/negative, offset past the end and `orphan_patterns: ["*"]` are in
test_triton_shm_region.py and test_triton_shm_info.py; docs/reliability.md maps them.

A fact these tests rest on (Triton 2.51, checked against the real server): the HTTP
endpoint does not percent-decode region names, so `POST .../region/a%20b/register`
creates a region literally named `a%20b`. Names a URL path segment cannot carry
(space, `#`, `?`, `/`, non-ASCII) can only come from gRPC clients; the collection
reports them and never sends them.
"""

from __future__ import annotations

import json
import os

import ansible_helpers
import pytest
import tritonclient.grpc as grpcclient
import tritonrig

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
UNADDRESSABLE = {
    'a b': '/bad_space',
    'x#y': '/bad_hash',
    'q?z': '/bad_query',
    's/l': '/bad_slash',
    'ünï': '/bad_unicode',
}


def no_traceback(result):
    text = json.dumps(result)
    assert 'Traceback' not in text and 'File "' not in text and 'Module failed' not in text, text


def by_name(items):
    return dict((i['name'], i) for i in items)


def play(tasks):
    return [
        {
            'name': 'hostile input',
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'tasks': [dict(t, register='r', ignore_errors=True) for t in tasks],
        }
    ]


# -- `%` names are sent byte for byte and round-trip ---------------------------------------------


def test_percent_names_round_trip_byte_for_byte(make_triton):
    server = make_triton(models=())
    tasks = []
    for name, key in (('x%41', '/x41'), ('p%25y', '/p25y')):
        args = dict(url=server.url, name=name, key=key, byte_size=4096, create_file=True)
        tasks += [{'name': 'register ' + name, REGION: args}, {'name': 'again ' + name, REGION: args}]
    absent = dict(url=server.url, state='absent', name=['x%41', 'p%25y'])
    tasks += [{'name': 'unregister', REGION: absent}, {'name': 'unregister again', REGION: absent}]
    res = ansible_helpers.ansible_playbook(play(tasks))
    for name in ('x%41', 'p%25y'):
        first, again = res.task('register ' + name), res.task('again ' + name)
        assert first['changed'] is True and first['registered'] == [name], first
        assert name in by_name(first['regions']), 'Triton lists the name exactly as sent'
        assert again['changed'] is False, again
    regions = by_name(res.task('register p%25y')['regions'])
    assert set(regions) == {'x%41', 'p%25y'}, 'no decoding: never xA or p%y'
    gone, again = res.task('unregister'), res.task('unregister again')
    assert gone['changed'] is True and sorted(gone['unregistered']) == ['p%25y', 'x%41'], gone
    assert sorted(os.path.basename(p) for p in gone['removed_files']) == ['p25y', 'x41']
    assert again['changed'] is False
    assert server.system_regions() == {}


@pytest.mark.parametrize('name', sorted(UNADDRESSABLE))
def test_names_http_cannot_carry_are_refused_before_anything(make_triton, name):
    server = make_triton(models=())
    res = ansible_helpers.run_module(
        REGION, dict(url=server.url, name=name, key='/created', byte_size=4096, create_file=True)
    )
    assert res.get('failed') is True, res
    assert repr(name) in res['msg'] and "cannot be addressed over Triton's HTTP API" in res['msg']
    no_traceback(res)
    assert server.system_regions() == {}
    assert 'created' not in server.shm_files()


# -- regions that only gRPC clients can name ----------------------------------------------------


@pytest.fixture
def grpc_scene(tmp_path):
    """Stale regions with names HTTP cannot carry (registered over gRPC), one held one, and plain stale ones."""
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=(), grpc=True)
    server.start()
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for name, key in UNADDRESSABLE.items():
            with open(server.shm_path(key), 'wb') as f:  # a client's file, left behind: nobody holds it
                f.write(b'\0' * 4096)
            client.register_system_shared_memory(name, key, 4096)
        server.client('held_bad', register=False, byte_size=4096)
        client.register_system_shared_memory('held one', '/held_bad', 4096)
        client.close()
        plain = server.leak_many('plain', 3)
        yield server, plain
    finally:
        server.stop()


def test_grpc_named_regions_are_reported_and_skipped_others_cleaned(grpc_scene):
    server, plain = grpc_scene
    url = server.url
    res = ansible_helpers.ansible_playbook(
        play(
            [
                {'name': 'info', INFO: dict(url=url)},
                {'name': 'stale', REGION: dict(url=url, state='absent', stale=True)},
                {'name': 'all', REGION: dict(url=url, state='absent', all=True)},
                {'name': 'named', REGION: dict(url=url, state='absent', name=['a b'])},
            ]
        )
    )
    info, stale, every, named = (res.task(n) for n in ('info', 'stale', 'all', 'named'))
    for r in (info, stale, every, named):
        assert not r.get('failed'), r
        no_traceback(r)
    states = dict((r['name'], r['state']) for r in info['system_regions'])
    assert states == dict([(n, 'stale') for n in list(UNADDRESSABLE) + plain] + [('held one', 'healthy')])
    # stale: the plain ones go; each unaddressable stale one is skipped with the reason, its file kept
    assert sorted(stale['unregistered']) == sorted(plain)
    skipped = dict((s['name'], s['reason']) for s in stale['skipped_items'] if 'name' in s)
    assert set(skipped) == set(UNADDRESSABLE)
    assert all("cannot be addressed over Triton's HTTP API" in why and 'gRPC' in why for why in skipped.values())
    kept_paths = set(os.path.basename(s['path']) for s in stale['skipped_items'] if 'path' in s)
    assert kept_paths == set(k.lstrip('/') for k in UNADDRESSABLE.values())
    # all: nothing left it can address; the held one is skipped too, its holder's file kept
    assert every['unregistered'] == [] and every['changed'] is False
    assert set(s['name'] for s in every['skipped_items'] if 'name' in s) == set(UNADDRESSABLE) | {'held one'}
    assert named['changed'] is False and [s['name'] for s in named['skipped_items'] if 'name' in s] == ['a b']
    assert set(server.system_regions()) == set(UNADDRESSABLE) | {'held one'}
    assert set(server.shm_files()) == set(k.lstrip('/') for k in UNADDRESSABLE.values()) | {'held_bad'}


# -- byte_size huge --------------------------------------------------------------------------


@pytest.mark.parametrize(
    'byte_size,offset',
    [(1 << 40, 0), (1 << 63, 0), (1 << 64, 0), (4096, 1 << 62), (65 << 20, 0)],
    ids=['1TiB', '2**63', '2**64', 'offset-2**62', 'past-tmpfs'],
)
def test_huge_byte_size_is_refused_before_anything(make_triton, byte_size, offset):
    server = make_triton(models=(), shm_size='64m')
    res = ansible_helpers.run_module(
        REGION, dict(url=server.url, name='huge', key='/huge', byte_size=byte_size, offset=offset, create_file=True)
    )
    assert res.get('failed') is True, res
    no_traceback(res)
    assert 'larger than the whole shm filesystem' in res['msg'] and str(byte_size + offset) in res['msg']
    assert server.system_regions() == {} and 'huge' not in server.shm_files()


def test_huge_byte_size_past_an_existing_file_is_refused(make_triton):
    server = make_triton(models=())
    client = server.client('small', register=False, byte_size=4096)
    res = ansible_helpers.run_module(REGION, dict(url=server.url, name='small', key='/small', byte_size=1 << 63))
    assert res.get('failed') is True and 'past the end' in res['msg'], res
    no_traceback(res)
    assert server.system_regions() == {} and client.alive
    assert os.path.getsize(server.shm_path('small')) == 4096, 'never truncated or grown'


# -- wrong types for every option of both modules ---------------------------------------------------

CONNECTION = [
    ('url', ['http://x'], 'url'),
    ('url', {'a': 1}, 'url'),
    ('timeout', 'soon', "argument 'timeout'"),
    ('timeout', [1], "argument 'timeout'"),
    ('timeout', -1, 'timeout must be a positive'),
    ('validate_certs', 'maybe', "argument 'validate_certs'"),
    ('validate_certs', [True], "argument 'validate_certs'"),
    ('ca_path', {'a': 1}, 'ca_path'),
    ('ca_path', ['/etc/ssl'], 'ca_path'),
    ('headers', 'not-a-dict', "argument 'headers'"),
    ('headers', [1, 2], "argument 'headers'"),
    ('headers', 7, "argument 'headers'"),
    ('client_cert', {'a': 1}, 'client_cert'),
    ('client_key', {'a': 1}, 'client_key'),
    ('server_pid', 'init', "argument 'server_pid'"),
    ('server_pid', 1.5, "argument 'server_pid'"),
    ('shm_dir', {'a': 1}, 'shm_dir'),
    ('shm_dir', 17, 'shm_dir'),
]
INFO_ONLY = [
    ('orphan_patterns', {'a': 1}, "argument 'orphan_patterns'"),
    ('min_age', 'old', "argument 'min_age'"),
    ('min_age', [1], "argument 'min_age'"),
    ('query', {'a': 1}, 'query'),
    ('query', 42, 'query'),
]
REGION_ONLY = [
    ('state', 'sideways', 'value of state must be one of'),
    ('state', ['absent'], 'value of state must be one of'),
    ('kind', 'gpu', 'value of kind must be one of'),
    ('name', {'a': 1}, "argument 'name'"),
    ('key', {'a': 1}, 'key'),
    ('key', ['/k'], 'key'),
    ('offset', 'zero', "argument 'offset'"),
    ('offset', 1.5, "argument 'offset'"),
    ('byte_size', 'big', "argument 'byte_size'"),
    ('byte_size', 1.5, "argument 'byte_size'"),
    ('byte_size', {}, "argument 'byte_size'"),
    ('create_file', 'maybe', "argument 'create_file'"),
    ('raw_handle', {'a': 1}, 'raw_handle'),
    ('device_id', 'gpu0', "argument 'device_id'"),
    ('stale', 'maybe', "argument 'stale'"),
    ('stale', [1], "argument 'stale'"),
    ('all', 'everything', "argument 'all'"),
    ('orphan_files', 'maybe', "argument 'orphan_files'"),
    ('orphan_patterns', {'a': 1}, "argument 'orphan_patterns'"),
    ('min_age', 'old', "argument 'min_age'"),
    ('min_age', -5, 'min_age must be 0 or more'),
    ('exclude', {'a': 1}, "argument 'exclude'"),
    ('remove_file', 'maybe', "argument 'remove_file'"),
    ('in_use_timeout', 'soon', "argument 'in_use_timeout'"),
    ('in_use_timeout', -1, 'in_use_timeout must be 0 or more'),
]
CASES = [('info', o, v, n) for o, v, n in CONNECTION + INFO_ONLY] + [
    ('region', o, v, n) for o, v, n in CONNECTION + REGION_ONLY
]


def _case_id(case):
    module, option, value, _needle = case
    return '%s-%s-%s' % (module, option, json.dumps(value))


def _base_args(module, option, url):
    args = dict(url=url, timeout=5)
    if module == 'region':
        if option in ('key', 'offset', 'byte_size', 'create_file'):
            args.update(state='present', name=['typed'], key='/typed', byte_size=4096)
        elif option in ('raw_handle', 'device_id'):
            args.update(state='present', kind='cuda', name=['typed'], raw_handle='AAAA', device_id=0, byte_size=4096)
        else:
            args.update(state='absent', name=['no_such_region'])
        if option in ('orphan_patterns', 'min_age'):
            args.update(orphan_files=True, orphan_patterns=['never_*'])
    if option in ('ca_path', 'client_cert', 'client_key'):
        args['url'] = url.replace('http://', 'https://')
    return args


@pytest.fixture(scope='module')
def wrong_types(tmp_path_factory):
    """Every case in one ansible-playbook run: one inventory host per case, run in parallel, on a real server."""
    server = tritonrig.TritonServer(workdir=str(tmp_path_factory.mktemp('types')), models=())
    server.start()
    try:
        leaked = server.leak('must_stay', byte_size=4096)
        before = (server.system_regions(), server.shm_files())
        hosts = {}
        for i, case in enumerate(CASES):
            module, option, value, _needle = case
            args = _base_args(module, option, server.url)
            args[option] = value
            hosts['case%d' % i] = dict(
                ansible_connection='local',
                ansible_python_interpreter=ansible_helpers.PYTHON,
                case_module=module,
                case_args=args,
            )
        plays = [
            {
                'name': 'wrong types',
                'hosts': 'all',
                'gather_facts': False,
                'tasks': [
                    {'name': 'info', INFO: '{{ case_args }}', 'when': "case_module == 'info'", 'ignore_errors': True},
                    {
                        'name': 'region',
                        REGION: '{{ case_args }}',
                        'when': "case_module == 'region'",
                        'ignore_errors': True,
                    },
                ],
            }
        ]
        res = ansible_helpers.ansible_playbook(plays, inventory={'all': {'hosts': hosts}}, args=['--forks', '16'])
        after = (server.system_regions(), server.shm_files())
        assert leaked.proc.returncode is not None
        yield res, before, after
    finally:
        server.stop()


@pytest.mark.parametrize('case', CASES, ids=[_case_id(c) for c in CASES])
def test_wrong_type_is_a_clear_error_not_a_traceback(wrong_types, case):
    res, before, after = wrong_types
    module, option, _value, needle = case
    result = res.task(module, 'case%d' % CASES.index(case))
    assert result.get('failed') is True, result
    assert needle in result['msg'], 'expected %r in %r' % (needle, result['msg'])
    no_traceback(result)
    assert before == after, 'no wrong-typed call changed anything on the server or in /dev/shm'


# -- NUL bytes through a real playbook ----------------------------------------------------------


@pytest.mark.parametrize(
    'option,value,why',
    [
        # AnsibleModule itself refuses a NUL in a string option before the module runs (it cannot log the invocation);
        # the module's own check (test_shm_fs.py) says 'NUL'
        ('key', '/a\x00b', ('NUL', 'embedded null character')),
        ('name', 'a\x00b', ("cannot be addressed over Triton's HTTP API", 'embedded null character')),
    ],
    ids=['key', 'name'],
)
def test_nul_bytes_are_refused_before_anything(make_triton, option, value, why):
    server = make_triton(models=())
    args = dict(url=server.url, name='nul', key='/nul', byte_size=4096, create_file=True)
    args[option] = value
    res = ansible_helpers.run_module(REGION, args)
    assert res.get('failed') is True and any(w in res['msg'] for w in why), res
    no_traceback(res)
    assert server.system_regions() == {} and server.shm_files() == []
