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

import errno
import os
import socket
import struct
import time
from collections.abc import Container, Iterable, Iterator
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import DiscoveryError
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import (
    Backoff,
    child_pids,
    fd_count,
    list_pids,
    netns_inode,
    read_comm,
    socket_inodes,
)

SERVER_COMMS = ('tritonserver',)


def server_pids(proc: str = '/proc') -> list[int]:
    """The pids of the processes named as a Triton server is (SERVER_COMMS), as proc lists them."""
    return [pid for pid in list_pids(proc) if read_comm(pid, proc) in SERVER_COMMS]


_LISTEN = '0A'
_ESTABLISHED = '01'
MAX_HOPS = 4
PROBE_SECONDS = 0.005  # the listener's holder is first looked for in pid order for this long, then among tritonservers
PROBE_MAX_FDS = 1024  # processes with more descriptors are left to the full walk
QUICK_LOOKS = (
    0.001,
    0.002,
    0.004,
)  # pauses before looking again when a look was quick and found the trace not settled yet
FIX_HINT = 'set server_pid or shm_dir, or run the task on the host that runs Triton, as root (become: true)'

Address = tuple[str, int]


class Location(NamedTuple):
    """Where one Triton server is on this host: the one answer of discovery, and of each of its steps.

    pid: the tritonserver process (None when not found); shm_dir: its shm directory as seen from here
    (None when unknown); located_by: how they were found; warnings: for the module to show;
    reason: why the server process was not found (None when it was, or when server_pid was given).
    The steps (the listening socket, a followed connection, find_server) fill pid and located_by,
    or reason; locate_server adds the shm directory and the warnings.
    shared: with server_pid given, why the URL's port is shared by several servers (a call may reach another
    one: only the regions whose files that process maps can be judged), else None.
    shm_root: the root shm_dir lies in when it is the server's own /dev/shm (/proc/PID/root): it is resolved as the
    server sees it, never through a symlink (shm_fs.pin); None when the operator named the directory.
    """

    pid: int | None
    shm_dir: str | None
    located_by: str | None
    warnings: list[str]
    reason: str | None
    shared: str | None = None
    shm_root: str | None = None

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
    state: str  # hex, as the table prints it: '0A' listening, '01' established
    inode: int  # 0 while the kernel holds an accepted connection no process has accepted yet


def _parse_addr(hexaddr: str) -> Address:
    """Address of /proc/net/tcp{,6} 'ADDR:PORT' in hex → (ip string, port)."""
    addr, port = hexaddr.split(':')
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
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
            ip = ip[len('::ffff:') :]
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
_NL_HEADER = struct.Struct('=IHHII')  # nlmsghdr: len, type, flags, seq, pid
_DIAG_REQ = struct.Struct('=BBBBI48x')  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid (any)
_DIAG_MSG = struct.Struct('=BBBBHH16s16s12xIIIII')  # inet_diag_msg, sport and dport in network order
_OWN_NET_DIRS = ('/proc/net', '/proc/self/net')
_FAMILIES = {'tcp': socket.AF_INET, 'tcp6': socket.AF_INET6}


_NLM_F_REQUEST = 0x1
_TCP_ESTABLISHED_STATE = 1
_NOCOOKIE = 0xFFFFFFFF
_INODE_AT = _NL_HEADER.size + _DIAG_MSG.size - 4  # offset of idiag_inode in one answer message
_U32 = struct.Struct('=I')


def _diag_addr(family: int, raw: bytes, port_be: int) -> Address:
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[:4]), socket.ntohs(port_be)
    return _plain_ip(socket.inet_ntop(family, raw)), socket.ntohs(port_be)


