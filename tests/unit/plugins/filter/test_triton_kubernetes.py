"""Unit tests for the tritonops.shm.triton_kubernetes filter: the triton_server role's Deployment and Service.

Every manifest is validated offline with kubernetes-validate (strict schemas) for each Kubernetes minor from 1.30
to 1.37 that it bundles.
"""

from __future__ import annotations

import copy
import json
import re

import kubernetes_validate
import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.triton_kubernetes import FilterModule
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.deploy import triton_version
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.kubernetes import (
    quantity_bytes,
    triton_kubernetes,
)
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.sizing import shm_size

MIB = 1 << 20
GIB = 1 << 30
IMAGE = 'nvcr.io/nvidia/tritonserver:26.04-py3'
ARGS = [
    'tritonserver',
    '--model-repository=/models',
    '--model-control-mode=explicit',
    '--http-port=8000',
    '--grpc-port=8001',
    '--metrics-port=8002',
    '--allow-client-shm=true',
]


def manifest(**kwargs):
    kwargs.setdefault('shm_bytes', 720 * MIB)
    kwargs.setdefault('model_repository', '/var/lib/triton_server/triton/models')
    return triton_kubernetes(
        kwargs.pop('name', 'triton'), kwargs.pop('image', IMAGE), kwargs.pop('args', ARGS), **kwargs
    )


def pod_spec(result):
    return result['deployment']['spec']['template']['spec']


def container(result):
    return pod_spec(result)['containers'][0]


def test_the_deployment_carries_the_planned_emptydir_at_dev_shm():
    result = manifest(server_memory_bytes='4G')
    spec = pod_spec(result)
    assert spec['volumes'][0] == {'name': 'dshm', 'emptyDir': {'medium': 'Memory', 'sizeLimit': '720Mi'}}
    assert {'name': 'dshm', 'mountPath': '/dev/shm'} in container(result)['volumeMounts']
    assert container(result)['resources'] == {'limits': {'memory': '4816Mi'}, 'requests': {'memory': '4816Mi'}}
    assert result['memory_limit'] == '4816Mi' and result['warnings'] == []
    assert result['shm'] == shm_size({'floor_bytes': 720 * MIB}, server_memory_bytes='4G')['kubernetes']
    assert 'hostIPC' not in spec and 'shareProcessNamespace' not in spec


def test_the_args_are_the_roles_command_line():
    assert container(manifest())['args'] == ARGS
    assert 'command' not in container(manifest())  # the image's entrypoint stays, as with docker/podman


@pytest.mark.parametrize(
    'image, flag',
    [
        ('nvcr.io/nvidia/tritonserver:26.04-py3', True),
        ('nvcr.io/nvidia/tritonserver:24.10-py3', False),
        ('localhost/x/tritonserver:2.68.0', True),
        ('localhost/x/tritonserver:2.51.0', False),
    ],
)
def test_the_allow_client_shm_rule_is_the_version_filters(image, flag):
    args = ['tritonserver'] + (['--allow-client-shm=true'] if triton_version(image)['allow_client_shm'] else [])
    result = manifest(image=image, args=args)
    assert ('--allow-client-shm=true' in container(result)['args']) is flag
    assert container(result)['image'] == image


def test_the_service_selects_the_pods_and_names_the_ports():
    result = manifest(namespace='inference')
    service, deployment = result['service'], result['deployment']
    assert result['documents'] == [deployment, service]
    assert service['spec']['selector'] == deployment['spec']['selector']['matchLabels']
    labels = deployment['spec']['template']['metadata']['labels']
    assert all(labels[k] == v for k, v in service['spec']['selector'].items())
    assert [(p['name'], p['port'], p['targetPort']) for p in service['spec']['ports']] == [
        ('http', 8000, 'http'),
        ('grpc', 8001, 'grpc'),
        ('metrics', 8002, 'metrics'),
    ]
    assert result['url'] == 'http://triton.inference.svc:8000'
    assert deployment['metadata']['namespace'] == service['metadata']['namespace'] == 'inference'


def test_disabled_ports_and_no_service():
    result = manifest(grpc_port=0, metrics_port=0, service_type='')
    assert [p['name'] for p in container(result)['ports']] == ['http']
    assert result['service'] is None and result['url'] is None and len(result['documents']) == 1


def test_without_server_memory_no_limit_is_set_and_a_warning_says_why():
    result = manifest()
    assert 'resources' in container(result) and container(result)['resources'] == {}
    assert result['memory_limit'] is None
    assert result['warnings'] and "PLUS the server's own memory" in result['warnings'][0]


def test_an_explicit_memory_limit_is_kept():
    result = manifest(resources={'limits': {'memory': '8Gi', 'cpu': '4'}, 'requests': {'cpu': '2'}})
    assert container(result)['resources'] == {'limits': {'memory': '8Gi', 'cpu': '4'}, 'requests': {'cpu': '2'}}
    assert result['memory_limit'] == '8Gi' and result['warnings'] == []


