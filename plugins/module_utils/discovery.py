# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""From a Triton URL's (host, port) to the tritonserver process and its shm directory.

Private to the tritonops.shm collection. See docs/concepts.md, "Finding the server".

Two ways, tried in this order:

1. **Listening socket** (the fast path): a tritonserver process in this network
   namespace owns the socket listening on the port (Triton on the host, or a
   container with host networking).
2. **Following a connection**: open a TCP connection to the URL and find the process
   that owns the other end of it, in whatever network namespace it lives, through
   /proc/PID/net/tcp{,6} and the processes' fds. Across NAT (Docker without its
   userland proxy, rootful podman, Kubernetes services), the translated addresses
   come from the namespace's conntrack table. When the owner is not tritonserver but
   a forwarder (docker-proxy, socat, kubectl port-forward, ...), follow the
   forwarder's own outgoing connections, a bounded number of hops. The answer must
   be one tritonserver: several reachable servers (a load balancer) are refused.

No container engine API is used: everything comes from /proc, so it works the same
for Docker, podman, containerd/CRI-O pods and plain processes, and needs root to
see other users' processes and namespaces.
"""
from __future__ import annotations

import os
import socket
import struct

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import DiscoveryError
from ansible_collections.tritonops.shm.plugins.module_utils.procfs import Backoff, list_pids, netns_inode, read_comm, socket_inodes

SERVER_COMMS = ('tritonserver',)
_LISTEN = '0A'
_ESTABLISHED = '01'
MAX_HOPS = 4
FIX_HINT = 'set server_pid or shm_dir, or run the task on the host that runs Triton, as root (become: true)'

Address = tuple[str, int]


class Location(NamedTuple):
    """Where one Triton server is on this host: the one answer of discovery, and of each of its steps.

    pid: the tritonserver process (None when not found); shm_dir: its shm directory as seen from here
    (None when unknown); located_by: how they were found; warnings: for the module to show;
    reason: why the server process was not found (None when it was, or when server_pid was given).
    The steps (the listening socket, a followed connection, find_server) fill pid and located_by,
    or reason; locate_server adds the shm directory and the warnings.
    """
    pid: int | None
    shm_dir: str | None
    located_by: str | None
    warnings: list[str]
    reason: str | None

    @classmethod
    def found(cls, pid: int, located_by: str) -> Location:
        return cls(pid, None, located_by, [], None)

    @classmethod
    def not_found(cls, reason: str | None) -> Location:
        return cls(None, None, None, [], reason)


class TcpSocket(NamedTuple):
    """One line of /proc/.../net/tcp{,6}."""
    local: Address
    remote: Address
    state: str   # hex, as the table prints it: '0A' listening, '01' established
    inode: int   # 0 while the kernel holds an accepted connection no process has accepted yet


def _parse_addr(hexaddr: str) -> Address:
    """Address of /proc/net/tcp{,6} 'ADDR:PORT' in hex → (ip string, port)."""
    addr, port = hexaddr.split(':')
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
        ip = _plain_ip(socket.inet_ntop(socket.AF_INET6, b''.join(words)))
    return ip, int(port, 16)


def _plain_ip(ip: str) -> str:
    """An address as the other tables print it: IPv4-mapped IPv6 as IPv4, IPv6 compressed."""
    if ':' in ip:
        try:
            ip = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, ip))
        except (OSError, ValueError):
            return ip
        if ip.startswith('::ffff:') and '.' in ip:
            ip = ip[len('::ffff:'):]
    return ip


def _tcp_lines(net_dir: str, families: Iterable[str]) -> Iterator[str]:
    for name in families:
        try:
            with open(os.path.join(net_dir, name)) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        yield from lines


# sock_diag (netlink), the interface of `ss`: with only TCP_LISTEN asked for, the kernel walks the
# listening table alone; /proc/net/tcp walks the whole established table (milliseconds on a busy host)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_TCP_LISTEN_STATE = 10
_NL_HEADER = struct.Struct('=IHHII')          # nlmsghdr: len, type, flags, seq, pid
_DIAG_REQ = struct.Struct('=BBBBI48x')        # inet_diag_req_v2: family, protocol, ext, pad, states, sockid (any)
_DIAG_MSG = struct.Struct('=BBBBHH16s16s12xIIIII')  # inet_diag_msg, sport and dport in network order
_OWN_NET_DIRS = ('/proc/net', '/proc/self/net')
_FAMILIES = {'tcp': socket.AF_INET, 'tcp6': socket.AF_INET6}


def parse_diag_listeners(data: bytes, family: int) -> tuple[list[tuple[str, int, int]], bool]:
    """[(ip, port, inode)] of the LISTEN sockets in a sock_diag dump answer, and whether it is complete.

    Raises OSError for a netlink error message (no inet_diag in this kernel, a filter refusing it).
    """
    out = []
    off = 0
    while off + _NL_HEADER.size <= len(data):
        length, kind = _NL_HEADER.unpack_from(data, off)[:2]
        if length < _NL_HEADER.size:
            raise OSError('malformed sock_diag answer')
        if kind == _NLMSG_DONE:
            return out, True
        if kind == _NLMSG_ERROR:
            err = struct.unpack_from('=i', data, off + _NL_HEADER.size)[0]
            raise OSError(-err, os.strerror(-err) if err else 'sock_diag error')
        if length >= _NL_HEADER.size + _DIAG_MSG.size:
            msg = _DIAG_MSG.unpack_from(data, off + _NL_HEADER.size)
            if msg[0] == family and msg[1] == _TCP_LISTEN_STATE:
                raw = msg[6][:4] if family == socket.AF_INET else msg[6]
                ip = socket.inet_ntop(family, raw)
                out.append((_plain_ip(ip) if family == socket.AF_INET6 else ip, socket.ntohs(msg[4]), msg[12]))
        off += (length + 3) & ~3
    return out, False


def _diag_listeners(family: int) -> list[tuple[str, int, int]] | None:
    """LISTEN TCP sockets of this process's network namespace through sock_diag, or None when it cannot be asked."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | getattr(socket, 'SOCK_CLOEXEC', 0), _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    try:
        request = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN_STATE)
        sock.settimeout(2.0)
        sock.sendall(_NL_HEADER.pack(_NL_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0) + request)
        out = []
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return None
            part, done = parse_diag_listeners(data, family)
            out.extend(part)
            if done:
                return out
    except OSError:
        return None
    finally:
        sock.close()


