"""Finding the Triton server from the URL alone, on real Docker and podman (issue: published ports).

Each topology runs a real tritonserver container and asks tritonops.shm.triton_shm_info for
it with nothing but the URL a user would give, then checks what a user checks: the pid is
that container's tritonserver, the shm filesystem is that container's --shm-size, and
located_by names the way (docker-proxy, NAT, the container's own namespace, socat, the
listening socket). The end-to-end case is the seed deployment itself:

    docker run --shm-size=64m -p 127.0.0.1:P:8000 ... tritonserver
    docker run --ipc container:triton --network container:triton ... client   (one killed, one live)

cleaned by the cleanup playbook given only http://127.0.0.1:P.
"""

from __future__ import annotations

import json
import os

import engines
import pytest
from ansible_helpers import PYTHON, ansible_playbook, run_module

MIB = 1 << 20
INFO = 'tritonops.shm.triton_shm_info'
DOCKER = pytest.mark.parametrize('container_engine', ['docker'], indirect=True)
PODMAN = pytest.mark.parametrize('container_engine', ['podman'], indirect=True)


def located(url, triton, shm_size):
    """triton_shm_info from the URL alone: the right server, its own /dev/shm; returns located_by."""
    info = run_module(INFO, {'url': url})
    assert not info.get('failed'), info
    server = info['server']
    assert server['pid'] == triton.pid, (server, info.get('warnings'))
    assert server['not_found_reason'] is None
    assert server['shm_dir'] == '/proc/%d/root/dev/shm' % triton.pid
    assert info['shm_fs']['total_bytes'] == shm_size
    assert info['holders_complete'] is True, info.get('warnings')
    return server['located_by']


# -- topologies 3, 4, 6: published ports and container IPs --------------------------------------


@DOCKER
def test_docker_published_port_through_docker_proxy_and_the_container_ip(container_engine):
    triton = engines.run_triton(container_engine, shm_size='48m')
    how = located(triton.published_url, triton, 48 * MIB)
    assert how.startswith('connection via docker-proxy (pid '), how
    assert how.endswith(
        ') to tritonserver (pid %d) at %s:8000 in another network namespace; shm_dir from /proc/%d/root'
        % (triton.pid, triton.ip, triton.pid)
    ), how
    how = located(triton.container_url, triton, 48 * MIB)
    assert how == (
        'connection to tritonserver (pid %d) at %s:8000 in another network namespace; shm_dir from /proc/%d/root'
        % (triton.pid, triton.ip, triton.pid)
    )


@PODMAN
def test_podman_published_port_through_nat_and_the_container_ip(container_engine):
    triton = engines.run_triton(container_engine, shm_size='40m')
    how = located(triton.published_url, triton, 40 * MIB)
    assert how.startswith(
        'connection via NAT 127.0.0.1:%d -> %s:8000 to tritonserver (pid %d)'
        % (triton.host_port, triton.ip, triton.pid)
    ), how
    how = located(triton.container_url, triton, 40 * MIB)
    assert how.startswith('connection to tritonserver (pid %d) at %s:8000' % (triton.pid, triton.ip)), how


# -- topology 5: Docker without its userland proxy (iptables DNAT only) ------------------------------


@DOCKER
def test_docker_without_userland_proxy_through_nat(container_engine):
    try:
        container_engine.set_userland_proxy(False)
        triton = engines.run_triton(container_engine, shm_size='40m')
        how = located(triton.published_url, triton, 40 * MIB)
        assert how.startswith(
            'connection via NAT 127.0.0.1:%d -> %s:8000 to tritonserver (pid %d)'
            % (triton.host_port, triton.ip, triton.pid)
        ), how
    finally:
        container_engine.set_userland_proxy(True)


# -- topology 2: host networking ------------------------------------------------------------------


@PODMAN
def test_host_network_container_by_its_listening_socket(container_engine):
    triton = engines.run_triton(container_engine, network='host', shm_size='32m')
    how = located(triton.url, triton, 32 * MIB)
    assert how.startswith('listener: tritonserver (pid %d) owns the listening socket' % triton.pid), how


# -- topology 7: several servers on one host -------------------------------------------------------


