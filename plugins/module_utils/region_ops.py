# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The executor of triton_shm_region: reads, holds the lock, carries a region_plan.Plan out, records what it did.

Private to the tritonops.shm collection: no stability promise to other code.
What to do is decided by region_plan.py (pure, from one read and the parameters); this file does the I/O
in the order the safety invariants require (docs/concepts.md): unregister first, wait until the region is
gone from the status, quarantine each file, re-check holders, then unlink only unheld regular files by
(device, inode) inside the shm directory, or give them back. Each step is recorded in an Outcome,
whose result() only formats it, on success and after a failure part-way. RegionOps is a operation.Operation:
base.run_operation runs it as every module runs, check -> read -> plan -> preview (check mode) or execute ->
result, with the per-server lock (taken inside read() once the server is located, before its regions are read;
not in check mode) held from read() until the result and the metrics textfile are written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils import (
    authority,
    classification,
    facts,
    gpu,
    kinds,
    nvml,
    region_plan,
    results,
    runlock,
    shm_fs,
    snapshot,
    vocabulary,
    wedged,
)
from ansible_collections.tritonops.shm.plugins.module_utils.client import unregister_batch
from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    LockError,
    ShmFsError,
    TritonError,
    TritonOpsError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.facts import Snapshot, holders_text
from ansible_collections.tritonops.shm.plugins.module_utils.operation import Operation, run_steps
from ansible_collections.tritonops.shm.plugins.module_utils.procfs import Backoff
from ansible_collections.tritonops.shm.plugins.module_utils.region_plan import IN_USE_TIMEOUT, Plan, same
from ansible_collections.tritonops.shm.plugins.module_utils.versions import version_tuple


class Unregister(enum.Enum):
    """What _unregister did with one region."""

    UNREGISTERED = 'unregistered'
    GONE = 'gone'  # no longer registered: not this run's work
    KEPT = 'kept'  # still registered (in use past in_use_timeout, or a name the client cannot address)


class Lock(enum.Enum):
    """What _lock did about the per-server lock."""

    NOT_NEEDED = 'not needed'  # not serialising, already held by this run, or no shm directory to lock
    TAKEN = 'taken'  # taken at once: nobody else was acting on this server
    WAITED = (
        'waited'  # taken after another run released it (read() reads the regions after it, so nothing is out of date)
    )


class Reading(NamedTuple):
    """What a run plans from: the snapshot of the server, and the regions of the run's kind in it."""

    snap: Snapshot
    regions: list


# Triton 2.53 (NGC 24.12) and later accept an unregister while requests are in flight and keep the
# region listed until they finish; before, an answered unregister removed it at once.
DEFERRED_UNREGISTER_VERSION = (2, 53)
# Seconds to wait, after CUDA regions were unregistered, for NVML to stop charging their memory to the server (1 GiB
# came back within 3 s on an H200, docs/cuda.md)
GPU_SETTLE_TIMEOUT = 10.0


def criteria_of(p: dict, orphans: bool = True) -> classification.Criteria:
    """The parameters' classification criteria, their client_users resolved here, at the edge (authority.client_uids:
    ParameterError for an unknown name): the rules (region_plan, classification) get uids and look nobody up."""
    return region_plan.criteria(p, authority.client_uids(p.get('client_users')), orphans)


def _may_defer(snap: Snapshot) -> bool:
    """Whether this server may keep an unregistered region listed (24.12+, or a version we cannot read)."""
    version = version_tuple(snap.metadata.get('version'))
    return version is None or version >= DEFERRED_UNREGISTER_VERSION


