# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read one server's shared memory into a snapshot: the one read (all I/O).

Private to the tritonops.shm collection: no stability promise to other code.

``read_server()`` reads the server's metadata and region lists, where its process and shm directory are, the
directory's usage and entries, the holders of every file, the reserved marks of the files that back regions and who
holds the python backend's pools (``read_pool_holders``, ``read_server_facts``). It returns a plain
``facts.Snapshot`` (no descriptor: the shm directory it pinned goes to ``on_located``, and the executor keeps it),
which classification.py judges and results.py turns into what the modules return. Nothing here decides a state.

A region is the operator's (``reserved`` while no client maps it) when its backing file carries the mark
triton_shm_region sets when it registers a region (facts.RESERVED_XATTR) and the mark names that region.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    PathRefused,
    ShmFsError,
    ShmUnsupported,
    TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.host import authority as authority_mod
from ansible_collections.tritonops.shm.plugins.module_utils.host import containers, discovery, rootfs, runlock, shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.host import gpu as gpu_mod
from ansible_collections.tritonops.shm.plugins.module_utils.host import holders as holders_mod
from ansible_collections.tritonops.shm.plugins.module_utils.host import wedged as wedged_mod
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import lineage, read_cmdline, start_time, uids
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import (
    BACKEND_PATTERNS,
    DEFAULT_BACKEND_DIR,
    POOL_TAIL,
    QUARANTINE_PREFIX,
    STUB_NAME,
    HolderScan,
    PoolHolder,
    PoolNames,
    ServerFacts,
    Snapshot,
    Visibility,
    backing_name,
    stub_args,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules.patterns import matches

# the state vocabulary (region states, file categories, pool states) and its one order: vocabulary.py

# -- the one read ------------------------------------------------------------------------------------


def read_server(
    client: Any,
    server_pid: int | None = None,
    shm_dir: str | None = None,
    require_readable_dir: bool = False,
    kinds: Sequence[str] | None = None,
    proc: str = '/proc',
    now: float | None = None,
    report_unsupported: bool = False,
    backend_patterns: Sequence[str] = BACKEND_PATTERNS,
    clients_share_pid_namespace: bool = False,
    on_located: Callable[[shm_fs.PinnedDir | None], object] | None = None,
    shm: shm_fs.PinnedDir | None = None,
    read_nvml: Callable[[], Any] | None = None,
    lock_dir: str | None = None,
) -> Snapshot:
    """Read the server behind client: metadata, location, shm directory, region lists, holders, marks.

    lock_dir: where the run locks, and beside them the record of wedged regions, are (runlock.lock_dir() when None).

    kinds: the kinds whose region lists are read (None: every kind of records.KINDS; each only when the server offers
    its extension).
    server_pid / shm_dir: as the modules' options (discovery from the URL when both are None).
    require_readable_dir: an unreadable shm directory raises ShmFsError instead of a warning.
    Raises TritonError when the server cannot be read, or does not offer system shared memory.
    report_unsupported: a server that answers its status with ShmUnsupported (Triton 2.73+ through the
    tritonfrontend bindings) gives a snapshot without regions whose shm_unsupported says why, instead
    of the error (what triton_shm_info reports; what would act raises it).
    backend_patterns: the backend files (Criteria.backend_patterns) whose holders' command lines are read, to
    name the model and instance each pool belongs to.
    clients_share_pid_namespace: the operator states that every client runs in the module's PID namespace (the
    visibility rule, holders.visibility(): without it, a module outside the host's initial PID namespace calls
    nothing stale).
    on_located: called with the shm directory (shm_fs.PinnedDir; None when not located or refused) once the server
    is located and before its regions are read: a run takes its per-server lock then, so that everything it plans
    from is read under it.
    shm: the shm directory a read of this same server opened before (read again: the same directory, not opened anew).
    read_nvml: what reads NVML for the CUDA regions' evidence (gpu.py; nvml.read when None).
    """
    metadata = client.server_metadata()
    extensions = metadata.get('extensions') or []
    if 'system_shared_memory' not in extensions:
        raise TritonError(
            f'server at {client.base} (Triton {metadata.get("version")}) does not offer the '
            f'system_shared_memory extension (its extensions: {", ".join(extensions) or "none"}): it has '
            'no shared-memory API, so there are no regions to read or clean through it; check that the '
            f'URL reaches tritonserver itself (GET {client.base}/v2 lists the extensions), not a proxy or '
            'another inference server',
            url=client.base + '/v2',
        )
    location = discovery.locate_server(client.host, client.port, client.base, server_pid, shm_dir, proc)
    visible = holders_mod.visibility(proc, clients_share_pid_namespace)
    if location.pid is None and location.reason and not visible.complete:
        # a pod's sidecar, a container: the server may simply be invisible from here
        reason = f'{location.reason}; {visible.reason}'
        location = location._replace(
            reason=reason, warnings=[w.replace(location.reason, reason) for w in location.warnings]
        )
    pinned, dir_error, fs = None, None, None
    if location.shm_dir is not None:
        try:
            pinned = shm if shm is not None else shm_fs.pin(location.shm_dir, location.shm_root)
        except (OSError, PathRefused) as exc:
            dir_error = _dir_error(location.shm_dir, exc, shm_dir)
            if require_readable_dir:
                raise ShmFsError(dir_error) from exc
    if on_located is not None:
        on_located(pinned)
    unsupported = None
    wanted = [k for k in records.KINDS.values() if (kinds is None or k.name in kinds) and k.extension in extensions]
    try:
        regions = {k.name: client.status(k.name) for k in wanted}
    except ShmUnsupported as exc:
        if not report_unsupported:
            raise
        regions, unsupported = {}, exc.msg
    regions = {k: regions.get(k, []) for k in records.KINDS}
    in_files = [r for k, kind in records.KINDS.items() if kind.files for r in regions[k]]
    warnings = list(location.warnings)
    if unsupported is not None:
        warnings.append(f'{unsupported} (no region is listed, and no file is called orphan)')
    entries = []
    if pinned is not None:
        try:
            fs = shm_fs.usage(pinned)
            entries = shm_fs.list_entries(pinned, now=now)
        except OSError as exc:
            dir_error = _dir_error(location.shm_dir, exc, shm_dir)
            if require_readable_dir:
                raise ShmFsError(dir_error) from exc
            # fs stays as read when only the listing failed (the statvfs answer is still true)
            pinned, entries = None, []
    if dir_error is not None:
        warnings.append(f'{dir_error}; file and holder data are missing')
    readable_dir = pinned.path if pinned is not None else None
    scan = None
    pool_holders: dict = {}
    server_facts = pool_names = None
    if readable_dir is not None:
        scan, warning = read_holders(entries, location.pid, proc, visible)
        if warning:
            warnings.append(warning)
        pool_names = read_pool_names(location.pid, pinned.dev, proc)
        pool_holders = read_pool_holders(scan, entries, backend_patterns, location.pid, proc, pool_names)
        server_facts = read_server_facts(location.pid, proc) if pool_holders else None
    elif not visible.complete:
        warnings.append(f'holders are incomplete, no region is reported stale and no file orphan: {visible.reason}')
    marks = read_marks(pinned, in_files, entries) if pinned is not None else {}
    cleanup_marks = read_cleanup_marks(pinned, in_files, entries) if pinned is not None else {}
    gpu = None
    on_gpus = any(regions[k] for k, kind in records.KINDS.items() if kind.gpu)
    if on_gpus and location.pid is not None and visible.pid_namespace == 'initial':
        gpu = gpu_mod.read_evidence(location.pid, proc, read_nvml)
    authority = authority_mod.read_authority(location.pid, pinned, proc) if pinned is not None else None
    ident = containers.identity(location.pid, proc) if location.pid is not None else containers.Identity()
    server = server_identity(location.pid, proc)
    return Snapshot(
        url=client.base,
        metadata=metadata,
        regions=regions,
        location=location,
        shm_dir=readable_dir,
        fs=fs,
        entries=entries,
        scan=scan,
        marks=marks,
        warnings=warnings,
        dir_error=dir_error,
        scanned_at=time.time(),
        shm_unsupported=unsupported,
        pool_holders=pool_holders,
        server_facts=server_facts,
        visibility=visible,
        authority=authority,
        container=ident.as_dict() if ident.found else None,
        cleanup_marks=cleanup_marks,
        server_id=server,
        gpu=gpu,
        pool_names=pool_names,
        wedged=read_wedged(pinned, server, lock_dir),
    )


def read_wedged(pinned: shm_fs.PinnedDir | None, server: str | None, lock_dir: str | None) -> dict:
    """The facts.Attempts of the server process server in the shm directory's record, beside its run lock (lock_dir,
    else runlock.lock_dir(), else its fallback)."""
    if pinned is None or server is None:
        return {}
    for directory in (lock_dir,) if lock_dir else (runlock.lock_dir(), runlock.fallback_lock_dir()):
        found = wedged_mod.read(directory, pinned.dev, pinned.ino, server)
        if found:
            return found
    return {}


def _dir_error(path: str, exc: OSError | PathRefused, given: str | None) -> str:
    """Why the shm directory at path cannot be used: refused (a symlink on the way), or not readable, and what to do."""
    if isinstance(exc, PathRefused):
        return (
            f'shm_dir {path} is refused: {exc.msg}; nothing in it is judged or removed (if this server is yours, '
            'mount its /dev/shm as a directory, or give shm_dir)'
        )
    return f'shm_dir {path} is not readable: {exc.strerror or exc} ({_unreadable_hint(exc, given)})'


def _unreadable_hint(exc: OSError, given: str | None) -> str:
    """Why a shm directory could not be read, and what to do: the tail of read_server's dir_error."""
    where = (
        'the shm_dir option names it'
        if given is not None
        else "it is the server's own /dev/shm, seen through /proc/PID/root"
    )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"{where}; this module runs as a user who may not read it, and a containerised server's /dev/shm "
            'is reachable only as root: run the task with become: true'
        )
    if exc.errno == errno.ENOENT:
        return (
            f'{where}, and it does not exist on this host: give the directory the server uses, or leave shm_dir '
            "out to use the server's own"
        )
    return f'{where}: check the path, and run the task as root (become: true)'


