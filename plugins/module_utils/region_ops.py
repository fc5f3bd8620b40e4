# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Register, unregister and clean regions safely: the work behind triton_shm_region.

Private to the tritonops.shm collection. Decisions about what a region or a
file *is* come from inventory.py; this file decides what to *do* and does it,
in the order the safety invariants require (docs/concepts.md):
unregister first, re-check holders, then unlink only unheld regular files by
(device, inode) inside the shm directory.
"""
from __future__ import annotations

import os
import time

from ansible_collections.tritonops.shm.plugins.module_utils import discovery, runlock, shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.holders import holders_text
from ansible_collections.tritonops.shm.plugins.module_utils.inventory import REGION_KEYS, Inventory
from ansible_collections.tritonops.shm.plugins.module_utils.patterns import matches
from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError


# what _unregister did with one region
UNREGISTERED = 'unregistered'
GONE = 'gone'
KEPT = 'kept'


def _spec(region):
    return dict((k, region.get(k)) for k in REGION_KEYS if k in region)


def version_tuple(version):
    """'2.51.0' -> (2, 51, 0); None or an unparsable version -> None."""
    parts = []
    for part in str(version or '').split('.'):
        digits = ''.join(c for c in part if c.isdigit()) if part[:1].isdigit() else ''
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


# Before Triton 2.50 (NGC 24.09), unregistering a region with requests in flight could crash the
# server (triton-inference-server/server#3207); 2.50 refuses it as "in use" instead.
SAFE_UNREGISTER_VERSION = (2, 50)


# Triton 2.53 (NGC 24.12) and later accept an unregister while requests are in flight and keep the
# region listed until they finish; before, an answered unregister removed it at once.
DEFERRED_UNREGISTER_VERSION = (2, 53)


def _may_defer(inv):
    """Whether this server may keep an unregistered region listed (24.12+, or a version we cannot read)."""
    version = version_tuple(inv.metadata.get('version'))
    return version is None or version >= DEFERRED_UNREGISTER_VERSION


def _same(listed, spec):
    """Whether a listed region has the spec (key, offset, byte_size; device_id for CUDA) of an earlier record."""
    return all(listed.get(k) == spec.get(k) for k in ('key', 'offset', 'byte_size', 'device_id') if k in spec)


def _cuda_spec(region):
    return dict((k, region.get(k)) for k in ('name', 'device_id', 'byte_size') if k in region)


class RegionOps(object):
    """One module run: plan, then (unless check mode) act, recording everything done."""

    def __init__(self, client, params, check_mode=False, warn=None, sleep=time.sleep, clock=time.monotonic,
                 serialise=True):
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
        self.removed_files = []
        self.created_files = []
        self.marked_files = []
        self.skipped = []
        self.freed_bytes = 0
        self.before = None
        self.after = None
        self.used_before = None
        self.used_after = None
        self.inv = None
        self.before_result = None   # with inventory: what triton_shm_info would have returned when this run read the server
        self.inv_after = None    # the read before unlinking, when it is also the state returned after the change
        self.status_after = None

    # -- results ---------------------------------------------------------------------------

    def done_something(self):
        return bool(self.registered or self.unregistered or self.removed_files or self.created_files or self.marked_files)

    def partial(self):
        """What was done so far: returned on success and on failure part-way.

        changed is what really changed (in check mode: what would change), also after a failure.
        """
        changed = self.changed if self.check_mode else self.done_something()
        out = dict(changed=changed, registered=self.registered, unregistered=self.unregistered,
                   removed_files=self.removed_files, created_files=self.created_files, marked_files=self.marked_files,
                   skipped_items=self.skipped,
                   freed_bytes=self.freed_bytes)
        if self.before_result is not None:
            out['before'] = self.before_result
        if self.used_before is not None:
            out['shm_used_bytes_before'] = self.used_before
            out['shm_used_bytes_after'] = self.used_after
        return out

    def _inventory(self, kinds, orphan_patterns=None, min_age=300):
        p = self.params

        def read():
            return Inventory(self.client, server_pid=p.get('server_pid'), shm_dir=p.get('shm_dir'),
                             orphan_patterns=orphan_patterns, min_age=min_age,
                             require_readable_dir=p.get('shm_dir') is not None, kinds=kinds,
                             backend_patterns=p.get('backend_patterns'))
        self.inv = read()
        if not self.check_mode and self._lock(self.inv):
            # another run acted on this server while we waited: plan from what is there now
            self.inv = read()
        for w in self.inv.warnings:
            self.warn(w)
        if self.inv.fs:
            self.used_before = self.used_after = self.inv.fs['used_bytes']
        return self.inv

    def _lock(self, inv):
        """Serialise runs against this server's shm directory; True when another run held the lock."""
        if not self.serialise or self.lock is not None or inv.shm_dir is None:
            return False
        lock = runlock.ShmDirLock(inv.shm_dir, sleep=self.sleep, clock=self.clock)
        try:
            waited = lock.acquire()
        except OSError as exc:
            self.warn('cannot lock %s (%s): acting without it, a run at the same time may count the same regions'
                      % (lock.path, exc.strerror or exc))
            return False
        self.lock = lock
        return waited

    def release(self):
        """Release the per-server lock (the end of the process releases it too)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def inventory_after(self):
        """What triton_shm_info would return now (see _read_again), still under the per-server lock."""
        if self.inv_after is None and not self.done_something() and self.before_result is not None:
            return self.before_result   # nothing changed since the read this run selected from
        result = (self.inv_after or self._read_again()).result()
        result['server'].update(located_by=self.inv.located_by,
                                not_found_reason=self.inv.server_reason if self.inv.pid is None else None)
        return result

    def _read_again(self):
        """The server's shared memory read again: status, files and a full holder scan.

        The server found before is kept (no second discovery); server.live and server.ready are not measured.
        """
        p = self.params
        return Inventory(self.client, server_pid=self.inv.pid, shm_dir=self.inv.shm_dir, orphan_patterns=p['orphan_patterns'],
                         min_age=p['min_age'], kinds=('system',), backend_patterns=p.get('backend_patterns'))

    def _measure_after(self):
        if self.inv and self.inv.shm_dir and not self.check_mode:
            try:
                self.used_after = shm_fs.usage(self.inv.shm_dir)['used_bytes']
            except OSError:
                pass

    # -- unregister with the in-use retry ---------------------------------------------------

    def _unregister(self, kind, name):
        """Unregister one region; return UNREGISTERED, GONE (no longer registered: not our work) or KEPT.

        KEPT means it is still registered (in use past in_use_timeout, or a name the client cannot
        address), with the reason recorded in skipped.
        """
        timeout = self.params.get('in_use_timeout', 10)
        deadline = self.clock() + timeout
        delay = 0.05
        while True:
            try:
                self.client.unregister(kind, name)
                return UNREGISTERED
            except TritonError as exc:
                if exc.unaddressable:
                    self.skipped.append(dict(name=name, reason=exc.msg))
                    return KEPT
                if exc.not_found:
                    return GONE
                if not exc.in_use:
                    raise
                if self.clock() + delay > deadline:
                    self.skipped.append(dict(name=name, reason='still in use after %ss (requests in flight): %s'
                                             % (timeout, exc.server_error)))
                    return KEPT
                self.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _wait_gone(self, kind, specs):
        """Poll the status until no region of specs {name: spec} is listed, within in_use_timeout; return those still listed.

        Triton 24.12 and later accept an unregister while requests are in flight and keep the region
        listed until they finish: its file must not be unlinked, nor the name registered again, before then.
        A name listed with another spec is a new registration (a client registered the name again), not ours.
        """
        if not specs:
            return set()
        deadline = self.clock() + self.params.get('in_use_timeout', 10)
        delay = 0.05
        while True:
            listed = set(r.get('name') for r in self.client.status(kind)
                         if r.get('name') in specs and _same(r, specs[r.get('name')]))
            if not listed or self.clock() + delay > deadline:
                return listed
            self.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- present ----------------------------------------------------------------------------

    def _check_key_allowed(self, key_name):
        """Refuse keys of Triton's python backend files before asking the server."""
        if key_name.startswith(shm_fs.BACKEND_PREFIX):
            raise shm_fs.ShmFsError("key '/%s' starts with '%s', the prefix Triton reserves for its python backend "
                                    "(Triton 2.60 and later refuse it as a reserved prefix): choose another key"
                                    % (key_name, shm_fs.BACKEND_PREFIX))
        patterns = self.params.get('backend_patterns')
        if matches(key_name, patterns):
            raise shm_fs.ShmFsError("key '/%s' names a python backend file (it matches backend_patterns %s): "
                                    "registering it as a client region would hand Triton's own memory to clients; "
                                    "choose another key" % (key_name, ', '.join(patterns)))

    def _mark(self, inv, key_name, region):
        """Mark the backing file as this region's (reserved); a refusal is a warning, the region stays registered."""
        path = os.path.join(inv.shm_dir, key_name)
        try:
            with shm_fs.ShmDir(inv.shm_dir) as d:
                st = d.lstat(key_name)
                if st is None:
                    raise shm_fs.ShmFsError('%s does not exist' % path)
                d.set_mark(key_name, region, st.st_dev, st.st_ino)
        except shm_fs.ShmFsError as exc:
            self.warn("region '%s' is registered, but its file could not be marked as the operator's: a later "
                      "stale cleanup would take it once no client maps it (%s)" % (region, exc))
            return
        self.marked_files.append(path)

    def present(self):
        if self.params['kind'] == 'cuda':
            return self._present_cuda()
        p = self.params
        key_name = shm_fs.key_to_name(p['key'])
        self._check_byte_size()
        if p['offset'] < 0:
            raise shm_fs.ShmFsError('offset must be 0 or more, got %s' % p['offset'])
        need = p['offset'] + p['byte_size']
        self._check_key_allowed(key_name)
        inv = self._inventory(kinds=('system',))
        current = dict((r['name'], r) for r in inv.system)
        wanted = dict(key=p['key'], offset=p['offset'], byte_size=p['byte_size'])
        self.before = dict(regions=[_spec(current[n]) for n in p['name'] if n in current])
        todo = self._todo(current, wanted)
        create = False
        if inv.shm_dir is None:
            if p['create_file']:
                raise shm_fs.ShmFsError('create_file needs the server\'s shm directory, which was not found: set server_pid or shm_dir')
        elif todo:
            create = self._check_backing_file(inv, key_name, need, p['create_file'])
            if create and inv.fs:
                self._check_fits(inv, key_name, need)
        self.after = dict(regions=[dict(name=n, **wanted) for n in p['name']])
        if not todo:
            self._mark_unmarked(inv, key_name)
            return
        self.changed = True
        if self.check_mode:
            if create:
                self.created_files.append(os.path.join(inv.shm_dir, key_name))
            self.registered = [n for n, _cur in todo]
            return
        created = None
        if create:
            with shm_fs.ShmDir(inv.shm_dir) as d:
                created = d.create(key_name, need)
            self.created_files.append(os.path.join(inv.shm_dir, key_name))
        try:
            self._register_all('system', todo, lambda name: self.client.register_system(name, p['key'], p['offset'], p['byte_size']),
                               lambda cur: self.client.register_system(cur['name'], cur['key'], cur.get('offset', 0), cur['byte_size']))
            if inv.shm_dir is not None:
                for name in self.registered:
                    self._mark(inv, key_name, name)
        except TritonError:
            if created is not None and not self.registered:
                # nothing uses the file we created: take it back (only that very file, by device and inode)
                with shm_fs.ShmDir(inv.shm_dir) as d:
                    d.unlink(key_name, created.st_dev, created.st_ino)
                self.created_files = []
            raise
        finally:
            self._measure_after()

    def _check_byte_size(self):
        size = self.params['byte_size']
        if size is None or size <= 0:
            raise shm_fs.ShmFsError('byte_size must be a positive number of bytes, got %s' % size)

    def _todo(self, current, wanted):
        """[(name, current region or None)] of the asked names not registered as wanted."""
        return [(n, current.get(n)) for n in self.params['name'] if not (n in current and _same(current[n], wanted))]

    def _mark_unmarked(self, inv, key_name):
        """A region already registered as asked: mark its backing file when it does not carry the mark yet."""
        if inv.shm_dir is None:
            return
        entry = inv.entry(key_name)
        if entry is None or entry['type'] != 'file':
            return
        for name in self.params['name']:
            if shm_fs.read_mark(entry['path']) == name:
                continue
            self.changed = True
            if self.check_mode:
                self.marked_files.append(entry['path'])
            else:
                self._mark(inv, key_name, name)

    def _register_all(self, kind, todo, register, restore):
        """Register each (name, current) of todo; a different current spec is unregistered first.

        When the server refuses the new spec after the old one was unregistered, the old spec is
        registered again so that a refused change leaves the region as it was.
        """
        for name, cur in todo:
            if cur is not None:
                if self._unregister(kind, name) == KEPT:
                    raise TritonError("re-register %s region '%s': it stays in use (requests in flight), not changed" % (kind, name))
                if self._wait_gone(kind, {name: cur}):
                    self.unregistered.append(name)
                    raise TritonError("re-register %s region '%s': it was unregistered but is still listed after %ss "
                                      "(requests in flight: Triton 24.12 and later remove it when they finish); "
                                      "not registered again, run again later" % (kind, name, self.params.get('in_use_timeout', 10)))
            try:
                register(name)
            except TritonError as exc:
                if cur is None:
                    raise
                try:
                    restore(cur)
                except TritonError as again:
                    self.unregistered.append(name)
                    raise type(exc)('%s; restoring the previous spec failed too, the region is now unregistered: %s'
                                    % (exc.msg, again.msg), url=exc.url, status=exc.status, server_error=exc.server_error,
                                    transport=exc.transport)
                raise type(exc)('%s; the previous spec was registered again, the region is unchanged' % exc.msg,
                                url=exc.url, status=exc.status, server_error=exc.server_error, transport=exc.transport)
            if cur is not None:
                self.unregistered.append(name)
            self.registered.append(name)

    def _check_fits(self, inv, key_name, need):
        """A file to create must fit in the shm filesystem: a sparse file larger than it makes every writer die of SIGBUS."""
        path = os.path.join(inv.shm_dir, key_name)
        if need > inv.fs['total_bytes']:
            raise shm_fs.ShmFsError('offset + byte_size (%d) is larger than the whole shm filesystem of %s (%d bytes): refusing to create %s, '
                                    'its memory could never be allocated' % (need, inv.shm_dir, inv.fs['total_bytes'], path))
        if need > inv.fs['free_bytes']:
            self.warn('%s is created with %d bytes but only %d bytes of the shm filesystem are free: writing it may fail (SIGBUS)'
                      % (path, need, inv.fs['free_bytes']))

    def _check_backing_file(self, inv, key_name, need, create_file):
        """Validate the backing file, as the inventory just listed it; True when it has to be created."""
        entry = inv.entry(key_name)
        path = os.path.join(inv.shm_dir, key_name)
        if entry is None:
            if not create_file:
                raise shm_fs.ShmFsError('backing file %s does not exist: create it (a client does) or set create_file: true' % path)
            return True
        if entry['type'] != 'file':
            raise shm_fs.ShmFsError('backing path %s is a %s, not a regular file: refusing to register it' % (path, entry['type']))
        if entry['size'] < need:
            raise shm_fs.ShmFsError('offset + byte_size (%d) is past the end of %s (%d bytes); the file is never truncated or grown'
                                    % (need, path, entry['size']))
        return False

    def _present_cuda(self):
        p = self.params
        self._check_byte_size()
        current = dict((r['name'], r) for r in self.client.status('cuda'))
        wanted = dict(device_id=p['device_id'], byte_size=p['byte_size'])
        self.before = dict(regions=[_cuda_spec(current[n]) for n in p['name'] if n in current])
        self.after = dict(regions=[dict(name=n, **wanted) for n in p['name']])
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
    def _restore_cuda(cur):
        # Triton's status does not return the IPC handle of a CUDA region: it cannot be registered again
        raise TritonError("the IPC handle of cuda region '%s' is not known to the server's status" % cur['name'])

    # -- absent -----------------------------------------------------------------------------

    def _select(self, candidates):
        """The candidate regions to unregister, minus the excluded and the unaddressable ones (skipped with the reason)."""
        selected = []
        for rec in candidates:
            if matches(rec['name'], self.params.get('exclude')):
                self.skipped.append(dict(name=rec['name'], reason='excluded by pattern'))
            elif not self._unaddressable(rec):
                selected.append(rec)
        return selected

    def _wanted(self, rec):
        """Whether the parameters ask for this system region (before exclusion)."""
        p = self.params
        return bool(p['all'] or rec['name'] in (p['name'] or ()) or (p['stale'] and rec['reclaimable'])
                    or (p.get('reserved') and rec['state'] == 'reserved'))

    def _unaddressable(self, rec):
        """True (and skipped with the reason, its file kept) when the client cannot address this region's name.

        Decided while planning, so that check mode reports exactly what a real run does.
        """
        why = self.client.unaddressable(rec['name'])
        if why is None:
            return False
        self.skipped.append(dict(name=rec['name'], reason=why))
        f = rec.get('file')
        if self.params.get('remove_file') and f and f.get('exists'):
            self.skipped.append(dict(path=f['path'], reason="region '%s' stays registered" % rec['name']))
        return True

    def _require_server(self, inv):
        """Stale and orphan cleanup on a host whose server was not found would be a silent no-op: refuse it."""
        p = self.params
        wants = [w for w, needs in (('stale', inv.pid is None), ('orphan_files', inv.shm_dir is None)) if p.get(w) and needs]
        if wants:
            raise discovery.ServerNotFound(
                '%s cleanup needs the tritonserver process behind %s and its shm directory, and %s: %s'
                % (' and '.join(wants), self.client.base,
                   'the process was not found' if inv.pid is None else 'the directory is not known',
                   inv.server_reason or inv.dir_error or 'see the warnings'))

    def absent(self):
        """Unregister the selected regions, then remove their unheld files and (with orphan_files) orphan files."""
        p = self.params
        if p['kind'] == 'cuda':
            return self._absent_cuda()
        classify_orphans = p['orphan_files'] or p.get('inventory')
        inv = self._inventory(kinds=('system',), orphan_patterns=p['orphan_patterns'] if classify_orphans else None,
                              min_age=p['min_age'])
        records = regions, _cuda, files = inv.records()
        if p.get('inventory'):
            self.before_result = inv.result(records=records)
        self._require_server(inv)
        selected = self._select(rec for rec in regions if self._wanted(rec))
        selected_names = set(r['name'] for r in selected)
        remaining = [r for r in regions if r['name'] not in selected_names]
        file_plan = self._plan_files(inv, selected, remaining, files)
        self.before = dict(regions=[_spec(r) for r in regions], files=[e['path'] for e, _n in file_plan])
        self.after = dict(regions=[_spec(r) for r in remaining], files=[])
        if not selected and not file_plan:
            return
        self.changed = True
        self._warn_unsafe_unregister(inv, selected)
        if self.check_mode:
            self.unregistered = sorted(selected_names)
            self.removed_files = [e['path'] for e, _n in file_plan]
            self.freed_bytes = sum(e['allocated_bytes'] for e, _n in file_plan)
            return
        try:
            self._unregister_then_remove(inv, selected, file_plan)
        finally:
            self._record_after()

    def _unregister_then_remove(self, inv, selected, file_plan):
        """Invariant 1: unregister first; a file is removed only once its region is gone from the status."""
        still_registered = set()
        try:
            self._unregister_selected('system', selected, still_registered)
            self._deferred(selected, still_registered)
        except TritonError:
            self._salvage_files(inv, selected, file_plan, still_registered)
            raise
        self._remove_files(inv, file_plan, still_registered)

    def _plan_files(self, inv, selected, remaining, files):
        """[(inventory entry, region name or None)]: the files to remove, each skip recorded with its reason."""
        p = self.params
        kept_paths = set(r['file']['path'] for r in remaining if r.get('file') and r['file'].get('exists'))
        entries = dict((e['path'], e) for e in inv.entries)
        file_plan = []
        planned = set()
        for rec in selected:
            f = rec.get('file')
            if not p['remove_file'] or not f or not f.get('exists'):
                continue
            path = f['path']
            reason = self._keep_file_reason(inv, rec, f, kept_paths)
            if reason is not None:
                self.skipped.append(dict(path=path, reason=reason))
            elif path not in planned:
                planned.add(path)
                file_plan.append((entries[path], rec['name']))
        if p['orphan_files']:
            file_plan.extend((entries[f['path']], None) for f in files if f['category'] == 'orphan')
        return file_plan

    def _keep_file_reason(self, inv, rec, f, kept_paths):
        """Why the backing file of a selected region must stay, or None."""
        path = f['path']
        if path in kept_paths:
            return 'also backs a region that stays registered'
        if f.get('type') != 'file':
            return 'not a regular file (%s): never removed' % f.get('type')
        if rec['holders']:
            self.warn("region '%s' is unregistered as asked, but its file %s is held by %s and is kept"
                      % (rec['name'], path, holders_text(rec['holders'])))
            return 'held by ' + holders_text(rec['holders'])
        if inv.scan is None or not inv.scan.complete:
            return 'holders could not be fully determined'
        return None

    def _unregister_selected(self, kind, selected, still_registered):
        """Unregister each selected region; add the names that stay registered (skipped with the reason) to still_registered."""
        for rec in selected:
            outcome = self._unregister(kind, rec['name'])
            if outcome == UNREGISTERED:
                self.unregistered.append(rec['name'])
            elif outcome == KEPT:
                still_registered.add(rec['name'])

    def _salvage_files(self, inv, selected, file_plan, still_registered):
        """After a failure part-way: remove the files of the regions confirmed unregistered and gone from the status,
        so that a rerun of the same task converges; every other file is kept."""
        done = set(self.unregistered)
        try:
            self._deferred(selected, still_registered)
        except TritonError as again:
            # before 24.12 an unregister Triton answered is final; since, it may still be listed
            if _may_defer(inv):
                self.skipped.extend(dict(path=e['path'], reason='not removed: the status could not be read to confirm '
                                         'that its region is gone: %s' % again.msg)
                                    for e, n in file_plan if n in done)
                return
        try:
            self._remove_files(inv, [(e, n) for e, n in file_plan if n in done], still_registered)
        except shm_fs.ShmFsError as exc:
            # e.g. the server died and its private /dev/shm went with it: the server's failure (the cause)
            # is what is raised; the files that could not be removed are reported with this reason
            removed = set(self.removed_files)
            self.skipped.extend(dict(path=e['path'], reason='not removed: %s' % exc)
                                for e, n in file_plan if n in done and e['path'] not in removed)

    def _record_after(self):
        """/dev/shm use and the server's regions after the change, as far as they can still be read."""
        self._measure_after()
        try:
            self.status_after = self.client.status('system')
            self.after['regions'] = [_spec(r) for r in self.status_after]
        except TritonError:
            pass

    def _deferred(self, selected, still_registered):
        """Regions unregistered but still listed (Triton 24.12+ defers while requests are in flight) keep their files."""
        specs = dict((r['name'], r) for r in selected if r['name'] in self.unregistered and r['name'] not in still_registered)
        for name in sorted(self._wait_gone('system', specs)):
            still_registered.add(name)
            self.skipped.append(dict(name=name, reason='unregistered, but still listed by the server after %ss (requests in '
                                     'flight: it goes when they finish); its file is kept' % self.params.get('in_use_timeout', 10)))
            self.warn("region '%s' is still listed after its unregister (requests in flight): its file is kept, "
                      "a later run removes it" % name)

    def _warn_unsafe_unregister(self, inv, selected):
        """Before Triton 2.50, unregistering a region a live client uses could crash the server (#3207)."""
        version = version_tuple(inv.metadata.get('version'))
        if version is None or version >= SAFE_UNREGISTER_VERSION:
            return
        held = sorted(r['name'] for r in selected if r['holders'])
        if held:
            self.warn('Triton %s is older than 2.50: unregistering a region while a live client runs requests through it '
                      'can crash the server (triton-inference-server/server#3207); region(s) %s are held by live clients'
                      % (inv.metadata.get('version'), ', '.join(held)))

    def _remove_files(self, inv, file_plan, still_registered):
        if not file_plan:
            return
        # Invariant 3: re-check holders immediately before unlinking. When the state after the change is
        # asked for, that re-check is a full read of the server (status, files, holders), which then
        # only loses the files unlinked here: one holder scan instead of two.
        if self.params.get('inventory'):
            check = self.inv_after = self._read_again()
        else:
            inv.rescan()
            check = inv
        with shm_fs.ShmDir(inv.shm_dir) as d:
            for entry, region in file_plan:
                path = entry['path']
                if region in still_registered:
                    self.skipped.append(dict(path=path, reason="region '%s' is still registered" % region))
                    continue
                if check.scan is None or not check.scan.complete:
                    self.skipped.append(dict(path=path, reason='holders could not be fully determined'))
                    continue
                holders = check.scan.holders_of(entry['dev'], entry['inode'])
                if holders:
                    self.skipped.append(dict(path=path, reason='held by %s (re-checked before removal)' % holders_text(holders)))
                    continue
                try:
                    freed = d.unlink(entry['name'], entry['dev'], entry['inode'], entry.get('ctime_ns'), missing=None)
                except shm_fs.ShmFsError as exc:
                    self.skipped.append(dict(path=path, reason=str(exc)))
                    self.warn(str(exc))
                    continue
                if freed is None:
                    # removed by someone else since it was listed: not this run's work
                    self.skipped.append(dict(path=path, reason='already removed (by another process) before this run unlinked it'))
                    continue
                self.removed_files.append(path)
                self.freed_bytes += freed
        if self.inv_after is not None:
            removed = set(self.removed_files)
            self.inv_after.entries = [e for e in self.inv_after.entries if e['path'] not in removed]
            try:
                self.inv_after.fs = shm_fs.usage(self.inv_after.shm_dir)
            except OSError:
                pass

    def _absent_cuda(self):
        p = self.params
        if p['orphan_files']:
            raise shm_fs.ShmFsError('orphan_files applies to kind=system only (CUDA regions have no files)')
        current = self.client.status('cuda')
        names = set(p['name'] or ())
        selected = self._select(rec for rec in current if p['all'] or rec['name'] in names)
        if p['stale'] and not p['all']:
            self.warn('CUDA regions are never stale (their clients cannot be observed): stale=true selects none of them')
        sel = set(r['name'] for r in selected)
        self.before = dict(regions=[_cuda_spec(r) for r in current], files=[])
        self.after = dict(regions=[_cuda_spec(r) for r in current if r['name'] not in sel], files=[])
        if not selected:
            return
        self.changed = True
        if self.check_mode:
            self.unregistered = sorted(sel)
            return
        self._unregister_selected('cuda', selected, set())

    def regions_after(self):
        """The regions after the change (predicted in check mode)."""
        if self.status_after is not None:
            return self.status_after
        try:
            current = self.client.status(self.params['kind'])
        except TritonError:
            return (self.after or {}).get('regions', [])
        return self._predict(current) if self.check_mode else current

    def _predict(self, current):
        p = self.params
        gone = set(self.unregistered)
        out = [r for r in current if r['name'] not in gone]
        if p['state'] == 'present':
            out = [r for r in out if r['name'] not in set(self.registered)]
            out += [r for r in self.after['regions'] if r['name'] in set(self.registered)]
        return sorted(out, key=lambda r: r['name'])
