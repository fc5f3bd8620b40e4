# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Classify a snapshot (pure): the one place where states and categories are decided.

Private to the tritonops.shm collection: no stability promise to other code.

Given a snapshot (facts.Snapshot, which snapshot.py reads; a literal one in the unit tests) and the caller's
``Criteria`` (client users already resolved to uids), ``classify()`` and the functions under it decide without
reading anything: this file imports facts.py, never a module that reads (test_layers.py). A region is called
healthy, stale, reserved, dangling or unknown here (``region_state``), and a file registered, backend, leftover,
in_use, orphan or foreign (``file_category``); see docs/concepts.md. ``pool_records()`` turns the backend files
into the per-model pools (``backend_pools``), a pool naming its model only on evidence its holder cannot fake
(``pool_attribution``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ParameterError,
    ShmFsError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules import facts, records
from ansible_collections.tritonops.shm.plugins.module_utils.rules import families as families_mod
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import (
    STUB_NAME,
    PoolHolder,
    ServerFacts,
    Snapshot,
    backing_name,
    stub_args,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules.patterns import matches
from ansible_collections.tritonops.shm.plugins.module_utils.rules.vocabulary import (
    BACKEND,
    DANGLING,
    FOREIGN,
    HEALTHY,
    IN_USE,
    LEFTOVER,
    ORPHAN,
    POOL_LEFTOVER,
    POOL_LIVE,
    POOL_UNKNOWN,
    REGISTERED,
    RESERVED,
    STALE,
    SUSPECT,
    UNKNOWN,
    WEDGED,
)

DEFAULT_MIN_AGE = 300
_INSTANCE_SUFFIX = re.compile(r'_\d+_\d+$')


# -- classification (pure) ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Criteria:
    """The caller's side of file classification: orphan patterns and grace age, backend patterns, client users."""

    orphan_patterns: tuple = ()
    min_age: float = DEFAULT_MIN_AGE
    backend_patterns: tuple = facts.BACKEND_PATTERNS
    client_uids: frozenset = frozenset()  # uids whose files a cleanup may remove besides the server's user's
    wedged_after: int = facts.WEDGED_AFTER  # runs whose unregister Triton refused or deferred before wedged
    families: tuple = families_mod.FAMILIES  # other software's files: never orphans (families.table())

    @classmethod
    def of(
        cls,
        orphan_patterns: Iterable[str] | None = None,
        min_age: float = DEFAULT_MIN_AGE,
        backend_patterns: Iterable[str] | None = None,
        client_uids: Iterable[int] | None = None,
        wedged_after: int | None = None,
        extra_families: Iterable[Mapping] | None = None,
    ) -> Criteria:
        """From module options: None patterns are none (orphans) or the default (backend).

        The files of every Python-based backend (facts.BACKEND_FILE_PATTERN) are backend files whatever
        backend_patterns says: the configured patterns add to them, never replace them.
        client_uids: the uids of the client_users option, already resolved (authority.client_uids: at the edge, never
        here, so that the rules look nobody up).
        extra_families: the users' families (families.check_extra; ParameterError when they cannot be used).
        """
        refused = families_mod.check_extra(extra_families)
        if refused is not None:
            raise ParameterError(refused)
        backend = tuple(dict.fromkeys(facts.BACKEND_PATTERNS + tuple(backend_patterns or ())))
        return cls(
            orphan_patterns=tuple(orphan_patterns or ()),
            min_age=min_age,
            backend_patterns=backend,
            client_uids=frozenset(client_uids or ()),
            wedged_after=facts.WEDGED_AFTER if wedged_after is None else max(1, int(wedged_after)),
            families=families_mod.table(extra_families),
        )


# names no two families share: a pattern matching all of them matches (nearly) every name
_PROBE_NAMES = ('a', 'Z9', '.x', 'sem.x', 'client_in_0', '-', '~')


def broad_pattern_warnings(patterns: Iterable[str] | None) -> list[str]:
    """The warnings for orphan patterns that match every name (a bare V(*)): one per such pattern."""
    return [
        f'orphan_patterns {p!r} matches every file name: only the families of other software that are never orphans '
        "(docs/concepts.md), the owner rule (client_users) and min_age stand between it and other programs' files; "
        "give your clients' prefix instead, for example 'client_*'"
        for p in patterns or ()
        if all(matches(n, (p,)) for n in _PROBE_NAMES)
    ]


def removal_refusal(snap: Snapshot, criteria: Criteria, entry: dict) -> str | None:
    """Why this run may not remove the regular file of entry whatever its state, or None (no borrowed authority).

    The server's own user must be able to remove it (authority.Authority.unlink_refusal), and its owner must be
    the server's user or one of the client users (owner_refusal). Not known: refused.
    """
    if snap.authority is None:
        return 'not removed: what the server process may remove in its shm directory is not known'
    if entry.get('links', 1) > 1:
        return f'not removed: it {facts.hard_links_refusal(entry["links"])}'
    return snap.authority.refusal(entry['uid'], criteria.client_uids)


class Records(NamedTuple):
    """The classified records of one snapshot, as triton_shm_info returns them."""

    regions: dict  # {kind name: [region record]}, every kind of records.KINDS in its order
    files: list

    def of(self, kind: str) -> list:
        """The region records of kind (a kind name of records.KINDS)."""
        return self.regions.get(kind, [])


class RegionFacts(NamedTuple):
    """What a snapshot says about one system region's backing file: the input of region_state()."""

    shm_dir_known: bool
    key_error: str | None = None  # why the key cannot be located safely
    path: str | None = None  # the backing file's path
    file_type: str | None = None  # its entry type; None when it is missing
    holders: Sequence = ()  # holders other than the server
    holders_complete: bool = False
    server_known: bool = False
    reserved: bool = False  # its mark names this region
    ambiguous: str | None = None  # why the file that backs it cannot be told (several files of its name)
    backend: str | None = None  # what makes the backing file one of Triton's own backend files (a pool), if it is
    wedged: str | None = None  # why Triton will not let it go (facts.Attempts reached wedged_after), if so


def region_state(f: RegionFacts) -> tuple[str, str]:
    """(state, state_reason) of a system region: the first of these rules, in this order, that applies.

    One function that returns, not a table of callables: it runs once per region (1,000s per read).
    """
    if not f.shm_dir_known:
        return UNKNOWN, 'the shm directory of the server is not known'
    if f.key_error is not None:
        return UNKNOWN, f'backing file cannot be located safely: {f.key_error}'
    if f.ambiguous is not None:
        return UNKNOWN, f.ambiguous
    if f.file_type is None:
        return DANGLING, f'backing file {f.path} is missing' + (' (still mapped by a client)' if f.holders else '')
    if f.file_type != 'file':
        return UNKNOWN, f'backing path is a {f.file_type}, not a regular file'
    if f.backend is not None:
        return SUSPECT, (
            f"its key is {f.backend}: a client has no business registering Triton's own pool (step 2 of the 2025 "
            'attack chain; Triton 25.07 and later refuse it). Never healthy, never stale: unregistered only when asked '
            '(suspect: true), and the pool file stays'
        )
    if f.holders:
        return HEALTHY, 'held by ' + facts.holders_text(f.holders)
    if not f.holders_complete:
        return UNKNOWN, 'holders could not be fully determined'
    if not f.server_known:
        return UNKNOWN, 'the server process is not known, so its own mapping cannot be told apart'
    if f.reserved:
        return RESERVED, (
            f'registered by tritonops.shm (its file carries the mark {facts.RESERVED_XATTR}) and not '
            'mapped by a client yet: desired state, never stale'
        )
    if f.wedged is not None:
        return WEDGED, f.wedged
    return STALE, 'no process but the server holds the backing file: the client is gone'


def _file_summary(e: dict) -> dict:
    return {
        'path': e['path'],
        'exists': True,
        'type': e['type'],
        'size': e['size'],
        'allocated_bytes': e['allocated_bytes'],
        'inode': e['inode'],
        'uid': e['uid'],
        'mode': e['mode'],
        'mtime': e['mtime'],
        'age_s': e['age_s'],
        'age_from': e['age_from'],
    }


def _server_maps(snap: Snapshot, e: dict | None, unlinked: Sequence) -> bool:
    """Whether the server process maps (or holds) the region's file: the listed one, or its one unlinked file."""
    if snap.scan is None or snap.pid is None:
        return False
    if e is not None and e['type'] == 'file':
        return snap.pid in snap.scan.holders.get((e['dev'], e['inode']), ())
    return len(unlinked) == 1 and snap.pid in snap.scan.holders.get(unlinked[0], ())


def _idents(keys: Iterable[tuple]) -> str:
    """(dev, ino) pairs as people read them: 'inode 12 on 0:45, inode 13 on 0:45'."""
    return ', '.join(f'inode {ino} on {os.major(dev)}:{os.minor(dev)}' for dev, ino in keys)


def region_record(
    snap: Snapshot,
    region: dict,
    backend_patterns: Sequence[str] = facts.BACKEND_PATTERNS,
    wedged_after: int = facts.WEDGED_AFTER,
) -> dict:
    """The record of one system region: the server's fields, its file, holders, mark, state and reclaimable.

    backend_patterns: the names of Triton's own backend files (Criteria.backend_patterns): a region whose existing
    regular file is one of them is suspect.
    """
    rec = dict(region)
    file = key_error = path = file_type = backend = None
    holders: list = []
    reserved = False
    ambiguous = None
    if snap.shm_dir is not None:
        name = backing_name(region.get('key'))
        if isinstance(name, ShmFsError):
            key_error = str(name)
        else:
            e = snap.entry(name)
            unlinked = snap.unlinked(name)  # matched by (dev, ino), never by name alone
            if e is None:
                path = os.path.join(snap.shm_dir, name)
                file = {'path': path, 'exists': False}
                if len(unlinked) == 1:
                    holders = snap.client_holders(*unlinked[0])
                elif unlinked:
                    ambiguous = (
                        f'the server maps {len(unlinked)} unlinked files that were named {name} '
                        f'({_idents(unlinked)}): which one backs this region cannot be told'
                    )
            else:
                file = _file_summary(e)
                path, file_type = e['path'], e['type']
                if file_type == 'file':
                    holders = snap.client_holders(e['dev'], e['inode'])
                    reserved = snap.marks.get(name) == region.get('name')
                    pool = snap.pool_names.of(name) if snap.pool_names is not None else None
                    if matches(name, backend_patterns) or pool:
                        owner = facts.backend_of(name) or 'python'
                        backend = f"{path}, a file of Triton's {owner} backend" + (f' ({pool})' if pool else '')
                if unlinked:
                    ambiguous = (
                        f'the server maps both the file now at {path} and {len(unlinked)} unlinked file(s) of the '
                        f'same name ({_idents(unlinked)}): which one backs this region cannot be told'
                    )
            if ambiguous is None and snap.location.shared is not None and not _server_maps(snap, e, unlinked):
                ambiguous = (
                    f'the port is shared by several servers and server process {snap.pid} does not map the backing '
                    f"file {path}: the region may be another server's"
                )
    rec['file'] = file
    rec['holders'] = holders
    rec['reserved'] = reserved
    rec['state'], rec['state_reason'] = region_state(
        RegionFacts(
            snap.shm_dir is not None,
            key_error,
            path,
            file_type,
            holders,
            snap.holders_complete,
            snap.pid is not None,
            reserved,
            ambiguous,
            backend,
            _wedged(snap.wedged.get(region.get('name')), region, wedged_after),
        )
    )
    rec['reclaimable'] = reclaimable(snap, rec)
    return rec


def _wedged(attempts: facts.Attempts | None, region: dict, wedged_after: int) -> str | None:
    """Why a region Triton would not let go on wedged_after consecutive runs is wedged (None: it is not)."""
    if attempts is None or attempts.runs < wedged_after or attempts.spec != facts.spec_of(region):
        return None
    since = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(attempts.since))
    return (
        f'no process but the server holds it, and Triton refused or deferred its unregister on {attempts.runs} '
        f'consecutive runs since {since}: a reference leaked inside the server keeps it (Triton 2.53 and later, '
        'server issue 7688); only a restart of the server frees it'
    )


def reclaimable(snap: Snapshot, rec: dict) -> bool:
    """Whether cleaning dead regions (triton_shm_region stale=true) takes this one.

    Stale regions, and dangling ones whose unlinked file no client maps any more: their
    memory stays allocated until they are unregistered. A dangling region counts only when
    the holders are fully known and the server process, whose mapping of the file is the
    only way to find it after the unlink, is known.
    """
    if rec['state'] in (STALE, WEDGED):
        return True
    return rec['state'] == DANGLING and not rec['holders'] and snap.pid is not None and snap.holders_complete


def file_region_record(snap: Snapshot, region: dict, criteria: Criteria) -> dict:
    """The state rule of a region backed by a file of the shm directory (region_record with the criteria's values)."""
    return region_record(snap, region, criteria.backend_patterns, criteria.wedged_after)


def gpu_record(snap: Snapshot, region: dict, _criteria: Criteria | None = None) -> dict:
    """The record of one CUDA region: its possible owners (holders), state and reclaimable (gpu_state), and the UUID
    of the NVML GPU its device_id is proven to name (gpu.Evidence.placement; None when not proven)."""
    rec = dict(region)
    state, reason, owners = gpu_state(snap, region.get('device_id'))
    rec['holders'] = [o.as_dict() for o in owners]
    rec['state'], rec['state_reason'] = state, reason
    rec['reclaimable'] = state == STALE
    rec['gpu_uuid'] = gpu_uuid(snap, region.get('device_id'))
    return rec


def gpu_uuid(snap: Snapshot, device_id: object) -> str | None:
    """The UUID of the NVML GPU a CUDA region's device_id is proven to name, or None (not read, MIG, not proven)."""
    ev = snap.gpu if snap.pid is not None and snap.pid_namespace == 'initial' else None
    if ev is None or ev.reading.error is not None or any(g.mig for g in ev.reading.gpus) or not ev.reading.gpus:
        return None
    named = ev.placement(device_id).gpu
    return named.uuid if named is not None else None


def gpu_state(snap: Snapshot, device_id: object) -> tuple[str, str, list]:
    """(state, reason, owners) of a CUDA region on device_id: the CUDA rule (docs/cuda.md).

    Stale only when both signals of gpu.py say that no process outside the server and its descendants has a CUDA
    context on the GPUs the region may live on, no zombie candidate is there, and both signals see the server's own
    context on those GPUs (the positive control, gpu.Evidence.blind); unknown whenever either cannot be read or says
    otherwise.
    """
    ev = snap.gpu
    if snap.pid is None:
        return UNKNOWN, 'the server process was not found on this host: its GPUs cannot be checked', []
    if snap.pid_namespace != 'initial':
        return UNKNOWN, "NVML names host pids, and this module runs outside the host's initial PID namespace", []
    if ev is None:
        return UNKNOWN, 'the GPUs were not read', []
    if ev.reading.error is not None:
        return UNKNOWN, f'{ev.reading.error}: whether a client still has a CUDA context cannot be told', []
    if not ev.reading.gpus:
        return UNKNOWN, 'NVML lists no GPU', []
    if any(g.mig for g in ev.reading.gpus):
        return UNKNOWN, 'MIG is on: a context on a MIG instance cannot be told from one on the region', []
    if ev.mps:
        return UNKNOWN, "MPS runs on this host: its clients' contexts belong to the MPS server", []
    place = ev.placement(device_id)
    owners = ev.owners(place.gpus)
    where = ', '.join(f'GPU {g.index}' for g in place.gpus) + (f' ({place.why})' if place.why else '')
    blind = ev.blind(place.gpus)
    if blind is not None:
        return UNKNOWN, f'{blind} (a region on {where} is never stale then)', owners
    if owners:
        counts = [
            f'{n} {what}'
            for n, what in (
                (sum(o.zombie for o in owners), 'zombie(s)'),
                (sum(o.candidate for o in owners), 'zombie candidate(s)'),
            )
            if n
        ]
        what = ', '.join(counts) + ' and ' if counts else ''
        return (
            UNKNOWN,
            f'{what}{len(owners)} process(es) besides the server may own it, with a CUDA context on {where}: '
            + ', '.join(f'{o.comm or "?"} (pid {o.pid})' for o in owners),
            owners,
        )
    return STALE, f'no process but the server has a CUDA context on {where} (NVML and /proc): the client is gone', []


def file_record(snap: Snapshot, e: dict, regions_by_path: dict, criteria: Criteria) -> dict:
    """The record of one directory entry: its listing, the regions it backs, holders and category."""
    rec = dict(e)
    rec.pop('dev', None)
    rec.pop('ctime_ns', None)
    rec.pop('links', None)
    rec['regions'] = sorted(regions_by_path.get(e['path'], ()))
    all_holders = snap.scan.holders_of(e['dev'], e['inode']) if (snap.scan and e['type'] == 'file') else []
    rec['holders'] = [h for h in all_holders if h['pid'] != snap.pid]
    rec['category'], rec['category_reason'] = file_category(
        e,
        rec['regions'],
        all_holders,
        snap.holders_complete,
        criteria,
        leftover=snap.leftover(e['name']),
        pool=snap.pool_names.of(e['name']) if snap.pool_names is not None else None,
    )
    if rec['category'] in (ORPHAN, LEFTOVER):
        refused = removal_refusal(snap, criteria, e)
        if refused is not None:
            rec['category'] = FOREIGN if rec['category'] == ORPHAN else BACKEND
            rec['category_reason'] = refused
    rec['backend'] = file_backend(e['name'], rec['category'])
    return rec


def file_backend(name: str, category: str) -> str | None:
    """The backend a backend file belongs to: its name's triton_<backend>_backend_ part, else python.

    A file that only a configured backend pattern matches comes from a prefix set with
    --backend-config=python,shm-region-prefix-name=…, an option of the python backend (which runs
    every Python-based backend). None for every other category.
    """
    if category not in (BACKEND, LEFTOVER):
        return None
    return facts.backend_of(name) or 'python'


def file_category(
    e: dict,
    regions: Sequence[str],
    all_holders: Sequence[dict],
    holders_complete: bool,
    criteria: Criteria,
    leftover: facts.CleanupMark | None = None,
    pool: str | None = None,
) -> tuple[str, str]:
    """(category, category_reason) of a directory entry; all_holders include the server process.

    leftover: the cleanup mark (Snapshot.leftover) of a file that a stale cleanup of this server process marked,
    then unregistered its region, and was stopped before removing it: an orphan whatever the patterns say.
    pool: why the file is a python backend pool by a prefix read from a server's command line (PoolNames.of), if it is.
    """
    if e['type'] != 'file':
        return FOREIGN, f'not a regular file ({e["type"]})'
    if matches(e['name'], criteria.backend_patterns) or pool:
        if regions:
            return BACKEND, (
                f"Triton's own backend file, registered as region(s) {', '.join(regions)} (suspect): never an orphan, "
                'never a leftover while registered'
            )
        return backend_category(e, all_holders, holders_complete, criteria.min_age, pool)
    if regions:
        return REGISTERED, f'backs region(s) {", ".join(regions)}'
    if all_holders:
        return IN_USE, 'held by ' + facts.holders_text(all_holders)
    software = families_mod.describe(e['name'], criteria.families)
    if software is not None:
        return FOREIGN, f'{software}: never an orphan, whatever orphan_patterns says'
    if leftover is not None:
        if not holders_complete:
            return FOREIGN, 'holders could not be fully determined'
        what = (
            f"that unregistered region '{leftover.region}' and was stopped before removing the file"
            if leftover.region
            else 'that found it held and could not give its name back (taken again meanwhile)'
        )
        return ORPHAN, (
            f'left by a stale cleanup of this server {what} (recorded in {facts.CLEANUP_XATTR} on the shm '
            'directory): the next stale cleanup removes it'
        )
    if facts.own_quarantine(e['name'], e['inode']):
        if not holders_complete:
            return FOREIGN, 'holders could not be fully determined'
        return ORPHAN, (
            "left under the collection's quarantine name for this very inode by a cleanup that was stopped (or could "
            'not record it) after it unregistered the region: the next stale cleanup removes it'
        )
    if not matches(e['name'], criteria.orphan_patterns):
        return FOREIGN, 'matches no orphan pattern'
    if e['age_s'] < criteria.min_age:
        return FOREIGN, f'matches an orphan pattern but is younger than min_age ({e["age_s"]}s < {criteria.min_age}s)'
    if not holders_complete:
        return FOREIGN, 'holders could not be fully determined'
    return ORPHAN, 'unregistered, unheld, matches an orphan pattern, older than min_age'


def backend_category(
    e: dict, all_holders: Sequence[dict], holders_complete: bool, min_age: float, pool: str | None = None
) -> tuple[str, str]:
    """(category, category_reason) of a backend file: backend while any process holds it (or may: an incomplete
    scan, or younger than min_age), else leftover: the pool of a dead server and its stubs. pool: why it is a pool by
    a prefix read from a server's command line, when it is."""
    owner = facts.backend_of(e['name'])
    if owner is not None:
        what = f"Triton's {owner} backend shared memory (triton_{owner}_backend_shm_region_*, a Python-based backend's file)"
    elif pool is not None:
        what = f"Triton's python backend shared memory ({pool})"
    else:
        what = "Triton's python backend shared memory (matches the backend patterns)"
    if all_holders:
        return BACKEND, f'{what}, held by {facts.holders_text(all_holders)}: never an orphan, never a leftover'
    if not holders_complete:
        return BACKEND, f'{what}: never an orphan; not held as far as seen, but holders could not be fully determined'
    if e['age_s'] < min_age:
        return BACKEND, (
            f'{what}: never an orphan; no process holds it, but it is younger than min_age ({e["age_s"]}s < {min_age}s)'
        )
    return LEFTOVER, (
        f'{what}, held by no process and older than min_age: the pool of a dead server and its stubs '
        '(they died together), which no server reuses'
    )


def model_of(model_path: str, instance: str) -> str:
    """The model a stub serves: the directory of MODEL/VERSION/model.py in the repository, else (a backend's own
    model.py, as vllm's) the instance name without its _GROUP_INDEX suffix (``echo_0_0`` → ``echo``)."""
    version_dir = os.path.dirname(model_path)
    if os.path.basename(version_dir).isdigit():
        return os.path.basename(os.path.dirname(version_dir))
    return _INSTANCE_SUFFIX.sub('', instance) or instance


def pool_attribution(holder: PoolHolder, server: ServerFacts | None) -> str | None:
    """Why a holder that says it is the stub of a model is not believed (None: it is the server's own stub).

    A command line is the one thing every user controls: the model is taken from it only when the holder is a child
    of the server process, started after it, runs as the server's user in its mount namespace, and runs the server's
    python backend stub program (or a custom stub in the model's own directory of the server's repository).
    """
    if server is None or server.start is None or server.uids is None:
        return 'the server process cannot be read, so no stub can be proven its own'
    who = f'pid {holder.pid}'
    if holder.ppid != server.pid:
        return f'{who} is not a child of the server process {server.pid} (its parent is {holder.ppid})'
    if holder.start is None or holder.start < server.start:
        return f'{who} started before the server process {server.pid} (not its child: the pid was reused)'
    if holder.uids != server.uids:
        return f"{who} runs as uid {(holder.uids or ('?',))[0]}, not as the server's user (uid {server.uids[0]})"
    if holder.mnt_ns is None or holder.mnt_ns != server.mnt_ns:
        return f"{who} is not in the server's mount namespace"
    if holder.exe is None or holder.exe not in (server.stub, holder.own_stub):
        return (
            f"{who} does not run the server's python backend stub ({os.path.join(server.backend_dir, 'python', STUB_NAME)}"
            ' or one in the model directory)'
        )
    return None


def pool_record(snap: Snapshot, rec: dict) -> dict:
    """The backend_pools record of one backend or leftover file record: its model and instance (from the server's own
    stub that maps it: pool_attribution), bytes, holders (the server included), state, and why no model is named."""
    e = snap.entry(rec['name'])
    all_holders = snap.scan.holders_of(e['dev'], e['inode']) if (snap.scan is not None and e is not None) else []
    model = instance = None
    refused = []
    for h in all_holders:
        holder = snap.pool_holders.get(h['pid'])
        args = stub_args(holder.argv if holder is not None else None)
        if args is None or os.path.basename(args['region']) != rec['name']:
            continue
        why = pool_attribution(holder, snap.server_facts)
        if why is None:
            model, instance = model_of(args['model_path'], args['instance']), args['instance']
            break
        refused.append(
            f"{why}: its command line's model {model_of(args['model_path'], args['instance'])!r} is not believed"
        )
    if rec['category'] == LEFTOVER:
        state = POOL_LEFTOVER
    elif all_holders:
        state = POOL_LIVE
    else:
        state = POOL_UNKNOWN
    unattributed = None
    if model is None and state != POOL_LEFTOVER:
        unattributed = '; '.join(refused) if refused else 'no python backend stub of the server maps it'
    return {
        'path': rec['path'],
        'name': rec['name'],
        'backend': rec['backend'],
        'model': model,
        'instance': instance,
        'bytes': rec['allocated_bytes'],
        'size': rec['size'],
        'holders': all_holders,
        'state': state,
        'reason': rec['category_reason'],
        'unattributed_reason': unattributed,
    }


def pool_records(snap: Snapshot, files: Iterable[dict]) -> list:
    """The pools of Python-based backends (backend and leftover files), by model then name."""
    pools = [pool_record(snap, f) for f in files if f['category'] in (BACKEND, LEFTOVER)]
    return sorted(pools, key=lambda p: (p['model'] is None, p['model'] or '', p['instance'] or '', p['name']))


def classify(snap: Snapshot, criteria: Criteria = Criteria(), rules: Mapping[str, Callable] | None = None) -> Records:
    """Every region and file of the snapshot, classified.

    rules: {kind name: its state rule (snap, region, criteria) -> record}; None: each kind's own (kinds.RegionKind.state).
    Without the server's status (snap.shm_unsupported) no file can be told unregistered: none is an orphan.
    """
    if rules is None:
        # kinds.py holds each kind's rule and imports this module: read it when called, not when imported
        from ansible_collections.tritonops.shm.plugins.module_utils.rules import kinds

        rules = kinds.rules()
    if snap.shm_unsupported is not None:
        criteria = dataclasses.replace(criteria, orphan_patterns=())
    regions = {k: [rules[k](snap, r, criteria) for r in snap.of(k)] for k in records.KINDS}
    by_path = _regions_by_path(r for k, kind in records.KINDS.items() if kind.files for r in regions[k])
    files = [file_record(snap, e, by_path, criteria) for e in snap.entries]
    return Records(regions, files)


def _regions_by_path(region_records: Iterable[dict]) -> dict:
    """{backing file path: [region names]} of regions whose file exists: one pass, not one per file."""
    out: dict = {}
    for r in region_records:
        f = r.get('file')
        if f and f.get('exists'):
            out.setdefault(f['path'], []).append(r['name'])
    return out