def listening_sockets(net_dir: str, families: Iterable[str] = ('tcp', 'tcp6')) -> list[tuple[str, int, int]]:
    """[(ip, port, inode)] of LISTEN TCP sockets in a /proc/.../net directory.

    For this process's own namespace they come from sock_diag when it answers, else from the
    tables; the same sockets either way.
    """
    if net_dir in _OWN_NET_DIRS:
        out = []
        for name in families:
            found = _diag_listeners(_FAMILIES[name])
            out.extend(found if found is not None else _listening_in_table(net_dir, (name,)))
        return out
    return _listening_in_table(net_dir, families)


def _listening_in_table(net_dir: str, families: Iterable[str]) -> list[tuple[str, int, int]]:
    out = []
    for line in _tcp_lines(net_dir, families):
        head = line.split(None, 4)  # most sockets are not listening: split the rest only for those that are
        if len(head) == 5 and head[3] == _LISTEN:
            fields = line.split()
            if len(fields) >= 10:
                ip, port = _parse_addr(fields[1])
                out.append((ip, port, int(fields[9])))
    return out


def tcp_sockets(net_dir: str) -> list[TcpSocket]:
    """Every TCP socket in a /proc/.../net directory, with both ends, its state and its inode."""
    out = []
    for line in _tcp_lines(net_dir, ('tcp', 'tcp6')):
        fields = line.split()
        if len(fields) >= 10:
            out.append(TcpSocket(_parse_addr(fields[1]), _parse_addr(fields[2]), fields[3], int(fields[9])))
    return out


