"""Unit tests for module_utils/host/runlock.py: one triton_shm_region run at a time per shm directory.

The locks are real flock(2) locks on real files and directories, held by this process or by another one; only the
clock is a fake, so that the 600 s wait takes no time. The tests of a whole run use test_region_ops' fake Triton API
and its real holder scan. Each test's lock directory is its own (conftest.py: private_lock_dir).
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

# the whole-run helpers and fixtures (complete_scan is autouse there and here)
from test_region_ops import FakeClock, FakeTriton, make_file, region, run

from ansible_collections.tritonops.shm.plugins.module_utils.errors import LockError
from ansible_collections.tritonops.shm.plugins.module_utils.host import runlock, shm_fs

# server_proc, shm and complete_scan: conftest.py
pytestmark = pytest.mark.usefixtures('complete_scan')

# holds an exclusive flock on a path (a file or a directory) until stdin closes (another run, in another process)
HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print('LOCKED', flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def holder():
    """holder(path, prefix=()): another process that holds the flock on path; it ends at teardown (stopped by pid)."""
    procs = []

    def start(path, prefix=(), python=sys.executable):
        proc = subprocess.Popen(
            [*prefix, python, '-c', HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == 'LOCKED'
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _open_fds():
    return set(os.listdir('/proc/self/fd'))


def lock_of(shm, **kw):
    return runlock.ServerLock(shm_fs.pin(shm), **kw)


def _made(shm):
    """The path of shm's lock file, created by one run that took and released it."""
    lock = lock_of(shm)
    lock.acquire()
    lock.release()
    return lock.path


# -- the lock itself -------------------------------------------------------------------------------


def test_a_free_lock_is_taken_at_once_and_released(shm):
    clock = FakeClock()
    lock = lock_of(shm, sleep=clock.sleep, clock=clock.clock)
    assert lock.acquire() is False and clock.sleeps == []
    other = lock_of(shm, sleep=clock.sleep, clock=clock.clock, wait_s=0)
    with pytest.raises(LockError):
        other.acquire()
    lock.release()
    lock.release()  # twice is harmless
    assert other.acquire() is False
    other.release()


def test_the_lock_is_a_private_file_outside_the_shm_directory(shm, private_lock_dir):
    """Nothing is created in the shm directory; the lock directory is 0700 and the file is named for the directory's
    device and inode (two servers that share one /dev/shm share it)."""
    lock = lock_of(shm)
    lock.acquire()
    lock.release()
    assert os.listdir(shm) == []
    st = os.stat(shm)
    assert os.listdir(private_lock_dir) == [f'shm-{os.major(st.st_dev)}-{os.minor(st.st_dev)}-{st.st_ino}.lock']
    assert stat.S_IMODE(os.stat(private_lock_dir).st_mode) == 0o700
    assert lock.path == os.path.join(private_lock_dir, os.listdir(private_lock_dir)[0])


def test_a_lock_directory_that_cannot_be_made_falls_back_to_a_private_one_under_the_temporary_directory(
    shm, tmp_path, monkeypatch
):
    """The node agent's container has a read-only /run: root's locks then go to TMPDIR/tritonops_shm-0 (its emptyDir),
    still private (0700), still outside the shm directory. Only a directory that cannot be made moves the lock; one
    that another user could write is refused (the test below)."""
    monkeypatch.setattr(runlock, 'LOCK_DIR', '/proc/tritonops-no-such-dir/locks')  # mkdir there: ENOENT
    monkeypatch.setattr(runlock, 'lock_dir', lambda euid=None: runlock.LOCK_DIR)
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    lock = runlock.ServerLock(shm_fs.pin(shm))
    lock.acquire()
    try:
        where = os.path.join(str(tmp_path), f'tritonops_shm-{os.geteuid()}')
        assert lock.path.startswith(where + '/') and os.path.exists(lock.path)
        assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
        assert os.listdir(shm) == []
        other = runlock.ServerLock(shm_fs.pin(shm), wait_s=0.2)
        with pytest.raises(LockError):
            other.acquire()  # the fallback lock excludes another run as the first one does
    finally:
        lock.release()


