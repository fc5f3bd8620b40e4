# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What triton_shm_info returns for a classified snapshot: the result and its summary.

Private to the tritonops.shm collection: no stability promise to other code. Pure: snapshot.py reads, classification.py
decides, this builds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ansible_collections.tritonops.shm.plugins.module_utils.classification import Records, pool_records
from ansible_collections.tritonops.shm.plugins.module_utils.snapshot import Snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.vocabulary import (
    BACKEND,
    DANGLING,
    FOREIGN,
    HEALTHY,
    IN_USE,
    LEFTOVER,
    ORPHAN,
    REGISTERED,
    RESERVED,
    STALE,
    UNKNOWN,
)


def info_result(snap: Snapshot, records: Records, live: bool | None = None, ready: bool | None = None) -> dict:
    """What triton_shm_info returns for a snapshot and its records (live, ready: the health calls, if made)."""
    regions, cuda, files = records
    fs = dict(snap.fs) if snap.fs else None
    server = {
        'url': snap.url,
        'live': live,
        'ready': ready,
        'version': snap.metadata.get('version'),
        'name': snap.metadata.get('name'),
        'extensions': snap.metadata.get('extensions') or [],
        'pid': snap.pid,
        'shm_dir': snap.shm_dir,
        'located_by': snap.located_by,
        'not_found_reason': snap.server_reason if snap.pid is None else None,
        'shm_unsupported': snap.shm_unsupported,
        'container': snap.container,
    }
    return {
        'server': server,
        'shm_fs': fs,
        'system_regions': regions,
        'cuda_regions': cuda,
        'files': files,
        'backend_pools': pool_records(snap, files),
        'summary': summarize(regions, cuda, files, fs),
        'unreadable_processes': len(snap.scan.unreadable) if snap.scan else 0,
        'holders_complete': snap.holders_complete,
        'holders_incomplete_reason': snap.holders_incomplete_reason,
        'pid_namespace': snap.pid_namespace,
        'scanned_at': snap.scanned_at,
    }


def summarize(regions: Sequence[dict], cuda: Sequence[dict], files: Sequence[dict], fs: dict | None) -> dict:
    def count(items: Iterable[dict], key: str, value: str) -> int:
        return sum(1 for i in items if i.get(key) == value)

    def file_bytes(rec: dict) -> int:
        f = rec.get('file') or {}
        return f.get('allocated_bytes', 0) if f.get('exists') else 0

    return {
        'system_regions': len(regions),
        'cuda_regions': len(cuda),
        'healthy_regions': count(regions, 'state', HEALTHY),
        'stale_regions': count(regions, 'state', STALE),
        'reserved_regions': count(regions, 'state', RESERVED),
        'stale_bytes': sum({r['file']['path']: file_bytes(r) for r in regions if r['state'] == STALE}.values()),
        'dangling_regions': count(regions, 'state', DANGLING),
        'unknown_regions': count(regions, 'state', UNKNOWN),
        'registered_files': count(files, 'category', REGISTERED),
        'backend_files': count(files, 'category', BACKEND),
        'backend_bytes': sum(f['allocated_bytes'] for f in files if f['category'] == BACKEND),
        'leftover_files': count(files, 'category', LEFTOVER),
        'leftover_bytes': sum(f['allocated_bytes'] for f in files if f['category'] == LEFTOVER),
        'in_use_files': count(files, 'category', IN_USE),
        'orphan_files': count(files, 'category', ORPHAN),
        'orphan_bytes': sum(f['allocated_bytes'] for f in files if f['category'] == ORPHAN),
        'foreign_files': count(files, 'category', FOREIGN),
        'used_bytes': fs['used_bytes'] if fs else None,
        'total_bytes': fs['total_bytes'] if fs else None,
        'used_percent': fs['used_percent'] if fs else None,
    }
