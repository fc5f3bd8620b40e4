"""A Kubernetes pod on this machine, cleaned from the node given only the pod's IP (issue 21, Kubernetes).

No Kubernetes API server can be installed here, so a podman pod is the model of a Triton pod:

    podman pod create --share ipc,net --shm-size PLANNED     the pod's /dev/shm = a memory-backed emptyDir
    podman run --pod POD ... tritonserver                    the Triton container
    podman run --pod POD ... client                          sidecar clients (one killed, as the OOM killer does)

The size is the tritonops.shm.shm_size plan of the workload. The cleanup playbook runs on the node (here: this
host, as the SSH-with-become or DaemonSet job would) with http://POD_IP:8000 as the only input.

The triton_server role's kubernetes engine is tested here too: it renders the Deployment and Service to a file
(check mode writes nothing, a second run is changed=false), and the file validates against the Kubernetes 1.30-1.37
schemas. Applying it to a cluster (kubernetes.core.k8s) is not tested: there is no API server.
"""

from __future__ import annotations

import os
import re
import sys

import engines
import kubernetes_validate
import pytest
import yaml
from ansible_helpers import COLLECTIONS_PATH, ansible_playbook, run_module
from test_topologies import clean_a_killed_client_given_only_the_url

if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)

from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.sizing import shm_size  # noqa: E402  pylint: disable=wrong-import-position

MIB = 1 << 20
PODMAN = pytest.mark.parametrize('container_engine', ['podman'], indirect=True)
# Two 8 MiB clients and one 1 MiB inference client at the same time, one python backend instance (the echo model)
# peaking at 4 MiB: (17 + 4) MiB * 1.25 = 27 MiB.
WORKLOAD = {
    'client_regions': [{'byte_size': '8m', 'count': 2}, {'byte_size': '1m'}],
    'python_backend_instances': 1,
    'python_backend_peak_byte_size': '4m',
    'floor_bytes': '16m',
}
K8S_VERSIONS = [f'1.{minor}' for minor in range(30, 38)]


@pytest.fixture
def pod(container_engine):
    """Factory: pod(shm_size) -> a started podman pod sharing IPC and network; removed after the test."""
    made = []

    def factory(shm_size):
        made.append(engines.create_pod(container_engine, shm_size=shm_size))
        return made[-1]

    try:
        yield factory
    finally:
        for p in reversed(made):
            p.remove()


@PODMAN
def test_cleanup_from_the_node_given_only_the_pod_ip(container_engine, pod):
    plan = shm_size(WORKLOAD)
    assert (plan['bytes'], plan['docker'], plan['kubernetes']['size_limit']) == (27 * MIB, '27m', '27Mi')
    triton_pod = pod(plan['docker'])
    assert triton_pod.shared == ['ipc', 'net'], triton_pod
    triton = engines.run_triton(container_engine, pod=triton_pod, models=('echo',))
    url = f'http://{triton_pod.ip}:8000'
    assert triton.url == url
    live = engines.run_client(triton, 'live_client', 8 * MIB)
    busy = engines.run_client(triton, 'busy_client', MIB, mode='infer')
    dead = engines.run_client(triton, 'dead_client', 8 * MIB)
    # every container of the pod has the pod's one /dev/shm (in Kubernetes: the emptyDir mounted in each)
    shm_dev = os.stat(triton.shm_dir).st_dev
    for client in (live, busy, dead):
        assert os.stat(f'/proc/{client.inspect()["State"]["Pid"]}/root/dev/shm').st_dev == shm_dev, client
    dead.kill()

    # from the node: the URL finds the server in the pod's network namespace, and its /dev/shm is the planned size
    info = run_module('tritonops.shm.triton_shm_info', {'url': url})
    assert not info.get('failed'), info
    assert info['server']['pid'] == triton.pid, info['server']
    assert info['server']['shm_dir'] == f'/proc/{triton.pid}/root/dev/shm'
    assert info['shm_fs']['total_bytes'] == plan['bytes']
    assert info['holders_complete'] is True, info.get('warnings')
    assert info['server']['located_by'].startswith(
        f'connection to tritonserver (pid {triton.pid}) at {triton_pod.ip}:8000'
    )

    # the sidecars wrote into the pod's /dev/shm, which is the server's; the node-level job cleans the dead one's
    clean_a_killed_client_given_only_the_url(triton, url, [live, busy], host='node1')


