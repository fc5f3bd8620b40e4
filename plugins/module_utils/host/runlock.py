# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One triton_shm_region run at a time per Triton shm directory.

Private to the tritonops.shm collection. Scheduled cleanups and self-healing jobs overlap on a host now and then; two
runs acting on one server at once would both count the same regions and files. A run that changes a server therefore
holds an exclusive flock(2) while it reads, plans and acts. The kernel drops a flock when its process ends, so a killed
run never blocks the next one. A run takes the lock before it reads the server's regions, so a run that had to wait
plans from what the other one left.

**Where the lock is (no lock a tenant can hold hostage).** The lock is a file of a directory only this run's user can
write: for root, LOCK_DIR (/run/tritonops_shm, mode 0700), one file per shm directory, named for the directory's
device and inode (``shm-MAJOR-MINOR-INODE.lock``: two servers that share one /dev/shm share one lock; the files are
empty, and /run is emptied at boot). Only root can open it, so only another root run can hold it, and that one is
waited for (WAIT_S). The lock was the shm directory itself before (0.2.0): every tenant of a server's /dev/shm (mode
1777, a pod's sidecar, a container started with --ipc=container:) can open that directory and flock it, and a uid-0
process of another PID namespace holding it stalled every cleanup of that server for 600 s, then failed it.

