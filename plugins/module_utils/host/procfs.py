# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Raw /proc reads and the one retry-with-backoff helper.

Private to the tritonops.shm collection: no stability promise to other code.
Standard library only. holders.py and discovery.py read /proc through these: the pids, a
process's name, a whole file as bytes, its socket inodes, its children and its network namespace, and
which PID namespace a proc filesystem and the module belong to (pid_namespace).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

_READ_FLAGS = os.O_RDONLY | getattr(os, 'O_CLOEXEC', 0)


def list_pids(proc: str = '/proc') -> list[int]:
    """The pids listed in proc (empty when it cannot be listed)."""
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]


def read_bytes(path: str) -> bytes:
    """The whole content of a /proc file: a raw open and reads to EOF (no decoding, no buffer layer).

    A /proc seq_file read returns at most one buffer, so a short read is not the end of the file.
    Raises OSError as os.open and os.read do.
    """
    fd = os.open(path, _READ_FLAGS)
    try:
        data = os.read(fd, 1 << 17)
        if not data:
            return data
        chunks = [data]
        while True:
            chunk = os.read(fd, 1 << 17)
            if not chunk:
                break
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b''.join(chunks)
    finally:
        os.close(fd)


def other_tasks(pid: int, proc: str = '/proc') -> list[int]:
    """The ids of a process's tasks (threads) other than its thread-group leader; empty when it has one or is gone.

    One stat when the process has a single task: the link count of /proc/PID/task is 2 + its tasks.
    """
    base = f'{proc}/{pid}/task'
    try:
        if os.stat(base).st_nlink <= 3:
            return []
        names = os.listdir(base)
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit() and int(n) != pid]


def read_maps(pid: int, proc: str = '/proc') -> bytes:
    """A process's memory map as its live tasks see it (/proc/PID/maps, else /proc/PID/task/TID/maps).

    A thread-group leader that has exited (pthread_exit in main while other threads run) leaves /proc/PID/maps
    empty, with no error, while its threads go on with the same memory: then the first other task whose view can be
    read and is not empty gives it. Returns b'' for a process with no memory (a kernel thread, every task exiting).
    Raises OSError as read_bytes does when the leader's view cannot be read, and when it is empty while other tasks
    run and none of those views can be read (the process is then unreadable, never empty).
    """
    data = read_bytes(f'{proc}/{pid}/maps')
    if data:
        return data
    denied: OSError | None = None
    for tid in other_tasks(pid, proc):
        try:
            data = read_bytes(f'{proc}/{pid}/task/{tid}/maps')
        except (FileNotFoundError, ProcessLookupError):
            continue  # that thread ended
        except OSError as exc:
            denied = exc
            continue
        if data:
            return data
    if denied is not None:
        raise denied
    return b''


