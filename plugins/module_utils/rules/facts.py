# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The facts of one read: plain data, no I/O, no descriptors (what the rules judge).

Private to the tritonops.shm collection: no stability promise to other code.

The reading modules fill these (snapshot.py the ``Snapshot``, holders.py the ``HolderScan``, shm_fs.py the entries
and the cleanup record); classification.py, region_plan.py and results.py judge them and import nothing that reads.
Here too: the names of backing files (``key_to_name``, the backend and quarantine names, the marks' attribute
names), the holders of one /proc pass, the pool holders and the server facts that attribute a python backend pool,
and the runs that found a region wedged.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ShmFsError
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records

if TYPE_CHECKING:  # the types of fields that reading modules fill (never imported at run time)
    from ansible_collections.tritonops.shm.plugins.module_utils.host.authority import Authority
    from ansible_collections.tritonops.shm.plugins.module_utils.host.containers import Identity
    from ansible_collections.tritonops.shm.plugins.module_utils.host.discovery import Location
    from ansible_collections.tritonops.shm.plugins.module_utils.host.gpu import Evidence


# -- backing files: their names and marks -------------------------------------------------------------

BACKEND_PREFIX = 'triton_python_backend_shm_region_'
# Every Python-based backend (python, vllm, …: the python backend's stub serves them all) names its
# files triton_<backend>_backend_shm_region_<suffix> (a counter before Triton 24.04, a UUID since);
# --backend-config=python,shm-region-prefix-name=X replaces the whole prefix. Files of this form are
# always backend files, whatever backend_patterns adds (classification.Criteria).
BACKEND_FILE_PATTERN = 'triton_*_backend_shm_region_*'
BACKEND_PATTERNS = (BACKEND_FILE_PATTERN,)
_BACKEND_FILE = re.compile(r'triton_(.+?)_backend_shm_region_')


def backend_of(name: str) -> str | None:
    """The backend a file of the form triton_<backend>_backend_shm_region_* belongs to ('vllm'), else None."""
    found = _BACKEND_FILE.match(name)
    return found.group(1) if found else None


# The mark of a region this collection registered (the 建 step): an extended attribute of the
# backing file, whose value is the region's name. trusted.* needs CAP_SYS_ADMIN to set and to read,
# tmpfs supports it, and it goes with the file: a file removed and created again has no mark.
RESERVED_XATTR = 'trusted.tritonops_shm.reserved'

# The marks of the files a stale cleanup is about to remove (invariant 8): written before their regions are
# unregistered, so that a run killed part-way leaves files a rerun can tell apart from everyone else's. One
# record on the shm directory itself (not an attribute per file: one write for 3,000 files, and no file's
# ctime changes), in chunks CLEANUP_XATTR.0, .1, … of JSON: {"files": [[inode, name, region, server], …]},
# server being the server process (pid:start time) that listed the region: only that same server's later
# runs finish the job. trusted.* needs root to set and to read, and the kernel enforces it.
CLEANUP_XATTR = 'trusted.tritonops_shm.cleanup'


# A file to remove is first renamed to a quarantine name inside the shm directory (one component,
# never an existing name: RENAME_NOREPLACE), its holders are scanned again, then it is unlinked, or
# renamed back when someone attached meanwhile (invariant 13). A client that opens it by name in
# between finds nothing (ENOENT) rather than a file about to go.
QUARANTINE_PREFIX = '.tritonops_shm.quarantine.'


class CleanupMark(NamedTuple):
    """One file of the cleanup record: the region unregistered, the file's own name, the server (pid:start time)."""

    region: str
    name: str
    server: str


def is_quarantine_name(name: str) -> bool:
    return name.startswith(QUARANTINE_PREFIX)


