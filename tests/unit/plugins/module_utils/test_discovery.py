"""Unit tests for module_utils/host/discovery.py: from a URL's host and port to the tritonserver process.

Everything is real: listening and accepting processes (named by prctl, as tritonserver is),
network namespaces joined by veth pairs, socat and a one-process forwarder (as docker-proxy
is), iptables DNAT with its conntrack entries. Only the parsers also get small tables.
The namespaces, links and rules are the tests' own, made on addresses of this machine only,
and removed afterwards; every process is stopped by pid.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.host import discovery, procfs

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason='network namespaces, veth and iptables need root')

# serve: listen and accept, keep connections.  forward: the same, and for every accepted
# connection open one to each backend (one process, as docker-proxy).  pool: connect to
# every backend first and keep those connections (a load balancer's upstream pool).
# listen: listen only, never accept.
PEER = textwrap.dedent("""
    import ctypes, socket, sys, time
    mode, comm, addr = sys.argv[1], sys.argv[2], sys.argv[3]
    backends = [b.rsplit(':', 1) for b in sys.argv[4:]]
    ctypes.CDLL(None).prctl(15, comm.encode(), 0, 0, 0)
    host, port = addr.rsplit(':', 1)
    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(16)
    keep = []
    if mode == 'pool':
        keep.extend(socket.create_connection((h, int(p)), timeout=5) for h, p in backends)
    print(f'READY {s.getsockname()[1]}', flush=True)
    if mode == 'listen':
        time.sleep(600)
    while True:
        c, _ = s.accept()
        keep.append(c)
        for h, p in (backends if mode == 'forward' else ()):
            keep.append(socket.create_connection((h, int(p)), timeout=5))
""")


def free_port(host='127.0.0.1'):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run(*argv):
    subprocess.run(list(argv), check=True, capture_output=True)


class Host:
    """Processes, network namespaces and NAT rules made by one test; all undone by teardown()."""

    def __init__(self):
        self.procs = []
        self.namespaces = []
        self.rules = []
        self.tag = uuid.uuid4().hex[:6]

    def start(self, argv, netns=None):
        prefix = ['ip', 'netns', 'exec', netns] if netns else []
        proc = subprocess.Popen(prefix + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def peer(self, mode, comm, addr, backends=(), netns=None):
        """A PEER process; returns (proc, port)."""
        proc = self.start([sys.executable, '-c', PEER, mode, comm, addr] + list(backends), netns)
        line = proc.stdout.readline()
        if not line.startswith('READY'):
            proc.kill()
            raise RuntimeError(f'peer did not start: {line} {proc.stderr.read()}')
        return proc, int(line.split()[1])

    def socat(self, listen_port, target):
        proc = self.start(['socat', f'TCP-LISTEN:{listen_port},bind=127.0.0.1,fork,reuseaddr', f'TCP:{target}'])
        for _attempt in range(100):
            if any(p == listen_port for _ip, p, _i in discovery.listening_sockets('/proc/self/net', ('tcp',))):
                return proc
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f'socat did not listen: {proc.stderr.read()}')

    def netns(self, index):
        """A network namespace joined to this one by a veth pair: (name, host-side address, namespace address)."""
        name = f'tops-{self.tag}-{index}'
        host_if, ns_if = f'th{self.tag}{index}', f'tn{self.tag}{index}'
        # a subnet of this run's own (from its tag): two suites at once (worktrees) never route to each other's peers
        subnet = f'10.{200 + int(self.tag, 16) % 50}.{(int(self.tag, 16) >> 8) % 200 + index}'
        host_ip, ns_ip = f'{subnet}.1', f'{subnet}.2'
        _run('ip', 'netns', 'add', name)
        self.namespaces.append((name, host_if))
        _run('ip', 'link', 'add', host_if, 'type', 'veth', 'peer', 'name', ns_if)
        _run('ip', 'link', 'set', ns_if, 'netns', name)
        _run('ip', 'addr', 'add', host_ip + '/24', 'dev', host_if)
        _run('ip', 'link', 'set', host_if, 'up')
        _run('ip', 'netns', 'exec', name, 'ip', 'addr', 'add', ns_ip + '/24', 'dev', ns_if)
        _run('ip', 'netns', 'exec', name, 'ip', 'link', 'set', ns_if, 'up')
        _run('ip', 'netns', 'exec', name, 'ip', 'link', 'set', 'lo', 'up')
        return name, host_ip, ns_ip

    def dnat(self, address, port, target):
        rule = [
            'OUTPUT',
            '-p',
            'tcp',
            '-d',
            address,
            '--dport',
            str(port),
            '-j',
            'DNAT',
            '--to-destination',
            target,
            '-m',
            'comment',
            '--comment',
            f'tritonops-test-{self.tag}',
        ]
        _run('iptables', '-t', 'nat', '-A', *rule)
        self.rules.append(rule)

    def teardown(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for rule in self.rules:
            subprocess.run(['iptables', '-t', 'nat', '-D'] + rule, check=False, capture_output=True)
        for name, host_if in self.namespaces:
            subprocess.run(['ip', 'link', 'del', host_if], check=False, capture_output=True)
            subprocess.run(['ip', 'netns', 'del', name], check=False, capture_output=True)


@pytest.fixture
def host():
    h = Host()
    yield h
    h.teardown()


# -- parsers ------------------------------------------------------------------------------------

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 00000000:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 20 4 30 10 -1
   3: 0101007F:1F42 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
"""
_TAIL6 = ' 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {} 1 0000000000000000 100 0 0 10 0'  # noqa: E501
TCP6 = (
    '\n'.join(
        [
            '  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode',  # noqa: E501
            '   0: 00000000000000000000000001000000:1F40' + _TAIL6.format(5555),
            '   1: 0000000000000000FFFF00000100007F:1F43' + _TAIL6.format(6666),
            '   2: 00000000000000000000000000000000:1F44' + _TAIL6.format(7777),
        ]
    )
    + '\n'
)


