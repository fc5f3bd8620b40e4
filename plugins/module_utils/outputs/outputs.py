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
import time
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
    if '\0' in directory:
        return f'{directory!r} contains a NUL character'
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if not missing_ok:
            return f'{directory} does not exist on this host'
        st = None
    except OSError as exc:
        return f'{directory} cannot be read ({exc.strerror})'
    try:
        if st is not None and stat.S_ISLNK(st.st_mode):
            return f'{directory} is a symlink to {os.path.realpath(directory)} (not followed; give the real directory)'
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return f'{directory} is not a directory'
        real = os.path.realpath(directory)
    except OSError as exc:  # a component changed while it was resolved (a swap in progress)
        return f'{directory} changed while it was checked ({exc.strerror}): not followed'
    if real != _absolute(directory):
        return f'{directory} leads to {real} through a symlink (not followed; give the real directory)'
    return None


def _absolute(directory: str) -> str:
    """The absolute path, normalised as realpath would (POSIX keeps a leading '//': realpath does not)."""
    return '/' + os.path.abspath(directory).lstrip('/')


def report_dir_refusal(directory: str) -> str | None:
    """Why a report directory on the controller is refused (None when it may be written into or created).

    dir_refusal() with missing_ok, and a relative path refused: Ansible runs a local task in its playbook's (or role's)
    directory, inside the installed collection. Whose directory it is, is checked as it is opened (_walk).
    """
    if not isinstance(directory, str) or '\0' in directory:
        return f'{directory!r} is not a path'
    if not directory.startswith('/'):
        return (
            f'{directory} is a relative path: the report would be written inside the installed collection '
            f"(Ansible runs the controller's tasks in the playbook's directory); give an absolute path, "
            f'e.g. $PWD/{directory}'
        )
    return dir_refusal(directory, missing_ok=True)


def _swap_risk(directory: str, part: str, parent: os.stat_result, st: os.stat_result) -> str | None:
    """Why another user could have made or could replace the directory part (stat st) of directory, in parent; None
    when nobody but the caller or root could. A parent anyone may write in renames at anyone's word, unless it is sticky
    (/tmp), where only an entry's owner does: there, part must be the caller's or root's (not made first by another)."""
    if not parent.st_mode & stat.S_IWOTH:
        return None
    if not parent.st_mode & stat.S_ISVTX:
        return (
            f'{directory}: {part} is in a directory anyone may write in (no sticky bit): give a directory of your own'
        )
    if st.st_uid in (0, os.geteuid()):
        return None
    return (
        f"{directory}: {part} is uid {st.st_uid}'s, in a directory anyone may write in: another user may have made it "
        'first, and could replace what is written; give a directory of your own'
    )


def _walk(directory: str, create: int | None = None) -> tuple:
    """(fd, None) for directory, opened one component at a time from the root with O_NOFOLLOW at each step, so that
    no symlink is ever followed, whatever is swapped meanwhile; or (None, why). create: a mode, to make each missing
    component on the way (mkdirat, then that mode whatever the umask). A directory another user could have planted
    or could swap (_swap_risk: in /tmp, one that is not the caller's or root's) is refused, and so is a final
    directory anyone may write in without the sticky bit."""
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
            parent = os.fstat(fd)
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            risk = _swap_risk(directory, part, parent, st)
            if risk:
                return None, risk
        st = os.fstat(fd)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            return None, (
                f'{directory} may be written by anyone (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit): another '
                'user could replace the files; give a directory of your own'
            )
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


# our temporary files: hidden (no reader of *.prom, *.json or *.html takes one for an output), short (any name of up to
# 255 bytes can be written), and ours by their prefix (a run killed part-way leaves one: a later write removes it)
TMP_PREFIX = '.tritonops-tmp-'
STALE_TMP_AGE = 3600.0  # seconds: a temporary file older than this is a killed run's, never one being written


def write(directory: str, name: str, text: str, nothing: str = 'nothing written', mode: int = 0o644) -> WriteResult:
    """Write text to directory/name atomically (write_at), with mode.

    Never raises for the directory's or the text's condition: returns written=False and a warning ending with nothing
    (what the caller did not get, e.g. 'no metrics written') instead. The caller checks the name (plain_name()).
    An interrupted write (the call's time limit) removes
    its temporary file before the interruption goes on.
    """
    path = os.path.join(directory, name)
    try:
        data = text.encode('utf-8')
    except UnicodeEncodeError:
        return WriteResult(
            path, False, f'{path}: the text has a character UTF-8 cannot carry (from non-UTF-8 input): {nothing}'
        )
    fd, why = open_dir(directory)
    if fd is None:
        return WriteResult(path, False, f'{why}: {nothing} ({name})', True)
    try:
        write_at(fd, name, data, mode)
    except Unwritable as exc:
        reason = 'is not writable' if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else 'cannot be written'
        return WriteResult(path, False, f'{directory} {reason} ({exc.strerror}): {nothing} ({name})', True)
    except OSError as exc:
        return WriteResult(path, False, f'{path} cannot be written ({exc.strerror}): {nothing}')
    finally:
        os.close(fd)
    return WriteResult(path, True, None)


class Unwritable(OSError):
    """write_at: the directory takes no temporary file (read-only, full, not ours); nothing was written there."""


def write_at(fd: int, name: str, data: bytes, mode: int) -> None:
    """Replace name in the open directory fd with data, atomically: a temporary file of ours beside it (TMP_PREFIX),
    written with mode whatever the umask, synced, then renamed over name; never follows a symlink.

    The one atomic write of the collection: write() for an output by its directory's path, the run's private state
    (the wedged regions' record) by its pinned directory's descriptor. Raises Unwritable when the temporary file cannot
    be made, OSError when it cannot be written or renamed; no temporary file stays behind, also when the call's time
    limit interrupts it. Our temporary files a killed run left (STALE_TMP_AGE) are removed after a write.
    """
    tmp = f'{TMP_PREFIX}{secrets.token_hex(6)}'
    try:
        tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    except OSError as exc:
        raise Unwritable(exc.errno, exc.strerror) from exc
    try:
        with os.fdopen(tfd, 'wb') as f:
            os.fchmod(f.fileno(), mode)  # whatever the umask
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:  # an OSError, or the call's time limit: no temporary file stays behind
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        raise
    _remove_stale_temporaries(fd)


def _remove_stale_temporaries(fd: int) -> None:
    """Remove our temporary files (TMP_PREFIX) that a killed run left in the directory: regular files of the caller's,
    untouched for STALE_TMP_AGE. Best effort: what cannot be looked at stays."""
    try:  # the directory's fd is an O_PATH one: a readable one of the same directory lists it
        lfd = os.open('.', os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return
    try:
        names = [n for n in os.listdir(lfd) if n.startswith(TMP_PREFIX)]
    except OSError:
        return
    finally:
        os.close(lfd)
    now = time.time()
    for n in names:
        try:
            st = os.lstat(n, dir_fd=fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and now - st.st_mtime > STALE_TMP_AGE:
                os.unlink(n, dir_fd=fd)
        except OSError:
            pass


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
