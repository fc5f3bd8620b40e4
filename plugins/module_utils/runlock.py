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

from ansible_collections.tritonops.shm.plugins.module_utils.errors import LockError

WAIT_S = 600.0


class ShmDirLock(object):
    """An exclusive flock on the shm directory path, held until release()."""

    def __init__(self, path, wait_s=WAIT_S, sleep=time.sleep, clock=time.monotonic):
        self.path = path
        self.wait_s = wait_s
        self.sleep = sleep
        self.clock = clock
        self.fd = None

    def acquire(self):
        """Take the lock. Returns True when another run held it (this one waited), False when it was free.

        Raises OSError when the directory cannot be opened, LockError when the lock stays held for wait_s seconds.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, 'O_CLOEXEC', 0))
        try:
            start = self.clock()
            delay = 0.05
            waited = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                waited = True
                if self.clock() - start >= self.wait_s:
                    raise LockError('another tritonops.shm run has held the lock on %s for %ss: not acting '
                                    '(it is released when that run ends)' % (self.path, self.wait_s))
                self.sleep(delay)
                delay = min(delay * 2, 0.5)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return waited

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