# -- the triton_server role's kubernetes engine: the manifest file ------------------------------------------


def _render(tmp_path, check=False, env=None, args=(), **role_vars):
    role_vars.setdefault('triton_server_engine', 'kubernetes')
    role_vars.setdefault('triton_server_kubernetes_manifest', str(tmp_path / 'out' / 'triton.yml'))
    play = [
        {
            'name': 'render',
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'roles': [{'role': 'tritonops.shm.triton_server', 'vars': role_vars}],
            'tasks': [{'name': 'result', 'ansible.builtin.debug': {'var': 'triton_server_result'}}],
        }
    ]
    return ansible_playbook(play, check=check, env=env, args=args, diff=bool(args))


ENV_SECRET = 'envs3cret-4d1a-never-shown'
# kubectl reads YAML 1.1 booleans (y, n, on, off) and 1e3 as a number: the role must quote them
KUBECTL_BOOL = re.compile(r'^(?:y|Y|n|N|yes|Yes|no|No|true|True|false|False|on|On|off|Off)$')


def test_the_role_renders_a_deployment_and_service_that_validate(tmp_path):
    path = tmp_path / 'out' / 'triton.yml'
    role_vars = dict(
        triton_server_image='nvcr.io/nvidia/tritonserver:26.04-py3',
        triton_server_shm_plan=dict(WORKLOAD, host_memory_bytes='64G', server_memory_bytes='4G'),
        triton_server_kubernetes_namespace='inference',
        triton_server_env={
            'API_TOKEN': ENV_SECRET,
            'FLAG': 'y',
            'SCALE': '1e3',
            'DB_PASSWORD': {'secretKeyRef': {'name': 'triton-secrets', 'key': 'db'}},
        },
        triton_server_labels={'canary': 'y'},
    )

    # check mode at -vvv with --diff in the human output: the env values are nowhere
    res = _render(
        tmp_path, check=True, env={'ANSIBLE_STDOUT_CALLBACK': 'ansible.builtin.default'}, args=['-vvv'], **role_vars
    )
    assert res.rc == 0 and 'changed=' in res.stdout, res.stdout[-3000:]
    assert ENV_SECRET not in res.stdout + res.stderr
    assert not path.exists() and not path.parent.exists()
    res = _render(tmp_path, check=True, **role_vars)
    assert res.rc == 0 and res.stats['localhost']['changed'] > 0, res

    res = _render(tmp_path, **role_vars)
    assert res.rc == 0 and res.stats['localhost']['changed'] > 0, res
    result = res.task('result')['triton_server_result']
    assert result['engine'] == 'kubernetes' and result['changed'] is True
    assert result['url'] == 'http://triton.inference.svc:8000'
    assert result['kubernetes']['manifest'] == str(path)
    text = path.read_text()
    deployment, service = list(yaml.safe_load_all(text))
    # every string quoted: the scalars kubectl would read as booleans or numbers are strings
    plain = [t.value for t in yaml.scan(text) if isinstance(t, yaml.ScalarToken) and t.plain]
    assert all(re.fullmatch(r'[0-9]+|true|false', v) for v in plain), plain
    assert (
        '"y"' in text
        and '"1e3"' in text
        and not any(KUBECTL_BOOL.match(v) for v in plain if v not in ('true', 'false'))
    )
    env = {e['name']: e for e in deployment['spec']['template']['spec']['containers'][0]['env']}
    assert env['FLAG'] == {'name': 'FLAG', 'value': 'y'} and env['SCALE'] == {'name': 'SCALE', 'value': '1e3'}
    assert env['DB_PASSWORD'] == {
        'name': 'DB_PASSWORD',
        'valueFrom': {'secretKeyRef': {'name': 'triton-secrets', 'key': 'db'}},
    }
    assert deployment['metadata']['labels']['canary'] == 'y'
    for version in K8S_VERSIONS:
        for resource in (deployment, service):
            assert kubernetes_validate.validate(resource, version, strict=True) == version
    spec = deployment['spec']['template']['spec']
    assert {'name': 'dshm', 'emptyDir': {'medium': 'Memory', 'sizeLimit': '27Mi'}} in spec['volumes']
    server = spec['containers'][0]
    assert {'name': 'dshm', 'mountPath': '/dev/shm'} in server['volumeMounts']
    assert server['resources']['limits']['memory'] == f'{27 + 4096}Mi'
    assert '--allow-client-shm=true' in server['args']  # 26.04 = Triton 2.68
    assert service['spec']['selector'] == deployment['spec']['selector']['matchLabels']
    mode = os.stat(path).st_mode & 0o777
    assert mode == 0o600, oct(mode)  # env values may be secrets

    res = _render(tmp_path, **role_vars)
    assert res.rc == 0 and res.stats['localhost']['changed'] == 0, res

    # an older server does not get the flag (it would refuse to start)
    older = {**role_vars, 'triton_server_image': 'nvcr.io/nvidia/tritonserver:24.10-py3'}
    res = _render(tmp_path, **older)
    assert res.rc == 0 and res.stats['localhost']['changed'] > 0, res
    deployment = next(yaml.safe_load_all(path.read_text()))
    assert not any(
        a.startswith('--allow-client-shm') for a in deployment['spec']['template']['spec']['containers'][0]['args']
    )

    # absent removes the file (not the objects in a cluster), then has nothing to do
    res = _render(tmp_path, triton_server_state='absent')
    assert res.rc == 0 and res.stats['localhost']['changed'] > 0 and not path.exists(), res
    res = _render(tmp_path, triton_server_state='absent')
    assert res.rc == 0 and res.stats['localhost']['changed'] == 0, res


