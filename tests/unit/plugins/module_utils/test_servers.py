"""Unit tests for module_utils/run/servers.py: the host's Triton servers, on a fake proc tree.

The tree has what the listing reads: comm, cmdline, cgroup, ns/net (one inode per namespace: hard links), fd links to
sockets, the namespace's net/tcp{,6} and fib_trie, and the container's /etc/hostname. The real thing (two real
tritonservers, one in a podman container) is tests/integration/test_node_agent.py.
"""

from __future__ import annotations

import os
import time

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.run import servers
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import HttpFront, Triton

CID = 'ab6a24e700069997e526947833f0caa9f645503ff2fb102c91da07f2af90b1fb'
UID_ = '5c1e2d4a_9b7f_4e31_8a0c_1f2e3d4c5b6a'
TCP_HEAD = '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n'
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.88.0.0/16 2 0 2
        |-- 10.88.0.0
           /16 link UNICAST
        |-- 10.88.0.7
           /32 host LOCAL
  +-- 127.0.0.0/8 2 0 2
     |-- 127.0.0.1
        /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 10.88.0.7
        /32 host LOCAL
"""


def _hex4(ip, port):
    return ''.join(f'{int(b):02X}' for b in reversed(ip.split('.'))) + f':{port:04X}'


def _line(n, ip, port, state, inode, remote='0.0.0.0:0'):
    rip, rport = remote.rsplit(':', 1)
    return (
        f'   {n}: {_hex4(ip, port)} {_hex4(rip, int(rport))} {state} 00000000:00000000 00:00000000 00000000     0'
        f'        0 {inode} 1 0000000000000000 100 0 0 10 0\n'
    )


class Tree:
    def __init__(self, root):
        self.root = str(root)
        self.ns: dict[str, str] = {}

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)
        return path

    def netns(self, pid, name):
        """ns/net of pid: a hard link per namespace, so processes of one namespace stat the same inode."""
        os.makedirs(f'{self.root}/{pid}/ns', exist_ok=True)
        if name not in self.ns:
            self.ns[name] = self.write(f'ns-{name}', name)
        os.link(self.ns[name], f'{self.root}/{pid}/ns/net')

    def process(
        self, pid, comm, argv, cgroup='0::/user.slice\n', sockets=(), ns='host', tcp=(), fib=None, hostname=None
    ):
        self.write(f'{pid}/comm', comm + '\n')
        self.write(f'{pid}/cmdline', '\0'.join(argv) + '\0')
        self.write(f'{pid}/cgroup', cgroup)
        self.netns(pid, ns)
        os.makedirs(f'{self.root}/{pid}/fd', exist_ok=True)
        for fd, inode in enumerate(sockets, start=3):
            os.symlink(f'socket:[{inode}]', f'{self.root}/{pid}/fd/{fd}')
        os.symlink('/dev/null', f'{self.root}/{pid}/fd/0')
        self.write(f'{pid}/net/tcp', TCP_HEAD + ''.join(_line(i, *t) for i, t in enumerate(tcp)))
        self.write(f'{pid}/net/tcp6', TCP_HEAD)
        if fib is not None:
            self.write(f'{pid}/net/fib_trie', fib)
        if hostname is not None:
            self.write(f'{pid}/root/etc/hostname', hostname + '\n')


@pytest.fixture
def tree(tmp_path):
    t = Tree(tmp_path)
    t.process('self', 'python', ['python'], ns='host')
    return t


def test_parse_args():
    assert servers.parse_args([]) == {'http': 8000, 'grpc': 8001, 'metrics': 8002}
    assert servers.parse_args(['--http-port=9000', '--grpc-port', '9001', '--allow-metrics=false']) == {
        'http': 9000,
        'grpc': 9001,
        'metrics': None,
    }
    assert servers.parse_args(['--allow-http', 'false', '--model-repository=/m'])['http'] is None


def test_local_addresses(tmp_path):
    (tmp_path / 'fib_trie').write_text(FIB_TRIE)
    assert servers.local_addresses(str(tmp_path)) == ['10.88.0.7']
    assert servers.local_addresses(str(tmp_path / 'gone')) == []


def test_two_servers_one_on_the_host_one_in_a_pod(tree):
    host_tcp = [
        ('127.0.0.1', 18000, '0A', 501),
        ('127.0.0.1', 18001, '0A', 502),
        ('127.0.0.1', 18000, '01', 503),
        ('0.0.0.0', 22, '0A', 900),
    ]
    argv = ['/opt/tritonserver/bin/tritonserver', '--http-port=18000', '--grpc-port', '18001', '--allow-metrics=false']
    tree.process(100, 'tritonserver', argv, sockets=(501, 502, 503), tcp=host_tcp)
    tree.process(150, 'sshd', ['sshd'], sockets=(900,), tcp=host_tcp)  # listens, not Triton
    pod_tcp = [('0.0.0.0', 8000, '0A', 701), ('0.0.0.0', 8002, '0A', 702), ('0.0.0.0', 9999, '0A', 703)]
    cgroup = (
        f'0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n'
    )
    tree.process(
        200,
        'tritonserver',
        ['tritonserver', '--allow-grpc=false'],
        cgroup=cgroup,
        sockets=(701, 702),
        ns='pod',
        tcp=pod_tcp,
        fib=FIB_TRIE,
        hostname='triton-0',
    )
    # a client in the pod's network namespace listening too: its socket is not the server's
    tree.process(210, 'python', ['python', 'client.py'], cgroup=cgroup, sockets=(703,), ns='pod', tcp=pod_tcp)

    found = servers.list_servers(tree.root)
    assert [s['pid'] for s in found] == [100, 200]
    host, pod = found
    assert host['listeners'] == [
        {'address': '127.0.0.1', 'port': 18000, 'protocol': 'http'},
        {'address': '127.0.0.1', 'port': 18001, 'protocol': 'grpc'},
    ]
    assert (host['http_port'], host['grpc_port'], host['metrics_port']) == (18000, 18001, None)
    assert (host['url'], host['http_url'], host['grpc_url']) == (
        'http://127.0.0.1:18000',
        'http://127.0.0.1:18000',
        'grpc://127.0.0.1:18001',
    )
    assert host['host_network'] is True and host['container'] is None
    assert host['name'] == 'tritonserver (pid 100)' and host['shm_dir'] == f'{tree.root}/100/root/dev/shm'
    assert host['warnings'] == []

    assert pod['listeners'] == [
        {'address': '0.0.0.0', 'port': 8000, 'protocol': 'http'},
        {'address': '0.0.0.0', 'port': 8002, 'protocol': 'metrics'},
    ]
    assert pod['url'] == 'http://10.88.0.7:8000' and pod['grpc_url'] is None and pod['metrics_port'] == 8002
    assert pod['host_network'] is False
    assert pod['container']['pod_uid'] == UID_.replace('_', '-') and pod['container']['qos'] == 'burstable'
    assert pod['container']['container_id'] == CID and pod['container']['runtime'] == 'containerd'
    assert pod['name'] == 'pod triton-0'


def test_a_server_with_no_reachable_listener_says_so(tree):
    tree.process(
        300,
        'tritonserver',
        ['tritonserver', '--http-port=8000'],
        ns='other',
        tcp=[('0.0.0.0', 8000, '0A', 11)],
        sockets=(11,),
    )  # another namespace, no fib_trie readable
    (entry,) = servers.list_servers(tree.root)
    assert entry['url'] is None and entry['http_port'] == 8000
    assert any('no HTTP or gRPC listener reachable' in w for w in entry['warnings'])


def test_gone_and_other_names(tree):
    tree.process(400, 'tritonserver_x', ['x'])
    assert servers.list_servers(tree.root) == []
    assert [s['pid'] for s in servers.list_servers(tree.root, ('tritonserver_x',))] == [400]
    assert servers.server(999, tree.root) is None


def test_a_server_whose_sockets_cannot_be_read_says_why(tree, monkeypatch):
    tree.process(500, 'tritonserver', ['tritonserver'], tcp=[('0.0.0.0', 8000, '0A', 21)], sockets=(21,))
    real = os.readlink

    def readlink(path):  # as the kernel's ptrace read check answers for each fd link
        if '/500/fd/' in str(path):
            raise PermissionError(13, 'Permission denied')
        return real(path)

    monkeypatch.setattr(servers.os, 'readlink', readlink)
    (entry,) = servers.list_servers(tree.root)
    assert any('cannot be read (Permission denied)' in w and 'SYS_PTRACE' in w for w in entry['warnings'])


def test_the_probe_times_each_servers_readiness_at_once_and_bounds_it():
    """Issue 40, goal 2: answered_s for a server that answers, null for one that answers after the bound (a slow fake)
    and for one with no HTTP endpoint; all at once, so twenty slow ones cost one bound, not twenty."""
    quick = HttpFront(Triton('2.51.0'))
    slow = [HttpFront(Triton('2.51.0'), delay=3.0) for _i in range(6)]
    try:
        found = [{'http_url': quick.url}, *({'http_url': s.url} for s in slow), {'http_url': None}]
        start = time.monotonic()
        servers.probe(found, 0.5)
        took = time.monotonic() - start
        assert isinstance(found[0]['answered_s'], float) and found[0]['answered_s'] <= 0.5
        assert [f['answered_s'] for f in found[1:]] == [None] * 7
        assert took < 3.0, f'the probes ran one after the other: {took:.1f}s'
        servers.probe(found, 0)
        assert all(f['answered_s'] is None for f in found), 'no probe: no request'
    finally:
        for front in (quick, *slow):
            front.close()
