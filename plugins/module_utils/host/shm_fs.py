# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shm directory: usage, safe listing, safe create and safe unlink.

Private to the tritonops.shm collection: no stability promise to other code. The directory is opened once
(``pin()``, a ``PinnedDir``) without following a symlink through another process's root (rootfs.py), and every
operation works on names relative to that descriptor, never follows symlinks, and refuses anything that is not a
single path component, so nothing outside the shm directory can ever be touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ShmFsError
from ansible_collections.tritonops.shm.plugins.module_utils.host import rootfs
from ansible_collections.tritonops.shm.plugins.module_utils.rules import families
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import (
    CLEANUP_XATTR,
    QUARANTINE_PREFIX,
    RESERVED_XATTR,
    CleanupMark,
    hard_links_refusal,
)


# Files of other software that live in /dev/shm: never an orphan, whatever orphan_patterns says (V(*) included).
# One table, families.FAMILIES (docs/shm-families.md); case-sensitive, as names are.
def other_software(name: str) -> str | None:
    """Whose file a name of a well-known family of other software is ('PostgreSQL's dynamic shared memory'), else None."""
    return families.describe(name)


# The marks (RESERVED_XATTR, CLEANUP_XATTR) and the quarantine names (QUARANTINE_PREFIX): facts.py.
_CHUNK = 60000  # below the 64 KiB limit of one attribute value

_RENAME_NOREPLACE = 1


def _record_names(names: list) -> list:
    prefix = CLEANUP_XATTR + '.'
    return sorted(
        (n for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit()), key=lambda n: int(n[len(prefix) :])
    )


def read_cleanup_record(path: str | int) -> dict:
    """{inode: CleanupMark} of the cleanup record of the shm directory at path (or open descriptor); {} when none."""
    try:
        names = _record_names(os.listxattr(path))
        if not names:
            return {}
        data = json.loads(b''.join(os.getxattr(path, n) for n in names).decode('utf-8'))
        return {
            int(ino): CleanupMark(str(region), str(name), str(server)) for ino, name, region, server in data['files']
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def read_only(pinned: PinnedDir) -> bool:
    """Whether the filesystem of the pinned shm directory is mounted read-only (nothing in it can be renamed or
    removed)."""
    try:
        return bool(os.fstatvfs(pinned.fd).f_flag & os.ST_RDONLY)
    except OSError:
        return False


_LIBC: list = []


def _renameat2(dir_fd: int, old: str, new: str, flags: int) -> None:
    """renameat2(2) inside one directory (the standard library has no flags); raises OSError."""
    if _LIBC:
        func = _LIBC[0]
    else:
        try:
            func = ctypes.CDLL(None, use_errno=True).renameat2
        except (OSError, AttributeError):
            func = None
        _LIBC.append(func)
    if func is None:
        raise OSError(errno.ENOSYS, 'renameat2 is not available')
    if func(dir_fd, os.fsencode(old), dir_fd, os.fsencode(new), flags):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class Quarantined(NamedTuple):
    """A file renamed to its quarantine name: its (dev, ino) and its inode change time after the rename."""

    name: str  # the quarantine name
    original: str  # the name it had
    dev: int
    ino: int
    ctime_ns: int | None  # None: the unlink checks device and inode only (the rename changed the ctime)
    blocks: int
    owner: tuple[int, int] | None = None  # (uid, gid) the rename ran as, and its unlink or restore runs as (acting_as)


def _fs_id_calls() -> tuple:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.setfsuid, libc.setfsgid


@contextlib.contextmanager
def acting_as(uid: int, gid: int) -> Iterator[None]:
    """Run the block with this thread's filesystem ids set to uid and gid (setfsuid/setfsgid, per thread), then back.

    For a tmpfs mounted in another user namespace (a rootless server's /dev/shm): root's ids are not mapped there, so
    the kernel refuses root a new name (EOVERFLOW), while the directory's owner, which that namespace maps, may make
    one. With a filesystem uid other than 0 the kernel checks permissions as that user (no DAC override): the block
    can do no more than the owner could. Raises OSError (EPERM) when the ids could not be taken.
    """
    setfsuid, setfsgid = _fs_id_calls()
    old_gid = setfsgid(gid)
    old_uid = setfsuid(uid)
    try:
        if setfsuid(-1) != uid or setfsgid(-1) != gid:
            raise OSError(errno.EPERM, f'cannot act as uid {uid}, gid {gid} (setfsuid/setfsgid refused)')
        yield
    finally:
        setfsuid(old_uid)
        setfsgid(old_gid)


_IN_ROOT = re.compile(r'^(/proc/[0-9]+/root)(/.*)?$')


class PinnedDir:
    """A shm directory opened once, safely: ``path`` is how it is shown, ``fd`` the descriptor every operation uses.

    Opened by pin(). ``at`` reaches the very directory again through its descriptor (/proc/self/fd/N), for the calls
    that take a path only (getxattr of a file in it); nothing re-walks ``path``. The descriptor closes with close()
    or when the object goes (keep the object while ``at`` is in use).
    """

    def __init__(self, path: str, fd: int, root: str | None = None) -> None:
        self.path = path
        self.fd = fd
        self.root = root  # the root path lies in (pin()'s), None: the host's
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino
        self.at = f'/proc/self/fd/{fd}'

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd)

    def still_there(self) -> None:
        """Raise ShmFsError unless path still leads, by pin()'s rules, to this very directory.

        A server that died (a container's private /dev/shm goes with it) or a root that changed since the read: the
        descriptor still reaches the old directory, but it is no longer the server's shm directory, and nothing is
        done there (the files that could not go are listed, as when the directory cannot be opened).
        """
        try:
            again = pin(self.path, self.root)
        except OSError as exc:
            raise ShmFsError(f'cannot open shm directory {self.path}: {exc.strerror or exc}') from exc
        same = (again.dev, again.ino) == (self.dev, self.ino)
        again.close()
        if not same:
            raise ShmFsError(
                f'cannot open shm directory {self.path}: it is no longer the directory that was read (the server '
                'or its root changed)'
            )

    def file_at(self, name: str) -> str:
        """The path of the file name in this directory, through the descriptor (never re-walking ``path``)."""
        return f'{self.at}/{check_name(name)}'

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f'PinnedDir({self.path!r}, fd={self.fd})'