def conntrack_replies(net_dir: str, local: Address, remote: Address) -> list[tuple[Address, Address]]:
    """[(peer local (ip, port), peer remote (ip, port))] for the TCP connection local→remote in a conntrack table.

    The reply tuple of a translated connection is what the other end sees: its own
    address (after DNAT) and ours (after SNAT). An empty list when the table is not
    there (no NAT module) or not readable.
    """
    want = (local[0], remote[0], str(local[1]), str(remote[1]))
    sport = f'sport={local[1]} '
    out = []
    try:
        with open(os.path.join(net_dir, 'nf_conntrack')) as f:
            for line in f:
                if ' tcp ' not in line or sport not in line:
                    continue
                tuples: list[dict[str, str]] = []   # the original tuple, then the reply tuple; each starts at src=
                for field in line.split():
                    key, sep, value = field.partition('=')
                    if not sep:
                        continue
                    if key == 'src':
                        tuples.append({})
                    if tuples:
                        tuples[-1][key] = _plain_ip(value) if key in ('src', 'dst') else value
                if len(tuples) < 2:
                    continue
                first, reply = tuples[0], tuples[1]
                if (first.get('src'), first.get('dst'), first.get('sport'), first.get('dport')) != want:
                    continue
                try:
                    out.append(((reply['src'], int(reply['sport'])), (reply['dst'], int(reply['dport']))))
                except (KeyError, ValueError):
                    continue
    except OSError:
        return []
    return out


def _resolve(host: str) -> set[str]:
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return set()
    return {_plain_ip(i[4][0]) for i in infos}


def _socket_owner(inodes: Iterable[int], pids: Iterable[int], proc: str) -> int | None:
    wanted = set(inodes)
    for pid in pids:
        if socket_inodes(pid, proc) & wanted:
            return pid
    return None


def _who(pid: int, proc: str) -> str:
    return f"{read_comm(pid, proc) or '?'} (pid {pid})"


class _Tracer:
    """One look at every network namespace on the host, to follow TCP connections to their other end."""

    def __init__(self, proc: str) -> None:
        self.proc = proc
        self.own_ns = netns_inode('self', proc)
        self.ns_pids: dict[int, list[int]] = {}
        for pid in list_pids(proc):
            ns = netns_inode(pid, proc)
            if ns is not None:
                self.ns_pids.setdefault(ns, []).append(pid)
        self._tables: dict[int | None, list[TcpSocket]] = {}
        self._inodes: dict[int, set[int]] = {}
        self.unreadable_ns = 0

    def inodes(self, pid: int) -> set[int]:
        """A process's socket inodes, read once per look."""
        if pid not in self._inodes:
            self._inodes[pid] = socket_inodes(pid, self.proc)
        return self._inodes[pid]

    def _net_dir(self, ns: int | None) -> str | None:
        if ns == self.own_ns:
            return f'{self.proc}/self/net'
        for pid in self.ns_pids.get(ns, ()):
            path = f'{self.proc}/{pid}/net'
            if os.access(path + '/tcp', os.R_OK):
                return path
        return None

    def table(self, ns: int | None) -> list[TcpSocket]:
        if ns not in self._tables:
            net_dir = self._net_dir(ns)
            if net_dir is None:
                self.unreadable_ns += 1
            self._tables[ns] = tcp_sockets(net_dir) if net_dir else []
        return self._tables[ns]

    def namespaces(self) -> list[int | None]:
        """Own namespace first: most connections end next door."""
        return [self.own_ns] + [ns for ns in self.ns_pids if ns != self.own_ns]

    def peers(self, local: Address, remote: Address, ns: int | None) -> tuple[list[tuple[int | None, TcpSocket]], str | None]:
        """[(ns, socket)] of the other end of the connection local→remote made from namespace ns, and how."""
        found = self._exact(remote, local)
        if found:
            return found, None
        net_dir = self._net_dir(ns)
        for peer_local, peer_remote in (conntrack_replies(net_dir, local, remote) if net_dir else []):
            found = self._exact(peer_local, peer_remote)
            if found:
                return found, f'NAT {remote[0]}:{remote[1]} -> {peer_local[0]}:{peer_local[1]}'
        return [], None

    def _exact(self, want_local: Address, want_remote: Address) -> list[tuple[int | None, TcpSocket]]:
        out = []
        for ns in self.namespaces():
            for sock in self.table(ns):
                if sock.local == want_local and sock.remote == want_remote and sock.state == _ESTABLISHED:
                    out.append((ns, sock))
        return out

    def owners(self, ns: int | None, inode: int) -> list[int]:
        """Pids in namespace ns that have the socket open (a forked forwarder may share it for a moment)."""
        return [pid for pid in self.ns_pids.get(ns, ()) if inode in self.inodes(pid)]

    def outgoing(self, ns: int | None, pid: int, skip_inode: int) -> list[TcpSocket]:
        """The established connections a forwarder opened itself: not the accepted ones (on its listening ports)."""
        mine = self.inodes(pid)
        table = self.table(ns)
        listening_ports = {s.local[1] for s in table if s.state == _LISTEN and s.inode in mine}
        return [s for s in table if s.inode in mine and s.inode != skip_inode and s.state == _ESTABLISHED
                and s.local[1] not in listening_ports]