def parse_diag(
    data: bytes, inodes: Container[int] | None = None, family: int | None = None
) -> tuple[list[TcpSocket], bool]:
    """The sockets of a sock_diag answer, and whether it ends the dump.

    inodes: keep only the sockets with one of these inodes (checked before anything else is decoded:
    a dump of a busy namespace has thousands); family: keep only that address family.
    Raises OSError for a netlink error message (no inet_diag in this kernel, a filter refusing it, no such socket).
    """
    out = []
    off = 0
    if inodes is not None:  # the fast way through a dump: pick the wanted messages at C speed, decode only those
        off, picked = _pick_by_inode(data, inodes)
        for at in picked:
            out.extend(_diag_message(data, at, family))
    while off + _NL_HEADER.size <= len(data):
        length, kind = _NL_HEADER.unpack_from(data, off)[:2]
        if length < _NL_HEADER.size:
            raise OSError('malformed sock_diag answer')
        if kind == _NLMSG_DONE:
            return out, True
        if kind == _NLMSG_ERROR:
            err = struct.unpack_from('=i', data, off + _NL_HEADER.size)[0]
            raise OSError(-err, os.strerror(-err) if err else 'sock_diag error')
        if length >= _NL_HEADER.size + _DIAG_MSG.size and (
            inodes is None or _U32.unpack_from(data, off + _INODE_AT)[0] in inodes
        ):
            out.extend(_diag_message(data, off, family))
        off += (length + 3) & ~3
    return out, False


def _diag_message(data: bytes, off: int, family: int | None) -> list[TcpSocket]:
    """The socket of the answer message at off: [] or [one TcpSocket]."""
    msg = _DIAG_MSG.unpack_from(data, off + _NL_HEADER.size)
    if msg[0] not in (socket.AF_INET, socket.AF_INET6) or (family is not None and msg[0] != family):
        return []
    return [TcpSocket(_diag_addr(msg[0], msg[6], msg[4]), _diag_addr(msg[0], msg[7], msg[5]), f'{msg[1]:02X}', msg[12])]


def _pick_by_inode(data: bytes, inodes: Container[int]) -> tuple[int, list[int]]:
    """(where the rest starts, [offsets of the messages with a wanted inode]) for the leading run of messages of one length.

    A dump's socket messages all have one length (same attributes); the run ends before the first
    message of another length (NLMSG_DONE, an error), which the caller reads the slow way.
    """
    if len(data) < _INODE_AT + 4:
        return 0, []
    length, kind = _NL_HEADER.unpack_from(data)[:2]
    step = (length + 3) & ~3
    if kind != _SOCK_DIAG_BY_FAMILY or length < _NL_HEADER.size + _DIAG_MSG.size:
        return 0, []
    record = struct.Struct(f'=IH{_INODE_AT - 6}xI{step - _INODE_AT - 4}x')
    picked = []
    records = len(data) // step
    for index, (size, what, inode) in enumerate(record.iter_unpack(memoryview(data)[: records * step])):
        if size != length or what != kind:
            return index * step, picked
        if inode in inodes:
            picked.append(index * step)
    return records * step, picked


def parse_diag_listeners(data: bytes, family: int) -> tuple[list[tuple[str, int, int]], bool]:
    """[(ip, port, inode)] of the LISTEN sockets in a sock_diag dump answer, and whether it is complete.

    Raises OSError for a netlink error message (no inet_diag in this kernel, a filter refusing it).
    """
    socks, done = parse_diag(data, family=family)
    return [(s.local[0], s.local[1], s.inode) for s in socks if s.state == _LISTEN], done


def _diag_ask(
    family: int, states: int, sockid: bytes | None = None, inodes: Container[int] | None = None
) -> list[TcpSocket] | None:
    """Ask sock_diag in this process's network namespace; None when it cannot be asked.

    Without sockid: a dump of the sockets in states (a bit mask of TCP states), the kernel walking only
    the tables of those states. With sockid (an inet_diag_sockid): the one socket the kernel's own
    lookup finds for it, as for an arriving packet (no table walk); [] when there is none.
    """
    try:
        sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | getattr(socket, 'SOCK_CLOEXEC', 0), _NETLINK_SOCK_DIAG
        )
    except (OSError, AttributeError):
        return None
    try:
        request = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, states)
        if sockid is not None:
            request = request[:8] + sockid
        flags = _NLM_F_REQUEST if sockid is not None else _NLM_F_REQUEST_DUMP
        sock.settimeout(2.0)
        sock.sendall(_NL_HEADER.pack(_NL_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, flags, 1, 0) + request)
        out = []
        while True:
            data = sock.recv(1 << 17)
            if not data:
                return None
            try:
                part, done = parse_diag(data, inodes)
            except OSError as exc:
                if sockid is not None and exc.errno == errno.ENOENT:
                    return []
                raise
            out.extend(part)
            if done or sockid is not None:  # a lookup answers with one message, a dump ends with NLMSG_DONE
                return out
    except OSError:
        return None
    finally:
        sock.close()


