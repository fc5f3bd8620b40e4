"""Unit tests for module_utils/rules/families.py: the families of other software's files in /dev/shm (issue 42, goal 1)."""

from __future__ import annotations

import os
import re

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.rules import families

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


@pytest.mark.parametrize(
    'name, family',
    [
        ('nccl-AbC123', 'nccl'),
        ('vllm_offload_7.mmap', 'vllm'),
        ('sgl_shm_0', 'sglang'),
        ('psm_1a2b3c4d', 'python_shared_memory'),
        ('psm2_shm.77', 'psm'),
        ('psm_shm.77', 'psm'),
        ('torch_4711_123', 'pytorch'),
        ('ucx_shm_posix_1', 'mpi_ucx'),
        ('sem.lock', 'posix_semaphore'),
        ('client_in_0', None),
        ('triton_python_backend_shm_region_1', None),
    ],
)
def test_a_files_family(name, family):
    found = families.family_of(name)
    assert (found.name if found else None) == family


def test_count_by_family_held_and_not_with_the_holders_containers():
    files = [
        dict(name='nccl-a', category='in_use', allocated_bytes=8, holders=[dict(pid=1, container=dict(name='ml/p-0'))]),
        dict(name='nccl-b', category='foreign', allocated_bytes=4, holders=[]),
        dict(name='mystery', category='foreign', allocated_bytes=2, holders=[]),
        dict(name='client_x', category='orphan', allocated_bytes=1, holders=[]),  # Triton's side: not counted
        dict(name='dir', category='foreign', type='directory', allocated_bytes=0),
    ]
    (nccl, other) = families.count(files, families.FAMILIES, ('foreign', 'in_use'))
    assert (nccl['name'], nccl['files'], nccl['bytes'], nccl['held_bytes'], nccl['unheld_bytes']) == (
        'nccl',
        2,
        12,
        8,
        4,
    )
    assert nccl['containers'] == ['ml/p-0'] and (other['name'], other['files']) == ('other', 1)


def test_extra_families_come_first_and_bad_ones_are_refused():
    table = families.table([dict(name='fs', patterns=['nccl-*'], description='ours')])
    assert families.family_of('nccl-1', table).name == 'fs'
    assert 'name and patterns' in families.check_extra([dict(name='x')])
    assert 'twice or is reserved' in families.check_extra([dict(name='other', patterns=['a*'])])
    assert 'every name' in families.check_extra([dict(name='all', patterns=['*'])])
    assert families.check_extra([dict(name='fs', patterns=['fs_*'])]) is None


@pytest.mark.parametrize('page', ['shm-families.md', 'shm-families.zh.md'])
def test_the_docs_table_is_the_code_table(page):
    with open(os.path.join(ROOT, 'docs', page), encoding='utf-8') as f:
        rows = re.findall(r'^\| `(\w+)` \| (.*?) \|', f.read(), re.M)
    assert [(name, tuple(re.findall(r'`([^`]+)`', pats))) for name, pats in rows] == [
        (f.name, f.patterns) for f in families.FAMILIES
    ]
