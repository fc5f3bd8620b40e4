"""Unit tests for the tritonops.shm.shm_size filter (the shm-size planner): tables of cases."""
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.shm_size import FilterModule, docker_size, shm_size

MIB = 1 << 20
GIB = 1 << 30

# (id, workload, keyword overrides, expected bytes, expected docker, expected capped)
PLANS = [
    # the test vectors, exactly
    ('8x64MiB-clients-4x16MiB-python-16GiB-host',
     {'client_regions': [{'byte_size': 64 * MIB, 'count': 8}], 'python_backend_instances': 4,
      'python_backend_peak_byte_size': 16 * MIB, 'headroom': 0.25, 'host_memory_bytes': 16 * GIB},
     {}, 720 * MIB, '720m', False),
    ('1GiB-client-1GiB-host-capped',
     {'client_regions': [{'byte_size': GIB, 'count': 1}], 'headroom': 0.25, 'host_memory_bytes': GIB},
     {}, 512 * MIB, '512m', True),
    ('1MiB-client-floor',
     {'client_regions': [{'byte_size': MIB, 'count': 1}]},
     {}, 64 * MIB, '64m', False),
    # the same vectors written with size strings
    ('vector1-size-strings',
     {'client_regions': [{'byte_size': '64m', 'count': 8}], 'python_backend_instances': 4,
      'python_backend_peak_byte_size': '16M', 'host_memory_bytes': '16G'},
     {}, 720 * MIB, '720m', False),
    ('vector2-size-strings',
     {'client_regions': [{'byte_size': '1g'}], 'host_memory_bytes': '1G'},
     {}, 512 * MIB, '512m', True),
    # defaults and edges
    ('empty-plan-is-the-floor', {}, {}, 64 * MIB, '64m', False),
    ('no-input-is-the-floor', None, {}, 64 * MIB, '64m', False),
    ('count-defaults-to-1', {'client_regions': [{'byte_size': '100m'}]}, {}, 125 * MIB, '125m', False),
    ('python-default-peak-1MiB', {'python_backend_instances': 80}, {}, 100 * MIB, '100m', False),
    ('ceil-to-whole-MiB', {'extra_bytes': 100 * MIB + 1, 'headroom': 0}, {}, 101 * MIB, '101m', False),
    ('zero-headroom', {'client_regions': [{'byte_size': '96m', 'count': 1}], 'headroom': 0}, {}, 96 * MIB, '96m', False),
    ('headroom-0.1-exact', {'extra_bytes': 100 * MIB, 'headroom': 0.1}, {}, 110 * MIB, '110m', False),
    ('headroom-as-string', {'extra_bytes': 100 * MIB, 'headroom': '0.5'}, {}, 150 * MIB, '150m', False),
    ('several-region-sizes',
     {'client_regions': [{'byte_size': '8m', 'count': 10}, {'byte_size': '4m', 'count': 5}]},
     {}, 125 * MIB, '125m', False),
    ('count-zero', {'client_regions': [{'byte_size': '1g', 'count': 0}]}, {}, 64 * MIB, '64m', False),
    ('floor-not-whole-MiB', {'floor_bytes': 1000}, {}, 1000, '1000b', False),
    ('floor-raised', {'floor_bytes': '1g'}, {}, GIB, '1024m', False),
    ('just-under-the-cap', {'extra_bytes': 400 * MIB, 'host_memory_bytes': GIB}, {}, 500 * MIB, '500m', False),
    ('exactly-the-cap', {'extra_bytes': 512 * MIB, 'headroom': 0, 'host_memory_bytes': GIB}, {}, 512 * MIB, '512m', False),
    ('cap-rounded-down-to-MiB', {'extra_bytes': GIB, 'host_memory_bytes': 1001 * MIB}, {}, 500 * MIB, '500m', True),
    ('floor-above-the-cap-is-capped', {'host_memory_bytes': 100 * MIB}, {}, 50 * MIB, '50m', True),
    ('max-host-fraction', {'extra_bytes': GIB, 'host_memory_bytes': GIB, 'max_host_fraction': 0.75}, {}, 768 * MIB, '768m', True),
    ('fraction-1', {'extra_bytes': 2 * GIB, 'headroom': 0, 'host_memory_bytes': GIB, 'max_host_fraction': 1}, {}, GIB, '1024m', True),
    ('kwargs-override-input',
     {'client_regions': [{'byte_size': GIB}], 'host_memory_bytes': 64 * GIB},
     {'host_memory_bytes': GIB}, 512 * MIB, '512m', True),
    ('kwargs-only', {}, {'extra_bytes': '200m', 'headroom': 0}, 200 * MIB, '200m', False),
    ('none-means-default', {'headroom': None, 'extra_bytes': 100 * MIB}, {}, 125 * MIB, '125m', False),
    ('host-none-no-cap', {'extra_bytes': 10 * GIB, 'host_memory_bytes': None}, {}, 12800 * MIB, '12800m', False),
    ('float-whole-bytes', {'extra_bytes': float(100 * MIB), 'headroom': 0}, {}, 100 * MIB, '100m', False),
]


@pytest.mark.parametrize('workload, overrides, expected_bytes, expected_docker, expected_capped',
                         [case[1:] for case in PLANS], ids=[case[0] for case in PLANS])
