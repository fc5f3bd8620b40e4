"""A model-based safety test (issue 40, goal 7): random sequences of steps on real shm directories, invariants after each.

A ``hypothesis.stateful.RuleBasedStateMachine`` (``Scene``) drives, per example:

- **the server**: a real process standing in for tritonserver (``SERVER``), started by ``unshare --mount --propagation
  private`` in its own mount namespace with its own small tmpfs on /dev/shm (``TMPFS``: 256 KiB, 40 inodes), so that
  "the directory fills up" (blocks and inodes) and "turns read-only" (``mount -o remount,ro`` in that namespace) are
  real; the kernel refuses ro while a file is open for writing (it stays writable then, as on a real host). Per example
  it runs as root or as an unprivileged uid (``SERVER_UID``) after the mount: then authority (invariant 12) decides what
  may go. It maps each file it registers, as Triton does (glibc's shm_open: ``O_NOFOLLOW``), refuses a register it
  cannot map, and unmaps once the region is gone. The test reaches the directory at /proc/PID/root/dev/shm;
- **the API**: tests/fakes' versioned ``Triton`` (2.51: unregister at once, refused while requests are in flight;
  2.53: deferred, listed until they finish) over HTTP on 127.0.0.1 (``HttpFront``), the same for the in-process
  cleanups and the module processes; ``Audited`` checks invariant 2 at each call before it answers;
- **clients**: real processes (``CLIENT``: Python in the server's mount namespace, as the server's uid or root) that
  create, open by name, map, close their fds, unmap, unlink, register and fork (the child keeps what it inherited); the
  compiled tests/rig/leader_exit.c (its main thread exits while a worker maps the file, fd closed or kept); SIGKILLs;
- **other users**: files, symlinks (to a file outside the directory, or to one inside) and fills (blocks, inodes)
  owned by uid 65534; a client registering a region on a planted file; a planted file swapped for a symlink;
- **cleanups**: ``RegionOps`` in-process (stale, or ``state=absent`` by name; under an unprivileged server sometimes
  ``client_users: ['0']``, so that only authority stands between root and root's files); a stale one during which a
  client opens and maps, by name, the file of a region just unregistered (after the holder scan, before the
  quarantine rename: invariant 13); and the module ``triton_shm_region`` as its own process, SIGKILLed part-way at a
  drawn point: at its Nth status or unregister call (before or after the fake acts on it), stopped by strace in its
  Nth quarantine rename (``renameat2``) or unlink (``unlinkat``), or after a drawn delay. No step passes ``all=true``
  (invariant 9: never a default).

After every step (``@invariant``), on the real state, never on the module's word:

1. every inode a live model process maps or has open is still linked in the directory (the model tracks each
   process's fds and maps, inherited on fork); nothing disappeared in a step that was not a cleanup, beyond what the
   step removed itself (a client's own unlink, the test's own fill files);
2. no region still listed (registered, or deferred) lacks the inode the server mapped at its register, checked at
   every API call (so also between an unregister and the status read that drops a deferred region) and after each
   step; every file a cleanup removed backed a region that was unregistered and is no longer listed;
4. the files outside the directory (symlink targets) are unchanged; no symlink in the directory was removed or
   changed; only regular files were removed;
9. a stale cleanup never unregisters a region whose file a live model process held from before the cleanup to its
   end, nor a region this collection reserved (``state=present``, ``create_file``) that no client attached to;
12, 13. no file of uid 65534 is ever removed (no ``client_users`` names it: a registration on it is a client's word);
   every removed file was the server's user's own; a client that attached during a cleanup keeps its file (1).

Decisions: the fake API, not a real Triton (a real one cannot be made to defer, refuse or lose a connection on demand,
and starts in seconds, not milliseconds); one namespace, server and API per example, so nothing leaks between
examples; every process a step starts is tracked by pid and killed at teardown; waits are bounded loops on a condition
(``WAIT``). Hypothesis draws rules with fewer arguments more often, so the commonest events are rules without
arguments: ``leak`` (a client registers a region and is killed) and ``reclaim`` (a stale cleanup). ``PROFILE`` is the
short profile in ``make test`` (``make units``), derandomized so that CI runs the same examples every time; ``make
soak`` sets ``TRITONOPS_MODEL_EXAMPLES`` and ``TRITONOPS_MODEL_STEPS`` (random seeds). Each prints a ``FIGURE
model_safety`` line: examples, steps, seconds, kills, files removed. ``test_the_scene_reclaims_what_is_stale`` is the
positive control (the scene does remove stale files, kills land where drawn), so the invariants are not vacuous. Each
counterexample becomes a named test below, as an explicit sequence (the profiles' draws change with the rules). None
was found in the collection's code; found: one of the model (``test_a_name_reused_after_...``), and, on the code with
a fix taken out, the shrunk sequences ``test_a_region_held_by_a_client_whose_main_thread_exited_stays`` (the holder
scan reading the leader's maps only, before goal 1) and ``test_a_client_attaching_mid_cleanup_keeps_its_file`` (no
re-check before the unlink).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ansible_collections.tritonops.shm.plugins.module_utils.run import region_ops as region_ops_mod
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import RegionOps
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient
from ansible_collections.tritonops.shm.plugins.modules import triton_shm_region
from ansible_collections.tritonops.shm.tests.fakes.fake_triton import Drop, HttpFront, Refusal, Triton

NOBODY = 65534
SERVER_UID = 4242  # an unprivileged server's uid (no name needed: authority works on numbers)
KEYS = ('a', 'b', 'c', 'd')
PLANTED = ('p', 'q')
KIB = 1024
TMPFS = 'size=256k,nr_inodes=40,mode=1777'
WAIT = 20.0  # the bound of every wait on a process
SYSCALLS = {'renameat2': 316, 'unlinkat': 263}  # x86_64 numbers, as /proc/PID/syscall shows them

# _ROOT/ansible_collections/tritonops/shm/plugins/module_utils/run/region_ops.py
COLLECTION = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(region_ops_mod.__file__))))
)
COLLECTIONS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION)))
LEADER_EXIT_SOURCE = os.path.join(COLLECTION, 'tests', 'rig', 'leader_exit.c')

EXAMPLES = int(os.environ.get('TRITONOPS_MODEL_EXAMPLES', '0') or 0)
STEPS = int(os.environ.get('TRITONOPS_MODEL_STEPS', '0') or 0)
PROFILE = settings(
    max_examples=EXAMPLES or 20,
    stateful_step_count=STEPS or 40,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)

# The server: mounts happen before (sh, as root); then it drops to its uid and maps what it registers.
SERVER = r"""
import mmap, os, sys
uid = int(sys.argv[1])
if uid:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
maps = {}
print('READY', flush=True)
for line in sys.stdin:
    cmd, name, key = (line.split() + ['', ''])[:3]
    try:
        if cmd == 'map':
            fd = os.open('/dev/shm/' + key, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                m = mmap.mmap(fd, st.st_size)
            finally:
                os.close(fd)
            maps.setdefault(name, []).append(m)
            print('ok %d' % st.st_ino, flush=True)
        elif cmd == 'unmap':
            for m in maps.pop(name, []):
                m.close()
            print('ok 0', flush=True)
    except (OSError, ValueError) as exc:
        print('err %s' % getattr(exc, 'errno', 0), flush=True)
"""

# A client in the server's mount namespace, as uid: one command a line, one answer a line.
CLIENT = r"""
import mmap, os, signal, sys, time
fd = os.open('/proc/%s/ns/mnt' % sys.argv[2], os.O_RDONLY)
os.setns(fd, os.CLONE_NEWNS)
os.close(fd)
uid = int(sys.argv[1])
if uid:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked children are reaped when killed
fds, maps = {}, {}
print('READY', flush=True)
for line in sys.stdin:
    cmd, key, size = (line.split() + ['', ''])[:3]
    path = '/dev/shm/' + key
    try:
        if cmd == 'create':
            f = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            fds[key] = f
            os.fchmod(f, 0o666)
            os.ftruncate(f, int(size))
            print('ok %d' % os.fstat(f).st_ino, flush=True)
        elif cmd == 'open':
            f = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            if key in fds:
                os.close(fds.pop(key))
            fds[key] = f
            print('ok %d' % os.fstat(f).st_ino, flush=True)
        elif cmd == 'map':
            maps.setdefault(key, []).append(mmap.mmap(fds[key], os.fstat(fds[key]).st_size))
            print('ok 0', flush=True)
        elif cmd == 'close':
            os.close(fds.pop(key))
            print('ok 0', flush=True)
        elif cmd == 'unmap':
            for m in maps.pop(key, []):
                m.close()
            print('ok 0', flush=True)
        elif cmd == 'unlink':
            ino = os.lstat(path).st_ino
            os.unlink(path)
            print('ok %d' % ino, flush=True)
        elif cmd == 'fork':
            pid = os.fork()
            if pid == 0:
                sys.stdin.close()
                while True:
                    time.sleep(60)
            print('ok %d' % pid, flush=True)
    except (OSError, ValueError, KeyError) as exc:
        print('err %s' % getattr(exc, 'errno', 0), flush=True)
"""


def module_params(args: dict) -> dict:
    """The parameters triton_shm_region's AnsibleModule makes of args (its own argument spec, defaults filled in)."""
    spec: dict = {}

    class Captured(Exception):
        pass

    def capture(argument_spec: dict, **_kw: object) -> None:
        spec.update(argument_spec)
        raise Captured

    real = triton_shm_region.AnsibleModule
    triton_shm_region.AnsibleModule = capture
    try:
        triton_shm_region.main()
    except Captured:
        pass
    finally:
        triton_shm_region.AnsibleModule = real
    result = ArgumentSpecValidator(spec).validate(args)
    assert not result.error_messages, result.error_messages
    return result.validated_parameters


class StepFailed(Exception):
    """A process of the scene did not answer within WAIT."""


def readable(stream: object, timeout: float = WAIT) -> bool:
    """Whether stream has something to read (or its end) within timeout (poll: no limit on the fd number)."""
    poller = select.poll()
    poller.register(stream, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def ask(proc: subprocess.Popen, line: str) -> tuple[bool, int]:
    """Send one command line; (ok, the number it answered)."""
    proc.stdin.write(line + '\n')
    proc.stdin.flush()
    if not readable(proc.stdout):
        raise StepFailed(f'no answer to {line!r} within {WAIT}s')
    answer = proc.stdout.readline().split()
    if not answer:
        raise StepFailed(f'process {proc.pid} ended at {line!r}')
    return answer[0] == 'ok', int(answer[1]) if len(answer) > 1 and answer[1].lstrip('-').isdigit() else 0


def ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline() if readable(proc.stdout) else ''
    if not line.startswith('READY'):
        proc.kill()
        raise StepFailed(f'process did not start: {line!r} {proc.stderr.read()[-2000:] if proc.stderr else ""}')


def stopped_in(tracer: subprocess.Popen, number: int) -> bool:
    """Wait (bounded) until strace's child, the module, sits in system call number (delayed there); False when the
    module ended first (it never made that call)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and tracer.poll() is None:
        try:
            with open(f'/proc/{tracer.pid}/task/{tracer.pid}/children') as f:
                child = f.read().split()[:1]
            with open(f'/proc/{child[0]}/syscall') as f:
                if f.read().split()[:1] == [str(number)]:
                    return True
        except (OSError, IndexError):
            pass
        time.sleep(0.002)
    return False


def gone(pid: int, timeout: float = WAIT) -> bool:
    """Wait (bounded) until pid is dead or a zombie: it maps and holds nothing any more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f'/proc/{pid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X'):
                    return True
        except OSError:
            return True
        time.sleep(0.002)
    return False


class Unregistered(NamedTuple):
    """One unregister the server accepted: the region, the inode it mapped at its register, the step."""

    region: str
    inode: int | None
    step: int


@dataclasses.dataclass
class Holder:
    """One model process: what it has open and what it maps (key -> inode)."""

    pid: int
    kind: str  # 'client', 'child' (forked), 'leader_exit'
    proc: subprocess.Popen | None = None
    uid: int = 0
    fds: dict = dataclasses.field(default_factory=dict)
    maps: dict = dataclasses.field(default_factory=dict)
    alive: bool = True

    def held(self) -> set:
        return set(self.fds.values()) | set(self.maps.values()) if self.alive else set()


class Audited(Triton):
    """The fake API, auditing invariant 2 before each call: a listed region never lacks its backing inode."""

    def __init__(self, scene: Scene, version: str) -> None:
        super().__init__(version)
        self.scene = scene
        self.backing: dict[str, int] = {}  # region -> inode the server mapped at its (last) register
        self.unregistered: list[Unregistered] = []  # in order
        self.violations: list[str] = []
        self.on_call = None  # (method, name, before) -> None: the kill hook of a module run
        self.mapped: set = set()  # regions whose file the server maps

    def audit(self, when: str) -> None:
        linked = self.scene.linked()
        for name in list(self.regions):
            ino = self.backing.get(name)
            if (
                ino is not None
                and ino not in linked
                and ino not in self.scene.client_unlinked | self.scene.removed_by_test
            ):
                self.violations.append(f'invariant 2 at {when}: region {name!r} listed, its file (inode {ino}) gone')

    def _hook(self, method: str, name: str, before: bool) -> None:
        if self.on_call is not None:
            self.on_call(method, name, before)

    def status(self, kind: str = 'system') -> list[dict]:
        self.audit('status')
        self._hook('status', '', True)
        out = super().status(kind)
        self._unmap_gone()
        self._hook('status', '', False)
        return out

    def _unmap_gone(self) -> None:
        """The server unmaps a region's file once the region is gone (at once, or when a deferred one leaves)."""
        for name in sorted(self.mapped - set(self.regions)):
            self.mapped.discard(name)
            ask(self.scene.server, f'unmap {name}')

    def unregister(self, kind: str, name: str, peer: object = None) -> None:
        self.audit(f'unregister {name}')
        self._hook('unregister', name, True)
        listed = name in self.regions
        super().unregister(kind, name, peer)
        if listed:
            self.unregistered.append(Unregistered(name, self.backing.get(name), self.scene.step_no))
        self._unmap_gone()
        self._hook('unregister', name, False)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.audit(f'register {name}')
        if name in self.regions:
            super().register(name, key, offset, byte_size)  # refused as the server does
        ok, ino = ask(self.scene.server, f'map {name} {key.lstrip("/")}')
        if not ok:
            raise Refusal((400, 'INVALID_ARGUMENT'), f"Unable to open shared memory region: '{key}'")
        super().register(name, key, offset, byte_size)
        self.backing[name] = ino
        self.mapped.add(name)


class Scene(RuleBasedStateMachine):
    """One server, its tmpfs, its API, and what clients and other users do around them (the module docstring)."""

    workdir = ''  # set by the test: a directory for the leader_exit program, locks, args, outside files
    leader_exit = ''
    figures: dict = {}

    def __init__(self) -> None:
        super().__init__()
        self.procs: list[subprocess.Popen] = []
        self.holders: list[Holder] = []
        self.client_unlinked: set = set()  # inodes a client or the test itself unlinked
        self.removed_by_test: set = set()
        self.step_no = 0
        self.tag = ''
        self.reserved_untouched: set = set()  # regions this collection registered, no client attached yet
        self.fills: list[str] = []
        self.readonly = False
        self.links: dict[str, tuple[int, str]] = {}  # symlink name -> (inode, target)
        self.planted: set = set()  # inodes of uid 65534's regular files
        self.front = None
        self.server = None
        self.before: dict = {}
        Scene.figures['examples'] = Scene.figures.get('examples', 0) + 1

    # -- the scene's set-up and teardown -----------------------------------------------------------------------------

    @initialize(server_root=st.booleans(), version=st.sampled_from(['2.51.0', '2.53.0']))
    def start(self, server_root: bool, version: str) -> None:
        self.server_uid = 0 if server_root else SERVER_UID
        shell = f'mount -t tmpfs -o {TMPFS} tmpfs /dev/shm && exec "$0" -c "$1" "$2"'
        argv = 'unshare --mount --propagation private sh -c'.split() + [shell, sys.executable, SERVER]
        self.server = self._spawn([*argv, str(self.server_uid)])
        self.shm = f'/proc/{self.server.pid}/root/dev/shm'
        self.model = Audited(self, version)
        self.front = HttpFront(self.model)
        self.outside = tempfile.mkdtemp(prefix='outside-', dir=self.workdir)
        for name in ('target', 'passwd'):
            with open(os.path.join(self.outside, name), 'w') as f:
                f.write(f'{name} stays as it is\n')
        self.outside_before = self._outside()
        self.before = self._listing()

    def teardown(self) -> None:
        if self.front is not None:
            self.front.close()
        for h in self.holders:
            if h.alive and h.proc is None:
                try:
                    os.kill(h.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                pass
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        if getattr(self, 'outside', None):
            shutil.rmtree(self.outside, ignore_errors=True)

    def _spawn(self, argv: list[str], answers: bool = True, **kw: object) -> subprocess.Popen:
        """Start one process of the scene (killed by pid at teardown); answers: it takes commands and says READY."""
        opts = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if answers:
            opts.update(stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        opts.update(kw)
        proc = subprocess.Popen(argv, text=True, start_new_session=True, **opts)
        self.procs.append(proc)
        if answers:
            ready(proc)
        return proc

    # -- reading the real state --------------------------------------------------------------------------------------

    def _listing(self) -> dict:
        """name -> (inode, uid, type, symlink target) of every entry of the directory."""
        out = {}
        for name in os.listdir(self.shm):
            try:
                s = os.lstat(os.path.join(self.shm, name))
            except FileNotFoundError:
                continue
            target = os.readlink(os.path.join(self.shm, name)) if stat.S_ISLNK(s.st_mode) else None
            out[name] = (s.st_ino, s.st_uid, stat.S_IFMT(s.st_mode), target)
        return out

    def linked(self) -> set:
        return {v[0] for v in self._listing().values()}

    def _outside(self) -> dict:
        out = {}
        for name in sorted(os.listdir(self.outside)):
            path = os.path.join(self.outside, name)
            s = os.lstat(path)
            with open(path, 'rb') as f:
                out[name] = (s.st_ino, s.st_size, s.st_mtime_ns, f.read())
        return out

    def _live(self, kinds: tuple = ('client',)) -> list[Holder]:
        return [h for h in self.holders if h.alive and h.kind in kinds]

    def _pick(self, i: int, kinds: tuple = ('client',)) -> Holder:
        live = self._live(kinds)
        return live[i % len(live)]

    def _held(self) -> dict:
        """inode -> the pids of live model processes holding it."""
        out: dict = {}
        for h in self.holders:
            for ino in h.held():
                out.setdefault(ino, set()).add(h.pid)
        return out

    def _root_path(self, key: str) -> str:
        return os.path.join(self.shm, key)

    # -- clients -----------------------------------------------------------------------------------------------------

    def _step(self, tag: str) -> None:
        self.step_no += 1
        self.tag = tag
        Scene.figures['steps'] = Scene.figures.get('steps', 0) + 1
        tags = Scene.figures.setdefault('tags', {})
        tags[tag] = tags.get(tag, 0) + 1

    @precondition(lambda self: len(self._live()) < 3)
    @rule(as_root=st.booleans())
    def new_client(self, as_root: bool) -> None:
        self._step('new_client')
        uid = 0 if as_root else self.server_uid
        proc = self._spawn([sys.executable, '-c', CLIENT, str(uid), str(self.server.pid)])
        self.holders.append(Holder(proc.pid, 'client', proc, uid))

    @precondition(lambda self: len(self._live()) < 4)
    @rule(
        as_root=st.booleans(),
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        size=st.sampled_from([4 * KIB, 48 * KIB]),
        close_fd=st.booleans(),
        then=st.sampled_from(['exit', 'stay', 'fork_exit']),
    )
    def client_region(self, as_root: bool, keys: list, size: int, close_fd: bool, then: str) -> None:
        """The usual client: a new process creates each of its keys, maps it, closes its fd (or not), registers
        region KEY; then stays, exits (its regions are left stale), or forks a child that keeps its mappings and
        exits."""
        self._step('client_region')
        self._client(as_root, keys, size, close_fd, then)

    @rule()
    def leak(self) -> None:
        """The commonest event, so the first rule (hypothesis draws rules with fewer arguments first): a client of
        the server's user creates a file, maps it, closes its fd, registers it, and is killed: a stale region."""
        self._step('leak')
        self._client(False, [KEYS[self.step_no % len(KEYS)]], 4 * KIB, True, 'exit')

    def _client(self, as_root: bool, keys: list, size: int, close_fd: bool, then: str) -> None:
        uid = 0 if as_root else self.server_uid
        proc = self._spawn([sys.executable, '-c', CLIENT, str(uid), str(self.server.pid)])
        h = Holder(proc.pid, 'client', proc, uid)
        self.holders.append(h)
        for key in keys:
            ok, ino = ask(proc, f'create {key} {size}')
            if not ok:
                continue
            h.fds[key] = ino
            if ask(proc, f'map {key}')[0]:
                h.maps[key] = ino
            if close_fd:
                ask(proc, f'close {key}')
                del h.fds[key]
            try:
                self.model.register(key, '/' + key, 0, 4 * KIB)
            except Refusal:
                pass
        if then == 'fork_exit':
            ok, pid = ask(proc, 'fork')
            if ok:
                self.holders.append(Holder(pid, 'child', None, uid, dict(h.fds), dict(h.maps)))
        if then != 'stay':
            proc.kill()
            proc.wait(timeout=WAIT)
            h.alive = False

    @precondition(lambda self: self._live())
    @rule(i=st.integers(0, 7), key=st.sampled_from(KEYS), size=st.sampled_from([4 * KIB, 48 * KIB]))
    def create(self, i: int, key: str, size: int) -> None:
        self._step('create')
        h = self._pick(i)
        ok, ino = ask(h.proc, f'create {key} {size}')
        if ok:
            h.fds[key] = ino

    @precondition(lambda self: self._live())
    @rule(i=st.integers(0, 7), key=st.sampled_from(KEYS + PLANTED + ('r',)))
    def open_by_name(self, i: int, key: str) -> None:
        self._step('open')
        h = self._pick(i)
        ok, ino = ask(h.proc, f'open {key}')
        if ok:
            h.fds[key] = ino
            self.reserved_untouched.discard(key)

    @precondition(lambda self: any(h.fds or h.maps for h in self._live()))
    @rule(i=st.integers(0, 7), k=st.integers(0, 7), what=st.sampled_from(['map', 'close', 'unmap']))
    def use(self, i: int, k: int, what: str) -> None:
        """A client maps one of its open files, closes an fd (a mapping stays: the usual C idiom), or unmaps."""
        self._step(what)
        h = self._pick(i)
        table = h.maps if what == 'unmap' else h.fds
        if not table:
            return
        key = sorted(table)[k % len(table)]
        if ask(h.proc, f'{what} {key}')[0]:
            if what == 'map':
                h.maps[key] = h.fds[key]
            else:
                del table[key]

    @precondition(lambda self: self._live())
    @rule(i=st.integers(0, 7), key=st.sampled_from(KEYS))
    def client_unlinks(self, i: int, key: str) -> None:
        """A client removes its file by name (a resource tracker does): its region becomes dangling."""
        self._step('client_unlink')
        ok, ino = ask(self._pick(i).proc, f'unlink {key}')
        if ok:
            self.client_unlinked.add(ino)

    @precondition(lambda self: self._live())
    @rule(key=st.sampled_from(KEYS + PLANTED))
    def register(self, key: str) -> None:
        """A client registers region KEY on the file KEY (its own, or another user's: a client's word)."""
        self._step('register')
        try:
            self.model.register(key, '/' + key, 0, 4 * KIB)
        except Refusal:
            pass

    @precondition(lambda self: self._live() and len(self._live(('child',))) < 3)
    @rule(i=st.integers(0, 7))
    def fork(self, i: int) -> None:
        self._step('fork')
        h = self._pick(i)
        ok, pid = ask(h.proc, 'fork')
        if ok:
            self.holders.append(Holder(pid, 'child', None, h.uid, dict(h.fds), dict(h.maps)))

    @precondition(lambda self: len(self._live(('leader_exit',))) < 2)
    @rule(k=st.integers(0, 7), keep_fd=st.booleans())
    def leader_exits(self, k: int, keep_fd: bool) -> None:
        """leader_exit.c on the file of a registered region (of a key, when none is): its main thread exits, a worker
        maps and writes (the case of goal 1: the region must stay healthy)."""
        self._step('leader_exit')
        keys = sorted(r['key'].lstrip('/') for r in self.model.regions.values()) or list(KEYS)
        key = keys[k % len(keys)]
        try:
            s = os.lstat(self._root_path(key))
        except FileNotFoundError:
            return
        if not stat.S_ISREG(s.st_mode) or s.st_size == 0:
            return
        argv = ['nsenter', f'--mount=/proc/{self.server.pid}/ns/mnt', self.leader_exit, '/dev/shm/' + key]
        proc = self._spawn(argv + [str(s.st_size), 'keep' if keep_fd else 'close'], answers=False)
        line = proc.stdout.readline() if readable(proc.stdout) else ''
        if not line.startswith('READY'):
            return  # the file went meanwhile, or it could not map it: nothing held
        h = Holder(proc.pid, 'leader_exit', proc, 0, maps={key: s.st_ino})
        if keep_fd:
            h.fds[key] = s.st_ino
        self.holders.append(h)
        self.reserved_untouched.discard(key)

    @precondition(lambda self: self._live(('client', 'child', 'leader_exit')))
    @rule(i=st.integers(0, 7))
    def kill(self, i: int) -> None:
        """SIGKILL one model process (its forked children live on, as they do)."""
        self._step('kill')
        h = self._pick(i, ('client', 'child', 'leader_exit'))
        os.kill(h.pid, signal.SIGKILL)
        if h.proc is not None:
            h.proc.wait(timeout=WAIT)
        elif not gone(h.pid):
            raise StepFailed(f'process {h.pid} still alive after SIGKILL')
        h.alive = False

    # -- other users, the directory ---------------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(PLANTED + KEYS + ('l',)),
        what=st.sampled_from(['empty', 'file', 'link', 'swap']),
        inside=st.sampled_from(['', *KEYS]),
    )
    def plant(self, name: str, what: str, inside: str) -> None:
        """uid 65534 plants a regular file (empty, or 4 KiB; mode 0666: a server may map it, a client register it), a
        symlink (to a file outside the directory, or to a file of the directory), or swaps its own file for one."""
        self._step('plant_' + what)
        if what in ('empty', 'file'):
            self._plant_file(name, 0 if what == 'empty' else 4 * KIB)
        else:
            self._plant_link(name, os.path.join(self.outside, 'target') if not inside else '/dev/shm/' + inside, what)

    def _plant_file(self, name: str, size: int) -> None:
        try:
            fd = os.open(self._root_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except OSError:
            return
        try:
            os.fchown(fd, NOBODY, NOBODY)
            os.fchmod(fd, 0o666)
            self.planted.add(os.fstat(fd).st_ino)
            os.ftruncate(fd, size)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _plant_link(self, name: str, target: str, what: str) -> None:
        path = self._root_path(name)
        tmp = self._root_path('.tmp-link')
        try:
            if what == 'swap':
                s = os.lstat(path)
                if s.st_uid != NOBODY or not stat.S_ISREG(s.st_mode):
                    return
                os.symlink(target, tmp)
                os.lchown(tmp, NOBODY, NOBODY)
                os.rename(tmp, path)
                self.removed_by_test.add(s.st_ino)
            else:
                os.symlink(target, path)
                os.lchown(path, NOBODY, NOBODY)
        except OSError:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            return
        self.links[name] = (os.lstat(path).st_ino, target)

    @rule(action=st.sampled_from(['free', 'rw', 'blocks', 'inodes', 'ro']))
    def directory(self, action: str) -> None:
        """uid 65534 fills the tmpfs (its blocks: one file to ENOSPC; its inodes: empty files to ENOSPC) or removes
        its fill files again (the test does it: those removals are the test's own); or the directory is remounted
        read-only (the kernel refuses while a file is open for writing: it stays writable then) or writable. A fill
        or a read-only remount lasts until the end of the next cleanup (_cleanup)."""
        self._step(action)
        if action in ('ro', 'rw'):
            self._remount(action)
        elif action == 'free':
            self._free()
        else:
            while self._fill_one(blocks=action == 'blocks') and action == 'inodes':
                pass

    def _free(self) -> None:
        for path in self.fills:
            try:
                ino = os.lstat(path).st_ino
                os.unlink(path)
                self.removed_by_test.add(ino)
            except OSError:
                pass
        self.fills = []

    def _fill_one(self, blocks: bool) -> bool:
        """One fill file of uid 65534 (written to ENOSPC when blocks); False when it could not be created."""
        path = self._root_path(f'fill{len(self.fills)}')
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError:
            return False
        self.fills.append(path)
        try:
            os.fchown(fd, NOBODY, NOBODY)
            self.planted.add(os.fstat(fd).st_ino)
            while blocks:
                os.write(fd, b'\0' * (16 * KIB))
        except OSError:
            pass
        finally:
            os.close(fd)
        return True

    def _remount(self, mode: str) -> None:
        done = subprocess.run(
            ['nsenter', f'--mount=/proc/{self.server.pid}/ns/mnt', 'mount', '-o', f'remount,{mode}', '/dev/shm'],
            check=False,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert done.returncode == 0 or 'busy' in done.stderr, done.stderr
        self.readonly = mode == 'ro' if done.returncode == 0 else self.readonly

    @rule(key=st.sampled_from(KEYS), reads=st.integers(1, 3))
    def in_flight(self, key: str, reads: int) -> None:
        """Requests in flight on region KEY: refused (2.51) or deferred (2.53) for that many calls."""
        self._step('in_flight')
        if key in self.model.regions:
            self.model.in_flight[key] = reads

    # -- cleanups ----------------------------------------------------------------------------------------------------

    def _args(self, **kw: object) -> dict:
        """A cleanup's module arguments: this scene's URL and server, no shm_dir (from /proc/PID/root), kw."""
        args = dict(url=self.front.url, server_pid=self.server.pid, state='absent', in_use_timeout=2)
        args.update(kw)
        return args

    def _run_ops(self, p: dict) -> Callable[[], None]:
        """A cleanup in-process: RegionOps over HTTP, as the module runs it (its failures are the invariants' to judge)."""

        def run() -> None:
            client = TritonClient(self.front.url, timeout=5)
            ops = RegionOps(client, p, warn=lambda m: None)
            try:
                ops.run()
                Scene.figures['removed'] = Scene.figures.get('removed', 0) + len(ops.result()['removed_files'])
            except Exception:  # noqa: BLE001  a refused or failed run: the invariants judge what it did
                pass
            finally:
                ops.release()
                client.close()

        return run

    def _protected(self) -> set:
        """Regions a stale cleanup must keep: held by a live model process, or reserved and never attached to."""
        held = self._held()
        names = {n for n, ino in self.model.backing.items() if n in self.model.regions and ino in held}
        return names | (self.reserved_untouched & set(self.model.regions))

    def _cleanup(self, tag: str, run: Callable[[], None]) -> None:
        protected = self._protected() if tag.endswith('stale') else set()
        first = len(self.model.unregistered)
        run()
        # a full or read-only directory lasts for one cleanup: then the space comes back, the directory is writable
        # again (else one fill early in an example would leave nothing to clean for the rest of it)
        self._free()
        if self.readonly:
            self._remount('rw')
        if protected:
            still = self._protected() & protected  # holds that lasted the whole cleanup
            wrong = {u.region for u in self.model.unregistered[first:]} & still
            assert not wrong, f'invariant 9: a stale cleanup unregistered live or reserved region(s) {sorted(wrong)}'

    @rule(
        by_name=st.one_of(st.none(), st.sampled_from(KEYS + PLANTED)),
        widen=st.booleans(),
        inventory=st.booleans(),
    )
    def cleanup(self, by_name: str | None, widen: bool, inventory: bool) -> None:
        """RegionOps in-process: stale=true, or state=absent of one named region (live or not)."""
        tag = 'absent' if by_name else 'stale'
        self._step(tag)
        users = ['0'] if widen and self.server_uid else []
        selector = dict(name=[by_name]) if by_name else dict(stale=True)
        p = module_params(self._args(client_users=users, inventory=inventory, **selector))
        self._cleanup(tag, self._run_ops(p))

    @rule()
    def reclaim(self) -> None:
        """The commonest cleanup, also a rule without arguments (drawn often): RegionOps in-process, stale=true."""
        self._step('stale')
        self._cleanup('stale', self._run_ops(module_params(self._args(stale=True))))

    @precondition(lambda self: self._live())
    @rule(i=st.integers(0, 7), at=st.sampled_from(['unregister', 'status']))
    def cleanup_raced(self, i: int, at: str) -> None:
        """Invariant 13: a stale cleanup in-process, and while it runs, after its holder scan and before its quarantine
        rename (at its first unregister, or at its first status read after that), a live client opens the file of the
        region just unregistered by name and maps it. The client keeps the file."""
        self._step('stale')
        h = self._pick(i)
        first = len(self.model.unregistered)
        done: list = []

        def attach(method: str, _name: str, before: bool) -> None:
            if done or before or method != at or len(self.model.unregistered) == first:
                return
            key = self.model.unregistered[first].region
            done.append(key)
            ok, ino = ask(h.proc, f'open {key}')
            if ok:
                h.fds[key] = ino
                if ask(h.proc, f'map {key}')[0]:
                    h.maps[key] = ino
                Scene.figures['raced'] = Scene.figures.get('raced', 0) + 1

        self.model.on_call = attach
        try:
            self._cleanup('stale', self._run_ops(module_params(self._args(stale=True))))
        finally:
            self.model.on_call = None

    @rule(name=st.sampled_from(('r', 's')))
    def reserve(self, name: str, size: int = 4 * KIB) -> None:
        """This collection registers a region and creates its file (state=present, create_file): reserved."""
        self._step('reserve')
        p = module_params(self._args(state='present', name=[name], key='/' + name, byte_size=size, create_file=True))
        client = TritonClient(self.front.url, timeout=5)
        ops = RegionOps(client, p, warn=lambda m: None)
        try:
            ops.run()
        except Exception:  # noqa: BLE001
            return
        finally:
            ops.release()
            client.close()
        if name in self.model.regions:
            self.reserved_untouched.add(name)

    @rule(
        point=st.sampled_from(['none', 'unlinkat', 'renameat2', 'unregister', 'status', 'time']),
        nth=st.integers(1, 4),
        before=st.booleans(),
        delay=st.floats(0.0, 1.5),
    )
    def module_killed(self, point: str, nth: int, before: bool, delay: float) -> None:
        """triton_shm_region stale=true as its own process, SIGKILLed part-way: at its nth status or unregister call
        (before or after the server acts on it), stopped by strace in its nth renameat2 (a quarantine rename) or
        unlinkat (an unlink, after every rename and the re-check), or after delay seconds."""
        self._step('module_stale')
        args = self._args(stale=True, lock_dir=os.path.join(self.workdir, 'locks'))
        args_file = os.path.join(self.workdir, f'args-{time.monotonic_ns()}.json')
        with open(args_file, 'w') as f:
            json.dump({'ANSIBLE_MODULE_ARGS': args}, f)
        env = dict(os.environ, PYTHONPATH=COLLECTIONS_ROOT, PYTHONDONTWRITEBYTECODE='1')
        argv = [sys.executable, '-m', 'ansible_collections.tritonops.shm.plugins.modules.triton_shm_region', args_file]
        traced = point in SYSCALLS and os.uname().machine == 'x86_64'
        if traced:
            argv = ['strace', '-f', '-qq', '--seccomp-bpf', '-o', '/dev/null', '-e', f'trace={point}', '-e',
                    f'inject={point}:delay_enter={int(WAIT * 1e6)}:when={nth}', *argv]  # fmt: skip

        def run() -> None:
            proc = self._spawn(argv, answers=False, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
            seen = {'status': 0, 'unregister': 0}

            def kill() -> None:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: strace and the module
                    Scene.figures['killed'] = Scene.figures.get('killed', 0) + 1

            def hook(method: str, _name: str, at_before: bool) -> None:
                if at_before:
                    seen[method] += 1
                if point == method and seen[method] == nth and at_before == before:
                    kill()
                    if before:
                        raise Drop(method)

            timer = None
            if point == 'time':
                timer = threading.Timer(delay, kill)
                timer.start()
            self.model.on_call = hook
            try:
                if traced and stopped_in(proc, SYSCALLS[point]):
                    kill()
                out, _err = proc.communicate(timeout=120)
                self._count_module(proc.returncode, out)
            finally:
                self.model.on_call = None
                if timer is not None:
                    timer.cancel()

        self._cleanup('module_stale', run)

    @staticmethod
    def _count_module(rc: int, out: str) -> None:
        """Count how module runs ended: killed, or their result (a run that fails to start is a test failure)."""
        f = Scene.figures
        if rc == -signal.SIGKILL:
            return
        try:
            result = json.loads(out[out.index('{') :])
        except ValueError:
            raise StepFailed(f'the module printed no result (rc {rc}): {out[-2000:]}') from None
        assert 'unsupported parameter' not in result.get('msg', ''), result['msg']
        f['module_results'] = f.get('module_results', 0) + 1
        f['removed'] = f.get('removed', 0) + len(result.get('removed_files', []))

    # -- the invariants ----------------------------------------------------------------------------------------------

    @invariant()
    def safety(self) -> None:
        if self.server is None:
            return
        assert not self.model.violations, self.model.violations
        self.model.audit('after the step')
        assert not self.model.violations, self.model.violations
        now = self._listing()
        linked = {v[0] for v in now.values()}
        # 1: every inode a live model process holds is still linked
        for ino, pids in self._held().items():
            assert ino in linked or ino in self.client_unlinked | self.removed_by_test, (
                f'invariant 1: inode {ino} held by {sorted(pids)} was removed (step {self.step_no} {self.tag})'
            )
        # what disappeared in this step, beyond what the step itself removed
        removed = {v[0]: (name, v) for name, v in self.before.items()}
        for ino in linked | self.client_unlinked | self.removed_by_test:
            removed.pop(ino, None)
        cleanup = self.tag in ('stale', 'absent', 'module_stale', 'reserve')
        for ino, (name, (_i, uid, ftype, _t)) in removed.items():
            what = f'{name} (inode {ino}, uid {uid}) removed at step {self.step_no} {self.tag}'
            assert cleanup, f'{what}: by no cleanup'
            assert ftype == stat.S_IFREG, f'invariant 4: {what} was not a regular file'
            assert ino not in self.planted and uid != NOBODY, f'invariants 12/13: {what} was planted by uid 65534'
            assert uid == self.server_uid, f'invariant 12: {what} is not the server user ({self.server_uid})'
            gone = {u.inode for u in self.model.unregistered}
            listed = {self.model.backing.get(n) for n in self.model.regions}
            assert ino in gone, f'invariant 2: {what} backed no region that was unregistered'
            assert ino not in listed, f'invariant 2: {what} backs a region still listed'
        # 4: symlinks unchanged, the files outside unchanged
        for name, (ino, target) in self.links.items():
            if ino in self.removed_by_test | self.client_unlinked:
                continue
            assert name in now and now[name][0] == ino and now[name][3] == target, (
                f'invariant 4: symlink {name} changed'
            )
        assert self._outside() == self.outside_before, 'invariant 4: a file outside the directory changed'
        self.before = now


@pytest.fixture
def scene_dir(tmp_path_factory):
    """A workdir every scene process can reach, with leader_exit compiled into it."""
    if os.geteuid() != 0:
        pytest.skip('needs root: mount namespaces, tmpfs mounts, other users')
    for tool in ('unshare', 'nsenter', 'mount', 'cc'):
        if shutil.which(tool) is None:
            pytest.fail(f'{tool} is not installed')
    work = str(tmp_path_factory.mktemp('model'))
    os.chmod(work, 0o755)
    program = os.path.join(work, 'leader_exit')
    subprocess.run(['cc', '-O2', '-pthread', '-o', program, LEADER_EXIT_SOURCE], check=True, capture_output=True)
    os.makedirs(os.path.join(work, 'locks'))
    return work


def test_safety_invariants_hold_after_every_step(scene_dir):
    Scene.workdir = scene_dir
    Scene.leader_exit = os.path.join(scene_dir, 'leader_exit')
    Scene.figures = {}
    started = time.monotonic()
    try:
        run_state_machine_as_test(Scene, settings=PROFILE)
    finally:
        f = Scene.figures
        print(
            f'FIGURE model_safety: {f.get("examples", 0)} examples, {f.get("steps", 0)} steps in '
            f'{time.monotonic() - started:.1f}s (max_examples {PROFILE.max_examples}, up to '
            f'{PROFILE.stateful_step_count} steps each): {f.get("killed", 0)} module runs SIGKILLed part-way, '
            f'{f.get("module_results", 0)} finished; {f.get("removed", 0)} files removed; {f.get("raced", 0)} '
            'clients attached mid-cleanup; steps: '
            + ', '.join(f'{k} {v}' for k, v in sorted(f.get('tags', {}).items()))
        )


def test_the_scene_reclaims_what_is_stale(scene_dir):
    """The positive control: in this scene a stale region and its file do go (so the invariants are not vacuous),
    in-process and by the module's own process, under a root and an unprivileged server."""
    Scene.workdir = scene_dir
    Scene.leader_exit = os.path.join(scene_dir, 'leader_exit')
    for server_root in (True, False):
        scene = Scene()
        try:
            scene.start(server_root=server_root, version='2.51.0')
            scene.client_region(as_root=False, keys=['a'], size=4 * KIB, close_fd=True, then='exit')
            scene.client_region(as_root=False, keys=['c'], size=4 * KIB, close_fd=True, then='stay')
            scene.safety()
            removed = Scene.figures.get('removed', 0)
            scene.cleanup(by_name=None, widen=False, inventory=False)
            scene.safety()
            assert sorted(scene.model.regions) == ['c'] and sorted(scene._listing()) == ['c']
            assert Scene.figures['removed'] == removed + 1
            scene.client_region(as_root=False, keys=['b'], size=4 * KIB, close_fd=False, then='fork_exit')
            scene.kill(i=1)  # the forked child (live: c's client, this child): the last holder
            scene.module_killed(point='none', nth=1, before=True, delay=0.0)
            scene.safety()
            assert sorted(scene.model.regions) == ['c'] and sorted(scene._listing()) == ['c']
            assert Scene.figures['removed'] == removed + 2
            # the kill points work: stopped by strace in its first unlink (after the quarantine rename), killed there
            if os.uname().machine == 'x86_64':
                killed = Scene.figures.get('killed', 0)
                scene.client_region(as_root=False, keys=['d'], size=4 * KIB, close_fd=True, then='exit')
                scene.module_killed(point='unlinkat', nth=1, before=True, delay=0.0)
                scene.safety()
                assert Scene.figures['killed'] == killed + 1 and sorted(scene.model.regions) == ['c']
                assert [n for n in scene._listing() if n != 'c'][0].startswith('.tritonops_shm.quarantine.')
                scene.cleanup(by_name=None, widen=False, inventory=False)  # and one more run converges
                scene.safety()
                assert sorted(scene._listing()) == ['c']
        finally:
            scene.teardown()


def test_a_name_reused_after_a_kill_in_the_first_unlink_and_the_next_stale_cleanup(scene_dir):
    """Found by the long profile (a counterexample of the model, which kept one inode per region name): three stale
    regions, the module SIGKILLed in its first unlink (their files under quarantine names), a new client registering
    a region under one of the same names, then a stale cleanup. Every invariant holds after each step, the quarantined
    files of the unregistered regions go, and so does the new stale region's file."""
    if os.uname().machine != 'x86_64':
        pytest.skip('system call numbers are x86_64 ones')
    Scene.workdir = scene_dir
    Scene.leader_exit = os.path.join(scene_dir, 'leader_exit')
    scene = Scene()
    try:
        scene.start(server_root=False, version='2.51.0')
        for _leak in range(3):
            scene.leak()
            scene.safety()
        scene.module_killed(point='unlinkat', nth=1, before=False, delay=0.0)
        scene.safety()
        assert (
            scene.model.regions == {} and sum(n.startswith('.tritonops_shm.quarantine.') for n in scene._listing()) >= 2
        )
        scene.leak()
        scene.safety()
        scene.reclaim()
        scene.safety()
        assert scene.model.regions == {} and scene._listing() == {}
    finally:
        scene.teardown()


@pytest.fixture
def scene(scene_dir):
    """One scene for an explicit sequence (a shrunk counterexample), torn down after the test."""
    Scene.workdir = scene_dir
    Scene.leader_exit = os.path.join(scene_dir, 'leader_exit')
    made = Scene()
    try:
        yield made
    finally:
        made.teardown()


@pytest.mark.parametrize('keep_fd', [False, True], ids=['fd-closed', 'fd-kept'])
def test_a_region_held_by_a_client_whose_main_thread_exited_stays(scene, keep_fd):
    """The profile's counterexample with the holder scan reading the thread-group leader's view only (procfs.read_maps
    before goal 1), shrunk: a leak, leader_exit.c attaching to its file, a stale cleanup. Invariant 1 failed there."""
    scene.start(server_root=False, version='2.51.0')
    scene.leak()
    scene.leader_exits(k=0, keep_fd=keep_fd)
    scene.safety()
    scene.reclaim()
    scene.safety()
    assert len(scene.model.regions) == 1 and len(scene._listing()) == 1


@pytest.mark.parametrize('at', ['unregister', 'status'])
def test_a_client_attaching_mid_cleanup_keeps_its_file(scene, at):
    """The profile's counterexample without the re-check before the unlink, shrunk: a leak, a live client, a stale
    cleanup during which the client opens and maps the file of the region just unregistered. Invariant 1 (13)."""
    scene.start(server_root=False, version='2.51.0')
    scene.leak()
    scene.new_client(as_root=False)
    scene.cleanup_raced(i=0, at=at)
    scene.safety()
    assert Scene.figures.get('raced', 0) >= 1 and scene.model.regions == {} and len(scene._listing()) == 1