def pin(path: str, root: str | None = None) -> PinnedDir:
    """The shm directory at path, opened without following a symlink that could lead out of where it is.

    root: the root the path lies in (/proc/PID/root, when the path is the server's /dev/shm seen through it); a
    path that starts with /proc/PID/root is taken as one too. Inside such a root no symlink is followed at any step
    (rootfs.REFUSE). Any other path (a directory an operator names) follows only symlinks that root owns
    (rootfs.ROOT_OWNED). Raises PathRefused with the reason, OSError when it cannot be opened.
    """
    found = _IN_ROOT.match(path)
    if root is None and found is not None:
        root = found.group(1)
    if root is not None and (path == root or path.startswith(root.rstrip('/') + '/')):
        fd = rootfs.open_in(root, path[len(root) :], rootfs.REFUSE, rootfs.DIRECTORY_FLAGS)
    else:
        fd = rootfs.open_in('/', path, rootfs.ROOT_OWNED, rootfs.DIRECTORY_FLAGS)
    try:
        pinned = PinnedDir(path, fd, root)
        seen = os.stat(pinned.at)
    except OSError as exc:
        os.close(fd)
        raise ShmFsError(f'shm directory {path} was opened, but /proc/self/fd cannot reach it: {exc.strerror}') from exc
    if (seen.st_dev, seen.st_ino) != (pinned.dev, pinned.ino):
        pinned.close()
        raise ShmFsError(f'shm directory {path} was opened, but /proc/self/fd reaches another directory')
    return pinned


def _pinned(path: str | PinnedDir) -> tuple[PinnedDir, bool]:
    """(the PinnedDir of path, whether this call opened it and must close it)."""
    if isinstance(path, PinnedDir):
        return path, False
    return pin(path), True