def test_plan(workload, overrides, expected_bytes, expected_docker, expected_capped):
    plan = shm_size(workload, **overrides)
    assert plan['bytes'] == expected_bytes
    assert plan['docker'] == expected_docker
    assert plan['capped'] is expected_capped
    assert set(plan) == {'bytes', 'docker', 'capped', 'breakdown'}


def test_breakdown_of_the_first_vector():
    plan = shm_size({'client_regions': [{'byte_size': 64 * MIB, 'count': 8}], 'python_backend_instances': 4,
                     'python_backend_peak_byte_size': 16 * MIB, 'headroom': 0.25, 'host_memory_bytes': 16 * GIB})
    assert plan['breakdown'] == {
        'client_regions_bytes': 512 * MIB,
        'python_backend_bytes': 64 * MIB,
        'extra_bytes': 0,
        'subtotal_bytes': 576 * MIB,
        'headroom': 0.25,
        'with_headroom_bytes': 720 * MIB,
        'floor_bytes': 64 * MIB,
        'host_memory_bytes': 16 * GIB,
        'cap_bytes': 8 * GIB,
    }


def test_breakdown_without_host_memory_has_no_cap():
    plan = shm_size({'client_regions': [{'byte_size': MIB}]})
    assert plan['breakdown']['cap_bytes'] is None
    assert plan['breakdown']['host_memory_bytes'] is None
    assert plan['breakdown']['with_headroom_bytes'] == 2 * MIB


def test_input_is_not_modified():
    workload = {'client_regions': [{'byte_size': '64m'}]}
    shm_size(workload, host_memory_bytes=GIB)
    assert workload == {'client_regions': [{'byte_size': '64m'}]}


# (id, workload, keyword overrides, words the error must contain)
ERRORS = [
    ('not-a-dict', ['64m'], {}, 'must be a dict'),
    ('unknown-key-typo', {'client_region': []}, {}, "unknown key(s) client_region"),
    ('unknown-kwarg', {}, {'headrom': 0.1}, 'unknown key(s) headrom'),
    ('regions-not-a-list', {'client_regions': {'byte_size': 1}}, {}, 'client_regions must be a list'),
    ('region-not-a-dict', {'client_regions': ['64m']}, {}, 'client_regions[0] must be a dict'),
    ('region-without-byte-size', {'client_regions': [{'count': 2}]}, {}, 'client_regions[0]: byte_size is required'),
    ('region-unknown-key', {'client_regions': [{'byte_size': 1, 'size': 2}]}, {}, 'client_regions[0]: unknown key(s) size'),
    ('bad-size-string', {'client_regions': [{'byte_size': '64 MiB'}]}, {}, "client_regions[0].byte_size: cannot read '64 MiB'"),
    ('negative-size-string', {'extra_bytes': '-1m'}, {}, 'extra_bytes: cannot read'),
    ('negative-bytes', {'extra_bytes': -1}, {}, 'extra_bytes must not be negative'),
    ('bool-bytes', {'floor_bytes': True}, {}, 'floor_bytes must be a byte count'),
    ('fractional-bytes', {'extra_bytes': 1.5}, {}, 'extra_bytes must be a whole number of bytes'),
    ('negative-count', {'client_regions': [{'byte_size': 1, 'count': -1}]}, {}, 'client_regions[0].count must be a whole number >= 0, got -1'),
    ('count-not-int', {'client_regions': [{'byte_size': 1, 'count': 1.5}]}, {}, 'count must be a whole number'),
    ('instances-not-int', {'python_backend_instances': 'four'}, {}, 'python_backend_instances must be a whole number'),
    ('negative-headroom', {'headroom': -0.1}, {}, 'headroom must not be negative'),
    ('headroom-not-a-number', {'headroom': 'lots'}, {}, 'headroom must be a number'),
    ('headroom-list', {'headroom': [1]}, {}, 'headroom must be a number'),
    ('fraction-zero', {'max_host_fraction': 0}, {}, 'max_host_fraction must be > 0 and <= 1'),
    ('fraction-above-one', {'max_host_fraction': 1.5}, {}, 'max_host_fraction must be > 0 and <= 1'),
    ('host-zero', {'host_memory_bytes': 0}, {}, 'host_memory_bytes must be > 0'),
    ('host-bad-string', {'host_memory_bytes': 'sixteen'}, {}, 'host_memory_bytes: cannot read'),
]


@pytest.mark.parametrize('workload, overrides, words', [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS])
def test_errors(workload, overrides, words):
    with pytest.raises(AnsibleFilterError) as info:
        shm_size(workload, **overrides)
    assert words in str(info.value)
    assert str(info.value).startswith('shm_size: ')


def test_bad_size_string_keeps_the_cause():
    with pytest.raises(AnsibleFilterError) as info:
        shm_size({'extra_bytes': '1GiB'})
    assert isinstance(info.value.orig_exc, ValueError)


@pytest.mark.parametrize('num_bytes, expected', [
    (MIB, '1m'), (720 * MIB, '720m'), (GIB, '1024m'), (1000, '1000b'), (MIB + 1, '1048577b'),
])
def test_docker_size(num_bytes, expected):
    assert docker_size(num_bytes) == expected


def test_filter_is_registered():
    assert FilterModule().filters()['shm_size'] is shm_size