@dataclasses.dataclass
class Outcome:
    """What one run did (in check mode: would do), recorded step by step so that a failure part-way reports it.

    result() formats it as the module's result; nothing else is kept between the steps of a run.
    """

    check_mode: bool = False
    plan: Plan | None = None  # the plan carried out (or, in check mode, reported)
    registered: list = dataclasses.field(default_factory=list)
    unregistered: list = dataclasses.field(default_factory=list)
    pending: list = dataclasses.field(default_factory=list)  # unregistered, still listed past in_use_timeout (2.53+)
    removed_files: list = dataclasses.field(default_factory=list)
    created_files: list = dataclasses.field(default_factory=list)
    marked_files: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    freed_bytes: int = 0
    freed_unlinked_bytes: int = 0  # the unlinked files the server mapped for the dangling regions unregistered
    gpu: gpu.Freed | None = None  # CUDA: the server's NVML charge before and after the unregister (None: not measured)
    before: dict | None = None  # the diff: regions (and files) before, and after
    after: dict | None = None
    used_before: int | None = None  # the shm filesystem's used bytes before and after
    used_after: int | None = None
    scan: dict | None = None  # holders_complete, holders_incomplete_reason, pid_namespace of the read planned from
    before_result: dict | None = None  # with inventory: what triton_shm_info would have returned for that read
    regions_after: list | None = None  # the regions of the kind after the change (predicted in check mode)
    inventory_after: dict | None = None  # with inventory, outside check mode: what triton_shm_info would return after

    def done_something(self) -> bool:
        return bool(
            self.registered
            or self.unregistered
            or self.pending
            or self.removed_files
            or self.created_files
            or self.marked_files
        )

    def result(self, finished: bool = True, diff: bool = False) -> dict:
        """The module's result: what was done (also after a failure part-way), then, when finished, the state after.

        changed is what really changed (in check mode: what would change), also after a failure; an
        unregister the server accepted but deferred (pending) is a change: the server will drop the region.
        finished=False (a failure) leaves out what is read after the change: regions, after and the diff.
        diff: add the diff (before and after) when the run got as far as planning it.
        """
        changed = (self.plan is not None and self.plan.changed) if self.check_mode else self.done_something()
        out = {
            'changed': changed,
            'registered': self.registered,
            'unregistered': self.unregistered,
            'pending': self.pending,
            'removed_files': self.removed_files,
            'created_files': self.created_files,
            'marked_files': self.marked_files,
            'skipped_items': self.skipped,
            'freed_bytes': self.freed_bytes,
            'freed_unlinked_bytes': self.freed_unlinked_bytes,
            'freed_gpu_bytes': self.gpu.bytes if self.gpu is not None else None,
        }
        if self.before_result is not None:
            out['before'] = self.before_result
        if self.scan is not None:
            out.update(self.scan)
        if self.plan is not None and self.plan.threshold is not None:
            out['threshold'] = self.plan.threshold.as_dict()
        if self.gpu is not None and self.gpu.before is not None:
            out['server_gpu_bytes_before'] = self.gpu.before
            out['server_gpu_bytes_after'] = self.gpu.after
        if self.used_before is not None:
            out['shm_used_bytes_before'] = self.used_before
            out['shm_used_bytes_after'] = self.used_after
        if not finished:
            return out
        out['regions'] = self.regions_after if self.regions_after is not None else []
        if self.inventory_after is not None:
            out['after'] = self.inventory_after
        if diff and self.before is not None:
            out['diff'] = {'before': self.before, 'after': self.after}
        return out


