"""Module-level unit tests: both modules refuse bad arguments with a clear message, before any request.

main() runs with set_module_args-style input (ansible.module_utils.testing.patch_module_args); the
URL points at a closed port, so a module that got past validation would fail with a connection error
instead of the expected message. No root, no server.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.tritonops.shm.plugins.modules import triton_backend_pool, triton_shm_info, triton_shm_region
from ansible_collections.tritonops.shm.tests.unit.plugins.module_args import patch_module_args

URL = 'http://127.0.0.1:9'  # discard port: nothing answers


def run_main(module, args, capsys):
    with patch_module_args(dict(url=URL, **args)):
        with pytest.raises(SystemExit) as exc:
            module.main()
    out = capsys.readouterr().out
    return exc.value.code, json.loads(out[out.index('{') :])


REGION_CASES = [
    ('present-without-name', dict(state='present', key='/k', byte_size=1), 'state=present needs name'),
    (
        'present-two-names',
        dict(state='present', name=['a', 'b'], key='/k', byte_size=1),
        'state=present registers one region per task, got 2',
    ),
    (
        'present-with-stale',
        dict(state='present', name=['a'], key='/k', byte_size=1, stale=True),
        'stale applies to state=absent only',
    ),
    (
        'present-system-without-key',
        dict(state='present', name=['a'], byte_size=1),
        'state=present with kind=system needs key',
    ),
    ('absent-without-selector', dict(state='absent'), 'state=absent needs a selector'),
    ('orphans-without-patterns', dict(state='absent', orphan_files=True), 'orphan_files=true needs orphan_patterns'),
    ('negative-min-age', dict(state='absent', stale=True, min_age=-1), 'min_age must be 0 or more seconds'),
    (
        'negative-in-use-timeout',
        dict(state='absent', stale=True, in_use_timeout=-1),
        'in_use_timeout must be 0 or more seconds',
    ),
    ('empty-name', dict(state='absent', name=['']), 'region names must not be empty'),
    (
        'inventory-present',
        dict(state='present', name=['a'], key='/k', byte_size=1, inventory=True),
        'inventory applies to state=absent with kind=system only',
    ),
    (
        'inventory-cuda',
        dict(state='absent', kind='cuda', name=['a'], inventory=True),
        'inventory applies to state=absent with kind=system only',
    ),
    ('unknown-state', dict(state='gone'), 'value of state must be one of: present, absent'),
    ('zero-timeout', dict(state='absent', stale=True, timeout=0), 'timeout must be a positive number of seconds'),
    ('unknown-option', dict(state='absent', stale=True, treshold=3), 'Unsupported parameters'),
]


@pytest.mark.parametrize('args, msg', [c[1:] for c in REGION_CASES], ids=[c[0] for c in REGION_CASES])
def test_region_module_refuses(args, msg, capsys):
    rc, result = run_main(triton_shm_region, args, capsys)
    assert rc == 1 and result['failed'] is True
    assert msg in result['msg'], result['msg']
    assert 'cannot connect' not in result['msg']


INFO_CASES = [
    ('zero-timeout', dict(timeout=0), 'timeout must be a positive number of seconds'),
    ('bad-query', dict(query='system_regions[?'), "query 'system_regions[?' is not a valid JMESPath expression"),
    ('unknown-option', dict(min_ag=3), 'Unsupported parameters'),
]


@pytest.mark.parametrize('args, msg', [c[1:] for c in INFO_CASES], ids=[c[0] for c in INFO_CASES])
def test_info_module_refuses(args, msg, capsys):
    rc, result = run_main(triton_shm_info, args, capsys)
    assert rc == 1 and result['failed'] is True
    assert msg in result['msg'], result['msg']


def test_info_module_past_validation_reports_the_unreachable_server(capsys):
    """The control case: valid arguments reach the network and fail there, naming the URL."""
    rc, result = run_main(triton_shm_info, dict(timeout=2), capsys)
    assert rc == 1 and URL in result['msg'], result['msg']


POOL_CASES = [
    ('no-limit', dict(), 'one of the following is required: max_bytes, max_percent'),
    ('negative-bytes', dict(max_bytes=-1), 'max_bytes must not be negative, got -1'),
    ('negative-percent', dict(max_percent=-5.0), 'max_percent must not be negative, got -5.0'),
    ('zero-timeout', dict(max_bytes=1, timeout=0), 'timeout must be a positive number of seconds'),
]


@pytest.mark.parametrize('args, msg', [c[1:] for c in POOL_CASES], ids=[c[0] for c in POOL_CASES])
def test_backend_pool_module_refuses(args, msg, capsys):
    rc, result = run_main(triton_backend_pool, args, capsys)
    assert rc == 1 and result['failed'] is True
    assert msg in result['msg'], result['msg']
    assert 'cannot connect' not in result['msg']