_PREFIX_OPTION = 'shm-region-prefix-name='


def pool_prefix(argv: Sequence[str] | None) -> str | None:
    """The python backend's pool prefix that a tritonserver command line sets
    (``--backend-config=python,shm-region-prefix-name=P``, also as two arguments), None when it sets none."""
    args = list(argv or ())
    found = None
    for i, arg in enumerate(args):
        value = arg.split('=', 1)[1] if arg.startswith('--backend-config=') else None
        if arg == '--backend-config' and i + 1 < len(args):
            value = args[i + 1]
        if value and value.startswith('python,' + _PREFIX_OPTION):
            found = value[len('python,' + _PREFIX_OPTION) :] or None
    return found


def read_pool_names(server_pid: int | None, shm_dev: int | None, proc: str = '/proc') -> PoolNames | None:
    """The PoolNames of the servers sharing the located server's /dev/shm filesystem (shm_dev), or None when no live
    server sets a prefix. A prefix is taken from a process only when it runs the located server's very program (its
    executable's device and inode) as its user: any user can name a process tritonserver and write a command line."""
    if server_pid is None or shm_dev is None:
        return None
    own_exe, own_uids = _exe_key(server_pid, proc), uids(server_pid, proc)
    if own_exe is None or own_uids is None:
        return None
    live: dict = {}
    for pid in discovery.server_pids(proc):
        if pid != server_pid and (_exe_key(pid, proc) != own_exe or uids(pid, proc) != own_uids):
            continue
        prefix = pool_prefix(read_cmdline(pid, proc))
        if prefix is None:
            continue
        shm = rootfs.stat_in(f'{proc}/{pid}/root', '/dev/shm')
        if pid == server_pid or (shm is not None and shm.st_dev == shm_dev):
            live.setdefault(prefix, pid)
    if not live:
        return None
    dead = []
    for prefix in live:
        if re.search(r'[0-9]', prefix):
            family = ''.join(r'[0-9]+' if part.isdigit() else re.escape(part) for part in re.split(r'([0-9]+)', prefix))
            dead.append(re.compile(f'({family}){POOL_TAIL}'))
    return PoolNames(live, tuple(dead))


