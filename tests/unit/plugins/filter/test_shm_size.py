"""Unit tests for the tritonops.shm.shm_size filter (the shm-size planner): tables of cases."""
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

import kubernetes_validate
from kubernetes_validate import utils as kubernetes_validate_utils

from ansible_collections.tritonops.shm.plugins.filter.shm_size import (
    FilterModule, docker_size, kubernetes_quantity, shm_size)
from ansible_collections.tritonops.shm.plugins.filter.triton_kubernetes import quantity_bytes

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
    # Kubernetes' binary quantities, as a node's allocatable memory is given
    ('kubernetes-binary-quantities',
     {'client_regions': [{'byte_size': '64Mi', 'count': 8}], 'python_backend_instances': 4,
      'python_backend_peak_byte_size': '16Mi', 'host_memory_bytes': f'{16 * 1024 * 1024}Ki'},
     {}, 720 * MIB, '720m', False),
    ('float-whole-bytes', {'extra_bytes': float(100 * MIB), 'headroom': 0}, {}, 100 * MIB, '100m', False),
]


@pytest.mark.parametrize('workload, overrides, expected_bytes, expected_docker, expected_capped',
                         [case[1:] for case in PLANS], ids=[case[0] for case in PLANS])
def test_plan(workload, overrides, expected_bytes, expected_docker, expected_capped):
    plan = shm_size(workload, **overrides)
    assert plan['bytes'] == expected_bytes
    assert plan['docker'] == expected_docker
    assert plan['capped'] is expected_capped
    assert set(plan) == {'bytes', 'docker', 'capped', 'breakdown', 'kubernetes'}


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
    ('decimal-kubernetes-quantity', {'extra_bytes': '1.5Gi'}, {}, "extra_bytes: cannot read '1.5Gi'"),
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


# -- the pod spec fragment (Kubernetes) -------------------------------------------------------------

VECTOR1 = {'client_regions': [{'byte_size': '64m', 'count': 8}], 'python_backend_instances': 4,
           'python_backend_peak_byte_size': '16m', 'host_memory_bytes': '16G'}


def test_the_schemas_cover_kubernetes_1_30_to_1_37():
    minors = {'.'.join(v.split('.')[:2]) for v in kubernetes_validate_utils.all_versions()}
    assert {f'1.{minor}' for minor in range(30, 38)} <= minors


def test_the_fragment_of_the_first_vector():
    k8s = shm_size(VECTOR1, server_memory_bytes='4G')['kubernetes']
    assert k8s['volume'] == {'name': 'dshm', 'emptyDir': {'medium': 'Memory', 'sizeLimit': '720Mi'}}
    assert k8s['volume_mount'] == {'name': 'dshm', 'mountPath': '/dev/shm'}
    assert k8s['size_limit'] == '720Mi'
    assert (k8s['memory_limit'], k8s['memory_limit_bytes']) == ('4816Mi', (720 + 4096) * MIB)
    assert k8s['memory_limit_includes_server'] is True
    notes = ' '.join(k8s['notes'])
    assert 'count against the memory limit' in notes
    assert 'the kubelet evicts the pod' in notes and 'kubernetes/kubernetes#28272' in notes
    assert 'at least 4816Mi: the 720Mi of /dev/shm plus the server\'s own 4096Mi' in notes


def test_without_the_server_memory_the_limit_is_only_the_floor_and_says_so():
    k8s = shm_size(VECTOR1)['kubernetes']
    assert (k8s['memory_limit'], k8s['memory_limit_includes_server']) == ('720Mi', False)
    assert 'PLUS the server\'s own memory' in k8s['notes'][1] and 'OOM-killed' in k8s['notes'][1]


@pytest.mark.parametrize('workload, size_limit', [
    ({}, '64Mi'),
    ({'floor_bytes': 1000}, '1000'),
    ({'extra_bytes': GIB, 'host_memory_bytes': GIB}, '512Mi'),  # capped: the fragment is the capped size
    ({'floor_bytes': '1g'}, '1024Mi'),
])
def test_the_size_limit_is_the_planned_bytes_as_a_quantity(workload, size_limit):
    plan = shm_size(workload)
    assert plan['kubernetes']['size_limit'] == size_limit
    assert plan['kubernetes']['volume']['emptyDir']['sizeLimit'] == size_limit
    assert quantity_bytes(size_limit) == plan['bytes']


@pytest.mark.parametrize('num_bytes, expected', [(MIB, '1Mi'), (720 * MIB, '720Mi'), (1000, '1000'), (MIB + 1, '1048577')])
def test_kubernetes_quantity(num_bytes, expected):
    assert kubernetes_quantity(num_bytes) == expected
    assert quantity_bytes(expected) == num_bytes


def test_server_memory_must_be_a_size():
    with pytest.raises(AnsibleFilterError, match='server_memory_bytes: cannot read'):
        shm_size({'server_memory_bytes': 'lots'})


def _pod_spec(k8s):
    """A Triton container and a client sidecar, both mounting the planned /dev/shm, as a user writes them."""
    mount = k8s['volume_mount']
    return {
        'containers': [
            {'name': 'tritonserver', 'image': 'nvcr.io/nvidia/tritonserver:26.04-py3',
             'args': ['tritonserver', '--model-repository=/models', '--allow-client-shm=true'],
             'resources': {'limits': {'memory': k8s['memory_limit']}, 'requests': {'memory': k8s['memory_limit']}},
             'volumeMounts': [mount]},
            {'name': 'client', 'image': 'registry.example/client:1', 'volumeMounts': [mount]},
        ],
        'volumes': [k8s['volume']],
    }


def test_the_fragment_validates_in_a_pod_and_a_deployment(k8s_version):
    k8s = shm_size(VECTOR1, server_memory_bytes='4G')['kubernetes']
    pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'triton'}, 'spec': _pod_spec(k8s)}
    labels = {'app': 'triton'}
    deployment = {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'triton'},
                  'spec': {'replicas': 1, 'selector': {'matchLabels': labels},
                           'template': {'metadata': {'labels': labels}, 'spec': _pod_spec(k8s)}}}
    for resource in (pod, deployment):
        assert kubernetes_validate.validate(resource, k8s_version, strict=True) == k8s_version


def test_the_validation_can_fail(k8s_version):
    """The schemas are strict: a misspelt emptyDir field or a sizeLimit that is not a quantity is refused."""
    spec = _pod_spec(shm_size(VECTOR1)['kubernetes'])
    spec['volumes'][0]['emptyDir']['sizeLimt'] = '1Gi'
    with pytest.raises(kubernetes_validate.ValidationError, match='sizeLimt'):
        kubernetes_validate.validate({'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 't'}, 'spec': spec},
                                     k8s_version, strict=True)
    spec = _pod_spec(shm_size(VECTOR1)['kubernetes'])
    spec['volumes'][0]['emptyDir']['sizeLimit'] = ['1Gi']
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 't'}, 'spec': spec},
                                     k8s_version, strict=True)