def test_listening_sockets_parses_tcp_and_tcp6_lines(tmp_path):
    (tmp_path / 'tcp').write_text(TCP)
    (tmp_path / 'tcp6').write_text(TCP6)
    got = discovery.listening_sockets(str(tmp_path))
    assert got == [
        ('127.0.0.1', 8000, 1111),
        ('0.0.0.0', 8001, 2222),
        ('127.0.1.1', 8002, 4444),
        ('::1', 8000, 5555),
        ('127.0.0.1', 8003, 6666),
        ('::', 8004, 7777),
    ]


def test_tcp_sockets_lists_every_socket_with_both_ends(tmp_path):
    (tmp_path / 'tcp').write_text(TCP)
    got = discovery.tcp_sockets(str(tmp_path))
    assert (('127.0.0.1', 8000), ('127.0.0.1', 50000), '01', 3333) in got
    assert len(got) == 4


def test_listening_sockets_of_a_missing_net_dir_is_empty(tmp_path):
    assert discovery.listening_sockets(str(tmp_path / 'nope')) == []
    assert discovery.tcp_sockets(str(tmp_path / 'nope')) == []


@pytest.mark.parametrize(
    'family,host', [(socket.AF_INET, '127.0.0.1'), (socket.AF_INET, '127.0.0.3'), (socket.AF_INET6, '::1')]
)
def test_listening_sockets_sees_a_real_listener_with_its_inode(family, host):
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        inode = os.fstat(sock.fileno()).st_ino
        got = discovery.listening_sockets('/proc/self/net')
    assert (host, port, inode) in got


def _diag_msg(family, state, ip, port, inode):
    raw = socket.inet_pton(family, ip).ljust(16, b'\0')
    body = struct.pack('=BBBB', family, state, 0, 0) + struct.pack('>HH', port, 0) + raw + b'\0' * 16 + b'\0' * 12
    body += struct.pack('=IIIII', 0, 0, 0, 0, inode)
    return struct.pack('=IHHII', 16 + len(body), 20, 2, 1, 0) + body


