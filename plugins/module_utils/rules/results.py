# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What triton_shm_info returns for a classified snapshot: the result and its summary.

Private to the tritonops.shm collection: no stability promise to other code. Pure: snapshot.py reads (facts.py, the
plain data), classification.py decides, this builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ansible_collections.tritonops.shm.plugins.module_utils.rules import families as families_mod
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import Records, pool_records
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.rules.records import KINDS
from ansible_collections.tritonops.shm.plugins.module_utils.rules.vocabulary import (
    DANGLING,
    FILE_CATEGORIES,
    FOREIGN,
    IN_USE,
    REGION_STATES,
    TRITON_CATEGORIES,
    file_bytes_key,
    file_count_key,
    kind_bytes_key,
    kind_count_key,
    region_bytes_key,
    region_count_key,
)

LIMITED, ALL = 'limited', 'all'
FILE_RECORDS = (LIMITED, ALL)
OTHER_FILE_RECORDS = 1000
"""With file_records=limited, at most this many records of files that are not Triton's (in_use, foreign)."""


def listed_files(files: Sequence[dict], file_records: str = LIMITED) -> tuple[list, dict]:
    """The file records an answer lists, and what it leaves out ({files, bytes, by_category}).

    ALL lists every file. LIMITED lists every file of Triton's, which a cleanup acts on or protects (registered,
    backend, leftover, orphan), and the OTHER_FILE_RECORDS largest of the rest (in_use, foreign), in the records' own
    order: a directory that other software fills with 100,000 files gives an answer of a few hundred kilobytes, not
    tens of megabytes. The families count every file, and the summary's counts and bytes too.
    """
    omitted: dict = {'files': 0, 'bytes': 0, 'by_category': {}}
    if file_records == ALL:
        return list(files), omitted
    others = [i for i, f in enumerate(files) if f.get('category') not in TRITON_CATEGORIES]
    if len(others) <= OTHER_FILE_RECORDS:
        return list(files), omitted
    ranked = sorted(others, key=lambda i: (-int(files[i].get('allocated_bytes') or 0), i))
    dropped = set(ranked[OTHER_FILE_RECORDS:])
    for i in sorted(dropped):
        f = files[i]
        omitted['files'] += 1
        omitted['bytes'] += int(f.get('allocated_bytes') or 0)
        category = str(f.get('category'))
        omitted['by_category'][category] = omitted['by_category'].get(category, 0) + 1
    return [f for i, f in enumerate(files) if i not in dropped], omitted


def info_result(
    snap: Snapshot,
    records: Records,
    live: bool | None = None,
    ready: bool | None = None,
    families: Sequence = families_mod.FAMILIES,
    file_records: str = LIMITED,
) -> dict:
    """What triton_shm_info returns for a snapshot and its records (live, ready: the health calls, if made; families:
    the table the files that are not Triton's are counted by, families.table(); file_records: LIMITED or ALL, see
    listed_files). The summary, the families and the pools count every file, listed or not."""
    files = records.files
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
    listed, omitted = listed_files(files, file_records)
    return {
        'server': server,
        'shm_fs': fs,
        **{kind.result_key: records.of(k) for k, kind in KINDS.items()},
        'files': listed,
        'files_omitted': omitted,
        'backend_pools': pool_records(snap, files),
        'families': families_mod.count(files, families, (FOREIGN, IN_USE)),
        'gpus': gpu_facts(snap, [r for k, kind in KINDS.items() if kind.gpu for r in records.of(k)]),
        'gpu_error': snap.gpu.reading.error if snap.gpu is not None else None,
        'summary': summarize(records.regions, files, fs, deleted_bytes(snap)),
        'unreadable_processes': len(snap.scan.unreadable) if snap.scan else 0,
        'holders_complete': snap.holders_complete,
        'holders_incomplete_reason': snap.holders_incomplete_reason,
        'pid_namespace': snap.pid_namespace,
        'scanned_at': snap.scanned_at,
    }


def deleted_bytes(snap: Snapshot) -> dict | None:
    """{(dev, ino): bytes} of the files the server maps although they were unlinked (holders.deleted_sizes), or None
    when the server's maps were not read."""
    if snap.scan is None or snap.pid is None:
        return None
    return snap.scan.deleted_bytes


