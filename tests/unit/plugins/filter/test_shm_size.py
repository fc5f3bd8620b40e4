"""Unit tests for the tritonops.shm.shm_size filter (the shm-size planner): tables of cases."""

from __future__ import annotations

import kubernetes_validate
import pytest
from ansible.errors import AnsibleFilterError
from kubernetes_validate import utils as kubernetes_validate_utils

from ansible_collections.tritonops.shm.plugins.filter.shm_size import FilterModule
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.kubernetes import quantity_bytes
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.sizing import (
    docker_size,
    kubernetes_quantity,
    pool_bound,
    pool_bytes,
    shm_size,
)

MIB = 1 << 20
GIB = 1 << 30

# (id, workload, keyword overrides, expected bytes, expected docker, expected capped)
PLANS = [
    # the test vectors, exactly
    (
        '8x64MiB-clients-4x16MiB-python-16GiB-host',
        {
            'client_regions': [{'byte_size': 64 * MIB, 'count': 8}],
            'python_backend_instances': 4,
            'python_backend_peak_byte_size': 16 * MIB,
            'headroom': 0.25,
            'host_memory_bytes': 16 * GIB,
        },
        {},
        720 * MIB,
        '720m',
        False,
    ),
    (
        '1GiB-client-1GiB-host-capped',
        {'client_regions': [{'byte_size': GIB, 'count': 1}], 'headroom': 0.25, 'host_memory_bytes': GIB},
        {},
        512 * MIB,
        '512m',
        True,
    ),
    ('1MiB-client-floor', {'client_regions': [{'byte_size': MIB, 'count': 1}]}, {}, 64 * MIB, '64m', False),
    # the same vectors written with size strings
    (
        'vector1-size-strings',
        {
            'client_regions': [{'byte_size': '64m', 'count': 8}],
            'python_backend_instances': 4,
            'python_backend_peak_byte_size': '16M',
            'host_memory_bytes': '16G',
        },
        {},
        720 * MIB,
        '720m',
        False,
    ),
    (
        'vector2-size-strings',
        {'client_regions': [{'byte_size': '1g'}], 'host_memory_bytes': '1G'},
        {},
        512 * MIB,
        '512m',
        True,
    ),
    # defaults and edges
    ('empty-plan-is-the-floor', {}, {}, 64 * MIB, '64m', False),
    ('no-input-is-the-floor', None, {}, 64 * MIB, '64m', False),
    ('count-defaults-to-1', {'client_regions': [{'byte_size': '100m'}]}, {}, 125 * MIB, '125m', False),
    ('python-default-peak-1MiB', {'python_backend_instances': 80}, {}, 100 * MIB, '100m', False),
    ('ceil-to-whole-MiB', {'extra_bytes': 100 * MIB + 1, 'headroom': 0}, {}, 101 * MIB, '101m', False),
    (
        'zero-headroom',
        {'client_regions': [{'byte_size': '96m', 'count': 1}], 'headroom': 0},
        {},
        96 * MIB,
        '96m',
        False,
    ),
    ('headroom-0.1-exact', {'extra_bytes': 100 * MIB, 'headroom': 0.1}, {}, 110 * MIB, '110m', False),
    ('headroom-as-string', {'extra_bytes': 100 * MIB, 'headroom': '0.5'}, {}, 150 * MIB, '150m', False),
    (
        'several-region-sizes',
        {'client_regions': [{'byte_size': '8m', 'count': 10}, {'byte_size': '4m', 'count': 5}]},
        {},
        125 * MIB,
        '125m',
        False,
    ),
    ('count-zero', {'client_regions': [{'byte_size': '1g', 'count': 0}]}, {}, 64 * MIB, '64m', False),
    ('floor-not-whole-MiB', {'floor_bytes': 1000}, {}, 1000, '1000b', False),
    ('floor-raised', {'floor_bytes': '1g'}, {}, GIB, '1024m', False),
    ('just-under-the-cap', {'extra_bytes': 400 * MIB, 'host_memory_bytes': GIB}, {}, 500 * MIB, '500m', False),
    (
        'exactly-the-cap',
        {'extra_bytes': 512 * MIB, 'headroom': 0, 'host_memory_bytes': GIB},
        {},
        512 * MIB,
        '512m',
        False,
    ),
    ('cap-rounded-down-to-MiB', {'extra_bytes': GIB, 'host_memory_bytes': 1001 * MIB}, {}, 500 * MIB, '500m', True),
    ('floor-above-the-cap-is-capped', {'host_memory_bytes': 100 * MIB}, {}, 50 * MIB, '50m', True),
    (
        'max-host-fraction',
        {'extra_bytes': GIB, 'host_memory_bytes': GIB, 'max_host_fraction': 0.75},
        {},
        768 * MIB,
        '768m',
        True,
    ),
    (
        'fraction-1',
        {'extra_bytes': 2 * GIB, 'headroom': 0, 'host_memory_bytes': GIB, 'max_host_fraction': 1},
        {},
        GIB,
        '1024m',
        True,
    ),
    (
        'kwargs-override-input',
        {'client_regions': [{'byte_size': GIB}], 'host_memory_bytes': 64 * GIB},
        {'host_memory_bytes': GIB},
        512 * MIB,
        '512m',
        True,
    ),
    ('kwargs-only', {}, {'extra_bytes': '200m', 'headroom': 0}, 200 * MIB, '200m', False),
    ('none-means-default', {'headroom': None, 'extra_bytes': 100 * MIB}, {}, 125 * MIB, '125m', False),
    ('host-none-no-cap', {'extra_bytes': 10 * GIB, 'host_memory_bytes': None}, {}, 12800 * MIB, '12800m', False),
    # Kubernetes' binary quantities, as a node's allocatable memory is given
    (
        'kubernetes-binary-quantities',
        {
            'client_regions': [{'byte_size': '64Mi', 'count': 8}],
            'python_backend_instances': 4,
            'python_backend_peak_byte_size': '16Mi',
            'host_memory_bytes': f'{16 * 1024 * 1024}Ki',
        },
        {},
        720 * MIB,
        '720m',
        False,
    ),
    ('float-whole-bytes', {'extra_bytes': float(100 * MIB), 'headroom': 0}, {}, 100 * MIB, '100m', False),
]