def test_parse_diag_listeners_reads_listeners_and_the_end_of_the_dump():
    answer = (
        _diag_msg(socket.AF_INET6, 10, '::ffff:127.0.0.1', 8003, 6666)
        + _diag_msg(socket.AF_INET6, 10, '::', 8004, 7777)
        + _diag_msg(socket.AF_INET6, 1, '::1', 8005, 8888)
    )
    assert discovery.parse_diag_listeners(answer, socket.AF_INET6) == (
        [('127.0.0.1', 8003, 6666), ('::', 8004, 7777)],
        False,
    )
    done = struct.pack('=IHHII', 20, 3, 2, 1, 0) + b'\0' * 4
    got = discovery.parse_diag_listeners(_diag_msg(socket.AF_INET, 10, '127.0.1.1', 8002, 4444) + done, socket.AF_INET)
    assert got == ([('127.0.1.1', 8002, 4444)], True)


def test_parse_diag_listeners_raises_on_a_netlink_error():
    error = struct.pack('=IHHII', 36, 2, 0, 1, 0) + struct.pack('=i', -errno.ENOENT) + b'\0' * 16
    with pytest.raises(OSError) as exc:
        discovery.parse_diag_listeners(error, socket.AF_INET)
    assert exc.value.errno == errno.ENOENT


def test_own_listeners_from_sock_diag_equal_those_of_the_tables():
    socks = []
    try:
        for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1'), (socket.AF_INET6, '::')):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
            sock.listen(1)
        for name in ('tcp', 'tcp6'):
            assert discovery._diag_listeners(discovery._FAMILIES[name]) is not None
            assert sorted(discovery.listening_sockets('/proc/self/net', (name,))) == sorted(
                discovery._listening_in_table('/proc/self/net', (name,))
            )
    finally:
        for sock in socks:
            sock.close()