@pytest.mark.parametrize('limit', ['720Mi', '512Mi', '754974720'])
def test_a_memory_limit_not_above_the_dev_shm_is_refused(limit):
    with pytest.raises(
        AnsibleFilterError, match=r'resources.limits.memory .* is not more than the /dev/shm sizeLimit 720Mi'
    ):
        manifest(resources={'limits': {'memory': limit}})


def test_gpus_host_ipc_share_process_namespace_and_a_pvc():
    result = manifest(
        gpus=2,
        ipc_mode='host',
        share_process_namespace=True,
        model_volume={'persistentVolumeClaim': {'claimName': 'models', 'readOnly': True}},
    )
    spec = pod_spec(result)
    assert spec['hostIPC'] is True and spec['shareProcessNamespace'] is True
    assert [v['name'] for v in spec['volumes']] == ['models']  # host IPC: the node's /dev/shm, no emptyDir
    assert spec['volumes'][0]['persistentVolumeClaim'] == {'claimName': 'models', 'readOnly': True}
    assert container(result)['resources'] == {'limits': {'nvidia.com/gpu': 2}}
    assert result['shm'] is None


def test_the_sweep_init_container_runs_the_module_on_the_pods_dev_shm_before_the_server():
    result = manifest(sweep_image='registry.example.com/tritonops/shm-agent:0.3.0', sweep_families=['nccl'])
    spec = pod_spec(result)
    (init,) = spec['initContainers']
    assert init['name'] == 'shm-sweep' and init['image'] == 'registry.example.com/tritonops/shm-agent:0.3.0'
    command = ' '.join(init['command'][:-1])
    assert command == 'ansible localhost --connection local --module-name tritonops.shm.triton_shm_sweep --args'
    assert json.loads(init['command'][-1]) == {
        'shm_dir': '/dev/shm',
        'clients_share_pid_namespace': True,
        'families': ['nccl'],
    }
    assert {'name': 'dshm', 'mountPath': '/dev/shm'} in init['volumeMounts']
    assert init['securityContext']['capabilities'] == {'drop': ['ALL']}
    assert {'name': 'shm-sweep-tmp', 'emptyDir': {}} in spec['volumes']
    assert 'initContainers' not in pod_spec(manifest())


def test_no_sweep_init_container_with_the_nodes_dev_shm():
    result = manifest(sweep_image='agent:1', ipc_mode='host')
    assert 'initContainers' not in pod_spec(result)
    assert any('sweep_image' in w for w in result['warnings'])


def test_env_labels_and_pull_policy():
    result = manifest(env={'B': 2, 'A': 'x'}, labels={'team': 'ml'}, image_pull='always', replicas=3)
    assert container(result)['env'] == [{'name': 'A', 'value': 'x'}, {'name': 'B', 'value': '2'}]
    assert 'env' not in container(manifest())
    assert container(result)['imagePullPolicy'] == 'Always'
    labels = result['deployment']['metadata']['labels']
    assert labels['team'] == 'ml' and labels['app.kubernetes.io/managed-by'] == 'tritonops.shm.triton_server'
    assert result['deployment']['spec']['replicas'] == 3


def test_the_startup_probe_waits_for_the_ready_timeout():
    probe = container(manifest(ready_timeout=180))['startupProbe']
    assert probe['httpGet'] == {'path': '/v2/health/ready', 'port': 'http'}
    assert probe['periodSeconds'] * probe['failureThreshold'] == 180


def test_the_input_is_not_modified():
    resources = {'limits': {'cpu': '1'}}
    before = copy.deepcopy(resources)
    manifest(resources=resources, server_memory_bytes='1G')
    assert resources == before


