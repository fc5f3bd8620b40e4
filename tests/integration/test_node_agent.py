"""The node agent (issue 25, goal 3), for real: the servers of a host listed with no inventory, and the agent run as a
container with the host's PID namespace cleaning a Triton podman pod by itself.

A podman pod is the model of a Kubernetes pod (test_kubernetes_pod.py); ``podman run --pid host`` is hostPID. The
agent container runs the host's own files (``--rootfs /:O``: the venv and this collection's build, read-only through
an overlay) with exactly the capabilities of the rendered manifests (tritonops.shm.triton_node_agent), no inventory
and connection local: ``ansible-playbook -i NODE, tritonops.shm.node_agent``. The machine runs other suites'
tritonservers too: the agent is narrowed to this test's pod by ``node_agent_select`` (a pattern on each server's
name), and the listing assertions look at this test's servers only.
"""

from __future__ import annotations

import json
import os
import sys

import engines
import pytest
import tritonrig
from ansible_helpers import COLLECTIONS_PATH, PYTHON, run_module

if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)

from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.node_agent import CAPABILITIES  # noqa: E402  pylint: disable=wrong-import-position

PODMAN = pytest.mark.parametrize('container_engine', ['podman'], indirect=True)
MIB = 1 << 20
NOBODY = '65534:65534'


def _agent_cmd(engine, args, pid_host=True, pod=None, caps=None, env=None, name='agent', volumes=()):
    """`podman run --rm --rootfs /:O` of ansible-playbook ARGS with the host's venv and this collection's build.

    caps: the capabilities (every other one dropped; None: the node agent manifest's), or 'default' (the engine's).
    """
    caps = sorted(CAPABILITIES) if caps is None else caps
    opts = [
        'run',
        '--rm',
        '--name',
        engine.unique_name(name),
        '--label',
        f'{engines.LABEL}={os.getpid()}',
        '--security-opt',
        'no-new-privileges',
    ]
    if caps != 'default':  # 'default': the engine's default capabilities (a sidecar as users run one)
        opts += ['--cap-drop', 'ALL'] + [f'--cap-add={cap}' for cap in caps]
    if pid_host:
        opts += ['--pid', 'host']
    if pod is not None:
        opts += ['--pod', pod.id]
    full_env = {
        'ANSIBLE_COLLECTIONS_PATH': COLLECTIONS_PATH,
        'ANSIBLE_STDOUT_CALLBACK': 'ansible.posix.json',
        'ANSIBLE_LOAD_CALLBACK_PLUGINS': '1',
        'ANSIBLE_PYTHON_INTERPRETER': PYTHON,
        'HOME': '/tmp',
        'ANSIBLE_LOCAL_TEMP': '/tmp/ansible',
        'ANSIBLE_NOCOLOR': '1',
        'ANSIBLE_LOCALHOST_WARNING': 'False',
        'ANSIBLE_INVENTORY_UNPARSED_WARNING': 'False',
        'ANSIBLE_DEPRECATION_WARNINGS': 'False',
    }
    full_env.update(env or {})
    for key, value in full_env.items():
        opts += ['-e', f'{key}={value}']
    for volume in volumes:
        opts += ['-v', volume]
    opts += ['--rootfs', '/:O', os.path.join(os.path.dirname(PYTHON), 'ansible-playbook')] + list(args)
    return engine.run(*opts, check=False, timeout=600)


def parse(proc):
    """The json callback's document (or None) and the whole output."""
    text = proc.stdout
    try:
        return json.loads(text[text.index('{') :]), text + proc.stderr
    except ValueError:
        return None, text + proc.stderr


def run_agent(engine, select, pid_host=True, caps=None, check=False, metrics_dir=None):
    # the pod's clients run as nobody, Triton as root: the owner rule (issue 26, finding 5) removes their files only
    # when the operator names their user
    extra = {'node_agent_select': select, 'shm_cleanup_client_users': ['65534']}
    volumes = []
    if metrics_dir is not None:
        extra['prometheus_textfile_dir'] = '/metrics'
        volumes.append(f'{metrics_dir}:/metrics')
    args = ['-i', 'node1,', '-e', 'target=node1', '-e', json.dumps(extra), 'tritonops.shm.node_agent'] + (
        ['--check'] if check else []
    )
    proc = _agent_cmd(
        engine, args, pid_host=pid_host, caps=caps, env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'}, volumes=volumes
    )
    data, text = parse(proc)
    return proc.returncode, data, text