def test_a_lock_directory_another_user_could_write_is_refused(shm, private_lock_dir):
    os.makedirs(private_lock_dir)
    os.chmod(private_lock_dir, 0o777)
    os.chown(private_lock_dir, 65534, 65534)
    with pytest.raises(PermissionError) as err:
        lock_of(shm).acquire()
    assert 'not a private directory' in str(err.value) and 'owner uid 65534' in str(err.value)
    os.rmdir(private_lock_dir)
    os.symlink(shm, private_lock_dir)  # planted as a symlink: never followed
    with pytest.raises(OSError):
        lock_of(shm).acquire()
    assert os.listdir(shm) == []


def test_a_lock_held_by_another_run_is_waited_for_with_backoff(shm, holder):
    proc = holder(_made(shm))
    clock = FakeClock()

    def sleep(seconds):
        clock.sleep(seconds)
        if len(clock.sleeps) == 6:
            proc.kill()  # the other run ends: the kernel drops its lock
            proc.wait()

    lock = lock_of(shm, sleep=sleep, clock=clock.clock)
    assert lock.acquire() is True, 'it waited'
    lock.release()
    assert clock.sleeps == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]


def test_a_lock_held_for_the_whole_wait_fails_after_all_of_it(shm, holder):
    holder(_made(shm))
    clock = FakeClock()
    lock = lock_of(shm, sleep=clock.sleep, clock=clock.clock)
    before = _open_fds()
    with pytest.raises(LockError) as err:
        lock.acquire()
    assert str(err.value) == (
        f'another tritonops.shm run has held the lock of {shm} ({lock.path}) for 600.0s: not acting '
        '(it is released when that run ends)'
    )
    assert sum(clock.sleeps) >= runlock.WAIT_S > sum(clock.sleeps[:-1]), 'tried again once the whole wait had passed'
    assert max(clock.sleeps) == 0.5
    assert lock.fd is None and _open_fds() == before, 'the lock file is closed again'


def test_the_shm_directory_flock_held_by_anyone_is_named_and_never_waited_for(shm, holder):
    """The shm directory's own flock (what 0.2.0 locked): held by another process, the run takes its own lock at once
    and names the holder; free, the run takes it too (a 0.2.0 run, or one inside the container, waits for it)."""
    proc = holder(shm)
    clock = FakeClock()
    lock = lock_of(shm, sleep=clock.sleep, clock=clock.clock)
    assert lock.acquire() is False and clock.sleeps == []
    assert lock.fd is not None and lock.dir_fd is None
    assert f'pid {proc.pid} (python' in lock.squatter and 'uid ' in lock.squatter
    lock.release()
    proc.kill()
    proc.wait()
    lock = lock_of(shm)
    lock.acquire()
    assert lock.squatter is None and lock.dir_fd is not None
    assert _locked(shm)
    lock.release()
    assert not _locked(shm)


def test_a_uid0_process_of_another_pid_namespace_holding_the_directory_stalls_nothing(shm, holder):
    """Issue 33, finding 3: a rootful sidecar (uid 0, its own PID namespace) holds the flock on the shm directory."""
    if os.geteuid() != 0:
        pytest.skip('needs root: a PID namespace')
    holder(shm, prefix=('unshare', '--pid', '--fork', '--kill-child'))
    clock = FakeClock()
    lock = lock_of(shm, sleep=clock.sleep, clock=clock.clock)
    assert lock.acquire() is False and clock.sleeps == [], 'not waited for'
    assert lock.squatter.startswith('held by pid ')
    lock.release()


def test_a_missing_directory_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        shm_fs.pin(str(tmp_path / 'nope'))
    (tmp_path / 'file').write_text('x')
    with pytest.raises(NotADirectoryError):
        shm_fs.pin(str(tmp_path / 'file'))


# -- what a run does with it ------------------------------------------------------------------------


