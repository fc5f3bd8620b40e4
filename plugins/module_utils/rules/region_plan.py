# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The plan of a triton_shm_region run, pure: decided from one read and the parameters, with no I/O.

Private to the tritonops.shm collection: no stability promise to other code.
What a region or a file *is* comes from classification.classify; this file decides what to *do* with it:
the regions selected to unregister, the files to remove, the reasons to keep, the regions to
register (and the file to create). check_params() is the one place for the checks the module's
argument spec cannot express. region_ops.py reads, holds the lock, and carries a plan out; in check
mode the plan is the result. Unit tests call these functions on literal snapshots.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError, ServerNotFound, ShmFsError
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, facts, vocabulary
from ansible_collections.tritonops.shm.plugins.module_utils.rules import families as families_mod
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import Records
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Snapshot, holders_text
from ansible_collections.tritonops.shm.plugins.module_utils.rules.patterns import matches
from ansible_collections.tritonops.shm.plugins.module_utils.rules.records import KINDS, SYSTEM
from ansible_collections.tritonops.shm.plugins.module_utils.rules.versions import version_tuple

# Seconds to retry an unregister Triton refuses as "in use", and to wait for a deferred one to leave
# the status: the default of the module's in_use_timeout option.
IN_USE_TIMEOUT = 10

# Before Triton 2.50 (NGC 24.09), unregistering a region with requests in flight could crash the
# server (triton-inference-server/server#3207); 2.50 refuses it as "in use" instead.
SAFE_UNREGISTER_VERSION = (2, 50)

# The options that select what state=absent acts on (one of them is required).
SELECTORS = ('stale', 'reserved', 'suspect', 'all', 'orphan_files', 'backend_leftovers', 'families')

Unaddressable = Callable[[str], 'str | None']  # client.unaddressable: why the client cannot address a name, or None


class FileAction(NamedTuple):
    """One file to remove: its snapshot entry, and the region it backs (None for an orphan or leftover file)."""

    entry: dict
    region: str | None


class Threshold(NamedTuple):
    """The threshold gate of state=absent: orphan files are removed only when the shm filesystem is at least this full.

    percent: threshold_percent (0: no gate); used_percent: the use the read measured (None when the shm filesystem is
    not known); over: whether the gate is open (always with percent 0).
    """

    percent: float
    used_percent: float | None
    over: bool

    @classmethod
    def of(cls, percent: float, fs: dict | None) -> Threshold:
        used = fs['used_percent'] if fs else None
        return cls(float(percent), used, percent <= 0 or (used is not None and used >= percent))

    def as_dict(self) -> dict:
        return self._asdict()

    def keep_reason(self) -> str:
        """Why an orphan file stays while the gate is closed."""
        used = 'not known' if self.used_percent is None else f'{self.used_percent}%'
        return (
            f'kept below the threshold: shm use is {used}, threshold_percent is {self.percent}% (orphan files are '
            'removed only at or above it)'
        )