@pytest.mark.parametrize(
    'workload, overrides, expected_bytes, expected_docker, expected_capped',
    [case[1:] for case in PLANS],
    ids=[case[0] for case in PLANS],
)
def test_plan(workload, overrides, expected_bytes, expected_docker, expected_capped):
    plan = shm_size(workload, **overrides)
    assert plan['bytes'] == expected_bytes
    assert plan['docker'] == expected_docker
    assert plan['capped'] is expected_capped
    assert set(plan) == {'bytes', 'docker', 'capped', 'breakdown', 'python_backend', 'nccl', 'kubernetes'}


def test_breakdown_of_the_first_vector():
    plan = shm_size(
        {
            'client_regions': [{'byte_size': 64 * MIB, 'count': 8}],
            'python_backend_instances': 4,
            'python_backend_peak_byte_size': 16 * MIB,
            'headroom': 0.25,
            'host_memory_bytes': 16 * GIB,
        }
    )
    assert plan['breakdown'] == {
        'client_regions_bytes': 512 * MIB,
        'python_backend_bytes': 64 * MIB,
        'python_models_bytes': 0,
        'python_growth_bytes': 0,
        'python_reload_bytes': 0,
        'nccl_bytes': 0,
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
    ('unknown-key-typo', {'client_region': []}, {}, 'unknown key(s) client_region'),
    ('unknown-kwarg', {}, {'headrom': 0.1}, 'unknown key(s) headrom'),
    ('regions-not-a-list', {'client_regions': {'byte_size': 1}}, {}, 'client_regions must be a list'),
    ('region-not-a-dict', {'client_regions': ['64m']}, {}, 'client_regions[0] must be a dict'),
    ('region-without-byte-size', {'client_regions': [{'count': 2}]}, {}, 'client_regions[0]: byte_size is required'),
    (
        'region-unknown-key',
        {'client_regions': [{'byte_size': 1, 'size': 2}]},
        {},
        'client_regions[0]: unknown key(s) size',
    ),
    (
        'bad-size-string',
        {'client_regions': [{'byte_size': '64 MiB'}]},
        {},
        "client_regions[0].byte_size: cannot read '64 MiB'",
    ),
    ('negative-size-string', {'extra_bytes': '-1m'}, {}, 'extra_bytes: cannot read'),
    ('negative-bytes', {'extra_bytes': -1}, {}, 'extra_bytes must not be negative'),
    ('bool-bytes', {'floor_bytes': True}, {}, 'floor_bytes must be a byte count'),
    ('fractional-bytes', {'extra_bytes': 1.5}, {}, 'extra_bytes must be a whole number of bytes'),
    (
        'negative-count',
        {'client_regions': [{'byte_size': 1, 'count': -1}]},
        {},
        'client_regions[0].count must be a whole number >= 0, got -1',
    ),
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


@pytest.mark.parametrize(
    'num_bytes, expected',
    [
        (MIB, '1m'),
        (720 * MIB, '720m'),
        (GIB, '1024m'),
        (1000, '1000b'),
        (MIB + 1, '1048577b'),
    ],
)
def test_docker_size(num_bytes, expected):
    assert docker_size(num_bytes) == expected


def test_filter_is_registered():
    assert FilterModule().filters()['shm_size'].target() is shm_size


# -- the pod spec fragment (Kubernetes) -------------------------------------------------------------

VECTOR1 = {
    'client_regions': [{'byte_size': '64m', 'count': 8}],
    'python_backend_instances': 4,
    'python_backend_peak_byte_size': '16m',
    'host_memory_bytes': '16G',
}


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
    assert "at least 4816Mi: the 720Mi of /dev/shm plus the server's own 4096Mi" in notes


def test_without_the_server_memory_the_limit_is_only_the_floor_and_says_so():
    k8s = shm_size(VECTOR1)['kubernetes']
    assert (k8s['memory_limit'], k8s['memory_limit_includes_server']) == ('720Mi', False)
    assert "PLUS the server's own memory" in k8s['notes'][1] and 'OOM-killed' in k8s['notes'][1]


@pytest.mark.parametrize(
    'workload, size_limit',
    [
        ({}, '64Mi'),
        ({'floor_bytes': 1000}, '1000'),
        ({'extra_bytes': GIB, 'host_memory_bytes': GIB}, '512Mi'),  # capped: the fragment is the capped size
        ({'floor_bytes': '1g'}, '1024Mi'),
    ],
)
def test_the_size_limit_is_the_planned_bytes_as_a_quantity(workload, size_limit):
    plan = shm_size(workload)
    assert plan['kubernetes']['size_limit'] == size_limit
    assert plan['kubernetes']['volume']['emptyDir']['sizeLimit'] == size_limit
    assert quantity_bytes(size_limit) == plan['bytes']


@pytest.mark.parametrize(
    'num_bytes, expected', [(MIB, '1Mi'), (720 * MIB, '720Mi'), (1000, '1000'), (MIB + 1, '1048577')]
)
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
            {
                'name': 'tritonserver',
                'image': 'nvcr.io/nvidia/tritonserver:26.04-py3',
                'args': ['tritonserver', '--model-repository=/models', '--allow-client-shm=true'],
                'resources': {'limits': {'memory': k8s['memory_limit']}, 'requests': {'memory': k8s['memory_limit']}},
                'volumeMounts': [mount],
            },
            {'name': 'client', 'image': 'registry.example/client:1', 'volumeMounts': [mount]},
        ],
        'volumes': [k8s['volume']],
    }