class ShmDirWork:
    """What a run that changes a shm directory does there, whichever module runs it (triton_shm_region, triton_shm_sweep):
    take the run lock of the directory (runlock.py), and remove planned files safely (quarantine rename, holders
    scanned again, unlink by device and inode, or give the file back).

    The class using it sets: params (lock_dir, inventory), serialise, lock (None), shm (None), lock_dir, sleep, clock,
    warn, check_mode, outcome (an Outcome: skipped, removed_files, freed_bytes), _finished ([]); and, when params has
    inventory, _read_again(). shm is the shm directory the read pinned (_located keeps it): the snapshot is plain data
    (facts.py), and every change in the directory goes through this descriptor, never its path.
    """

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
        """Release the per-server lock (locked() does at the end of its block; the end of the process does too)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _remove_files(self, snap: Snapshot, file_plan: list, still_registered: set) -> Snapshot | None:
        """Remove the planned files that are still safe to remove; return the state after, when inventory asks for it.

        Invariants 3 and 13: each file is first renamed to a quarantine name inside the shm directory (no client
        can open it by name any more), then the holders are scanned again, then each quarantined file is unlinked,
        or renamed back when someone holds it. A client that attached before the rename is seen by that scan; one
        that opens the name after it finds no file. When the state after the change is asked for, that scan is a
        full read of the server (status, files, holders), returned without the files unlinked here.
        """
        if not file_plan:
            return None
        want_after = bool(self.params.get('inventory'))
        moved = []
        with shm_fs.ShmDir(self.shm) as d:
            for entry, region in file_plan:
                q = self._quarantine(d, snap, entry, region, still_registered)
                if q is not None:
                    moved.append((entry, region, q))
            check = self._read_again() if want_after else snapshot.rescan(snap)
            gone = []
            restored = False
            for entry, region, q in moved:
                reason = self._unlink(d, check, entry, q)
                if reason is None:
                    gone.append(os.path.join(snap.shm_dir, q.name))
                else:
                    self.outcome.skipped.append({'path': entry['path'], 'reason': reason})
                    restored = restored or q.name != q.original
        if not want_after:
            return None
        if restored:
            check = self._read_again()  # the listing of the scan saw quarantine names since renamed back
        fs = None
        if check.shm_dir is not None:
            try:
                fs = shm_fs.usage(self.shm)
            except OSError:
                pass
        return check.without(gone, fs=fs)

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


class RegionOps(ShmDirWork, Operation):
    """One module run: read, plan (region_plan), then, unless check mode, act, recording everything done."""

    def __init__(
        self,
        client: Any,
        params: dict,
        check_mode: bool = False,
        warn: Callable[[str], object] | None = None,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        serialise: bool = True,
        lock_dir: str | None = None,
        diff: bool = False,
        read_nvml: Callable[[], Any] | None = None,
    ) -> None:
        self.client = client
        self.serialise = serialise
        self.lock_dir = lock_dir  # runlock.lock_dir() when None
        self.lock = None
        self.shm = None  # the shm directory the read pinned (_located): this run acts through it
        self.params = params
        self.kind = kinds.KINDS[params.get('kind') or 'system']  # what differs between kinds (kinds.py)
        self.check_mode = check_mode
        self.warn = warn or (lambda msg: None)
        self.sleep = sleep
        self.clock = clock
        self.diff = diff
        self.read_nvml = read_nvml or nvml.read  # the GPU memory a CUDA unregister gave back (gpu.measure_freed)
        self.outcome: Outcome | None = None  # what this run did (or, in check mode, would do): read() starts it
        self.snap = None  # the read this run planned from
        self.snap_after = None  # the read before unlinking, when it is also the state returned after the change
        self._criteria = None  # the parameters' classification.Criteria, client users resolved once per run
        self._record = None  # the cleanup record this run wrote ({inode: facts.CleanupMark}), if it did
        self._ours = set()  # the inodes this run added to it
        self._finished = []  # the inodes of files this run removed or gave back to a holder

    @property
    def in_use_timeout(self) -> float:
        return self.params.get('in_use_timeout', IN_USE_TIMEOUT)

    @property
    def criteria(self) -> classification.Criteria:
        if self._criteria is None:
            self._criteria = criteria_of(self.params)
        return self._criteria

    def run(self) -> dict:
        """The whole run, as a module's main() does it (operation.run_steps: the tests' and benches' entry); its result."""
        return run_steps(self, self.check_mode)

    present = absent = run  # the state comes from the parameters

    def check(self) -> None:
        """ParameterError for what the argument spec cannot check (region_plan.check_params); warns about broad patterns."""
        for warning in region_plan.check_params(self.params, self.client.unaddressable):
            self.warn(warning)

    # -- read and lock ----------------------------------------------------------------------------

    def read(self) -> Reading:
        """Read what the run plans from: the server's snapshot, with the region list of the run's kind.

        The per-server lock (not in check mode) is taken as soon as the server is located, before its regions, files
        and holders are read: a run that read first and locked after could plan from what another run changed in
        between (it would unregister again what that run had unregistered, and report it as its own).
        """
        p = self.params
        self.outcome = Outcome(check_mode=self.check_mode)
        try:
            snap = snapshot.read_server(
                self.client,
                server_pid=p.get('server_pid'),
                shm_dir=p.get('shm_dir'),
                require_readable_dir=p.get('shm_dir') is not None,
                kinds=(self.kind.name,),
                backend_patterns=self.criteria.backend_patterns,
                clients_share_pid_namespace=bool(p.get('clients_share_pid_namespace')),
                on_located=self._located,
                read_nvml=self.read_nvml,
                lock_dir=self.lock_dir or p.get('lock_dir'),
            )
        except BaseException:
            self.release()
            raise
        if snap.shm_dir is None:
            self.shm = None  # pinned, then not listed: nothing in it is judged or touched
        return Reading(snap, self.kind.regions(snap))

    @contextlib.contextmanager
    def locked(self, reading: Reading) -> Iterator[Reading]:
        """Hold the per-server lock that read() took (not in check mode) until the block ends; yields reading."""
        try:
            if reading.snap is not None:
                self.snap = reading.snap
                for w in self.snap.warnings:
                    self.warn(w)
                if self.snap.fs:
                    self.outcome.used_before = self.outcome.used_after = self.snap.fs['used_bytes']
                self.outcome.scan = {  # the holder scan this run planned from (the visibility rule)
                    'holders_complete': self.snap.holders_complete,
                    'holders_incomplete_reason': self.snap.holders_incomplete_reason,
                    'pid_namespace': self.snap.pid_namespace,
                }
            yield reading
        finally:
            self.release()

    hold = locked  # operation.Operation

    # -- plan (pure: region_plan) ----------------------------------------------------------------

    def plan(self, reading: Reading) -> Plan:
        """The plan for the parameters and what was read; with inventory, also the read as triton_shm_info shows it."""
        p = self.params
        snap = reading.snap
        if p['state'] == 'present':
            return self.kind.plan_present(snap, p)
        orphans = bool(p.get('orphan_files') or p.get('inventory'))
        records = classification.classify(snap, self.criteria if orphans else criteria_of(p, orphans=False))
        if p.get('inventory'):
            self.outcome.before_result = results.info_result(snap, records)
        return self.kind.plan_absent(snap, records, p, self.criteria, self.client.unaddressable)

    # -- execute ----------------------------------------------------------------------------------

    def _planned(self, plan: Plan) -> Outcome:
        outcome = self.outcome
        outcome.plan = plan
        outcome.before, outcome.after = plan.before, {k: list(v) for k, v in plan.after.items()}
        for w in plan.warnings:
            self.warn(w)
        outcome.skipped.extend(plan.skipped)
        return outcome

    def preview(self, plan: Plan) -> Outcome:
        """Check mode: the plan as the outcome (what would be registered, unregistered, removed), touching nothing."""
        outcome = self._planned(plan)
        outcome.registered = [r.name for r in plan.register]
        outcome.unregistered = sorted(plan.selected_names)
        outcome.removed_files = [e['path'] for e, _n in plan.files]
        outcome.freed_bytes = sum(e['allocated_bytes'] for e, _n in plan.files)
        outcome.freed_unlinked_bytes = unlinked_freed(self.snap, plan.selected_names) if self.kind.files else 0
        outcome.created_files = [os.path.join(self.snap.shm_dir, plan.create)] if plan.create else []
        outcome.marked_files = [path for path, _n in plan.marks]
        outcome.regions_after = plan.predicted_regions()
        return outcome

    def execute(self, plan: Plan) -> Outcome:
        """Carry the plan out, recording each step in the outcome as it is done, then read the state after."""
        if self.check_mode:
            raise RuntimeError('check mode previews the plan (operation.run_steps), it never executes it')
        self._planned(plan)
        if plan.register or plan.marks:
            self._present(plan)
        elif plan.selected or plan.files:
            try:
                self._unregister_then_remove(self.snap, plan.selected, plan.files)
            finally:
                if self.kind.files:  # what the dangling regions' unlinked files gave back, once gone from the status
                    self.outcome.freed_unlinked_bytes = unlinked_freed(self.snap, self.outcome.unregistered)
                self._record_after()
                self._measure_gpu()
        self._read_after()
        return self.outcome

    def _present(self, plan: Plan) -> None:
        """Register (creating the backing file when planned) and mark; or mark the file of a region registered as asked."""
        p = self.params
        snap = self.snap
        if not plan.register:
            for path, name in plan.marks:
                self._mark(snap, os.path.basename(path), name)
            return
        created = None
        if plan.create:
            with shm_fs.ShmDir(self.shm) as d:
                created = d.create(plan.create, plan.need)
            self.outcome.created_files.append(os.path.join(snap.shm_dir, plan.create))
        try:
            self._register_all(
                self.kind.name,
                plan.register,
                lambda name: self.kind.register(self.client, name, p),
                lambda cur: self.kind.restore(self.client, cur),
            )
            if self.kind.files and snap.shm_dir is not None:
                key_name = facts.key_to_name(p['key'])
                for name in self.outcome.registered:
                    self._mark(snap, key_name, name)
        except TritonError:
            if created is not None and not self.outcome.registered:
                # nothing uses the file we created: take it back (only that very file, by device and inode)
                with shm_fs.ShmDir(self.shm) as d:
                    d.unlink(plan.create, created.st_dev, created.st_ino)
                self.outcome.created_files = []
            raise
        finally:
            self._measure_after()

    def _read_after(self) -> None:
        """The state after a finished run: the regions of the kind, and with inventory what triton_shm_info would return."""
        if self.outcome.regions_after is None:
            try:
                self.outcome.regions_after = self.client.status(self.kind.name)
            except TritonError:
                self.outcome.regions_after = (self.outcome.after or {}).get('regions', [])
        if self.params.get('inventory'):
            self.outcome.inventory_after = self._inventory_after()

    def _inventory_after(self) -> dict:
        """What triton_shm_info would return now (see _read_again), still under the per-server lock."""
        if self.snap_after is None and not self.outcome.done_something() and self.outcome.before_result is not None:
            return self.outcome.before_result  # nothing changed since the read this run selected from
        snap = self.snap_after or self._read_again()
        result = results.info_result(snap, classification.classify(snap, self.criteria))
        result['server'].update(
            located_by=self.snap.located_by, not_found_reason=self.snap.server_reason if self.snap.pid is None else None
        )
        return result

    def _read_again(self) -> Snapshot:
        """The server's shared memory read again: status, files and a full holder scan.

        The server found before is kept; server.live and server.ready are not measured.
        """
        return snapshot.read_server(
            self.client,
            server_pid=self.snap.pid,
            shm_dir=self.snap.shm_dir,
            shm=self.shm,
            kinds=(self.kind.name,),
            backend_patterns=self.criteria.backend_patterns,
            clients_share_pid_namespace=self.snap.visibility.clients_share_pid_namespace,
        )

    def _measure_gpu(self) -> None:
        """For a kind whose regions are GPU memory: what came back, measured through NVML (the server's charge before,
        from the read this run planned from, and after, read again until it settles)."""
        ev = self.snap.gpu if self.snap is not None else None
        if not self.kind.gpu_memory or ev is None:
            return
        gone = set(self.outcome.unregistered) | set(self.outcome.pending)
        expected = sum(int(r.get('byte_size') or 0) for r in self.kind.regions(self.snap) if r['name'] in gone)
        before = gpu.server_charge(ev.reading, self.snap.pid)
        freed = gpu.measure_freed(
            before, self.snap.pid, expected, self.read_nvml, self.sleep, self.clock, GPU_SETTLE_TIMEOUT
        )
        self.outcome.gpu = freed
        if freed.bytes is not None and not gpu.all_back(freed.bytes, expected):
            self.warn(
                f'{expected} bytes of CUDA regions were unregistered, but NVML shows {freed.bytes} bytes back from the '
                f'server after {freed.seconds}s (it charges the server {freed.after} bytes): a request still in flight '
                'may hold them, or the memory belongs to a live process (docs/cuda.md, "memory does not come back")'
            )

    def _measure_after(self) -> None:
        if self.snap and self.snap.shm_dir and not self.check_mode:
            try:
                self.outcome.used_after = shm_fs.usage(self.shm)['used_bytes']
            except OSError:
                pass

    # -- the result (formats what was recorded: no I/O) --------------------------------------------

    def result(self, outcome: Outcome | None = None, finished: bool = True, diff: bool | None = None) -> dict:
        """The module's result from outcome (this run's by default): Outcome.result."""
        return (outcome or self.outcome or Outcome()).result(finished, self.diff if diff is None else diff)

    # -- the I/O: unregister with the in-use retry ---------------------------------------------------

    def _unregister(self, kind: str, name: str, refused: TritonError | None = None, once: bool = False) -> Unregister:
        """Unregister one region; KEPT means it stays registered, with the reason recorded in skipped.

        refused: the server's refusal of an unregister already sent (by a batch), handled as the first answer.
        once: a wedged region (wedged.py) is tried once a run, its refusal not waited out.
        """
        backoff = Backoff(timeout=0 if once else self.in_use_timeout, sleep=self.sleep, clock=self.clock)
        while True:
            exc = refused
            refused = None
            if exc is None:
                try:
                    self.client.unregister(kind, name)
                    return Unregister.UNREGISTERED
                except TritonError as answer:
                    exc = answer
            if exc.unaddressable:
                self.outcome.skipped.append({'name': name, 'reason': exc.msg})
                return Unregister.KEPT
            if exc.not_found:
                return Unregister.GONE
            if not exc.in_use:
                raise exc
            if not backoff.wait():
                reason = (
                    f'wedged: still refused as in use, tried once this run (a restart frees it): {exc.server_error}'
                    if once
                    else f'still in use after {self.in_use_timeout}s (requests in flight): {exc.server_error}'
                )
                self.outcome.skipped.append({'name': name, 'reason': reason})
                return Unregister.KEPT

    def _wait_gone(self, kind: str, specs: dict, once: bool = False) -> set:
        """Poll the status until no region of specs {name: spec} is listed, within in_use_timeout; return those still listed.

        Triton 24.12 and later accept an unregister while requests are in flight and keep the region
        listed until they finish: its file must not be unlinked, nor the name registered again, before then.
        A name listed with another spec is a new registration (a client registered the name again), not ours.
        """
        if not specs:
            return set()
        backoff = Backoff(timeout=0 if once else self.in_use_timeout, sleep=self.sleep, clock=self.clock)
        while True:
            listed = {
                r.get('name')
                for r in self.client.status(kind)
                if r.get('name') in specs and same(r, specs[r.get('name')])
            }
            if not listed or not backoff.wait():
                return listed

    # -- register --------------------------------------------------------------------------------

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

    def _register_all(
        self, kind: str, todo: list, register: Callable[[str], object], restore: Callable[[dict], object]
    ) -> None:
        """Register each (name, current) of todo; a different current spec is unregistered first.

        When the server refuses the new spec after the old one was unregistered, the old spec is
        registered again so that a refused change leaves the region as it was.
        """
        for name, cur in todo:
            if cur is not None:
                if self._unregister(kind, name) is Unregister.KEPT:
                    raise TritonError(
                        f"re-register {kind} region '{name}': it stays in use: Triton refused to unregister "
                        f'its current registration for {self.in_use_timeout}s because requests are in '
                        'flight through it, so nothing changed and it keeps its current spec; run again '
                        'when its clients are idle, or give in_use_timeout more seconds'
                    )
                if self._wait_gone(kind, {name: cur}):
                    self.outcome.pending.append(name)
                    raise TritonError(
                        f"re-register {kind} region '{name}': it was unregistered but is still listed after "
                        f'{self.in_use_timeout}s (requests in flight: Triton 24.12 and later remove it when '
                        'they finish); not registered again, run again later'
                    )
            try:
                register(name)
            except TritonError as exc:
                if cur is None:
                    raise
                try:
                    restore(cur)
                except TritonError as again:
                    self.outcome.unregistered.append(name)
                    raise type(exc)(
                        f'{exc.msg}; restoring the previous spec failed too, the region is now unregistered: '
                        f'{again.msg}',
                        url=exc.url,
                        status=exc.status,
                        server_error=exc.server_error,
                        transport=exc.transport,
                    ) from exc
                raise type(exc)(
                    f'{exc.msg}; the previous spec was registered again, the region is unchanged',
                    url=exc.url,
                    status=exc.status,
                    server_error=exc.server_error,
                    transport=exc.transport,
                ) from exc
            if cur is not None:
                self.outcome.unregistered.append(name)
            self.outcome.registered.append(name)

    # -- unregister, then remove ----------------------------------------------------------------

    def _unregister_then_remove(self, snap: Snapshot, selected: list, file_plan: list) -> None:
        """Invariant 1: unregister first; a file is removed only once its region is gone from the status."""
        still_registered = set()
        kept = self._mark_files(snap, file_plan)
        if kept:
            selected = [rec for rec in selected if rec['name'] not in kept]
            file_plan = [action for action in file_plan if action.region not in kept]
        try:
            try:
                self._unregister_selected(self.kind.name, selected, still_registered)
                self._deferred(selected, still_registered)
            except TritonError:
                self._salvage_files(snap, selected, file_plan, still_registered)
                raise
            self.snap_after = self._remove_files(snap, file_plan, still_registered)
        finally:
            self._update_record(snap, still_registered)
            self._update_wedged(snap, selected, still_registered)

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
                wedged.write(fd, self.shm.dev, self.shm.ino, snap.server_id, after)
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

    def _unregister_selected(self, kind: str, selected: list, still_registered: set) -> None:
        """Unregister each selected region; add the names that stay registered (skipped with the reason) to still_registered.

        The unregisters go out as one batch (the transport may send several at once: client.UnregisterBatch);
        a region refused as in use is retried with backoff as its answer comes, while the batch goes on. On a
        failure no further unregister is sent, the answers of those already sent are recorded, then it is raised.
        """
        batch = unregister_batch(self.client, kind, [rec['name'] for rec in selected])
        tried_once = {rec['name'] for rec in selected if rec.get('state') == vocabulary.WEDGED}
        first = len(self.outcome.unregistered)
        failure = None
        try:
            for name, refused in batch:
                if failure is not None:
                    if refused is None:  # sent before the failure: done, and reported as done
                        self.outcome.unregistered.append(name)
                    continue
                try:
                    outcome = (
                        self._unregister(kind, name, refused, once=name in tried_once)
                        if refused is not None
                        else Unregister.UNREGISTERED
                    )
                except TritonError as exc:
                    failure = exc
                    batch.stop()
                    continue
                if outcome is Unregister.UNREGISTERED:
                    self.outcome.unregistered.append(name)
                elif outcome is Unregister.KEPT:
                    still_registered.add(name)
        finally:
            # in the order selected, whatever order the answers came in
            order = {rec['name']: i for i, rec in enumerate(selected)}
            self.outcome.unregistered[first:] = sorted(self.outcome.unregistered[first:], key=order.__getitem__)
        if failure is not None:
            raise failure

    def _salvage_files(self, snap: Snapshot, selected: list, file_plan: list, still_registered: set) -> None:
        """After a failure part-way: remove the files of the regions confirmed unregistered and gone from the status,
        so that a rerun of the same task converges; every other file is kept."""
        done = set(self.outcome.unregistered)
        try:
            self._deferred(selected, still_registered)
        except TritonError as again:
            # before 24.12 an unregister Triton answered is final; since, it may still be listed
            if _may_defer(snap):
                self.outcome.skipped.extend(
                    {
                        'path': e['path'],
                        'reason': 'not removed: the status could not be read to confirm '
                        f'that its region is gone: {again.msg}',
                    }
                    for e, n in file_plan
                    if n in done
                )
                return
        try:
            self.snap_after = self._remove_files(snap, [(e, n) for e, n in file_plan if n in done], still_registered)
        except ShmFsError as exc:
            # e.g. the server died and its private /dev/shm went with it: the server's failure (the cause)
            # is what is raised; the files that could not be removed are reported with this reason
            removed = set(self.outcome.removed_files)
            self.outcome.skipped.extend(
                {'path': e['path'], 'reason': f'not removed: {exc}'}
                for e, n in file_plan
                if n in done and e['path'] not in removed
            )

    def _record_after(self) -> None:
        """/dev/shm use and the server's regions after the change, as far as they can still be read."""
        self._measure_after()
        try:
            self.outcome.regions_after = self.client.status(self.kind.name)
            self.outcome.after['regions'] = [self.kind.spec(r) for r in self.outcome.regions_after]
        except TritonError:
            pass

    def _deferred(self, selected: list, still_registered: set) -> None:
        """Regions unregistered but still listed (Triton 24.12+ defers while requests are in flight) keep their files.

        Waits up to in_use_timeout for them to leave the status; those still listed then move from
        unregistered to pending (the server accepted the unregister and drops the region when its
        requests finish), with the reason in skipped and a warning.
        """
        done = set(
            self.outcome.unregistered
        )  # a set: one lookup per region, not a scan of the list (3,000 regions: ~1 s)
        specs = {r['name']: r for r in selected if r['name'] in done and r['name'] not in still_registered}
        # a wedged region's deferral is looked at once, never waited out (wedged.py)
        once = all(r.get('state') == vocabulary.WEDGED for r in specs.values())
        listed = self._wait_gone(self.kind.name, specs, once=once)
        for name in sorted(listed):
            still_registered.add(name)
            self.outcome.pending.append(name)
            self.outcome.skipped.append(
                {
                    'name': name,
                    'reason': f'pending: unregistered, but still listed by the server after '
                    f'{self.in_use_timeout}s (requests in flight: it goes when '
                    'they finish); its file is kept',
                }
            )
            self.warn(
                f"region '{name}' is pending: still listed {self.in_use_timeout}s after its unregister (Triton "
                '24.12 and later drop it when its requests in flight finish); its file is kept: a run while it is '
                'still listed unregisters it again and removes the file once it is gone'
            )
        if listed:
            self.outcome.unregistered[:] = [n for n in self.outcome.unregistered if n not in listed]


