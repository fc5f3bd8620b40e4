# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Register, unregister and clean regions safely: the work behind triton_shm_region.

Private to the tritonops.shm collection: no stability promise to other code.
Decisions about what a region or a file *is* come from inventory.py (a snapshot read
by inventory.read_server, classified by inventory.classify); this file decides what to
*do* and does it, in the order the safety invariants require (docs/concepts.md):
unregister first, re-check holders, then unlink only unheld regular files by
(device, inode) inside the shm directory. RegionOps.result() is the module's result,
on success and after a failure part-way.
"""
from __future__ import annotations

import enum
import os
import time

from collections.abc import Callable, Iterable

from ansible_collections.tritonops.shm.plugins.module_utils import inventory, runlock, shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.client import unregister_batch
from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ParameterError, ServerNotFound, ShmFsError, TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.holders import holders_text
from ansible_collections.tritonops.shm.plugins.module_utils.inventory import REGION_KEYS, Snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.patterns import matches
from ansible_collections.tritonops.shm.plugins.module_utils.procfs import Backoff
from ansible_collections.tritonops.shm.plugins.module_utils.versions import version_tuple

# Seconds to retry an unregister Triton refuses as "in use", and to wait for a deferred one to leave
# the status: the default of the module's in_use_timeout option.
IN_USE_TIMEOUT = 10


class Unregister(enum.Enum):
    """What _unregister did with one region."""

    UNREGISTERED = 'unregistered'
    GONE = 'gone'        # no longer registered: not this run's work
    KEPT = 'kept'        # still registered (in use past in_use_timeout, or a name the client cannot address)


class Lock(enum.Enum):
    """What _lock did about the per-server lock."""

    NOT_NEEDED = 'not needed'    # not serialising, already held by this run, or no shm directory to lock
    TAKEN = 'taken'              # taken at once: nobody else was acting on this server
    WAITED = 'waited'            # taken after another run released it: what it read before may be out of date
    UNAVAILABLE = 'unavailable'  # the directory cannot be locked: warned, acting without it


def _spec(region: dict) -> dict:
    return {k: region.get(k) for k in REGION_KEYS if k in region}


# Before Triton 2.50 (NGC 24.09), unregistering a region with requests in flight could crash the
# server (triton-inference-server/server#3207); 2.50 refuses it as "in use" instead.
SAFE_UNREGISTER_VERSION = (2, 50)


# Triton 2.53 (NGC 24.12) and later accept an unregister while requests are in flight and keep the
# region listed until they finish; before, an answered unregister removed it at once.
DEFERRED_UNREGISTER_VERSION = (2, 53)


def _may_defer(snap: Snapshot) -> bool:
    """Whether this server may keep an unregistered region listed (24.12+, or a version we cannot read)."""
    version = version_tuple(snap.metadata.get('version'))
    return version is None or version >= DEFERRED_UNREGISTER_VERSION


def _same(listed: dict, spec: dict) -> bool:
    """Whether a listed region has the spec (key, offset, byte_size; device_id for CUDA) of an earlier record."""
    return all(listed.get(k) == spec.get(k) for k in ('key', 'offset', 'byte_size', 'device_id') if k in spec)


def _cuda_spec(region: dict) -> dict:
    return {k: region.get(k) for k in ('name', 'device_id', 'byte_size') if k in region}


class RegionOps:
    """One module run: plan, then (unless check mode) act, recording everything done; result() reports it."""

    def __init__(self, client, params: dict, check_mode: bool = False, warn: Callable[[str], object] | None = None,
                 sleep: Callable[[float], object] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 serialise: bool = True) -> None:
        self.client = client
        self.serialise = serialise
        self.lock = None
        self.params = params
        self.check_mode = check_mode
        self.warn = warn or (lambda msg: None)
        self.sleep = sleep
        self.clock = clock
        self.changed = False
        self.registered = []
        self.unregistered = []
        self.pending = []           # unregistered, but still listed past in_use_timeout (Triton 24.12+ defers)
        self.removed_files = []
        self.created_files = []
        self.marked_files = []
        self.skipped = []
        self.freed_bytes = 0
        self.before = None          # the diff: regions (and files) before, and after
        self.after = None
        self.used_before = None
        self.used_after = None
        self.snap = None            # the read this run planned from
        self.threshold = None       # {percent, used_percent, over} of threshold_percent (state=absent, system)
        self.before_result = None   # with inventory: what triton_shm_info would have returned for that read
        self.snap_after = None      # the read before unlinking, when it is also the state returned after the change
        self._owners: inventory.Criteria | None = None   # the client users, resolved once per run
        self.status_after = None
        self._record = None         # the cleanup record this run wrote ({inode: shm_fs.CleanupMark}), if it did
        self._ours = set()          # the inodes this run added to it
        self._finished = []         # the inodes of files this run removed or gave back to a holder

    @property
    def in_use_timeout(self) -> float:
        return self.params.get('in_use_timeout', IN_USE_TIMEOUT)

    def run(self) -> None:
        """Do what the parameters' state asks (see present() and absent())."""
        if self.params['state'] == 'present':
            self.present()
        else:
            self.absent()

    # -- the result ------------------------------------------------------------------------

    def done_something(self) -> bool:
        return bool(self.registered or self.unregistered or self.pending or self.removed_files or self.created_files
                    or self.marked_files)

    def result(self, finished: bool = True, diff: bool = False) -> dict:
        """The module's result: what was done (also after a failure part-way), then, when finished, the state after.

        changed is what really changed (in check mode: what would change), also after a failure; an
        unregister the server accepted but deferred (pending) is a change: the server will drop the region.
        finished=False (a failure) leaves out what is read after the change: regions, after and the diff.
        diff: add the diff (before and after) when the run got as far as planning it.
        """
        out = {'changed': self.changed if self.check_mode else self.done_something(),
               'registered': self.registered, 'unregistered': self.unregistered, 'pending': self.pending,
               'removed_files': self.removed_files, 'created_files': self.created_files,
               'marked_files': self.marked_files, 'skipped_items': self.skipped, 'freed_bytes': self.freed_bytes}
        if self.before_result is not None:
            out['before'] = self.before_result
        if self.threshold is not None:
            out['threshold'] = self.threshold
        if self.snap is not None:   # the holder scan this run planned from (the visibility rule)
            out.update(holders_complete=self.snap.holders_complete,
                       holders_incomplete_reason=self.snap.holders_incomplete_reason,
                       pid_namespace=self.snap.pid_namespace)
        if self.used_before is not None:
            out['shm_used_bytes_before'] = self.used_before
            out['shm_used_bytes_after'] = self.used_after
        if not finished:
            return out
        out['regions'] = self._regions_after()
        if self.params.get('inventory') and not self.check_mode:
            out['after'] = self._inventory_after()
        if diff and self.before is not None:
            out['diff'] = {'before': self.before, 'after': self.after}
        return out

    def _criteria(self, orphans: bool = True) -> inventory.Criteria:
        p = self.params
        return inventory.Criteria.of(orphan_patterns=p.get('orphan_patterns') if orphans else None,
                                     min_age=p.get('min_age', inventory.DEFAULT_MIN_AGE),
                                     backend_patterns=p.get('backend_patterns'), client_users=p.get('client_users'))

    def _read_for_plan(self, kinds: Iterable[str]) -> Snapshot:
        """Read the server to plan from, under the per-server lock (taken here, unless check mode)."""
        p = self.params

        def read() -> Snapshot:
            return inventory.read_server(self.client, server_pid=p.get('server_pid'), shm_dir=p.get('shm_dir'),
                                         require_readable_dir=p.get('shm_dir') is not None, kinds=tuple(kinds),
                                         backend_patterns=self._criteria().backend_patterns,
                                         clients_share_pid_namespace=bool(p.get('clients_share_pid_namespace')))
        self.snap = read()
        if not self.check_mode and self._lock(self.snap) is Lock.WAITED:
            # another run acted on this server while we waited: plan from what is there now
            self.snap = read()
        for w in self.snap.warnings:
            self.warn(w)
        if self.snap.fs:
            self.used_before = self.used_after = self.snap.fs['used_bytes']
        return self.snap

    def _lock(self, snap: Snapshot) -> Lock:
        """Serialise runs against this server's shm directory."""
        if not self.serialise or self.lock is not None or snap.shm_dir is None:
            return Lock.NOT_NEEDED
        lock = runlock.ShmDirLock(snap.shm_dir, sleep=self.sleep, clock=self.clock)
        try:
            waited = lock.acquire()
        except OSError as exc:
            self.warn(f'cannot lock {lock.path} ({exc.strerror or exc}): acting without it, a run at the same time '
                      'may count the same regions')
            return Lock.UNAVAILABLE
        if lock.squatter is not None:
            self.warn(f'the lock on {lock.path} is {lock.squatter}: acting without it, not waiting (any user can take '
                      'a flock on a shm directory)')
            return Lock.UNAVAILABLE
        self.lock = lock
        return Lock.WAITED if waited else Lock.TAKEN

    def release(self) -> None:
        """Release the per-server lock (the end of the process releases it too)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _inventory_after(self) -> dict:
        """What triton_shm_info would return now (see _read_again), still under the per-server lock."""
        if self.snap_after is None and not self.done_something() and self.before_result is not None:
            return self.before_result   # nothing changed since the read this run selected from
        snap = self.snap_after or self._read_again()
        result = inventory.info_result(snap, inventory.classify(snap, self._criteria()))
        result['server'].update(located_by=self.snap.located_by,
                                not_found_reason=self.snap.server_reason if self.snap.pid is None else None)
        return result

    def _read_again(self) -> Snapshot:
        """The server's shared memory read again: status, files and a full holder scan.

        The server found before is kept; server.live and server.ready are not measured.
        """
        return inventory.read_server(self.client, server_pid=self.snap.pid, shm_dir=self.snap.shm_dir, kinds=('system',),
                                     backend_patterns=self._criteria().backend_patterns,
                                     clients_share_pid_namespace=self.snap.visibility.clients_share_pid_namespace)

    def _measure_after(self) -> None:
        if self.snap and self.snap.shm_dir and not self.check_mode:
            try:
                self.used_after = shm_fs.usage(self.snap.shm_dir)['used_bytes']
            except OSError:
                pass

    def _regions_after(self) -> list:
        """The regions after the change (predicted in check mode)."""
        if self.status_after is not None:
            return self.status_after
        try:
            current = self.client.status(self.params['kind'])
        except TritonError:
            return (self.after or {}).get('regions', [])
        return self._predict(current) if self.check_mode else current

    def _predict(self, current: list) -> list:
        p = self.params
        gone = set(self.unregistered)
        out = [r for r in current if r['name'] not in gone]
        if p['state'] == 'present':
            registered = set(self.registered)
            out = [r for r in out if r['name'] not in registered]
            out += [r for r in self.after['regions'] if r['name'] in registered]
        return sorted(out, key=lambda r: r['name'])

    # -- unregister with the in-use retry ---------------------------------------------------

    def _unregister(self, kind: str, name: str, refused: TritonError | None = None) -> Unregister:
        """Unregister one region; KEPT means it stays registered, with the reason recorded in skipped.

        refused: the server's refusal of an unregister already sent (by a batch), handled as the first answer.
        """
        backoff = Backoff(timeout=self.in_use_timeout, sleep=self.sleep, clock=self.clock)
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
                self.skipped.append({'name': name, 'reason': exc.msg})
                return Unregister.KEPT
            if exc.not_found:
                return Unregister.GONE
            if not exc.in_use:
                raise exc
            if not backoff.wait():
                reason = f'still in use after {self.in_use_timeout}s (requests in flight): {exc.server_error}'
                self.skipped.append({'name': name, 'reason': reason})
                return Unregister.KEPT

    def _wait_gone(self, kind: str, specs: dict) -> set:
        """Poll the status until no region of specs {name: spec} is listed, within in_use_timeout; return those still listed.

        Triton 24.12 and later accept an unregister while requests are in flight and keep the region
        listed until they finish: its file must not be unlinked, nor the name registered again, before then.
        A name listed with another spec is a new registration (a client registered the name again), not ours.
        """
        if not specs:
            return set()
        backoff = Backoff(timeout=self.in_use_timeout, sleep=self.sleep, clock=self.clock)
        while True:
            listed = {r.get('name') for r in self.client.status(kind)
                      if r.get('name') in specs and _same(r, specs[r.get('name')])}
            if not listed or not backoff.wait():
                return listed

    # -- present ----------------------------------------------------------------------------

    def _check_key_allowed(self, key: object) -> None:
        """Refuse, before asking the server, the keys newer servers refuse and those of Python-based backends' files.

        As Triton 2.61 does, leading slashes are stripped before the prefix check: ``//triton_python_…``
        is the reserved prefix too, and a key of slashes only is invalid.
        """
        if not isinstance(key, str):
            return      # shm_fs.key_to_name says why
        stripped = key.lstrip('/')
        if key and not stripped:
            raise ParameterError(f"key '{key}' is only slashes, and a key is '/' followed by exactly one path component "
                                 f"(Triton 2.61 and later refuse it: '... - invalid shm key '{key}''): choose a key like "
                                 "'/my_region'")
        if stripped.startswith(shm_fs.BACKEND_PREFIX):
            raise ParameterError(f"key '{key}' starts with '{shm_fs.BACKEND_PREFIX}', the prefix Triton reserves "
                                 "for its python backend (Triton 2.60 and later refuse it as a reserved prefix, 2.61 "
                                 "and later also after leading slashes): choose another key")
        owner = shm_fs.backend_of(stripped)
        if owner is not None:
            raise ParameterError(f"key '{key}' has the form {shm_fs.BACKEND_FILE_PATTERN} of a Python-based backend's "
                                 f"files (here the {owner} backend's): registering it as a client region would hand "
                                 "Triton's own memory to clients; choose another key")

    def _check_not_backend_pattern(self, key_name: str) -> None:
        """Refuse keys of the configured backend patterns before asking the server."""
        patterns = self.params.get('backend_patterns')
        if matches(key_name, patterns):
            raise ParameterError(f"key '/{key_name}' names a python backend file (it matches backend_patterns "
                                 f"{', '.join(patterns)}): registering it as a client region would hand Triton's own "
                                 "memory to clients; choose another key")

    def _mark(self, snap: Snapshot, key_name: str, region: str) -> None:
        """Mark the backing file as this region's (reserved); a refusal is a warning, the region stays registered."""
        path = os.path.join(snap.shm_dir, key_name)
        try:
            with shm_fs.ShmDir(snap.shm_dir) as d:
                st = d.lstat(key_name)
                if st is None:
                    raise ShmFsError(f'{path} does not exist')
                d.set_mark(key_name, region, st.st_dev, st.st_ino)
        except ShmFsError as exc:
            self.warn(f"region '{region}' is registered, but its file could not be marked as the operator's: a later "
                      f"stale cleanup would take it once no client maps it ({exc})")
            return
        self.marked_files.append(path)

    def present(self) -> None:
        if self.params['kind'] == 'cuda':
            return self._present_cuda()
        p = self.params
        self._check_key_allowed(p['key'])
        try:
            key_name = shm_fs.key_to_name(p['key'])
        except ShmFsError as exc:
            raise ParameterError(exc.msg) from exc
        self._check_byte_size()
        if p['offset'] < 0:
            raise ParameterError(f"offset must be 0 or more, got {p['offset']}")
        need = p['offset'] + p['byte_size']
        self._check_not_backend_pattern(key_name)
        snap = self._read_for_plan(kinds=('system',))
        current = {r['name']: r for r in snap.system}
        wanted = {'key': p['key'], 'offset': p['offset'], 'byte_size': p['byte_size']}
        self.before = {'regions': [_spec(current[n]) for n in p['name'] if n in current]}
        todo = self._todo(current, wanted)
        create = False
        if snap.shm_dir is None:
            if p['create_file']:
                raise ServerNotFound("create_file needs the server's shm directory, which was not found: "
                                     "set server_pid or shm_dir")
        elif todo:
            create = self._check_backing_file(snap, key_name, need, p['create_file'])
            if create and snap.fs:
                self._check_fits(snap, key_name, need)
        self.after = {'regions': [dict(name=n, **wanted) for n in p['name']]}
        if not todo:
            self._mark_unmarked(snap, key_name)
            return None
        self.changed = True
        if self.check_mode:
            if create:
                self.created_files.append(os.path.join(snap.shm_dir, key_name))
            self.registered = [n for n, _cur in todo]
            return None
        created = None
        if create:
            with shm_fs.ShmDir(snap.shm_dir) as d:
                created = d.create(key_name, need)
            self.created_files.append(os.path.join(snap.shm_dir, key_name))
        try:
            self._register_all('system', todo, lambda name: self.client.register_system(name, p['key'], p['offset'], p['byte_size']),
                               lambda cur: self.client.register_system(cur['name'], cur['key'], cur.get('offset', 0), cur['byte_size']))
            if snap.shm_dir is not None:
                for name in self.registered:
                    self._mark(snap, key_name, name)
        except TritonError:
            if created is not None and not self.registered:
                # nothing uses the file we created: take it back (only that very file, by device and inode)
                with shm_fs.ShmDir(snap.shm_dir) as d:
                    d.unlink(key_name, created.st_dev, created.st_ino)
                self.created_files = []
            raise
        finally:
            self._measure_after()
        return None

    def _check_byte_size(self) -> None:
        size = self.params['byte_size']
        if size is None or size <= 0:
            raise ParameterError(f'byte_size must be a positive number of bytes, got {size}')

    def _todo(self, current: dict, wanted: dict) -> list:
        """[(name, current region or None)] of the asked names not registered as wanted."""
        return [(n, current.get(n)) for n in self.params['name'] if not (n in current and _same(current[n], wanted))]

    def _mark_unmarked(self, snap: Snapshot, key_name: str) -> None:
        """A region already registered as asked: mark its backing file when it does not carry the mark yet."""
        if snap.shm_dir is None:
            return
        entry = snap.entry(key_name)
        if entry is None or entry['type'] != 'file':
            return
        for name in self.params['name']:
            if shm_fs.read_mark(entry['path']) == name:
                continue
            self.changed = True
            if self.check_mode:
                self.marked_files.append(entry['path'])
            else:
                self._mark(snap, key_name, name)

    def _register_all(self, kind: str, todo: list, register: Callable[[str], object],
                      restore: Callable[[dict], object]) -> None:
        """Register each (name, current) of todo; a different current spec is unregistered first.

        When the server refuses the new spec after the old one was unregistered, the old spec is
        registered again so that a refused change leaves the region as it was.
        """
        for name, cur in todo:
            if cur is not None:
                if self._unregister(kind, name) is Unregister.KEPT:
                    raise TritonError(f"re-register {kind} region '{name}': it stays in use (requests in flight), not changed")
                if self._wait_gone(kind, {name: cur}):
                    self.pending.append(name)
                    raise TritonError(f"re-register {kind} region '{name}': it was unregistered but is still listed after "
                                      f"{self.in_use_timeout}s (requests in flight: Triton 24.12 and later remove it when "
                                      "they finish); not registered again, run again later")
            try:
                register(name)
            except TritonError as exc:
                if cur is None:
                    raise
                try:
                    restore(cur)
                except TritonError as again:
                    self.unregistered.append(name)
                    raise type(exc)(f'{exc.msg}; restoring the previous spec failed too, the region is now unregistered: '
                                    f'{again.msg}', url=exc.url, status=exc.status, server_error=exc.server_error,
                                    transport=exc.transport) from exc
                raise type(exc)(f'{exc.msg}; the previous spec was registered again, the region is unchanged',
                                url=exc.url, status=exc.status, server_error=exc.server_error,
                                transport=exc.transport) from exc
            if cur is not None:
                self.unregistered.append(name)
            self.registered.append(name)

    def _check_fits(self, snap: Snapshot, key_name: str, need: int) -> None:
        """A file to create must fit in the shm filesystem: a sparse file larger than it makes every writer die of SIGBUS."""
        path = os.path.join(snap.shm_dir, key_name)
        if need > snap.fs['total_bytes']:
            raise ShmFsError(f"offset + byte_size ({need}) is larger than the whole shm filesystem of {snap.shm_dir} "
                             f"({snap.fs['total_bytes']} bytes): refusing to create {path}, its memory could never be allocated")
        if need > snap.fs['free_bytes']:
            self.warn(f"{path} is created with {need} bytes but only {snap.fs['free_bytes']} bytes of the shm filesystem "
                      "are free: writing it may fail (SIGBUS)")

    def _check_backing_file(self, snap: Snapshot, key_name: str, need: int, create_file: bool) -> bool:
        """Validate the backing file, as the read just listed it; True when it has to be created."""
        entry = snap.entry(key_name)
        path = os.path.join(snap.shm_dir, key_name)
        if entry is None:
            if not create_file:
                raise ShmFsError(f'backing file {path} does not exist: create it (a client does) or set create_file: true')
            return True
        if entry['type'] != 'file':
            raise ShmFsError(f"backing path {path} is a {entry['type']}, not a regular file: refusing to register it")
        if entry['size'] < need:
            raise ShmFsError(f"offset + byte_size ({need}) is past the end of {path} ({entry['size']} bytes); "
                             "the file is never truncated or grown")
        return False

    def _present_cuda(self) -> None:
        p = self.params
        self._check_byte_size()
        current = {r['name']: r for r in self.client.status('cuda')}
        wanted = {'device_id': p['device_id'], 'byte_size': p['byte_size']}
        self.before = {'regions': [_cuda_spec(current[n]) for n in p['name'] if n in current]}
        self.after = {'regions': [dict(name=n, **wanted) for n in p['name']]}
        todo = self._todo(current, wanted)
        if not todo:
            return
        self.changed = True
        if self.check_mode:
            self.registered = [n for n, _cur in todo]
            return
        self._register_all('cuda', todo, lambda name: self.client.register_cuda(name, p['raw_handle'], p['device_id'], p['byte_size']),
                           self._restore_cuda)

    @staticmethod
    def _restore_cuda(cur: dict) -> None:
        # Triton's status does not return the IPC handle of a CUDA region: it cannot be registered again
        raise TritonError(f"the IPC handle of cuda region '{cur['name']}' is not known to the server's status")

    # -- absent -----------------------------------------------------------------------------

    def _select(self, candidates: Iterable[dict]) -> list:
        """The candidate regions to unregister, minus the excluded and the unaddressable ones (skipped with the reason)."""
        selected = []
        for rec in candidates:
            if matches(rec['name'], self.params.get('exclude')):
                self.skipped.append({'name': rec['name'], 'reason': 'excluded by pattern'})
            elif not self._unaddressable(rec):
                selected.append(rec)
        return selected

    def _gate(self, snap: Snapshot) -> None:
        """threshold_percent (STAND-IN until wt-plan's lands): below it, only stale regions and leftover pools are cleaned."""
        percent = float(self.params.get('threshold_percent') or 0)
        used = float((snap.fs or {}).get('used_percent') or 0)
        self.threshold = {'percent': percent, 'used_percent': used, 'over': percent <= 0 or used >= percent}

    def _below(self) -> bool:
        return self.threshold is not None and not self.threshold['over']

    def _wanted(self, rec: dict) -> bool:
        """Whether the parameters ask for this system region (before exclusion)."""
        p = self.params
        if self._below():
            return bool(p['stale'] and rec['reclaimable'])
        return bool(p['all'] or rec['name'] in (p['name'] or ()) or (p['stale'] and rec['reclaimable'])
                    or (p.get('reserved') and rec['state'] == inventory.RESERVED))

    def _unaddressable(self, rec: dict) -> bool:
        """True (and skipped with the reason, its file kept) when the client cannot address this region's name.

        Decided while planning, so that check mode reports exactly what a real run does.
        """
        why = self.client.unaddressable(rec['name'])
        if why is None:
            return False
        self.skipped.append({'name': rec['name'], 'reason': why})
        f = rec.get('file')
        if self.params.get('remove_file') and f and f.get('exists'):
            self.skipped.append({'path': f['path'], 'reason': f"region '{rec['name']}' stays registered"})
        return True

    def _require_server(self, snap: Snapshot) -> None:
        """Stale and orphan cleanup on a host whose server was not found would be a silent no-op: refuse it."""
        p = self.params
        wants = [w for w, needs in (('stale', snap.pid is None), ('orphan_files', snap.shm_dir is None),
                                    ('backend_leftovers', snap.shm_dir is None)) if p.get(w) and needs]
        if wants:
            missing = 'the process was not found' if snap.pid is None else 'the directory is not known'
            raise ServerNotFound(
                f"{' and '.join(wants)} cleanup needs the tritonserver process behind {self.client.base} and its shm "
                f"directory, and {missing}: {snap.server_reason or snap.dir_error or 'see the warnings'}")

    def absent(self) -> None:
        """Unregister the selected regions, then remove their unheld files and (with orphan_files, backend_leftovers) orphan and
        leftover files."""
        p = self.params
        if p['kind'] == 'cuda':
            return self._absent_cuda()
        snap = self._read_for_plan(kinds=('system',))
        records = inventory.classify(snap, self._criteria(orphans=bool(p['orphan_files'] or p.get('inventory'))))
        regions, files = records.system_regions, records.files
        if p.get('inventory'):
            self.before_result = inventory.info_result(snap, records)
        self._require_server(snap)
        self._gate(snap)
        selected = self._select(rec for rec in regions if self._wanted(rec))
        selected_names = {r['name'] for r in selected}
        remaining = [r for r in regions if r['name'] not in selected_names]
        file_plan = self._plan_files(snap, selected, remaining, files)
        self.before = {'regions': [_spec(r) for r in regions], 'files': [e['path'] for e, _n in file_plan]}
        self.after = {'regions': [_spec(r) for r in remaining], 'files': []}
        if not selected and not file_plan:
            return None
        self.changed = True
        self._warn_unsafe_unregister(snap, selected)
        if self.check_mode:
            self.unregistered = sorted(selected_names)
            self.removed_files = [e['path'] for e, _n in file_plan]
            self.freed_bytes = sum(e['allocated_bytes'] for e, _n in file_plan)
            return None
        try:
            self._unregister_then_remove(snap, selected, file_plan)
        finally:
            self._record_after()
        return None

    def _unregister_then_remove(self, snap: Snapshot, selected: list, file_plan: list) -> None:
        """Invariant 1: unregister first; a file is removed only once its region is gone from the status."""
        still_registered = set()
        self._mark_files(snap, file_plan)
        try:
            try:
                self._unregister_selected('system', selected, still_registered)
                self._deferred(selected, still_registered)
            except TritonError:
                self._salvage_files(snap, selected, file_plan, still_registered)
                raise
            self.snap_after = self._remove_files(snap, file_plan, still_registered)
        finally:
            self._update_record(snap, still_registered)

    def _plan_files(self, snap: Snapshot, selected: list, remaining: list, files: list) -> list:
        """[(snapshot entry, region name or None)]: the files to remove, each skip recorded with its reason."""
        p = self.params
        kept_paths = {r['file']['path'] for r in remaining if r.get('file') and r['file'].get('exists')}
        entries = {e['path']: e for e in snap.entries}
        file_plan = []
        planned = set()
        for rec in selected:
            f = rec.get('file')
            if not p['remove_file'] or not f or not f.get('exists'):
                continue
            path = f['path']
            reason = self._keep_file_reason(snap, rec, f, kept_paths)
            if reason is not None:
                self.skipped.append({'path': path, 'reason': reason})
            elif path not in planned:
                planned.add(path)
                file_plan.append((entries[path], rec['name']))
        if p['orphan_files'] and not self._below():
            file_plan.extend((entries[f['path']], None) for f in files if f['category'] == 'orphan')
        elif p['stale'] or p['all']:
            # what a stale cleanup of this server marked, unregistered and could not remove (it was killed): finish it
            file_plan.extend((entries[f['path']], None) for f in files
                             if f['category'] == 'orphan' and snap.leftover(f['name']) is not None)
        if p.get('backend_leftovers'):
            file_plan.extend((entries[f['path']], None) for f in files if f['category'] == inventory.LEFTOVER)
        return file_plan

    def _mark_files(self, snap: Snapshot, file_plan: list) -> None:
        """Invariant 8: record the planned backing files (shm_fs.CLEANUP_XATTR) before their regions are unregistered.

        One record on the shm directory (the files themselves, their ctimes included, are untouched). It keeps
        what an earlier record still names (another server's, or a killed run's), and adds this run's files;
        _update_record() takes out, at the end, what this run finished. A run killed in between leaves the
        record, and the next stale cleanup of the same server process finishes the files it names. When the
        filesystem or the run's privileges refuse the record, a warning says so and the cleanup goes on.
        """
        ours = {e['inode']: shm_fs.CleanupMark(region, e['name'], snap.server_id or '')
                for e, region in file_plan if region is not None}
        if not ours:
            return
        present = {e['inode'] for e in snap.entries}
        record = {ino: m for ino, m in shm_fs.read_cleanup_record(snap.shm_dir).items() if ino in present}
        record.update(ours)
        try:
            with shm_fs.ShmDir(snap.shm_dir) as d:
                d.write_cleanup_record(record)
        except ShmFsError as exc:
            self.warn(f'the files are not recorded before their regions are unregistered ({exc}): a run stopped part-way '
                      'leaves them to orphan patterns')
            return
        self._record = record
        self._ours = set(ours)

    def _update_record(self, snap: Snapshot, still_registered: set) -> None:
        """At the end of a run (also a failed one): take out of the record what this run finished or gave back.

        Kept: the files of pending regions (a later stale cleanup removes them once the server drops the region)
        and of regions whose unregister was not answered, files left under a quarantine name, and other entries.
        """
        done = set(self._finished)
        done.update(ino for ino in self._ours
                    if self._record[ino].region in still_registered and self._record[ino].region not in self.pending)
        if not done or snap.shm_dir is None:
            return
        # read again, never this run's copy: a run that found the lock squatted by another user overlaps other root
        # runs, and writing back its copy would erase what they recorded meanwhile (their files then lost to a kill)
        current = shm_fs.read_cleanup_record(snap.shm_dir)
        if not done & set(current):
            return
        record = {ino: m for ino, m in current.items() if ino not in done}
        try:
            with shm_fs.ShmDir(snap.shm_dir) as d:
                d.write_cleanup_record(record)
        except ShmFsError as exc:
            self.warn(str(exc))

    def _keep_file_reason(self, snap: Snapshot, rec: dict, f: dict, kept_paths: set) -> str | None:
        """Why the backing file of a selected region must stay, or None."""
        path = f['path']
        if path in kept_paths:
            return 'also backs a region that stays registered'
        if f.get('type') != 'file':
            return f"not a regular file ({f.get('type')}): never removed"
        if rec['holders']:
            self.warn(f"region '{rec['name']}' is unregistered as asked, but its file {path} is held by "
                      f"{holders_text(rec['holders'])} and is kept")
            return 'held by ' + holders_text(rec['holders'])
        if not snap.holders_complete:
            return 'holders could not be fully determined'
        entry = snap.entry(os.path.basename(path))
        if entry is None:
            return 'not listed in the shm directory'
        if self._owners is None:
            self._owners = self._criteria(orphans=False)
        return inventory.removal_refusal(snap, self._owners, entry)

    def _unregister_selected(self, kind: str, selected: list, still_registered: set) -> None:
        """Unregister each selected region; add the names that stay registered (skipped with the reason) to still_registered.

        The unregisters go out as one batch (the transport may send several at once: client.UnregisterBatch);
        a region refused as in use is retried with backoff as its answer comes, while the batch goes on. On a
        failure no further unregister is sent, the answers of those already sent are recorded, then it is raised.
        """
        batch = unregister_batch(self.client, kind, [rec['name'] for rec in selected])
        first = len(self.unregistered)
        failure = None
        try:
            for name, refused in batch:
                if failure is not None:
                    if refused is None:   # sent before the failure: done, and reported as done
                        self.unregistered.append(name)
                    continue
                try:
                    outcome = self._unregister(kind, name, refused) if refused is not None else Unregister.UNREGISTERED
                except TritonError as exc:
                    failure = exc
                    batch.stop()
                    continue
                if outcome is Unregister.UNREGISTERED:
                    self.unregistered.append(name)
                elif outcome is Unregister.KEPT:
                    still_registered.add(name)
        finally:
            # in the order selected, whatever order the answers came in
            order = {rec['name']: i for i, rec in enumerate(selected)}
            self.unregistered[first:] = sorted(self.unregistered[first:], key=order.__getitem__)
        if failure is not None:
            raise failure

    def _salvage_files(self, snap: Snapshot, selected: list, file_plan: list, still_registered: set) -> None:
        """After a failure part-way: remove the files of the regions confirmed unregistered and gone from the status,
        so that a rerun of the same task converges; every other file is kept."""
        done = set(self.unregistered)
        try:
            self._deferred(selected, still_registered)
        except TritonError as again:
            # before 24.12 an unregister Triton answered is final; since, it may still be listed
            if _may_defer(snap):
                self.skipped.extend({'path': e['path'], 'reason': 'not removed: the status could not be read to confirm '
                                     f'that its region is gone: {again.msg}'}
                                    for e, n in file_plan if n in done)
                return
        try:
            self.snap_after = self._remove_files(snap, [(e, n) for e, n in file_plan if n in done], still_registered)
        except ShmFsError as exc:
            # e.g. the server died and its private /dev/shm went with it: the server's failure (the cause)
            # is what is raised; the files that could not be removed are reported with this reason
            removed = set(self.removed_files)
            self.skipped.extend({'path': e['path'], 'reason': f'not removed: {exc}'}
                                for e, n in file_plan if n in done and e['path'] not in removed)

    def _record_after(self) -> None:
        """/dev/shm use and the server's regions after the change, as far as they can still be read."""
        self._measure_after()
        try:
            self.status_after = self.client.status('system')
            self.after['regions'] = [_spec(r) for r in self.status_after]
        except TritonError:
            pass

    def _deferred(self, selected: list, still_registered: set) -> None:
        """Regions unregistered but still listed (Triton 24.12+ defers while requests are in flight) keep their files.

        Waits up to in_use_timeout for them to leave the status; those still listed then move from
        unregistered to pending (the server accepted the unregister and drops the region when its
        requests finish), with the reason in skipped and a warning.
        """
        done = set(self.unregistered)   # a set: one lookup per region, not a scan of the list (3,000 regions: ~1 s)
        specs = {r['name']: r for r in selected if r['name'] in done and r['name'] not in still_registered}
        listed = self._wait_gone('system', specs)
        for name in sorted(listed):
            still_registered.add(name)
            self.pending.append(name)
            self.skipped.append({'name': name, 'reason': f'pending: unregistered, but still listed by the server after '
                                                         f'{self.in_use_timeout}s (requests in flight: it goes when '
                                                         'they finish); its file is kept'})
            self.warn(f"region '{name}' is pending: still listed {self.in_use_timeout}s after its unregister (Triton "
                      "24.12 and later drop it when its requests in flight finish); its file is kept: a run while it is "
                      "still listed unregisters it again and removes the file once it is gone")
        if listed:
            self.unregistered[:] = [n for n in self.unregistered if n not in listed]

    def _warn_unsafe_unregister(self, snap: Snapshot, selected: list) -> None:
        """Before Triton 2.50, unregistering a region a live client uses could crash the server (#3207)."""
        version = version_tuple(snap.metadata.get('version'))
        if version is None or version >= SAFE_UNREGISTER_VERSION:
            return
        held = sorted(r['name'] for r in selected if r['holders'])
        if held:
            self.warn(f"Triton {snap.metadata.get('version')} is older than 2.50: unregistering a region while a live "
                      "client runs requests through it can crash the server (triton-inference-server/server#3207); "
                      f"region(s) {', '.join(held)} are held by live clients")

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
        with shm_fs.ShmDir(snap.shm_dir) as d:
            for entry, region in file_plan:
                q = self._quarantine(d, snap, entry, region, still_registered)
                if q is not None:
                    moved.append((entry, region, q))
            check = self._read_again() if want_after else inventory.rescan(snap)
            gone = []
            restored = False
            for entry, region, q in moved:
                reason = self._unlink(d, check, entry, q)
                if reason is None:
                    gone.append(os.path.join(snap.shm_dir, q.name))
                else:
                    self.skipped.append({'path': entry['path'], 'reason': reason})
                    restored = restored or q.name != q.original
        if not want_after:
            return None
        if restored:
            check = self._read_again()   # the listing of the scan saw quarantine names since renamed back
        fs = None
        if check.shm_dir is not None:
            try:
                fs = shm_fs.usage(check.shm_dir)
            except OSError:
                pass
        return check.without(gone, fs=fs)

    def _quarantine(self, d: shm_fs.ShmDir, snap: Snapshot, entry: dict, region: str | None,
                    still_registered: set) -> shm_fs.Quarantined | None:
        """Rename one planned file to its quarantine name; None (the reason recorded) when it stays as it is."""
        name = entry['name']
        reason = None
        if region in still_registered:
            reason = f"region '{region}' is still registered"
        elif shm_fs.is_quarantine_name(name):
            # left quarantined by a run stopped before its unlink: no client can open it by name
            mark = snap.cleanup_marks.get(name)
            original = mark.name if mark is not None else name
            return shm_fs.Quarantined(name, original, entry['dev'], entry['inode'], entry.get('ctime_ns'), 0)
        else:
            try:
                q = d.quarantine(name, entry['dev'], entry['inode'], entry.get('ctime_ns'))
            except ShmFsError as exc:
                self.warn(str(exc))
                reason = str(exc)
            except OSError:
                # no RENAME_NOREPLACE here (kernel or filesystem), or a rootless server's tmpfs where root may not create
                # a name: re-check, then unlink in place (the re-attach window of docs/reliability.md stays open there)
                return shm_fs.Quarantined(name, name, entry['dev'], entry['inode'], entry.get('ctime_ns'), 0)
            else:
                if q is not None:
                    return q
                reason = 'already removed (by another process) before this run unlinked it'
        self.skipped.append({'path': entry['path'], 'reason': reason})
        return None

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
            freed = d.unlink(q.name, q.dev, q.ino, q.ctime_ns, missing=None)
        except ShmFsError as exc:
            self.warn(str(exc))
            return str(exc) + self._give_back(d, q, check.server_id)
        if freed is None:
            # removed by someone else since it was listed: not this run's work
            return 'already removed (by another process) before this run unlinked it'
        self._finished.append(q.ino)
        self.removed_files.append(entry['path'])
        self.freed_bytes += freed
        return None

    def _give_back(self, d: shm_fs.ShmDir, q: shm_fs.Quarantined, server: str | None) -> str:
        """Rename a quarantined file that stays back to its name and unmark it; the text to add to its reason.

        One that stays under its quarantine name is recorded (an orphan or leftover file was not), so that a later
        stale cleanup of this server finishes it once nobody holds it: no pattern matches a quarantine name.
        """
        if q.name == q.original:
            return ''
        try:
            back = d.restore(q.name, q.original)
        except ShmFsError as exc:
            self.warn(str(exc))
            self._record_quarantined(d, q, server)
            return f'; it stays under {q.name}: {exc}'
        if not back:
            self._record_quarantined(d, q, server)
            self.warn(f'{q.original} in {d.path} was created again while the file it named was quarantined; that file is '
                      f'kept under {q.name} (a stale cleanup removes it once nobody holds it)')
            return f'; its name was taken meanwhile, so it stays under {q.name}'
        self._finished.append(q.ino)
        return ''

    def _record_quarantined(self, d: shm_fs.ShmDir, q: shm_fs.Quarantined, server: str | None) -> None:
        """Add a file left under its quarantine name to the cleanup record, unless it is there (a warning when refused)."""
        record = shm_fs.read_cleanup_record(d.fd)
        if q.ino in record or not server:
            return
        record[q.ino] = shm_fs.CleanupMark('', q.original, server)
        try:
            d.write_cleanup_record(record)
        except ShmFsError as exc:
            self.warn(f'{q.name} is not recorded ({exc}): only an orphan pattern matching it removes it')

    def _absent_cuda(self) -> None:
        p = self.params
        for opt in ('orphan_files', 'backend_leftovers'):
            if p.get(opt):
                raise ParameterError(f'{opt} applies to kind=system only (CUDA regions have no files)')
        current = self.client.status('cuda')
        names = set(p['name'] or ())
        selected = self._select(rec for rec in current if p['all'] or rec['name'] in names)
        if p['stale'] and not p['all']:
            self.warn('CUDA regions are never stale (their clients cannot be observed): stale=true selects none of them')
        sel = {r['name'] for r in selected}
        self.before = {'regions': [_cuda_spec(r) for r in current], 'files': []}
        self.after = {'regions': [_cuda_spec(r) for r in current if r['name'] not in sel], 'files': []}
        if not selected:
            return
        self.changed = True
        if self.check_mode:
            self.unregistered = sorted(sel)
            return
        self._unregister_selected('cuda', selected, set())