def _diag_listeners(family: int) -> list[tuple[str, int, int]] | None:
    """LISTEN TCP sockets of this process's network namespace through sock_diag, or None when it cannot be asked."""
    found = _diag_ask(family, 1 << _TCP_LISTEN_STATE)
    return None if found is None else [(s.local[0], s.local[1], s.inode) for s in found if s.state == _LISTEN]


def diag_lookup(local: Address, remote: Address) -> list[TcpSocket] | None:
    """The TCP socket local -> remote in this process's network namespace, by the kernel's hash lookup.

    [] when there is none (the lookup may also answer with the listener of local: it is dropped here),
    None when sock_diag cannot be asked (then the tables must be read).
    """
    family = socket.AF_INET6 if ':' in local[0] or ':' in remote[0] else socket.AF_INET
    try:
        src, dst = (socket.inet_pton(family, ip).ljust(16, b'\0') for ip in (local[0], remote[0]))
    except (OSError, ValueError):
        return None
    sockid = struct.pack('!HH', local[1], remote[1]) + src + dst + struct.pack('=III', 0, _NOCOOKIE, _NOCOOKIE)
    found = _diag_ask(family, 1 << _TCP_ESTABLISHED_STATE, sockid)
    return None if found is None else [s for s in found if s.local == local and s.remote == remote]


def diag_sockets_of(inodes: Container[int]) -> list[TcpSocket] | None:
    """The LISTEN and ESTABLISHED TCP sockets of this namespace whose inode is in inodes (one process's), or None."""
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        found = _diag_ask(family, (1 << _TCP_LISTEN_STATE) | (1 << _TCP_ESTABLISHED_STATE), inodes=inodes)
        if found is None:
            return None
        out.extend(found)
    return out


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
                tuples: list[dict[str, str]] = []  # the original tuple, then the reply tuple; each starts at src=
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


def _who(pid: int, proc: str) -> str:
    return f'{read_comm(pid, proc) or "?"} (pid {pid})'