def unlinked_freed(snap: Snapshot | None, gone: Iterable[str]) -> int:
    """Bytes of the unlinked files the server mapped for the regions named in gone whose file is no longer listed
    (dangling regions, unregistered): each file once, none that a region staying registered still names. Their memory
    comes back when the server unmaps them at the unregister, so /dev/shm's use falls by them beside the removed files."""
    if snap is None or snap.scan is None or snap.shm_dir is None:
        return 0
    gone = set(gone)
    freed: set = set()
    kept: set = set()
    for region in snap.in_files:
        try:
            name = facts.key_to_name(region.get('key'))  # the one reading of a key, as classification's
        except ShmFsError:
            continue
        if snap.entry(name) is None:  # no listed file: the server may map an unlinked one (a dangling region)
            (freed if region.get('name') in gone else kept).update(snap.unlinked(name))
    return sum(int(snap.scan.deleted_bytes.get(key) or 0) for key in freed - kept)


EVERY_KIND = 'all'
# what the parts of a call for every kind after the first leave to that first part: the shm directory's files, the
# inventory, the threshold verdict and the metrics textfile
LATER_PART = dict(
    orphan_files=False,
    backend_leftovers=False,
    suspect=False,
    families=[],
    inventory=False,
    threshold_percent=0,
    metrics_dir=None,
)


