# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read one server's shared memory into a snapshot, and classify the snapshot.

Private to the tritonops.shm collection: no stability promise to other code.

Two halves, kept apart:

- ``read_server()`` is the one read (I/O): the server's metadata and region lists, where its
  process and shm directory are, the directory's usage and entries, the holders of every file
  and the reserved marks of the files that back regions. It returns a plain ``Snapshot``.
- ``classify()`` and the functions under it are pure: given a snapshot (a literal one in the unit
  tests) and the caller's ``Criteria``, they decide. This is the one place where a region is
  called healthy, stale, reserved, dangling or unknown (``region_state``), and a file registered,
  backend, leftover, in_use, orphan or foreign (``file_category``); see docs/concepts.md.
  ``pool_records()`` turns the backend files into the per-model pools (``backend_pools``).

A region is the operator's (``reserved`` while no client maps it) when its backing file carries
the mark triton_shm_region sets when it registers a region (shm_fs.RESERVED_XATTR) and the mark
names that region.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils import authority as authority_mod
from ansible_collections.tritonops.shm.plugins.module_utils import containers, discovery, rootfs, shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils import holders as holders_mod
from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    PathRefused,
    ShmFsError,
    ShmUnsupported,
    TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.patterns import matches
from ansible_collections.tritonops.shm.plugins.module_utils.procfs import lineage, read_cmdline, start_time, uids
from ansible_collections.tritonops.shm.plugins.module_utils.vocabulary import (
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
    UNKNOWN,
)

REGION_KEYS = ('name', 'key', 'offset', 'byte_size')
DEFAULT_MIN_AGE = 300

# the state vocabulary (region states, file categories, pool states) and its one order: vocabulary.py

# The python backend stub's command line (Triton 2.4x-2.6x, python_backend's stub_launcher.cc):
#   triton_python_backend_stub MODEL_PATH SHM_REGION_NAME SHM_DEFAULT_SIZE SHM_GROWTH_SIZE PARENT_PID
#                              PYTHON_LIB_PATH IPC_CONTROL_HANDLE INSTANCE_NAME RUNTIME_MODELDIR
STUB_NAME = 'triton_python_backend_stub'
DEFAULT_BACKEND_DIR = '/opt/tritonserver/backends'  # tritonserver's --backend-directory when not given
_STUB_ARGS = 9
_INSTANCE_SUFFIX = re.compile(r'_\d+_\d+$')


