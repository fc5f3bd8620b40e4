"""The modules run INSIDE the Triton container, through the real connection plugins (issue 25, the visibility rule).

The seed's topology, on real engines:

    podman run --ipc shareable --shm-size 64m -p 127.0.0.1:P:8000 ... tritonserver          (the rig image: it has Python)
    podman run --ipc container:T --network container:T ... client   x2, one killed (its whole container: a stale region)

The playbooks run with ``ansible_connection: containers.podman.podman`` (and ``community.docker.docker`` on the harness's
private dockerd) INTO the Triton container, as an operator following "clean inside the container" would. From there
/proc shows tritonserver but not the clients, which live in their own containers' PID namespaces. Before the visibility
rule, the live client's region was called stale and removed. Now the scan is incomplete: every region and file is kept,
the reason is in the results, and the report's row is ``incomplete``, not ``ok``.

With ``clients_share_pid_namespace: true`` and every client inside that same container (``podman exec``), the scan is
complete there: the killed client's region is reclaimed and the live one kept.

The rig image carries ``requests`` (the modules' HTTP library) for this: tritonclient[http] does not bring it
(tests/integration/containers/build_image.py). The pod scenarios (a sidecar with and without the pod's PID namespace)
are in test_pod_sidecar.py.
"""

from __future__ import annotations

import os
import signal
import time

import engines
import pytest
from ansible_helpers import ansible_playbook

MIB = 1 << 20
PODMAN = pytest.mark.parametrize('container_engine', ['podman'], indirect=True)
DOCKER = pytest.mark.parametrize('container_engine', ['docker'], indirect=True)
INSIDE_URL = f'http://127.0.0.1:{engines.TRITON_HTTP_PORT}'


def _connection_vars(engine, triton, tmp_path) -> tuple[dict, dict]:
    """(host variables that reach INTO triton's container through the engine's connection plugin, extra env)."""
    python = engine.image('rig').python
    if engine.name == 'podman':
        # the harness runs podman in a private mount namespace: the plugin's podman must too (and copy with
        # `podman cp`: a `podman mount` point would be in that namespace, not this one)
        wrapper = tmp_path / 'podman'
        wrapper.write_text('#!/bin/sh\nexec ' + ' '.join(engine.cli) + ' "$@"\n')
        wrapper.chmod(0o755)
        return dict(
            ansible_connection='containers.podman.podman',
            ansible_host=triton.id,
            ansible_podman_executable=str(wrapper),
            ansible_podman_mount_detection=False,
            ansible_python_interpreter=python,
        ), {}
    # community.docker.docker runs the first `docker` on PATH: the harness's Debian CLI, against the private daemon
    bindir = tmp_path / 'bin'
    if not bindir.exists():
        bindir.mkdir()
        os.symlink(engine.cli[0], bindir / 'docker')
    return (
        dict(
            ansible_connection='community.docker.docker',
            ansible_host=triton.id,
            ansible_docker_extra_args=' '.join(engine.cli[1:]),
            ansible_python_interpreter=python,
        ),
        {'PATH': f'{bindir}{os.pathsep}{os.environ.get("PATH", "")}'},
    )


def _playbook(name, engine, triton, tmp_path, check=False, textfile_dir='', **host_vars):
    conn, env = _connection_vars(engine, triton, tmp_path)
    # the connection plugin enters the container as root, which has no sudo: no become (the playbooks' default)
    host = dict(conn, triton_url=INSIDE_URL, triton_become=False, **host_vars)
    inv = {'all': {'children': {'triton': {'hosts': {'t1': host}}}}}
    # the rig image has /bin/sh and Python but no coreutils (no mkdir for Ansible's remote temp directory):
    # pipelining sends each module on stdin instead (a Triton image from NGC has both)
    env.update(ANSIBLE_SHOW_CUSTOM_STATS='1', ANSIBLE_PIPELINING='1')
    return ansible_playbook(
        f'tritonops.shm.{name}',
        inventory=inv,
        env=env,
        check=check,
        extra_vars={'prometheus_textfile_dir': textfile_dir, 'report_dir': str(tmp_path / 'report')},
    )


