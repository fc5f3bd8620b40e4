# -*- coding: utf-8 -*-
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
blocks the next one. A run that had to wait reads the server again before it plans.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time

from collections.abc import Callable

from ansible_collections.tritonops.shm.plugins.module_utils.errors import LockError
from ansible_collections.tritonops.shm.plugins.module_utils.procfs import Backoff

WAIT_S = 600.0


class ShmDirLock:
    """An exclusive flock on the shm directory path, held until release()."""

    def __init__(self, path: str, wait_s: float = WAIT_S, sleep: Callable[[float], object] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.wait_s = wait_s
        self.sleep = sleep
        self.clock = clock
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock. Returns True when another run held it (this one waited), False when it was free.

        Raises OSError when the directory cannot be opened, LockError when the lock stays held for wait_s seconds
        (tried again after the whole wait: the last delay may end past it).
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, 'O_CLOEXEC', 0))
        try:
            backoff = Backoff(timeout=self.wait_s, first=0.05, cap=0.5, sleep=self.sleep, clock=self.clock, overrun=True)
            while not _try_lock(fd):
                if not backoff.wait():
                    raise LockError(f'another tritonops.shm run has held the lock on {self.path} for {self.wait_s}s: '
                                    'not acting (it is released when that run ends)')
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return backoff.waited > 0

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _try_lock(fd: int) -> bool:
    """Take the exclusive flock without waiting: False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True
