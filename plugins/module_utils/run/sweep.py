# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What triton_shm_sweep does: clean a shm directory that no tritonserver uses, before a server starts (issue 42).

Private to the tritonops.shm collection: no stability promise to other code.

No URL and no server: the operator names the directory (shm_dir). The sweep is the region module's leftover and
family cleanup without a server, and it takes every decision from the code paths that module uses:

- **refusal** (``servers_using``): a running tritonserver whose /dev/shm, seen through /proc/PID/root (any mount
  namespace), is this directory's filesystem (the same st_dev) stops the sweep, with its pid, before anything is judged;
  so does a tritonserver whose root cannot be read (it cannot be proven not to use it);
- **one read** (``read_dir``): the directory pinned (shm_fs.pin: never through a symlink), listed, its files' holders
  scanned (snapshot.read_holders, the visibility rule included), the authority of the directory's owner
  (authority.read_authority with no server process: root removes only files of the directory's owner or of
  client_users);
- **one plan** (``plan_sweep``): classification.classify (a python backend pool nobody holds, older than min_age, with a
  complete scan, is ``leftover``) and region_plan.plan_files with backend_leftovers and the families asked for, as
  triton_shm_region plans them; where the module cannot see every process, it decides nothing;
- **one removal** (file_ops.ShmDirWork): the run lock of the directory, then each file renamed to a quarantine name,
  the holders scanned again, and unlinked by device and inode, or given back.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError, ShmDirInUse, ShmFsError
from ansible_collections.tritonops.shm.plugins.module_utils.host import authority, discovery, rootfs, shm_fs, snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.host import holders as holders_mod
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import list_pids, read_comm
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, facts, region_plan
from ansible_collections.tritonops.shm.plugins.module_utils.run.file_ops import ShmDirWork
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import Operation
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import Outcome, criteria_of

SERVER_SHM = '/dev/shm'  # where a tritonserver's python backend (shm_open) puts its pools, inside its own root
LOCATED_BY = 'shm_dir given: triton_shm_sweep, no server'
# what region_plan.plan_files is asked: no region, the leftover pools, and (stale) what a killed run left under its
# quarantine name; the families come from the option
SELECTORS = {
    'state': 'absent',
    'stale': True,
    'all': False,
    'remove_file': False,
    'orphan_files': False,
    'backend_leftovers': True,
}


class ServerUse(NamedTuple):
    """A tritonserver that uses the swept directory's filesystem as its /dev/shm (or may: its root is unreadable)."""

    pid: int
    why: str


def _exe_name(pid: int, proc: str) -> str | None:
    try:
        return os.path.basename(os.readlink(f'{proc}/{pid}/exe')).removesuffix(' (deleted)')
    except OSError:
        return None


def tritonserver_pids(proc: str = '/proc') -> list[int]:
    """The pids of the processes whose comm or program is tritonserver (discovery.SERVER_COMMS)."""
    return [
        pid
        for pid in list_pids(proc)
        if read_comm(pid, proc) in discovery.SERVER_COMMS or _exe_name(pid, proc) in discovery.SERVER_COMMS
    ]


def servers_using(shm_dev: int, proc: str = '/proc', pids: Iterable[int] | None = None) -> list[ServerUse]:
    """The tritonservers whose /dev/shm (seen through /proc/PID/root, whatever their mount namespace) is the
    filesystem shm_dev, and those whose root cannot be read. pids: the tritonservers (tritonserver_pids when None)."""
    found = []
    for pid in tritonserver_pids(proc) if pids is None else pids:
        root = f'{proc}/{pid}/root'
        st = rootfs.stat_in(root, SERVER_SHM)
        if st is None:
            if not os.path.exists(f'{proc}/{pid}'):
                continue  # ended since it was listed
            found.append(
                ServerUse(
                    pid,
                    f'tritonserver (pid {pid}): {root}{SERVER_SHM} cannot be read, so it cannot be shown not to use it',
                )
            )
        elif st.st_dev == shm_dev:
            found.append(
                ServerUse(
                    pid,
                    f'tritonserver (pid {pid}) runs with it as its /dev/shm (device {os.major(shm_dev)}:{os.minor(shm_dev)}, '
                    f'seen through {root}{SERVER_SHM})',
                )
            )
    return found


