# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: what a run changes in a shm directory, whichever module runs it (region, sweep).

It owns the directory's side of a cleanup, in the order the safety invariants require (docs/concepts.md): the run lock
(runlock.py), the cleanup record written before a region is unregistered and updated after (invariant 8), each file
renamed to a quarantine name, its holders scanned again, then unlinked by device, inode and ctime or given back
(invariants 3 and 13), the reserved mark of a registered region's file, and the record of wedged regions beside the lock
(wedged.py). It never talks to the server: region_ops.py (triton_shm_region) and sweep.py (triton_shm_sweep) decide,
read and call Triton; they run this work through the directory descriptor their read pinned.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import LockError, ShmFsError
from ansible_collections.tritonops.shm.plugins.module_utils.host import runlock, shm_fs, snapshot, wedged
from ansible_collections.tritonops.shm.plugins.module_utils.outputs import outputs
from ansible_collections.tritonops.shm.plugins.module_utils.rules import facts, vocabulary
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Snapshot, holders_text


class Lock(enum.Enum):
    """What _lock did about the per-server lock."""

    NOT_NEEDED = 'not needed'  # not serialising, already held by this run, or no shm directory to lock
    TAKEN = 'taken'  # taken at once: nobody else was acting on this server
    WAITED = (
        'waited'  # taken after another run released it (read() reads the regions after it, so nothing is out of date)
    )


class Recheck(NamedTuple):
    """The holder re-check of a removal (_remove_files): its read, the files unlinked after it taken out."""

    snap: Snapshot
    current: bool  # False when a file was renamed back since: the read lists it under its quarantine name