def summarize(
    by_kind: Mapping[str, Sequence[dict]],
    files: Sequence[dict],
    fs: dict | None,
    deleted: dict | None = None,
) -> dict:
    """The counts of a result: the regions of each kind (by_kind: {kind name: region records}, records.KINDS's order:
    ``<kind>_regions``), every region state of the kinds backed by files and every file category of vocabulary.py (in
    its order), the regions of each other kind in each of its states (``<kind>_<state>_regions``, and their byte sizes
    ``<kind>_<state>_bytes``: GPU memory, each region its own allocation), and bytes.

    Bytes (what each occupies in the filesystem, allocated blocks): ``<state>_bytes`` of every region state (each file
    once; a dangling region's are the server's unlinked mappings, deleted), ``<category>_bytes`` of every file
    category, ``files_bytes`` of every listed file, ``unlinked_mapped_bytes`` of the files the server maps although
    they were unlinked (deleted: {(dev, ino): bytes}; None when not read), and ``other_bytes``: what the filesystem
    says is used beyond those two (another process's unlinked files, the filesystem's own blocks), so that
    files_bytes + unlinked_mapped_bytes + other_bytes = used_bytes.
    """

    def file_bytes(rec: dict) -> int:
        f = rec.get('file') or {}
        return f.get('allocated_bytes', 0) if f.get('exists') else 0

    summary = {kind.result_key: len(by_kind.get(k, ())) for k, kind in KINDS.items()}
    regions = [r for k, kind in KINDS.items() if kind.files for r in by_kind.get(k, ())]
    for state in REGION_STATES:
        summary[region_count_key(state)] = sum(1 for r in regions if r.get('state') == state)
    unlinked = sum((deleted or {}).values())
    for state in REGION_STATES:
        if state == DANGLING:
            summary[region_bytes_key(state)] = unlinked if any(r.get('state') == state for r in regions) else 0
            continue
        summary[region_bytes_key(state)] = sum(
            {r['file']['path']: file_bytes(r) for r in regions if r.get('state') == state and r.get('file')}.values()
        )
    for k, kind in KINDS.items():
        for state in () if kind.files else kind.states:  # each region is its own allocation
            these = [r for r in by_kind.get(k, ()) if r.get('state') == state]
            summary[kind_count_key(k, state)] = len(these)
            summary[kind_bytes_key(k, state)] = sum(int(r.get('byte_size') or 0) for r in these)
    for category in FILE_CATEGORIES:
        summary[file_count_key(category)] = sum(1 for f in files if f.get('category') == category)
        summary[file_bytes_key(category)] = sum(f.get('allocated_bytes', 0) for f in files if f['category'] == category)
    for key in ('used_bytes', 'total_bytes', 'used_percent'):
        summary[key] = fs[key] if fs else None
    summary['files_bytes'] = sum(f.get('allocated_bytes', 0) for f in files)
    summary['unlinked_mapped_bytes'] = None if deleted is None else unlinked
    summary['other_bytes'] = (
        None
        if not fs or deleted is None
        else max(0, fs['used_bytes'] - summary['files_bytes'] - summary['unlinked_mapped_bytes'])
    )
    return summary


def gpu_facts(snap: Snapshot, on_gpus: Sequence[dict]) -> list | None:
    """Per NVML GPU, what the CUDA rule read (snapshot.gpu): the server's NVML charge, the CUDA regions' bytes by state
    (a region counts on the GPU its device_id is proven to name, its gpu_uuid; on none when that is not proven), the
    processes with a CUDA context besides the server
    (its possible owners) and the zombies among them. None when the GPUs were not read (no CUDA region, the server not
    located, or outside the host's initial PID namespace)."""
    ev = snap.gpu
    if ev is None:
        return None
    out = []
    for g in ev.reading.gpus:
        owners = ev.owners((g,))
        mine = [r for r in on_gpus if r.get('gpu_uuid') == g.uuid]
        out.append(
            {
                'index': g.index,
                'uuid': g.uuid,
                'mig': g.mig,
                'server_bytes': g.charged(snap.pid) if snap.pid is not None else None,
                **{
                    f'{kind.name}_region_bytes': {
                        state: sum(int(r.get('byte_size') or 0) for r in mine if r.get('state') == state)
                        for state in kind.states
                    }
                    for kind in KINDS.values()
                    if kind.gpu
                },
                'context_holders': [o.as_dict() for o in owners],
                'zombies': [o.pid for o in owners if o.zombie],
            }
        )
    return out