def _task(data, name):
    for play in data['plays']:
        for task in play['tasks']:
            if task['task']['name'] == name:
                return task['hosts'].get('node1')
    return None


@PODMAN
def test_server_info_lists_a_host_server_and_a_podman_server(container_engine, tmp_path):
    """Two real tritonservers on one machine, one on the host (gRPC too), one in a podman container: both listed with
    their ports, a URL that answers, their shm directories and (for the container) its engine and id."""
    with tritonrig.TritonServer(workdir=str(tmp_path / 'host'), grpc=True, models=()) as host:
        container = engines.run_triton(container_engine, publish=True)
        res = run_module('tritonops.shm.triton_server_info')
        assert not res.get('failed') and res['changed'] is False, res
        assert res['complete'] is True and res['reason'] is None
        by_pid = {s['pid']: s for s in res['servers']}
        assert {host.pid, container.pid} <= set(by_pid), by_pid.keys()
        mine = by_pid[host.pid]
        assert (mine['http_port'], mine['grpc_port'], mine['metrics_port']) == (host.http_port, host.grpc_port, None)
        assert mine['http_url'] == host.url and mine['grpc_url'] == f'grpc://127.0.0.1:{host.grpc_port}'
        assert mine['shm_dir'] == f'/proc/{host.pid}/root/dev/shm' and mine['container'] is None
        assert mine['host_network'] is True
        theirs = by_pid[container.pid]
        assert theirs['container']['runtime'] == 'podman' and theirs['container']['container_id'] == container.id
        assert theirs['name'] == f'podman {container.id[:12]}'
        assert theirs['http_port'] == 8000 and theirs['host_network'] is False
        assert theirs['url'] == container.container_url, theirs  # the container's own address, found in its namespace
        assert engines.http_status(theirs['url']) == 200
        assert os.stat(theirs['shm_dir']).st_dev == os.stat(container.shm_dir).st_dev
        # check mode: the same listing
        again = run_module('tritonops.shm.triton_server_info', check=True)
        assert again['changed'] is False and {s['pid'] for s in again['servers']} >= {host.pid, container.pid}


@pytest.fixture
def leaky_pod(container_engine):
    """A Triton podman pod (--share ipc,net) with a live sidecar client and a killed one, both running as nobody."""
    pod = engines.create_pod(container_engine, shm_size='64m')
    try:
        triton = engines.run_triton(container_engine, pod=pod)
        live = engines.run_client(triton, 'live_client', 4 * MIB, extra=('--user', NOBODY))
        dead = engines.run_client(triton, 'dead_client', 4 * MIB, extra=('--user', NOBODY))
        dead.kill()
        assert {'live_client', 'dead_client'} <= set(triton.system_regions())
        assert {'live_client', 'dead_client'} <= set(triton.shm_files())
        assert os.stat(triton.shm_path('dead_client')).st_uid == 65534
        yield pod, triton, live
    finally:
        pod.remove()


def _untouched(triton):
    regions, files = set(triton.system_regions()), set(triton.shm_files())
    return {'live_client', 'dead_client'} <= regions and {'live_client', 'dead_client'} <= files


