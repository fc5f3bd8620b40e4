"""The container harness itself (tests/integration/containers/engines.py), on real Docker and podman.

What the topology tests rely on: a Triton container answers at its published
URL and at its container IP; its /dev/shm is a tmpfs of --shm-size, reached
from the host at /proc/PID/root/dev/shm and mounted outside PID 1's mount
namespace; client containers share its IPC and network namespaces, and one
killed with `docker kill` / `podman kill` leaves its region registered and its
file in place; Docker runs with and without its userland proxy; socat forwards.
"""

from __future__ import annotations

import os
import socket
import time

import engines
import pytest

MIB = 1 << 20


def _device(path):
    st = os.stat(path)
    return '%d:%d' % (os.major(st.st_dev), os.minor(st.st_dev))


def _mounted_devices(pid):
    with open('/proc/%s/mountinfo' % pid) as f:
        return {line.split()[2] for line in f}


def _comm(pid):
    with open('/proc/%d/comm' % pid) as f:
        return f.read().strip()


def _docker_proxies(port):
    """pids of docker-proxy processes holding host port `port`."""
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open('/proc/%s/cmdline' % entry, 'rb') as f:
                    args = f.read().decode(errors='replace').split('\0')
            except OSError:
                continue
            if (
                os.path.basename(args[0]) == 'docker-proxy'
                and '-host-port' in args
                and args[args.index('-host-port') + 1] == str(port)
            ):
                found.append(int(entry))
    return found


def test_triton_answers_at_both_urls_with_its_own_shm(container_engine):
    triton = engines.run_triton(container_engine, shm_size='48m')
    assert triton.published_url == 'http://127.0.0.1:%d' % triton.host_port
    assert triton.url == triton.published_url
    assert engines.http_status(triton.published_url) == 200
    assert triton.container_url == 'http://%s:8000' % triton.ip
    assert engines.http_status(triton.container_url) == 200
    assert _comm(triton.pid) == 'tritonserver'
    assert triton.inspect()['HostConfig']['ShmSize'] == 48 * MIB
    fs = os.statvfs(triton.shm_dir)
    assert fs.f_blocks * fs.f_frsize == 48 * MIB
    # the engine mounted it in its own mount namespace: not where PID 1 (unreadable here) would show it
    assert _device(triton.shm_dir) != _device('/dev/shm')
    assert _device(triton.shm_dir) not in _mounted_devices(1)
    assert _device(triton.shm_dir) not in _mounted_devices('self')


def test_killed_client_container_leaves_its_region_and_file(container_engine):
    triton = engines.run_triton(container_engine, publish=False)
    assert triton.published_url is None and triton.url == triton.container_url
    live = engines.run_client(triton, 'live', 2 * MIB)
    leak = engines.run_client(triton, 'leak', 3 * MIB)
    assert set(triton.system_regions()) == {'live', 'leak'}
    leak.kill()
    assert not leak.alive and live.alive
    regions = triton.system_regions()
    assert regions['leak']['key'] == '/leak' and regions['leak']['byte_size'] == 3 * MIB
    assert set(regions) == {'live', 'leak'}
    # the file stays (the whole container died at once, its resource tracker too), written and full size
    st = os.stat(triton.shm_path('/leak'))
    assert st.st_size == 3 * MIB and st.st_blocks * 512 >= 3 * MIB
    assert sorted(triton.shm_files()) == ['leak', 'live']
    # the client joined the server's IPC namespace: one /dev/shm
    with open('/proc/%d/root/dev/shm/live' % triton.pid, 'rb') as f:
        assert f.read(4) == b'\1\1\1\1'


def test_infer_client_container_runs_inferences_through_its_regions(container_engine):
    triton = engines.run_triton(container_engine, models=('echo',))
    client = engines.run_client(triton, 'busy', MIB, mode='infer')
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        line.startswith('STATS ok=') and not line.startswith('STATS ok=0 ') for line in client.lines
    ):
        time.sleep(0.5)
    stats = [line for line in client.lines if line.startswith('STATS')]
    assert stats and ' failed=0' in stats[-1] and not stats[-1].startswith('STATS ok=0 '), client.lines[-5:]
    assert {'busy', 'busy_out'} <= set(triton.system_regions())
    assert any(name.startswith('triton_python_backend_shm_region_') for name in triton.shm_files())


@pytest.mark.parametrize('container_engine', ['docker', 'docker-noproxy'], indirect=True)
def test_docker_userland_proxy_holds_the_published_port_or_not(container_engine, request):
    proxy = request.node.callspec.params['container_engine'] == 'docker'
    assert container_engine.userland_proxy is proxy
    triton = engines.run_triton(container_engine)
    assert engines.http_status(triton.published_url) == 200
    proxies = _docker_proxies(triton.host_port)
    if proxy:
        assert len(proxies) == 1
        assert os.readlink('/proc/%d/exe' % proxies[0]).endswith('docker-proxy')
    else:
        # iptables DNAT only: 127.0.0.1 still reaches the container, and no docker-proxy holds the port
        assert proxies == []


@pytest.mark.parametrize('container_engine', ['podman'], indirect=True)
def test_host_network_triton(container_engine):
    triton = engines.run_triton(container_engine, network='host')
    assert triton.ip is None and triton.published_url is None
    assert triton.url == 'http://127.0.0.1:%d' % triton.http_port
    assert engines.http_status(triton.url) == 200
    client = engines.run_client(triton, 'hostnet', MIB)
    client.kill()
    assert 'hostnet' in triton.system_regions()
    assert os.path.exists(triton.shm_path('/hostnet'))


@pytest.mark.parametrize('container_engine', ['docker'], indirect=True)
def test_socat_forwarder_reaches_triton(container_engine, forwarder):
    triton = engines.run_triton(container_engine, publish=False)
    fwd = forwarder(triton.container_url)
    assert fwd.url.startswith('http://127.0.0.1:')
    assert engines.http_status(fwd.url) == 200
    # one forked child per connection
    with socket.create_connection(('127.0.0.1', fwd.port), timeout=5):
        children = []
        deadline = time.monotonic() + 10
        while not children and time.monotonic() < deadline:
            with open('/proc/%d/task/%d/children' % (fwd.pid, fwd.pid)) as f:
                children = f.read().split()
            time.sleep(0.05)
        assert children
    fwd.stop()
    with socket.socket() as sock:
        sock.settimeout(2)
        assert sock.connect_ex(('127.0.0.1', fwd.port)) != 0


@pytest.mark.parametrize('container_engine', ['docker', 'podman'], indirect=True)
def test_a_triton_that_exits_fails_with_its_log_and_is_removed(container_engine):
    before = list(container_engine.created)
    with pytest.raises(engines.EngineError) as err:
        engines.run_triton(container_engine, args=['--no-such-flag=1'], ready_timeout=60)
    assert 'is not ready at http://127.0.0.1:' in str(err.value)
    assert "unrecognized option '--no-such-flag=1'" in str(err.value)
    assert container_engine.created == before
    assert container_engine.run('ps', '-aq', '--filter', 'label=' + engines.LABEL).stdout.split() == [
        cid[:12] for cid in before
    ]