def test_a_run_waits_for_the_lock_then_plans_from_what_is_left(shm, server_proc):
    for name in ('a', 'b'):
        make_file(shm, name)
    fake = FakeTriton(shm, regions=[region('a'), region('b')])
    other = lock_of(shm)
    assert other.acquire() is False

    class OtherRunFinishes(FakeClock):
        def sleep(self, seconds):
            super().sleep(seconds)
            if other.fd is not None:  # the other run does the work and ends
                fake.regions.clear()
                for name in ('a', 'b'):
                    os.unlink(os.path.join(shm, name))
                other.release()

    res = run(fake, shm, server_proc.pid, clock=OtherRunFinishes(), stale=True, serialise=True)
    assert res['changed'] is False and res['unregistered'] == [] and res['removed_files'] == []
    assert not [c for c in fake.calls if c[0] == 'unregister']


def _locked(path):
    """Whether some open file holds the flock on path (tried from a new one)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _lock_file(private_lock_dir):
    return os.path.join(private_lock_dir, os.listdir(private_lock_dir)[0])


def test_the_regions_are_read_under_the_lock(shm, server_proc, private_lock_dir):
    """A run takes the lock once the server is located, before it reads the regions: a run that read first and
    locked after could plan from what another run changed in between (make test at stop 31: two concurrent cleanups
    both reported the same 300 regions unregistered)."""
    make_file(shm, 'a')
    seen = []

    class Watched(FakeTriton):
        def status(self, kind):
            seen.append(_locked(_lock_file(private_lock_dir)))
            return super().status(kind)

    res = run(Watched(shm, regions=[region('a')]), shm, server_proc.pid, stale=True, serialise=True)
    assert res['unregistered'] == ['a']
    assert seen and seen[0] is True and all(seen), seen  # every status read, the first one included
    assert _locked(_lock_file(private_lock_dir)) is False  # released at the end


def test_another_run_that_would_act_while_this_one_reads_waits_for_it(shm, server_proc):
    """Another run tries to clean right after this run has read the regions: the lock is held from before that read,
    so the other run cannot act in between, and the regions are unregistered once, by this run. (Locking after the
    read, the other run cleaned in between and this run unregistered the same regions again from its old read.)"""
    for name in ('a', 'b'):
        make_file(shm, name)
    by_other = []

    class OtherRunMeanwhile(FakeTriton):
        def status(self, kind):
            listed = super().status(kind)
            other = lock_of(shm, wait_s=0)
            try:
                other.acquire()
            except LockError:
                return listed  # held by this run: the other run would wait
            by_other.extend(sorted(self.regions))
            self.regions.clear()
            for name in ('a', 'b'):
                os.unlink(os.path.join(shm, name))
            other.release()
            return listed

    res = run(
        OtherRunMeanwhile(shm, regions=[region('a'), region('b')]), shm, server_proc.pid, stale=True, serialise=True
    )
    assert by_other == [], "the other run acted between this run's read and its lock"
    assert res['unregistered'] == ['a', 'b'] and sorted(os.path.basename(f) for f in res['removed_files']) == ['a', 'b']


def test_a_lock_held_too_long_fails_clearly_and_touches_nothing(shm, server_proc):
    make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    other = lock_of(shm)
    other.acquire()
    try:
        with pytest.raises(shm_fs.ShmFsError) as err:
            run(fake, shm, server_proc.pid, stale=True, serialise=True)
    finally:
        other.release()
    assert f'another tritonops.shm run has held the lock of {shm} (' in str(err.value)
    assert 'a' in fake.regions and os.listdir(shm) == ['a']


def test_a_run_leaves_no_file_in_the_shm_directory_and_releases_the_lock(shm, server_proc):
    make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    before = os.listdir(os.path.dirname(shm))
    res = run(fake, shm, server_proc.pid, stale=True, serialise=True)
    assert res['unregistered'] == ['a'] and os.listdir(shm) == []
    assert os.listdir(os.path.dirname(shm)) == before
    # released: the next run takes it at once
    lock = lock_of(shm)
    assert lock.acquire() is False
    lock.release()


def test_a_squatted_shm_directory_is_one_warning_and_the_run_goes_on(shm, server_proc, holder):
    make_file(shm, 'a')
    proc = holder(shm)
    res = run(FakeTriton(shm, regions=[region('a')]), shm, server_proc.pid, stale=True, serialise=True)
    assert res['unregistered'] == ['a']
    warned = [w for w in res['warnings'] if 'not waiting for it' in w]
    assert len(warned) == 1 and f'pid {proc.pid}' in warned[0], res['warnings']


def test_check_mode_takes_no_lock(shm, server_proc):
    make_file(shm, 'a')
    other = lock_of(shm)
    other.acquire()
    try:
        res = run(
            FakeTriton(shm, regions=[region('a')]), shm, server_proc.pid, stale=True, check_mode=True, serialise=True
        )
    finally:
        other.release()
    assert res['unregistered'] == ['a']


# -- a lock another user holds (issue 26: 9) ----------------------------------------------------------


def test_a_directory_flock_another_user_holds_is_not_waited_for(holder):
    if os.geteuid() != 0 or not os.path.exists('/usr/bin/python3'):
        pytest.skip('needs root and a system python3 to hold the lock as another user')
    shm = tempfile.mkdtemp(prefix='runlock-', dir='/tmp')  # a directory every user reaches, as /dev/shm
    os.chmod(shm, 0o1777)
    try:
        proc = holder(
            shm, prefix=('setpriv', '--reuid', '65534', '--regid', '65534', '--clear-groups'), python='/usr/bin/python3'
        )
        clock = FakeClock()
        lock = lock_of(shm, sleep=clock.sleep, clock=clock.clock)
        assert lock.acquire() is False and clock.sleeps == [] and lock.fd is not None
        assert f'pid {proc.pid} (python3, uid 65534)' in lock.squatter
        st = os.stat(shm)
        assert runlock.lock_holders(st.st_dev, st.st_ino) == [proc.pid]
        lock.release()
    finally:
        os.rmdir(shm)


def test_lock_dir_of_other_users_is_their_own():
    assert runlock.lock_dir(0) == runlock.LOCK_DIR
    other = runlock.lock_dir(4242)
    assert other.endswith('tritonops_shm-4242') or other == '/run/user/4242/tritonops_shm'


# -- no root run without a lock (issue 40: 3) ------------------------------------------------------------


def _plant(where, what):
    """What another user (uid 65534) leaves at where before any run: its own directory, a symlink, a plain file."""
    if what == 'directory':
        os.mkdir(where, 0o777)
    elif what == 'symlink':
        os.symlink('/etc', where)
    else:
        with open(where, 'w') as f:
            f.write('mine')
    os.chown(where, 65534, 65534, follow_symlinks=False)


@pytest.fixture
def read_only_run(shm, tmp_path, monkeypatch):
    """/run cannot be made (as in the node agent's container); TMPDIR is a directory every user may write (mode 1777,
    as /tmp is). Returns TMPDIR."""
    monkeypatch.setattr(runlock, 'LOCK_DIR', '/proc/tritonops-no-such-dir/locks')  # mkdir there: ENOENT
    monkeypatch.setattr(runlock, 'lock_dir', lambda euid=None: runlock.LOCK_DIR)
    tmpdir = tmp_path / 'tmp'
    tmpdir.mkdir()
    tmpdir.chmod(0o1777)
    monkeypatch.setattr(tempfile, 'tempdir', str(tmpdir))
    for name in ('TMPDIR', 'TEMP', 'TMP'):
        monkeypatch.delenv(name, raising=False)
    return str(tmpdir)


@pytest.mark.parametrize('planted', [None, 'directory', 'symlink', 'file'])
def test_a_read_only_run_and_a_tmpdir_every_user_writes_is_no_lock_place_planted_or_not(shm, read_only_run, planted):
    """Before, root fell back to /tmp/tritonops_shm-0: a user who made that name first (a directory of their own, a
    symlink, a plain file) got every root run acting with no lock at all. A name any user can make first is no lock
    place, planted or not: a run that chose another place when it was planted would not exclude a run that did not."""
    where = os.path.join(read_only_run, f'tritonops_shm-{os.geteuid()}')
    if planted:
        _plant(where, planted)
    with pytest.raises(OSError) as err:
        lock_of(shm).acquire()
    assert 'writable by other users' in str(err.value) and 'plant' in str(err.value), err.value
    assert (os.listdir(read_only_run) == []) if planted is None else os.path.lexists(where)
    if planted == 'symlink':
        assert os.readlink(where) == '/etc' and not os.path.exists('/etc/' + os.path.basename(lock_of(shm).path))


@pytest.mark.parametrize('planted', ['directory', 'symlink', 'file'])
def test_a_planted_lock_dir_option_is_refused(shm, tmp_path, planted):
    """lock_dir given: the only place; another user's directory, a symlink or a file there is refused, never used."""
    where = str(tmp_path / 'locks')
    _plant(where, planted)
    with pytest.raises(OSError):
        runlock.ServerLock(shm_fs.pin(shm), directory=where).acquire()
    assert os.path.lexists(where) and (planted != 'directory' or os.listdir(where) == [])