def _state(triton):
    return set(triton.system_regions()), set(triton.shm_files())


def _cleanup_record(res):
    return res.data['global_custom_stats']['tritonops_shm_cleanup']['t1']


def kept_inside_with_the_reason(engine, tmp_path):
    """Two sibling client containers, one killed; every module run inside the Triton container keeps everything."""
    triton = engines.run_triton(engine, shm_size='64m')
    live = engines.run_client(triton, 'live_client', 8 * MIB)
    dead = engines.run_client(triton, 'dead_client', 8 * MIB)
    dead.kill()
    before = _state(triton)
    assert {'live_client', 'dead_client'} <= before[0] and {'live_client', 'dead_client'} <= before[1], before

    # the cleanup: nothing unregistered, nothing removed, the reason in the record and the warnings
    # (before the visibility rule, this run unregistered both regions and unlinked both files, the live one's too)
    res = _playbook('cleanup', engine, triton, tmp_path)
    assert _state(triton) == before, (res, _state(triton))
    assert live.alive
    record = _cleanup_record(res)
    assert record['status'] == 'incomplete', record
    assert record['done']['unregistered'] == [] and record['done']['removed_files'] == [], record
    assert record['server']['holders_complete'] is False and record['server']['pid_namespace'] == 'other', record
    assert "outside the host's initial PID namespace" in record['server']['holders_incomplete_reason']
    # the module's own warning says what to do (its text, not the record's reason)
    warnings = [w for _name, r in res.tasks('t1') for w in r.get('warnings', [])]
    assert any('clients_share_pid_namespace' in w and 'PID namespace' in w for w in warnings), warnings

    # the report: the row is incomplete, with the reason, never ok: in JSON, Markdown, HTML and the metrics
    textfiles = '/tmp/textfiles'  # inside Triton's container, where the modules run and write the textfile
    engine.run('exec', triton.id, engine.image('rig').python, '-c', f'import os; os.makedirs({textfiles!r})')
    res = _playbook('report', engine, triton, tmp_path, textfile_dir=textfiles)
    assert res.rc == 0, (res, res.stdout[-4000:])  # reported as incomplete, with the reason: not a failure
    report = (tmp_path / 'report' / 'report.json').read_text()
    assert '"status": "incomplete"' in report, report[:3000]
    assert "outside the host's initial PID namespace" in report
    assert '"pid_namespace": "other"' in report
    markdown = (tmp_path / 'report' / 'report.md').read_text()
    assert '| t1 | **incomplete** |' in markdown and "outside the host's initial PID namespace" in markdown, markdown
    page = (tmp_path / 'report' / 'report.html').read_text()
    assert 'data-status="incomplete"' in page and 'data-fleet="incomplete"' in page, page[:3000]
    assert '<b>0</b> ok' in page and 'outside the host&#x27;s initial PID namespace' in page.replace("'", '&#x27;')
    metrics = engine.run(
        'exec',
        triton.id,
        engine.image('rig').python,
        '-c',
        f'import glob; print("".join(open(p).read() for p in glob.glob({textfiles!r} + "/*.prom")))',
    ).stdout
    assert 'tritonops_shm_holders_complete{' in metrics, metrics[:3000]
    (line,) = [x for x in metrics.splitlines() if x.startswith('tritonops_shm_holders_complete{')]
    assert 'pid_namespace="other"' in line and 'reason="pid_namespace"' in line and line.endswith(' 0'), line
    assert _state(triton) == before
    return triton, live


@PODMAN
def test_inside_the_triton_container_through_podman_nothing_is_removed(container_engine, tmp_path):
    """containers.podman.podman into Triton's container: the live sibling's region and file are kept (and the killed
    one's: nothing can tell them apart from there), the reason is shown, and the row is incomplete."""
    kept_inside_with_the_reason(container_engine, tmp_path)


