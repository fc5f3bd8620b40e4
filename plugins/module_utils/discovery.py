# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""From a Triton URL's (host, port) to the tritonserver process and its shm directory.

Private to the tritonops.shm collection.
"""
from __future__ import annotations

import os
import socket

from ansible_collections.tritonops.shm.plugins.module_utils.holders import list_pids, read_comm

SERVER_COMMS = ('tritonserver',)
_LISTEN = '0A'


class DiscoveryError(Exception):
    """The server_pid or shm_dir given cannot be used."""


def _parse_addr(hexaddr):
    """Address of /proc/net/tcp{,6} 'ADDR:PORT' in hex → (ip string, port)."""
    addr, port = hexaddr.split(':')
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
        ip = socket.inet_ntop(socket.AF_INET6, b''.join(words))
        if ip.startswith('::ffff:') and '.' in ip:
            ip = ip[len('::ffff:'):]
    return ip, int(port, 16)


def listening_sockets(net_dir, families=('tcp', 'tcp6')):
    """[(ip, port, inode)] of LISTEN TCP sockets in a /proc/.../net directory."""
    out = []
    for name in families:
        try:
            with open(os.path.join(net_dir, name)) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            head = line.split(None, 4)  # most sockets are not listening: split the rest only for those that are
            if len(head) == 5 and head[3] == _LISTEN:
                fields = line.split()
                if len(fields) >= 10:
                    ip, port = _parse_addr(fields[1])
                    out.append((ip, port, int(fields[9])))
    return out


def _resolve(host):
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return set()
    return set(i[4][0] for i in infos)


def _socket_owner(inodes, pids, proc):
    wanted = set('socket:[%d]' % i for i in inodes)
    for pid in pids:
        base = '%s/%d/fd' % (proc, pid)
        try:
            fds = os.listdir(base)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(base + '/' + fd) in wanted:
                    return pid
            except OSError:
                continue
    return None


def _netns(pid, proc):
    try:
        return os.stat('%s/%s/ns/net' % (proc, pid)).st_ino
    except OSError:
        return None


def find_server(host, port, proc='/proc'):
    """Find the tritonserver process serving host:port.

    Returns (pid or None, how, reason). ``how`` is 'listener' when the process
    owns the listening socket in our network namespace, 'netns' when it is the
    single tritonserver whose own network namespace listens on the port (the
    port is published by a proxy or NAT, as with container bridge networks).
    """
    addrs = _resolve(host) | set([host])
    wildcard = set(['0.0.0.0', '::'])
    inodes = []
    # /proc/net/tcp{,6} cost milliseconds each to generate: read the URL's family first, the other only if needed
    for family in (('tcp6', 'tcp') if any(':' in a for a in addrs) else ('tcp', 'tcp6')):
        inodes = [ino for ip, p, ino in listening_sockets('%s/net' % proc, (family,))
                  if p == port and (ip in addrs or ip in wildcard)]
        if inodes:
            break
    pids = list_pids(proc)
    servers = []
    for pid in pids:
        if read_comm(pid, proc) in SERVER_COMMS:
            if inodes and _socket_owner(inodes, [pid], proc) == pid:
                return pid, 'listener', None  # the usual case: no need to read every other process's name
            servers.append(pid)
    if inodes:
        known = set(servers)
        owner = _socket_owner(inodes, [p for p in pids if p not in known], proc)
        if owner is not None and read_comm(owner, proc) in SERVER_COMMS:
            return owner, 'listener', None
        via = ('pid %s (%s)' % (owner, read_comm(owner, proc))) if owner else 'an unidentified process'
    else:
        via = None
    my_ns = _netns('self', proc)
    candidates = []
    for pid in servers:
        ns = _netns(pid, proc)
        if ns is None or ns == my_ns:
            continue
        if any(p == port for _ip, p, _ino in listening_sockets('%s/%d/net' % (proc, pid))):
            candidates.append(pid)
    if len(candidates) == 1:
        return candidates[0], 'netns', None
    if len(candidates) > 1:
        return None, None, ('port %d is served by several tritonserver processes in other network namespaces (pids %s); '
                            'set server_pid or shm_dir' % (port, ', '.join(str(c) for c in candidates)))
    if via:
        return None, None, 'port %d on %s is held by %s, not by a tritonserver process; set server_pid or shm_dir' % (port, host, via)
    return None, None, ('no local process listens on %s:%d and no tritonserver network namespace does: the server is remote or '
                        'not visible from here; set server_pid or shm_dir' % (host, port))


def locate_server(host, port, base, server_pid=None, shm_dir=None, proc='/proc'):
    """Decide the server pid and the shm directory: (pid, shm_dir, how, warnings)."""
    warnings = []
    pid = server_pid
    how = 'server_pid' if server_pid else None
    if pid is None:
        pid, how, reason = find_server(host, port, proc=proc)
        if pid is None and shm_dir is None:
            warnings.append('tritonserver process for %s not found (%s): file and holder data are missing' % (base, reason))
        elif pid is None:
            warnings.append('tritonserver process for %s not found (%s): it cannot be told apart from clients, '
                            'so every file it maps counts as held' % (base, reason))
    elif not os.path.isdir('%s/%d' % (proc, pid)):
        raise DiscoveryError('server_pid %d (given for %s) does not exist on this host' % (pid, base))
    if shm_dir is None and pid is not None:
        shm_dir = '%s/%d/root/dev/shm' % (proc, pid)
        how = '%s; shm_dir from /proc/%d/root' % (how, pid)
    elif shm_dir is not None:
        how = (how + '; ' if how else '') + 'shm_dir given'
    return pid, shm_dir, how, warnings