class EveryKind(Operation):
    """triton_shm_region state=absent kind=all: one call for every kind of region the server offers.

    The first kind (system: the regions, their files, the orphans, pools and families, the inventory, the threshold and
    the metrics) runs as RegionOps does. Then, under the same per-server lock and on the same connection, each other
    kind the server lists in its extensions (GET /v2, read by the first part) runs as a RegionOps of its own with the
    same selectors; its result is the call's ``kinds[NAME]``. A failure in a later part fails the call with the part's
    name and keeps what the earlier parts did.
    """

    def __init__(self, client: Any, params: dict, check_mode: bool = False, **options: Any) -> None:
        self.client, self.params, self.check_mode, self.options = client, params, check_mode, options
        first, *self.others = list(kinds.KINDS)
        self.first = RegionOps(client, dict(params, kind=first), check_mode=check_mode, **options)
        self.parts: dict = {}  # kind name -> the RegionOps of a later part that started

    @property
    def outcome(self) -> Outcome | None:  # base.run_operation: what was done so far, for a failure part-way
        return self.first.outcome

    def check(self) -> None:
        self.first.check()

    def read(self) -> Reading:
        return self.first.read()

    def hold(self, reading: Reading) -> contextlib.AbstractContextManager:
        return self.first.hold(reading)

    def plan(self, reading: Reading) -> Plan:
        return self.first.plan(reading)

    def preview(self, plan: Plan) -> Outcome:
        outcome = self.first.preview(plan)
        self._later_parts()
        return outcome

    def execute(self, plan: Plan) -> Outcome:
        outcome = self.first.execute(plan)
        self._later_parts()
        return outcome

    def _later_parts(self) -> None:
        """The other kinds the server offers, each a whole run; the first part's lock covers them (same server)."""
        snap = self.first.snap
        offered = set((snap.metadata.get('extensions') if snap is not None else None) or ())
        later = dict(self.params, **LATER_PART)
        if not (later.get('name') or any(later.get(opt) for opt in region_plan.SELECTORS)):
            # only the shm directory's selectors were given (orphan_files, backend_leftovers, families, suspect): they
            # are the first part's, and select no region of another kind
            return
        for name in self.others:
            if kinds.KINDS[name].record.extension not in offered:
                continue
            part = RegionOps(
                self.client,
                dict(later, kind=name),
                check_mode=self.check_mode,
                **dict(self.options, serialise=False),
            )
            self.parts[name] = part
            try:
                run_steps(part, self.check_mode)
            except TritonOpsError as exc:
                exc.msg = f'{name} regions, after the {self.first.kind.name} regions were done: {exc.msg}'
                raise

    def result(self, outcome: Outcome | None = None, finished: bool = True) -> dict:
        out = self.first.result(outcome, finished)
        parts = {name: part.result(finished=finished) for name, part in self.parts.items()}
        out['kinds'] = parts
        out['changed'] = bool(out['changed'] or any(r.get('changed') for r in parts.values()))
        return out


def _as_owner(q: shm_fs.Quarantined) -> contextlib.AbstractContextManager:
    """The identity a quarantined file's unlink or restore runs as: the one its rename ran as."""
    return shm_fs.acting_as(*q.owner) if q.owner is not None else contextlib.nullcontext()