CASES = {
    'default': {},
    'memory': {'server_memory_bytes': '4G'},
    'gpus-pvc-host-ipc': {'gpus': 1, 'ipc_mode': 'host', 'model_volume': {'persistentVolumeClaim': {'claimName': 'm'}}},
    'sweep-init-container': {
        'sweep_image': 'registry.example.com/tritonops/shm-agent:0.3.0',
        'sweep_families': ['nccl'],
    },
    'share-process-namespace-nodeport': {'share_process_namespace': True, 'service_type': 'NodePort', 'grpc_port': 0},
    'odd-size': {'shm_bytes': 1000, 'resources': {'limits': {'memory': '2G'}}, 'env': {'X': 1}},
    'secret-env-yes-no-labels': {
        'env': {
            'TOKEN': {'secretKeyRef': {'name': 'triton-secrets', 'key': 'token'}},
            'NODE': {'fieldRef': {'fieldPath': 'spec.nodeName'}},
            'A': 'y',
            'B': 'n',
            'C': '1e3',
        },
        'labels': {'tier': 'y', 'n': 'n', 'ver': '1e3', 'on': 'off'},
    },
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_every_manifest_validates(case, k8s_version):
    result = manifest(**CASES[case])
    for resource in result['documents']:
        assert kubernetes_validate.validate(resource, k8s_version, strict=True) == k8s_version
    # the text the role writes, read back as kubectl reads it, is the same objects and validates too
    assert list(yaml.load_all(result['manifest'], Loader=KubectlLoader)) == result['documents']
    for resource in yaml.load_all(result['manifest'], Loader=KubectlLoader):
        assert kubernetes_validate.validate(resource, k8s_version, strict=True) == k8s_version


class KubectlLoader(yaml.SafeLoader):
    """YAML as kubectl (sigs.k8s.io/yaml, go-yaml) reads it: y/n/yes/no/on/off are booleans, 1e3 is a number."""


YAML11_BOOL = re.compile(r'^(?:y|Y|n|N|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$')
KubectlLoader.add_implicit_resolver('tag:yaml.org,2002:bool', YAML11_BOOL, list('yYnNtTfFoO'))
KubectlLoader.add_implicit_resolver(
    'tag:yaml.org,2002:float', re.compile(r'^[-+]?[0-9]+[eE][-+]?[0-9]+$'), list('-+0123456789')
)


def test_every_string_is_quoted_so_y_n_and_1e3_keep_their_meaning():
    result = manifest(**CASES['secret-env-yes-no-labels'])
    env = {e['name']: e for e in container(result)['env']}
    assert env['A'] == {'name': 'A', 'value': 'y'} and env['C'] == {'name': 'C', 'value': '1e3'}
    assert env['TOKEN'] == {'name': 'TOKEN', 'valueFrom': {'secretKeyRef': {'name': 'triton-secrets', 'key': 'token'}}}
    assert result['manifest'].startswith('---\n') and '\n---\n' in result['manifest']
    for token in yaml.scan(result['manifest']):
        if isinstance(token, yaml.ScalarToken) and token.plain:
            # only numbers and booleans are plain; every string is double-quoted
            assert re.fullmatch(r'[0-9]+|true|false', token.value), token.value
    loaded = list(yaml.load_all(result['manifest'], Loader=KubectlLoader))
    labels = loaded[0]['metadata']['labels']
    assert labels['tier'] == 'y' and labels['n'] == 'n' and labels['on'] == 'off' and labels['ver'] == '1e3'


# (id, env, words the error must contain); a value is never shown
ENV_ERRORS = [
    (
        'two-sources',
        {'T': {'secretKeyRef': {'name': 's', 'key': 'k'}, 'fieldRef': {'fieldPath': 'x'}}},
        'env T: a dict value',
    ),
    ('unknown-source', {'T': {'secretRef': {'name': 's'}}}, "got the keys ['secretRef']"),
    ('plain-dict', {'T': {'value': 's3cret'}}, "got the keys ['value']"),
    ('list', {'T': ['s3cret']}, 'env T: a value is a string or a valueFrom dict'),
    ('not-a-dict', ['T=s3cret'], 'env must be a dict, got list'),
]


@pytest.mark.parametrize('env, words', [c[1:] for c in ENV_ERRORS], ids=[c[0] for c in ENV_ERRORS])
def test_env_errors_name_the_variable_never_the_value(env, words):
    with pytest.raises(AnsibleFilterError) as info:
        manifest(env=env)
    assert words in str(info.value) and 's3cret' not in str(info.value)


# (id, keyword arguments, words the error must contain)
ERRORS = [
    ('name-not-dns', {'name': 'Triton_1'}, 'the name must be a DNS-1123 label'),
    ('namespace-not-dns', {'namespace': 'A B'}, 'namespace must be a DNS-1123 label'),
    ('ipc-container', {'ipc_mode': 'container:other'}, 'ipc_mode must be one of private, shareable, host'),
    ('pull', {'image_pull': 'sometimes'}, 'image_pull must be one of missing, always, never'),
    ('service-type', {'service_type': 'ExternalName'}, 'service_type must be one of'),
    ('gpus-all', {'gpus': 'all'}, 'gpus must be a whole number'),
    ('http-off', {'http_port': 0}, 'http_port must not be 0'),
    ('port-range', {'grpc_port': 70000}, 'grpc_port must be between 0 and 65535'),
    ('no-models', {'model_repository': ''}, 'give model_volume'),
    ('args', {'args': 'tritonserver'}, 'args must be a list'),
    ('bad-limit', {'resources': {'limits': {'memory': '4 GB'}}}, "cannot read '4 GB' as a Kubernetes quantity"),
    ('bad-server-memory', {'server_memory_bytes': 'much'}, 'server_memory_bytes: cannot read'),
]


@pytest.mark.parametrize('kwargs, words', [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_errors(kwargs, words):
    with pytest.raises(AnsibleFilterError) as info:
        manifest(**kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize(
    'text, expected',
    [
        ('4Gi', 4 * GIB),
        ('4096Mi', 4 * GIB),
        ('4G', 4 * 10**9),
        ('1.5Gi', 3 * GIB // 2),
        ('1e9', 10**9),
        ('1000', 1000),
        (1000, 1000),
        ('500m', 1),
        ('128k', 128000),
        ('0.5Ki', 512),
    ],
)
def test_quantity_bytes(text, expected):
    assert quantity_bytes(text) == expected


def test_filter_is_registered():
    assert FilterModule().filters()['triton_kubernetes'].target() is triton_kubernetes