def _key(st: os.stat_result | None) -> tuple | None:
    return None if st is None else (st.st_dev, st.st_ino)


def _ns_inode(pid: int, proc: str, kind: str = 'mnt') -> int | None:
    try:
        return os.stat(f'{proc}/{pid}/ns/{kind}').st_ino
    except OSError:
        return None


def _exe_key(pid: int, proc: str) -> tuple | None:
    try:
        return _key(os.stat(f'{proc}/{pid}/exe'))
    except OSError:
        return None


def server_dirs(argv: Sequence[str] | None) -> tuple[str, tuple]:
    """(backend directory, model repositories) from tritonserver's command line (its defaults when not given)."""
    backend, repos = DEFAULT_BACKEND_DIR, []
    args = list(argv or ())
    for i, arg in enumerate(args):
        for opt in ('--backend-directory', '--model-repository', '--model-store'):
            value = None
            if arg.startswith(opt + '='):
                value = arg.split('=', 1)[1]
            elif arg == opt and i + 1 < len(args):
                value = args[i + 1]
            if value is None:
                continue
            if opt == '--backend-directory':
                backend = value
            else:
                repos.append(value)
    return backend, tuple(repos)


def read_server_facts(pid: int | None, proc: str = '/proc') -> ServerFacts | None:
    """The ServerFacts of the server process (None when it is not known)."""
    if pid is None:
        return None
    backend, repos = server_dirs(read_cmdline(pid, proc))
    found = lineage(pid, proc)
    root = f'{proc}/{pid}/root'
    return ServerFacts(
        pid=pid,
        start=found.start if found else None,
        uids=uids(pid, proc),
        mnt_ns=_ns_inode(pid, proc),
        stub=_key(rootfs.stat_in(root, os.path.join(backend, 'python', STUB_NAME))),
        backend_dir=backend,
        repositories=repos,
    )