# -- the snapshot: what one read of the server saw ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything read about one server's shared memory at one moment. Plain data: no I/O.

    shm_dir is the directory that was read (None when unknown or unreadable: dir_error says why);
    entries are shm_fs.list_entries() records; scan is the holders.HolderScan of their regular
    files (None without a directory); marks maps the names of regular files that back a system
    region to their reserved mark (None when they have none); cleanup_marks maps the names of regular files that
    back no region to their entry in the cleanup record (shm_fs.CLEANUP_XATTR) a stale cleanup wrote before it
    unregistered their regions; server_id is the server process as that record names it (pid:start time).
    visibility is the visibility rule's answer (holders.visibility()) for the proc that was read: an incomplete
    one makes the scan incomplete too.
    """

    url: str
    metadata: dict
    system: list
    cuda: list
    location: discovery.Location
    shm_dir: str | None = None
    pinned: shm_fs.PinnedDir | None = dataclasses.field(default=None, compare=False, repr=False)
    fs: dict | None = None
    entries: list = dataclasses.field(default_factory=list)
    scan: holders_mod.HolderScan | None = None
    marks: dict = dataclasses.field(default_factory=dict)
    warnings: list = dataclasses.field(default_factory=list)
    dir_error: str | None = None
    scanned_at: float = 0.0
    shm_unsupported: str | None = (
        None  # why the server offers no shared memory (its status refused: errors.ShmUnsupported)
    )
    cleanup_marks: dict = dataclasses.field(default_factory=dict)
    server_id: str | None = None
    authority: authority_mod.Authority | None = (
        None  # what the server's own user may remove there (None: not read, nothing may)
    )
    pool_holders: dict = dataclasses.field(default_factory=dict)  # {pid: PoolHolder} of the holders of backend files
    server_facts: ServerFacts | None = None  # what attributes a pool to the server's own stub (read with pool_holders)
    visibility: holders_mod.Visibility = holders_mod.NOT_JUDGED
    container: dict | None = None  # the server's container or pod (containers.Identity.as_dict), None on the host
    _by_name: dict = dataclasses.field(init=False, repr=False, compare=False)
    _listed: set = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, '_by_name', {e['name']: e for e in self.entries})
        object.__setattr__(self, '_listed', {(e['dev'], e['inode']) for e in self.entries if e['type'] == 'file'})

    @property
    def pid(self) -> int | None:
        return self.location.pid

    @property
    def shm(self) -> shm_fs.PinnedDir | None:
        """The shm directory as read (its descriptor: every operation on it goes through this, never shm_dir).

        A snapshot built by hand with a shm_dir only (unit tests) opens it on first use, with shm_fs.pin's rules.
        """
        if self.pinned is None and self.shm_dir is not None:
            object.__setattr__(self, 'pinned', shm_fs.pin(self.shm_dir, self.location.shm_root))
        return self.pinned

    @property
    def located_by(self) -> str | None:
        return self.location.located_by

    @property
    def server_reason(self) -> str | None:
        return self.location.reason

    @property
    def deleted(self) -> dict:
        """{name: (dev, ino)} of files the server still maps although they were unlinked."""
        return self.scan.deleted if (self.scan is not None and self.pid is not None) else {}

    @property
    def holders_complete(self) -> bool:
        return bool(self.scan is not None and self.scan.complete)

    def unlinked(self, name: str) -> list:
        """[(dev, ino)] of the unlinked files named name that the server still maps, matched by (dev, ino).

        Its maps print an unlinked file as "NAME (deleted)", and a file literally named "NAME (deleted)" the same way:
        a file still listed in the directory (same device and inode) is not unlinked, whatever its maps line says.
        """
        if self.scan is None or self.pid is None:
            return []
        found = self.scan.deleted_all.get(name)
        if found is None:
            found = [self.scan.deleted[name]] if name in self.scan.deleted else []
        return [k for k in found if k not in self._listed]

    @property
    def pid_namespace(self) -> str:
        """holders.INITIAL or holders.OTHER: the PID namespace the module read /proc from."""
        return self.visibility.pid_namespace

    @property
    def holders_incomplete_reason(self) -> str | None:
        """Why the holders are not fully known (None when they are): the scan's reasons, or why there was no scan."""
        if self.holders_complete:
            return None
        if self.scan is not None:
            return self.scan.incomplete_reason() or 'holders could not be fully determined'
        why = self.dir_error or (
            'the shm directory of the server is not known'
            + (f': {self.server_reason}' if self.pid is None and self.server_reason else '')
        )
        if not self.visibility.complete and self.visibility.reason not in why:
            return f'{why}; {self.visibility.reason}'
        return why

    def entry(self, name: str) -> dict | None:
        return self._by_name.get(name)

    def leftover(self, name: str) -> shm_fs.CleanupMark | None:
        """The cleanup mark of an unregistered file that a stale cleanup of this very server process left, or None."""
        mark = self.cleanup_marks.get(name)
        return mark if (mark is not None and self.server_id is not None and mark.server == self.server_id) else None

    def client_holders(self, dev: int, ino: int) -> list[dict]:
        """Holders of (dev, ino) other than the server process."""
        if self.scan is None:
            return []
        return self.scan.holders_of(dev, ino, exclude=(self.pid,) if self.pid is not None else ())

    def without(self, paths: Iterable[str], fs: dict | None = None) -> Snapshot:
        """A new snapshot without the entries at paths (files unlinked since the read), with fs when given."""
        gone = set(paths)
        return dataclasses.replace(
            self, entries=[e for e in self.entries if e['path'] not in gone], fs=self.fs if fs is None else fs
        )


# -- the one read ------------------------------------------------------------------------------------