@pytest.mark.parametrize('container_engine', ['docker', 'podman'], indirect=True)
def test_several_containers_each_url_finds_its_own_server(container_engine):
    a = engines.run_triton(container_engine, shm_size='24m')
    b = engines.run_triton(container_engine, shm_size='40m')
    assert a.pid != b.pid
    for triton, size in ((a, 24 * MIB), (b, 40 * MIB), (a, 24 * MIB)):
        located(triton.published_url, triton, size)
        located(triton.container_url, triton, size)


# -- topology 8: a TCP forwarder in front --------------------------------------------------------------


@DOCKER
def test_socat_in_front_of_a_published_port(container_engine, forwarder):
    """Two hops: socat's child, then docker-proxy, then the container."""
    triton = engines.run_triton(container_engine, shm_size='24m')
    fwd = forwarder(triton.published_url)
    how = located(fwd.url, triton, 24 * MIB)
    assert how.startswith('connection via socat (pid '), how
    assert ', docker-proxy (pid ' in how and 'to tritonserver (pid %d)' % triton.pid in how, how


# -- the seed deployment, end to end, with only the URL -------------------------------------------------


def _used(triton):
    fs = os.statvfs(triton.shm_dir)
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def _cleanup(url, host='t1', **kwargs):
    host_vars = dict(ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=url)
    inv = {'all': {'children': {'triton': {'hosts': {host: host_vars}}}}}
    return ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inv,
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
        extra_vars={'prometheus_textfile_dir': ''},
        **kwargs,
    )


def clean_a_killed_client_given_only_the_url(triton, url, live_clients, host='t1'):
    """The killed client 'dead_client' (8 MiB) is cleaned by the cleanup playbook given only url; the live clients'
    regions and files and the python backend's files are kept; check mode changes nothing; a rerun is changed=0.

    Shared with test_kubernetes_pod.py (a pod's sidecars, the pod's IP).
    """
    regions, files = triton.system_regions(), triton.shm_files()
    assert {'dead_client'} | {c.region for c in live_clients} <= set(regions)
    assert {'live_client', 'dead_client'} <= set(files)
    backend = sorted(f for f in files if f.startswith('triton_python_backend_shm_region_'))
    assert backend, files
    used_before = _used(triton)

    # check mode first: says what it would do, changes nothing
    res = _cleanup(url, check=True, host=host)
    assert res.rc == 0, res
    assert (set(triton.system_regions()), set(triton.shm_files())) == (set(regions), set(files))
    would = res.data['global_custom_stats']['tritonops_shm_cleanup'][host]
    assert would['check_mode'] is True and would['done']['unregistered'] == ['dead_client'], would

    res = _cleanup(url, host=host)
    assert res.rc == 0, res
    after_regions, after_files = triton.system_regions(), triton.shm_files()
    # the killed client container's region and file are gone
    assert 'dead_client' not in after_regions and 'dead_client' not in after_files
    # the live clients' regions and files, and the python backend's files, are kept
    assert {c.region for c in live_clients} <= set(after_regions)
    assert 'live_client' in after_files and set(backend) <= set(after_files)
    assert all(c.alive for c in live_clients)
    result = res.data['global_custom_stats']['tritonops_shm_cleanup'][host]
    assert result['status'] == 'ok' and result['changed'] is True
    assert result['done']['unregistered'] == ['dead_client']
    assert [path.rsplit('/', 1)[1] for path in result['done']['removed_files']] == ['dead_client']
    assert result['done']['freed_bytes'] >= 8 * MIB
    assert result['server']['pid'] == triton.pid
    assert _used(triton) <= used_before - 8 * MIB

    # a second run has nothing to do
    res = _cleanup(url, host=host)
    assert res.rc == 0 and res.stats[host]['changed'] == 0, res
    assert json.dumps(sorted(triton.system_regions())) == json.dumps(sorted(after_regions))


@pytest.mark.parametrize('container_engine', ['docker', 'podman'], indirect=True)
def test_cleanup_playbook_cleans_a_killed_client_container_given_only_the_url(container_engine):
    triton = engines.run_triton(container_engine, shm_size='64m', models=('echo',))
    live = engines.run_client(triton, 'live_client', 8 * MIB)
    busy = engines.run_client(triton, 'busy_client', MIB, mode='infer')
    dead = engines.run_client(triton, 'dead_client', 8 * MIB)
    dead.kill()
    clean_a_killed_client_given_only_the_url(triton, triton.published_url, [live, busy])
