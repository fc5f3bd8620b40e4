"""Unit tests for module_utils/runlock.py: one triton_shm_region run at a time per shm directory.

The locks are real flock(2) locks on real directories, held by this process or by another one;
only the clock is a fake, so that the 600 s wait takes no time. The tests of a whole run use
test_region_ops' fake Triton API and its real holder scan.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

# the whole-run helpers and fixtures (complete_scan is autouse there and here)
from test_region_ops import FakeClock, FakeTriton, make_file, region, run

from ansible_collections.tritonops.shm.plugins.module_utils import runlock, shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.errors import LockError

# server_proc, shm and complete_scan: conftest.py
pytestmark = pytest.mark.usefixtures('complete_scan')

# holds an exclusive flock on a directory until stdin closes (another run, in another process)
HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print('LOCKED', flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def holder():
    """holder(path): another process that holds the lock on path; it ends at teardown (stopped by pid)."""
    procs = []

    def start(path):
        proc = subprocess.Popen(
            [sys.executable, '-c', HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
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


# -- the lock itself -------------------------------------------------------------------------------


def test_a_free_lock_is_taken_at_once_and_released(shm):
    clock = FakeClock()
    lock = runlock.ShmDirLock(shm, sleep=clock.sleep, clock=clock.clock)
    assert lock.acquire() is False and clock.sleeps == []
    other = runlock.ShmDirLock(shm, sleep=clock.sleep, clock=clock.clock, wait_s=0)
    with pytest.raises(LockError):
        other.acquire()
    lock.release()
    lock.release()  # twice is harmless
    assert other.acquire() is False
    other.release()


def test_a_lock_held_by_another_process_is_waited_for_with_backoff(shm, holder):
    proc = holder(shm)
    clock = FakeClock()

    def sleep(seconds):
        clock.sleep(seconds)
        if len(clock.sleeps) == 6:
            proc.kill()  # the other run ends: the kernel drops its lock
            proc.wait()

    lock = runlock.ShmDirLock(shm, sleep=sleep, clock=clock.clock)
    assert lock.acquire() is True, 'it waited'
    lock.release()
    assert clock.sleeps == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]


def test_a_lock_held_for_the_whole_wait_fails_after_all_of_it(shm, holder):
    holder(shm)
    clock = FakeClock()
    before = _open_fds()
    lock = runlock.ShmDirLock(shm, sleep=clock.sleep, clock=clock.clock)
    with pytest.raises(LockError) as err:
        lock.acquire()
    assert str(err.value) == (
        f'another tritonops.shm run has held the lock on {shm} for 600.0s: not acting '
        '(it is released when that run ends)'
    )
    assert sum(clock.sleeps) >= runlock.WAIT_S > sum(clock.sleeps[:-1]), 'tried again once the whole wait had passed'
    assert max(clock.sleeps) == 0.5
    assert lock.fd is None and _open_fds() == before, 'the directory is closed again'


def test_a_missing_directory_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        runlock.ShmDirLock(str(tmp_path / 'nope')).acquire()
    (tmp_path / 'file').write_text('x')
    with pytest.raises(NotADirectoryError):
        runlock.ShmDirLock(str(tmp_path / 'file')).acquire()


# -- what a run does with it ------------------------------------------------------------------------


def test_a_run_waits_for_the_lock_then_plans_from_what_is_left(shm, server_proc):
    for name in ('a', 'b'):
        make_file(shm, name)
    fake = FakeTriton(shm, regions=[region('a'), region('b')])
    other = runlock.ShmDirLock(shm)
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
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_the_regions_are_read_under_the_lock(shm, server_proc):
    """A run takes the lock once the server is located, before it reads the regions: a run that read first and
    locked after could plan from what another run changed in between (make test at stop 31: two concurrent cleanups
    both reported the same 300 regions unregistered)."""
    make_file(shm, 'a')
    seen = []

    class Watched(FakeTriton):
        def status(self, kind):
            seen.append(_locked(shm))
            return super().status(kind)

    res = run(Watched(shm, regions=[region('a')]), shm, server_proc.pid, stale=True, serialise=True)
    assert res['unregistered'] == ['a']
    assert seen and seen[0] is True and all(seen), seen  # every status read, the first one included
    assert _locked(shm) is False  # released at the end


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
            other = runlock.ShmDirLock(shm, wait_s=0)
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
    other = runlock.ShmDirLock(shm)
    other.acquire()
    try:
        with pytest.raises(shm_fs.ShmFsError) as err:
            run(fake, shm, server_proc.pid, stale=True, serialise=True)
    finally:
        other.release()
    assert f'another tritonops.shm run has held the lock on {shm} for 600' in str(err.value)
    assert 'a' in fake.regions and os.listdir(shm) == ['a']


def test_the_lock_is_the_directory_itself_and_leaves_no_file(shm, server_proc):
    make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    before = os.listdir(os.path.dirname(shm))
    res = run(fake, shm, server_proc.pid, stale=True, serialise=True)
    assert res['unregistered'] == ['a'] and os.listdir(shm) == []
    assert os.listdir(os.path.dirname(shm)) == before
    # released: the next run takes it at once
    lock = runlock.ShmDirLock(shm)
    assert lock.acquire() is False
    lock.release()


def test_check_mode_takes_no_lock(shm, server_proc):
    make_file(shm, 'a')
    other = runlock.ShmDirLock(shm)
    other.acquire()
    try:
        res = run(
            FakeTriton(shm, regions=[region('a')]), shm, server_proc.pid, stale=True, check_mode=True, serialise=True
        )
    finally:
        other.release()
    assert res['unregistered'] == ['a']


# -- a lock another user holds (issue 26: 9) ----------------------------------------------------------


def test_a_lock_another_user_holds_is_not_waited_for(tmp_path_factory):
    if os.geteuid() != 0 or not os.path.exists('/usr/bin/python3'):
        pytest.skip('needs root and a system python3 to hold the lock as another user')
    shm = tempfile.mkdtemp(prefix='runlock-', dir='/tmp')  # a directory every user reaches, as /dev/shm
    os.chmod(shm, 0o1777)
    proc = subprocess.Popen(
        ['setpriv', '--reuid', '65534', '--regid', '65534', '--clear-groups', '/usr/bin/python3', '-c', HOLDER, shm],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == 'LOCKED'
        clock = FakeClock()
        lock = runlock.ShmDirLock(shm, sleep=clock.sleep, clock=clock.clock)
        assert lock.acquire() is False and clock.sleeps == [] and lock.fd is None
        assert f'pid {proc.pid} (uid 65534)' in lock.squatter
        st = os.stat(shm)
        assert runlock.lock_holders(st.st_dev, st.st_ino) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
        os.rmdir(shm)


def test_a_lock_a_root_process_holds_is_still_waited_for(shm, holder):
    proc = holder(shm)
    st = os.stat(shm)
    assert runlock.lock_holders(st.st_dev, st.st_ino) == [proc.pid]
    if os.geteuid() == 0:
        assert runlock.squatted(st.st_dev, st.st_ino) is None