def test_own_listeners_come_from_the_tables_when_sock_diag_cannot_be_asked(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        sock.listen(1)
        want = ('127.0.0.1', sock.getsockname()[1], os.fstat(sock.fileno()).st_ino)

        def refused(*_args):
            raise OSError(errno.EPROTONOSUPPORT, 'no netlink here')

        monkeypatch.setattr(discovery.socket, 'socket', refused)
        assert want in discovery.listening_sockets('/proc/self/net', ('tcp',))


CONNTRACK = (
    '\n'.join(
        [
            'ipv4     2 udp      17 20 src=10.0.0.1 dst=10.0.0.2 sport=5353 dport=5353 src=10.0.0.2 dst=10.0.0.1 sport=5353 dport=5353 mark=0 use=2',  # noqa: E501
            # with accounting on, packets= and bytes= follow each tuple
            'ipv4     2 tcp      6 431999 ESTABLISHED src=127.0.0.1 dst=127.0.0.1 sport=41000 dport=18000 packets=3 bytes=180 '
            'src=10.88.0.5 dst=10.88.0.1 sport=8000 dport=41000 packets=2 bytes=112 [ASSURED] mark=0 zone=0 use=2',
            'ipv4     2 tcp      6 431999 ESTABLISHED src=127.0.0.1 dst=127.0.0.1 sport=41001 dport=18000 '
            'src=10.88.0.6 dst=10.88.0.1 sport=8000 dport=41001 [ASSURED] mark=0 zone=0 use=2',
            'ipv6     10 tcp      6 431999 ESTABLISHED src=0000:0000:0000:0000:0000:0000:0000:0001 '
            'dst=0000:0000:0000:0000:0000:0000:0000:0001 sport=41002 dport=18000 src=fd00:0000:0000:0000:0000:0000:0000:0005 '
            'dst=fd00:0000:0000:0000:0000:0000:0000:0001 sport=8000 dport=41002 [ASSURED] mark=0 zone=0 use=2',
        ]
    )
    + '\n'
)


def test_conntrack_replies_give_what_the_other_end_sees(tmp_path):
    (tmp_path / 'nf_conntrack').write_text(CONNTRACK)
    net = str(tmp_path)
    assert discovery.conntrack_replies(net, ('127.0.0.1', 41000), ('127.0.0.1', 18000)) == [
        (('10.88.0.5', 8000), ('10.88.0.1', 41000))
    ]
    assert discovery.conntrack_replies(net, ('::1', 41002), ('::1', 18000)) == [(('fd00::5', 8000), ('fd00::1', 41002))]
    assert discovery.conntrack_replies(net, ('127.0.0.1', 41000), ('127.0.0.1', 18001)) == []
    assert discovery.conntrack_replies(str(tmp_path / 'none'), ('127.0.0.1', 41000), ('127.0.0.1', 18000)) == []


# -- the listening socket -----------------------------------------------------------------------


def test_find_server_by_its_listening_socket(host):
    server, port = host.peer('serve', 'tritonserver', '127.0.0.1:0')
    for name in ('127.0.0.1', 'localhost'):
        found = discovery.find_server(name, port)
        assert (found.pid, found.reason) == (server.pid, None)
        assert found.located_by == f'listener: tritonserver (pid {server.pid}) owns the listening socket {name}:{port}'


def test_find_server_on_a_wildcard_listener(host):
    server, port = host.peer('listen', 'tritonserver', '0.0.0.0:0')
    assert discovery.find_server('127.0.0.1', port).pid == server.pid


def test_find_server_refuses_a_port_held_by_another_program(host):
    other, port = host.peer('serve', 'nginx', '127.0.0.1:0')
    found = discovery.find_server('127.0.0.1', port)
    assert (found.pid, found.located_by) == (None, None)
    assert f'port {port} on 127.0.0.1 is held by nginx (pid {other.pid}), not by a tritonserver process' in found.reason
    assert (
        f'nginx (pid {other.pid}) accepts the connection but is not tritonserver and forwards it nowhere visible'
        in found.reason
    )
    assert 'set server_pid or shm_dir' in found.reason


def test_find_server_when_nobody_listens():
    port = free_port()
    found = discovery.find_server('127.0.0.1', port, timeout=1)
    assert (found.pid, found.located_by) == (None, None)
    assert (
        f'cannot open a TCP connection to 127.0.0.1:{port}' in found.reason
        and 'set server_pid or shm_dir' in found.reason
    )


def test_each_step_answers_with_one_location(host):
    server, port = host.peer('serve', 'tritonserver', '127.0.0.1:0')
    other, other_port = host.peer('serve', 'nginx', '127.0.0.1:0')
    assert discovery._by_listener('127.0.0.1', port, '/proc') == discovery.Location(
        server.pid,
        None,
        f'listener: tritonserver (pid {server.pid}) owns the listening socket 127.0.0.1:{port}',
        [],
        None,
    )
    assert discovery._by_listener('127.0.0.1', other_port, '/proc') == discovery.Location(
        None,
        None,
        None,
        [],
        f'port {other_port} on 127.0.0.1 is held by nginx (pid {other.pid}), not by a tritonserver process',
    )
    assert discovery._by_listener('127.0.0.1', free_port(), '/proc') == discovery.Location(None, None, None, [], None)
    assert discovery._by_connection('127.0.0.1', port, '/proc', 2.0, discovery.MAX_HOPS, 6) == discovery.Location(
        server.pid, None, f'connection to tritonserver (pid {server.pid})', [], None
    )


def test_a_connection_nobody_accepted_yet_is_traced_again_with_backoff(host, monkeypatch):
    """Until the process calls accept() the socket has no inode: six looks, about 0.6 s of waits at most."""
    _listener, port = host.peer('listen', 'nginx', '127.0.0.1:0')
    sleeps = []
    real = discovery.Backoff
    monkeypatch.setattr(discovery, 'Backoff', lambda **kwargs: real(sleep=sleeps.append, **kwargs))
    found = discovery._by_connection('127.0.0.1', port, '/proc', 2.0, discovery.MAX_HOPS, 6)
    assert found == discovery.Location(
        None, None, None, [], f'the connection to 127.0.0.1:{port} could not be followed'
    )
    assert sleeps == [0.02, 0.04, 0.08, 0.16, 0.3]


# -- following the connection ------------------------------------------------------------------------


@ROOT
def test_a_server_in_another_namespace_reached_by_its_own_address(host):
    """A container or pod IP: the other end of the connection is in the server's namespace."""
    ns, _host_ip, ns_ip = host.netns(1)
    server, port = host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)
    found = discovery.find_server(ns_ip, port)
    assert (found.pid, found.reason) == (server.pid, None)
    assert (
        found.located_by
        == f'connection to tritonserver (pid {server.pid}) at {ns_ip}:8000 in another network namespace'
    )


