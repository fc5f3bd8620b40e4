# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the one room for outputs, the one way a file of ours is written.

The node_exporter textfiles (metrics.py, on the target), the report playbook's files and the cleanup role's records
(action shm_output_files, on the controller), and any later output are written here and only here:

- into a directory that is no symlink and is reached through none (``dir_refusal()``): another user may have planted
  one to make root write where they choose;
- by a plain name (``plain_name()``): one path component, never hidden, so it can never be one of our temporary names;
- atomically: a temporary ``.NAME.RANDOM.tmp`` in the same directory, written, fsynced, then renamed over the name,
  with the mode asked whatever the umask (``write()``). A reader sees the old file or the new one, never half.

An output is never a change (DESIGN invariant 11): callers report ``changed=false`` for it. Check mode is the caller's
decision. Nothing here raises for a directory's condition: ``write()`` says what it did and why not.

Standard library only: the filters and the action plugin import it on the controller, the modules on the target.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from typing import NamedTuple


class WriteResult(NamedTuple):
    """What write() did: the path, whether the file was written, the warning when it was not, and whether the
    directory itself was the cause (missing, a symlink, not writable) rather than this one file."""

    path: str
    written: bool
    warning: str | None
    directory_refused: bool = False


def plain_name(name: str) -> str | None:
    """Why name cannot be an output's name (None when it can): one component, not hidden, no NUL."""
    if not isinstance(name, str) or not name:
        return f'an output name must be a non-empty string, got {name!r}'
    if '/' in name or '\0' in name or name.startswith('.'):
        return f'an output name must be one plain file name (no "/", not starting with "."), got {name!r}'
    return None


def dir_refusal(directory: str, missing_ok: bool = False) -> str | None:
    """Why nothing may be written into directory (a symlink, or a path through one: not followed), or None.

    The one check of an output directory: the modules' metrics_dir, the playbooks' report_dir (filter
    shm_dir_refusal, action shm_output_files). Another user may have planted the link to make root write where they
    choose. missing_ok: a directory that does not exist yet is no refusal when no component of its path is a symlink.
    """
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if not missing_ok:
            return f'{directory} does not exist on this host'
        st = None
    except OSError as exc:
        return f'{directory} cannot be read ({exc.strerror})'
    if st is not None and stat.S_ISLNK(st.st_mode):
        return f'{directory} is a symlink to {os.path.realpath(directory)} (not followed; give the real directory)'
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return f'{directory} is not a directory'
    real = os.path.realpath(directory)
    if real != os.path.abspath(directory):
        return f'{directory} leads to {real} through a symlink (not followed; give the real directory)'
    return None


def report_dir_refusal(directory: str) -> str | None:
    """Why a report directory on the controller is refused (None when it may be written into or created).

    dir_refusal() with missing_ok, and a relative path refused: Ansible runs a local task in its playbook's (or role's)
    directory, inside the installed collection.
    """
    if not directory.startswith('/'):
        return (
            f'{directory} is a relative path: the report would be written inside the installed collection '
            f"(Ansible runs the controller's tasks in the playbook's directory); give an absolute path, "
            f'e.g. $PWD/{directory}'
        )
    return dir_refusal(directory, missing_ok=True)


def _walk(directory: str, create: int | None = None) -> tuple:
    """(fd, None) for directory, opened one component at a time from the root with O_NOFOLLOW at each step, so that
    no symlink is ever followed, whatever is swapped meanwhile; or (None, why). create: a mode, to make each missing
    component on the way (mkdirat, then that mode whatever the umask)."""
    path = os.path.abspath(directory)
    # O_PATH: a component needs search permission only (a 0711 home), as a path lookup does; the fd serves as dir_fd
    flags = getattr(os, 'O_PATH', os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open('/', flags)
    try:
        for part in [p for p in path.split('/') if p]:
            try:
                try:
                    nfd = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if create is None:
                        return None, f'{directory} does not exist on this host'
                    try:
                        os.mkdir(part, 0o700, dir_fd=fd)  # 0700 until its mode is set: never wider meanwhile
                        made = True
                    except FileExistsError:
                        made = False
                    if made:  # this run's own directory: readable to set its mode (an O_PATH fd cannot)
                        mfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                        try:
                            os.fchmod(mfd, create)
                        finally:
                            os.close(mfd)
                    nfd = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    return None, dir_refusal(
                        directory
                    ) or f'{directory} leads through a symlink or a file (not followed)'
                verb = 'created' if create is not None and exc.errno != errno.EACCES else 'opened'
                return None, f'{directory} cannot be {verb} ({exc.strerror})'
            os.close(fd)
            fd = nfd
        found, fd = fd, None
        return found, None
    finally:
        if fd is not None:
            os.close(fd)


def open_dir(directory: str) -> tuple:
    """(fd, None) for the directory itself, or (None, why nothing is written): refused as dir_refusal() says, then
    opened without following any symlink (_walk), so that a swap after the check is refused too."""
    why = dir_refusal(directory)
    if why:
        return None, why
    return _walk(directory)


def read(directory: str, name: str, limit: int = 1 << 20) -> str | None:
    """The text of an output (None when absent, not a regular file, or unreadable); never follows a symlink."""
    fd, _why = open_dir(directory)
    if fd is None:
        return None
    try:
        ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(ffd).st_mode):
            return None
        with os.fdopen(ffd, 'rb') as f:
            ffd = None
            return f.read(limit).decode('utf-8', 'replace')
    finally:
        if ffd is not None:
            os.close(ffd)


def write(directory: str, name: str, text: str, nothing: str = 'nothing written', mode: int = 0o644) -> WriteResult:
    """Write text to directory/name atomically (a temporary file in the same directory, then rename), with mode.

    Never raises for the directory's condition: returns written=False and a warning ending with nothing (what the
    caller did not get, e.g. 'no metrics written') instead. The caller checks the name (plain_name()).
    """
    path = os.path.join(directory, name)
    fd, why = open_dir(directory)
    if fd is None:
        return WriteResult(path, False, f'{why}: {nothing} ({name})', True)
    # a hidden name: no reader of *.prom, *.json or *.html ever takes it for an output
    tmp = f'.{name}.{secrets.token_hex(6)}.tmp'
    try:
        try:
            tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        except OSError as exc:
            reason = 'is not writable' if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else 'cannot be written'
            return WriteResult(path, False, f'{directory} {reason} ({exc.strerror}): {nothing} ({name})', True)
        try:
            with os.fdopen(tfd, 'wb') as f:
                os.fchmod(f.fileno(), mode)  # whatever the umask
                f.write(text.encode('utf-8'))
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as exc:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            return WriteResult(path, False, f'{path} cannot be written ({exc.strerror}): {nothing}')
        return WriteResult(path, True, None)
    finally:
        os.close(fd)


def make_dir(directory: str, mode: int = 0o755) -> str | None:
    """Create directory (and its missing parents, each with mode) unless it exists; why it cannot be written into, or
    None. A path through a symlink is refused before, and never followed while the components are made (_walk)."""
    why = dir_refusal(directory, missing_ok=True)
    if why:
        return why
    fd, why = _walk(directory, create=mode)
    if fd is not None:
        os.close(fd)
    return why
