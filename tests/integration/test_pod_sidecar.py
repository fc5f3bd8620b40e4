"""A sidecar of a Triton pod running the modules (issue 25, goal 2, the pod scenarios), on real podman pods.

    podman pod create --share ipc,net        a Kubernetes pod (no shareProcessNamespace): each container has its own PIDs
    podman pod create --share pid,ipc,net    a pod with shareProcessNamespace: true

In the pod: Triton, two sidecar clients (one killed with its container: a stale region), and a sidecar running the
collection's modules over http://127.0.0.1:8000 (the pod's network) on the pod's /dev/shm (its IPC namespace). The
sidecar is the host's own files (``podman run --pod P --rootfs /:O``: the venv and this collection's build, through a
read-only overlay) with podman's default capabilities, as a sidecar container image with the collection would run.

Without a shared PID namespace the sidecar sees neither the server nor the clients. Before the visibility rule, given
the pod's /dev/shm (shm_dir, what a sidecar user writes) it called the live client's region stale and removed it; now
the scan is incomplete, nothing is removed, and the results say why. With ``--share pid,ipc,net`` and
``clients_share_pid_namespace: true`` it cleans the dead client's region and keeps the live one.
"""

from __future__ import annotations

import os

import engines
import pytest
import yaml
from test_node_agent import _agent_cmd, parse

PODMAN = pytest.mark.parametrize('container_engine', ['podman'], indirect=True)
MIB = 1 << 20
URL = f'http://127.0.0.1:{engines.TRITON_HTTP_PORT}'
REASON = "outside the host's initial PID namespace"


def _pod_with_a_leak(engine, share):
    pod = engines.create_pod(engine, shm_size='64m', share=share)
    triton = engines.run_triton(engine, pod=pod)
    init = 'pid' not in share.split(',')  # in a shared PID namespace the pod's infra is PID 1 (no --init)
    live = engines.run_client(triton, 'live_client', 4 * MIB, init=init)
    dead = engines.run_client(triton, 'dead_client', 4 * MIB, init=init)
    dead_pids = [int(p) for p in engine.run('top', dead.id, '-eo', 'hpid', check=False).stdout.split() if p.isdigit()]
    dead.kill()
    for pid in dead_pids:  # the whole container died, also in a shared PID namespace
        assert not os.path.exists(f'/proc/{pid}'), pid
    assert {'live_client', 'dead_client'} <= set(triton.system_regions())
    # without an init the client's resource tracker may unlink the file first (engines.run_client): stale or dangling
    assert 'live_client' in triton.shm_files() and (not init or 'dead_client' in triton.shm_files())
    return pod, triton, live


def _sidecar(engine, pod, tmp_path, **module_args):
    """The modules in a sidecar of pod: triton_shm_info, then triton_shm_region state=absent stale=true."""
    args = dict({'url': URL}, **module_args)
    play = [
        {
            'name': 'sidecar',
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'tasks': [
                {'name': 'info', 'tritonops.shm.triton_shm_info': args, 'register': 'info', 'ignore_errors': True},
                {
                    'name': 'clean',
                    'tritonops.shm.triton_shm_region': dict(args, state='absent', stale=True),
                    'ignore_errors': True,
                },
            ],
        }
    ]
    path = tmp_path / f'sidecar-{len(list(tmp_path.iterdir()))}.yml'
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    proc = _agent_cmd(engine, ['-i', 'localhost,', str(path)], pid_host=False, pod=pod, caps='default', name='sidecar')
    data, text = parse(proc)
    assert data is not None, text[-4000:]
    tasks = {t['task']['name']: t['hosts']['localhost'] for t in data['plays'][0]['tasks']}
    return tasks['info'], tasks['clean'], text


def _kept(triton):
    return {'live_client', 'dead_client'} <= set(triton.system_regions()) and 'live_client' in triton.shm_files()


@PODMAN
def test_a_sidecar_without_the_pods_pids_removes_nothing_and_says_why(container_engine, tmp_path):
    pod, triton, live = _pod_with_a_leak(container_engine, 'ipc,net')
    try:
        # given the pod's /dev/shm: the server and every client are invisible from here
        info, clean, text = _sidecar(container_engine, pod, tmp_path, shm_dir='/dev/shm')
        assert _kept(triton) and 'dead_client' in triton.shm_files() and live.alive, text[-4000:]
        assert not any(r['state'] == 'stale' for r in info.get('system_regions', [])), info
        assert info.get('holders_complete') is False and REASON in info['holders_incomplete_reason'], info
        # the cleanup fails (it cannot act) and says why; it changed nothing
        assert clean.get('failed') is True and REASON in clean['msg'], clean
        assert not clean.get('changed'), clean
        # found by its URL alone: the server cannot be seen at all; it fails with the reason, nothing is removed either
        info, clean, text = _sidecar(container_engine, pod, tmp_path)
        assert _kept(triton) and live.alive, text[-4000:]
        assert clean.get('failed') is True and REASON in clean['msg'] and not clean.get('changed'), clean
        assert info.get('holders_complete') is False and REASON in info['holders_incomplete_reason'], info
    finally:
        pod.remove()


@PODMAN
def test_a_sidecar_sharing_the_pods_pids_cleans_with_the_option(container_engine, tmp_path):
    pod, triton, live = _pod_with_a_leak(container_engine, 'pid,ipc,net')
    try:
        assert pod.shared == ['ipc', 'net', 'pid'], pod
        # without the option the scan is still incomplete (the sidecar cannot know the pod shares its PIDs)
        info, clean, text = _sidecar(container_engine, pod, tmp_path)
        assert _kept(triton), text[-4000:]
        assert info.get('holders_complete') is False and REASON in info['holders_incomplete_reason'], info
        # with it: the server is found by its URL in the pod's namespaces, the dead client's region is reclaimed
        info, clean, text = _sidecar(container_engine, pod, tmp_path, clients_share_pid_namespace=True)
        assert info['holders_complete'] is True, info
        states = {r['name']: r['state'] for r in info['system_regions']}
        assert states['dead_client'] in ('stale', 'dangling') and states['live_client'] == 'healthy', states
        # the live client is named by its container in the pod (its cgroup, read through the pod's shared PIDs)
        (holder,) = next(r for r in info['system_regions'] if r['name'] == 'live_client')['holders']
        assert holder['container']['podman_pod'] == pod.id and holder['container']['container_id'] == live.id, holder
        assert clean.get('changed') is True and clean['unregistered'] == ['dead_client'], clean
        regions, files = set(triton.system_regions()), set(triton.shm_files())
        assert 'dead_client' not in regions and 'dead_client' not in files
        assert 'live_client' in regions and 'live_client' in files and live.alive
        # a second run has nothing to do
        info, clean, text = _sidecar(container_engine, pod, tmp_path, clients_share_pid_namespace=True)
        assert clean.get('changed') is False, clean
    finally:
        pod.remove()
