# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One triton_shm_region run at a time per Triton shm directory.

Private to the tritonops.shm collection. Scheduled cleanups and self-healing jobs
overlap on a host now and then; two runs acting on one server at once would both
count the same regions and files. A run that changes a server therefore holds an
exclusive flock(2) on the server's shm directory itself (the directory, opened
read-only: no lock file is created anywhere, inside or outside it) while it plans
and acts. flock works on the inode, so a run on the host (through
/proc/PID/root/dev/shm) and a run inside the container (/dev/shm) exclude each
other. The kernel drops the lock when the process ends, so a killed run never
blocks the next one. A run takes the lock before it reads the server's regions, so a run that had to
wait plans from what the other one left.

Any user who can open the directory (a shm directory is world-readable, mode 1777) can take the
same flock. A run that finds the lock held therefore asks /proc/locks who holds it: it waits only
for a live process whose effective uid is 0 (another root run); a lock held by any other user, or
by a process it cannot see, is not waited for: the run goes on without it, with a warning that
names the holder (squatted()).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable

from ansible_collections.tritonops.shm.plugins.module_utils.errors import LockError
from ansible_collections.tritonops.shm.plugins.module_utils.procfs import Backoff, effective_uid, read_bytes

WAIT_S = 600.0


class ShmDirLock:
    """An exclusive flock on the shm directory path, held until release()."""

    def __init__(
        self,
        path: str,
        wait_s: float = WAIT_S,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.wait_s = wait_s
        self.sleep = sleep
        self.clock = clock
        self.fd: int | None = None
        self.squatter: str | None = None  # why the lock was not waited for (held by another user), when it was not

    def acquire(self) -> bool:
        """Take the lock. Returns True when another run held it (this one waited), False when it was free.

        Raises OSError when the directory cannot be opened, LockError when the lock stays held for wait_s seconds
        (tried again after the whole wait: the last delay may end past it). When the holder is not another root
        run (see squatted()), returns False at once without the lock, with the reason in ``squatter``.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, 'O_CLOEXEC', 0))
        try:
            backoff = Backoff(
                timeout=self.wait_s, first=0.05, cap=0.5, sleep=self.sleep, clock=self.clock, overrun=True
            )
            while not _try_lock(fd):
                st = os.fstat(fd)
                self.squatter = squatted(st.st_dev, st.st_ino)
                if self.squatter is not None:
                    os.close(fd)
                    return False
                if not backoff.wait():
                    raise LockError(
                        f'another tritonops.shm run has held the lock on {self.path} for {self.wait_s}s: '
                        'not acting (it is released when that run ends)'
                    )
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return backoff.waited > 0

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_holders(dev: int, ino: int, proc: str = '/proc') -> list[int]:
    """The pids (as this process sees them, 0 when not visible) that /proc/locks shows holding a lock on (dev, ino)."""
    try:
        data = read_bytes(f'{proc}/locks')
    except OSError:
        return []
    want = f'{os.major(dev):02x}:{os.minor(dev):02x}:{ino}'.encode('ascii')
    out = []
    for line in data.split(b'\n'):
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4711 00:2a:1234 0 EOF"; waiters are "1: -> FLOCK ..."
        if len(fields) >= 6 and fields[1] != b'->' and fields[5] == want:
            try:
                out.append(int(fields[4]))
            except ValueError:
                out.append(0)
    return out


def squatted(dev: int, ino: int, proc: str = '/proc') -> str | None:
    """Why a held lock on (dev, ino) is not another root run's (so not worth waiting for), or None when it may be.

    Only root runs of the modules change anything, so only a live holder with effective uid 0 is waited for.
    A holder this process cannot see (pid 0: another pid namespace, or gone) is not: any user can take the
    flock, and waiting for it would let any user stall every cleanup.
    """
    pids = lock_holders(dev, ino, proc)
    if not pids:
        return None  # released meanwhile, or /proc/locks unreadable: try (and wait) as before
    for pid in pids:
        uid = effective_uid(pid, proc) if pid > 0 else None
        if uid == 0:
            return None
    who = ', '.join(f'pid {p} (uid {effective_uid(p, proc)})' if p > 0 else 'a process not visible here' for p in pids)
    return f'held by {who}, not by a root tritonops.shm run'


def _try_lock(fd: int) -> bool:
    """Take the exclusive flock without waiting: False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True