class _Trace:
    """The search from one connection: every tritonserver reached, with the way to it, or why none."""

    def __init__(self, tracer: _Tracer, max_hops: int) -> None:
        self.tracer = tracer
        self.max_hops = max_hops
        self.servers: dict[int, str] = {}   # pid -> located_by
        self.dead_ends: list[str] = []      # why a branch ended without a server
        self.transient = False

    def follow(self, local: Address, remote: Address, ns: int | None, via: list[str], hop: int) -> None:
        peers, nat = self.tracer.peers(local, remote, ns)
        if not peers:
            self.dead_ends.append(f'no process on this host owns the other end of the connection '
                                  f"{local[0]}:{local[1]} -> {remote[0]}:{remote[1]}{_via(via, ' (via {})')}")
            self.transient = True
            return
        step = list(via) + ([nat] if nat else [])
        for peer_ns, sock in peers:
            if sock.inode == 0:
                self.transient = True   # accepted by the kernel, not yet by the process: no inode yet
                continue
            owners = self.tracer.owners(peer_ns, sock.inode)
            if not owners:
                self.dead_ends.append(f'the process owning {sock.local[0]}:{sock.local[1]} in network namespace {peer_ns} '
                                      'could not be read')
                self.transient = True   # or it was forked (a forwarder's child) after the processes were listed
                continue
            for pid in owners:
                self._owner(pid, peer_ns, sock, step, hop)

    def _owner(self, pid: int, ns: int | None, sock: TcpSocket, via: list[str], hop: int) -> None:
        comm = read_comm(pid, self.tracer.proc)
        who = f"{comm or '?'} (pid {pid})"
        if comm in SERVER_COMMS:
            where = '' if ns == self.tracer.own_ns else f' at {sock.local[0]}:{sock.local[1]} in another network namespace'
            self.servers.setdefault(pid, f"connection {_via(via, 'via {} ')}to tritonserver (pid {pid}){where}")
            return
        if hop >= self.max_hops:
            self.dead_ends.append(f'gave up after {hop} forwarding hops at {who}')
            return
        onward = self.tracer.outgoing(ns, pid, sock.inode)
        if not onward:
            self.dead_ends.append(f'{who} accepts the connection but is not tritonserver and forwards it nowhere visible')
            self.transient = True   # a forwarder may not have connected onward yet
            return
        for out in onward:
            self.follow(out.local, out.remote, ns, list(via) + [who], hop + 1)


def _via(via: list[str], template: str) -> str:
    """The forwarders a connection went through, in template ('via {} '), or '' when it went straight."""
    return template.format(', '.join(via)) if via else ''


def _by_listener(host: str, port: int, proc: str) -> Location:
    """The fast path: a tritonserver in this network namespace owns the listening socket.

    Not found: the reason names the program holding the port when another one does, else it is None.
    """
    addrs = _resolve(host) | {_plain_ip(host)}
    wildcard = {'0.0.0.0', '::'}
    inodes: list[int] = []
    # /proc/net/tcp{,6} cost milliseconds each to generate: read the URL's family first, the other only if needed
    for family in (('tcp6', 'tcp') if any(':' in a for a in addrs) else ('tcp', 'tcp6')):
        inodes = [ino for ip, p, ino in listening_sockets(f'{proc}/net', (family,))
                  if p == port and (ip in addrs or ip in wildcard)]
        if inodes:
            break
    if not inodes:
        return Location.not_found(None)
    others = []
    for pid in list_pids(proc):
        if read_comm(pid, proc) in SERVER_COMMS:
            if _socket_owner(inodes, [pid], proc) == pid:   # the usual case: no need to read every other process's name
                return Location.found(pid, f'listener: tritonserver (pid {pid}) owns the listening socket {host}:{port}')
        else:
            others.append(pid)
    holder = _socket_owner(inodes, others, proc)
    if holder is None:
        return Location.not_found(None)
    return Location.not_found(f'port {port} on {host} is held by {_who(holder, proc)}, not by a tritonserver process')