def refusal(path: str, uses: Iterable[ServerUse]) -> str | None:
    """The message that stops a sweep of path because of uses, or None when there is none."""
    uses = list(uses)
    if not uses:
        return None
    return (
        f'not sweeping {path}: {"; ".join(u.why for u in uses)}. A sweep is for a shm directory no server runs on (before '
        'it starts); while one runs, triton_shm_region with its URL (backend_leftovers, families) cleans it. Nothing was '
        'changed'
    )


def read_dir(
    shm_dir: str,
    clients_share_pid_namespace: bool = False,
    proc: str = '/proc',
    now: float | None = None,
    on_pinned: Callable[[shm_fs.PinnedDir], object] | None = None,
) -> facts.Snapshot:
    """The snapshot of shm_dir with no server: its files, their holders, the authority of its owner.

    on_pinned: called with the pinned directory before anything else is read (the run lock). Raises ShmFsError when
    the directory cannot be opened (or is reached through a symlink that is not root's), ShmDirInUse when a running
    tritonserver uses it.
    """
    try:
        pinned = shm_fs.pin(shm_dir)
    except OSError as exc:
        raise ShmFsError(f'cannot open shm_dir {shm_dir}: {exc.strerror or exc}; nothing was changed') from exc
    if on_pinned is not None:
        on_pinned(pinned)
    refused = refusal(pinned.path, servers_using(pinned.dev, proc))
    if refused is not None:
        raise ShmDirInUse(refused)
    try:
        fs = shm_fs.usage(pinned)
        entries = shm_fs.list_entries(pinned, now=now)
    except OSError as exc:
        raise ShmFsError(f'cannot list shm_dir {shm_dir}: {exc.strerror or exc}; nothing was changed') from exc
    visible = holders_mod.visibility(proc, clients_share_pid_namespace)
    scan, warning = snapshot.read_holders(entries, None, proc, visible)
    return facts.Snapshot(
        url='',
        metadata={},
        regions={},
        location=discovery.Location(None, pinned.path, LOCATED_BY, [], None),
        shm_dir=pinned.path,
        fs=fs,
        entries=entries,
        scan=scan,
        warnings=[warning] if warning else [],
        scanned_at=time.time(),
        authority=authority.read_authority(None, pinned),
        visibility=visible,
    )


class Plan(NamedTuple):
    """What a sweep removes (region_plan.FileAction) and keeps ({path, category, reason}), its warnings, and the
    category of each file ({path: category})."""

    files: list
    kept: list
    warnings: list
    categories: dict


def plan_sweep(snap: facts.Snapshot, criteria: classification.Criteria, families: Iterable[str] = ()) -> Plan:
    """The sweep of one read (pure): the leftover pools, the files a killed run left quarantined and the unheld, old
    enough files of the families asked for, as triton_shm_region plans them; every other file kept, with its reason."""
    records = classification.classify(snap, criteria)
    notes = region_plan.Notes()
    actions = region_plan.plan_files(
        snap, dict(SELECTORS, families=list(families)), criteria, [], [], records.files, notes
    )
    going = {a.entry['path'] for a in actions}
    why = {s['path']: s['reason'] for s in notes.skipped}
    kept = [
        {'path': f['path'], 'category': f['category'], 'reason': why.get(f['path'], f['category_reason'])}
        for f in records.files
        if f['path'] not in going
    ]
    warnings = list(notes.warnings)
    if not snap.holders_complete:
        warnings.append(
            'where the module cannot see every process, it decides nothing: no file is removed '
            f'({snap.holders_incomplete_reason})'
        )
    return Plan(actions, kept, warnings, {f['path']: f['category'] for f in records.files})


def kept_counts(kept: Iterable[dict]) -> dict:
    """{category: files kept} of a sweep's kept files."""
    out: dict = {}
    for k in kept:
        out[k['category']] = out.get(k['category'], 0) + 1
    return out