class ShmDirWork:
    """The shm directory's side of a run (see the module docstring); a mixin of the Operation that runs it (region,
    sweep). The attributes it needs are declared here; the class using it sets them. shm is the directory the read
    pinned (_located): the snapshot is plain data (facts.py), and every change in the directory goes through this
    descriptor, never its path.
    """

    params: dict  # lock_dir
    serialise: bool
    lock: runlock.ServerLock | None
    shm: shm_fs.PinnedDir | None
    lock_dir: str | None
    sleep: Callable[[float], object]
    clock: Callable[[], float]
    warn: Callable[[str], object]
    check_mode: bool
    outcome: Any  # region_ops.Outcome
    snap: Snapshot | None  # _held() sets it
    _finished: list

    def _located(self, shm: shm_fs.PinnedDir | None) -> Lock:
        """What the read calls once the server is located: keep the directory it pinned, and (not in check mode) lock it."""
        self.shm = shm
        return Lock.NOT_NEEDED if self.check_mode else self._lock(shm)

    def _lock(self, shm: shm_fs.PinnedDir | None) -> Lock:
        """Serialise runs on the shm directory shm (read() asks once, before it reads the regions): runlock.py."""
        if not self.serialise or self.lock is not None or shm is None:
            return Lock.NOT_NEEDED
        directory = self.lock_dir or self.params.get('lock_dir')
        lock = runlock.ServerLock(shm, sleep=self.sleep, clock=self.clock, directory=directory)
        try:
            waited = lock.acquire()
        except OSError as exc:
            raise LockError(
                f'cannot take the run lock {lock.path} ({exc.strerror or exc}): not acting, since a run at the same time '
                'could count the same regions again. Set lock_dir (role variable shm_cleanup_lock_dir) to a directory '
                'on a writable filesystem that only this user can write'
            ) from exc
        if lock.squatter is not None:
            self.warn(
                f'the flock on the shm directory {shm.path} itself is {lock.squatter}: not waiting for it (any tenant of '
                f'the directory can take it); this run holds its own lock ({lock.path})'
            )
        self.lock = lock
        return Lock.WAITED if waited else Lock.TAKEN

    def release(self) -> None:
        """Release the per-server lock (hold() does at the end of its block; the end of the process does too)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _held(self, snap: Snapshot) -> None:
        """Record, once the read is held, what the run plans from: its warnings, the holder scan it judged by (the
        visibility rule), and the shm filesystem's use before (and, until a change, after)."""
        self.snap = snap
        for w in snap.warnings:
            self.warn(w)
        self.outcome.scan = {
            'holders_complete': snap.holders_complete,
            'holders_incomplete_reason': snap.holders_incomplete_reason,
            'pid_namespace': snap.pid_namespace,
        }
        if snap.fs:
            self.outcome.used_before = self.outcome.used_after = snap.fs['used_bytes']

    def _remove_files(
        self, snap: Snapshot, file_plan: list, still_registered: set, recheck: Callable[[], Snapshot] | None = None
    ) -> Recheck | None:
        """Remove the planned files that are still safe to remove; the holder re-check's read (None: nothing planned).

        Invariants 3 and 13: each file is first renamed to a quarantine name inside the shm directory (no client
        can open it by name any more), then the holders are scanned again, then each quarantined file is unlinked,
        or renamed back when someone holds it. A client that attached before the rename is seen by that scan; one
        that opens the name after it finds no file. recheck: what scans them (snapshot.rescan of snap by default); a
        run that wants the state after passes a full read of the server (status, files, holders), which, minus the
        files unlinked here, is that state without another /proc pass.
        """
        if not file_plan:
            return None
        moved = []
        with shm_fs.ShmDir(self.shm) as d:
            try:
                for entry, region in file_plan:
                    q = self._quarantine(d, snap, entry, region, still_registered)
                    if q is not None:
                        moved.append((entry, region, q))
                first = self._recheck(snap, recheck)
            except BaseException:
                # no re-check, no unlink: every file moved so far gets its name back (or is recorded), and says why
                for entry, _region, q in moved:
                    why = 'its holders could not be checked again before the unlink: not removed'
                    why += self._give_back(d, q, snap.server_id)
                    self.outcome.skipped.append({'path': entry['path'], 'reason': why})
                raise
            check, restored, gone = first.snap, not first.current, []
            for entry, _region, q in moved:
                reason = self._unlink(d, check, entry, q)
                if reason is None:
                    gone.append(os.path.join(snap.shm_dir, q.name))
                else:
                    self.outcome.skipped.append({'path': entry['path'], 'reason': reason})
                    restored = restored or q.name != q.original
        return Recheck(check.without(gone), current=not restored)

    def _recheck(self, snap: Snapshot, recheck: Callable[[], Snapshot] | None) -> Recheck:
        """The holders read again: recheck(), the run's full read of the server, or snapshot.rescan of snap. When that
        full read fails (the server stopped answering), the holders alone, all the unlinks need; the read is then not
        the server's current state (current false: the state after is read again later)."""
        if recheck is None:
            return Recheck(snapshot.rescan(snap), current=True)
        try:
            return Recheck(recheck(), current=True)
        except Exception as exc:  # pylint: disable=broad-except  # the files' safety needs only the holders
            self.warn(
                f'the server could not be read again after its unregisters ({exc}): the holders were re-checked alone'
            )
            return Recheck(snapshot.rescan(snap), current=False)

    def _quarantine(
        self, d: shm_fs.ShmDir, snap: Snapshot, entry: dict, region: str | None, still_registered: set
    ) -> shm_fs.Quarantined | None:
        """Rename one planned file to its quarantine name; None (the reason recorded) when it stays as it is."""
        name = entry['name']
        reason = None
        if region in still_registered:
            reason = f"region '{region}' is still registered"
        elif facts.is_quarantine_name(name):
            # left quarantined by a run stopped before its unlink: no client can open it by name
            mark = snap.cleanup_marks.get(name)
            original = mark.name if mark is not None else name
            return shm_fs.Quarantined(name, original, entry['dev'], entry['inode'], entry.get('ctime_ns'), 0)
        else:
            try:
                q = self._rename_to_quarantine(d, entry)
            except ShmFsError as exc:
                self.warn(str(exc))
                reason = str(exc)
            except OSError as exc:
                # never unlinked in place: a client that opens the name between the re-check and the unlink would lose it
                reason = (
                    f'cannot rename it to a quarantine name before removing it ({exc.strerror or exc}): not removed, '
                    'since a client could open it by name between the re-check and the unlink'
                )
            else:
                if q is not None:
                    return q
                reason = 'already removed (by another process) before this run unlinked it'
        self.outcome.skipped.append({'path': entry['path'], 'reason': reason})
        return None

    @staticmethod
    def _rename_to_quarantine(d: shm_fs.ShmDir, entry: dict) -> shm_fs.Quarantined | None:
        """d.quarantine(), and on a tmpfs of another user namespace (a rootless server's, where root's ids are not
        mapped: EOVERFLOW) once more as the directory's owner, whose ids that namespace maps (shm_fs.acting_as)."""
        args = (entry['name'], entry['dev'], entry['inode'], entry.get('ctime_ns'))
        try:
            return d.quarantine(*args)
        except OSError as exc:
            if isinstance(exc, ShmFsError) or exc.errno != errno.EOVERFLOW:
                raise
        st = os.fstat(d.fd)
        with shm_fs.acting_as(st.st_uid, st.st_gid):
            q = d.quarantine(*args)
        return q._replace(owner=(st.st_uid, st.st_gid)) if q is not None else None

    def _unlink(self, d: shm_fs.ShmDir, check: Snapshot, entry: dict, q: shm_fs.Quarantined) -> str | None:
        """Unlink one quarantined file (recorded in removed_files and freed_bytes), or give it back and return why it stays."""
        reason = None
        if not check.holders_complete:
            reason = 'holders could not be fully determined'
        else:
            holders = check.scan.holders_of(q.dev, q.ino)
            if holders:
                reason = f'held by {holders_text(holders)} (re-checked before removal)'
        if reason is not None:
            return reason + self._give_back(d, q, check.server_id)
        try:
            with _as_owner(q):
                freed = d.unlink(q.name, q.dev, q.ino, q.ctime_ns, missing=None)
        except ShmFsError as exc:
            self.warn(str(exc))
            return str(exc) + self._give_back(d, q, check.server_id)
        if freed is None:
            # removed by someone else since it was listed: not this run's work
            return 'already removed (by another process) before this run unlinked it'
        self._finished.append(q.ino)
        self.outcome.removed_files.append(entry['path'])
        self.outcome.freed_bytes += freed
        return None

    def _give_back(self, d: shm_fs.ShmDir, q: shm_fs.Quarantined, server: str | None) -> str:
        """Rename a quarantined file that stays back to its name and unmark it; the text to add to its reason.

        One that stays under its quarantine name is recorded (an orphan or leftover file was not), so that a later
        stale cleanup of this server finishes it once nobody holds it: no pattern matches a quarantine name.
        """
        if q.name == q.original:
            return ''
        try:
            with _as_owner(q):
                back = d.restore(q.name, q.original)
        except ShmFsError as exc:
            self.warn(str(exc))
            self._record_quarantined(d, q, server)
            return f'; it stays under {q.name}: {exc}'
        if not back:
            self._record_quarantined(d, q, server)
            self.warn(
                f'{q.original} in {d.path} was created again while the file it named was quarantined; that file is '
                f'kept under {q.name} (a stale cleanup removes it once nobody holds it)'
            )
            return f'; its name was taken meanwhile, so it stays under {q.name}'
        self._finished.append(q.ino)
        return ''

    def _record_quarantined(self, d: shm_fs.ShmDir, q: shm_fs.Quarantined, server: str | None) -> None:
        """Add a file left under its quarantine name to the cleanup record, unless it is there (a warning when refused)."""
        record = shm_fs.read_cleanup_record(d.fd)
        if q.ino in record or not server:
            return
        record[q.ino] = facts.CleanupMark('', q.original, server)
        try:
            d.write_cleanup_record(record)
        except ShmFsError as exc:
            self.warn(f'{q.name} is not recorded ({exc}): only an orphan pattern matching it removes it')


