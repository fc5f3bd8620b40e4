"""The tritonops.shm.triton_server role and playbooks/deploy.yml against real containers.

Podman (and runc) from the distribution, a local tritonserver image built from
the nvidia-pytriton wheel by tests/integration/containers/setup.sh (no
registry), the docker engine through Podman's Docker API (`podman system
service`, engine id ``docker``) and through a real dockerd (Debian's docker.io,
the harness's private daemon, engine id ``dockerd``). Each flow deploys with a
plan, checks the engine's `inspect` ShmSize, the
container's /dev/shm as tritonops.shm.triton_shm_info sees it from the URL
alone, readiness, `changed=0` on a rerun, check mode, recreation on a changed
plan and removal.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import tritonrig
import yaml
from ansible_helpers import PYTHON, REPO, ansible_playbook, run_module

MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
SETUP = os.path.join(HERE, 'containers', 'setup.sh')
ROLE = 'tritonops.shm.triton_server'
NVIDIA_ULIMITS = ['memlock=-1', 'stack=67108864']

# 4 x 16 MiB client regions + 2 python instances x 8 MiB = 80 MiB, +25 % = 100 MiB
PLAN = {
    'client_regions': [{'byte_size': '16m', 'count': 4}],
    'python_backend_instances': 2,
    'python_backend_peak_byte_size': '8m',
}
PLAN_BYTES = 100 * MIB
# one more 16 MiB region: 96 MiB + 25 % = 120 MiB
BIGGER_PLAN = {
    'client_regions': [{'byte_size': '16m', 'count': 5}],
    'python_backend_instances': 2,
    'python_backend_peak_byte_size': '8m',
}
BIGGER_PLAN_BYTES = 120 * MIB

# with the container harness's tests in one pytest-xdist worker (conftest.ENGINES_GROUP): the engine parameter
# reaches the private dockerd through request.getfixturevalue, which the conftest's rule cannot see
pytestmark = pytest.mark.xdist_group('engines')


def _podman(*args, check=True, timeout=120):
    return subprocess.run(['podman'] + list(args), capture_output=True, text=True, check=check, timeout=timeout)


@pytest.fixture(scope='module')
def image():
    """The local tritonserver image (built once, cached by content hash)."""
    proc = subprocess.run([SETUP, PYTHON], capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode == 3:
        pytest.skip(
            'container tests need podman, which is missing and cannot be installed here: %s' % proc.stderr.strip()
        )
    if proc.returncode != 0:
        pytest.fail('container setup failed (%s):\n%s\n%s' % (proc.returncode, proc.stdout, proc.stderr))
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope='module')
def ulimits(image):
    """NVIDIA's ulimits when this machine accepts them, else the machine's own hard limits.

    Some VMs cannot raise hard rlimits (memlock=-1 is refused); explicit ulimits
    also replace Podman's default nofile/nproc, so those are set as well.
    """
    probe = ['run', '--rm', '--network=none']
    if (
        _podman(
            *(probe + ['--ulimit=%s' % u for u in NVIDIA_ULIMITS] + [image, '/bin/sh', '-c', 'true']), check=False
        ).returncode
        == 0
    ):
        return NVIDIA_ULIMITS
    fallback = [
        'memlock=%d' % resource.getrlimit(resource.RLIMIT_MEMLOCK)[1],
        'stack=67108864',
        'nofile=%d:%d' % ((resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2),
        'nproc=%d:%d' % ((min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768),) * 2),
    ]
    proc = _podman(*(probe + ['--ulimit=%s' % u for u in fallback] + [image, '/bin/sh', '-c', 'true']), check=False)
    assert proc.returncode == 0, 'podman cannot run a container with %s either: %s' % (fallback, proc.stderr)
    return fallback


@pytest.fixture(scope='module')
def docker_host(image, tmp_path_factory):
    """Podman's Docker-compatible API on a private socket (stopped by pid afterwards)."""
    sock = str(tmp_path_factory.mktemp('podman-api') / 'podman.sock')
    proc = subprocess.Popen(
        ['podman', 'system', 'service', '--time=0', 'unix://' + sock],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError('podman system service did not start: %s' % proc.stderr.read().decode())
            time.sleep(0.1)
        yield 'unix://' + sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope='module')
