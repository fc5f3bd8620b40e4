# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whose authority a cleanup acts with: the server process's, never more (no borrowed authority).

Private to the tritonops.shm collection: no stability promise to other code. Standard library only.

The modules run as root, and the regions they judge come from an HTTP API that anyone may answer:
a process in an unprivileged user namespace can call itself ``tritonserver``, bind-mount a root-owned
directory over its own ``/dev/shm`` and list that directory's files as its regions. So, before any
unlink, two rules (docs/concepts.md, "Whose files a cleanup may remove"):

1. **Authority** (``Authority.unlink_refusal``): the server process itself could unlink the file.
   A server in the module's own user namespace with CAP_DAC_OVERRIDE and CAP_FOWNER (root on the host,
   a rootful container) can unlink anything there; any other server only what the kernel's DAC rules
   give its filesystem uid and groups, as seen from the host: the directory writable (and searchable)
   by it, and when the directory is sticky, the file or the directory its own. Capabilities inside
   another user namespace are not counted (the kernel grants them only over inodes mapped into that
   namespace; counting none is the stricter side).
2. **Owner** (``Authority.owner_refusal``): a file is removed only when its owner is the server's user
   (its filesystem uid, as seen from the host) or one of the operator's ``client_users``. A client's
   registration, or a pattern, never gets another program's file removed.

