# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who holds which file.

Private to the tritonops.shm collection.

Holders are found in one pass over /proc/*/maps and /proc/*/fd, matching
files by (st_dev, st_ino), so a client in another mount namespace, or a file
renamed or unlinked since, is still matched. The cost is one read of each
process's maps and fd table, whatever the number of files.

A process whose maps or fds cannot be read is *unreadable*. It makes the scan
incomplete (so nothing may be called stale) unless its own mount namespace
provably cannot reach the shm filesystem: its /proc/PID/mountinfo, which every
user may read, lists no mount of that device. That rule keeps the fail-safe for
the cases it exists for (module not run as root, another user's client in the
server's namespace) without letting an unrelated, more privileged process such
as a sandbox's init make every region unknown.
"""
from __future__ import annotations

import os

from ansible_collections.tritonops.shm.plugins.module_utils.procfs import list_pids, read_bytes as _read, read_comm  # noqa: F401


def dev_maps_str(dev):
    """st_dev as printed in /proc/PID/maps: hex major:minor, at least two digits each."""
    return '%02x:%02x' % (os.major(dev), os.minor(dev))


def dev_mountinfo_str(dev):
    """st_dev as printed in /proc/PID/mountinfo: decimal major:minor."""
    return '%d:%d' % (os.major(dev), os.minor(dev))


def holders_text(holders):
    """Holders as people read them: '4711 (python), 4712 (tritonserver)'."""
    return ', '.join('%s (%s)' % (h['pid'], h['comm']) for h in holders)


class HolderScan(object):
    """Result of one /proc pass."""

    def __init__(self):
        self.holders = {}        # (dev, ino) -> set(pid)
        self.comms = {}          # pid -> comm
        self.unreadable = []     # pids that could hold a target and could not be read
        self.unreadable_ignored = []  # unreadable pids whose mount namespace cannot see the shm fs
        self.processes = 0
        self.deleted = {}        # name -> (dev, ino): files the server maps although they were unlinked (scan(deleted_of=))
        self.hidden = False      # /proc mounted with hidepid and we are not root
        self.hidden_reason = None

    @property
    def complete(self):
        return not self.unreadable and not self.hidden

    def incomplete_reason(self):
        if self.hidden:
            return self.hidden_reason
        if self.unreadable:
            sample = ', '.join(str(p) for p in sorted(self.unreadable)[:5])
            return ('%d process(es) could not be inspected (pids %s%s): run the module as root (become: true) '
                    'so every holder can be seen' % (len(self.unreadable), sample, ', ...' if len(self.unreadable) > 5 else ''))
        return None

    def holders_of(self, dev, ino, exclude=()):
        pids = self.holders.get((dev, ino))
        if not pids:
            return []
        return [dict(pid=p, comm=self.comms.get(p)) for p in sorted(pids) if p not in exclude]


def proc_hidepid(proc='/proc'):
    """The hidepid mount option of /proc when it hides processes from us, else None."""
    if os.geteuid() == 0:
        return None
    try:
        with open('%s/self/mountinfo' % proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _sep, right = line.partition(' - ')
        fields = left.split()
        if len(fields) >= 5 and fields[4] == proc and right.startswith('proc '):
            for opt in right.split()[-1].split(','):
                if opt.startswith('hidepid=') and opt.split('=', 1)[1] not in ('0', 'off'):
                    return opt
    return None


def _mountinfo_has_dev(pid, devs, proc):
    """True when the process's mount namespace has a mount of one of devs (or we cannot tell)."""
    try:
        with open('%s/%d/mountinfo' % (proc, pid)) as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    for line in data.splitlines():
        fields = line.split(None, 3)
        if len(fields) >= 3 and fields[2] in devs:
            return True
    return False


def fd_counts(proc='/proc'):
    """Whether the size of /proc/PID/fd is the number of open descriptors (Linux >= 6.2), checked on ourselves.

    The listing holds one descriptor of its own while it reads the directory.
    """
    fd_dir = '%s/self/fd' % proc
    try:
        count = os.stat(fd_dir).st_size
        return count > 0 and count == len(os.listdir(fd_dir)) - 1
    except OSError:
        return False


_FD_NAMES = [str(i) for i in range(1024)]


def _open_fds(fd_dir, counted=False):
    """{fd name: stat of the open file} of one process, or raise OSError as os.listdir(fd_dir) does.

    With counted (see fd_counts), when the size of the directory is N and descriptors 0..N-1 all
    exist, they are all of them, and listing the directory (an open, two reads and a close) is
    saved. Anything else (a gap, a descriptor closed meanwhile, no permission) falls back to
    listing it.
    """
    count = 0
    if counted:
        try:
            count = os.stat(fd_dir).st_size
        except OSError:
            count = 0
    if 0 < count <= len(_FD_NAMES):
        top = _FD_NAMES[count - 1]
        try:
            out = {top: os.stat(fd_dir + top)}   # a gap usually shows at the top: test it first
            for name in _FD_NAMES[:count - 1]:
                out[name] = os.stat(fd_dir + name)
            return out
        except OSError:
            pass
    out = {}
    for name in os.listdir(fd_dir):
        # stat follows the fd's magic link to the open file itself (sockets and pipes simply never match)
        try:
            out[name] = os.stat(fd_dir + name)
        except OSError:
            continue
    return out


def parse_deleted(data, path_prefix='/dev/shm/'):
    """{name: (dev, ino)} of the files under path_prefix that a maps text (bytes) shows mapped although unlinked."""
    out = {}
    prefix = os.fsencode(path_prefix)
    suffix = b' (deleted)'
    if suffix not in data:
        return out
    for line in data.split(b'\n'):
        if not line.endswith(suffix):
            continue
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith(prefix):
            name = os.fsdecode(fields[5][len(prefix):-len(suffix)])
            major, minor = fields[3].split(b':')
            out[name] = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
    return out


def scan(targets, proc='/proc', deleted_of=None, deleted_prefix='/dev/shm/'):
    """One pass over every process: who maps or has open each (dev, ino) in targets.

    With deleted_of (the server's pid), the files under deleted_prefix that process maps although
    they were unlinked (see deleted_mappings) are read from the same read of its maps first, kept
    in the result's ``deleted`` and scanned for too.
    """
    result = HolderScan()
    hide = proc_hidepid(proc)
    if hide:
        result.hidden = True
        result.hidden_reason = ('/proc is mounted with %s and the module does not run as root: other users\' '
                                'processes are invisible, so holders cannot be determined' % hide)
    targets = set(targets)
    first = {}
    if deleted_of is not None:
        try:
            first[deleted_of] = _read('%s/%d/maps' % (proc, deleted_of))
        except OSError:
            pass   # read again, and judged, in the pass itself
        result.deleted = parse_deleted(first.get(deleted_of, b''), deleted_prefix)
        targets.update(result.deleted.values())
    if not targets:
        return result
    devs = set(dev for dev, _ino in targets)
    map_devs = dict((dev_maps_str(d).encode('ascii'), d) for d in devs)
    # the device field of a maps line, with its separating spaces: a cheap test before parsing any line
    needles = [b' ' + k + b' ' for k in map_devs]
    needle = needles[0] if len(needles) == 1 else None   # the usual case: one shm filesystem
    mount_devs = set(dev_mountinfo_str(d) for d in devs)
    counted = fd_counts(proc)
    for pid in list_pids(proc):
        base = '%s/%d' % (proc, pid)
        found = set()
        denied = False
        data = first.pop(pid, None)
        if data is None:
            try:
                data = _read(base + '/maps')
            except (FileNotFoundError, ProcessLookupError):
                continue
            except OSError:
                denied = True
                data = b''
        result.processes += 1
        if data and ((needle in data) if needle is not None else any(n in data for n in needles)):
            for line in data.split(b'\n'):
                fields = line.split(None, 5)
                if len(fields) >= 5 and fields[3] in map_devs:
                    key = (map_devs[fields[3]], int(fields[4]))
                    if key in targets:
                        found.add(key)
        try:
            fds = _open_fds(base + '/fd/', counted)
        except (FileNotFoundError, ProcessLookupError):
            fds = {}
        except OSError:
            denied = True
            fds = {}
        for st in fds.values():
            if st.st_dev in devs:
                key = (st.st_dev, st.st_ino)
                if key in targets:
                    found.add(key)
        if denied:
            if _mountinfo_has_dev(pid, mount_devs, proc):
                result.unreadable.append(pid)
            else:
                result.unreadable_ignored.append(pid)
        if found:
            result.comms[pid] = read_comm(pid, proc)
            for key in found:
                result.holders.setdefault(key, set()).add(pid)
    return result


def deleted_mappings(pid, path_prefix='/dev/shm/', proc='/proc'):
    """{name: (dev, ino)} of files under path_prefix that pid maps although they were unlinked."""
    try:
        data = _read('%s/%d/maps' % (proc, pid))
    except OSError:
        return {}
    return parse_deleted(data, path_prefix)
