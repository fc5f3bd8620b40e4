"""Unit tests for module_utils/host/procfs.py: raw /proc reads on this host's real /proc, and the one backoff loop.

The processes, sockets and files are real (this test process and children it starts, stopped by
pid); only the clock of the backoff tests is a fake, so that a 600 s budget takes no time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from test_region_ops import FakeClock

from ansible_collections.tritonops.shm.plugins.module_utils.host import procfs

# prints READY and waits, its comm set by prctl (as tritonserver's is its own name)
NAMED = textwrap.dedent("""
    import ctypes, sys, time
    ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
    print('READY', flush=True)
    time.sleep(600)
""")


@pytest.fixture
def named():
    procs = []

    def start(comm):
        proc = subprocess.Popen([sys.executable, '-c', NAMED, comm], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == 'READY'
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _gone_pid():
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, '-c', 'pass'])
    proc.wait()
    return proc.pid


# -- pids and names ---------------------------------------------------------------------------------


def test_list_pids_lists_live_processes_and_nothing_else(named):
    child = named('procfs-child')
    pids = procfs.list_pids()
    assert os.getpid() in pids and child.pid in pids
    assert all(isinstance(p, int) for p in pids)
    assert len(set(pids)) == len(pids), 'each process once; self, thread-self and the other entries are not pids'
    child.kill()
    child.wait()
    assert child.pid not in procfs.list_pids()


def test_list_pids_of_a_directory_that_cannot_be_listed_is_empty(tmp_path):
    assert procfs.list_pids(str(tmp_path / 'nope')) == []
    (tmp_path / '12').mkdir()
    (tmp_path / 'self').mkdir()
    assert procfs.list_pids(str(tmp_path)) == [12]


def test_read_comm_is_the_name_the_process_gave_itself(named):
    child = named('tritonserver')
    assert procfs.read_comm(child.pid) == 'tritonserver'
    with open(f'/proc/{os.getpid()}/comm') as f:
        assert procfs.read_comm(os.getpid()) == f.read().strip()


def test_read_comm_of_a_gone_process_is_none():
    assert procfs.read_comm(_gone_pid()) is None


# -- whole files -------------------------------------------------------------------------------------


def test_read_bytes_reads_a_proc_seq_file_to_its_end():
    """A seq_file read returns one buffer at a time: every read up to EOF is needed."""
    with open('/proc/self/mountinfo', 'rb') as f:
        want = f.read()
    assert procfs.read_bytes('/proc/self/mountinfo') == want


def test_read_bytes_reads_a_file_larger_than_one_read(tmp_path):
    path = tmp_path / 'big'
    data = os.urandom(300 * 1024)
    path.write_bytes(data)
    assert procfs.read_bytes(str(path)) == data
    (tmp_path / 'empty').write_bytes(b'')
    assert procfs.read_bytes(str(tmp_path / 'empty')) == b''


def test_read_bytes_raises_what_open_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        procfs.read_bytes(str(tmp_path / 'nope'))
    with pytest.raises(IsADirectoryError):
        procfs.read_bytes(str(tmp_path))


# -- sockets and network namespaces -----------------------------------------------------------------


def test_socket_inodes_are_the_inodes_of_the_sockets_a_process_has_open(tmp_path):
    with socket.socket() as sock, open(tmp_path / 'f', 'w'):
        inode = os.fstat(sock.fileno()).st_ino
        mine = procfs.socket_inodes(os.getpid())
        assert inode in mine
        assert procfs.socket_inodes('self') == mine
    assert inode not in procfs.socket_inodes(os.getpid())
    assert procfs.socket_inodes(_gone_pid()) == set()


def test_fd_count_is_the_number_of_open_descriptors():
    before = procfs.fd_count(os.getpid())
    if before == 0:
        pytest.skip('this kernel gives no descriptor count (Linux < 6.2)')
    with open(os.devnull) as _f:
        assert procfs.fd_count(os.getpid()) == before + 1
    assert procfs.fd_count(_gone_pid()) == 0


def test_child_pids_are_the_children_of_a_process(named):
    child = named('tops-child')
    assert child.pid in procfs.child_pids(os.getpid())
    assert procfs.child_pids(child.pid) == []
    assert procfs.child_pids(_gone_pid()) == []


def test_netns_inode_is_the_network_namespace_of_a_process(named):
    child = named('procfs-child')
    mine = os.stat('/proc/self/ns/net').st_ino
    assert procfs.netns_inode('self') == procfs.netns_inode(os.getpid()) == mine
    assert procfs.netns_inode(child.pid) == mine, 'a child shares its parent network namespace'
    assert procfs.netns_inode(_gone_pid()) is None


# -- the one retry loop ------------------------------------------------------------------------------


def _waits(backoff):
    while backoff.wait():
        pass
    return backoff.waited


def test_backoff_doubles_its_delay_up_to_the_cap_within_the_budget():
    clock = FakeClock()
    backoff = procfs.Backoff(timeout=10, sleep=clock.sleep, clock=clock.clock)
    assert _waits(backoff) == len(clock.sleeps)
    assert clock.sleeps[:6] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert set(clock.sleeps[5:]) == {1.0}
    assert sum(clock.sleeps) <= 10 < sum(clock.sleeps) + 1.0, 'never past the budget, and no delay left unused'


def test_backoff_by_number_of_tries():
    """attempts counts the tries: one fewer waits between them (the discovery trace's 0.6 s at most)."""
    clock = FakeClock()
    assert _waits(procfs.Backoff(attempts=6, first=0.02, cap=0.3, sleep=clock.sleep, clock=clock.clock)) == 5
    assert clock.sleeps == [0.02, 0.04, 0.08, 0.16, 0.3]
    clock = FakeClock()
    assert _waits(procfs.Backoff(attempts=1, sleep=clock.sleep, clock=clock.clock)) == 0
    assert clock.sleeps == []


def test_backoff_with_no_budget_gives_up_at_once():
    clock = FakeClock()
    assert procfs.Backoff(timeout=0, sleep=clock.sleep, clock=clock.clock).wait() is False
    assert procfs.Backoff(timeout=0, sleep=clock.sleep, clock=clock.clock, overrun=True).wait() is False
    assert clock.sleeps == []


def test_backoff_with_overrun_lets_the_whole_budget_pass():
    """The lock's loop: waits while the budget is not spent, so its give-up means the time really went by."""
    clock = FakeClock()
    _waits(procfs.Backoff(timeout=600, first=0.05, cap=0.5, sleep=clock.sleep, clock=clock.clock, overrun=True))
    assert clock.sleeps[:5] == [0.05, 0.1, 0.2, 0.4, 0.5]
    assert sum(clock.sleeps) >= 600 > sum(clock.sleeps[:-1])
    clock = FakeClock()
    _waits(procfs.Backoff(timeout=600, first=0.05, cap=0.5, sleep=clock.sleep, clock=clock.clock))
    assert sum(clock.sleeps) <= 600, 'without overrun the last delay stays within the budget'


def test_backoff_budget_counts_time_spent_outside_its_sleeps():
    clock = FakeClock()
    backoff = procfs.Backoff(timeout=1.0, sleep=clock.sleep, clock=clock.clock)
    assert backoff.wait() is True
    clock.now += 0.9  # the work between two tries took most of the budget
    assert backoff.wait() is False
    assert clock.sleeps == [0.05]
