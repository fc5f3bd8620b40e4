"""Unit tests for the triton_server role's filters: triton_version, triton_gpus, triton_endpoints."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.triton_server import FilterModule
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.deploy import (
    image_tag,
    triton_args,
    triton_container,
    triton_deployed,
    triton_endpoints,
    triton_gpus,
    triton_log_report,
    triton_retries,
    triton_shm,
    triton_shm_change,
    triton_version,
)

DIGEST = '@sha256:' + '0' * 64
MIB = 1 << 20


@pytest.mark.parametrize(
    'image, tag',
    [
        ('nvcr.io/nvidia/tritonserver:24.10-py3', '24.10-py3'),
        ('registry:5000/tritonserver:27.01-py3-min' + DIGEST, '27.01-py3-min'),
        ('registry:5000/tritonserver', ''),
        ('tritonserver' + DIGEST, ''),
        ('x:a:b', 'a'),
        ('', ''),
    ],
)
def test_image_tag(image, tag):
    assert image_tag(image) == tag


@pytest.mark.parametrize(
    'image, version, text, kind, number, off',
    [
        ('nvcr.io/nvidia/tritonserver:24.10-py3', '', '24.10-py3', 'ngc', 24010, False),
        ('nvcr.io/nvidia/tritonserver:26.03-py3', '', '26.03-py3', 'ngc', 26003, False),
        ('nvcr.io/nvidia/tritonserver:26.04-py3', '', '26.04-py3', 'ngc', 26004, True),
        ('registry:5000/tritonserver:27.01-py3-min' + DIGEST, '', '27.01-py3-min', 'ngc', 27001, True),
        ('localhost/tritonops-test/tritonserver:2.51.0-0123abcd', '', '2.51.0-0123abcd', 'server', 2051, False),
        ('localhost/x/tritonserver:2.68.0', '', '2.68.0', 'server', 2068, True),
        ('x/t:v2.70', '', 'v2.70', 'server', 2070, True),
        ('x/t:19.01', '', '19.01', 'ngc', 19001, False),
        # not versions: unknown, never an error
        ('nvcr.io/nvidia/tritonserver:latest', '', 'latest', 'unknown', 0, False),
        ('registry:5000/tritonserver', '', '', 'unknown', 0, False),
        ('tritonserver' + DIGEST, '', '', 'unknown', 0, False),
        ('x/t:18.10', '', '18.10', 'unknown', 0, False),
        ('x/t:3.1', '', '3.1', 'unknown', 0, False),
        ('x/t:26', '', '26', 'unknown', 0, False),
        # the version wins over the tag; YAML numbers are read as text
        ('x/tritonserver:latest', '26.05', '26.05', 'ngc', 26005, True),
        ('x/tritonserver:26.04-py3', '2.51.0', '2.51.0', 'server', 2051, False),
        ('x/tritonserver:latest', 26.05, '26.05', 'ngc', 26005, True),
        ('x/tritonserver:26.04-py3', None, '26.04-py3', 'ngc', 26004, True),
        ('x/tritonserver:26.04-py3', '  ', '26.04-py3', 'ngc', 26004, True),
    ],
)
def test_version(image, version, text, kind, number, off):
    result = triton_version(image, version=version)
    assert result == dict(text=text, kind=kind, number=number, client_shm_off_by_default=off, allow_client_shm=off)


@pytest.mark.parametrize(
    'image, allow, flag',
    [
        ('x/t:24.10-py3', True, True),
        ('x/t:24.10-py3', 'true', True),
        ('x/t:24.10-py3', 'True', True),
        ('x/t:24.10-py3', 'yes', True),
        ('x/t:24.10-py3', 1, True),
        ('x/t:latest', 'true', True),
        ('x/t:26.04-py3', False, False),
        ('x/t:26.04-py3', 'false', False),
        ('x/t:26.04-py3', 'no', False),
        ('x/t:26.04-py3', '0', False),
        ('x/t:26.04-py3', 'AUTO', True),
        ('x/t:latest', 'auto', False),
    ],
)
def test_allow_client_shm(image, allow, flag):
    assert triton_version(image, allow_client_shm=allow)['allow_client_shm'] is flag


@pytest.mark.parametrize(
    'image, kwargs, match',
    [
        (['x/t:26.04'], {}, 'the image must be a string, got list'),
        (True, {}, 'the image must be a string, got bool'),
        ('x/t:1', dict(version={'major': 2}), 'version must be a string, got dict'),
        ('x/t:1', dict(version=False), 'version must be a string, got bool'),
        ('x/t:1', dict(allow_client_shm='sometimes'), "allow_client_shm must be auto, true or false, got 'sometimes'"),
        ('x/t:1', dict(allow_client_shm=None), 'allow_client_shm must be auto, true or false, got None'),
        ('x/t:1', dict(allow_client_shm=['true']), 'allow_client_shm must be a string, got list'),
    ],
)
def test_version_refuses_wrong_types(image, kwargs, match):
    with pytest.raises(AnsibleFilterError, match='^triton_version: ' + match):
        triton_version(image, **kwargs)


ALL_REQUEST = [dict(driver='nvidia', count=-1, capabilities=[['gpu']])]


@pytest.mark.parametrize(
    'value, ids, docker, podman',
    [
        ('', [], [], []),
        (None, [], [], []),
        ([], [], [], []),
        ('all', ['all'], ALL_REQUEST, ['nvidia.com/gpu=all']),
        (['all'], ['all'], ALL_REQUEST, ['nvidia.com/gpu=all']),
        (' all ', ['all'], ALL_REQUEST, ['nvidia.com/gpu=all']),
        ('0', ['0'], [dict(driver='nvidia', device_ids=['0'], capabilities=[['gpu']])], ['nvidia.com/gpu=0']),
        (1, ['1'], [dict(driver='nvidia', device_ids=['1'], capabilities=[['gpu']])], ['nvidia.com/gpu=1']),
        (
            [0, 1],
            ['0', '1'],
            [dict(driver='nvidia', device_ids=['0', '1'], capabilities=[['gpu']])],
            ['nvidia.com/gpu=0', 'nvidia.com/gpu=1'],
        ),
        (
            ('GPU-5e2b',),
            ['GPU-5e2b'],
            [dict(driver='nvidia', device_ids=['GPU-5e2b'], capabilities=[['gpu']])],
            ['nvidia.com/gpu=GPU-5e2b'],
        ),
    ],
)
def test_gpus(value, ids, docker, podman):
    assert triton_gpus(value) == dict(ids=ids, docker_device_requests=docker, podman_devices=podman)


@pytest.mark.parametrize(
    'value, match',
    [
        (True, "expected '', 'all', a GPU index or UUID, or a list of them, got bool True"),
        ({'0': 'x'}, "expected '', 'all', a GPU index or UUID, or a list of them, got dict"),
        (2.5, "expected '', 'all', a GPU index or UUID, or a list of them, got float 2.5"),
        (['0', ''], "each GPU must be a non-empty index or UUID, got '' in"),
        ([['0']], r"each GPU must be a non-empty index or UUID, got \['0'\]"),
        ([False], 'each GPU must be a non-empty index or UUID, got False'),
        (['all', '0'], "'all' cannot be combined with other GPUs"),
    ],
)
def test_gpus_refuses(value, match):
    with pytest.raises(AnsibleFilterError, match='^triton_gpus: ' + match):
        triton_gpus(value)


@pytest.mark.parametrize(
    'address, kwargs, ports, published, ready',
    [
        (
            '0.0.0.0',
            {},
            [8000, 8001, 8002],
            ['0.0.0.0:8000:8000', '0.0.0.0:8001:8001', '0.0.0.0:8002:8002'],
            'http://127.0.0.1:8000/v2/health/ready',
        ),
        (
            '127.0.0.1',
            dict(http_port=18000, grpc_port=0, metrics_port='18002'),
            [18000, 18002],
            ['127.0.0.1:18000:18000', '127.0.0.1:18002:18002'],
            'http://127.0.0.1:18000/v2/health/ready',
        ),
        (
            '127.0.0.2',
            dict(network_mode='host', grpc_port=-1),
            [8000, 8002],
            [],
            'http://127.0.0.2:8000/v2/health/ready',
        ),
        (
            '',
            {},
            [8000, 8001, 8002],
            [':8000:8000', ':8001:8001', ':8002:8002'],
            'http://127.0.0.1:8000/v2/health/ready',
        ),
        ('::', dict(grpc_port=0, metrics_port=0), [8000], [':::8000:8000'], 'http://127.0.0.1:8000/v2/health/ready'),
        (
            '10.0.0.1',
            dict(network_mode='triton-net'),
            [8000, 8001, 8002],
            ['10.0.0.1:8000:8000', '10.0.0.1:8001:8001', '10.0.0.1:8002:8002'],
            'http://10.0.0.1:8000/v2/health/ready',
        ),
        (
            '0.0.0.0',
            dict(ready_url='https://lb.example/triton/v2/health/ready', grpc_port=0, metrics_port=0),
            [8000],
            ['0.0.0.0:8000:8000'],
            'https://lb.example/triton/v2/health/ready',
        ),
        (
            '0.0.0.0',
            dict(ready_url='http://x:1/ready', grpc_port=0, metrics_port=0),
            [8000],
            ['0.0.0.0:8000:8000'],
            'http://x:1/ready',
        ),
    ],
)
def test_endpoints(address, kwargs, ports, published, ready):
    result = triton_endpoints(address, **kwargs)
    url = ready[: -len('/v2/health/ready')] if ready.endswith('/v2/health/ready') else ready
    assert result == dict(ports=ports, published_ports=published, ready_url=ready, url=url)


@pytest.mark.parametrize(
    'address, kwargs, match',
    [
        ('0.0.0.0', dict(http_port='http'), "http_port must be a port number \\(0 disables it\\), got 'http'"),
        ('0.0.0.0', dict(grpc_port=None), 'grpc_port must be a port number'),
        ('0.0.0.0', dict(metrics_port=True), 'metrics_port must be a port number'),
        ('0.0.0.0', dict(http_port=70000), 'http_port must be at most 65535, got 70000'),
        (['0.0.0.0'], {}, 'listen_address must be a string, got list'),
        ('0.0.0.0', dict(ready_url={'url': 'x'}), 'ready_url must be a string, got dict'),
    ],
)
def test_endpoints_refuse(address, kwargs, match):
    with pytest.raises(AnsibleFilterError, match='^triton_endpoints: ' + match):
        triton_endpoints(address, **kwargs)


def test_filters_are_registered():
    assert {name: f.target() for name, f in FilterModule().filters().items()} == dict(
        triton_version=triton_version,
        triton_gpus=triton_gpus,
        triton_endpoints=triton_endpoints,
        _triton_args=triton_args,
        _triton_container=triton_container,
        _triton_shm=triton_shm,
        _triton_shm_change=triton_shm_change,
        _triton_retries=triton_retries,
        _triton_log_report=triton_log_report,
        _triton_deployed=triton_deployed,
    )


BASE = ['tritonserver', '--model-repository=/models', '--model-control-mode=explicit']


@pytest.mark.parametrize(
    'command, kwargs, expected',
    [
        (['tritonserver'], {}, BASE + ['--http-port=8000', '--grpc-port=8001', '--metrics-port=8002']),
        (
            ['tritonserver'],
            dict(grpc_port=0, metrics_port='0'),
            BASE + ['--http-port=8000', '--allow-grpc=false', '--allow-metrics=false'],
        ),
        (
            ['tritonserver'],
            dict(load_models=['a', 'b'], allow_client_shm=True, extra_args=['--log-verbose=1', 2]),
            BASE
            + [
                '--load-model=a',
                '--load-model=b',
                '--http-port=8000',
                '--grpc-port=8001',
                '--metrics-port=8002',
                '--allow-client-shm=true',
                '--log-verbose=1',
                '2',
            ],
        ),
        # the role's host-network case (tests/integration/test_triton_server_role.py)
        (
            ['numactl', '--cpunodebind=0', 'tritonserver'],
            dict(
                network_mode='host',
                listen_address='127.0.0.2',
                grpc_port=0,
                http_port=18000,
                metrics_port=18002,
                load_models=['a', 'b'],
                extra_args=['--log-verbose=1'],
            ),
            [
                'numactl',
                '--cpunodebind=0',
                'tritonserver',
                '--model-repository=/models',
                '--model-control-mode=explicit',
                '--load-model=a',
                '--load-model=b',
                '--http-port=18000',
                '--allow-grpc=false',
                '--metrics-port=18002',
                '--http-address=127.0.0.2',
                '--metrics-address=127.0.0.2',
                '--log-verbose=1',
            ],
        ),
        (
            ['tritonserver'],
            dict(network_mode='host', listen_address='::'),
            BASE
            + [
                '--http-port=8000',
                '--grpc-port=8001',
                '--metrics-port=8002',
                '--http-address=::',
                '--grpc-address=::',
                '--metrics-address=::',
            ],
        ),
        # any address: no address flags; a bridge publishes the ports on the address instead
        (
            ['tritonserver'],
            dict(network_mode='host', listen_address='0.0.0.0'),
            BASE + ['--http-port=8000', '--grpc-port=8001', '--metrics-port=8002'],
        ),
        (
            ['tritonserver'],
            dict(network_mode='host', listen_address=''),
            BASE + ['--http-port=8000', '--grpc-port=8001', '--metrics-port=8002'],
        ),
        (
            ['tritonserver'],
            dict(listen_address='127.0.0.2'),
            BASE + ['--http-port=8000', '--grpc-port=8001', '--metrics-port=8002'],
        ),
        (
            ['tritonserver'],
            dict(model_repository='/m', model_control_mode='poll', http_port='18000'),
            [
                'tritonserver',
                '--model-repository=/m',
                '--model-control-mode=poll',
                '--http-port=18000',
                '--grpc-port=8001',
                '--metrics-port=8002',
            ],
        ),
    ],
)
def test_args(command, kwargs, expected):
    assert triton_args(command, **kwargs) == expected


@pytest.mark.parametrize(
    'command, kwargs, match',
    [
        ('tritonserver', {}, 'the command must be a list, got str'),
        (['tritonserver'], dict(load_models='a'), 'load_models must be a list, got str'),
        (['tritonserver'], dict(extra_args={'a': 1}), 'extra_args must be a list, got dict'),
        (['tritonserver'], dict(grpc_port='x'), "grpc_port must be a port number \\(0 disables it\\), got 'x'"),
        (['tritonserver'], dict(http_port=70000), 'http_port must be at most 65535'),
    ],
)
def test_args_refuse(command, kwargs, match):
    with pytest.raises(AnsibleFilterError, match='^triton_args: ' + match):
        triton_args(command, **kwargs)


@pytest.mark.parametrize(
    'kwargs, expected',
    [
        (
            {},
            dict(
                env={},
                labels={'io.github.tritonops.shm.managed-by': 'tritonops.shm.triton_server'},
                invalid_ulimits=[],
                docker_ulimits=[],
                logs_argv=['docker', 'logs', '--tail', '2000', 'triton'],
            ),
        ),
        (
            dict(
                engine='docker',
                docker_host='unix:///run/podman/podman.sock',
                env={'A': 1, 2: True},
                labels={'team': 'ml'},
                ulimits=['memlock=-1', 'stack=67108864', 'nofile=1024:2048'],
            ),
            dict(
                env={'A': '1', '2': 'True'},
                labels={'io.github.tritonops.shm.managed-by': 'tritonops.shm.triton_server', 'team': 'ml'},
                invalid_ulimits=[],
                docker_ulimits=['memlock:-1', 'stack:67108864', 'nofile:1024:2048'],
                logs_argv=['docker', '--host', 'unix:///run/podman/podman.sock', 'logs', '--tail', '2000', 'triton'],
            ),
        ),
        # podman has no --host; a user label may replace the role's
        (
            dict(
                engine='podman',
                docker_host='unix:///x.sock',
                labels={'io.github.tritonops.shm.managed-by': 'me'},
                ulimits=['memlock=unlimited', 'Stack=1', 'nofile=-1:-1', 'nproc=1:2:3'],
            ),
            dict(
                env={},
                labels={'io.github.tritonops.shm.managed-by': 'me'},
                invalid_ulimits=['memlock=unlimited', 'Stack=1', 'nproc=1:2:3'],
                docker_ulimits=['memlock:unlimited', 'Stack:1', 'nofile:-1:-1', 'nproc:1:2:3'],
                logs_argv=['podman', 'logs', '--tail', '2000', 'triton'],
            ),
        ),
    ],
)
def test_container(kwargs, expected):
    assert triton_container('triton', **kwargs) == expected


@pytest.mark.parametrize(
    'kwargs, match',
    [
        (dict(env=['A=1']), 'env must be a dict, got list'),
        # a Kubernetes valueFrom works only with the kubernetes engine; the value is never shown
        (
            dict(env={'TOKEN': {'secretKeyRef': {'name': 's3cret', 'key': 'k'}}}),
            r'env TOKEN: a dict or list value \(a Kubernetes valueFrom such as secretKeyRef\) works only with '
            r'triton_server_engine: kubernetes; give a string$',
        ),
        (dict(labels='a=b'), 'labels must be a dict, got str'),
        (dict(ulimits='memlock=-1'), 'ulimits must be a list, got str'),
    ],
)
def test_container_refuses(kwargs, match):
    """Docker's and Podman's env is strings only (the kubernetes engine takes a valueFrom dict: test_triton_kubernetes)."""
    with pytest.raises(AnsibleFilterError, match='^triton_container: ' + match):
        triton_container('triton', **kwargs)


PLAN = dict(bytes=100 * MIB, docker='100m', capped=False)


@pytest.mark.parametrize(
    'size, plan, expected',
    [
        ('', PLAN, dict(bytes=100 * MIB, docker='100m', source='plan', plan=PLAN)),
        ('96m', None, dict(bytes=96 * MIB, docker='96m', source='explicit', plan=None)),
        ('2g', PLAN, dict(bytes=2048 * MIB, docker='2048m', source='explicit', plan=PLAN)),
        (2147483649, None, dict(bytes=2147483649, docker='2147483649b', source='explicit', plan=None)),
        ('1000', None, dict(bytes=1000, docker='1000b', source='explicit', plan=None)),
        ('0', None, dict(bytes=0, docker='0m', source='explicit', plan=None)),
    ],
)
def test_shm(size, plan, expected):
    assert triton_shm(size, plan=plan) == expected


@pytest.mark.parametrize(
    'size, plan, match',
    [
        ('lots', None, "the size must be bytes or a size such as 2g or 512m, got 'lots'"),
        ('', None, 'either a size or a plan'),
    ],
)
def test_shm_refuses(size, plan, match):
    with pytest.raises(AnsibleFilterError, match='^triton_shm: ' + match):
        triton_shm(size, plan=plan)


def docker_info(size):
    return dict(exists=size is not None, container=dict(HostConfig=dict(ShmSize=size)) if size is not None else None)


def podman_info(size):
    return dict(containers=[dict(HostConfig=dict(ShmSize=size))] if size is not None else [])


@pytest.mark.parametrize(
    'current, wanted, changes, current_bytes',
    [
        (docker_info(100 * MIB), 100 * MIB, False, 100 * MIB),
        (docker_info(100 * MIB), 120 * MIB, True, 100 * MIB),
        (docker_info(100 * MIB), str(120 * MIB), True, 100 * MIB),
        (docker_info(None), 120 * MIB, False, None),
        (docker_info(100 * MIB), None, False, 100 * MIB),
        (podman_info(str(100 * MIB)), 120 * MIB, True, 100 * MIB),
        (podman_info(100 * MIB), 100 * MIB, False, 100 * MIB),
        (podman_info(None), 100 * MIB, False, None),
        ({}, 100 * MIB, False, None),
    ],
)
def test_shm_change(current, wanted, changes, current_bytes):
    assert triton_shm_change(current, wanted) == dict(changes=changes, current_bytes=current_bytes)


@pytest.mark.parametrize(
    'timeout, delay, retries',
    [
        (180, 2, 89),
        (180, '2', 89),
        (181, 2, 90),
        (1, 2, 1),
        (2, 2, 1),
        (10, 0, 9),
        (10, -5, 9),
        (0, 2, 1),
        (7, 3, 2),
    ],
)
def test_retries(timeout, delay, retries):
    assert triton_retries(timeout, delay) == retries


def test_retries_refuse():
    with pytest.raises(AnsibleFilterError, match='^triton_retries: timeout and delay must be whole seconds'):
        triton_retries('soon', 2)


CMD = ['podman', 'logs', '--tail', '2000', 'triton']
LOG = [
    'I1202 starting',
    'E1202 12:00 model.cc:1] failed to load',
    'I1202 x',
    'error: unrecognized option',
    '  --help text with an error word',
    '-- also not',
    'E1202 12:00 model.cc:1] failed to load',
    'done',
]


@pytest.mark.parametrize(
    'logs, lines, expected',
    [
        (
            dict(rc=0, stdout_lines=LOG[:4], stderr_lines=LOG[4:]),
            3,
            'H\nErrors in the log:\nE1202 12:00 model.cc:1] failed to load\nerror: unrecognized option\n'
            'Last 3 log lines (podman logs --tail 2000 triton):\n-- also not\nE1202 12:00 model.cc:1] failed to load\ndone\n',
        ),
        (
            dict(rc=0, stdout_lines=[], stderr_lines=[]),
            50,
            'H\nErrors in the log:\nLast 50 log lines (podman logs --tail 2000 triton):\n',
        ),
        (
            dict(rc=0, stdout_lines=[f'boot failed: {i}' for i in range(12)]),
            0,
            'H\nErrors in the log:\n'
            + ''.join(f'boot failed: {i}\n' for i in range(2, 12))
            + 'Last 0 log lines (podman logs --tail 2000 triton):\nboot failed: 11\n',
        ),
        (
            dict(rc=125, msg='non-zero return code', stderr='no such container'),
            50,
            "H\nCould not read the container's log (podman logs --tail 2000 triton): non-zero return code no such container\n",
        ),
        (
            dict(failed=True, msg='[Errno 2] No such file or directory'),
            50,
            "H\nCould not read the container's log (podman logs --tail 2000 triton): [Errno 2] No such file or directory \n",
        ),
    ],
)
def test_log_report(logs, lines, expected):
    assert triton_log_report(logs, header='H', command=CMD, lines=lines) == expected


@pytest.mark.parametrize(
    'result, line',
    [
        (
            dict(
                name='t',
                state='present',
                url='http://127.0.0.1:8000',
                shm_size_bytes=100 * MIB,
                shm_size=dict(docker='100m', source='plan'),
            ),
            't: present at http://127.0.0.1:8000, /dev/shm 100m (plan)',
        ),
        (
            dict(
                name='t',
                state='present',
                url='http://h:1',
                shm_size_bytes=None,
                shm_size=dict(docker='64m', source='plan'),
            ),
            't: present at http://h:1, /dev/shm shared (ipc mode)',
        ),
        (dict(name='t', state='absent', url=None, shm_size_bytes=None, shm_size=None), 't: absent'),
    ],
)
def test_deployed(result, line):
    assert triton_deployed(result) == line


def test_container_env_keeps_a_value_from_dict_for_kubernetes():
    secret = {'secretKeyRef': {'name': 's', 'key': 'k'}}
    assert triton_container('triton', engine='kubernetes', env={'T': secret, 'A': 1})['env'] == {'T': secret, 'A': '1'}
