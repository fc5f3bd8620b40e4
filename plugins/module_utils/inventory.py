# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Join regions, files and holders into classified records.

Private to the tritonops.shm collection. This is the one place where a region
is called healthy, stale, reserved, dangling or unknown, and a file registered,
backend, in_use, orphan or foreign (see docs/concepts.md).

A region is the operator's (``reserved`` while no client maps it) when its backing file
carries the mark triton_shm_region sets when it registers a region (shm_fs.RESERVED_XATTR)
and the mark names that region.
"""
from __future__ import annotations

import os
import time

from ansible_collections.tritonops.shm.plugins.module_utils import discovery
from ansible_collections.tritonops.shm.plugins.module_utils import holders as holders_mod
from ansible_collections.tritonops.shm.plugins.module_utils import shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.patterns import matches
from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError

REGION_KEYS = ('name', 'key', 'offset', 'byte_size')


class Inventory(object):
    """Everything known about one server's shared memory at one moment."""

    def __init__(self, client, server_pid=None, shm_dir=None, orphan_patterns=None, min_age=300,
                 require_readable_dir=False, proc='/proc', now=None, kinds=('system', 'cuda'), backend_patterns=None):
        self.client = client
        self.proc = proc
        self.orphan_patterns = list(orphan_patterns or [])
        self.backend_patterns = list(shm_fs.BACKEND_PATTERNS if backend_patterns is None else backend_patterns)
        self.min_age = min_age
        self.warnings = []
        self.metadata = client.server_metadata()
        extensions = self.metadata.get('extensions') or []
        if 'system_shared_memory' not in extensions:
            raise TritonError('server at %s (Triton %s) does not offer the system_shared_memory extension; '
                              'extensions: %s' % (client.base, self.metadata.get('version'), ', '.join(extensions) or 'none'),
                              url=client.base + '/v2')
        self.system = client.status('system') if 'system' in kinds else []
        self.cuda = []
        if 'cuda' in kinds and 'cuda_shared_memory' in extensions:
            self.cuda = client.status('cuda')
        try:
            loc = discovery.locate_server(client.host, client.port, client.base, server_pid, shm_dir, proc)
        except discovery.DiscoveryError as exc:
            raise TritonError(str(exc), url=client.base)
        self.pid, self.shm_dir, self.located_by, self.server_reason = loc.pid, loc.shm_dir, loc.located_by, loc.reason
        self.warnings.extend(loc.warnings)
        self.fs = None
        self.entries = []
        self.scan = None
        self.deleted = {}
        self.dir_error = None
        self._by_name = None
        if self.shm_dir is not None:
            try:
                self.fs = shm_fs.usage(self.shm_dir)
                self.entries = shm_fs.list_entries(self.shm_dir, now=now)
            except OSError as exc:
                self.dir_error = 'shm_dir %s is not readable: %s' % (self.shm_dir, exc.strerror or exc)
                if require_readable_dir:
                    raise shm_fs.ShmFsError(self.dir_error)
                self.warnings.append(self.dir_error + ': file and holder data are missing')
                self.shm_dir = None
                self.entries = []
        self.rescan()

    # -- holders ---------------------------------------------------------------------------

    def rescan(self):
        """(Re)read holders of every regular file and of registered files unlinked under the server."""
        if self.shm_dir is None:
            self.scan = None
            return
        targets = set((e['dev'], e['inode']) for e in self.entries if e['type'] == 'file')
        # the server's unlinked-but-mapped files come from the same read of its maps as its holdings
        self.scan = holders_mod.scan(targets, proc=self.proc, deleted_of=self.pid)
        if self.pid is not None:
            self.deleted = self.scan.deleted
        reason = self.scan.incomplete_reason()
        if reason:
            self.warnings.append('holders are incomplete, no region is reported stale and no file orphan: ' + reason)

    def client_holders(self, dev, ino):
        exclude = (self.pid,) if self.pid is not None else ()
        return self.scan.holders_of(dev, ino, exclude=exclude) if self.scan else []

    def server_holds(self, dev, ino):
        return self.pid is not None and self.scan is not None and self.pid in self.scan.holders.get((dev, ino), set())

    # -- records ---------------------------------------------------------------------------

    def entry(self, name):
        if self._by_name is None or self._by_name[0] is not self.entries:
            self._by_name = (self.entries, dict((e['name'], e) for e in self.entries))
        return self._by_name[1].get(name)

    def region_record(self, region):
        rec = self._classify_region(region)
        rec['reclaimable'] = self._reclaimable(rec)
        return rec

    def _reclaimable(self, rec):
        """Whether cleaning dead regions (triton_shm_region stale=true) takes this one.

        Stale regions, and dangling ones whose unlinked file no client maps any more: their
        memory stays allocated until they are unregistered. A dangling region counts only when
        the holders are fully known and the server process, whose mapping of the file is the
        only way to find it after the unlink, is known.
        """
        if rec['state'] == 'stale':
            return True
        return (rec['state'] == 'dangling' and not rec['holders'] and self.pid is not None
                and self.scan is not None and self.scan.complete)

    def _classify_region(self, region):
        rec = dict(region)
        rec['file'] = None
        rec['holders'] = []
        rec['reserved'] = False
        if self.shm_dir is None:
            rec['state'] = 'unknown'
            rec['state_reason'] = 'the shm directory of the server is not known'
            return rec
        try:
            name = shm_fs.key_to_name(region.get('key'))
        except shm_fs.ShmFsError as exc:
            rec['state'] = 'unknown'
            rec['state_reason'] = 'backing file cannot be located safely: %s' % exc
            return rec
        e = self.entry(name)
        if e is None:
            path = os.path.join(self.shm_dir, name)
            rec['file'] = dict(path=path, exists=False)
            ident = self.deleted.get(name)
            if ident:
                rec['holders'] = self.client_holders(*ident)
            rec['state'] = 'dangling'
            rec['state_reason'] = 'backing file %s is missing' % path
            if rec['holders']:
                rec['state_reason'] += ' (still mapped by a client)'
            return rec
        rec['file'] = {'path': e['path'], 'exists': True, 'type': e['type'], 'size': e['size'],
                       'allocated_bytes': e['allocated_bytes'], 'inode': e['inode'], 'uid': e['uid'], 'mode': e['mode'],
                       'mtime': e['mtime'], 'age_s': e['age_s']}
        if e['type'] != 'file':
            rec['state'] = 'unknown'
            rec['state_reason'] = 'backing path is a %s, not a regular file' % e['type']
            return rec
        rec['holders'] = self.client_holders(e['dev'], e['inode'])
        rec['reserved'] = shm_fs.read_mark(e['path']) == region.get('name')
        if rec['holders']:
            rec['state'] = 'healthy'
            rec['state_reason'] = 'held by ' + holders_mod.holders_text(rec['holders'])
        elif not self.scan.complete:
            rec['state'] = 'unknown'
            rec['state_reason'] = 'holders could not be fully determined'
        elif self.pid is None:
            rec['state'] = 'unknown'
            rec['state_reason'] = 'the server process is not known, so its own mapping cannot be told apart'
        elif rec['reserved']:
            rec['state'] = 'reserved'
            rec['state_reason'] = ('registered by tritonops.shm (its file carries the mark %s) and not mapped by a client yet: '
                                   'desired state, never stale' % shm_fs.RESERVED_XATTR)
        else:
            rec['state'] = 'stale'
            rec['state_reason'] = 'no process but the server holds the backing file: the client is gone'
        return rec

    def cuda_record(self, region):
        rec = dict(region)
        rec['state'] = 'unknown'
        rec['state_reason'] = 'CUDA regions have no backing file; their clients cannot be observed'
        return rec

    def file_record(self, e, region_records, regions_by_path=None):
        rec = dict(e)
        rec.pop('dev', None)
        rec.pop('ctime_ns', None)
        if regions_by_path is None:
            regions_by_path = _regions_by_path(region_records)
        rec['regions'] = sorted(regions_by_path.get(e['path'], ()))
        all_holders = self.scan.holders_of(e['dev'], e['inode']) if (self.scan and e['type'] == 'file') else []
        rec['holders'] = [h for h in all_holders if h['pid'] != self.pid]
        rec['category'], rec['category_reason'] = self._category(e, rec, all_holders)
        return rec

    def _category(self, e, rec, all_holders):
        if e['type'] != 'file':
            return 'foreign', 'not a regular file (%s)' % e['type']
        if rec['regions']:
            return 'registered', 'backs region(s) %s' % ', '.join(rec['regions'])
        if matches(e['name'], self.backend_patterns):
            return 'backend', "Triton's python backend shared memory (matches the backend patterns)"
        if all_holders:
            return 'in_use', 'held by ' + holders_mod.holders_text(all_holders)
        if not matches(e['name'], self.orphan_patterns):
            return 'foreign', 'matches no orphan pattern'
        if e['age_s'] < self.min_age:
            return 'foreign', 'matches an orphan pattern but is younger than min_age (%ss < %ss)' % (e['age_s'], self.min_age)
        if not self.scan or not self.scan.complete:
            return 'foreign', 'holders could not be fully determined'
        return 'orphan', 'unregistered, unheld, matches an orphan pattern, older than min_age'

    def records(self):
        regions = [self.region_record(r) for r in self.system]
        cuda = [self.cuda_record(r) for r in self.cuda]
        by_path = _regions_by_path(regions)
        files = [self.file_record(e, regions, by_path) for e in self.entries]
        return regions, cuda, files

    def result(self, live=None, ready=None, records=None):
        """What triton_shm_info returns; records: this inventory's records() when the caller already has them."""
        regions, cuda, files = records or self.records()
        fs = dict(self.fs) if self.fs else None
        summary = summarize(regions, cuda, files, fs)
        server = dict(url=self.client.base, live=live, ready=ready, version=self.metadata.get('version'),
                      name=self.metadata.get('name'), extensions=self.metadata.get('extensions') or [],
                      pid=self.pid, shm_dir=self.shm_dir, located_by=self.located_by,
                      not_found_reason=self.server_reason if self.pid is None else None)
        return dict(server=server, shm_fs=fs, system_regions=regions, cuda_regions=cuda, files=files,
                    summary=summary,
                    unreadable_processes=len(self.scan.unreadable) if self.scan else 0,
                    holders_complete=bool(self.scan and self.scan.complete),
                    scanned_at=time.time())