def own_quarantine(name: str, inode: int) -> bool:
    """Whether name is the quarantine name a cleanup gives the file of this very inode (QUARANTINE_PREFIX, the inode,
    a dot and the run's 12 hex digits): such a file is past its region's unregister (or had none), and a run that
    was stopped, or could not record it, left it. Who may remove it is still the authority rule's question: a file
    another user made under such a name is theirs (classification.removal_refusal)."""
    if not name.startswith(QUARANTINE_PREFIX):
        return False
    ino, dot, token = name[len(QUARANTINE_PREFIX) :].partition('.')
    return bool(dot) and ino == str(inode) and len(token) == 12 and all(c in '0123456789abcdef' for c in token)


def key_to_name(key: object) -> str:
    """The file name a system region key refers to, or raise ShmFsError saying why the key is unsafe.

    Triton opens ``shm_open(key)``, i.e. ``/dev/shm`` + key: a valid key is ``/`` followed by
    one path component that is not ``.`` or ``..`` and holds no NUL.
    """
    if not isinstance(key, str) or not key:
        raise ShmFsError('key must be a non-empty string like "/my_region"')
    if '\x00' in key:
        raise ShmFsError(f'key {key!r} contains a NUL byte')
    if not key.startswith('/'):
        raise ShmFsError(f'key {key!r} must start with "/" (Triton opens it with shm_open in the shm directory)')
    name = key[1:]
    if not name or '/' in name:
        raise ShmFsError(f'key {key!r} must be exactly one path component after the leading "/"')
    if name in ('.', '..'):
        raise ShmFsError(f'key {key!r} points outside the shm directory')
    return name


def hard_links_refusal(links: int) -> str:
    """Why a file with other names is never removed: shm_open makes one name per file, so other links are another
    program's (or a user's, who linked a file of root's under a name a cleanup takes: protected_hardlinks lets anyone
    link a file readable and writable by all); removing one name frees nothing and touches that file."""
    return (
        f'has {links} hard links: not removed, a file shm_open made has one name; the others are another '
        "program's, and removing this one would free nothing"
    )


def backing_name(key: Any) -> str | ShmFsError:
    """The backing file name of a region key, or the ShmFsError saying why it cannot be located safely."""
    try:
        return key_to_name(key)
    except ShmFsError as exc:
        return exc


# -- holders: what one /proc pass found ------------------------------------------------------------------

FileKey = tuple[int, int]  # (st_dev, st_ino)


def holders_text(holders: Iterable[Mapping[str, object]]) -> str:
    """Holders as people read them: '4711 (python), 4712 (tritonserver in pod ml/triton-0)'."""
    return ', '.join(f'{h["pid"]} ({h["comm"]}{_in(h)})' for h in holders)


def _in(holder: Mapping[str, object]) -> str:
    container = holder.get('container')
    return f' in {container["name"]}' if isinstance(container, Mapping) else ''


INITIAL = 'initial'
OTHER = 'other'


class Visibility(NamedTuple):
    """Whether a pass over a proc filesystem can see every process that may hold the server's files."""

    pid_namespace: str  # INITIAL (the host's) or OTHER
    complete: bool  # every possible holder is visible (or the operator says so)
    reason: str | None = None  # why not, and what to do; None when complete
    clients_share_pid_namespace: bool = False  # the operator's statement, as given


# what a HolderScan built by hand (unit tests' literal snapshots) assumes: nothing judged, nothing hidden
NOT_JUDGED = Visibility(INITIAL, True)