class _Tracer:
    """One look at the host, to follow TCP connections to their other end.

    Read lazily, and each thing once per look: this namespace's sockets come from sock_diag (a hash
    lookup of the exact 4-tuple, a dump filtered to one process's inodes), other namespaces' from
    their tables, and only when the connection left this one; a socket's owner is searched with the
    likely processes first (the port's holder, a listener's owner's children) and the search
    stops at the first one that has it, unless that one leads nowhere.
    """

    def __init__(self, proc: str) -> None:
        self.proc = proc
        self.own_ns = netns_inode('self', proc)
        self.pids = sorted(list_pids(proc))
        self.hints: list[int] = []  # processes likely to own the sockets (the port's holder): read first
        self.comms: dict[int, str | None] = {}
        self._read: list[int] = []  # the pids whose descriptors were read, in that order
        self._cursor = 0  # how far the walk in pid order got
        self.diag = proc == '/proc'  # sock_diag answers for this process's own namespace only
        self._ns_pids: dict[int, list[int]] | None = None
        self._tables: dict[int | None, list[TcpSocket]] = {}
        self._inodes: dict[int, set[int]] = {}
        self._listeners: dict[int, set[int]] | None = None
        self.unreadable_ns = 0

    @property
    def ns_pids(self) -> dict[int, list[int]]:
        """The pids of every network namespace (one stat per process: only when the connection left this one)."""
        if self._ns_pids is None:
            self._ns_pids = {}
            for pid in self.pids:
                ns = netns_inode(pid, self.proc)
                if ns is not None:
                    self._ns_pids.setdefault(ns, []).append(pid)
        return self._ns_pids

    def comm(self, pid: int) -> str | None:
        if pid not in self.comms:
            self.comms[pid] = read_comm(pid, self.proc)
        return self.comms[pid]

    def inodes(self, pid: int) -> set[int]:
        """A process's socket inodes, read once per look."""
        if pid not in self._inodes:
            self._inodes[pid] = socket_inodes(pid, self.proc)
            self._read.append(pid)
        return self._inodes[pid]

    def _walk(self) -> Iterator[int]:
        """Every process once: those already read first, then the others in pid order.

        One walk serves every search of a look: a search stops at its first owner, and the next one
        reads only the processes no search has read yet.
        """
        done = 0
        while True:
            if done < len(self._read):
                done += 1
                yield self._read[done - 1]
            elif self._cursor < len(self.pids):
                self._cursor += 1
                self.inodes(self.pids[self._cursor - 1])
            else:
                return

    def first_holder(self, inodes: Iterable[int]) -> int | None:
        """The first process found with one of these sockets open (the listener's holder), or None.

        Three steps, each only when the one before found nothing: a few milliseconds of the walk in pid
        order (long-lived servers and forwarders are usually older than the load around them); the
        tritonservers, by name (one small read per process, what the listener path always did); the rest
        of the walk.
        """
        wanted = set(inodes)
        deadline = time.monotonic() + PROBE_SECONDS
        for pid in self.pids:
            if time.monotonic() > deadline:
                break
            if fd_count(pid, self.proc) <= PROBE_MAX_FDS and self.inodes(pid) & wanted:
                return pid
        self.hints = [pid for pid in self.pids if self.comm(pid) in SERVER_COMMS]
        for pid in self.hints:
            if self.inodes(pid) & wanted:
                return pid
        for pid in self._walk():
            if self.inodes(pid) & wanted:
                return pid
        return None

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

    def peers(
        self, local: Address, remote: Address, ns: int | None
    ) -> tuple[list[tuple[int | None, TcpSocket]], str | None]:
        """[(ns, socket)] of the other end of the connection local→remote made from namespace ns, and how."""
        found = self._exact(remote, local, ns)
        if found:
            return found, None
        net_dir = self._net_dir(ns)
        for peer_local, peer_remote in conntrack_replies(net_dir, local, remote) if net_dir else []:
            found = self._exact(peer_local, peer_remote, ns)
            if found:
                return found, f'NAT {remote[0]}:{remote[1]} -> {peer_local[0]}:{peer_local[1]}'
        return [], None

    def _in_ns(self, ns: int | None, want_local: Address, want_remote: Address) -> list[tuple[int | None, TcpSocket]]:
        socks = diag_lookup(want_local, want_remote) if self.diag and ns == self.own_ns else None
        if socks is None:
            socks = self.table(ns)
        return [(ns, s) for s in socks if s.local == want_local and s.remote == want_remote and s.state == _ESTABLISHED]

    def _exact(
        self, want_local: Address, want_remote: Address, origin: int | None
    ) -> list[tuple[int | None, TcpSocket]]:
        """The sockets want_local→want_remote, first in the namespace the connection was made from.

        Found there, it is the other end: its address is local to that namespace, so the connection
        never left it, and no other namespace is read.
        """
        found = self._in_ns(origin, want_local, want_remote)
        if found:
            return found
        out = []
        for ns in self.namespaces():
            if ns != origin:
                out.extend(self._in_ns(ns, want_local, want_remote))
        return out

    def _listener_inodes(self, port: int) -> set[int]:
        """Inodes of this namespace's listening sockets on port (sock_diag: the listening table only)."""
        if self._listeners is None:
            self._listeners = {}
            if self.diag:
                for family in (socket.AF_INET, socket.AF_INET6):
                    for _ip, p, ino in _diag_listeners(family) or ():
                        self._listeners.setdefault(p, set()).add(ino)
        return self._listeners.get(port, set())

    def owners(self, ns: int | None, sock: TcpSocket) -> Iterator[int]:
        """Pids that have the socket of namespace ns open (a forwarder may hold it from another one), likely ones first.

        The order only changes how soon an owner is found, never which: the hints first, then every
        process in pid order; a process holding the listener of the socket's port (a forking forwarder's
        parent) sends its children to the front. Descriptors read earlier in the look may predate the
        socket (a forwarder connects onward after it accepted): the hints are read again at once, the
        other processes only when no owner is found.
        """
        listeners = self._listener_inodes(sock.local[1]) if ns == self.own_ns else set()
        before = set(self._read)
        # another namespace's processes are known by then (its table was read): only those
        pool = iter(self.ns_pids.get(ns, [])) if ns != self.own_ns else self._walk()
        stale: list[int] = []
        found = False
        for again in (False, True):
            pending = list(reversed(self.hints))
            seen: set[int] = set()
            while True:
                pid = pending.pop() if pending else next(pool, None)
                if pid is None:
                    break
                if pid in seen:
                    continue
                seen.add(pid)
                if again or (pid in before and pid in self.hints):  # the likely owners are read again at once
                    self._inodes[pid] = socket_inodes(pid, self.proc)
                elif pid in before:
                    stale.append(pid)
                mine = self.inodes(pid)
                if sock.inode in mine:
                    # an owner may live in another network namespace than its socket: rootless podman's rootlessport
                    # holds the host's listening socket (made there, passed to it) from the container's namespace
                    found = True
                    yield pid
                elif listeners & mine:
                    pending.extend(reversed(child_pids(pid, self.proc)))
            if found or not stale:
                return
            pool = iter(stale)

    def outgoing(self, ns: int | None, pid: int, skip_inode: int) -> list[TcpSocket]:
        """The established connections a forwarder opened itself: not the accepted ones (on its listening ports)."""
        mine = self.inodes(pid)
        table = diag_sockets_of(mine) if self.diag and ns == self.own_ns else None
        if table is None:
            table = self.table(ns)
        listening_ports = {s.local[1] for s in table if s.state == _LISTEN and s.inode in mine}
        return [
            s
            for s in table
            if s.inode in mine
            and s.inode != skip_inode
            and s.state == _ESTABLISHED
            and s.local[1] not in listening_ports
        ]