def test_the_fragment_validates_in_a_pod_and_a_deployment(k8s_version):
    k8s = shm_size(VECTOR1, server_memory_bytes='4G')['kubernetes']
    pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'triton'}, 'spec': _pod_spec(k8s)}
    labels = {'app': 'triton'}
    deployment = {
        'apiVersion': 'apps/v1',
        'kind': 'Deployment',
        'metadata': {'name': 'triton'},
        'spec': {
            'replicas': 1,
            'selector': {'matchLabels': labels},
            'template': {'metadata': {'labels': labels}, 'spec': _pod_spec(k8s)},
        },
    }
    for resource in (pod, deployment):
        assert kubernetes_validate.validate(resource, k8s_version, strict=True) == k8s_version


def test_the_validation_can_fail(k8s_version):
    """The schemas are strict: a misspelt emptyDir field or a sizeLimit that is not a quantity is refused."""
    spec = _pod_spec(shm_size(VECTOR1)['kubernetes'])
    spec['volumes'][0]['emptyDir']['sizeLimt'] = '1Gi'
    with pytest.raises(kubernetes_validate.ValidationError, match='sizeLimt'):
        kubernetes_validate.validate(
            {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 't'}, 'spec': spec}, k8s_version, strict=True
        )
    spec = _pod_spec(shm_size(VECTOR1)['kubernetes'])
    spec['volumes'][0]['emptyDir']['sizeLimit'] = ['1Gi']
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 't'}, 'spec': spec}, k8s_version, strict=True
        )