def usage(path: str | PinnedDir) -> dict:
    """statvfs of the shm filesystem: sizes in bytes."""
    d, opened = _pinned(path)
    try:
        st = os.statvfs(d.fd)
    finally:
        if opened:
            d.close()
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return {
        'path': d.path,
        'total_bytes': total,
        'used_bytes': used,
        'free_bytes': free,
        'used_percent': round(100.0 * used / total, 2) if total else 0.0,
    }


def read_mark(path: str) -> str | None:
    """The reserved mark (a region name) of the file at path, never followed; None when absent or unreadable."""
    try:
        value = os.getxattr(path, RESERVED_XATTR, follow_symlinks=False)
    except OSError:
        # no mark (ENODATA), gone, no xattr support, or not privileged to read trusted.*
        return None
    return value.decode('utf-8', 'replace')


def check_name(name: str) -> str:
    if not name or '/' in name or '\x00' in name or name in ('.', '..'):
        raise ShmFsError(f'refusing unsafe file name {name!r} (must be one component inside the shm directory)')
    return name


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return 'file'
    if stat.S_ISLNK(mode):
        return 'symlink'
    if stat.S_ISDIR(mode):
        return 'directory'
    if stat.S_ISFIFO(mode):
        return 'fifo'
    if stat.S_ISSOCK(mode):
        return 'socket'
    return 'other'


def age_of(st: os.stat_result, now: float) -> tuple[float, str]:
    """Seconds from the newest of a stat result's atime, mtime and ctime to now (never negative), and which time it is.

    As systemd-tmpfiles ages files: a file read (atime), written (mtime), or renamed, chmod'ed, chown'ed or marked
    (ctime) since is young again. ctime cannot be set back (utime() sets it to now), so a file's age can only be
    what really passed. On ties mtime is named, then ctime.
    """
    newest, which = max((st.st_mtime, 'mtime'), (st.st_ctime, 'ctime'), (st.st_atime, 'atime'), key=lambda t: t[0])
    return round(max(0.0, now - newest), 3), which


def describe(name: str, full_path: str, st: os.stat_result, now: float) -> dict:
    """The public description of one directory entry (full_path) from its lstat result, its age as of now (age_of)."""
    mode = st.st_mode
    age, age_from = age_of(st, now)
    return {
        'name': name,
        'path': full_path,
        'type': _kind(mode),
        'size': st.st_size,
        'allocated_bytes': getattr(st, 'st_blocks', 0) * 512,
        'uid': st.st_uid,
        'mode': f'{stat.S_IMODE(mode):04o}',
        'mtime': st.st_mtime,
        'age_s': age,
        'age_from': age_from,
        'inode': st.st_ino,
        'dev': st.st_dev,
        'ctime_ns': st.st_ctime_ns,
        'links': st.st_nlink,
    }