def read_comm(pid: int, proc: str = '/proc') -> str | None:
    """The process name (at most 16 bytes: one read is enough), or None when the process is gone or unreadable."""
    try:
        fd = os.open(f'{proc}/{pid}/comm', _READ_FLAGS)
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode('utf-8', 'replace').strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def start_time(pid: int, proc: str = '/proc') -> int | None:
    """A process's start time (clock ticks after boot, field 22 of /proc/PID/stat), or None when gone or unreadable.

    With the pid it names one process for good: a pid reused later has another start time.
    """
    try:
        data = read_bytes(f'{proc}/{pid}/stat')
        return int(data[data.rindex(b')') + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class Lineage(NamedTuple):
    """What /proc/PID/stat says of where a process comes from: its parent's pid and its own start time."""

    ppid: int
    start: int


def lineage(pid: int, proc: str = '/proc') -> Lineage | None:
    """The Lineage of a process (fields 4 and 22 of /proc/PID/stat, after the comm), or None when gone or unreadable.

    The comm is skipped by the last ')': a process names itself whatever it likes, ') 1 ' included.
    """
    try:
        data = read_bytes(f'{proc}/{pid}/stat')
        fields = data[data.rindex(b')') + 2 :].split()
        return Lineage(int(fields[1]), int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


def uids(pid: int, proc: str = '/proc') -> tuple[int, ...] | None:
    """A process's real, effective, saved and filesystem uids as this process sees them (the Uid: line), or None."""
    try:
        data = read_bytes(f'{proc}/{pid}/status')
    except OSError:
        return None
    for line in data.split(b'\n'):
        if line.startswith(b'Uid:'):
            try:
                return tuple(int(v) for v in line.split()[1:5])
            except ValueError:
                return None
    return None


def effective_uid(pid: int, proc: str = '/proc') -> int | None:
    """A process's effective uid as this process sees it (the Uid: line of /proc/PID/status), or None when gone."""
    found = uids(pid, proc)
    return found[1] if found is not None and len(found) > 1 else None


def read_cmdline(pid: int, proc: str = '/proc') -> list[str] | None:
    """The command line of a process (its arguments), or None when it is gone or unreadable."""
    try:
        data = read_bytes(f'{proc}/{pid}/cmdline')
    except OSError:
        return None
    if not data:
        return None  # a kernel thread, or a process already exiting
    return [a.decode('utf-8', 'replace') for a in data.rstrip(b'\0').split(b'\0')]


def socket_inodes(pid: int | str, proc: str = '/proc') -> set[int]:
    """The inodes of the sockets a process has open (empty when it is gone or unreadable)."""
    base = f'{proc}/{pid}/fd/'
    try:
        fds = os.listdir(base)
    except OSError:
        return set()
    out = set()
    for fd in fds:
        try:
            link = os.readlink(base + fd)
        except OSError:
            continue
        if link.startswith('socket:['):
            out.add(int(link[8:-1]))
    return out


def fd_count(pid: int, proc: str = '/proc') -> int:
    """How many descriptors a process has open, from the size of /proc/PID/fd (Linux >= 6.2; 0 when unknown)."""
    try:
        return os.stat(f'{proc}/{pid}/fd').st_size
    except OSError:
        return 0


def child_pids(pid: int, proc: str = '/proc') -> list[int]:
    """The children of a process's main thread (/proc/PID/task/PID/children), empty when gone or unreadable."""
    try:
        return [int(c) for c in read_bytes(f'{proc}/{pid}/task/{pid}/children').split()]
    except (OSError, ValueError):
        return []


def netns_inode(pid: int | str, proc: str = '/proc') -> int | None:
    """The inode of a process's network namespace (one per namespace), or None when gone or unreadable."""
    try:
        return os.stat(f'{proc}/{pid}/ns/net').st_ino
    except OSError:
        return None


# The inode the kernel gives the host's initial PID namespace (PROC_PID_INIT_INO, include/linux/proc_ns.h):
# fixed, whatever the machine; every other PID namespace gets a dynamic one.
INITIAL_PID_NS_INODE = 0xEFFFFFFC


class PidNamespace(NamedTuple):
    """Which PID namespace the module and the proc filesystem it reads belong to (see pid_namespace)."""

    initial: bool  # both are the host's initial PID namespace
    detail: str  # what was seen, for a reason


def pid_namespace(proc: str = '/proc') -> PidNamespace:
    """Whether the module runs in the host's initial PID namespace and proc is that namespace's proc filesystem.

    Both must hold for a pass over proc to see every process of the machine:
    - ``PROC/self`` resolves to the module's own pid: a proc filesystem shows the pid of its reader as seen from
      the namespace it was mounted for, so it is the module's own (an ancestor's proc shows another number, a
      descendant's none);
    - ``PROC/self/ns/pid`` (stat follows the nsfs link) has the initial namespace's fixed inode 0xEFFFFFFC.
    Anything that cannot be read counts as another namespace.
    """
    try:
        link = os.readlink(f'{proc}/self')
    except OSError as exc:
        return PidNamespace(
            False,
            f'{proc}/self does not resolve ({exc.strerror or exc}): {proc} is not the proc '
            "filesystem of the module's PID namespace",
        )
    own = str(os.getpid())
    if link != own:
        return PidNamespace(
            False,
            f"{proc}/self is {link}, not the module's pid {own}: {proc} belongs to another PID "
            'namespace than the module',
        )
    try:
        inode = os.stat(f'{proc}/self/ns/pid').st_ino
    except OSError as exc:
        return PidNamespace(False, f'{proc}/self/ns/pid cannot be read ({exc.strerror or exc})')
    if inode != INITIAL_PID_NS_INODE:
        return PidNamespace(
            False,
            f"the module's PID namespace is pid:[{inode}], not the host's initial one pid:[{INITIAL_PID_NS_INODE}]",
        )
    return PidNamespace(True, f"the host's initial PID namespace pid:[{INITIAL_PID_NS_INODE}]")


class Backoff:
    """Delays that double from ``first`` up to ``cap``, bounded by a time budget and/or a number of tries.

    The one retry loop of the collection::

        backoff = Backoff(timeout=10, sleep=sleep, clock=clock)
        while not done():
            if not backoff.wait():   # the budget is spent: give up
                break

    With a timeout, wait() refuses a delay that would end past the budget, so the loop gives up
    before it. With ``overrun``, it sleeps while the budget is not yet spent, even when the delay
    ends past it: the loop tries once more after the whole budget has passed, and a give-up means
    the budget really went by (a lock held "for 600 s").
    """

    def __init__(
        self,
        timeout: float | None = None,
        attempts: int | None = None,
        first: float = 0.05,
        cap: float = 1.0,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        overrun: bool = False,
    ) -> None:
        self.sleep = sleep
        self.clock = clock
        self.delay = first
        self.cap = cap
        self.overrun = overrun
        self.deadline = None if timeout is None else clock() + timeout
        self.waits_left = None if attempts is None else attempts - 1
        self.waited = 0

    def wait(self) -> bool:
        """Sleep the next delay and return True; False (without sleeping) when the budget is spent."""
        if self.waits_left is not None and self.waits_left <= 0:
            return False
        if self.deadline is not None:
            now = self.clock()
            if (now >= self.deadline) if self.overrun else (now + self.delay > self.deadline):
                return False
        self.sleep(self.delay)
        self.waited += 1
        if self.waits_left is not None:
            self.waits_left -= 1
        self.delay = min(self.delay * 2, self.cap)
        return True