def _regions_by_path(region_records):
    """{backing file path: [region names]} of regions whose file exists: one pass, not one per file."""
    out = {}
    for r in region_records:
        f = r.get('file')
        if f and f.get('exists'):
            out.setdefault(f['path'], []).append(r['name'])
    return out


def summarize(regions, cuda, files, fs):
    def count(items, key, value):
        return sum(1 for i in items if i.get(key) == value)

    def file_bytes(rec):
        f = rec.get('file') or {}
        return f.get('allocated_bytes', 0) if f.get('exists') else 0
    return dict(
        system_regions=len(regions),
        cuda_regions=len(cuda),
        healthy_regions=count(regions, 'state', 'healthy'),
        stale_regions=count(regions, 'state', 'stale'),
        reserved_regions=count(regions, 'state', 'reserved'),
        stale_bytes=sum(dict((r['file']['path'], file_bytes(r)) for r in regions if r['state'] == 'stale').values()),
        dangling_regions=count(regions, 'state', 'dangling'),
        unknown_regions=count(regions, 'state', 'unknown'),
        registered_files=count(files, 'category', 'registered'),
        backend_files=count(files, 'category', 'backend'),
        in_use_files=count(files, 'category', 'in_use'),
        orphan_files=count(files, 'category', 'orphan'),
        orphan_bytes=sum(f['allocated_bytes'] for f in files if f['category'] == 'orphan'),
        foreign_files=count(files, 'category', 'foreign'),
        used_bytes=fs['used_bytes'] if fs else None,
        total_bytes=fs['total_bytes'] if fs else None,
        used_percent=fs['used_percent'] if fs else None,
    )