def read_server(
    client: Any,
    server_pid: int | None = None,
    shm_dir: str | None = None,
    require_readable_dir: bool = False,
    kinds: Sequence[str] = ('system', 'cuda'),
    proc: str = '/proc',
    now: float | None = None,
    report_unsupported: bool = False,
    backend_patterns: Sequence[str] = shm_fs.BACKEND_PATTERNS,
    clients_share_pid_namespace: bool = False,
    on_located: Callable[[shm_fs.PinnedDir | None], object] | None = None,
    shm: shm_fs.PinnedDir | None = None,
) -> Snapshot:
    """Read the server behind client: metadata, location, shm directory, region lists, holders, marks.

    kinds: the region lists to read ('cuda' only when the server offers the extension).
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
    try:
        system = client.status('system') if 'system' in kinds else []
        cuda = client.status('cuda') if ('cuda' in kinds and 'cuda_shared_memory' in extensions) else []
    except ShmUnsupported as exc:
        if not report_unsupported:
            raise
        system, cuda, unsupported = [], [], exc.msg
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
    server_facts = None
    if readable_dir is not None:
        scan, warning = read_holders(entries, location.pid, proc, visible)
        if warning:
            warnings.append(warning)
        pool_holders = read_pool_holders(scan, entries, backend_patterns, location.pid, proc)
        server_facts = read_server_facts(location.pid, proc) if pool_holders else None
    elif not visible.complete:
        warnings.append(f'holders are incomplete, no region is reported stale and no file orphan: {visible.reason}')
    marks = read_marks(pinned, system, entries) if pinned is not None else {}
    cleanup_marks = read_cleanup_marks(pinned, system, entries) if pinned is not None else {}
    authority = authority_mod.read_authority(location.pid, pinned, proc) if pinned is not None else None
    ident = containers.identity(location.pid, proc) if location.pid is not None else containers.Identity()
    return Snapshot(
        url=client.base,
        metadata=metadata,
        system=system,
        cuda=cuda,
        location=location,
        shm_dir=readable_dir,
        pinned=pinned,
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
        server_id=server_identity(location.pid, proc),
    )


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


class PoolHolder(NamedTuple):
    """What one holder of a backend file is (the evidence that attributes a pool to a model: pool_attribution()).

    argv: its command line (what a stub says it serves: anyone can say anything there); ppid, start: its parent and
    start time (procfs.lineage); uids: its real, effective, saved and filesystem uids; mnt_ns: its mount namespace's
    inode; exe: (st_dev, st_ino) of its program (/proc/PID/exe); own_stub: (st_dev, st_ino) of a custom stub in the
    model's own directory (MODEL/triton_python_backend_stub, as the python backend allows) when its model directory
    lies in one of the server's model repositories, else None.
    """

    pid: int
    argv: list | None = None
    ppid: int | None = None
    start: int | None = None
    uids: tuple | None = None
    mnt_ns: int | None = None
    exe: tuple | None = None
    own_stub: tuple | None = None


class ServerFacts(NamedTuple):
    """The server process as pool attribution checks it: pid, start time, uids, mount namespace, and the (st_dev,
    st_ino) of its python backend stub program (BACKEND_DIR/python/triton_python_backend_stub, resolved in the server's
    root; None when it cannot be read), backend_dir as its command line gives it."""

    pid: int
    start: int | None = None
    uids: tuple | None = None
    mnt_ns: int | None = None
    stub: tuple | None = None
    backend_dir: str = DEFAULT_BACKEND_DIR
    repositories: tuple = ()


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
    scan: holders_mod.HolderScan,
    entries: Iterable[dict],
    backend_patterns: Sequence[str],
    server_pid: int | None,
    proc: str = '/proc',
) -> dict:
    """{pid: PoolHolder} of the processes (the server aside) that hold a backend file: the python stubs, and whoever
    else maps one. Only those few processes are read, nothing when no backend file is held."""
    pids: set = set()
    for e in entries:
        if e['type'] == 'file' and matches(e['name'], backend_patterns):
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
    """{file name: shm_fs.CleanupMark} of the regular files that back no system region and are in the cleanup record.

    A file is the record's when its inode is, under the name recorded or a quarantine name of that inode.
    """
    record = shm_fs.read_cleanup_record(shm_dir.fd)
    if not record:
        return {}
    backing = {_file_name(r.get('key')) for r in system}
    out = {}
    for e in entries:
        mark = record.get(e['inode'])
        if mark is None or e['type'] != 'file' or e['name'] in backing:
            continue
        if e['name'] == mark.name or e['name'].startswith(f'{shm_fs.QUARANTINE_PREFIX}{e["inode"]}.'):
            out[e['name']] = mark
    return out


def read_holders(
    entries: Iterable[dict], server_pid: int | None, proc: str = '/proc', visible: holders_mod.Visibility | None = None
) -> tuple[holders_mod.HolderScan, str | None]:
    """(holders.HolderScan of the regular files among entries, the warning when it is incomplete or None).

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
        name = _file_name(region.get('key'))
        entry = by_name.get(name) if isinstance(name, str) else None
        if entry is not None and entry['type'] == 'file' and name not in marks:
            marks[name] = shm_fs.read_mark(shm_dir.file_at(name))
    return marks