def _by_connection(host: str, port: int, proc: str, timeout: float, max_hops: int, attempts: int) -> Location:
    """Open a TCP connection to host:port and follow it to the tritonserver at its other end."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return Location.not_found(f'cannot open a TCP connection to {host}:{port} to follow it to the server: {exc}')
    try:
        local = sock.getsockname()[:2]
        remote = sock.getpeername()[:2]
        local, remote = (_plain_ip(local[0]), local[1]), (_plain_ip(remote[0]), remote[1])
        # a just-accepted socket has no inode yet, a forking forwarder's child may not be listed yet: look again
        backoff = Backoff(attempts=attempts, first=0.02, cap=0.3)
        while True:
            tracer = _Tracer(proc)
            trace = _Trace(tracer, max_hops)
            trace.follow(local, remote, tracer.own_ns, [], 0)
            if trace.servers or not trace.transient or not backoff.wait():
                break
    finally:
        sock.close()
    if len(trace.servers) == 1:
        pid, path = next(iter(trace.servers.items()))
        return Location.found(pid, path)
    if trace.servers:
        paths = '; '.join(trace.servers[p] for p in sorted(trace.servers))
        return Location.not_found(f'connections to {host}:{port} lead to several tritonserver processes ({paths}), '
                                  f'as through a load balancer: the one serving this URL cannot be told; {FIX_HINT}')
    reasons = list(dict.fromkeys(trace.dead_ends))
    if tracer.unreadable_ns:
        reasons.append(f'{tracer.unreadable_ns} network namespace(s) could not be read (not root?)')
    return Location.not_found('; '.join(reasons) or f'the connection to {host}:{port} could not be followed')


def find_server(host: str, port: int, proc: str = '/proc', timeout: float = 2.0, max_hops: int = MAX_HOPS,
                attempts: int = 6) -> Location:
    """Find the tritonserver process serving host:port: its pid and located_by, or the reason it was not found.

    The Location has no shm_dir and no warnings: locate_server adds them.
    """
    listener = _by_listener(host, port, proc)
    if listener.pid is not None:
        return listener
    found = _by_connection(host, port, proc, timeout, max_hops, attempts)
    if found.pid is not None:
        return found
    held = f'{listener.reason}, and ' if listener.reason else ''
    return Location.not_found(f'{held}the tritonserver process behind {host}:{port} was not found: {found.reason}; {FIX_HINT}')


def locate_server(host: str, port: int, base: str, server_pid: int | None = None, shm_dir: str | None = None,
                  proc: str = '/proc') -> Location:
    """Decide the server pid and the shm directory (see Location).

    reason says why the server process was not found (None when it was, or when server_pid was given).
    """
    warnings = []
    pid = server_pid
    how = 'server_pid' if server_pid else None
    reason = None
    if pid is None:
        found = find_server(host, port, proc=proc)
        pid, how, reason = found.pid, found.located_by, found.reason
        if pid is None and shm_dir is None:
            warnings.append(f'tritonserver process for {base} not found ({reason}): file and holder data are missing')
        elif pid is None:
            warnings.append(f'tritonserver process for {base} not found ({reason}): it cannot be told apart from clients, '
                            'so every file it maps counts as held')
    elif not os.path.isdir(f'{proc}/{pid}'):
        raise DiscoveryError(f'server_pid {pid} (given for {base}) does not exist on this host')
    if shm_dir is None and pid is not None:
        shm_dir = f'{proc}/{pid}/root/dev/shm'
        how = f'{how}; shm_dir from /proc/{pid}/root'
    elif shm_dir is not None:
        how = (how + '; ' if how else '') + 'shm_dir given'
    return Location(pid, shm_dir, how, warnings, reason)