@ROOT
def test_a_one_process_forwarder_like_docker_proxy(host):
    ns, _host_ip, ns_ip = host.netns(1)
    server, _port = host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)
    proxy, port = host.peer('forward', 'docker-proxy', '127.0.0.1:0', backends=[f'{ns_ip}:8000'])
    found = discovery.find_server('127.0.0.1', port)
    assert (found.pid, found.reason) == (server.pid, None)
    assert found.located_by == (
        f'connection via docker-proxy (pid {proxy.pid}) to tritonserver (pid {server.pid}) '
        f'at {ns_ip}:8000 in another network namespace'
    )


@ROOT
@pytest.mark.skipif(not shutil.which('socat'), reason='socat is installed by .ci/deps')
def test_a_forking_forwarder_socat(host):
    """socat forks a child per connection: the child holds both ends, the parent only listens."""
    ns, _host_ip, ns_ip = host.netns(1)
    server, _port = host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)
    port = free_port()
    host.socat(port, f'{ns_ip}:8000')
    found = discovery.find_server('127.0.0.1', port)
    assert (found.pid, found.reason) == (server.pid, None)
    assert found.located_by.startswith('connection via socat (pid ') and found.located_by.endswith(
        f') to tritonserver (pid {server.pid}) at {ns_ip}:8000 in another network namespace'
    )


@ROOT
def test_nat_is_followed_through_conntrack(host):
    """A published port without a proxy (Docker userland-proxy=false, rootful podman): DNAT, no process on the host port."""
    ns, host_ip, ns_ip = host.netns(1)
    server, _port = host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)
    port = free_port()
    host.dnat(host_ip, port, f'{ns_ip}:8000')
    found = discovery.find_server(host_ip, port)
    assert (found.pid, found.reason) == (server.pid, None)
    assert found.located_by == (
        f'connection via NAT {host_ip}:{port} -> {ns_ip}:8000 to tritonserver (pid {server.pid}) '
        f'at {ns_ip}:8000 in another network namespace'
    )


@ROOT
def test_several_servers_each_url_finds_its_own(host):
    """Two containers, both on port 8000 inside, published on two host ports: never the other one's server."""
    servers, urls = [], []
    for i in (1, 2):
        ns, host_ip, ns_ip = host.netns(i)
        servers.append(host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)[0])
        urls.append(host.peer('forward', 'docker-proxy', '127.0.0.1:0', backends=[f'{ns_ip}:8000'])[1])
        port = free_port()
        host.dnat(host_ip, port, f'{ns_ip}:8000')
        urls.append((host_ip, port))
    got = [
        discovery.find_server('127.0.0.1', urls[0]).pid,
        discovery.find_server(*urls[1]).pid,
        discovery.find_server('127.0.0.1', urls[2]).pid,
        discovery.find_server(*urls[3]).pid,
    ]
    assert got == [servers[0].pid, servers[0].pid, servers[1].pid, servers[1].pid]


@ROOT
def test_a_load_balancer_in_front_of_two_servers_is_refused(host):
    """Its upstream pool keeps connections to both servers: the URL is refused, never resolved to one of them."""
    backends = []
    for i in (1, 2):
        ns, _host_ip, ns_ip = host.netns(i)
        host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)
        backends.append(f'{ns_ip}:8000')
    _lb, port = host.peer('pool', 'haproxy', '127.0.0.1:0', backends=backends)
    found = discovery.find_server('127.0.0.1', port)
    assert (found.pid, found.located_by) == (None, None)
    assert 'lead to several tritonserver processes' in found.reason and 'load balancer' in found.reason


@ROOT
def test_forwarding_hops_are_bounded(host):
    ns, _host_ip, ns_ip = host.netns(1)
    server, _port = host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)
    _inner, inner_port = host.peer('forward', 'fwd-inner', '127.0.0.1:0', backends=[f'{ns_ip}:8000'])
    outer, port = host.peer('forward', 'fwd-outer', '127.0.0.1:0', backends=[f'127.0.0.1:{inner_port}'])
    assert discovery.find_server('127.0.0.1', port).pid == server.pid
    bounded = discovery.find_server('127.0.0.1', port, max_hops=1)
    assert bounded.pid is None
    assert 'gave up after 1 forwarding hops at fwd-inner' in bounded.reason, bounded.reason
    assert f'port {port} on 127.0.0.1 is held by fwd-outer (pid {outer.pid})' in bounded.reason