class Register(NamedTuple):
    """One name to register, and its current registration with another spec (None when not registered)."""

    name: str
    current: dict | None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run does, decided before anything is done. In check mode it is the result.

    current: the regions of the kind as read (what the prediction of the regions after starts from).
    before/after: the diff. selected: region records to unregister, in order; files: the files to remove;
    register: the names to register; create: the backing file name to create; marks: [(path, region)] of
    files of regions already registered as asked that lack the reserved mark; skipped: the reasons to keep;
    warnings: what the run warns about, in order; threshold: the gate of state=absent with kind=system.
    inventory: with inventory=true, the read as triton_shm_info shows it (the result's ``before``).
    """

    kind: str
    current: list
    before: dict
    after: dict
    selected: list = dataclasses.field(default_factory=list)
    files: list = dataclasses.field(default_factory=list)
    register: list = dataclasses.field(default_factory=list)
    create: str | None = None
    need: int = 0
    marks: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    threshold: Threshold | None = None
    inventory: dict | None = None

    @property
    def changed(self) -> bool:
        return bool(self.selected or self.files or self.register or self.marks)

    @property
    def selected_names(self) -> list:
        return [r['name'] for r in self.selected]

    def predicted_regions(self) -> list:
        """The regions of the kind after the plan is carried out, as check mode reports them."""
        gone = set(self.selected_names)
        registered = {r.name for r in self.register}
        out = [r for r in self.current if r['name'] not in gone and r['name'] not in registered]
        out += [r for r in self.after['regions'] if r['name'] in registered]
        return sorted(out, key=lambda r: r['name'])


spec = SYSTEM.spec  # a system region's registration (records.Kind.spec)


# what a region's spec is: every kind's fields but the name, each once
_SPEC_KEYS = tuple(dict.fromkeys(f.name for kind in KINDS.values() for f in kind.fields if f.name != 'name'))


def same(listed: dict, wanted: dict) -> bool:
    """Whether a listed region has the spec (its kind's fields but the name: key, offset, byte_size; device_id for
    CUDA) of an earlier record."""
    return all(listed.get(k) == wanted.get(k) for k in _SPEC_KEYS if k in wanted)


def criteria(p: dict, client_uids: Iterable[int], orphans: bool = True) -> classification.Criteria:
    """The classification criteria of the parameters, with the uids of their client_users as the executor resolved them
    (region_ops.criteria_of: no user is looked up here)."""
    return classification.Criteria.of(
        orphan_patterns=p.get('orphan_patterns') if orphans else None,
        min_age=p.get('min_age', classification.DEFAULT_MIN_AGE),
        backend_patterns=p.get('backend_patterns'),
        client_uids=client_uids,
        wedged_after=p.get('wedged_after'),
        extra_families=p.get('extra_families'),
    )


# -- the checks the argument spec cannot express ----------------------------------------------------------------


def check_params(p: dict, unaddressable: Unaddressable) -> list[str]:
    """ParameterError for parameters the run cannot act on; returns the warnings about them (broad patterns).

    Checked before anything is read or sent. The argument spec checks types, choices and the required byte_size;
    this is everything it cannot say.
    """
    names = p.get('name') or []
    if any(not n for n in names):
        raise ParameterError('region names must not be empty')
    if p['state'] == 'present':
        _check_present(p, names, unaddressable)
    else:
        _check_absent(p)
    files = KINDS[p['kind']].files  # inventory, threshold_percent, orphans and pools are about the shm directory
    if p.get('inventory') and (p['state'] != 'absent' or not files):
        raise ParameterError('inventory applies to state=absent with kind=system only')
    threshold = p.get('threshold_percent') or 0
    if not 0 <= threshold <= 100:
        raise ParameterError(f'threshold_percent must be between 0 and 100, got {threshold}')
    if threshold and (p['state'] != 'absent' or not files):
        raise ParameterError(
            'threshold_percent applies to state=absent with kind=system only (it gates the removal of orphan files)'
        )
    if p.get('in_use_timeout', IN_USE_TIMEOUT) < 0:
        raise ParameterError('in_use_timeout must be 0 or more seconds')
    check_families(p)
    return classification.broad_pattern_warnings(p.get('orphan_patterns')) if p.get('orphan_files') else []


def check_families(p: dict) -> None:
    """ParameterError when p['families'] names a family neither families.FAMILIES nor p['extra_families'] has."""
    known = {f.name for f in families_mod.table(p.get('extra_families'))}
    unknown = sorted(set(p.get('families') or ()) - known)
    if unknown:
        raise ParameterError(
            f'families: {", ".join(unknown)} is no family of docs/shm-families.md nor of extra_families '
            f'(known: {", ".join(sorted(known))})'
        )


def _check_present(p: dict, names: list, unaddressable: Unaddressable) -> None:
    if not names:
        raise ParameterError('state=present needs name')
    if len(names) > 1:
        raise ParameterError(
            f'state=present registers one region per task, got {len(names)} names (Triton refuses a '
            'second region on a key that is already registered): loop over the names, each with its own key'
        )
    for opt in SELECTORS:
        if p.get(opt):
            raise ParameterError(f'{opt} applies to state=absent only')
    kind = KINDS[p['kind']]
    missing = [o for o in kind.registration if p.get(o) is None]
    if missing and missing != ['byte_size']:  # byte_size alone: the argument spec says it (required_if)
        raise ParameterError(f'state=present with kind={p["kind"]} needs {", ".join(missing)}')
    for name in names:
        why = unaddressable(name)  # over HTTP: names a URL path cannot carry
        if why:
            raise ParameterError(why)
    key_name = _check_key(p['key'], p.get('backend_patterns')) if kind.files else None
    size = p.get('byte_size')
    if size is None or size <= 0:
        raise ParameterError(f'byte_size must be a positive number of bytes, got {size}')
    if kind.files:  # a region in a file: at an offset of it, and never in a Python-based backend's file
        if p.get('offset', 0) < 0:
            raise ParameterError(f'offset must be 0 or more, got {p["offset"]}')
        if matches(key_name, p.get('backend_patterns')):
            raise ParameterError(
                f"key '/{key_name}' names a python backend file (it matches backend_patterns "
                f'{", ".join(p["backend_patterns"])}): registering it as a client region would hand '
                "Triton's own memory to clients; choose another key"
            )


def _check_key(key: object, backend_patterns: Sequence[str] | None) -> str:
    """The backing file name of key; refuses the keys newer servers refuse and those of Python-based backends' files.

    As Triton 2.61 does, leading slashes are stripped before the prefix check: ``//triton_python_…``
    is the reserved prefix too, and a key of slashes only is invalid.
    """
    if isinstance(key, str):
        stripped = key.lstrip('/')
        if key and not stripped:
            raise ParameterError(
                f"key '{key}' is only slashes, and a key is '/' followed by exactly one path component "
                f"(Triton 2.61 and later refuse it: '... - invalid shm key '{key}''): choose a key like "
                "'/my_region'"
            )
        if stripped.startswith(facts.BACKEND_PREFIX):
            raise ParameterError(
                f"key '{key}' starts with '{facts.BACKEND_PREFIX}', the prefix Triton reserves "
                'for its python backend (Triton 2.60 and later refuse it as a reserved prefix, 2.61 '
                'and later also after leading slashes): choose another key'
            )
        owner = facts.backend_of(stripped)
        if owner is not None:
            raise ParameterError(
                f"key '{key}' has the form {facts.BACKEND_FILE_PATTERN} of a Python-based backend's "
                f"files (here the {owner} backend's): registering it as a client region would hand "
                "Triton's own memory to clients; choose another key"
            )
    try:
        return facts.key_to_name(key)
    except ShmFsError as exc:
        raise ParameterError(exc.msg) from exc


def _check_absent(p: dict) -> None:
    if not (p.get('name') or any(p.get(opt) for opt in SELECTORS)):
        raise ParameterError(
            'state=absent needs a selector: name, stale=true, reserved=true, all=true, orphan_files=true or '
            'backend_leftovers=true'
        )
    if p.get('orphan_files') and not p.get('orphan_patterns'):
        raise ParameterError('orphan_files=true needs orphan_patterns (no file is an orphan without a pattern)')
    if p.get('min_age', 0) < 0:
        raise ParameterError('min_age must be 0 or more seconds')
    if not KINDS[p['kind']].files:
        with_files = ', '.join(f'kind={k.name}' for k in KINDS.values() if k.files)
        for opt in ('orphan_files', 'backend_leftovers'):
            if p.get(opt):
                raise ParameterError(f'{opt} applies to {with_files} only ({p["kind"].upper()} regions have no files)')


# -- state=present ----------------------------------------------------------------------------------------------


def plan_present(snap: Snapshot, p: dict) -> Plan:
    """Register the one name of p with key, offset and byte_size; create the backing file when asked and missing."""
    key_name = facts.key_to_name(p['key'])
    need = p['offset'] + p['byte_size']
    current = {r['name']: r for r in snap.of(SYSTEM.name)}
    wanted = {'key': p['key'], 'offset': p['offset'], 'byte_size': p['byte_size']}
    before = {'regions': [spec(current[n]) for n in p['name'] if n in current]}
    todo = _todo(p['name'], current, wanted)
    warnings = []
    create = False
    if snap.shm_dir is None:
        if p['create_file']:
            raise ServerNotFound(
                "create_file needs the server's shm directory, which was not found: set server_pid or shm_dir"
            )
    elif todo:
        create = _backing_file_missing(snap, key_name, need, p['create_file'])
        if create and snap.fs:
            warnings.extend(_fits(snap, key_name, need))
    after = {'regions': [dict(name=n, **wanted) for n in p['name']]}
    return Plan(
        kind=SYSTEM.name,
        current=snap.of(SYSTEM.name),
        before=before,
        after=after,
        register=todo,
        create=key_name if create else None,
        need=need,
        warnings=warnings,
        marks=[] if todo else _unmarked(snap, key_name, p['name']),
    )


def plan_present_memory(snap: Snapshot, p: dict) -> Plan:
    """Register the one name of p with the kind's register values, whatever is listed under that name (a kind whose
    regions have no file: CUDA's).

    Triton's status shows a CUDA region's device_id and byte_size, never its IPC handle: a region listed under the
    name with the same device_id and byte_size may hold another handle (a dead client's registration). The status
    cannot prove that the handle is the one given, so the given raw_handle is always registered: a region listed
    under the name is unregistered first. Every run is a change.
    """
    kind = KINDS[p['kind']]
    current = {r['name']: r for r in snap.of(kind.name)}
    wanted = {f: p[f] for f in kind.names() if f != 'name' and f in p}
    return Plan(
        kind=kind.name,
        current=snap.of(kind.name),
        before={'regions': [kind.spec(current[n]) for n in p['name'] if n in current]},
        after={'regions': [dict(name=n, **wanted) for n in p['name']]},
        register=[Register(n, current.get(n)) for n in p['name']],
    )


def _todo(names: Iterable[str], current: dict, wanted: dict) -> list:
    """The asked names not registered as wanted, each with its current registration (None when not registered)."""
    return [Register(n, current.get(n)) for n in names if not (n in current and same(current[n], wanted))]


def _unmarked(snap: Snapshot, key_name: str, names: Iterable[str]) -> list:
    """[(path, region)]: a region already registered as asked whose backing file does not carry its mark yet."""
    if snap.shm_dir is None:
        return []
    entry = snap.entry(key_name)
    if entry is None or entry['type'] != 'file':
        return []
    return [(entry['path'], n) for n in names if snap.marks.get(key_name) != n]


def _backing_file_missing(snap: Snapshot, key_name: str, need: int, create_file: bool) -> bool:
    """Validate the backing file, as the read listed it; True when it has to be created."""
    entry = snap.entry(key_name)
    path = os.path.join(snap.shm_dir, key_name)
    if entry is None:
        if not create_file:
            raise ShmFsError(f'backing file {path} does not exist: create it (a client does) or set create_file: true')
        return True
    if entry['type'] != 'file':
        raise ShmFsError(f'backing path {path} is a {entry["type"]}, not a regular file: refusing to register it')
    if entry['size'] < need:
        raise ShmFsError(
            f'offset + byte_size ({need}) is past the end of {path} ({entry["size"]} bytes); '
            'the file is never truncated or grown'
        )
    return False


def _fits(snap: Snapshot, key_name: str, need: int) -> list[str]:
    """A file to create must fit in the shm filesystem: a sparse file larger than it makes every writer die of SIGBUS."""
    path = os.path.join(snap.shm_dir, key_name)
    if need > snap.fs['total_bytes']:
        raise ShmFsError(
            f'offset + byte_size ({need}) is larger than the whole shm filesystem of {snap.shm_dir} '
            f'({snap.fs["total_bytes"]} bytes): refusing to create {path}, its memory could never be allocated'
        )
    if need > snap.fs['free_bytes']:
        return [
            f'{path} is created with {need} bytes but only {snap.fs["free_bytes"]} bytes of the shm filesystem '
            'are free: writing it may fail (SIGBUS)'
        ]
    return []


# -- state=absent -----------------------------------------------------------------------------------------------


class Notes:
    """The reasons to keep and the warnings, gathered in the order the plan meets them."""

    def __init__(self) -> None:
        self.skipped: list = []
        self.warnings: list = []


def plan_absent(
    snap: Snapshot, records: Records, p: dict, owners: classification.Criteria, unaddressable: Unaddressable
) -> Plan:
    """Unregister the selected system regions, then remove their unheld files and (with orphan_files, backend_leftovers)
    orphan and leftover files. records: classify(snap) with the parameters' criteria; owners: whose files may go."""
    regions, files = records.of(SYSTEM.name), records.files
    require_server(snap, p)
    notes = Notes()
    selected = _select((rec for rec in regions if _wanted(p, rec)), p, unaddressable, notes)
    selected_names = {r['name'] for r in selected}
    remaining = [r for r in regions if r['name'] not in selected_names]
    threshold = Threshold.of(p.get('threshold_percent') or 0, snap.fs)
    file_plan = plan_files(snap, p, owners, selected, remaining, files, notes, threshold)
    if selected or file_plan:
        notes.warnings.extend(_unsafe_unregister(snap, selected))
    return Plan(
        kind=SYSTEM.name,
        current=snap.of(SYSTEM.name),
        before={'regions': [spec(r) for r in regions], 'files': [e['path'] for e, _n in file_plan]},
        after={'regions': [spec(r) for r in remaining], 'files': []},
        selected=selected,
        files=file_plan,
        skipped=notes.skipped,
        warnings=notes.warnings,
        threshold=threshold,
    )


def plan_absent_memory(
    snap: Snapshot,
    records: Records,
    p: dict,
    crit: classification.Criteria,
    unaddressable: Unaddressable,
) -> Plan:
    """The regions of a kind without files that state=absent selects: by name, all, or (stale) those its state rule
    calls stale (records: classified; for CUDA, classification.gpu_state: a region is stale only when no process but
    the server has a CUDA context on its GPU, by NVML and by /proc).
    """
    kind = KINDS[p['kind']]
    current = snap.of(kind.name)
    notes = Notes()
    names = set(p['name'] or ())
    regions = records.of(kind.name)
    selected = _select((rec for rec in regions if _wanted(p, rec)), p, unaddressable, notes)
    if p['stale'] and not p['all']:
        left = [r for r in regions if not r['reclaimable'] and r['name'] not in names]
        if left:
            notes.warnings.append(
                f'stale=true leaves {len(left)} {kind.name.upper()} region(s) that are not stale: {left[0]["name"]} '
                f'is {left[0]["state"]} ({left[0]["state_reason"]})'
            )
    sel = {r['name'] for r in selected}
    return Plan(
        kind=kind.name,
        current=current,
        before={'regions': [kind.spec(r) for r in current], 'files': []},
        after={'regions': [kind.spec(r) for r in current if r['name'] not in sel], 'files': []},
        selected=selected,
        skipped=notes.skipped,
        warnings=notes.warnings,
    )


def _wanted(p: dict, rec: dict) -> bool:
    """Whether the parameters ask for this system region (before exclusion)."""
    return bool(
        p['all']
        or rec['name'] in (p['name'] or ())
        or (p['stale'] and rec['reclaimable'])
        or (p.get('reserved') and rec['state'] == vocabulary.RESERVED)
        or (p.get('suspect') and rec['state'] == vocabulary.SUSPECT)
    )


def _select(candidates: Iterable[dict], p: dict, unaddressable: Unaddressable, notes: Notes) -> list:
    """The candidate regions to unregister, minus the excluded and the unaddressable ones (skipped with the reason).

    A name the client cannot address stays registered and its file is kept: decided here, so that check mode
    reports exactly what a real run does.
    """
    selected = []
    for rec in candidates:
        if matches(rec['name'], p.get('exclude')):
            notes.skipped.append({'name': rec['name'], 'reason': 'excluded by pattern'})
            continue
        why = unaddressable(rec['name'])
        if why is None:
            selected.append(rec)
            continue
        notes.skipped.append({'name': rec['name'], 'reason': why})
        f = rec.get('file')
        if p.get('remove_file') and f and f.get('exists'):
            notes.skipped.append({'path': f['path'], 'reason': f"region '{rec['name']}' stays registered"})
    return selected


def require_server(snap: Snapshot, p: dict) -> None:
    """Stale and orphan cleanup on a host whose server was not found would be a silent no-op: refuse it."""
    wants = [
        w
        for w, needs in (
            ('stale', snap.pid is None),
            ('orphan_files', snap.shm_dir is None),
            ('backend_leftovers', snap.shm_dir is None),
            ('families', snap.shm_dir is None),
        )
        if p.get(w) and needs
    ]
    if wants:
        missing = 'the process was not found' if snap.pid is None else 'the directory is not known'
        raise ServerNotFound(
            f'{" and ".join(wants)} cleanup needs the tritonserver process behind {snap.url} and its shm '
            f'directory, and {missing}: {snap.server_reason or snap.dir_error or "see the warnings"}'
        )


def plan_files(
    snap: Snapshot,
    p: dict,
    owners: classification.Criteria,
    selected: list,
    remaining: list,
    files: list,
    notes: Notes | None = None,
    threshold: Threshold | None = None,
) -> list:
    """[FileAction]: the files to remove, each file kept recorded with its reason in notes.

    threshold: orphan files (orphan_files) are removed only when its gate is open; the backing files of the selected
    regions, the files a killed cleanup left and leftover backend pools whatever the use.
    """
    notes = notes or Notes()
    kept_paths = {r['file']['path'] for r in remaining if r.get('file') and r['file'].get('exists')}
    entries = {e['path']: e for e in snap.entries}
    file_plan = []
    planned = set()
    for rec in selected:
        f = rec.get('file')
        if not p['remove_file'] or not f or not f.get('exists'):
            continue
        path = f['path']
        reason = _keep_file_reason(snap, owners, rec, f, kept_paths, notes)
        if reason is not None:
            notes.skipped.append({'path': path, 'reason': reason})
        elif path not in planned:
            planned.add(path)
            file_plan.append(FileAction(entries[path], rec['name']))
    if p['orphan_files']:
        orphans = [f for f in files if f['category'] == 'orphan']
        if threshold is None or threshold.over:
            file_plan.extend(FileAction(entries[f['path']], None) for f in orphans)
        else:
            notes.skipped.extend({'path': f['path'], 'reason': threshold.keep_reason()} for f in orphans)
    elif p['stale'] or p['all']:
        # what a stale cleanup of this server marked, unregistered and could not remove (it was killed), and what a
        # cleanup left under its quarantine name (killed, or unable to record it): finish it
        file_plan.extend(
            FileAction(entries[f['path']], None)
            for f in files
            if f['category'] == 'orphan'
            and (snap.leftover(f['name']) is not None or facts.own_quarantine(f['name'], f['inode']))
        )
    if p.get('backend_leftovers'):
        file_plan.extend(FileAction(entries[f['path']], None) for f in files if f['category'] == vocabulary.LEFTOVER)
    for f in family_files(snap, p, owners, files, notes):
        file_plan.append(FileAction(entries[f['path']], None))
    return file_plan


def family_files(snap: Snapshot, p: dict, owners: classification.Criteria, files: list, notes: Notes) -> list:
    """The files of the families asked for (p['families'], opt-in; docs/shm-families.md) that may go: regular files
    no process holds (a complete scan), older than min_age, whose owner the authority rule accepts; each other one of
    those families is kept, with its reason in notes."""
    wanted = set(p.get('families') or ())
    if not wanted:
        return []
    out = []
    for f in files:
        family = families_mod.family_of(f['name'], owners.families)
        if family is None or family.name not in wanted or f['category'] not in (vocabulary.FOREIGN, vocabulary.IN_USE):
            continue
        why = None
        if f.get('type') != 'file':
            why = f'not a regular file ({f.get("type")})'
        elif f['holders']:
            why = f'{family.name}: held by {holders_text(f["holders"])}'
        elif not snap.holders_complete:
            why = f'{family.name}: holders could not be fully determined'
        elif f['age_s'] < owners.min_age:
            why = f'{family.name}: younger than min_age ({f["age_s"]}s < {owners.min_age}s)'
        else:
            entry = snap.entry(f['name'])
            why = (
                'not listed in the shm directory'
                if entry is None
                else classification.removal_refusal(snap, owners, entry)
            )
        if why is None:
            out.append(f)
        else:
            notes.skipped.append({'path': f['path'], 'reason': why})
    return out


def _keep_file_reason(
    snap: Snapshot, owners: classification.Criteria, rec: dict, f: dict, kept_paths: set, notes: Notes
) -> str | None:
    """Why the backing file of a selected region must stay, or None."""
    path = f['path']
    if rec['state'] == vocabulary.SUSPECT:
        return (
            "Triton's own backend file (the region was suspect): kept, backend_leftovers takes it once nobody holds it"
        )
    if path in kept_paths:
        return 'also backs a region that stays registered'
    if f.get('type') != 'file':
        return f'not a regular file ({f.get("type")}): never removed'
    if rec['holders']:
        notes.warnings.append(
            f"region '{rec['name']}' is unregistered as asked, but its file {path} is held by "
            f'{holders_text(rec["holders"])} and is kept'
        )
        return 'held by ' + holders_text(rec['holders'])
    if not snap.holders_complete:
        return 'holders could not be fully determined'
    entry = snap.entry(os.path.basename(path))
    if entry is None:
        return 'not listed in the shm directory'
    return classification.removal_refusal(snap, owners, entry)


def _unsafe_unregister(snap: Snapshot, selected: list) -> list[str]:
    """Before Triton 2.50, unregistering a region a live client uses could crash the server (#3207)."""
    version = version_tuple(snap.metadata.get('version'))
    if version is None or version >= SAFE_UNREGISTER_VERSION:
        return []
    held = sorted(r['name'] for r in selected if r['holders'])
    if not held:
        return []
    return [
        f'Triton {snap.metadata.get("version")} is older than 2.50: unregistering a region while a live '
        'client runs requests through it can crash the server (triton-inference-server/server#3207); '
        f'region(s) {", ".join(held)} are held by live clients'
    ]