The shm directory's own flock is still tried once, never waited for: runs of 0.2.0 took it, and so does a run inside
the server's container (whose /run is its own). When another process holds it, the run goes on under its own lock,
with a warning that names the holder (``ServerLock.squatter``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable

from ansible_collections.tritonops.shm.plugins.module_utils.errors import LockError
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import (
    Backoff,
    effective_uid,
    read_bytes,
    read_comm,
)

WAIT_S = 600.0
LOCK_DIR = '/run/tritonops_shm'


def lock_dir(euid: int | None = None) -> str:
    """The directory of this user's locks: LOCK_DIR for root; for another user their runtime directory's, else a
    directory of their own under the temporary directory."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return LOCK_DIR
    runtime = f'/run/user/{euid}'
    try:
        st = os.lstat(runtime)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == euid:
            return os.path.join(runtime, 'tritonops_shm')
    except OSError:
        pass
    return fallback_lock_dir(euid)


def fallback_lock_dir(euid: int | None = None) -> str:
    """Where this user's locks go when lock_dir() cannot be made: a directory of their own under the temporary
    directory, used only when no other user can write there (chain_problem: a read-only /run and a TMPDIR of the
    user's own; /tmp itself never is one)."""
    euid = os.geteuid() if euid is None else euid
    return os.path.join(_temporary_directory(), f'tritonops_shm-{euid}')


def _temporary_directory() -> str:
    """TMPDIR (TEMP, TMP) when absolute, else /tmp: as tempfile.gettempdir() chooses, without its probe (it writes a
    file there to test it: a run writes nothing but its lock)."""
    for name in ('TMPDIR', 'TEMP', 'TMP'):
        value = os.environ.get(name)
        if value and value.startswith('/'):
            return value
    return tempfile.tempdir or '/tmp'


def chain_problem(parent: str, euid: int | None = None, sticky_parent: bool = False) -> str | None:
    """Why another user could plant or replace a lock directory made in parent; None when nobody but root and euid can.

    Every directory from / down to parent (symlinks resolved first) must be owned by root or euid. One that others may
    write must be sticky (they cannot rename or remove what root or euid made in it) and, unless sticky_parent, cannot
    be parent itself: there another user could create the lock directory's name first (a directory, a symlink or a
    file of theirs). A run refuses such a name, never moves elsewhere (a run that chose another place would not exclude
    one that did not), so a planted name stops every run: root's runs never take that risk (sticky_parent False), and
    another user's runs take it in /tmp, where their locks went before, rather than fail everywhere.
    """
    euid = os.geteuid() if euid is None else euid
    real = os.path.realpath(parent)
    path = '/'
    for part in [''] + [p for p in real.split('/') if p]:
        path = os.path.join(path, part)
        try:
            st = os.stat(path)
        except OSError as exc:
            return f'{path} cannot be examined ({exc.strerror})'
        if not stat.S_ISDIR(st.st_mode):
            return f'{path} is not a directory'
        if st.st_uid not in (0, euid):
            return f'{path} belongs to uid {st.st_uid}'
        if st.st_mode & 0o022:
            if path == real and not (sticky_parent and st.st_mode & stat.S_ISVTX):
                return f'{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})'
            if not st.st_mode & stat.S_ISVTX:
                return f'{path} is writable by other users and not sticky (mode {stat.S_IMODE(st.st_mode):04o})'
    return None


def _open_lock_dir(path: str) -> int:
    """The lock directory, created (0700) when missing; OSError when it is not this user's own, private directory.

    One of this user's that others may write (an emptyDir mounted at /run/tritonops_shm is 0777) is made private
    (0700) when nobody else can replace it (chain_problem of its parent); its lock files are checked when opened.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f'owner uid {st.st_uid}'
    elif stat.S_IMODE(st.st_mode) & 0o077:
        problem = chain_problem(os.path.dirname(path))
        if problem is None:
            os.fchmod(fd, 0o700)
    if problem is not None:
        os.close(fd)
        raise OSError(
            errno.EPERM,
            f'not a private directory of uid {os.geteuid()} ({problem}, mode {stat.S_IMODE(st.st_mode):04o}): another '
            'user could hold or replace its locks',
            path,
        )
    return fd


def _open_lock_file(name: str, dir_fd: int) -> int:
    """The lock file name in the private directory dir_fd, created when missing. A name that is not this user's own
    regular file with one link (left from before the directory was made private) is removed and made again."""
    for _attempt in range(2):
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600, dir_fd=dir_fd)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
            return fd
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)
    raise OSError(errno.EPERM, 'the lock file is replaced as soon as it is made', name)


def lock_name(dev: int, ino: int) -> str:
    return f'shm-{os.major(dev)}-{os.minor(dev)}-{ino}.lock'


class ServerLock:
    """The exclusive lock of one shm directory (an open shm_fs.PinnedDir: its dev, ino and fd), until release()."""

    def __init__(
        self,
        shm: object,
        wait_s: float = WAIT_S,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        directory: str | None = None,
        proc: str = '/proc',
    ) -> None:
        self.shm = shm
        self.wait_s = wait_s
        self.sleep = sleep
        self.clock = clock
        self.directory = directory or lock_dir()
        self.fallback = directory is None  # a directory not given: the temporary directory's when it cannot be made
        self.proc = proc
        self.path = os.path.join(self.directory, lock_name(shm.dev, shm.ino))
        self.fd: int | None = None
        self.dir_fd: int | None = None  # the shm directory's own flock, when this run got it
        self.squatter: str | None = None  # who holds the shm directory's own flock, when another process does

    def acquire(self) -> bool:
        """Take the lock. Returns True when another run held it (this one waited), False when it was free.

        Raises OSError when the lock directory or file cannot be used, LockError when the lock stays held for wait_s
        seconds (tried again after the whole wait: the last delay may end past it). Then tries the shm directory's
        own flock once (see the module doc).
        """
        try:
            dir_fd = _open_lock_dir(self.directory)
        except OSError as exc:
            if not self.fallback or exc.errno not in (errno.EROFS, errno.EACCES, errno.ENOENT):
                raise
            fallback = fallback_lock_dir()
            problem = chain_problem(os.path.dirname(fallback), sticky_parent=os.geteuid() != 0)
            if fallback == self.directory or problem is not None:
                raise OSError(
                    exc.errno,
                    f'{self.directory} cannot be made ({exc.strerror}), and {fallback} is no place for it either: '
                    f'{problem or "the same directory"}, where another user could plant its name',
                    self.directory,
                ) from exc
            self.directory, self.fallback = fallback, False
            self.path = os.path.join(self.directory, os.path.basename(self.path))
            dir_fd = _open_lock_dir(self.directory)
        try:
            fd = _open_lock_file(os.path.basename(self.path), dir_fd)
        finally:
            os.close(dir_fd)
        try:
            backoff = Backoff(
                timeout=self.wait_s, first=0.05, cap=0.5, sleep=self.sleep, clock=self.clock, overrun=True
            )
            while not _try_lock(fd):
                if not backoff.wait():
                    raise LockError(
                        f'another tritonops.shm run has held the lock of {self.shm.path} ({self.path}) for '
                        f'{self.wait_s}s: not acting (it is released when that run ends)'
                    )
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._shm_dir_flock()
        return backoff.waited > 0

    def _shm_dir_flock(self) -> None:
        """Take the shm directory's own flock if it is free; else name its holder in squatter. Never waits."""
        try:
            fd = os.open(self.shm.at, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        if _try_lock(fd):
            self.dir_fd = fd
            return
        os.close(fd)
        self.squatter = holders_text(self.shm.dev, self.shm.ino, self.proc)

    def release(self) -> None:
        for attr in ('dir_fd', 'fd'):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)


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


def holders_text(dev: int, ino: int, proc: str = '/proc') -> str:
    """Who holds a lock on (dev, ino), as people read it: 'pid 4711 (sleep, uid 0)', or why it cannot be told."""
    pids = lock_holders(dev, ino, proc)
    if not pids:
        return 'held by a process that /proc/locks does not show (released meanwhile, or another PID namespace)'
    who = []
    for pid in pids:
        if pid <= 0:
            who.append('a process not visible here')
            continue
        who.append(f'pid {pid} ({read_comm(pid, proc) or "?"}, uid {effective_uid(pid, proc)})')
    return 'held by ' + ', '.join(who)


def _try_lock(fd: int) -> bool:
    """Take the exclusive flock without waiting: False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True