def dockerd_host(image, docker_daemon):
    """The harness's private dockerd (Debian's docker.io) with the same tritonserver image imported."""
    assert docker_daemon.image('tritonserver').ref == image
    return docker_daemon.host


def engine_setup(engine, request):
    """(the role's triton_server_engine, its docker_host, the engine the test inspects through or None for podman)."""
    if engine == 'dockerd':
        return 'docker', request.getfixturevalue('dockerd_host'), request.getfixturevalue('docker_daemon')
    if engine == 'docker':
        return 'docker', request.getfixturevalue('docker_host'), None
    return engine, None, None


@pytest.fixture
def container():
    """A unique container name (make(label, via=engine) for one the harness's dockerd runs); removed after the test."""
    names = []

    def make(label, via=None):
        name = 'tritonops-test-%s-%d-%d' % (label, os.getpid(), len(names))
        names.append((name, via))
        return name

    try:
        yield make
    finally:
        for name, via in names:
            if via is not None:
                via.run('rm', '--force', name, check=False)
            else:
                _podman('rm', '--force', '--time', '2', name, check=False)


ENV_SECRET = 'envs3cret-role-never-shown'  # a triton_server_env value the output must never show


def role_vars(image, ulimits, name, tmp_path, engine, docker_host=None, **extra):
    http, grpc, metrics = tritonrig.free_port(), tritonrig.free_port(), tritonrig.free_port()
    values = {
        'triton_server_engine': engine,
        'triton_server_name': name,
        'triton_server_image': image,
        'triton_server_image_pull': 'never',
        'triton_server_model_repository': str(tmp_path / ('repo-' + name) / 'models'),
        'triton_server_listen_address': '127.0.0.1',
        'triton_server_http_port': http,
        'triton_server_grpc_port': grpc,
        'triton_server_metrics_port': metrics,
        'triton_server_ulimits': ulimits,
        'triton_server_ready_timeout': 90,
        'triton_server_ready_delay': 1,
        'triton_server_shm_plan': PLAN,
    }
    if docker_host:
        values['triton_server_docker_host'] = docker_host
    values.update(extra)
    return values


def role_play(values, tasks_from=None):
    """One play on localhost that runs the role (or one of its task files) and shows triton_server_result."""
    play = {
        'name': 'triton_server role',
        'hosts': 'localhost',
        'connection': 'local',
        'gather_facts': False,
        'vars': dict(values, ansible_python_interpreter=PYTHON),
        'tasks': [],
    }
    if tasks_from:
        play['tasks'].append(
            {'name': 'the role', 'ansible.builtin.include_role': {'name': ROLE, 'tasks_from': tasks_from}}
        )
    else:
        play['roles'] = [{'role': ROLE}]
    play['tasks'].append({'name': 'result', 'ansible.builtin.debug': {'var': 'triton_server_result'}})
    return [play]


def run_role(values, check=False, diff=False):
    return ansible_playbook(role_play(values), check=check, diff=diff)


def role_task(res, suffix):
    found = [r for n, r in res.tasks() if n.endswith(' : ' + suffix) or n == suffix]
    if not found:
        raise KeyError('no task %r in %s' % (suffix, [task[0] for task in res.tasks()]))
    return found[-1]


def result_of(res):
    return res.task('result')['triton_server_result']


def changed(res):
    return res.stats['localhost']['changed']


def failed(res):
    return res.stats.get('localhost', {}).get('failures', 0)