# -- the python backend's pools (issue 27): growth settings, largest tensor and instances per model -------------

# (id, largest tensor, shm-default-byte-size, shm-growth-byte-size, pool size): the rows measured on Triton 2.51 first
POOLS = [
    ('measured-32MiB-from-1MiB-steps', 32 * MIB, MIB, MIB, 34 * MIB),
    ('measured-20MiB-from-4MiB-8MiB-steps', 20 * MIB, 4 * MIB, 8 * MIB, 28 * MIB),
    ('measured-3MiB-from-1MiB-steps', 3 * MIB, MIB, MIB, 5 * MIB),
    ('measured-3MiB-fits-4MiB', 3 * MIB, 4 * MIB, 8 * MIB, 4 * MIB),
    ('measured-10MiB-from-2MiB-4MiB-steps', 10 * MIB, 2 * MIB, 4 * MIB, 14 * MIB),
    ('small-tensor-no-growth', 1000, MIB, MIB, MIB),
    ('tensor-equal-to-the-default-grows', MIB, MIB, MIB, 3 * MIB),
    ('tensor-not-a-multiple', 5 * MIB + 1, MIB, 2 * MIB, MIB + 6 * MIB),
]


@pytest.mark.parametrize('largest, default, growth, pool', [c[1:] for c in POOLS], ids=[c[0] for c in POOLS])
def test_pool_bytes(largest, default, growth, pool):
    assert pool_bytes(largest, default, growth) == pool


# (id, requests in the order they came, shm-default-byte-size, shm-growth-byte-size, the pool they left): measured on
# Triton 2.51 (docs/backend-pools.md; tests/integration/test_triton_backend_pool.py measures them again)
RISING = [
    ('measured-3-then-20MiB-from-1MiB-steps', (3 * MIB, 20 * MIB), MIB, MIB, 27 * MIB),
    ('measured-32MiB-from-1MiB-steps', (32 * MIB,), MIB, MIB, 34 * MIB),
    ('measured-20MiB-from-4MiB-8MiB-steps', (3 * MIB, 20 * MIB), 4 * MIB, 8 * MIB, 28 * MIB),
]


@pytest.mark.parametrize('requests, default, growth, measured', [c[1:] for c in RISING], ids=[c[0] for c in RISING])
def test_the_planned_pool_bounds_what_requests_in_any_order_grew(requests, default, growth, measured):
    largest = max(requests)
    assert pool_bytes(largest, default, growth) <= measured <= pool_bound(largest, default, growth)