def _file_name(key: Any) -> str | ShmFsError:
    """The backing file name of a region key, or the ShmFsError saying why it cannot be located safely."""
    try:
        return shm_fs.key_to_name(key)
    except ShmFsError as exc:
        return exc


# -- classification (pure) ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Criteria:
    """The caller's side of file classification: orphan patterns and grace age, backend patterns, client users."""

    orphan_patterns: tuple = ()
    min_age: float = DEFAULT_MIN_AGE
    backend_patterns: tuple = shm_fs.BACKEND_PATTERNS
    client_uids: frozenset = frozenset()  # uids whose files a cleanup may remove besides the server's user's

    @classmethod
    def of(
        cls,
        orphan_patterns: Iterable[str] | None = None,
        min_age: float = DEFAULT_MIN_AGE,
        backend_patterns: Iterable[str] | None = None,
        client_users: Iterable[object] | None = None,
    ) -> Criteria:
        """From module options: None patterns are none (orphans) or the default (backend).

        The files of every Python-based backend (shm_fs.BACKEND_FILE_PATTERN) are backend files whatever
        backend_patterns says: the configured patterns add to them, never replace them.
        client_users: names or numeric uids (authority.client_uids; ParameterError for an unknown name).
        """
        backend = tuple(dict.fromkeys(shm_fs.BACKEND_PATTERNS + tuple(backend_patterns or ())))
        return cls(
            orphan_patterns=tuple(orphan_patterns or ()),
            min_age=min_age,
            backend_patterns=backend,
            client_uids=authority_mod.client_uids(client_users),
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
    return snap.authority.refusal(entry['uid'], criteria.client_uids)


class Records(NamedTuple):
    """The classified records of one snapshot, as triton_shm_info returns them."""

    system_regions: list
    cuda_regions: list
    files: list


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
    if f.holders:
        return HEALTHY, 'held by ' + holders_mod.holders_text(f.holders)
    if not f.holders_complete:
        return UNKNOWN, 'holders could not be fully determined'
    if not f.server_known:
        return UNKNOWN, 'the server process is not known, so its own mapping cannot be told apart'
    if f.reserved:
        return RESERVED, (
            f'registered by tritonops.shm (its file carries the mark {shm_fs.RESERVED_XATTR}) and not '
            'mapped by a client yet: desired state, never stale'
        )
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


def region_record(snap: Snapshot, region: dict) -> dict:
    """The record of one system region: the server's fields, its file, holders, mark, state and reclaimable."""
    rec = dict(region)
    file = key_error = path = file_type = None
    holders: list = []
    reserved = False
    ambiguous = None
    if snap.shm_dir is not None:
        name = _file_name(region.get('key'))
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
        )
    )
    rec['reclaimable'] = reclaimable(snap, rec)
    return rec


def reclaimable(snap: Snapshot, rec: dict) -> bool:
    """Whether cleaning dead regions (triton_shm_region stale=true) takes this one.

    Stale regions, and dangling ones whose unlinked file no client maps any more: their
    memory stays allocated until they are unregistered. A dangling region counts only when
    the holders are fully known and the server process, whose mapping of the file is the
    only way to find it after the unlink, is known.
    """
    if rec['state'] == STALE:
        return True
    return rec['state'] == DANGLING and not rec['holders'] and snap.pid is not None and snap.holders_complete


def cuda_record(region: dict) -> dict:
    rec = dict(region)
    rec['state'] = UNKNOWN
    rec['state_reason'] = 'CUDA regions have no backing file; their clients cannot be observed'
    return rec