def read_pool_holders(
    scan: HolderScan,
    entries: Iterable[dict],
    backend_patterns: Sequence[str],
    server_pid: int | None,
    proc: str = '/proc',
    pool_names: PoolNames | None = None,
) -> dict:
    """{pid: PoolHolder} of the processes (the server aside) that hold a backend file: the python stubs, and whoever
    else maps one. Only those few processes are read, nothing when no backend file is held."""
    pids: set = set()
    for e in entries:
        if e['type'] == 'file' and (
            matches(e['name'], backend_patterns) or (pool_names is not None and pool_names.of(e['name']))
        ):
            pids.update(scan.holders.get((e['dev'], e['inode'])) or ())
    pids.discard(server_pid)
    if not pids:
        return {}
    repos = server_dirs(read_cmdline(server_pid, proc))[1] if server_pid is not None else ()
    out = {}
    for pid in sorted(pids):
        argv = read_cmdline(pid, proc)
        if argv is None:
            continue
        found = lineage(pid, proc)
        own = None
        args = stub_args(argv)
        if args is not None and server_pid is not None:
            model_dir = os.path.dirname(os.path.dirname(args['model_path']))
            if any(_within(model_dir, r) for r in repos):
                own = _key(rootfs.stat_in(f'{proc}/{server_pid}/root', os.path.join(model_dir, STUB_NAME)))
        out[pid] = PoolHolder(
            pid=pid,
            argv=argv,
            ppid=found.ppid if found else None,
            start=found.start if found else None,
            uids=uids(pid, proc),
            mnt_ns=_ns_inode(pid, proc),
            exe=_exe_key(pid, proc),
            own_stub=own,
        )
    return out


def _within(path: str, directory: str) -> bool:
    path, directory = os.path.normpath(path), os.path.normpath(directory)
    return path.startswith(directory.rstrip('/') + '/')


def server_identity(pid: int | None, proc: str = '/proc') -> str | None:
    """The server process as a cleanup mark names it: 'pid:start time' (a restarted server is another one)."""
    if pid is None:
        return None
    started = start_time(pid, proc)
    return None if started is None else f'{pid}:{started}'


def read_cleanup_marks(shm_dir: shm_fs.PinnedDir, system: Iterable[dict], entries: Iterable[dict]) -> dict:
    """{file name: facts.CleanupMark} of the regular files that back no system region and are in the cleanup record.

    A file is the record's when its inode is, under the name recorded or a quarantine name of that inode.
    """
    record = shm_fs.read_cleanup_record(shm_dir.fd)
    if not record:
        return {}
    backing = {backing_name(r.get('key')) for r in system}
    out = {}
    for e in entries:
        mark = record.get(e['inode'])
        if mark is None or e['type'] != 'file' or e['name'] in backing:
            continue
        if e['name'] == mark.name or e['name'].startswith(f'{QUARANTINE_PREFIX}{e["inode"]}.'):
            out[e['name']] = mark
    return out


def read_holders(
    entries: Iterable[dict], server_pid: int | None, proc: str = '/proc', visible: Visibility | None = None
) -> tuple[HolderScan, str | None]:
    """(facts.HolderScan of the regular files among entries, the warning when it is incomplete or None).

    The server's unlinked-but-mapped files come from the same read of its maps as its holdings.
    visible: the visibility rule's answer (holders.visibility()); judged for proc with the option off when None.
    """
    targets = {(e['dev'], e['inode']) for e in entries if e['type'] == 'file'}
    scan = holders_mod.scan(targets, proc=proc, deleted_of=server_pid, visible=visible)
    reason = scan.incomplete_reason()
    warning = f'holders are incomplete, no region is reported stale and no file orphan: {reason}' if reason else None
    return scan, warning


def rescan(snap: Snapshot, proc: str = '/proc') -> Snapshot:
    """The same snapshot with its holders read again (the re-check right before an unlink)."""
    if snap.shm_dir is None:
        return snap
    scan, warning = read_holders(snap.entries, snap.pid, proc, snap.visibility)
    return dataclasses.replace(snap, scan=scan, warnings=snap.warnings + ([warning] if warning else []))


def read_marks(shm_dir: shm_fs.PinnedDir, system: Iterable[dict], entries: Iterable[dict]) -> dict:
    """{file name: reserved mark or None} of the regular files that back a system region (read through the
    directory's descriptor, never by its shown path)."""
    by_name = {e['name']: e for e in entries}
    marks = {}
    for region in system:
        name = backing_name(region.get('key'))
        entry = by_name.get(name) if isinstance(name, str) else None
        if entry is not None and entry['type'] == 'file' and name not in marks:
            marks[name] = shm_fs.read_mark(shm_dir.file_at(name))
    return marks