def inspect(name, via=None):
    """`inspect` through podman, or through the harness engine `via` (the real dockerd)."""
    if via is not None:
        return via.inspect(name)
    proc = _podman('container', 'inspect', name, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def ready_status(url):
    try:
        with urllib.request.urlopen(url + '/v2/health/ready', timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def shm_info(url):
    result = run_module('tritonops.shm.triton_shm_info', {'url': url})
    assert not result.get('failed'), result
    return result


def deploy_and_check(values, name, bytes_expected, docker_string, via=None):
    """Run the role, then check the container: ShmSize, readiness, its /dev/shm seen from the URL alone."""
    res = run_role(values)
    assert res.rc == 0 and failed(res) == 0, res
    result = result_of(res)
    assert result['changed'] is True
    assert result['shm_size_bytes'] == bytes_expected
    assert result['shm_size']['source'] == 'plan'
    assert result['shm_size']['plan']['bytes'] == bytes_expected
    assert result['shm_size']['docker'] == docker_string
    url = result['url']
    assert url == 'http://127.0.0.1:%d' % values['triton_server_http_port']
    state = inspect(name, via)
    assert state is not None and state['State']['Running'] is True
    assert state['HostConfig']['ShmSize'] == bytes_expected
    assert ready_status(url) == 200
    assert shm_info(url)['shm_fs']['total_bytes'] == bytes_expected
    return res, result, state


@pytest.mark.parametrize('engine', ['podman', 'docker', 'dockerd'])
def test_deploy_rerun_recreate_absent(engine, image, ulimits, container, tmp_path, request):
    role_engine, docker, via = engine_setup(engine, request)
    name = container(engine, via)
    values = role_vars(
        image, ulimits, name, tmp_path, role_engine, docker_host=docker, triton_server_env={'API_TOKEN': ENV_SECRET}
    )

    # deploy with a plan
    res, result, state = deploy_and_check(values, name, PLAN_BYTES, '100m', via)
    assert f'API_TOKEN={ENV_SECRET}' in inspect(name, via)['Config']['Env']
    # Triton 2.51 has no --allow-client-shm: auto leaves it out (the server would exit otherwise)
    assert result['allow_client_shm'] is False
    assert not any(a.startswith('--allow-client-shm') for a in result['args'])
    assert os.path.isdir(values['triton_server_model_repository'])

    # the same inputs change nothing
    res = run_role(values)
    assert res.rc == 0 and changed(res) == 0, res
    assert result_of(res)['changed'] is False
    assert inspect(name, via)['Id'] == state['Id']
    # the env values are never shown, even at -vvv with --diff in the human output; the same run with the role's
    # no_log forced off shows them, so the output did carry them
    human = {'ANSIBLE_STDOUT_CALLBACK': 'ansible.builtin.default'}
    res = ansible_playbook(role_play(values), diff=True, env=human, args=['-vvv'])
    assert res.rc == 0 and 'changed=0' in res.stdout, res.stdout[-3000:]
    assert ENV_SECRET not in res.stdout + res.stderr
    shown = ansible_playbook(
        role_play(values), diff=True, env=human, args=['-vvv', '-e', '_triton_server_no_log=false']
    )
    assert shown.rc == 0 and ENV_SECRET in shown.stdout + shown.stderr, shown.stdout[-3000:]

    if engine in ('podman', 'dockerd'):
        # check mode with a bigger plan: reports the recreation, changes nothing, does not fail
        res = run_role(dict(values, triton_server_shm_plan=BIGGER_PLAN), check=True)
        assert res.rc == 0 and failed(res) == 0, res
        run_task = 'Run the Triton Podman container' if engine == 'podman' else 'Run the Triton Docker container'
        assert role_task(res, run_task)['changed'] is True
        assert inspect(name, via)['Id'] == state['Id']
        assert inspect(name, via)['HostConfig']['ShmSize'] == PLAN_BYTES

    # a bigger plan recreates the container, and says so
    res, result, new_state = deploy_and_check(
        dict(values, triton_server_shm_plan=BIGGER_PLAN), name, BIGGER_PLAN_BYTES, '120m', via
    )
    said = role_task(res, 'Say that the container is recreated for its /dev/shm size')
    assert 'changes from %d to %d bytes' % (PLAN_BYTES, BIGGER_PLAN_BYTES) in said['msg']
    assert result['recreated_for_shm_size'] is True
    assert new_state['Id'] != state['Id']

    # absent removes it (check mode first: nothing removed); again changes nothing
    absent = dict(values, triton_server_state='absent')
    if engine in ('podman', 'dockerd'):
        res = run_role(absent, check=True)
        assert res.rc == 0 and changed(res) == 1, res
        assert inspect(name, via) is not None
    res = run_role(absent)
    assert res.rc == 0 and changed(res) == 1, res
    assert inspect(name, via) is None
    if engine in ('podman', 'dockerd'):
        res = run_role(absent)
        assert res.rc == 0 and changed(res) == 0, res


@pytest.mark.parametrize('engine', ['podman', 'docker', 'dockerd'])
def test_not_ready_shows_the_log(engine, image, ulimits, container, tmp_path, request):
    if engine != 'podman' and shutil.which('docker') is None:
        pytest.skip('the docker CLI (used to read the log of a docker-engine container) is not installed')
    role_engine, docker, via = engine_setup(engine, request)
    name = container('bad-' + engine, via)
    values = role_vars(
        image,
        ulimits,
        name,
        tmp_path,
        role_engine,
        docker_host=docker,
        triton_server_extra_args=['--no-such-flag=1'],
        triton_server_ready_timeout=4,
        triton_server_restart_policy='no',
    )
    res = run_role(values)
    assert res.rc != 0
    fail = role_task(res, "Fail with the container's log")
    assert fail['failed'] is True
    assert 'is not ready at http://127.0.0.1:%d/v2/health/ready' % values['triton_server_http_port'] in fail['msg']
    assert "unrecognized option '--no-such-flag=1'" in fail['msg']


def test_capped_plan_fails_unless_an_explicit_size_is_set(image, ulimits, container, tmp_path):
    name = container('capped')
    capped = {'client_regions': [{'byte_size': '1g'}], 'host_memory_bytes': '1g'}
    values = role_vars(image, ulimits, name, tmp_path, 'podman', triton_server_shm_plan=capped)
    res = run_role(values, check=True)
    assert res.rc != 0
    fail = role_task(res, 'Refuse a plan that does not fit the host')
    assert 'needs 1280 MiB of /dev/shm' in fail['msg'] and 'cap 512 MiB' in fail['msg']
    assert 'set triton_server_shm_size' in fail['msg']
    assert inspect(name) is None

    res = run_role(dict(values, triton_server_shm_size='96m'), check=True)
    assert res.rc == 0 and failed(res) == 0, res
    result = result_of(res)
    assert result['shm_size']['source'] == 'explicit'
    assert result['shm_size_bytes'] == 96 * MIB
    assert result['shm_size']['plan']['capped'] is True
    assert inspect(name) is None


@pytest.mark.parametrize('engine', ['podman', 'docker', 'dockerd'])
def test_check_mode_with_a_missing_image(engine, image, ulimits, container, tmp_path, request):
    """--check on a fresh host: reports the new container, pulls nothing, creates nothing, does not fail."""
    role_engine, docker, via = engine_setup(engine, request)
    name = container('check-' + engine, via)
    missing = 'localhost/tritonops-test/not-pulled:26.04-py3'
    values = role_vars(
        image,
        ulimits,
        name,
        tmp_path,
        role_engine,
        docker_host=docker,
        triton_server_image=missing,
        triton_server_image_pull='missing',
    )
    res = run_role(values, check=True)
    assert res.rc == 0 and failed(res) == 0, res
    result = result_of(res)
    assert result['changed'] is True
    assert result['allow_client_shm'] is True  # 26.04 from the tag
    assert '--allow-client-shm=true' in result['args']
    assert inspect(name, via) is None
    if via is not None:
        assert via.run('image', 'inspect', missing, check=False).returncode != 0
    assert _podman('image', 'exists', missing, check=False).returncode == 1
    assert not os.path.exists(values['triton_server_model_repository'])


def test_client_shm_flag_and_addresses():
    """--allow-client-shm by version (tag or triton_server_version) and explicit choice; host-network flags."""
    cases = {
        'ngc-24.10': ({'triton_server_image': 'nvcr.io/nvidia/tritonserver:24.10-py3'}, False),
        'ngc-26.03': ({'triton_server_image': 'nvcr.io/nvidia/tritonserver:26.03-py3'}, False),
        'ngc-26.04': ({'triton_server_image': 'nvcr.io/nvidia/tritonserver:26.04-py3'}, True),
        'ngc-27.01-digest': (
            {'triton_server_image': 'registry:5000/tritonserver:27.01-py3-min@sha256:' + '0' * 64},
            True,
        ),
        'server-2.51': ({'triton_server_image': 'localhost/tritonops-test/tritonserver:2.51.0-0123abcd'}, False),
        'server-2.68': ({'triton_server_image': 'localhost/x/tritonserver:2.68.0'}, True),
        'latest-unknown': ({'triton_server_image': 'nvcr.io/nvidia/tritonserver:latest'}, False),
        'untagged-registry-port': ({'triton_server_image': 'registry:5000/tritonserver'}, False),
        'latest-with-version': (
            {'triton_server_image': 'x/tritonserver:latest', 'triton_server_version': '26.05'},
            True,
        ),
        'version-wins-over-tag': (
            {'triton_server_image': 'x/tritonserver:26.04-py3', 'triton_server_version': '2.51.0'},
            False,
        ),
        'forced-true': (
            {'triton_server_image': 'x/tritonserver:24.10-py3', 'triton_server_allow_client_shm': True},
            True,
        ),
        'forced-true-string': (
            {'triton_server_image': 'x/tritonserver:24.10-py3', 'triton_server_allow_client_shm': 'true'},
            True,
        ),
        'forced-false': (
            {'triton_server_image': 'x/tritonserver:26.04-py3', 'triton_server_allow_client_shm': False},
            False,
        ),
    }
    tasks = []
    for case, (values, dummy) in cases.items():
        tasks.append(
            {
                'name': 'include ' + case,
                'ansible.builtin.include_role': {'name': ROLE, 'tasks_from': 'args'},
                'vars': values,
            }
        )
        tasks.append({'name': case, 'ansible.builtin.debug': {'var': '_triton_server_args'}})
    host = {
        'triton_server_network_mode': 'host',
        'triton_server_listen_address': '127.0.0.2',
        'triton_server_grpc_port': 0,
        'triton_server_http_port': 18000,
        'triton_server_metrics_port': 18002,
        'triton_server_load_models': ['a', 'b'],
        'triton_server_command': ['numactl', '--cpunodebind=0', 'tritonserver'],
        'triton_server_extra_args': ['--log-verbose=1'],
    }
    tasks.append(
        {
            'name': 'include host',
            'ansible.builtin.include_role': {'name': ROLE, 'tasks_from': 'args', 'public': True},
            'vars': host,
        }
    )
    tasks.append({'name': 'host', 'ansible.builtin.debug': {'var': '_triton_server_args'}})
    tasks.append(
        {'name': 'host ports', 'ansible.builtin.debug': {'var': '_triton_server_published_ports'}, 'vars': host}
    )
    play = [
        {
            'name': 'flags',
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'vars': {'ansible_python_interpreter': PYTHON},
            'tasks': tasks,
        }
    ]
    res = ansible_playbook(play)
    assert res.rc == 0, res
    for case, (dummy, expected) in cases.items():
        args = res.task(case)['_triton_server_args']
        assert ('--allow-client-shm=true' in args) is expected, (case, args)
    assert res.task('host')['_triton_server_args'] == [
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
    ]
    assert res.task('host ports')['_triton_server_published_ports'] == []


def only_collections(tmp_path, *names):
    """An ANSIBLE_COLLECTIONS_PATH with only this collection, ansible.posix (the JSON callback) and names; no sys.path scan."""
    root = tmp_path / 'collections' / 'ansible_collections'
    os.makedirs(str(root / 'tritonops'))
    os.symlink(REPO, str(root / 'tritonops' / 'shm'))
    for name in ('ansible.posix',) + names:
        namespace, collection = name.split('.')
        (root / namespace).mkdir(exist_ok=True)
        found = importlib.util.find_spec('ansible_collections.' + name)
        os.symlink(list(found.submodule_search_locations)[0], str(root / namespace / collection))
    return {'ANSIBLE_COLLECTIONS_PATH': str(tmp_path / 'collections'), 'ANSIBLE_COLLECTIONS_SCAN_SYS_PATH': 'False'}


def test_missing_engine_collection_is_explained(tmp_path):
    """Where the engine's collection is not installed, the role says how to get it."""
    env = only_collections(tmp_path)
    play = role_play({'triton_server_engine': 'podman', 'triton_server_state': 'absent'}, tasks_from='collection')
    res = ansible_playbook(play, env=env)
    assert res.rc != 0, res
    fail = role_task(res, "Fail when the engine's collection is missing")
    assert 'needs the containers.podman collection' in fail['msg']
    assert 'ansible-galaxy collection install containers.podman' in fail['msg']
    assert 'the `ansible` package from PyPI' in fail['msg']


def test_engine_collection_found_on_the_collections_path(tmp_path):
    """The check finds the engine's collection where Ansible does (ANSIBLE_COLLECTIONS_PATH), and only that one."""
    env = only_collections(tmp_path, 'containers.podman')
    res = ansible_playbook(
        role_play({'triton_server_engine': 'podman', 'triton_server_state': 'absent'}, tasks_from='collection'), env=env
    )
    assert res.rc == 0 and failed(res) == 0, res
    assert role_task(res, "Fail when the engine's collection is missing")['msg'] == 'All assertions passed'
    res = ansible_playbook(
        role_play({'triton_server_engine': 'docker', 'triton_server_state': 'absent'}, tasks_from='collection'), env=env
    )
    assert res.rc != 0, res
    assert (
        'needs the community.docker collection' in role_task(res, "Fail when the engine's collection is missing")['msg']
    )


def test_deploy_playbook_serial(image, ulimits, docker_host, container, tmp_path):
    """playbooks/deploy.yml: two hosts in two batches (one per engine), then absent for both."""
    hosts = {}
    for label, engine in (('pb-podman', 'podman'), ('pb-docker', 'docker')):
        name = container(label)
        values = role_vars(
            image, ulimits, name, tmp_path, engine, docker_host=docker_host if engine == 'docker' else None
        )
        values.update({'ansible_connection': 'local', 'ansible_python_interpreter': PYTHON})
        hosts[label] = values
    inventory = {'all': {'children': {'tritonfleet': {'hosts': hosts}}}}
    playbook = os.path.join(REPO, 'playbooks', 'deploy.yml')
    res = ansible_playbook(
        playbook, inventory=inventory, extra_vars={'target': 'tritonfleet', 'triton_deploy_serial': 1}
    )
    assert res.rc == 0, res
    for label, values in hosts.items():
        assert res.stats[label]['failures'] == 0 and res.stats[label]['changed'] >= 1, res.stats
        shown = res.task('Show what was deployed', host=label)['msg']
        assert shown == '%s: present at http://127.0.0.1:%d, /dev/shm 100m (plan)' % (
            values['triton_server_name'],
            values['triton_server_http_port'],
        )
        assert inspect(values['triton_server_name'])['HostConfig']['ShmSize'] == PLAN_BYTES
        assert ready_status('http://127.0.0.1:%d' % values['triton_server_http_port']) == 200
    res = ansible_playbook(
        playbook,
        inventory=inventory,
        extra_vars={'target': 'tritonfleet', 'triton_server_state': 'absent', 'triton_deploy_serial': '50%'},
    )
    assert res.rc == 0, res
    for label, values in hosts.items():
        assert res.stats[label]['changed'] == 1, res.stats
        assert inspect(values['triton_server_name']) is None


def test_argument_specs_match_defaults():
    """Every default is specified in meta/argument_specs.yml with the same default, and nothing else is."""
    role_dir = os.path.join(REPO, 'roles', 'triton_server')
    with open(os.path.join(role_dir, 'defaults', 'main.yml')) as f:
        defaults = yaml.safe_load(f)
    with open(os.path.join(role_dir, 'meta', 'argument_specs.yml')) as f:
        options = yaml.safe_load(f)['argument_specs']['main']['options']
    assert sorted(options) == sorted(defaults)
    for name, spec in options.items():
        assert spec.get('description'), name
        assert spec.get('type'), name
        assert spec.get('default') == defaults[name], name
        if spec['type'] == 'list':
            assert spec.get('elements'), name
    assert all(name.startswith('triton_server_') for name in defaults)