def file_record(snap: Snapshot, e: dict, regions_by_path: dict, criteria: Criteria) -> dict:
    """The record of one directory entry: its listing, the regions it backs, holders and category."""
    rec = dict(e)
    rec.pop('dev', None)
    rec.pop('ctime_ns', None)
    rec['regions'] = sorted(regions_by_path.get(e['path'], ()))
    all_holders = snap.scan.holders_of(e['dev'], e['inode']) if (snap.scan and e['type'] == 'file') else []
    rec['holders'] = [h for h in all_holders if h['pid'] != snap.pid]
    rec['category'], rec['category_reason'] = file_category(
        e, rec['regions'], all_holders, snap.holders_complete, criteria, leftover=snap.leftover(e['name'])
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
    return shm_fs.backend_of(name) or 'python'


def file_category(
    e: dict,
    regions: Sequence[str],
    all_holders: Sequence[dict],
    holders_complete: bool,
    criteria: Criteria,
    leftover: shm_fs.CleanupMark | None = None,
) -> tuple[str, str]:
    """(category, category_reason) of a directory entry; all_holders include the server process.

    leftover: the cleanup mark (Snapshot.leftover) of a file that a stale cleanup of this server process marked,
    then unregistered its region, and was stopped before removing it: an orphan whatever the patterns say.
    """
    if e['type'] != 'file':
        return FOREIGN, f'not a regular file ({e["type"]})'
    if regions:
        return REGISTERED, f'backs region(s) {", ".join(regions)}'
    if matches(e['name'], criteria.backend_patterns):
        return backend_category(e, all_holders, holders_complete, criteria.min_age)
    if all_holders:
        return IN_USE, 'held by ' + holders_mod.holders_text(all_holders)
    software = shm_fs.other_software(e['name'])
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
            f'left by a stale cleanup of this server {what} (recorded in {shm_fs.CLEANUP_XATTR} on the shm '
            'directory): the next stale cleanup removes it'
        )
    if not matches(e['name'], criteria.orphan_patterns):
        return FOREIGN, 'matches no orphan pattern'
    if e['age_s'] < criteria.min_age:
        return FOREIGN, f'matches an orphan pattern but is younger than min_age ({e["age_s"]}s < {criteria.min_age}s)'
    if not holders_complete:
        return FOREIGN, 'holders could not be fully determined'
    return ORPHAN, 'unregistered, unheld, matches an orphan pattern, older than min_age'


def backend_category(e: dict, all_holders: Sequence[dict], holders_complete: bool, min_age: float) -> tuple[str, str]:
    """(category, category_reason) of a backend file: backend while any process holds it (or may: an incomplete
    scan, or younger than min_age), else leftover: the pool of a dead server and its stubs."""
    owner = shm_fs.backend_of(e['name'])
    what = (
        f"Triton's {owner} backend shared memory (triton_{owner}_backend_shm_region_*, a Python-based backend's file)"
        if owner is not None
        else "Triton's python backend shared memory (matches the backend patterns)"
    )
    if all_holders:
        return BACKEND, f'{what}, held by {holders_mod.holders_text(all_holders)}: never an orphan, never a leftover'
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


def stub_args(argv: Sequence[str] | None) -> dict | None:
    """{model_path, region, instance} from a python backend stub's command line, or None when argv is not one."""
    if not argv or len(argv) < _STUB_ARGS or os.path.basename(argv[0]) != STUB_NAME:
        return None
    return {'model_path': argv[1], 'region': argv[2], 'instance': argv[8]}


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


def classify(snap: Snapshot, criteria: Criteria = Criteria()) -> Records:
    """Every region and file of the snapshot, classified.

    Without the server's status (snap.shm_unsupported) no file can be told unregistered: none is an orphan.
    """
    if snap.shm_unsupported is not None:
        criteria = dataclasses.replace(criteria, orphan_patterns=())
    regions = [region_record(snap, r) for r in snap.system]
    cuda = [cuda_record(r) for r in snap.cuda]
    by_path = _regions_by_path(regions)
    files = [file_record(snap, e, by_path, criteria) for e in snap.entries]
    return Records(regions, cuda, files)


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


def _regions_by_path(region_records: Iterable[dict]) -> dict:
    """{backing file path: [region names]} of regions whose file exists: one pass, not one per file."""
    out: dict = {}
    for r in region_records:
        f = r.get('file')
        if f and f.get('exists'):
            out.setdefault(f['path'], []).append(r['name'])
    return out


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