def list_entries(path: str | PinnedDir, now: float | None = None) -> list[dict]:
    """Every entry of the shm directory, lstat'ed (never followed). Entries that vanish are skipped.

    The directory is listed and lstat'ed by its descriptor: a path like /proc/PID/root/dev/shm is walked once
    (pin()), not once per name. Each entry's path is shown under the directory's shown path.
    """
    now = time.time() if now is None else now
    d, opened = _pinned(path)
    prefix = os.path.join(d.path, '')  # path + separator, as os.path.join(path, name) spells each entry
    out = []
    try:
        with os.scandir(d.fd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                out.append(describe(entry.name, prefix + entry.name, st, now))
    finally:
        if opened:
            d.close()
    out.sort(key=lambda e: e['name'])
    return out


class ShmDir:
    """An open shm directory; all operations are relative to its descriptor (a copy of a PinnedDir's, or pin()'s)."""

    def __init__(self, path: str | PinnedDir) -> None:
        if isinstance(path, PinnedDir):
            path.still_there()  # acted on only while it is still the server's directory
            self.path, self.fd = path.path, os.dup(path.fd)
        else:
            self.path = path
            try:
                pinned = pin(path)
            except OSError as exc:
                raise ShmFsError(f'cannot open shm directory {path}: {exc.strerror}') from exc
            self.fd, pinned.fd = pinned.fd, -1  # the descriptor is this object's now
        self.st = os.fstat(self.fd)
        self._token = os.urandom(6).hex()  # this run's part of its quarantine names: nobody can take them first

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> ShmDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lstat(self, name: str) -> os.stat_result | None:
        """lstat of name inside the directory, or None when it does not exist."""
        check_name(name)
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def create(self, name: str, size: int, mode: int = 0o600) -> os.stat_result:
        """Create a new regular file of size bytes (O_EXCL: never reuses or truncates an existing file)."""
        check_name(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0)
        try:
            fd = os.open(name, flags, mode, dir_fd=self.fd)
        except OSError as exc:
            raise ShmFsError(f'cannot create {name} in {self.path}: {exc.strerror}') from exc
        try:
            os.fchmod(fd, mode)
            os.ftruncate(fd, size)
            return os.fstat(fd)
        except OSError as exc:
            try:
                os.unlink(name, dir_fd=self.fd)
            except OSError:
                pass
            raise ShmFsError(f'cannot size {name} in {self.path} to {size} bytes: {exc.strerror}') from exc
        finally:
            os.close(fd)

    def read_mark(self, name: str) -> str | None:
        """The reserved mark (a region name) of regular file name, or None when it has none or it cannot be read."""
        return read_mark(f'/proc/self/fd/{self.fd}/{check_name(name)}')

    def set_mark(self, name: str, region: str, expect_dev: int, expect_ino: int) -> None:
        """Mark regular file name, still the same (device, inode), as backing region (see RESERVED_XATTR).

        Raises ShmFsError when the file is gone, replaced, not regular, or the filesystem or the
        caller's privileges do not allow trusted.* attributes.
        """
        fd = self._open_same(name, expect_dev, expect_ino, 'mark it')
        try:
            os.setxattr(fd, RESERVED_XATTR, region.encode('utf-8'))
        except OSError as exc:
            raise ShmFsError(
                f'cannot mark {name} in {self.path} as reserved (extended attribute {RESERVED_XATTR}): {exc.strerror}'
            ) from exc
        finally:
            os.close(fd)

    def _open_same(self, name: str, expect_dev: int, expect_ino: int, what: str) -> int:
        """An O_RDONLY descriptor of regular file name, still (expect_dev, expect_ino); raises ShmFsError."""
        check_name(name)
        flags = os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0) | getattr(os, 'O_NONBLOCK', 0)
        try:
            fd = os.open(name, flags, dir_fd=self.fd)
        except OSError as exc:
            raise ShmFsError(f'cannot open {name} in {self.path} to {what}: {exc.strerror}') from exc
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expect_dev, expect_ino):
            os.close(fd)
            raise ShmFsError(f'{name} in {self.path} was replaced since it was checked: not marked')
        return fd

    def write_cleanup_record(self, record: dict) -> None:
        """Replace the directory's cleanup record by record ({inode: CleanupMark}; empty: remove it).

        Raises ShmFsError when the filesystem or the caller's privileges refuse trusted.* attributes.
        """
        data = (
            json.dumps(
                {'files': [[ino, m.name, m.region, m.server] for ino, m in sorted(record.items())]},
                separators=(',', ':'),
            ).encode('utf-8')
            if record
            else b''
        )
        chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)]
        try:
            old = _record_names(os.listxattr(self.fd))
            for i, chunk in enumerate(chunks):
                os.setxattr(self.fd, f'{CLEANUP_XATTR}.{i}', chunk)
            for name in old[len(chunks) :]:
                os.removexattr(self.fd, name)
        except OSError as exc:
            raise ShmFsError(
                f'cannot record the files to remove on {self.path} (extended attribute {CLEANUP_XATTR}): {exc.strerror}'
            ) from exc

    def _check_same(
        self, name: str, st: os.stat_result, expect_dev: int, expect_ino: int, expect_ctime_ns: int | None
    ) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise ShmFsError(f'{name} in {self.path} is a {_kind(st.st_mode)}, not a regular file: not removed')
        if (st.st_dev, st.st_ino) != (expect_dev, expect_ino):
            raise ShmFsError(
                f'{name} in {self.path} was replaced since it was checked (inode {st.st_ino}, '
                f'expected {expect_ino}): not removed'
            )
        if st.st_nlink > 1:
            raise ShmFsError(f'{name} in {self.path} {hard_links_refusal(st.st_nlink)}')
        if expect_ctime_ns is not None and st.st_ctime_ns != expect_ctime_ns:
            raise ShmFsError(
                f'{name} in {self.path} changed since it was checked (its inode change time differs): not removed'
            )

    def quarantine(
        self, name: str, expect_dev: int, expect_ino: int, expect_ctime_ns: int | None = None
    ) -> Quarantined | None:
        """Rename regular file name, still the (dev, inode, ctime) classified, to a fresh quarantine name.

        Returns None when name is already gone. Raises ShmFsError as unlink() does, and when the rename
        is refused (OSError ENOSYS/EINVAL when the kernel or filesystem has no RENAME_NOREPLACE, EOVERFLOW when
        this process's uid is not mapped in the user namespace of the filesystem: the caller may try again as the
        directory's owner, acting_as, never unlink in place). The quarantined file is checked again (device and inode)
        when it is unlinked: one swapped in between this check and the rename is given its name back then.
        """
        check_name(name)
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if (
            st.st_ino != expect_ino
            or st.st_dev != expect_dev
            or not stat.S_ISREG(st.st_mode)
            or st.st_nlink > 1
            or (expect_ctime_ns is not None and st.st_ctime_ns != expect_ctime_ns)
        ):
            self._check_same(name, st, expect_dev, expect_ino, expect_ctime_ns)  # raises, saying why
        qname = f'{QUARANTINE_PREFIX}{st.st_ino}.{self._token}'
        try:
            _renameat2(self.fd, name, qname, _RENAME_NOREPLACE)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            # ENOSYS/EINVAL: no RENAME_NOREPLACE here; EOVERFLOW: a tmpfs mounted in another user namespace (a rootless
            # server's) where this process's uid is not mapped, so it may not create a name there (it may still unlink)
            if exc.errno in (errno.ENOSYS, errno.EINVAL, errno.EOVERFLOW):
                raise
            raise ShmFsError(
                f'cannot rename {name} in {self.path} to {qname} before removing it: {exc.strerror}'
            ) from exc
        return Quarantined(qname, name, st.st_dev, st.st_ino, None, st.st_blocks)

    def restore(self, qname: str, name: str) -> bool:
        """Rename quarantined qname back to name; False (it stays quarantined) when name exists again meanwhile."""
        check_name(qname)
        check_name(name)
        try:
            _renameat2(self.fd, qname, name, _RENAME_NOREPLACE)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                return False
            raise ShmFsError(f'cannot rename {qname} back to {name} in {self.path}: {exc.strerror}') from exc
        return True

    def unlink(
        self, name: str, expect_dev: int, expect_ino: int, expect_ctime_ns: int | None = None, missing: int | None = 0
    ) -> int | None:
        """Unlink name only if it is still the same regular file (device and inode) we classified.

        With expect_ctime_ns, its inode change time must be unchanged too: a file removed and
        created again in its place can get the same inode number, never the same ctime.

        Returns the bytes the file occupied, or ``missing`` when it was already gone (another run
        removed it). Raises ShmFsError when the entry is not a regular file or was replaced since
        it was classified.
        """
        check_name(name)
        st = self.lstat(name)
        if st is None:
            return missing
        self._check_same(name, st, expect_dev, expect_ino, expect_ctime_ns)
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return missing
            raise ShmFsError(f'cannot remove {name} from {self.path}: {exc.strerror}') from exc
        return st.st_blocks * 512