class _Trace:
    """The search from one connection: every tritonserver reached, with the way to it, or why none."""

    def __init__(self, tracer: _Tracer, max_hops: int) -> None:
        self.tracer = tracer
        self.max_hops = max_hops
        self.servers: dict[int, str] = {}  # pid -> located_by
        self.dead_ends: list[str] = []  # why a branch ended without a server
        self.transient = False

    def follow(self, local: Address, remote: Address, ns: int | None, via: list[str], hop: int) -> None:
        peers, nat = self.tracer.peers(local, remote, ns)
        if not peers:
            self.dead_ends.append(
                f'no process on this host owns the other end of the connection '
                f'{local[0]}:{local[1]} -> {remote[0]}:{remote[1]}{_via(via, " (via {})")}'
            )
            self.transient = True
            return
        step = list(via) + ([nat] if nat else [])
        for peer_ns, sock in peers:
            if sock.inode == 0:
                self.transient = True  # accepted by the kernel, not yet by the process: no inode yet
                continue
            owned = False
            for pid in self.tracer.owners(peer_ns, sock):
                owned = True
                if self._owner(pid, peer_ns, sock, step, hop):
                    break  # the socket's other holders (a forking forwarder's parent) forward nothing further
            if not owned:
                self.dead_ends.append(
                    f'the process owning {sock.local[0]}:{sock.local[1]} in network namespace {peer_ns} '
                    'could not be read'
                )
                self.transient = True  # or it was forked (a forwarder's child) after the processes were listed

    def _owner(self, pid: int, ns: int | None, sock: TcpSocket, via: list[str], hop: int) -> bool:
        """Follow one owner of the socket; True when it is a server or forwards the connection onward."""
        comm = self.tracer.comm(pid)
        who = f'{comm or "?"} (pid {pid})'
        if comm in SERVER_COMMS:
            where = (
                '' if ns == self.tracer.own_ns else f' at {sock.local[0]}:{sock.local[1]} in another network namespace'
            )
            self.servers.setdefault(pid, f'connection {_via(via, "via {} ")}to tritonserver (pid {pid}){where}')
            return True
        if hop >= self.max_hops:
            self.dead_ends.append(f'gave up after {hop} forwarding hops at {who}')
            return False
        # a forwarder connects onward from its own network namespace (rootlessport: the container's), which need not
        # be its accepted socket's
        own = netns_inode(pid, self.tracer.proc)
        ns = own if own is not None else ns
        onward = self.tracer.outgoing(ns, pid, sock.inode)
        if not onward:
            self.dead_ends.append(
                f'{who} accepts the connection but is not tritonserver and forwards it nowhere visible'
            )
            self.transient = True  # a forwarder may not have connected onward yet
            return False
        for out in onward:
            self.follow(out.local, out.remote, ns, list(via) + [who], hop + 1)
        return True


def _via(via: list[str], template: str) -> str:
    """The forwarders a connection went through, in template ('via {} '), or '' when it went straight."""
    return template.format(', '.join(via)) if via else ''