def test_the_role_adds_the_sweep_init_container_with_the_agents_image(tmp_path):
    """triton_server_kubernetes_sweep_image: an initContainer runs triton_shm_sweep on the pod's /dev/shm emptyDir before
    tritonserver starts; triton_server_shm_sweep: false leaves it out. The Deployment validates either way."""
    path = tmp_path / 'out' / 'triton.yml'
    role_vars = dict(
        triton_server_image='nvcr.io/nvidia/tritonserver:26.04-py3',
        triton_server_shm_plan=dict(WORKLOAD, host_memory_bytes='64G', server_memory_bytes='4G'),
        triton_server_kubernetes_sweep_image='registry.example.com/tritonops/shm-agent:0.3.0',
        triton_server_shm_sweep_families=['nccl'],
    )
    res = _render(tmp_path, **role_vars)
    assert res.rc == 0, res
    deployment = next(yaml.safe_load_all(path.read_text()))
    spec = deployment['spec']['template']['spec']
    (init,) = spec['initContainers']
    assert init['image'] == 'registry.example.com/tritonops/shm-agent:0.3.0'
    assert 'tritonops.shm.triton_shm_sweep' in init['command'] and '"families": ["nccl"]' in init['command'][-1]
    assert {'name': 'dshm', 'mountPath': '/dev/shm'} in init['volumeMounts']
    for version in K8S_VERSIONS:
        assert kubernetes_validate.validate(deployment, version, strict=True) == version

    res = _render(tmp_path, triton_server_shm_sweep=False, **role_vars)
    assert res.rc == 0 and res.stats['localhost']['changed'] > 0, res
    assert 'initContainers' not in next(yaml.safe_load_all(path.read_text()))['spec']['template']['spec']
