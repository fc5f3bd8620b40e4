# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who holds which file.

Private to the tritonops.shm collection.

Holders are found in one pass over /proc/*/maps and /proc/*/fd, matching
files by (st_dev, st_ino), so a client in another mount namespace, or a file
renamed or unlinked since, is still matched. The cost is one read of each
process's maps and fd table, whatever the number of files. Per process, scan()
runs the maps pass (maps_holding), the fds pass (fds_holding) and, when either
could not be read, the unreadable-process rule (unreadable_counts).

A process whose maps or fds cannot be read is *unreadable*. It makes the scan
incomplete (so nothing may be called stale) unless its own mount namespace
provably cannot reach the shm filesystem: its /proc/PID/mountinfo, which every
user may read, lists no mount of that device. That rule keeps the fail-safe for
the cases it exists for (module not run as root, another user's client in the
server's namespace) without letting an unrelated, more privileged process such
as a sandbox's init make every region unknown.

/proc/PID/fd is the fd table of the process's main thread. A thread that made its own
(unshare(CLONE_FILES)) holds files that table does not show: a process with more than one
thread (the link count of /proc/PID/task, one stat) has its threads' tables compared with the
main thread's (kcmp(KCMP_FILES)), and each table that differs is read as well (other_fd_tables).

A thread-group leader that has exited (pthread_exit in main) leaves /proc/PID/maps empty and /proc/PID/fd
bare while its other threads run: their views, under /proc/PID/task/TID/, are read instead
(procfs.read_maps, other_fd_tables). When none of them can be read, the process is unreadable.

Not seen, by any /proc reader: a descriptor in flight in a unix socket (SCM_RIGHTS sent, not yet
received) belongs to no process until it is received.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Collection, Iterable

from ansible_collections.tritonops.shm.plugins.module_utils.host.containers import identity
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import (
    list_pids,
    pid_namespace,
    read_comm,
    read_maps,
)
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import (
    other_tasks as procfs_other_tasks,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import (
    INITIAL,
    OTHER,
    FileKey,
    HolderScan,
    Visibility,
)


def dev_maps_str(dev: int) -> str:
    """st_dev as printed in /proc/PID/maps: hex major:minor, at least two digits each."""
    return f'{os.major(dev):02x}:{os.minor(dev):02x}'


def dev_mountinfo_str(dev: int) -> str:
    """st_dev as printed in /proc/PID/mountinfo: decimal major:minor."""
    return f'{os.major(dev)}:{os.minor(dev)}'


def visibility(proc: str = '/proc', clients_share_pid_namespace: bool = False) -> Visibility:
    """The visibility rule: complete in the host's initial PID namespace, or when the operator states that every
    client runs in the module's own PID namespace (clients_share_pid_namespace); incomplete anywhere else."""
    ns = pid_namespace(proc)
    if ns.initial:
        return Visibility(INITIAL, True, None, clients_share_pid_namespace)
    if clients_share_pid_namespace:
        return Visibility(OTHER, True, None, True)
    return Visibility(
        OTHER,
        False,
        (
            f"the module runs outside the host's initial PID namespace ({ns.detail}): in a container or a pod without "
            "hostPID, clients in other containers' PID namespaces are invisible and a live client's region would look "
            'stale. Run it on the host, or through the node agent (docs/kubernetes.md), or set clients_share_pid_namespace: '
            'true if every client of the server runs in this same PID namespace'
        ),
        False,
    )


def proc_hidepid(proc: str = '/proc') -> str | None:
    """The hidepid mount option of /proc when it hides processes from us, else None."""
    if os.geteuid() == 0:
        return None
    try:
        with open(f'{proc}/self/mountinfo') as f:
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


def fd_counts(proc: str = '/proc') -> bool:
    """Whether the size of /proc/PID/fd is the number of open descriptors (Linux >= 6.2), checked on ourselves.

    The listing holds one descriptor of its own while it reads the directory. Another thread of this process may
    open or close one between the stat and the listing, so three tries: before 6.2 the size is always 0, so a
    match can only mean the kernel counts.
    """
    fd_dir = f'{proc}/self/fd'
    for _attempt in range(3):
        try:
            count = os.stat(fd_dir).st_size
            if count > 0 and count == len(os.listdir(fd_dir)) - 1:
                return True
        except OSError:
            return False
    return False


_FD_NAMES = [str(i) for i in range(1024)]


def _open_fds(fd_dir: str, counted: bool = False) -> dict[str, os.stat_result]:
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
            out = {top: os.stat(fd_dir + top)}  # a gap usually shows at the top: test it first
            for name in _FD_NAMES[: count - 1]:
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


_KCMP_FILES = 2
_SYS_KCMP = {'x86_64': 312, 'aarch64': 272, 'ppc64le': 354, 's390x': 343, 'i686': 349, 'armv7l': 378}
_KCMP: list = []


def _kcmp_files(pid: int, tid: int) -> int | None:
    """0 when task tid shares process pid's fd table, another number when not, None when kcmp cannot tell."""
    if not _KCMP:
        number = _SYS_KCMP.get(platform.machine())
        try:
            _KCMP.append((ctypes.CDLL(None, use_errno=True).syscall, number) if number else None)
        except (OSError, AttributeError):
            _KCMP.append(None)
    if _KCMP[0] is None:
        return None
    syscall, number = _KCMP[0]
    result = syscall(number, pid, tid, _KCMP_FILES, 0, 0)
    return None if result < 0 else result


def other_fd_tables(proc: str, pid: int) -> list[str]:
    """The fd directories (``PROC/PID/task/TID/fd/``) of a process's threads whose fd table is not the main thread's.

    One stat for a process with one thread (procfs.other_tasks); the threads of others are compared with
    kcmp(KCMP_FILES), and every thread's table is read when kcmp cannot tell (not built into the kernel). A leader
    that has exited has no table (its /proc/PID/fd is bare): kcmp never finds it equal to a live thread's, so every
    live thread's table is read then.
    """
    return [f'{proc}/{pid}/task/{tid}/fd/' for tid in procfs_other_tasks(pid, proc) if _kcmp_files(pid, tid) != 0]


def parse_deleted(data: bytes, path_prefix: str = '/dev/shm/') -> dict[str, FileKey]:
    """{name: (dev, ino)} of the files under path_prefix that a maps text (bytes) shows mapped although unlinked.

    One file per name (the last mapped): parse_deleted_all gives every one.
    """
    return {name: keys[-1] for name, keys in parse_deleted_all(data, path_prefix).items()}


def parse_deleted_all(data: bytes, path_prefix: str = '/dev/shm/') -> dict[str, list[FileKey]]:
    """{name: [(dev, ino), ...]} of the files under path_prefix a maps text (bytes) shows as " (deleted)", in map order.

    A name can stand for several files (a file unlinked, another made under its name and mapped too), and a
    file literally named "k (deleted)" prints as the unlinked "k": the caller tells them apart by (dev, ino)
    (facts.Snapshot.unlinked).
    """
    out: dict[str, list[FileKey]] = {}
    prefix = os.fsencode(path_prefix)
    suffix = b' (deleted)'
    if suffix not in data:
        return out
    for line in data.split(b'\n'):
        if not line.endswith(suffix):
            continue
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith(prefix):
            name = os.fsdecode(fields[5][len(prefix) : -len(suffix)])
            major, minor = fields[3].split(b':')
            key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
            keys = out.setdefault(name, [])
            if key not in keys:
                keys.append(key)
    return out


class Targets:
    """The files one scan looks for, keyed by (dev, ino), and their devices as maps and mountinfo print them."""

    __slots__ = ('keys', 'devs', 'map_devs', 'needle', 'needles', 'mount_devs')

    def __init__(self, keys: Iterable[FileKey]) -> None:
        self.keys = set(keys)
        self.devs = {dev for dev, _ino in self.keys}
        self.map_devs = {dev_maps_str(d).encode('ascii'): d for d in self.devs}
        # the device field of a maps line, with its separating spaces: a cheap test before parsing any line
        self.needles = [b' ' + k + b' ' for k in self.map_devs]
        self.needle = self.needles[0] if len(self.needles) == 1 else None  # the usual case: one shm filesystem
        self.mount_devs = {dev_mountinfo_str(d) for d in self.devs}


_NONE: frozenset[FileKey] = frozenset()


def maps_holding(data: bytes, targets: Targets) -> set[FileKey] | frozenset[FileKey]:
    """The maps pass: the targets a process's maps text (bytes) shows mapped, whatever their path says."""
    needle = targets.needle
    if not data or ((needle not in data) if needle is not None else not any(n in data for n in targets.needles)):
        return _NONE
    map_devs, keys = targets.map_devs, targets.keys
    found = set()
    for line in data.split(b'\n'):
        fields = line.split(None, 5)
        if len(fields) >= 5 and fields[3] in map_devs:
            key = (map_devs[fields[3]], int(fields[4]))
            if key in keys:
                found.add(key)
    return found


def fds_holding(fds: Iterable[os.stat_result], targets: Targets) -> set[FileKey] | frozenset[FileKey]:
    """The fds pass: the targets among a process's open files (the stats of its /proc/PID/fd entries)."""
    devs = targets.devs
    found = {(st.st_dev, st.st_ino) for st in fds if st.st_dev in devs}
    return found & targets.keys if found else _NONE


def unreadable_counts(pid: int, mount_devs: Collection[str], proc: str = '/proc') -> bool:
    """The unreadable-process rule: whether a process whose maps or fds could not be read blocks "stale".

    It does when its mount namespace has a mount of one of mount_devs (mountinfo's decimal major:minor),
    or when that cannot be told; a process gone meanwhile does not.
    """
    try:
        with open(f'{proc}/{pid}/mountinfo') as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    for line in data.splitlines():
        fields = line.split(None, 3)
        if len(fields) >= 3 and fields[2] in mount_devs:
            return True
    return False


def _scan_process(result: HolderScan, pid: int, targets: Targets, proc: str, counted: bool, maps: bytes | None) -> None:
    """Read one process's maps (unless given) and fds, and record what it holds, or that it is unreadable."""
    base = f'{proc}/{pid}'
    denied = False
    if maps is None:
        try:
            maps = read_maps(pid, proc)
        except (FileNotFoundError, ProcessLookupError):
            return  # gone
        except OSError:
            denied = True
            maps = b''
    result.processes += 1
    found = maps_holding(maps, targets)
    try:
        found = found | fds_holding(_open_fds(base + '/fd/', counted).values(), targets)
        for fd_dir in other_fd_tables(proc, pid):
            try:
                found = found | fds_holding(_open_fds(fd_dir).values(), targets)
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended
    except (FileNotFoundError, ProcessLookupError):
        pass
    except OSError:
        denied = True
    if denied:
        if unreadable_counts(pid, targets.mount_devs, proc):
            result.unreadable.append(pid)
        else:
            result.unreadable_ignored.append(pid)
    if found:
        result.comms[pid] = read_comm(pid, proc)
        result.identities[pid] = identity(pid, proc)
        for key in found:
            result.holders.setdefault(key, set()).add(pid)


def scan(
    targets: Iterable[FileKey],
    proc: str = '/proc',
    deleted_of: int | None = None,
    deleted_prefix: str = '/dev/shm/',
    visible: Visibility | None = None,
) -> HolderScan:
    """One pass over every process: who maps or has open each (dev, ino) in targets.

    visible: the visibility rule's answer for proc (visibility()); judged here, with the option off, when not given.
    With deleted_of (the server's pid), the files under deleted_prefix that process maps although
    they were unlinked (see deleted_mappings) are read from the same read of its maps first, kept
    in the result's ``deleted`` and scanned for too.
    """
    result = HolderScan(visible if visible is not None else visibility(proc))
    hide = proc_hidepid(proc)
    if hide:
        result.hidden = True
        result.hidden_reason = (
            f"/proc is mounted with {hide} and the module does not run as root: other users' "
            'processes are invisible, so holders cannot be determined'
        )
    keys = set(targets)
    first: dict[int, bytes] = {}
    if deleted_of is not None:
        try:
            first[deleted_of] = read_maps(deleted_of, proc)
        except OSError:
            pass  # read again, and judged, in the pass itself
        result.deleted_all = parse_deleted_all(first.get(deleted_of, b''), deleted_prefix)
        result.deleted = {name: found[-1] for name, found in result.deleted_all.items()}
        if result.deleted_all:
            result.deleted_bytes = deleted_sizes(deleted_of, first.get(deleted_of, b''), deleted_prefix, proc)
        for found in result.deleted_all.values():
            keys.update(found)
    if not keys:
        return result
    wanted = Targets(keys)
    counted = fd_counts(proc)
    for pid in list_pids(proc):
        _scan_process(result, pid, wanted, proc, counted, first.pop(pid, None))
    return result


def deleted_sizes(pid: int, data: bytes, path_prefix: str = '/dev/shm/', proc: str = '/proc') -> dict[FileKey, int]:
    """{(dev, ino): bytes it occupies} of the unlinked files under path_prefix that pid's maps text (bytes) shows:
    each one's first mapping stat'ed through /proc/PID/map_files/START-END (root only; a file not reachable is left
    out). An unlinked file no longer has a name to stat, yet the memory stays in the filesystem's use until its last
    mapping goes: the memory of a dangling region."""
    out: dict[FileKey, int] = {}
    prefix = os.fsencode(path_prefix)
    for line in data.split(b'\n'):
        if not line.endswith(b' (deleted)'):
            continue
        fields = line.split(None, 5)
        if len(fields) != 6 or not fields[5].startswith(prefix):
            continue
        major, minor = fields[3].split(b':')
        key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
        if key in out:
            continue
        try:
            st = os.stat(f'{proc}/{pid}/map_files/{fields[0].decode("ascii")}')
        except (OSError, UnicodeDecodeError):
            continue
        if (st.st_dev, st.st_ino) == key:
            out[key] = st.st_blocks * 512
    return out


def deleted_mappings(pid: int, path_prefix: str = '/dev/shm/', proc: str = '/proc') -> dict[str, FileKey]:
    """{name: (dev, ino)} of files under path_prefix that pid maps although they were unlinked."""
    try:
        data = read_maps(pid, proc)
    except OSError:
        return {}
    return parse_deleted(data, path_prefix)
