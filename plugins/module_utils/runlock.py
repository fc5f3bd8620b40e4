# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One triton_shm_region run at a time per Triton server on a host.

Private to the tritonops.shm collection. Scheduled cleanups and self-healing jobs
overlap on a host now and then; two runs acting on one server at once would both
count the same regions and files. A run therefore holds an exclusive flock(2) on
``/run/lock/tritonops-shm-KEY.lock`` (KEY: the server's pid on this host, else its
address) while it plans and acts. The lock lives under /run/lock, never in the shm
directory. The kernel drops it when the process ends, so a killed run never blocks
the next one. A run that had to wait reads the server again before it plans.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time

from ansible_collections.tritonops.shm.plugins.module_utils.shm_fs import ShmFsError

LOCK_DIR = '/run/lock'
WAIT_S = 600.0


class LockError(ShmFsError):
    """The lock could not be taken in time; the message says which and why."""


def lock_key(pid=None, host=None, port=None):
    """The lock name of one server: its pid on this host when known, else host and port."""
    if pid is not None:
        return 'pid-%d' % pid
    return 'addr-%s' % re.sub(r'[^A-Za-z0-9.-]', '_', '%s-%s' % (host, port))


class ServerLock(object):
    """An exclusive flock on LOCK_DIR/tritonops-shm-KEY.lock, held until release()."""

    def __init__(self, key, lock_dir=LOCK_DIR, wait_s=WAIT_S, sleep=time.sleep, clock=time.monotonic):
        self.path = os.path.join(lock_dir, 'tritonops-shm-%s.lock' % key)
        self.wait_s = wait_s
        self.sleep = sleep
        self.clock = clock
        self.fd = None
        self.waited_s = 0.0

    def acquire(self):
        """Take the lock. Returns True when another run held it (this one waited), False when it was free.

        Raises OSError when the lock file cannot be used (no /run/lock, a file of another user,
        a symlink), LockError when it stays held for wait_s seconds.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0), 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise OSError(errno.EPERM, 'not a regular file owned by uid %d' % os.geteuid(), self.path)
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
                    raise LockError('another tritonops.shm run on this host has held %s for %ss: not acting '
                                    '(it is released when that run ends)' % (self.path, self.wait_s))
                self.sleep(delay)
                delay = min(delay * 2, 0.5)
            self.waited_s = self.clock() - start
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return waited

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
