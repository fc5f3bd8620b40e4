# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The executor of triton_shm_region: reads, holds the lock, carries a region_plan.Plan out, records what it did.

Private to the tritonops.shm collection: no stability promise to other code.
What to do is decided by region_plan.py (pure, from one read and the parameters); RegionOps does the I/O in the order
the safety invariants require (docs/concepts.md): unregister first (region_calls.py), wait until the region is gone
from the status, then remove the files (file_ops.py: quarantine each, re-check holders, unlink only unheld regular files
by device and inode inside the shm directory, or give them back), then read the state after once. Each step is recorded
in an Outcome, whose result() only formats it, on success and after a failure part-way. RegionOps is an
operation.Operation: base.run_operation runs it as every module runs, check -> read -> plan -> preview (check mode) or
execute -> result, with the per-server lock (taken inside read() once the server is located, before its regions are
read; not in check mode) held from read() until the result and the metrics textfile are written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ShmFsError, TritonError, TritonOpsError
from ansible_collections.tritonops.shm.plugins.module_utils.host import authority, gpu, nvml, shm_fs, snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.rules import (
    classification,
    facts,
    kinds,
    region_plan,
    results,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.rules.region_plan import IN_USE_TIMEOUT, Plan
from ansible_collections.tritonops.shm.plugins.module_utils.run.file_ops import RegionFileWork
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import Operation, run_steps
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_calls import RegionCalls, may_defer


class Reading(NamedTuple):
    """What a run plans from: the snapshot of the server, and the regions of the run's kind in it; with inventory,
    hold() adds the read classified (records) and as triton_shm_info shows it (inventory), which the outcome keeps
    from then on, also when the plan refuses (a host whose server process was not found: its state before is the
    record's evidence)."""

    snap: Snapshot
    regions: list
    records: Any = None
    inventory: dict | None = None


# Seconds to wait, after CUDA regions were unregistered, for NVML to stop charging their memory to the server (1 GiB
# came back within 3 s on an H200, docs/cuda.md)
GPU_SETTLE_TIMEOUT = 10.0


def criteria_of(p: dict, orphans: bool = True) -> classification.Criteria:
    """The parameters' classification criteria, their client_users resolved here, at the edge (authority.client_uids:
    ParameterError for an unknown name): the rules (region_plan, classification) get uids and look nobody up."""
    return region_plan.criteria(p, authority.client_uids(p.get('client_users')), orphans)


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


class RegionOps(RegionFileWork, Operation):
    """One triton_shm_region call for one kind: read and lock, plan (pure), preview or execute, then one read after.

    The steps are the run protocol's (operation.py); the region calls are made by the run's RegionCalls (``calls``,
    region_calls.py), the shm directory's side is RegionFileWork's (file_ops.py). The outcome is started by read() and
    hold() (what the read found) and built by preview() or execute() from the plan.
    """

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
        self.calls: RegionCalls | None = None  # its calls to Triton, recording into the outcome: read() makes them
        self.snap = None  # the read this run planned from
        self.rechecked = None  # file_ops.Recheck: the holder re-check of the removal, the state after with inventory
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
        self.calls = RegionCalls(
            self.client, self.kind, self.outcome, self.in_use_timeout, self.warn, self.sleep, self.clock
        )
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
    def hold(self, reading: Reading) -> Iterator[Reading]:
        """Hold the per-server lock that read() took (not in check mode) until the block ends; yields reading."""
        try:
            if reading.snap is not None:
                self._held(reading.snap)
                if self.params.get('inventory') and self.params['state'] != 'present':
                    records = classification.classify(reading.snap, self.criteria)
                    reading = reading._replace(records=records, inventory=results.info_result(reading.snap, records))
                    self.outcome.before_result = reading.inventory
            yield reading
        finally:
            self.release()

    # -- plan (pure: region_plan) ----------------------------------------------------------------

    def plan(self, reading: Reading) -> Plan:
        """The plan for the parameters and what was read; with inventory it carries the read as triton_shm_info shows
        it (Plan.inventory). Pure: it records nothing and reads nothing (the client users were resolved by read())."""
        p = self.params
        snap = reading.snap
        if p['state'] == 'present':
            return self.kind.plan_present(snap, p)
        if reading.records is not None:  # inventory: hold() classified the read with the criteria of orphans
            plan = self.kind.plan_absent(snap, reading.records, p, self.criteria, self.client.unaddressable)
            return dataclasses.replace(plan, inventory=reading.inventory)
        orphans = bool(p.get('orphan_files'))
        criteria = self.criteria if orphans else region_plan.criteria(p, self.criteria.client_uids, orphans=False)
        return self.kind.plan_absent(
            snap, classification.classify(snap, criteria), p, self.criteria, self.client.unaddressable
        )

    # -- preview or execute: the outcome, from the plan ------------------------------------------------

    def _planned(self, plan: Plan) -> Outcome:
        """The outcome's start from the plan (preview and execute alike): the diff, the inventory before, what is kept."""
        outcome = self.outcome
        outcome.plan = plan
        outcome.before_result = plan.inventory
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
        """Carry the plan out, recording each step in the outcome as it is done; then, also after a failure part-way,
        the one step after (_after)."""
        if self.check_mode:
            raise RuntimeError('check mode previews the plan (operation.run_steps), it never executes it')
        outcome = self._planned(plan)
        registering = bool(plan.register or plan.marks)
        finished = False
        try:
            if registering:
                self._present(plan)
            elif plan.changed:
                self._unregister_then_remove(self.snap, plan.selected, plan.files)
            finished = True
        finally:
            self._after(acted=plan.changed, unregistering=plan.changed and not registering, finished=finished)
        return outcome

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
            self.calls.register_all(
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

    def _unregister_then_remove(self, snap: Snapshot, selected: list, file_plan: list) -> None:
        """Invariant 1: unregister first; a file is removed only once its region is gone from the status."""
        still_registered = set()
        kept = self._mark_files(snap, file_plan)
        if kept:
            selected = [rec for rec in selected if rec['name'] not in kept]
            file_plan = [action for action in file_plan if action.region not in kept]
        try:
            try:
                self.calls.unregister_selected(self.kind.name, selected, still_registered)
                self.calls.deferred(selected, still_registered)
            except TritonError:
                self._salvage_files(snap, selected, file_plan, still_registered)
                raise
            recheck = self._read_server if self.params.get('inventory') else None
            self.rechecked = self._remove_files(snap, file_plan, still_registered, recheck)
        finally:
            self._update_record(snap, still_registered)
            self._update_wedged(snap, selected, still_registered)

    def _salvage_files(self, snap: Snapshot, selected: list, file_plan: list, still_registered: set) -> None:
        """After a failure part-way: remove the files of the regions confirmed unregistered and gone from the status,
        so that a rerun of the same task converges; every other file is kept."""
        done = set(self.outcome.unregistered)
        try:
            self.calls.deferred(selected, still_registered)
        except TritonError as again:
            # before 24.12 an unregister Triton answered is final; since, it may still be listed
            if may_defer(snap):
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
            self._remove_files(snap, [(e, n) for e, n in file_plan if n in done], still_registered)
        except ShmFsError as exc:
            # e.g. the server died and its private /dev/shm went with it: the server's failure (the cause)
            # is what is raised; the files that could not be removed are reported with this reason
            removed = set(self.outcome.removed_files)
            self.outcome.skipped.extend(
                {'path': e['path'], 'reason': f'not removed: {exc}'}
                for e, n in file_plan
                if n in done and e['path'] not in removed
            )

    # -- the one step after -------------------------------------------------------------------------

    def _after(self, acted: bool, unregistering: bool, finished: bool) -> None:
        """What the run left, recorded once it is done acting (also after a failure part-way).

        From what it did: the bytes the dangling regions' unlinked files gave back, and the GPU memory the server's NVML
        charge gave back (waited until it settles). Then one read of the shm directory (its use, when the run acted) and,
        when finished, of the server: the status of the kind; with inventory and a change, the whole server as
        triton_shm_info reads it, which is the removal's holder re-check when it still lists the directory as it is
        (a full read right before the unlinks: no other /proc pass). The regions and the inventory after, the diff's
        after and used_after all come from it; when nothing changed the inventory before is the one after.
        """
        outcome = self.outcome
        if unregistering:
            if self.kind.files:  # what the dangling regions' unlinked files gave back, once gone from the status
                outcome.freed_unlinked_bytes = unlinked_freed(self.snap, outcome.unregistered)
            self._measure_gpu()
        fs = None
        if acted and self.snap.shm_dir:
            with contextlib.suppress(OSError):
                fs = shm_fs.usage(self.shm)
                outcome.used_after = fs['used_bytes']
        if not finished:
            return
        inventory = bool(self.params.get('inventory'))
        snap = None
        if inventory and (self.rechecked is not None or outcome.done_something()):
            current = self.rechecked is not None and self.rechecked.current
            snap = self.rechecked.snap.without((), fs=fs) if current else self._read_server()
        try:
            regions = self.kind.regions(snap) if snap is not None else self.client.status(self.kind.name)
        except TritonError:
            regions = None
        outcome.regions_after = regions if regions is not None else outcome.after.get('regions', [])
        if unregistering and regions is not None:
            outcome.after['regions'] = [self.kind.spec(r) for r in regions]
        if inventory:
            outcome.inventory_after = self._inventory(snap) if snap is not None else outcome.before_result

    def _read_server(self) -> Snapshot:
        """The server's shared memory read again (status, files, a full holder scan), the server found before kept
        and its directory through the same descriptor; server.live and server.ready are not measured."""
        return snapshot.read_server(
            self.client,
            server_pid=self.snap.pid,
            shm_dir=self.snap.shm_dir,
            shm=self.shm,
            kinds=(self.kind.name,),
            backend_patterns=self.criteria.backend_patterns,
            clients_share_pid_namespace=self.snap.visibility.clients_share_pid_namespace,
        )

    def _inventory(self, snap: Snapshot) -> dict:
        """What triton_shm_info would return for snap, the server located as the read this run planned from found it."""
        result = results.info_result(snap, classification.classify(snap, self.criteria))
        result['server'].update(
            located_by=self.snap.located_by, not_found_reason=self.snap.server_reason if self.snap.pid is None else None
        )
        return result

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

    def result(self, outcome: Outcome | None = None, finished: bool = True, diff: bool | None = None) -> dict:
        """The module's result from outcome (this run's by default): Outcome.result, which formats it (no I/O)."""
        return (outcome or self.outcome or Outcome()).result(finished, self.diff if diff is None else diff)


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