@DOCKER
def test_inside_the_triton_container_through_docker_nothing_is_removed(container_engine, tmp_path):
    """The same through community.docker.docker on the private dockerd."""
    kept_inside_with_the_reason(container_engine, tmp_path)


# -- every client inside the one container: clients_share_pid_namespace --------------------------------------------


def _exec_client(engine, triton, name):
    """The rig's client started inside triton's own container (`ENGINE exec`): the same PID namespace as the modules."""
    image = engine.image('rig')
    engine.run(
        'exec',
        '-d',
        triton.id,
        image.python,
        engines.build_image.CLIENT_PATH,
        '--url',
        INSIDE_URL,
        '--name',
        name,
        '--key',
        '/' + name,
        '--byte-size',
        str(8 * MIB),
        '--mode',
        'hold',
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if name in triton.system_regions() and name in triton.shm_files():
            return _host_pid(triton, name)
        time.sleep(0.3)
    raise AssertionError(f'client {name} did not register inside {triton.name}: {triton.log_tail(20)}')


def _host_pid(triton, name):
    """The host pid of the rig client (an interpreter running client.py) registering region name in triton's container
    (its PID namespace: other tests on the machine run clients of the same name)."""
    namespace = os.stat(f'/proc/{triton.pid}/ns/pid').st_ino
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                args = f.read().split(b'\0')
            same = os.stat(f'/proc/{entry}/ns/pid').st_ino == namespace
        except OSError:
            continue
        if (
            same
            and os.path.basename(args[0]).startswith(b'python')
            and len(args) > 1
            and args[1].endswith(b'client.py')
            and b'--name' in args
            and args[args.index(b'--name') + 1 :][:1] == [name.encode()]
        ):
            return int(entry)
    raise AssertionError(f'no process of client {name}')


def _kill_with_children(pid):
    """SIGKILL the client's children (its resource tracker) first, then the client, as the OOM killer or a container
    runtime takes a whole process tree: nobody unlinks the file, the region stays registered (a stale region)."""
    with open(f'/proc/{pid}/task/{pid}/children') as f:
        children = [int(c) for c in f.read().split()]
    for child in children:
        os.kill(child, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f'/proc/{pid}') and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize('container_engine', ['podman', 'docker'], indirect=True)
def test_all_in_one_container_with_the_option_the_dead_client_is_reclaimed(container_engine, tmp_path):
    """Clients inside Triton's container (`podman exec`, `docker exec`), clients_share_pid_namespace: true, through
    the engine's connection plugin: the killed client's region and file go, the live one's stay."""
    triton = engines.run_triton(container_engine, shm_size='64m')
    live = _exec_client(container_engine, triton, 'live_client')
    dead = _exec_client(container_engine, triton, 'dead_client')
    _kill_with_children(dead)
    regions, files = _state(triton)
    assert {'live_client', 'dead_client'} <= regions and {'live_client', 'dead_client'} <= files

    res = _playbook('report', container_engine, triton, tmp_path, triton_clients_share_pid_namespace=True)
    report = (tmp_path / 'report' / 'report.json').read_text()
    assert '"status": "ok"' in report and '"pid_namespace": "other"' in report, report[:3000]

    res = _playbook('cleanup', container_engine, triton, tmp_path, triton_clients_share_pid_namespace=True)
    assert res.rc == 0, res
    after_regions, after_files = _state(triton)
    assert 'dead_client' not in after_regions and 'dead_client' not in after_files
    assert 'live_client' in after_regions and 'live_client' in after_files
    assert os.path.exists(f'/proc/{live}')
    record = _cleanup_record(res)
    assert record['status'] == 'ok' and record['done']['unregistered'] == ['dead_client'], record
    assert record['server']['holders_complete'] is True and record['server']['pid_namespace'] == 'other', record