class Sweep(ShmDirWork, Operation):
    """One triton_shm_sweep call: check, read (under the run lock, not in check mode), plan, preview or execute."""

    def __init__(
        self,
        params: dict,
        check_mode: bool = False,
        warn: Callable[[str], object] | None = None,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        proc: str = '/proc',
    ) -> None:
        self.params = params
        self.check_mode = check_mode
        self.warn = warn or (lambda msg: None)
        self.sleep = sleep
        self.clock = clock
        self.proc = proc
        self.serialise = True
        self.lock = None
        self.shm = None  # the directory read_dir pinned (_located): the sweep acts through it
        self.lock_dir = params.get('lock_dir')
        self.outcome: Outcome | None = None
        self.snap: facts.Snapshot | None = None
        self.kept: list = []
        self.categories: dict = {}
        self.in_use: str | None = None  # why a server's use of the directory skipped the sweep (in_use: skip)
        self._finished: list = []
        self._criteria: classification.Criteria | None = None

    @property
    def criteria(self) -> classification.Criteria:
        if self._criteria is None:
            self._criteria = criteria_of(self.params, orphans=False)
        return self._criteria

    def check(self) -> None:
        """ParameterError for a relative shm_dir, a negative min_age, an unknown family or client user."""
        p = self.params
        if not os.path.isabs(p['shm_dir']):
            raise ParameterError(f'shm_dir must be an absolute path, got {p["shm_dir"]!r}')
        if p.get('min_age', 0) < 0:
            raise ParameterError('min_age must be 0 or more seconds')
        region_plan.check_families(p)
        # client_users and extra_families: ParameterError now, before anything is read
        self._criteria = criteria_of(p, orphans=False)

    def read(self) -> facts.Snapshot | None:
        """The directory read under its run lock; None when a server uses it and in_use is skip (a warning says so)."""
        self.outcome = Outcome(check_mode=self.check_mode)
        try:
            return read_dir(
                self.params['shm_dir'],
                bool(self.params.get('clients_share_pid_namespace')),
                self.proc,
                on_pinned=self._located,
            )
        except ShmDirInUse as exc:
            self.release()
            if self.params.get('in_use') != 'skip':
                raise
            self.in_use = exc.msg
            self.warn(exc.msg)
            return None
        except BaseException:
            self.release()
            raise

    @contextlib.contextmanager
    def hold(self, reading: facts.Snapshot | None) -> Iterator[facts.Snapshot | None]:
        """Hold the run lock read() took (not in check mode) until the result is written."""
        if reading is None:
            yield None
            return
        try:
            self._held(reading)
            yield reading
        finally:
            self.release()

    def plan(self, reading: facts.Snapshot | None) -> Plan:
        if reading is None:
            return Plan([], [], [], {})
        return plan_sweep(reading, self.criteria, self.params.get('families') or ())

    def _planned(self, plan: Plan) -> Outcome:
        for w in plan.warnings:
            self.warn(w)
        self.kept = list(plan.kept)
        self.categories = dict(plan.categories)
        return self.outcome

    def preview(self, plan: Plan) -> Outcome:
        """Check mode: what would be removed, touching nothing."""
        outcome = self._planned(plan)
        outcome.removed_files = [a.entry['path'] for a in plan.files]
        outcome.freed_bytes = sum(a.entry['allocated_bytes'] for a in plan.files)
        return outcome

    def execute(self, plan: Plan) -> Outcome:
        """Remove the planned files (ShmDirWork._remove_files: quarantine, re-check, unlink or give back)."""
        outcome = self._planned(plan)
        if plan.files:
            try:
                self._remove_files(self.snap, [(a.entry, a.region) for a in plan.files], set())
            finally:
                with contextlib.suppress(OSError):
                    outcome.used_after = shm_fs.usage(self.shm)['used_bytes']
        return outcome

    def result(self, outcome: Outcome | None, finished: bool = True) -> dict:
        """changed, removed_files (check mode: would remove), freed_bytes, kept and kept_counts, skipped_items, scan."""
        outcome = outcome or Outcome(check_mode=self.check_mode)
        removed = set(outcome.removed_files)
        skipped = {s.get('path'): s['reason'] for s in outcome.skipped}
        kept = [k for k in self.kept if k['path'] not in removed]
        kept += [
            {'path': path, 'category': self.categories.get(path), 'reason': reason}
            for path, reason in skipped.items()
            if path
        ]
        return {
            'changed': bool(outcome.removed_files),
            'shm_dir': self.params['shm_dir'],
            'removed_files': list(outcome.removed_files),
            'freed_bytes': outcome.freed_bytes,
            'kept': kept,
            'kept_counts': kept_counts(kept),
            'skipped_items': list(outcome.skipped),
            'scan': outcome.scan,
            'in_use': self.in_use,
            'used_bytes_before': outcome.used_before,
            'used_bytes_after': outcome.used_after,
        }