@ROOT
def test_not_root_cannot_follow_into_other_namespaces(host, as_nobody):
    """Without root the other end's process cannot be read: no guess, a reason that says to become root."""
    ns, _host_ip, ns_ip = host.netns(1)
    host.peer('serve', 'tritonserver', '0.0.0.0:8000', netns=ns)
    found = as_nobody(lambda: discovery.find_server(ns_ip, 8000, '/proc', 2.0, 4, 1)._asdict())
    assert (found['pid'], found['located_by']) == (None, None)
    assert 'become: true' in found['reason']


# -- locate_server -------------------------------------------------------------------------------


def test_locate_server_explicit_values():
    me = os.getpid()
    assert discovery.locate_server('127.0.0.1', 1, 'http://127.0.0.1:1', server_pid=me) == discovery.Location(
        me,
        f'/proc/{me}/root/dev/shm',
        f'server_pid; shm_dir from /proc/{me}/root',
        [],
        None,
        shm_root=f'/proc/{me}/root',
    )
    assert discovery.locate_server(
        '127.0.0.1', 1, 'http://127.0.0.1:1', server_pid=me, shm_dir='/x'
    ) == discovery.Location(me, '/x', 'server_pid; shm_dir given', [], None)


def test_locate_server_not_found_says_why():
    port = free_port()
    loc = discovery.locate_server('127.0.0.1', port, f'http://127.0.0.1:{port}')
    assert (loc.pid, loc.shm_dir, loc.located_by) == (None, None, None)
    assert 'cannot open a TCP connection' in loc.reason
    assert loc.warnings == [
        f'tritonserver process for http://127.0.0.1:{port} not found ({loc.reason}): file and holder data are missing'
    ]


def test_locate_server_refuses_a_server_pid_that_does_not_exist():
    with pytest.raises(
        discovery.DiscoveryError, match='server_pid 99999999 .given for http://x. does not exist on this host'
    ) as err:
        discovery.locate_server('127.0.0.1', 1, 'http://x', server_pid=99999999)
    # why, and what to do (issue 29)
    assert 'another PID namespace' in err.value.msg and 'pgrep -x tritonserver' in err.value.msg
    assert 'leave server_pid out' in err.value.msg


# -- sock_diag: this namespace's sockets without reading its tables -------------------------------------


def _inode(sock):
    return os.fstat(sock.fileno()).st_ino


@pytest.fixture
def connection():
    """A real loopback connection: (listener, client end, accepted end), closed afterwards."""
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen(256)
    client = socket.create_connection(listener.getsockname())
    accepted, _peer = listener.accept()
    yield listener, client, accepted
    for sock in (client, accepted, listener):
        sock.close()


def test_diag_lookup_finds_each_end_of_a_real_connection_by_its_4_tuple(connection):
    listener, client, accepted = connection
    here, there = client.getsockname()[:2], client.getpeername()[:2]
    assert discovery.diag_lookup(there, here) == [discovery.TcpSocket(there, here, '01', _inode(accepted))]
    assert discovery.diag_lookup(here, there) == [discovery.TcpSocket(here, there, '01', _inode(client))]
    # no such connection: the kernel's lookup answers with the listener of that address, which is not it
    assert discovery.diag_lookup(there, ('127.0.0.1', free_port())) == []
    assert discovery.diag_lookup(('127.0.0.1', free_port()), here) == []
    assert _inode(listener) not in {s.inode for s in discovery.diag_lookup(there, here)}


def test_diag_lookup_finds_an_ipv4_connection_accepted_by_a_dual_stack_listener():
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(('::', 0))
        listener.listen(1)
        with socket.create_connection(('127.0.0.1', listener.getsockname()[1])) as client:
            accepted, _peer = listener.accept()
            with accepted:
                here, there = client.getsockname()[:2], client.getpeername()[:2]
                assert accepted.family == socket.AF_INET6
                assert discovery.diag_lookup(there, here) == [discovery.TcpSocket(there, here, '01', _inode(accepted))]