def _listening_inodes(host: str, port: int, proc: str) -> list[int]:
    """Inodes of the sockets listening on port for host in this namespace (none: the port is not held here)."""
    addrs = _resolve(host) | {_plain_ip(host)}
    wildcard = {'0.0.0.0', '::'}
    inodes: list[int] = []
    # read the URL's family first, the other only if needed
    for family in ('tcp6', 'tcp') if any(':' in a for a in addrs) else ('tcp', 'tcp6'):
        inodes = [
            ino
            for ip, p, ino in listening_sockets(f'{proc}/net', (family,))
            if p == port and (ip in addrs or ip in wildcard)
        ]
        if inodes:
            break
    return inodes


class _Holder(NamedTuple):
    """The listening socket's answer: the server when a tritonserver holds it, else why not (None: nobody here)."""

    location: Location
    pid: int | None  # the process holding the port when it is not tritonserver (a forwarder, most likely)


def _holder(tracer: _Tracer, inodes: list[int], host: str, port: int) -> _Holder:
    pid = tracer.first_holder(inodes) if inodes else None
    if pid is None:
        return _Holder(Location.not_found(None), None)
    if tracer.comm(pid) in SERVER_COMMS:
        return _Holder(
            Location.found(pid, f'listener: tritonserver (pid {pid}) owns the listening socket {host}:{port}'), None
        )
    return _Holder(
        Location.not_found(f'port {port} on {host} is held by {_who(pid, tracer.proc)}, not by a tritonserver process'),
        pid,
    )


def _by_listener(host: str, port: int, proc: str) -> Location:
    """The fast path: a tritonserver in this network namespace owns the listening socket.

    Not found: the reason names the program holding the port when another one does, else it is None.
    """
    return _holder(_Tracer(proc), _listening_inodes(host, port, proc), host, port).location


class _Followed(NamedTuple):
    """What following a connection gave: the Location, the listener's answer, and whether it connected at all."""

    location: Location
    held: str | None
    connected: bool


def _by_connection(host: str, port: int, proc: str, timeout: float, max_hops: int, attempts: int) -> Location:
    """Open a TCP connection to host:port and follow it to the tritonserver at its other end."""
    return _follow(host, port, proc, timeout, max_hops, attempts, []).location


def _follow(
    host: str, port: int, proc: str, timeout: float, max_hops: int, attempts: int, listening: list[int]
) -> _Followed:
    """Connect, then in each look: the listening socket's holder first, then the connection to its other end.

    Connecting first makes one walk over the processes' descriptors answer both: the listener's holder
    (a forwarder) is where the connection most likely went, so its descriptors are read first.
    """
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return _Followed(
            Location.not_found(f'cannot open a TCP connection to {host}:{port} to follow it to the server: {exc}'),
            None,
            False,
        )
    held = None
    try:
        local = sock.getsockname()[:2]
        remote = sock.getpeername()[:2]
        local, remote = (_plain_ip(local[0]), local[1]), (_plain_ip(remote[0]), remote[1])
        # a just-accepted socket has no inode yet, a forking forwarder's child may not be listed yet: look again
        backoff = Backoff(attempts=attempts, first=0.02, cap=0.3)
        quick = list(QUICK_LOOKS)
        while True:
            started = time.monotonic()
            tracer = _Tracer(proc)
            if listening:
                holder = _holder(tracer, listening, host, port)
                if holder.location.pid is not None:
                    return _Followed(holder.location, None, True)
                held = holder.location.reason or held
                # the port's holder first, then the tritonservers when they had to be found by name
                tracer.hints = ([] if holder.pid is None else [holder.pid]) + tracer.hints
            trace = _Trace(tracer, max_hops)
            trace.follow(local, remote, tracer.own_ns, [], 0)
            if trace.servers or not trace.transient:
                break
            if quick and time.monotonic() - started < 0.02:  # a forwarder connects onward within milliseconds
                time.sleep(quick.pop(0))
                continue
            if not backoff.wait():
                break
    finally:
        sock.close()
    if len(trace.servers) == 1:
        pid, path = next(iter(trace.servers.items()))
        return _Followed(Location.found(pid, path), held, True)
    if trace.servers:
        paths = '; '.join(trace.servers[p] for p in sorted(trace.servers))
        return _Followed(
            Location.not_found(
                f'connections to {host}:{port} lead to several tritonserver processes ({paths}), '
                f'as through a load balancer: the one serving this URL cannot be told; {FIX_HINT}'
            ),
            held,
            True,
        )
    reasons = list(dict.fromkeys(trace.dead_ends))
    if tracer.unreadable_ns:
        reasons.append(f'{tracer.unreadable_ns} network namespace(s) could not be read (not root?)')
    return _Followed(
        Location.not_found('; '.join(reasons) or f'the connection to {host}:{port} could not be followed'), held, True
    )