class RegionFileWork(ShmDirWork):
    """The shm directory's side that only a region run has: the reserved mark of a registered region's file, the
    cleanup record written before its unregisters and updated after (invariant 8), and the wedged record."""

    kind: Any  # kinds.RegionKind
    _record: dict | None
    _ours: set

    def _mark(self, snap: Snapshot, key_name: str, region: str) -> None:
        """Mark the backing file as this region's (reserved); a refusal is a warning, the region stays registered."""
        path = os.path.join(snap.shm_dir, key_name)
        try:
            with shm_fs.ShmDir(self.shm) as d:
                st = d.lstat(key_name)
                if st is None:
                    raise ShmFsError(f'{path} does not exist')
                d.set_mark(key_name, region, st.st_dev, st.st_ino)
        except ShmFsError as exc:
            self.warn(
                f"region '{region}' is registered, but its file could not be marked as the operator's: a later "
                f'stale cleanup would take it once no client maps it ({exc})'
            )
            return
        self.outcome.marked_files.append(path)

    def _update_wedged(self, snap: Snapshot, selected: list, still_registered: set) -> None:
        """Count, in the record beside the run lock (wedged.py), the stale regions this run tried and Triton kept
        registered (refused as in use, or pending); forget those it let go. Under the lock only; a record that cannot be
        written is warned about, and the regions are counted again from the start."""
        if self.lock is None or snap.shm_dir is None or not snap.server_id or not self.kind.files:
            return
        tried = [r for r in selected if r.get('state') in (vocabulary.STALE, vocabulary.WEDGED)]
        if not tried and not snap.wedged:
            return
        kept = set(still_registered) | set(self.outcome.pending)
        gone = set(self.outcome.unregistered)
        listed = [r for r in self.kind.regions(snap) if r.get('name') not in gone]
        after = wedged.updated(snap.wedged, tried, kept, listed, time.time())
        if after == snap.wedged:
            return
        try:
            fd = os.open(self.lock.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                name = wedged.record_name(self.shm.dev, self.shm.ino)
                if after:
                    outputs.write_at(fd, name, wedged.encoded(snap.server_id, after), 0o600)
                else:
                    wedged.forget(fd, name)
            finally:
                os.close(fd)
        except OSError as exc:
            self.warn(f'cannot write the record of wedged regions in {self.lock.directory}: {exc.strerror or exc}')

    def _mark_files(self, snap: Snapshot, file_plan: list) -> set:
        """Invariant 8: record the planned backing files (facts.CLEANUP_XATTR) before their regions are unregistered.

        One record on the shm directory (the files themselves, their ctimes included, are untouched). It keeps
        what an earlier record still names (another server's, or a killed run's), and adds this run's files;
        _update_record() takes out, at the end, what this run finished. A run killed in between leaves the
        record, and the next stale cleanup of the same server process finishes the files it names.

        Returns the regions that must stay registered: when the record cannot be written because the shm directory is
        read-only, their files could not be removed either, and a region unregistered then would strand its file as
        ``foreign`` for good; kept registered (skipped with the reason), a later run on a writable directory finishes
        both. When the record is refused otherwise (no trusted.* attributes: a container without CAP_SYS_ADMIN), the
        cleanup goes on with a warning: a run stopped after a quarantine rename leaves a file under the collection's
        quarantine name, which the next stale cleanup recognises (facts.own_quarantine), and one stopped between an
        unregister and its rename leaves the file to orphan patterns.
        """
        ours = {
            e['inode']: facts.CleanupMark(region, e['name'], snap.server_id or '')
            for e, region in file_plan
            if region is not None
        }
        if not ours:
            return set()
        present = {e['inode'] for e in snap.entries}
        record = {ino: m for ino, m in shm_fs.read_cleanup_record(self.shm.fd).items() if ino in present}
        record.update(ours)
        try:
            with shm_fs.ShmDir(self.shm) as d:
                d.write_cleanup_record(record)
        except ShmFsError as exc:
            if shm_fs.read_only(self.shm):
                kept = {m.region for m in ours.values()}
                reason = (
                    f'the shm directory {snap.shm_dir} is read-only: its file could not be recorded nor removed, so '
                    'the region stays registered (unregistered, its file would be left as foreign for good); a '
                    'later run on a writable directory unregisters it and removes the file'
                )
                self.outcome.skipped.extend({'name': name, 'reason': reason} for name in sorted(kept))
                self.warn(f'{len(kept)} stale region(s) kept registered: {reason}')
                return kept
            self.warn(
                f'the files are not recorded before their regions are unregistered ({exc}): a run stopped between an '
                'unregister and its quarantine rename leaves the file to orphan patterns'
            )
            return set()
        self._record = record
        self._ours = set(ours)
        return set()

    def _update_record(self, snap: Snapshot, still_registered: set) -> None:
        """At the end of a run (also a failed one): take out of the record what this run finished or gave back.

        Kept: the files of pending regions (a later stale cleanup removes them once the server drops the region)
        and of regions whose unregister was not answered, files left under a quarantine name, and other entries.
        """
        done = set(self._finished)
        done.update(
            ino
            for ino in self._ours
            if self._record[ino].region in still_registered and self._record[ino].region not in self.outcome.pending
        )
        if not done or snap.shm_dir is None:
            return
        # read again, never this run's copy: a run that found the lock squatted by another user overlaps other root
        # runs, and writing back its copy would erase what they recorded meanwhile (their files then lost to a kill)
        current = shm_fs.read_cleanup_record(self.shm.fd)
        if not done & set(current):
            return
        record = {ino: m for ino, m in current.items() if ino not in done}
        try:
            with shm_fs.ShmDir(self.shm) as d:
                d.write_cleanup_record(record)
        except ShmFsError as exc:
            self.warn(str(exc))


def _as_owner(q: shm_fs.Quarantined) -> contextlib.AbstractContextManager:
    """The identity a quarantined file's unlink or restore runs as: the one its rename ran as."""
    return shm_fs.acting_as(*q.owner) if q.owner is not None else contextlib.nullcontext()