@PODMAN
def test_agent_with_host_pid_cleans_a_pod_by_itself(container_engine, leaky_pod, tmp_path):
    pod, triton, live = leaky_pod
    pod_name = f'podman pod {pod.id[:12]} container {triton.id[:12]}'
    select = f'podman pod {pod.id[:12]} '

    # without the host's PID namespace: it cannot see the pod's processes, says why, removes nothing
    rc, data, text = run_agent(container_engine, select, pid_host=False)
    assert rc != 0, text
    failed = _task(data, 'Refuse a listing that cannot see every server and client')
    assert failed and failed.get('failed'), text
    assert "outside the host's initial PID namespace" in failed['msg'], failed['msg']
    assert _untouched(triton)

    # each capability of the manifest is needed: without any one of them, nothing is removed
    for missing in sorted(CAPABILITIES):
        caps = sorted(set(CAPABILITIES) - {missing})
        rc, data, text = run_agent(container_engine, select, caps=caps)
        assert _untouched(triton), (missing, text[-3000:])
        assert rc != 0, (missing, text[-3000:])  # a round that cannot act fails: the Job or the pod shows it
        # the reason: processes it could not read (their maps and fds), or the server's sockets (no URL to reach it)
        assert 'could not be inspected' in text or 'cannot be read' in text, (missing, text[-3000:])

    # check mode with hostPID: finds the pod's server by itself, says what it would do, changes nothing
    rc, data, text = run_agent(container_engine, select, check=True)
    assert rc == 0, text[-4000:]
    listing = _task(data, 'List the Triton servers of this node')
    (server,) = [s for s in listing['servers'] if s['pid'] == triton.pid]
    assert server['url'] == f'http://{pod.ip}:8000' and server['container']['podman_pod'] == pod.id, server
    assert _untouched(triton)

    assert server['name'] == pod_name
    # who holds what: the live sidecar by its container in the pod
    (record,) = data['global_custom_stats']['tritonops_shm_cleanup'].values()
    assert record['server']['container'] == pod_name and record['done']['unregistered'] == ['dead_client'], record

    # with hostPID and the manifest's capabilities: the dead sidecar's region and file are gone, the live one kept
    metrics_dir = tmp_path / 'metrics'
    metrics_dir.mkdir()
    rc, data, text = run_agent(container_engine, select, metrics_dir=str(metrics_dir))
    assert rc == 0, text[-4000:]
    regions, files = set(triton.system_regions()), set(triton.shm_files())
    assert 'dead_client' not in regions and 'dead_client' not in files
    assert 'live_client' in regions and 'live_client' in files and live.alive
    # the node's metrics name the pod's server and the live sidecar's container, not only pids
    report = ''.join(p.read_text() for p in metrics_dir.glob('tritonops_shm.node1.*.prom'))
    assert (
        f'tritonops_shm_server_container_info{{host="node1",triton_url="http://{pod.ip}:8000",container="{pod_name}"'
        in report
    ), report
    assert f'holder="podman pod {pod.id[:12]} container {live.id[:12]}"}} {4 * MIB}' in report, report
    # a second round has nothing to do
    rc, data, text = run_agent(container_engine, select)
    assert rc == 0 and data['stats']['node1']['changed'] == 0, text[-4000:]
    # the node and each server's own host (the round's queue, issue 40)
    assert len(data['stats']) == 2 and all(s['changed'] == 0 for s in data['stats'].values()), data['stats']


def test_the_manifest_playbook_writes_manifests_that_validate(tmp_path):
    """tritonops.shm.node_agent_manifest: check mode writes nothing, the file validates, a second run is changed=0."""
    import kubernetes_validate
    import yaml
    from ansible_helpers import ansible_playbook

    path = tmp_path / 'agent.yml'
    extra = {
        'node_agent_image': 'registry.example.com/tritonops/shm-agent:0.2.0',
        'node_agent_manifest': str(path),
        'node_agent_kinds': ['DaemonSet', 'CronJob'],
        'node_agent_nodes': ['gpu-1'],
        'node_agent_options': {'interval': 120, 'extra_vars': {'shm_cleanup_exclude': ['keep_*']}},
    }
    play = os.path.join(
        COLLECTIONS_PATH, 'ansible_collections', 'tritonops', 'shm', 'playbooks', 'node_agent_manifest.yml'
    )
    res = ansible_playbook(play, extra_vars=extra, check=True, inventory='localhost,')
    assert res.rc == 0 and res.stats['localhost']['changed'] == 1 and not path.exists(), res
    res = ansible_playbook(play, extra_vars=extra, inventory='localhost,')
    assert res.rc == 0 and res.stats['localhost']['changed'] == 1, res
    documents = list(yaml.safe_load_all(path.read_text()))
    assert [d['kind'] for d in documents] == ['Namespace', 'DaemonSet', 'CronJob']
    for version in [f'1.{minor}' for minor in range(30, 38)]:
        for resource in documents:
            assert kubernetes_validate.validate(resource, version, strict=True) == version
    assert documents[1]['spec']['template']['spec']['hostPID'] is True
    assert oct(os.stat(path).st_mode & 0o777) == '0o644'
    res = ansible_playbook(play, extra_vars=extra, inventory='localhost,')
    assert res.rc == 0 and res.stats['localhost']['changed'] == 0, res
