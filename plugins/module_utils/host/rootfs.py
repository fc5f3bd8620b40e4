# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Paths inside another process's root (/proc/PID/root), resolved as that process sees them and never outside it.

Private to the tritonops.shm collection: no stability promise to other code. Standard library only.

The kernel treats /proc/PID/root as a jump into that process's root directory, but everything after the jump is
resolved as *this* process sees things: an absolute symlink is resolved against this process's root, and ``..``
climbs above the other process's root, which is no root to this process. A pod's root that chroots into a directory
of its own whose ``dev/shm`` is a symlink to ``/etc`` (or ``../../../../etc``) therefore gets
``/proc/PID/root/dev/shm`` resolved to the node's ``/etc`` when the whole path is handed to the kernel. So nothing here
hands such a path to the kernel in one piece (``resolve()``):

- the root is opened once (``O_PATH``: the jump is what is wanted), and each component is opened relative to the last
  one's descriptor with ``O_NOFOLLOW``, never ``..`` (a ``..`` goes back to the descriptor below it, and never above the
  root): a component renamed or swapped meanwhile is met as it is, inside the root;
- a symlink met on the way is refused (``REFUSE``: the shm directory, its files, the backend stub) with the reason,
  or read and resolved inside the root (``IN_ROOT``: an absolute target starts again at the root, as the kernel's
  ``RESOLVE_IN_ROOT`` does: Kubernetes' projected volumes are symlinks, ``/var/run`` is one), or followed only when root
  owns it (``ROOT_OWNED``: a directory an operator names on the host, where only root may plant such a link in a
  root-owned directory);
- the last component is opened with the caller's flags and ``O_NOFOLLOW``, and must be the very file checked.

openat2(2) with RESOLVE_IN_ROOT does the same in the kernel since Linux 5.6; the descent works on every kernel the
modules support (RHEL 8's 4.18 too) and is the one path the tests cover.
"""

from __future__ import annotations

import collections
import errno
import os
import stat

from ansible_collections.tritonops.shm.plugins.module_utils.errors import PathRefused

REFUSE = 'refuse'
IN_ROOT = 'in_root'
ROOT_OWNED = 'root_owned'
MAX_LINKS = 40  # as the kernel's own limit of symlinks in one lookup (ELOOP past it)

_PATH = getattr(os, 'O_PATH', 0o10000000)
_CLOEXEC = getattr(os, 'O_CLOEXEC', 0)
_NOFOLLOW = getattr(os, 'O_NOFOLLOW', 0)
DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0)
FILE_FLAGS = os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0) | getattr(os, 'O_NOCTTY', 0)


def _parts(path: str) -> list[str]:
    return [p for p in path.split('/') if p and p != '.']


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, 'directory'), (stat.S_ISREG, 'regular file'), (stat.S_ISLNK, 'symlink')):
        if test(mode):
            return name
    return 'special file'


def resolve(root_fd: int, path: str, policy: str = REFUSE, flags: int = _PATH, shown: str = '') -> int:
    """A descriptor (opened with flags) of path inside the root at root_fd, resolved as described above.

    shown: how the root is named in messages (/proc/4711/root). Raises PathRefused when a symlink is met that the
    policy does not follow, or a component changes between its check and its open; OSError as open(2) does (ENOENT,
    ENOTDIR, ELOOP past MAX_LINKS).
    """
    stack = [os.dup(root_fd)]
    todo = collections.deque(_parts(path))
    walked: list[str] = []  # the components resolved so far, as the root's own path (for messages)
    links = 0
    try:
        if not todo:
            return os.open('.', flags | _CLOEXEC, dir_fd=stack[-1])
        while todo:
            name = todo.popleft()
            if name == '..':
                if len(stack) > 1:
                    os.close(stack.pop())
                    walked.pop()
                continue
            fd = os.open(name, _PATH | _NOFOLLOW | _CLOEXEC, dir_fd=stack[-1])
            try:
                st = os.fstat(fd)
                here = '/' + '/'.join(walked + [name])
                if stat.S_ISLNK(st.st_mode):
                    target = _readlink(name, stack[-1], here, shown)
                    _allowed(policy, st, here, target, shown)
                    links += 1
                    if links > MAX_LINKS:
                        raise OSError(errno.ELOOP, f'more than {MAX_LINKS} symlinks', shown + here)
                    if target.startswith('/'):
                        for extra in stack[1:]:
                            os.close(extra)
                        del stack[1:]
                        walked.clear()
                    todo.extendleft(reversed(_parts(target) or ['.']))
                    continue
                if not todo:
                    return _reopen(name, stack[-1], st, flags, shown + here)
                if not stat.S_ISDIR(st.st_mode):
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown + here)
                stack.append(fd)
                fd = -1
                walked.append(name)
            finally:
                if fd >= 0:
                    os.close(fd)
        # the path ended on '..' or '.': the directory reached
        return os.open('.', flags | _CLOEXEC, dir_fd=stack[-1])
    finally:
        for d in stack:
            os.close(d)


def _readlink(name: str, dir_fd: int, here: str, shown: str) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # no longer a symlink: it was swapped between the check and the read
            raise PathRefused(f'{shown}{here} changed while it was resolved: refused') from None
        raise


def _allowed(policy: str, st: os.stat_result, here: str, target: str, shown: str) -> None:
    """Raise PathRefused when the policy does not follow this symlink."""
    if policy == IN_ROOT:
        return
    if policy == ROOT_OWNED and st.st_uid == 0:
        return
    owner = '' if policy == REFUSE else f', owned by uid {st.st_uid}, not root,'
    raise PathRefused(
        f"{shown}{here} is a symlink{owner} (to {target!r}): refused, a path through another process's root or a "
        'directory that another user controls is never followed through a symlink (it could lead outside that root)'
    )


def _reopen(name: str, dir_fd: int, checked: os.stat_result, flags: int, where: str) -> int:
    """The last component opened with flags (and O_NOFOLLOW); PathRefused when it is no longer the file checked."""
    try:
        fd = os.open(name, flags | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a symlink since it was checked
            raise PathRefused(f'{where} changed while it was resolved (now a symlink): refused') from None
        raise
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
        os.close(fd)
        raise PathRefused(f'{where} changed while it was resolved (another {_kind(st.st_mode)}): refused')
    return fd


def open_root(root: str) -> int:
    """An O_PATH descriptor of a root directory: /proc/PID/root (the jump into that process's root), or '/'."""
    return os.open(root, _PATH | getattr(os, 'O_DIRECTORY', 0) | _CLOEXEC)


def open_in(root: str, path: str, policy: str = REFUSE, flags: int = _PATH) -> int:
    """resolve() of path inside the root directory at the path root (see open_root)."""
    root_fd = open_root(root)
    try:
        return resolve(root_fd, path, policy, flags, shown=root.rstrip('/'))
    finally:
        os.close(root_fd)


def read_small(root: str, path: str, limit: int = 4096, policy: str = IN_ROOT) -> str | None:
    """The first limit bytes (as text) of the regular file path inside root, or None when it cannot be read safely.

    Never blocks (O_NONBLOCK: a FIFO planted there is not waited on) and reads only regular files.
    """
    try:
        fd = open_in(root, path, policy, FILE_FLAGS)
    except (OSError, PathRefused):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode('utf-8', 'replace')
    except OSError:
        return None
    finally:
        os.close(fd)


def stat_in(root: str, path: str, policy: str = IN_ROOT) -> os.stat_result | None:
    """The stat of path inside root (symlinks as the policy says, the last one never followed), None when it fails."""
    try:
        fd = open_in(root, path, policy)
    except (OSError, PathRefused):
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)