def test_diag_sockets_of_one_process_equal_its_lines_of_the_tables(connection):
    """Among many other connections, the filtered dump gives exactly the chosen sockets, as the tables show them."""
    listener, client, accepted = connection
    others = [socket.create_connection(listener.getsockname()) for _i in range(200)]
    try:
        more = [listener.accept()[0] for _sock in others]
        mine = {_inode(s) for s in (listener, client, accepted)}
        got = discovery.diag_sockets_of(mine)
        table = [s for s in discovery.tcp_sockets('/proc/self/net') if s.inode in mine]
        assert sorted(got) == sorted(table) and len(got) == 3
        for sock in more:
            sock.close()
    finally:
        for sock in others:
            sock.close()


def test_parse_diag_picks_by_inode_the_same_sockets_as_reading_every_message():
    run = [_diag_msg(socket.AF_INET, 1, '127.0.0.1', 9000 + i, 100 + i) for i in range(50)]
    done = struct.pack('=IHHII', 20, 3, 2, 1, 0) + b'\0' * 4
    longer = _diag_msg(socket.AF_INET6, 1, '::1', 8999, 120)  # with one attribute more: a message of another length
    odd = struct.pack('=I', len(longer) + 8) + longer[4:] + struct.pack('=HH', 5, 8) + b'\0' * 4
    wanted = {101, 120, 149, 555}
    for answer in (b''.join(run) + done, b''.join(run[:10]) + odd + b''.join(run[10:]) + done, b''.join(run)):
        fast = discovery.parse_diag(answer, wanted)
        slow = discovery.parse_diag(answer)
        assert fast == ([s for s in slow[0] if s.inode in wanted], slow[1])
    assert [s.local[1] for s in discovery.parse_diag(b''.join(run) + done, wanted)[0]] == [9001, 9020, 9049]


def _refuse_netlink(monkeypatch):
    """sock_diag cannot be asked (no netlink, a seccomp filter): every other socket still opens."""
    refused = []
    real = socket.socket

    def no_netlink(family=-1, *args, **kwargs):
        if family == socket.AF_NETLINK:
            refused.append(family)
            raise OSError(errno.EPROTONOSUPPORT, 'no netlink here')
        return real(family, *args, **kwargs)

    monkeypatch.setattr(discovery.socket, 'socket', no_netlink)
    return refused


def test_a_forwarder_is_followed_the_same_way_when_sock_diag_cannot_be_asked(host, monkeypatch):
    server, server_port = host.peer('serve', 'tritonserver', '127.0.0.1:0')
    proxy, port = host.peer('forward', 'docker-proxy', '127.0.0.1:0', backends=[f'127.0.0.1:{server_port}'])
    want = discovery.Location(
        server.pid, None, f'connection via docker-proxy (pid {proxy.pid}) to tritonserver (pid {server.pid})', [], None
    )
    assert discovery.find_server('127.0.0.1', port) == want
    refused = _refuse_netlink(monkeypatch)
    assert discovery.find_server('127.0.0.1', port) == want
    assert refused, 'the tables were read because sock_diag was refused'


def test_a_port_held_by_a_process_found_late_in_the_walk_is_still_named(host, monkeypatch):
    """The walk stops at a socket's first owner; nothing is missed when the owner comes last."""
    other, port = host.peer('serve', 'nginx', '127.0.0.1:0')
    monkeypatch.setattr(
        discovery, 'list_pids', lambda proc='/proc': sorted(procfs.list_pids(proc), key=lambda p: p == other.pid)
    )
    monkeypatch.setattr(discovery, 'PROBE_SECONDS', 0.0)
    found = discovery.find_server('127.0.0.1', port)
    assert found.pid is None
    assert f'port {port} on 127.0.0.1 is held by nginx (pid {other.pid}), not by a tritonserver process' in found.reason
    assert (
        f'nginx (pid {other.pid}) accepts the connection but is not tritonserver and forwards it nowhere visible'
        in found.reason
    )