def test_pool_bound_is_one_more_step_past_a_pool_just_too_small_for_the_largest():
    # 9 MiB then 11 MiB from 1 MiB steps: 1 + 10 = 11 MiB, too small for 11 MiB and its bookkeeping: 11 + 12 = 23 MiB
    assert pool_bound(11 * MIB, MIB, MIB) == 11 * MIB + MIB + 12 * MIB
    assert pool_bound(1000, MIB, MIB) == MIB  # fits the starting pool: never grows


# (id, workload, expected python_models_bytes, expected growth bytes, expected reload bytes, expected planned bytes)
PYTHON_PLANS = [
    (
        'one-model-two-instances',
        {'python_models': [{'name': 'llm', 'instances': 2, 'largest_tensor_bytes': '32m'}]},
        132 * MIB,
        130 * MIB,
        0,
        165 * MIB,
    ),
    ('instances-default-to-1', {'python_models': [{'largest_tensor_bytes': '32m'}]}, 66 * MIB, 65 * MIB, 0, 83 * MIB),
    (
        'growth-settings-change-the-pool',
        {
            'python_models': [{'name': 'llm', 'instances': 4, 'largest_tensor_bytes': '20m'}],
            'python_backend_shm_default_byte_size': '4m',
            'python_backend_shm_growth_byte_size': '8m',
        },
        208 * MIB,
        192 * MIB,
        0,
        260 * MIB,
    ),
    (
        'a-reload-adds-one-model-s-default-pools',
        {
            'python_models': [
                {'name': 'a', 'instances': 3, 'largest_tensor_bytes': '32m'},
                {'name': 'b', 'instances': 1, 'largest_tensor_bytes': 100},
            ],
            'python_backend_reloads': True,
            'python_backend_shm_default_byte_size': '2m',
        },
        3 * 66 * MIB + 2 * MIB,
        3 * 64 * MIB,
        3 * 2 * MIB,
        258 * MIB,
    ),
    (
        'added-to-clients-and-the-old-inputs',
        {
            'client_regions': [{'byte_size': '64m', 'count': 2}],
            'python_backend_instances': 1,
            'python_models': [{'name': 'm', 'largest_tensor_bytes': '8m'}],
        },
        18 * MIB,
        17 * MIB,
        0,
        184 * MIB,
    ),
]


@pytest.mark.parametrize(
    'workload, models_bytes, growth, reload, planned', [c[1:] for c in PYTHON_PLANS], ids=[c[0] for c in PYTHON_PLANS]
)
def test_python_pools_plan(workload, models_bytes, growth, reload, planned):
    plan = shm_size(workload)
    assert plan['breakdown']['python_models_bytes'] == models_bytes
    assert plan['breakdown']['python_growth_bytes'] == growth
    assert plan['breakdown']['python_reload_bytes'] == reload
    assert plan['bytes'] == planned
    assert plan['python_backend']['pools_bytes'] == models_bytes


def test_the_plan_explains_the_growth_headroom_per_model():
    plan = shm_size(
        {
            'python_models': [
                {'name': 'llm', 'instances': 2, 'largest_tensor_bytes': '32m'},
                {'name': 'pre', 'largest_tensor_bytes': '1k'},
            ],
            'python_backend_reloads': True,
        }
    )
    llm, pre = plan['python_backend']['models']
    assert (llm['pool_bytes'], llm['bytes'], llm['growth_bytes']) == (66 * MIB, 132 * MIB, 130 * MIB)
    assert llm['one_request_pool_bytes'] == 34 * MIB
    assert 'takes a new pool to 35651584 bytes (1048576 + 1048576 x (33554432 // 1048576 + 1))' in llm['explanation']
    assert 'at most 33554432 + 1048576 + 1048576 x (33554432 // 1048576 + 1) = 69206016 bytes' in llm['explanation']
    assert 'never shrinks' in llm['explanation']
    assert 'fits the starting pool' in pre['explanation'] and pre['growth_bytes'] == 0
    notes = ' '.join(plan['python_backend']['notes'])
    assert '2097152 bytes for a reload' in notes and 'Pools never shrink' in notes


