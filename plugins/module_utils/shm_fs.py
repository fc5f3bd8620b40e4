# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shm directory: usage, safe listing, safe create and safe unlink.

Private to the tritonops.shm collection. Every operation works on names
relative to an open directory file descriptor, never follows symlinks, and
refuses anything that is not a single path component, so nothing outside the
shm directory can ever be touched.
"""
from __future__ import annotations

import errno
import os
import stat
import time

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ShmFsError

BACKEND_PREFIX = 'triton_python_backend_shm_region_'
# Shell-style patterns of Triton's python backend files: the default prefix, with a counter
# suffix before Triton 24.04 and a UUID since (--backend-config=python,shm-region-prefix-name=... changes it).
BACKEND_PATTERNS = (BACKEND_PREFIX + '*',)

# The mark of a region this collection registered (the 建 step): an extended attribute of the
# backing file, whose value is the region's name. trusted.* needs CAP_SYS_ADMIN to set and to read,
# tmpfs supports it, and it goes with the file: a file removed and created again has no mark.
RESERVED_XATTR = 'trusted.tritonops_shm.reserved'


def usage(path):
    """statvfs of the shm filesystem: sizes in bytes."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return dict(path=path, total_bytes=total, used_bytes=used, free_bytes=free,
                used_percent=round(100.0 * used / total, 2) if total else 0.0)


def key_to_name(key):
    """The file name a system region key refers to, or raise ShmFsError saying why the key is unsafe.

    Triton opens ``shm_open(key)``, i.e. ``/dev/shm`` + key: a valid key is ``/`` followed by
    one path component that is not ``.`` or ``..`` and holds no NUL.
    """
    if not isinstance(key, str) or not key:
        raise ShmFsError('key must be a non-empty string like "/my_region"')
    if '\x00' in key:
        raise ShmFsError('key %r contains a NUL byte' % (key,))
    if not key.startswith('/'):
        raise ShmFsError('key %r must start with "/" (Triton opens it with shm_open in the shm directory)' % (key,))
    name = key[1:]
    if not name or '/' in name:
        raise ShmFsError('key %r must be exactly one path component after the leading "/"' % (key,))
    if name in ('.', '..'):
        raise ShmFsError('key %r points outside the shm directory' % (key,))
    return name


def read_mark(path):
    """The reserved mark (a region name) of the file at path, never followed; None when absent or unreadable."""
    try:
        value = os.getxattr(path, RESERVED_XATTR, follow_symlinks=False)
    except OSError:
        # no mark (ENODATA), gone, no xattr support, or not privileged to read trusted.*
        return None
    return value.decode('utf-8', 'replace')


def check_name(name):
    if not name or '/' in name or '\x00' in name or name in ('.', '..'):
        raise ShmFsError('refusing unsafe file name %r (must be one component inside the shm directory)' % (name,))
    return name


def _kind(mode):
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


def describe(name, full_path, st, now):
    """The public description of one directory entry (full_path) from its lstat result, its age as of now."""
    mode = st.st_mode
    return {
        'name': name,
        'path': full_path,
        'type': _kind(mode),
        'size': st.st_size,
        'allocated_bytes': getattr(st, 'st_blocks', 0) * 512,
        'uid': st.st_uid,
        'mode': '%04o' % stat.S_IMODE(mode),
        'mtime': st.st_mtime,
        'age_s': round(max(0.0, now - st.st_mtime), 3),
        'inode': st.st_ino,
        'dev': st.st_dev,
        'ctime_ns': st.st_ctime_ns,
    }


def list_entries(path, now=None):
    """Every entry of the shm directory, lstat'ed (never followed). Entries that vanish are skipped.

    The directory is opened once and listed and lstat'ed by its descriptor: a path like
    /proc/PID/root/dev/shm costs a walk through the other process's root for every name otherwise.
    """
    now = time.time() if now is None else now
    prefix = os.path.join(path, '')   # path + separator, as os.path.join(path, name) spells each entry
    out = []
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, 'O_CLOEXEC', 0))
    try:
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                out.append(describe(entry.name, prefix + entry.name, st, now))
    finally:
        os.close(fd)
    out.sort(key=lambda e: e['name'])
    return out


class ShmDir(object):
    """An open shm directory; all operations are relative to its descriptor."""

    def __init__(self, path):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, 'O_CLOEXEC', 0))
        except OSError as exc:
            raise ShmFsError('cannot open shm directory %s: %s' % (path, exc.strerror))
        self.st = os.fstat(self.fd)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def lstat(self, name):
        """lstat of name inside the directory, or None when it does not exist."""
        check_name(name)
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def create(self, name, size, mode=0o600):
        """Create a new regular file of size bytes (O_EXCL: never reuses or truncates an existing file)."""
        check_name(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0)
        try:
            fd = os.open(name, flags, mode, dir_fd=self.fd)
        except OSError as exc:
            raise ShmFsError('cannot create %s in %s: %s' % (name, self.path, exc.strerror))
        try:
            os.fchmod(fd, mode)
            os.ftruncate(fd, size)
            return os.fstat(fd)
        except OSError as exc:
            try:
                os.unlink(name, dir_fd=self.fd)
            except OSError:
                pass
            raise ShmFsError('cannot size %s in %s to %d bytes: %s' % (name, self.path, size, exc.strerror))
        finally:
            os.close(fd)

    def read_mark(self, name):
        """The reserved mark (a region name) of regular file name, or None when it has none or it cannot be read."""
        return read_mark(os.path.join(self.path, check_name(name)))

    def set_mark(self, name, region, expect_dev, expect_ino):
        """Mark regular file name, still the same (device, inode), as backing region (see RESERVED_XATTR).

        Raises ShmFsError when the file is gone, replaced, not regular, or the filesystem or the
        caller's privileges do not allow trusted.* attributes.
        """
        check_name(name)
        flags = os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0) | getattr(os, 'O_NONBLOCK', 0)
        try:
            fd = os.open(name, flags, dir_fd=self.fd)
        except OSError as exc:
            raise ShmFsError('cannot open %s in %s to mark it: %s' % (name, self.path, exc.strerror))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expect_dev, expect_ino):
                raise ShmFsError('%s in %s was replaced since it was checked: not marked' % (name, self.path))
            os.setxattr(fd, RESERVED_XATTR, region.encode('utf-8'))
        except OSError as exc:
            raise ShmFsError('cannot mark %s in %s as reserved (extended attribute %s): %s'
                             % (name, self.path, RESERVED_XATTR, exc.strerror))
        finally:
            os.close(fd)

    def unlink(self, name, expect_dev, expect_ino, expect_ctime_ns=None, missing=0):
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
        if not stat.S_ISREG(st.st_mode):
            raise ShmFsError('%s in %s is a %s, not a regular file: not removed' % (name, self.path, _kind(st.st_mode)))
        if (st.st_dev, st.st_ino) != (expect_dev, expect_ino):
            raise ShmFsError('%s in %s was replaced since it was checked (inode %d, expected %d): not removed'
                             % (name, self.path, st.st_ino, expect_ino))
        if expect_ctime_ns is not None and st.st_ctime_ns != expect_ctime_ns:
            raise ShmFsError('%s in %s changed since it was checked (its inode change time differs): not removed'
                             % (name, self.path))
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return missing
            raise ShmFsError('cannot remove %s from %s: %s' % (name, self.path, exc.strerror))
        return st.st_blocks * 512