def test_an_empty_dir_lock_place_is_made_private_and_a_planted_lock_file_replaced(shm, tmp_path):
    """The node agent mounts an emptyDir (mode 0777, root's) at /run/tritonops_shm: the run makes it 0700, and a lock
    file another user made there before is removed and made again (else they could remove it under a run, and the
    next run would lock another file)."""
    where = tmp_path / 'run' / 'tritonops_shm'
    where.mkdir(parents=True)
    where.chmod(0o777)
    lock = runlock.ServerLock(shm_fs.pin(shm), directory=str(where))
    _plant(lock.path, 'file')
    lock.acquire()
    try:
        assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
        st = os.stat(lock.path)
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600 and _locked(lock.path)
    finally:
        lock.release()


def test_a_run_with_no_lock_place_acts_not_and_says_which_option_gives_one(shm, server_proc, read_only_run):
    """The whole run: it fails with the reason and the option, and unregisters and removes nothing (before: a warning,
    then the run acted with no lock)."""
    make_file(shm, 'k', 4096)
    fake = FakeTriton(shm, [region('k', 'k', 4096)])
    ops_result = None
    with pytest.raises(LockError) as err:
        ops_result = run(fake, shm, server_proc.pid, state='absent', stale=True, serialise=True)
    assert ops_result is None
    assert 'lock_dir' in str(err.value) and 'shm_cleanup_lock_dir' in str(err.value) and 'not acting' in str(err.value)
    assert list(fake.regions) == ['k'] and os.listdir(shm) == ['k']


def test_the_chain_rule_lets_only_another_users_runs_use_a_sticky_parent(tmp_path):
    """Not root: with no runtime directory the lock goes to TMPDIR/tritonops_shm-UID as before (a sticky /tmp); a name
    another user made there first is refused by _open_lock_dir, never replaced by another place. Root never uses it."""
    tmpdir = tmp_path / 'tmp'
    tmpdir.mkdir()
    tmpdir.chmod(0o1777)
    assert runlock.chain_problem(str(tmpdir), euid=1000, sticky_parent=True) is None
    assert 'writable by other users' in runlock.chain_problem(str(tmpdir), euid=1000)
    tmpdir.chmod(0o777)
    (tmpdir / 'x').mkdir()
    assert 'not sticky' in runlock.chain_problem(str(tmpdir / 'x'), euid=1000)
    assert 'writable by other users' in runlock.chain_problem(str(tmpdir), euid=1000, sticky_parent=True)
    outside = tmp_path / 'theirs'
    outside.mkdir()
    os.chown(outside, 65534, 65534)
    assert 'belongs to uid 65534' in runlock.chain_problem(str(outside), euid=1000)