def shared_port(host: str, port: int, proc: str, listening: list[int]) -> str | None:
    """Why the port cannot name one server when distinct processes listen on it (SO_REUSEPORT), else None.

    Triton's --reuse-http-port (and --reuse-grpc-port) let several servers listen on one port: the kernel spreads
    the connections, so the server that answers a call and the one discovery would find can differ. A forked
    child or a thread shares its server's socket (same inode): distinct processes each with their own listening
    socket are distinct servers.
    """
    if len(listening) < 2:
        return None
    tracer = _Tracer(proc)
    wanted = set(listening)
    owners = {}
    for inode in listening:
        pid = tracer.first_holder([inode])
        if pid is not None:
            owners[pid] = tracer.inodes(pid) & wanted
    apart = sorted(p for p in owners if not any(q != p and owners[q] & owners[p] for q in owners))
    if len(owners) < 2 or not apart:
        return None
    who = ', '.join(_who(p, proc) for p in sorted(owners))
    return (
        f'{len(owners)} processes listen on {host}:{port} each with a socket of its own ({who}), as with '
        f"Triton's --reuse-http-port: a call may reach any of them, so one server cannot be judged by another's files"
    )


def find_server(
    host: str, port: int, proc: str = '/proc', timeout: float = 2.0, max_hops: int = MAX_HOPS, attempts: int = 6
) -> Location:
    """Find the tritonserver process serving host:port: its pid and located_by, or the reason it was not found.

    The Location has no shm_dir and no warnings: locate_server adds them. Several processes listening on the port
    (shared_port) are refused: server_pid must say which.
    """
    listening = _listening_inodes(host, port, proc)
    shared = shared_port(host, port, proc, listening)
    if shared is not None:
        return Location.not_found(f'{shared}; set server_pid to the one meant')
    followed = _follow(host, port, proc, timeout, max_hops, attempts, listening)
    if followed.location.pid is not None:
        return followed.location
    reason = followed.held
    if listening and not followed.connected:  # no connection: the listening socket alone
        listener = _by_listener(host, port, proc)
        if listener.pid is not None:
            return listener
        reason = listener.reason
    found = followed.location
    held = f'{reason}, and ' if reason else ''
    return Location.not_found(
        f'{held}the tritonserver process behind {host}:{port} was not found: {found.reason}; {FIX_HINT}'
    )


def locate_server(
    host: str, port: int, base: str, server_pid: int | None = None, shm_dir: str | None = None, proc: str = '/proc'
) -> Location:
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
            warnings.append(
                f'tritonserver process for {base} not found ({reason}): it cannot be told apart from clients, '
                'so every file it maps counts as held'
            )
    elif not os.path.isdir(f'{proc}/{pid}'):
        raise DiscoveryError(
            f'server_pid {pid} (given for {base}) does not exist on this host: no process {pid} is '
            f'listed in {proc} as this module sees it (the server ended or restarted with a new pid, or '
            'the pid was read in another PID namespace, such as inside a container); give the pid of '
            'the tritonserver behind the URL as the host sees it (pgrep -x tritonserver), or leave '
            'server_pid out and let the module find the server from the URL'
        )
    shared = None
    if server_pid:
        shared = shared_port(host, port, proc, _listening_inodes(host, port, proc))
        if shared is not None:
            warnings.append(
                f'{shared}: server_pid {pid} is judged only by the regions whose files it maps itself; '
                'the others are unknown (give each server its own port to judge them all)'
            )
    shm_root = None
    if shm_dir is None and pid is not None:
        shm_root = f'{proc}/{pid}/root'
        shm_dir = f'{shm_root}/dev/shm'
        how = f'{how}; shm_dir from /proc/{pid}/root'
    elif shm_dir is not None:
        how = (how + '; ' if how else '') + 'shm_dir given'
    return Location(pid, shm_dir, how, warnings, reason, shared, shm_root)