def test_growth_settings_become_the_server_arguments_in_both_fragments():
    default = shm_size({'python_models': [{'largest_tensor_bytes': '1m'}]})
    assert default['python_backend']['server_args'] == [] and default['kubernetes']['server_args'] == []
    plan = shm_size(
        {
            'python_models': [{'largest_tensor_bytes': '1m'}],
            'python_backend_shm_default_byte_size': '4m',
            'python_backend_shm_growth_byte_size': '16m',
        }
    )
    args = [
        '--backend-config=python,shm-default-byte-size=4194304',
        '--backend-config=python,shm-growth-byte-size=16777216',
    ]
    assert plan['python_backend']['server_args'] == args and plan['kubernetes']['server_args'] == args


def test_the_kubernetes_fragment_warns_that_pools_outlive_a_container_restart():
    with_pools = ' '.join(shm_size({'python_models': [{'largest_tensor_bytes': '1m'}]})['kubernetes']['notes'])
    assert 'kubernetes/kubernetes#81001' in with_pools and 'shm_cleanup_backend_leftovers' in with_pools
    without = ' '.join(shm_size({})['kubernetes']['notes'])
    assert '81001' not in without


@pytest.mark.parametrize(
    'workload, words',
    [
        ({'python_models': {'largest_tensor_bytes': 1}}, 'python_models must be a list'),
        ({'python_models': [{'instances': 2}]}, 'python_models[0]: largest_tensor_bytes is required'),
        ({'python_models': [{'largest_tensor_bytes': 1, 'count': 2}]}, 'python_models[0]: unknown key(s) count'),
        ({'python_models': [{'largest_tensor_bytes': '1x'}]}, 'python_models[0].largest_tensor_bytes'),
        (
            {'python_models': [{'largest_tensor_bytes': 1, 'instances': -1}]},
            'python_models[0].instances must be a whole number',
        ),
        ({'python_backend_shm_growth_byte_size': 0}, 'must be > 0'),
        ({'python_backend_reloads': 'yes'}, 'python_backend_reloads must be true or false'),
    ],
)
def test_python_pool_errors(workload, words):
    with pytest.raises(AnsibleFilterError) as err:
        shm_size(workload)
    assert words in str(err.value)


@pytest.mark.parametrize(
    'nccl, segments, per_rank',
    [
        (None, 0, None),
        ({'tensor_parallel': 1}, 0, 0),  # one rank: no peer, no segment
        ({'tensor_parallel': 4}, 4 * 2 * 2, 4),  # a ring of 4: a send and a receive per channel, 2 channels
        ({'tensor_parallel': 2, 'pipeline_parallel': 2}, 4 * 4 * 2, 8),
        ({'pipeline_parallel': 3, 'channels': 1, 'replicas': 2}, 6 * 2, 2),
    ],
)
def test_nccl_segments_per_rank_and_their_bytes_in_the_plan(nccl, segments, per_rank):
    plan = shm_size({'nccl': nccl, 'headroom': 0, 'floor_bytes': 0})
    assert plan['nccl']['segments'] == segments
    assert plan['nccl'].get('segments_per_rank') == per_rank
    assert plan['breakdown']['nccl_bytes'] == segments * 10 * MIB == plan['nccl']['bytes']
    assert plan['breakdown']['subtotal_bytes'] == segments * 10 * MIB


def test_nccl_segment_size_is_a_size_string_and_bad_input_is_named():
    plan = shm_size({'nccl': {'tensor_parallel': 8, 'segment_byte_size': '6m'}, 'headroom': 0})
    assert plan['bytes'] == 8 * 2 * 2 * 6 * MIB
    assert 'tp 8' in plan['nccl']['explanation']
    with pytest.raises(AnsibleFilterError, match='nccl: unknown key'):
        shm_size({'nccl': {'tp': 2}})
    with pytest.raises(AnsibleFilterError, match='at least 1'):
        shm_size({'nccl': {'tensor_parallel': 0}})
    with pytest.raises(AnsibleFilterError, match='nccl must be a dict'):
        shm_size({'nccl': 4})