class HolderScan:
    """Result of one /proc pass."""

    def __init__(self, visibility: Visibility = NOT_JUDGED) -> None:
        self.holders: dict[FileKey, set[int]] = {}
        self.comms: dict[int, str | None] = {}
        self.identities: dict[int, Identity] = {}  # read for the holders found only (one cgroup read each)
        self.unreadable: list[int] = []  # pids that could hold a target and could not be read
        self.unreadable_ignored: list[int] = []  # unreadable pids whose mount namespace cannot see the shm fs
        self.processes = 0
        self.deleted: dict[str, FileKey] = {}  # files the server maps although they were unlinked (scan(deleted_of=))
        self.deleted_all: dict[str, list[FileKey]] = {}  # the same, every file of each name (names can repeat)
        self.deleted_bytes: dict[FileKey, int] = {}  # what each of those files occupies (deleted_sizes), when known
        self.hidden = False  # /proc mounted with hidepid and we are not root
        self.hidden_reason: str | None = None
        self.visibility = visibility  # the visibility rule for the proc that was read

    @property
    def complete(self) -> bool:
        return not self.unreadable and not self.hidden and self.visibility.complete

    def incomplete_reason(self) -> str | None:
        """Every reason the scan is incomplete, joined with '; ' (None when it is complete)."""
        reasons = []
        if self.hidden:
            reasons.append(self.hidden_reason)
        if self.unreadable:
            sample = ', '.join(str(p) for p in sorted(self.unreadable)[:5])
            more = ', ...' if len(self.unreadable) > 5 else ''
            reasons.append(
                f'{len(self.unreadable)} process(es) could not be inspected (pids {sample}{more}): '
                'run the module as root (become: true) so every holder can be seen'
            )
        if not self.visibility.complete:
            reasons.append(self.visibility.reason)
        return '; '.join(r for r in reasons if r) or None

    def holders_of(self, dev: int, ino: int, exclude: Iterable[int] = ()) -> list[dict[str, object]]:
        pids = self.holders.get((dev, ino))
        if not pids:
            return []
        return [self._holder(p) for p in sorted(pids) if p not in exclude]

    def _holder(self, pid: int) -> dict[str, object]:
        """{'pid', 'comm'}, and 'container' (containers.Identity.as_dict) when the host shows the process in one."""
        out: dict[str, object] = {'pid': pid, 'comm': self.comms.get(pid)}
        found = self.identities.get(pid)
        if found is not None and found.found:
            out['container'] = found.as_dict()
        return out


# -- the python backend's pools: who holds them, which server they belong to ----------------------------------------


# The python backend stub's command line (Triton 2.4x-2.6x, python_backend's stub_launcher.cc):
#   triton_python_backend_stub MODEL_PATH SHM_REGION_NAME SHM_DEFAULT_SIZE SHM_GROWTH_SIZE PARENT_PID
#                              PYTHON_LIB_PATH IPC_CONTROL_HANDLE INSTANCE_NAME RUNTIME_MODELDIR
STUB_NAME = 'triton_python_backend_stub'
DEFAULT_BACKEND_DIR = '/opt/tritonserver/backends'  # tritonserver's --backend-directory when not given
_STUB_ARGS = 9


def stub_args(argv: Sequence[str] | None) -> dict | None:
    """{model_path, region, instance} from a python backend stub's command line, or None when argv is not one."""
    if not argv or len(argv) < _STUB_ARGS or os.path.basename(argv[0]) != STUB_NAME:
        return None
    return {'model_path': argv[1], 'region': argv[2], 'instance': argv[8]}


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


# a python backend pool's name after its prefix: a uuid (2.40 and later), or a number (older backends: _1, _2 ...)
POOL_TAIL = r'(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|_?[0-9]+)'


class PoolNames(NamedTuple):
    """The python backend pools named by prefixes read from live servers (issue 42: several ranks share one /dev/shm).

    live: {prefix: the pid of the server that set it}, the located server's own and those of the other tritonservers
    of the same program and user whose /dev/shm is this same filesystem; a file named PREFIX + a pool's tail (a uuid,
    or a number) is that server's pool. dead: the families of the live prefixes with a number in them (``prefix0_`` →
    ``prefix<N>_``): a file of such a family whose prefix no live server uses is a dead rank's pool.
    """

    live: dict
    dead: tuple  # compiled patterns of the families

    def of(self, name: str) -> str | None:
        """Why name is a python backend pool by a read prefix (a live server's, or a dead rank's), or None."""
        for prefix, pid in self.live.items():
            if name.startswith(prefix) and re.fullmatch(POOL_TAIL, name[len(prefix) :]):
                return f"a pool of the python backend prefix '{prefix}' that server process {pid} sets"
        for family in self.dead:
            found = family.fullmatch(name)
            if found and found.group(1) not in self.live:
                return (
                    f"a pool of the python backend prefix '{found.group(1)}', which no live server sets (a dead rank "
                    f'of the family {", ".join(sorted(self.live))})'
                )
        return None


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


