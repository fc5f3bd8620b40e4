"""Unit tests for the triton_server role's filters: triton_version, triton_gpus, triton_endpoints."""
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.triton_server import (
    FilterModule, image_tag, triton_endpoints, triton_gpus, triton_version)

DIGEST = '@sha256:' + '0' * 64


@pytest.mark.parametrize('image, tag', [
    ('nvcr.io/nvidia/tritonserver:24.10-py3', '24.10-py3'),
    ('registry:5000/tritonserver:27.01-py3-min' + DIGEST, '27.01-py3-min'),
    ('registry:5000/tritonserver', ''),
    ('tritonserver' + DIGEST, ''),
    ('x:a:b', 'a'),
    ('', ''),
])
def test_image_tag(image, tag):
    assert image_tag(image) == tag


@pytest.mark.parametrize('image, version, text, kind, number, off', [
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
])
def test_version(image, version, text, kind, number, off):
    result = triton_version(image, version=version)
    assert result == dict(text=text, kind=kind, number=number, client_shm_off_by_default=off, allow_client_shm=off)


@pytest.mark.parametrize('image, allow, flag', [
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
])
def test_allow_client_shm(image, allow, flag):
    assert triton_version(image, allow_client_shm=allow)['allow_client_shm'] is flag


@pytest.mark.parametrize('image, kwargs, match', [
    (['x/t:26.04'], {}, 'the image must be a string, got list'),
    (True, {}, 'the image must be a string, got bool'),
    ('x/t:1', dict(version={'major': 2}), 'version must be a string, got dict'),
    ('x/t:1', dict(version=False), 'version must be a string, got bool'),
    ('x/t:1', dict(allow_client_shm='sometimes'), "allow_client_shm must be auto, true or false, got 'sometimes'"),
    ('x/t:1', dict(allow_client_shm=None), 'allow_client_shm must be auto, true or false, got None'),
    ('x/t:1', dict(allow_client_shm=['true']), 'allow_client_shm must be a string, got list'),
])
def test_version_refuses_wrong_types(image, kwargs, match):
    with pytest.raises(AnsibleFilterError, match='^triton_version: ' + match):
        triton_version(image, **kwargs)


ALL_REQUEST = [dict(driver='nvidia', count=-1, capabilities=[['gpu']])]


@pytest.mark.parametrize('value, ids, docker, podman', [
    ('', [], [], []),
    (None, [], [], []),
    ([], [], [], []),
    ('all', ['all'], ALL_REQUEST, ['nvidia.com/gpu=all']),
    (['all'], ['all'], ALL_REQUEST, ['nvidia.com/gpu=all']),
    (' all ', ['all'], ALL_REQUEST, ['nvidia.com/gpu=all']),
    ('0', ['0'], [dict(driver='nvidia', device_ids=['0'], capabilities=[['gpu']])], ['nvidia.com/gpu=0']),
    (1, ['1'], [dict(driver='nvidia', device_ids=['1'], capabilities=[['gpu']])], ['nvidia.com/gpu=1']),
    ([0, 1], ['0', '1'], [dict(driver='nvidia', device_ids=['0', '1'], capabilities=[['gpu']])],
     ['nvidia.com/gpu=0', 'nvidia.com/gpu=1']),
    (('GPU-5e2b',), ['GPU-5e2b'], [dict(driver='nvidia', device_ids=['GPU-5e2b'], capabilities=[['gpu']])],
     ['nvidia.com/gpu=GPU-5e2b']),
])
def test_gpus(value, ids, docker, podman):
    assert triton_gpus(value) == dict(ids=ids, docker_device_requests=docker, podman_devices=podman)


@pytest.mark.parametrize('value, match', [
    (True, "expected '', 'all', a GPU index or UUID, or a list of them, got bool True"),
    ({'0': 'x'}, "expected '', 'all', a GPU index or UUID, or a list of them, got dict"),
    (2.5, "expected '', 'all', a GPU index or UUID, or a list of them, got float 2.5"),
    (['0', ''], "each GPU must be a non-empty index or UUID, got '' in"),
    ([['0']], r"each GPU must be a non-empty index or UUID, got \['0'\]"),
    ([False], 'each GPU must be a non-empty index or UUID, got False'),
    (['all', '0'], "'all' cannot be combined with other GPUs"),
])
def test_gpus_refuses(value, match):
    with pytest.raises(AnsibleFilterError, match='^triton_gpus: ' + match):
        triton_gpus(value)


@pytest.mark.parametrize('address, kwargs, ports, published, ready', [
    ('0.0.0.0', {}, [8000, 8001, 8002], ['0.0.0.0:8000:8000', '0.0.0.0:8001:8001', '0.0.0.0:8002:8002'],
     'http://127.0.0.1:8000/v2/health/ready'),
    ('127.0.0.1', dict(http_port=18000, grpc_port=0, metrics_port='18002'), [18000, 18002],
     ['127.0.0.1:18000:18000', '127.0.0.1:18002:18002'], 'http://127.0.0.1:18000/v2/health/ready'),
    ('127.0.0.2', dict(network_mode='host', grpc_port=-1), [8000, 8002], [], 'http://127.0.0.2:8000/v2/health/ready'),
    ('', {}, [8000, 8001, 8002], [':8000:8000', ':8001:8001', ':8002:8002'], 'http://127.0.0.1:8000/v2/health/ready'),
    ('::', dict(grpc_port=0, metrics_port=0), [8000], [':::8000:8000'], 'http://127.0.0.1:8000/v2/health/ready'),
    ('10.0.0.1', dict(network_mode='triton-net'), [8000, 8001, 8002],
     ['10.0.0.1:8000:8000', '10.0.0.1:8001:8001', '10.0.0.1:8002:8002'], 'http://10.0.0.1:8000/v2/health/ready'),
    ('0.0.0.0', dict(ready_url='https://lb.example/triton/v2/health/ready', grpc_port=0, metrics_port=0), [8000],
     ['0.0.0.0:8000:8000'], 'https://lb.example/triton/v2/health/ready'),
    ('0.0.0.0', dict(ready_url='http://x:1/ready', grpc_port=0, metrics_port=0), [8000], ['0.0.0.0:8000:8000'],
     'http://x:1/ready'),
])
def test_endpoints(address, kwargs, ports, published, ready):
    result = triton_endpoints(address, **kwargs)
    url = ready[:-len('/v2/health/ready')] if ready.endswith('/v2/health/ready') else ready
    assert result == dict(ports=ports, published_ports=published, ready_url=ready, url=url)


@pytest.mark.parametrize('address, kwargs, match', [
    ('0.0.0.0', dict(http_port='http'), "http_port must be a port number \\(0 disables it\\), got 'http'"),
    ('0.0.0.0', dict(grpc_port=None), 'grpc_port must be a port number'),
    ('0.0.0.0', dict(metrics_port=True), 'metrics_port must be a port number'),
    ('0.0.0.0', dict(http_port=70000), 'http_port must be at most 65535, got 70000'),
    (['0.0.0.0'], {}, 'listen_address must be a string, got list'),
    ('0.0.0.0', dict(ready_url={'url': 'x'}), 'ready_url must be a string, got dict'),
])
def test_endpoints_refuse(address, kwargs, match):
    with pytest.raises(AnsibleFilterError, match='^triton_endpoints: ' + match):
        triton_endpoints(address, **kwargs)


def test_filters_are_registered():
    assert FilterModule().filters() == dict(triton_version=triton_version, triton_gpus=triton_gpus,
                                            triton_endpoints=triton_endpoints)