Anything that cannot be read (the server's status file, its shm directory) refuses every unlink, with the reason.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError

CAP_DAC_OVERRIDE = 1
CAP_FOWNER = 3
_NEEDED_CAPS = (1 << CAP_DAC_OVERRIDE) | (1 << CAP_FOWNER)


class Authority(NamedTuple):
    """What the server process may do in its shm directory, and whose files count as its own.

    uid, gids: the server's filesystem uid and its groups (fs gid and supplementary), as seen from here;
    privileged: it is in the module's user namespace with CAP_DAC_OVERRIDE and CAP_FOWNER;
    dir_uid, dir_gid, dir_mode: the shm directory's owner, group and mode;
    owner_uid: the user whose files are the server's own (the server's uid; the directory's owner when
    the operator named the directory and no server process is known);
    reason: why the authority is not known (every unlink is then refused), else None.
    """

    uid: int | None = None
    gids: frozenset = frozenset()
    privileged: bool = False
    dir_uid: int | None = None
    dir_gid: int | None = None
    dir_mode: int = 0
    owner_uid: int | None = None
    reason: str | None = None
    described: str = ''

    @classmethod
    def unknown(cls, reason: str) -> Authority:
        return cls(reason=reason)

    def unlink_refusal(self, file_uid: int) -> str | None:
        """Why the server's own user could not unlink a file of file_uid in the shm directory, or None when it could."""
        if self.reason is not None:
            return f'not removed: {self.reason}'
        if self.privileged:
            return None
        mode, uid = self.dir_mode, self.uid
        if self.dir_uid == uid:
            bits = stat.S_IWUSR | stat.S_IXUSR
        elif self.dir_gid in self.gids:
            bits = stat.S_IWGRP | stat.S_IXGRP
        else:
            bits = stat.S_IWOTH | stat.S_IXOTH
        if mode & bits != bits:
            return (
                f'not removed: the server process ({self.described}) could not remove it itself: its shm directory '
                f'(owner uid {self.dir_uid}, mode {stat.S_IMODE(mode):04o}) is not writable by it (no borrowed authority)'
            )
        if mode & stat.S_ISVTX and uid not in (file_uid, self.dir_uid):
            return (
                f'not removed: the server process ({self.described}) could not remove it itself: the shm directory is '
                f'sticky and the file belongs to uid {file_uid} (no borrowed authority)'
            )
        return None

    def owner_refusal(self, file_uid: int, client_uids: Iterable[int]) -> str | None:
        """Why a file of file_uid is another program's (never removed on a client's word or a pattern), or None."""
        if self.reason is not None:
            return f'not removed: {self.reason}'
        if file_uid == self.owner_uid or file_uid in client_uids:
            return None
        return (
            f"not removed: owned by uid {file_uid}, neither the server's user (uid {self.owner_uid}) nor one of "
            "client_users: another program's file is never removed on a client's word or a pattern"
        )

    def refusal(self, file_uid: int, client_uids: Iterable[int]) -> str | None:
        """The first of unlink_refusal and owner_refusal that refuses, or None when the file may be removed."""
        return self.unlink_refusal(file_uid) or self.owner_refusal(file_uid, client_uids)


def _status_ids(text: str) -> dict[str, list[int]]:
    """{'Uid': [...], 'Gid': [...], 'Groups': [...]} and CapEff (as one int) of /proc/PID/status."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        key, _sep, value = line.partition(':')
        if key in ('Uid', 'Gid', 'Groups'):
            out[key] = [int(v) for v in value.split()]
        elif key == 'CapEff':
            out[key] = [int(value.strip(), 16)]
    return out


def parse_status(text: str, same_userns: bool) -> tuple[int, frozenset, bool]:
    """(filesystem uid, groups, privileged) of a /proc/PID/status text; ValueError when fields are missing.

    Uid/Gid lines are real, effective, saved and filesystem ids: the filesystem ones decide file access.
    """
    ids = _status_ids(text)
    uids, gids = ids.get('Uid') or [], ids.get('Gid') or []
    if len(uids) < 4 or len(gids) < 4:
        raise ValueError('no Uid/Gid lines')
    caps = (ids.get('CapEff') or [0])[0]
    privileged = same_userns and caps & _NEEDED_CAPS == _NEEDED_CAPS
    return uids[3], frozenset([gids[3]] + (ids.get('Groups') or [])), privileged


def read_authority(pid: int | None, shm_dir: str | object, proc: str = '/proc') -> Authority:
    """The Authority of server process pid over shm_dir (pid None: the operator named the directory, no server known).

    shm_dir: the open directory (shm_fs.PinnedDir: its descriptor is stat'ed, never its path), or a path.
    """
    try:
        dir_st = os.fstat(shm_dir.fd) if hasattr(shm_dir, 'fd') else os.stat(shm_dir)
    except OSError as exc:
        return Authority.unknown(
            f'the shm directory {getattr(shm_dir, "path", shm_dir)} cannot be read ({exc.strerror or exc})'
        )
    if pid is None:
        # no server process: the operator named the directory; its owner stands for the server's user
        return Authority(
            uid=None,
            privileged=True,
            dir_uid=dir_st.st_uid,
            dir_gid=dir_st.st_gid,
            dir_mode=dir_st.st_mode,
            owner_uid=dir_st.st_uid,
            described='no server process: shm_dir given',
        )
    try:
        with open(f'{proc}/{pid}/status', encoding='utf-8', errors='replace') as f:
            text = f.read()
        same_userns = os.stat(f'{proc}/{pid}/ns/user').st_ino == os.stat(f'{proc}/self/ns/user').st_ino
        uid, gids, privileged = parse_status(text, same_userns)
    except (OSError, ValueError) as exc:
        return Authority.unknown(
            f'the identity of server process {pid} cannot be read '
            f'({getattr(exc, "strerror", None) or exc}), so what it may remove is not known'
        )
    where = 'this user namespace' if same_userns else 'its own user namespace'
    described = f'pid {pid}, uid {uid} in {where}' + (', privileged' if privileged else '')
    return Authority(
        uid=uid,
        gids=gids,
        privileged=privileged,
        dir_uid=dir_st.st_uid,
        dir_gid=dir_st.st_gid,
        dir_mode=dir_st.st_mode,
        owner_uid=uid,
        described=described,
    )


def client_uids(users: Iterable[object] | None) -> frozenset:
    """The uids of the client_users option (user names or numeric uids); ParameterError for an unknown name."""
    out = set()
    for user in users or ():
        text = str(user).strip()
        if text.isdigit():
            out.add(int(text))
            continue
        try:
            out.add(pwd.getpwnam(text).pw_uid)
        except KeyError:
            raise ParameterError(
                f'client_users: no user named {text!r} on this host (give a user name or a numeric uid)'
            ) from None
    return frozenset(out)