# -- wedged regions: the unregisters Triton would not carry out, run after run (wedged.py reads and writes them) --

WEDGED_AFTER = 3


class Attempts(NamedTuple):
    """How many consecutive runs left one region registered, and since when (epoch seconds of the first)."""

    runs: int
    since: float
    spec: tuple  # (key, offset, byte_size) of the region they tried: a new registration of the name starts again


def spec_of(region: Mapping) -> tuple:
    return (region.get('key'), region.get('offset'), region.get('byte_size'))


# -- the snapshot: what one read of the server saw ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything read about one server's shared memory at one moment. Plain data: no I/O, no descriptor (the shm
    directory that was read stays open with whoever reads and acts: snapshot.read_server's on_located).

    shm_dir is the directory that was read (None when unknown or unreadable: dir_error says why);
    entries are shm_fs.list_entries() records; scan is the HolderScan (holders.scan) of their regular
    files (None without a directory); marks maps the names of regular files that back a system
    region to their reserved mark (None when they have none); cleanup_marks maps the names of regular files that
    back no region to their entry in the cleanup record (CLEANUP_XATTR) a stale cleanup wrote before it
    unregistered their regions; server_id is the server process as that record names it (pid:start time).
    visibility is the visibility rule's answer (holders.visibility()) for the proc that was read: an incomplete
    one makes the scan incomplete too.
    """

    url: str
    metadata: dict
    regions: dict  # {kind name: [region]}: each kind's status (records.KINDS; a kind not read: absent or [])
    location: Location
    shm_dir: str | None = None
    fs: dict | None = None
    entries: list = dataclasses.field(default_factory=list)
    scan: HolderScan | None = None
    marks: dict = dataclasses.field(default_factory=dict)
    warnings: list = dataclasses.field(default_factory=list)
    dir_error: str | None = None
    scanned_at: float = 0.0
    shm_unsupported: str | None = (
        None  # why the server offers no shared memory (its status refused: errors.ShmUnsupported)
    )
    cleanup_marks: dict = dataclasses.field(default_factory=dict)
    server_id: str | None = None
    authority: Authority | None = None  # what the server's own user may remove there (None: not read, nothing may)
    pool_holders: dict = dataclasses.field(default_factory=dict)  # {pid: PoolHolder} of the holders of backend files
    server_facts: ServerFacts | None = None  # what attributes a pool to the server's own stub (read with pool_holders)
    visibility: Visibility = NOT_JUDGED
    container: dict | None = None  # the server's container or pod (containers.Identity.as_dict), None on the host
    gpu: Evidence | None = None  # the CUDA regions' holder evidence (read with them; None: not read)
    pool_names: PoolNames | None = None  # the python backend pool prefixes read from the servers' command lines
    wedged: dict = dataclasses.field(default_factory=dict)  # {region name: Attempts} of this server process
    _by_name: dict = dataclasses.field(init=False, repr=False, compare=False)
    _listed: set = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, '_by_name', {e['name']: e for e in self.entries})
        object.__setattr__(self, '_listed', {(e['dev'], e['inode']) for e in self.entries if e['type'] == 'file'})

    def of(self, kind: str) -> list:
        """The regions of kind (a kind name of records.KINDS) the server listed; [] when not read."""
        return self.regions.get(kind, [])

    @property
    def in_files(self) -> list:
        """The regions of the kinds backed by files of the shm directory (records.Kind.files), kinds in their order."""
        return [r for k, kind in records.KINDS.items() if kind.files for r in self.of(k)]

    @property
    def pid(self) -> int | None:
        return self.location.pid

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
        """INITIAL or OTHER: the PID namespace the module read /proc from."""
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

    def leftover(self, name: str) -> CleanupMark | None:
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
