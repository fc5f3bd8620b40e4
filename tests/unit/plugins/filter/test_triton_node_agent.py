"""Unit tests for the triton_node_agent filter: the node agent's DaemonSet and CronJobs, validated against Kubernetes
1.30-1.37 (kubernetes-validate, strict; conftest.py gives the versions)."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.triton_node_agent import FilterModule
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.node_agent import (
    CAPABILITIES,
    STATE_KEEP,
    node_agent_deadline,
    node_agent_queue,
    node_agent_state,
    node_agent_time_left,
    triton_node_agent,
)

IMAGE = 'registry.example.com/tritonops/shm-agent:0.2.0'
CASES = {
    'daemonset': dict(),
    'cronjobs': dict(kinds=['CronJob'], nodes=['gpu-1', 'gpu-2.example.com'], schedule='*/5 * * * *'),
    'both, no metrics, AppArmor unconfined': dict(
        kinds=['DaemonSet', 'CronJob'],
        nodes=['gpu-1'],
        prometheus_textfile_dir='',
        apparmor_profile='Unconfined',
        node_selector={'nvidia.com/gpu.present': 'true'},
        tolerations=[{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}],
    ),
    'nvml': dict(kinds=['DaemonSet', 'CronJob'], nodes=['gpu-1'], nvml=True),
}


def _pods(out):
    specs = []
    if out['daemonset']:
        specs.append(out['daemonset']['spec']['template']['spec'])
    specs.extend(c['spec']['jobTemplate']['spec']['template']['spec'] for c in out['cronjobs'])
    return specs


@pytest.mark.parametrize('case', sorted(CASES))
def test_every_manifest_validates(case, k8s_version):
    out = triton_node_agent(IMAGE, **CASES[case])
    assert out['documents'][0]['kind'] == 'Namespace'
    for resource in out['documents']:
        assert kubernetes_validate.validate(resource, k8s_version, strict=True) == k8s_version


def test_the_daemonset_sees_the_whole_node_with_the_least_privileges():
    out = triton_node_agent(IMAGE)
    assert [d['kind'] for d in out['documents']] == ['Namespace', 'DaemonSet'] and out['cronjobs'] == []
    (spec,) = _pods(out)
    assert spec['hostPID'] is True
    assert 'hostNetwork' not in spec and 'hostIPC' not in spec
    assert spec['automountServiceAccountToken'] is False
    (container,) = spec['containers']
    security = container['securityContext']
    assert security['capabilities'] == {'drop': ['ALL'], 'add': ['DAC_READ_SEARCH', 'SYS_PTRACE']}
    assert security['privileged'] is False and security['allowPrivilegeEscalation'] is False
    assert security['readOnlyRootFilesystem'] is True and security['runAsUser'] == 0
    assert security['seccompProfile'] == {'type': 'RuntimeDefault'} and 'appArmorProfile' not in security
    assert set(out['capabilities']) == set(CAPABILITIES) == {'SYS_PTRACE', 'DAC_READ_SEARCH'}
    assert all(out['capabilities'].values())
    script = container['command'][2]
    assert script.startswith('while true; do ansible-playbook') and 'tritonops.shm.node_agent' in script
    assert script.endswith('sleep 300; done')
    env = {e['name']: e for e in container['env']}
    assert env['NODE_NAME']['valueFrom'] == {'fieldRef': {'fieldPath': 'spec.nodeName'}}
    assert json.loads(env['AGENT_VARS']['value']) == {
        'prometheus_textfile_dir': '/var/lib/node_exporter/textfile_collector',
        'node_agent_round_timeout': 240,
    }
    # the round's memory outlives the pod (a CronJob's), on the node
    assert {'name': 'state', 'hostPath': {'path': '/var/lib/tritonops-shm', 'type': 'DirectoryOrCreate'}} in spec[
        'volumes'
    ]
    assert {'name': 'state', 'mountPath': '/var/lib/tritonops-shm'} in container['volumeMounts']
    assert {
        'name': 'textfile',
        'hostPath': {'path': '/var/lib/node_exporter/textfile_collector', 'type': 'DirectoryOrCreate'},
    } in spec['volumes']
    assert spec['tolerations'] == [{'operator': 'Exists'}]


def test_a_cronjob_per_node_pinned_by_node_affinity():
    out = triton_node_agent(
        IMAGE, kinds='CronJob', nodes=['gpu-1', 'gpu-2.example.com'], extra_vars={'shm_cleanup_exclude': ['keep_*']}
    )
    names = ['tritonops-shm-agent-gpu-1', 'tritonops-shm-agent-gpu-2-example-com']
    assert [c['metadata']['name'] for c in out['cronjobs']] == names
    for node, job in zip(['gpu-1', 'gpu-2.example.com'], out['cronjobs']):
        spec = job['spec']['jobTemplate']['spec']['template']['spec']
        terms = spec['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']
        assert terms == [{'matchExpressions': [{'key': 'kubernetes.io/hostname', 'operator': 'In', 'values': [node]}]}]
        assert spec['restartPolicy'] == 'Never' and spec['hostPID'] is True
        assert job['spec']['concurrencyPolicy'] == 'Forbid'
        assert spec['containers'][0]['command'][2].startswith('exec ansible-playbook')
        assert json.loads(spec['containers'][0]['env'][1]['value'])['shm_cleanup_exclude'] == ['keep_*']


def test_options():
    out = triton_node_agent(
        IMAGE,
        interval=60,
        capabilities=['sys_ptrace'],
        prometheus_textfile_dir='',
        apparmor_profile='Unconfined',
        image_pull='always',
    )
    (spec,) = _pods(out)
    container = spec['containers'][0]
    assert container['securityContext']['capabilities']['add'] == ['SYS_PTRACE']
    assert container['securityContext']['appArmorProfile'] == {'type': 'Unconfined'}
    assert container['imagePullPolicy'] == 'Always' and container['command'][2].endswith('sleep 60; done')
    assert [v['name'] for v in spec['volumes']] == ['tmp', 'locks', 'state']
    # the run locks need a place only root writes (the root filesystem is read-only, /tmp is every user's): issue 40
    assert {'name': 'locks', 'mountPath': '/run/tritonops_shm'} in container['volumeMounts']
    assert {'name': 'locks', 'emptyDir': {}} in spec['volumes']
    # the round's deadline: at most the interval
    assert json.loads(container['env'][1]['value'])['node_agent_round_timeout'] == 60


def test_the_rounds_deadline_is_below_the_jobs_and_the_interval():
    def round_timeout(**kwargs):
        out = triton_node_agent(IMAGE, **kwargs)
        (value,) = {json.loads(p['containers'][0]['env'][1]['value'])['node_agent_round_timeout'] for p in _pods(out)}
        return value

    assert round_timeout(kinds=['CronJob'], nodes=['gpu-1']) == 240
    assert round_timeout(kinds=['CronJob'], nodes=['gpu-1'], round_timeout=600) == 600
    assert round_timeout(interval=120) == 120
    assert round_timeout(round_timeout=100) == 100
    with pytest.raises(AnsibleFilterError, match='round_timeout must be at most 840 s'):
        triton_node_agent(IMAGE, kinds=['CronJob'], nodes=['gpu-1'], round_timeout=900)
    with pytest.raises(AnsibleFilterError, match='round_timeout must be at most 300 s'):
        triton_node_agent(IMAGE, round_timeout=301)


@pytest.mark.parametrize(
    'kwargs, words',
    [
        (dict(image=''), 'image must be'),
        (dict(name='Bad_Name'), 'name must be'),
        (dict(kinds=['Deployment']), 'kinds must list'),
        (dict(kinds=['CronJob']), 'give nodes'),
        (dict(kinds=['CronJob'], nodes=['Bad Node']), 'is not a node name'),
        (dict(kinds=['CronJob'], nodes=['n'], schedule='every minute'), 'cron schedule'),
        (dict(interval=5), 'interval must be >= 10'),
        (dict(interval=True), 'whole number'),
        (dict(apparmor_profile='Localhost'), 'apparmor_profile'),
        (dict(image_pull='sometimes'), 'image_pull'),
        (dict(nvml='yes'), 'nvml must be true or false'),
        (dict(nvml=True, runtime_class='Not A Class'), 'runtime_class'),
    ],
)
def test_errors(kwargs, words):
    kwargs = dict({'image': IMAGE}, **kwargs)
    with pytest.raises(AnsibleFilterError, match=words):
        triton_node_agent(**kwargs)


def test_filter_is_registered():
    assert FilterModule().filters()['triton_node_agent'].target() is triton_node_agent


def test_nvml_is_opt_in_and_requests_no_gpu():
    """Issue 34, goal 4: the agent reads NVML through the NVIDIA runtime (every GPU visible, the utility capability)
    without taking a GPU from a workload; without the opt-in the pods are as before."""
    for spec in _pods(triton_node_agent(IMAGE, kinds=['DaemonSet', 'CronJob'], nodes=['gpu-1'], nvml=True)):
        env = {e['name']: e.get('value') for e in spec['containers'][0]['env']}
        assert spec['runtimeClassName'] == 'nvidia'
        assert (env['NVIDIA_VISIBLE_DEVICES'], env['NVIDIA_DRIVER_CAPABILITIES']) == ('all', 'utility')
        resources = spec['containers'][0]['resources']
        assert 'nvidia.com/gpu' not in {**resources.get('requests', {}), **resources.get('limits', {})}
    (plain,) = _pods(triton_node_agent(IMAGE))
    assert 'runtimeClassName' not in plain
    assert not any(e['name'].startswith('NVIDIA_') for e in plain['containers'][0]['env'])
    (other,) = _pods(triton_node_agent(IMAGE, nvml=True, runtime_class='nvidia-cdi'))
    assert other['runtimeClassName'] == 'nvidia-cdi'


# -- the round (playbooks/node_agent.yml) ---------------------------------------------------------------------------


def test_the_filters_of_the_round_are_registered():
    names = FilterModule().filters()
    assert {'_node_agent_deadline', '_node_agent_time_left', '_node_agent_queue', '_node_agent_state'} <= set(names)


def test_a_servers_deadline_never_passes_the_rounds():
    assert node_agent_deadline(240, now=1000.0) == 1240.0
    assert node_agent_deadline('60', 1240.0, now=1000.0) == 1060.0
    assert node_agent_deadline(60, 1030.5, now=1000.0) == 1030.5
    assert node_agent_time_left(1060.0, now=1000.0) == 60
    assert node_agent_time_left(1000.9, now=1000.0) == 0 and node_agent_time_left(900.0, now=1000.0) == 0
    for bad in (0, -1, 'soon', None, float('inf')):
        with pytest.raises(AnsibleFilterError, match='a bound must be'):
            node_agent_deadline(bad)


def _server(pid, name=None):
    return {'pid': pid, 'name': name or f'tritonserver (pid {pid})', 'url': f'http://127.0.0.1:{8000 + pid}'}


def _row(server, status, msg=''):
    return dict(server, status=status, error={'step': 'Query' if msg else '', 'msg': msg})


def test_servers_that_failed_go_last_the_oldest_attempt_first():
    fakes = [_server(pid) for pid in (10, 11, 12)]
    real = _server(50)
    assert node_agent_queue([real, *fakes]) == [*fakes, real]  # no memory: pid order
    state = node_agent_state([_row(fakes[0], 'failed', 'timed out'), _row(fakes[1], 'failed', 'HTTP 500')], now=100.0)
    state = node_agent_state([_row(fakes[2], 'failed', 'timed out'), _row(real, 'ok')], json.dumps(state), now=200.0)
    assert set(state['servers']) == {f'{f["name"]} {f["url"]}' for f in fakes}
    assert state['servers'][f'{fakes[0]["name"]} {fakes[0]["url"]}'] == {
        'attempted': 100.0,
        'step': 'Query',
        'msg': 'timed out',
    }
    # the state file's text (as the playbook reads it) or its data: the same order
    for remembered in (state, json.dumps(state)):
        assert node_agent_queue([*fakes, real], remembered) == [real, fakes[0], fakes[1], fakes[2]]
    # a server not reached keeps its older attempt (it comes before those tried since); one cleaned is forgotten
    again = node_agent_state(
        [_row(fakes[0], 'not_reached'), _row(fakes[1], 'ok'), _row(fakes[2], 'failed', 'x')], state, now=300.0
    )
    assert [v['attempted'] for v in again['servers'].values()] == [100.0, 300.0]
    assert node_agent_queue([*fakes, real], again) == [fakes[1], real, fakes[0], fakes[2]]


def test_servers_that_answered_the_probe_go_first_the_quickest_first():
    """Issue 40, goal 2: nothing remembered yet (a first round), processes that did not answer the readiness probe in
    time (answered_s null) come after those that did: twenty slow fakes with lower pids cannot hold a real server."""
    fakes = [dict(_server(pid), answered_s=None) for pid in range(10, 30)]
    real, slowish = dict(_server(50), answered_s=0.004), dict(_server(40), answered_s=0.9)
    queue = node_agent_queue([*fakes, slowish, real])
    assert queue[:2] == [real, slowish] and queue[2:] == fakes
    remembered = node_agent_state([_row(real, 'failed', 'x')], now=1.0)
    assert node_agent_queue([*fakes, slowish, real], remembered)[-1] == real, 'a failure outweighs a quick answer'


@pytest.mark.parametrize('state', [None, '', 'not json', '[]', '{"version": 2, "servers": {}}', {'servers': 'x'}])
def test_a_state_that_is_not_this_playbooks_is_no_memory(state):
    servers = [_server(12), _server(10)]
    assert node_agent_queue(servers, state) == [servers[1], servers[0]]
    assert node_agent_state([], state, now=1.0) == {'version': 1, 'servers': {}}


def test_a_server_not_seen_for_a_week_is_forgotten():
    state = node_agent_state([_row(_server(10), 'failed', 'x')], now=0.0)
    assert (
        node_agent_state([], state, now=STATE_KEEP - 1)['servers']
        and not node_agent_state([], state, now=STATE_KEEP)['servers']
    )
