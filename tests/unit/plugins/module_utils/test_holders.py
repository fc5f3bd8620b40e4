"""Unit tests for module_utils/host/holders.py on this host's real /proc.

Mappings, open files, listening sockets and processes are real (this test process
and children it starts). Only the unreadable-process decision also uses a small
proc-like tree, because as root no real process is unreadable for a reason we
can choose; the real not-root case runs in a child that drops to uid 65534.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.host import holders, procfs

# A process that maps, opens or listens as asked, prints READY and waits; comm set by prctl.
CHILD = textwrap.dedent("""
    import ctypes, mmap, socket, sys, time
    mode, arg, comm = sys.argv[1], sys.argv[2], sys.argv[3]
    ctypes.CDLL(None).prctl(15, comm.encode(), 0, 0, 0)
    keep = []
    if mode == 'map':
        f = open(arg, 'r+b')
        keep.append(mmap.mmap(f.fileno(), 0))
        f.close()
    elif mode == 'open':
        keep.append(open(arg, 'rb'))
    elif mode == 'thread':   # a thread with its own fd table (unshare(CLONE_FILES)) holds the file open
        import os, threading
        held = threading.Event()
        def own_table():
            if ctypes.CDLL(None, use_errno=True).unshare(0x400) != 0:
                raise OSError(ctypes.get_errno(), 'unshare(CLONE_FILES)')
            keep.append(os.open(arg, os.O_RDONLY))
            held.set()
            time.sleep(600)
        threading.Thread(target=own_table, daemon=True).start()
        held.wait()
    elif mode == 'listen':
        host, port = arg.rsplit(':', 1)
        s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen(1)
        keep.append(s)
    print('READY', flush=True)
    time.sleep(600)
""")


@pytest.fixture
def child():
    """Start helper processes (optionally under a prefix like unshare); kill them by pid afterwards."""
    procs = []

    def start(mode, arg, comm='holdertest', prefix=()):
        proc = subprocess.Popen(
            list(prefix) + [sys.executable, '-c', CHILD, mode, arg, comm],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        line = proc.stdout.readline()
        if line.strip() != 'READY':
            proc.kill()
            raise RuntimeError(f'helper did not start: {line} {proc.stderr.read()}')
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def make_file(directory, name, size=8192):
    path = os.path.join(str(directory), name)
    with open(path, 'wb') as f:
        f.write(b'\1' * size)
    st = os.stat(path)
    return path, (st.st_dev, st.st_ino)


def map_file(path):
    """A shared mapping of the whole file in this process; closed at the end of a with block."""
    with open(path, 'r+b') as f:
        return mmap.mmap(f.fileno(), 0)


# -- device formatting ------------------------------------------------------------------------


@pytest.mark.parametrize(
    'major,minor,maps,mountinfo',
    [
        (0, 45, '00:2d', '0:45'),
        (8, 1, '08:01', '8:1'),
        (259, 3, '103:03', '259:3'),
        (0, 300, '00:12c', '0:300'),
    ],
)
def test_dev_formats(major, minor, maps, mountinfo):
    dev = os.makedev(major, minor)
    assert holders.dev_maps_str(dev) == maps
    assert holders.dev_mountinfo_str(dev) == mountinfo


def test_dev_maps_str_matches_the_kernels_maps_line(tmp_path):
    path, (dev, ino) = make_file(tmp_path, 'mapped')
    with map_file(path), open('/proc/self/maps') as f:
        line = [ln for ln in f if ln.rstrip().endswith(path)][0]
    fields = line.split()
    assert fields[3] == holders.dev_maps_str(dev)
    assert int(fields[4]) == ino


def test_dev_mountinfo_str_matches_a_mountinfo_line(tmp_path):
    dev = os.stat(str(tmp_path)).st_dev
    with open('/proc/self/mountinfo') as f:
        devs = [ln.split()[2] for ln in f]
    assert holders.dev_mountinfo_str(dev) in devs


# -- the one /proc pass -------------------------------------------------------------------------


def test_scan_finds_this_process_by_its_mapping(tmp_path):
    path, key = make_file(tmp_path, 'mapped')
    _other, other_key = make_file(tmp_path, 'not_held')
    with map_file(path):
        result = holders.scan([key, other_key])
    assert os.getpid() in result.holders[key]
    assert other_key not in result.holders
    assert result.comms[os.getpid()] == procfs.read_comm(os.getpid())
    assert result.processes >= 1
    assert os.getpid() not in result.unreadable
    assert result.holders_of(*key, exclude=(os.getpid(),)) == [
        h for h in result.holders_of(*key) if h['pid'] != os.getpid()
    ]


def test_scan_finds_an_open_file_without_mapping_and_a_mapping_after_unlink(tmp_path):
    path, key = make_file(tmp_path, 'opened')
    path2, key2 = make_file(tmp_path, 'unlinked')
    with map_file(path2):
        os.unlink(path2)
        with open(path, 'rb'):
            result = holders.scan([key, key2])
    assert os.getpid() in result.holders[key]
    assert os.getpid() in result.holders[key2], 'matched on (dev, ino), not on the path'


def test_scan_finds_child_processes_and_forgets_them_when_they_die(tmp_path, child):
    path, key = make_file(tmp_path, 'shared')
    mapper = child('map', path, comm='mapper')
    opener = child('open', path, comm='opener')
    result = holders.scan([key])
    pids = result.holders[key]
    assert mapper.pid in pids and opener.pid in pids
    assert {h['pid']: h['comm'] for h in result.holders_of(*key) if h['pid'] in (mapper.pid, opener.pid)} == {
        mapper.pid: 'mapper',
        opener.pid: 'opener',
    }
    assert [h['pid'] for h in result.holders_of(*key, exclude=(mapper.pid,))] == [opener.pid]
    mapper.kill()
    mapper.wait()
    assert mapper.pid not in holders.scan([key]).holders.get(key, set())


def test_scan_without_targets_reads_nothing():
    result = holders.scan([])
    assert result.processes == 0 and result.holders == {} and result.complete


# -- the parts of the pass: maps, fds, and the unreadable rule ----------------------------------------


def test_targets_print_their_devices_as_maps_and_mountinfo_do():
    shm, tmp = os.makedev(0, 0x2D), os.makedev(8, 1)
    one = holders.Targets([(shm, 101), (shm, 102)])
    assert one.devs == {shm} and one.map_devs == {b'00:2d': shm} and one.mount_devs == {'0:45'}
    assert one.needle == b' 00:2d ' and one.needles == [b' 00:2d ']
    two = holders.Targets([(shm, 101), (tmp, 103)])
    assert two.needle is None and sorted(two.needles) == [b' 00:2d ', b' 08:01 ']


@pytest.mark.parametrize(
    'keys,want',
    [
        ([(os.makedev(0, 0x2D), 101)], [(os.makedev(0, 0x2D), 101)]),  # unlinked: matched all the same
        ([(os.makedev(0, 0x2D), 102), (os.makedev(0, 0x2D), 999)], [(os.makedev(0, 0x2D), 102)]),
        ([(os.makedev(0, 0x2D), 103)], []),  # inode 103 is on another device
        ([(os.makedev(8, 1), 103), (os.makedev(0, 0x2D), 104)], [(os.makedev(0, 0x2D), 104), (os.makedev(8, 1), 103)]),
        ([(os.makedev(0, 0x2E), 101)], []),  # the device is in no line
    ],
)
def test_maps_holding_matches_device_and_inode_not_the_path(keys, want):
    assert sorted(holders.maps_holding(MAPS, holders.Targets(keys))) == want


def test_maps_holding_of_an_empty_or_unreadable_maps_is_nothing():
    targets = holders.Targets([(os.makedev(0, 0x2D), 101)])
    assert holders.maps_holding(b'', targets) == set()
    assert holders.maps_holding(MAPS.replace(b' 00:2d ', b' 00:2e '), targets) == set()


def test_maps_holding_reads_a_real_maps(tmp_path):
    path, key = make_file(tmp_path, 'mapped')
    _other, other_key = make_file(tmp_path, 'not_mapped')
    with map_file(path):
        got = holders.maps_holding(procfs.read_bytes('/proc/self/maps'), holders.Targets([key, other_key]))
    assert got == {key}


def test_fds_holding_matches_the_open_files_by_device_and_inode(tmp_path):
    path, key = make_file(tmp_path, 'opened')
    _other, other_key = make_file(tmp_path, 'closed')
    with open(path, 'rb') as f:
        fds = holders._open_fds(f'/proc/{os.getpid()}/fd/')
        assert holders.fds_holding(fds.values(), holders.Targets([key, other_key])) == {key}
        assert holders.fds_holding([os.fstat(f.fileno())], holders.Targets([other_key])) == set()
    assert holders.fds_holding([], holders.Targets([key])) == set()


def test_unreadable_counts_when_its_mount_namespace_shows_the_device_or_cannot_be_read(tmp_path):
    proc = str(tmp_path)
    _fake_proc(proc, 10, mountinfo='30 25 0:77 / /dev/shm rw - tmpfs tmpfs rw\n')
    _fake_proc(proc, 11, mountinfo='30 25 0:78 / /dev/shm rw - tmpfs tmpfs rw\n')
    _fake_proc(proc, 12)
    _fake_proc(proc, 13)
    os.mkdir(os.path.join(proc, '13', 'mountinfo'))
    assert holders.unreadable_counts(10, {'0:77'}, proc) is True
    assert holders.unreadable_counts(11, {'0:77'}, proc) is False, 'its namespace cannot reach the shm filesystem'
    assert holders.unreadable_counts(12, {'0:77'}, proc) is False, 'gone meanwhile'
    assert holders.unreadable_counts(13, {'0:77'}, proc) is True, 'cannot tell: it counts'


def test_unreadable_counts_on_this_hosts_mountinfo(tmp_path):
    dev = os.stat(str(tmp_path)).st_dev
    assert holders.unreadable_counts(os.getpid(), {holders.dev_mountinfo_str(dev)}) is True
    assert holders.unreadable_counts(os.getpid(), {'4095:1048575'}) is False


def test_deleted_mappings_reports_unlinked_files_under_the_prefix(tmp_path):
    path, key = make_file(tmp_path, 'gone region')
    kept, _kept_key = make_file(tmp_path, 'kept')
    with map_file(path), map_file(kept):
        os.unlink(path)
        got = holders.deleted_mappings(os.getpid(), path_prefix=str(tmp_path) + '/')
    assert got == {'gone region': key}
    assert holders.deleted_mappings(os.getpid(), path_prefix='/nonexistent-prefix/') == {}


MAPS = (
    b'7f0000000000-7f0000001000 rw-s 00000000 00:2d 101                        /dev/shm/gone region (deleted)\n'
    b'7f0000001000-7f0000002000 rw-s 00000000 00:2d 102                        /dev/shm/kept\n'
    b'7f0000002000-7f0000003000 rw-s 00000000 08:01 103                        /tmp/elsewhere (deleted)\n'
    b'7f0000003000-7f0000004000 rw-s 00000000 00:2d 104                        /dev/shm/caf\xc3\xa9 (deleted)\n'
    b'7f0000004000-7f0000005000 rw-p 00000000 00:00 0 \n'
)


def test_parse_deleted_reads_unlinked_files_under_the_prefix_from_maps_bytes():
    assert holders.parse_deleted(MAPS) == {
        'gone region': (os.makedev(0, 0x2D), 101),
        'caf\u00e9': (os.makedev(0, 0x2D), 104),
    }
    assert holders.parse_deleted(MAPS, '/tmp/') == {'elsewhere': (os.makedev(8, 1), 103)}
    assert holders.parse_deleted(MAPS.replace(b' (deleted)', b'')) == {}


def test_scan_reports_the_deleted_mappings_of_the_process_it_is_given_and_their_holders(tmp_path, child):
    path, key = make_file(tmp_path, 'gone region')
    kept_path, kept_key = make_file(tmp_path, 'kept')
    mapper = child('map', path, comm='mapper')
    with map_file(path):
        os.unlink(path)
        with open(kept_path, 'rb'):
            result = holders.scan([kept_key], deleted_of=os.getpid(), deleted_prefix=str(tmp_path) + '/')
            alone = holders.deleted_mappings(os.getpid(), path_prefix=str(tmp_path) + '/')
    assert result.deleted == alone == {'gone region': key}
    assert {os.getpid(), mapper.pid} <= result.holders[key], 'the unlinked file is scanned for in every process'
    assert os.getpid() in result.holders[kept_key]
    assert holders.scan([kept_key]).deleted == {}


def _listed_fds(fd_dir):
    out = {}
    for name in os.listdir(fd_dir):
        try:
            st = os.stat(fd_dir + name)
        except OSError:
            continue
        out[name] = (st.st_dev, st.st_ino)
    return out


def test_open_fds_are_those_the_fd_directory_lists(tmp_path, child, monkeypatch):
    path, key = make_file(tmp_path, 'held')
    opener = child('open', path)
    fd_dir = f'/proc/{opener.pid}/fd/'
    want = _listed_fds(fd_dir)
    assert key in want.values()
    # asked in a quiet process of its own: this one's threads (earlier tests' servers) open and close descriptors
    root = holders.__file__.rsplit('/ansible_collections/', 1)[0]
    ask = 'from ansible_collections.tritonops.shm.plugins.module_utils.host import holders; print(holders.fd_counts())'
    env = dict(os.environ, PYTHONPATH=root)
    counted = subprocess.run(
        [sys.executable, '-c', ask], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    assert counted == str(os.stat(fd_dir).st_size == len(want)), 'Linux >= 6.2 counts the descriptors'
    assert {name: (st.st_dev, st.st_ino) for name, st in holders._open_fds(fd_dir).items()} == want
    if counted and sorted(want) == [str(i) for i in range(len(want))]:
        monkeypatch.setattr(holders.os, 'listdir', None)  # counted, no gap: no listing needed
    got = holders._open_fds(fd_dir, counted)
    assert {name: (st.st_dev, st.st_ino) for name, st in got.items()} == want


def test_open_fds_with_a_gap_are_those_the_fd_directory_lists(tmp_path):
    path, key = make_file(tmp_path, 'held')
    fds = [os.open(path, os.O_RDONLY) for _i in range(4)]
    os.close(fds.pop(1))
    try:
        fd_dir = f'/proc/{os.getpid()}/fd/'
        got = holders._open_fds(fd_dir, holders.fd_counts())
        want = _listed_fds(fd_dir)  # the listing's own descriptor is closed again before the stat: not in it
    finally:
        for fd in fds:
            os.close(fd)
    assert {name: (st.st_dev, st.st_ino) for name, st in got.items()} == want
    assert [want[str(fd)] for fd in fds] == [key] * 3


def test_open_fds_of_a_plain_directory_lists_it(tmp_path):
    fd_dir = tmp_path / 'fd'
    fd_dir.mkdir()
    (fd_dir / '0').write_text('x')
    assert sorted(holders._open_fds(str(fd_dir) + '/', True)) == ['0']
    with pytest.raises(FileNotFoundError):
        holders._open_fds(str(tmp_path / 'nope') + '/', True)
    assert holders.fd_counts(str(tmp_path)) is False


# -- the unreadable-process rule ------------------------------------------------------------------


def _fake_proc(root, pid, maps=None, mountinfo=None):
    """A proc-like entry: maps=None makes maps unreadable (a directory), mountinfo=None leaves it out."""
    base = os.path.join(root, str(pid))
    os.makedirs(os.path.join(base, 'fd'))
    if maps is None:
        os.mkdir(os.path.join(base, 'maps'))
    else:
        with open(os.path.join(base, 'maps'), 'w') as f:
            f.write(maps)
    if mountinfo is not None:
        with open(os.path.join(base, 'mountinfo'), 'w') as f:
            f.write(mountinfo)
    with open(os.path.join(base, 'comm'), 'w') as f:
        f.write(f'p{pid}\n')


def test_unreadable_process_counts_only_when_its_mount_namespace_can_see_the_device(tmp_path):
    dev, ino = os.makedev(0, 77), 4242
    sees = '30 25 0:77 / /dev/shm rw - tmpfs tmpfs rw\n'
    blind = '30 25 0:78 / /dev/shm rw - tmpfs tmpfs rw\n'
    proc = str(tmp_path)
    _fake_proc(proc, 10, maps=None, mountinfo=sees)  # unreadable, could hold: counts
    _fake_proc(proc, 11, maps=None, mountinfo=blind)  # unreadable, cannot reach the fs: ignored
    _fake_proc(proc, 12, maps=None, mountinfo=None)  # gone while scanning: ignored
    _fake_proc(proc, 13, maps=f'7f00-7f01 rw-s 00000000 00:4d {ino} /dev/shm/x\n', mountinfo=sees)  # readable holder
    _fake_proc(proc, 14, maps=None)
    os.mkdir(os.path.join(proc, '14', 'mountinfo'))  # mountinfo unreadable too: cannot tell, counts
    result = holders.scan([(dev, ino)], proc=proc)
    assert sorted(result.unreadable) == [10, 14]
    assert sorted(result.unreadable_ignored) == [11, 12]
    assert result.holders == {(dev, ino): {13}}
    assert result.comms == {13: 'p13'}
    assert not result.complete
    assert result.incomplete_reason().startswith(
        '2 process(es) could not be inspected (pids 10, 14): run the module as root'
    )


def test_incomplete_reason_lists_at_most_five_pids():
    result = holders.HolderScan()
    result.unreadable = list(range(100, 107))
    assert '(pids 100, 101, 102, 103, 104, ...)' in result.incomplete_reason()
    assert holders.HolderScan().incomplete_reason() is None


def _scan_summary(key, proc='/proc'):
    r = holders.scan([tuple(key)], proc=proc)
    return dict(
        unreadable=r.unreadable,
        holders=sorted(r.holders.get(tuple(key), [])),
        complete=r.complete,
        hidden=r.hidden,
        reason=r.incomplete_reason(),
    )


def test_not_root_a_root_holder_is_unreadable_and_the_scan_incomplete(child, as_nobody):
    d = tempfile.mkdtemp(prefix='holders-')
    try:
        os.chmod(d, 0o755)
        path, key = make_file(d, 'root_holds')
        holder = child('map', path, comm='rootclient')
        got = as_nobody(_scan_summary, list(key))
        as_root = _scan_summary(list(key))
    finally:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
    assert 'error' not in got, got
    assert as_root['holders'] == [holder.pid] and holder.pid not in as_root['unreadable']
    assert got['holders'] == [], 'root processes cannot be read by another user'
    assert holder.pid in got['unreadable']
    assert got['complete'] is False
    assert 'run the module as root' in got['reason']


def test_not_root_hidepid_makes_the_scan_incomplete(as_nobody):
    proc = tempfile.mkdtemp(prefix='fakeproc-')
    try:
        os.chmod(proc, 0o755)
        os.mkdir(os.path.join(proc, 'self'))
        with open(os.path.join(proc, 'self', 'mountinfo'), 'w') as f:
            f.write(
                '22 27 0:21 / /sys rw - sysfs sysfs rw\n'
                f'23 27 0:22 / {proc} rw,nosuid,nodev,noexec - proc proc rw,hidepid=invisible\n'
            )
        os.chmod(os.path.join(proc, 'self', 'mountinfo'), 0o644)
        got = as_nobody(lambda: dict(opt=holders.proc_hidepid(proc), scan=_scan_summary([1, 2], proc)))
        as_root = holders.proc_hidepid(proc)
    finally:
        os.unlink(os.path.join(proc, 'self', 'mountinfo'))
        os.rmdir(os.path.join(proc, 'self'))
        os.rmdir(proc)
    assert as_root is None, 'root sees every process whatever hidepid says'
    assert got['opt'] == 'hidepid=invisible'
    assert got['scan']['hidden'] is True and got['scan']['complete'] is False
    assert 'hidepid=invisible' in got['scan']['reason'] and 'not run as root' in got['scan']['reason']


# -- threads with their own fd table (issue 26: 9) ----------------------------------------------------


def test_scan_finds_a_thread_holding_the_file_in_its_own_fd_table(tmp_path, child):
    path, key = make_file(tmp_path, 'threaded')
    proc = child('thread', path)
    # the process's fd directory (its main thread's table) does not show it
    assert path not in [os.path.realpath(f'/proc/{proc.pid}/fd/{n}') for n in os.listdir(f'/proc/{proc.pid}/fd')]
    assert [d.split('/')[-3] for d in holders.other_fd_tables('/proc', proc.pid)] != []
    scan = holders.scan([key])
    assert proc.pid in scan.holders.get(key, set())


def test_other_fd_tables_of_threads_sharing_the_table_is_nothing(tmp_path, child):
    path, _key = make_file(tmp_path, 'plain')
    proc = child('open', path)
    assert holders.other_fd_tables('/proc', proc.pid) == []
    assert holders.other_fd_tables('/proc', os.getpid()) == []


# -- a thread-group leader that has exited (issue 40: 1) ------------------------------------------------

LEADER_EXIT_C = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
    'rig',
    'leader_exit.c',
)


@pytest.fixture
def leader_exit(tmp_path):
    """Start leader_exit.c (built with cc): its main thread exits, a worker maps and writes the file; killed after."""
    program = str(tmp_path / 'leader_exit')
    subprocess.run(['cc', '-O2', '-pthread', '-o', program, LEADER_EXIT_C], check=True, capture_output=True)
    procs = []

    def start(path, fd_mode):
        proc = subprocess.Popen([program, path, '8192', fd_mode], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().startswith('READY')
        for _attempt in range(1000):  # the main thread ends right after READY: wait for the kernel to show it
            with open(f'/proc/{proc.pid}/maps', 'rb') as f:
                if not f.read():
                    break
            os.sched_yield()
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize('fd_mode', ['close', 'keep'])
def test_scan_sees_a_live_worker_whose_main_thread_has_exited(tmp_path, leader_exit, fd_mode):
    path, key = make_file(tmp_path, f'leader-{fd_mode}')
    proc = leader_exit(path, fd_mode)
    # what the kernel shows of the process itself: no mapping, no descriptor, no error
    with open(f'/proc/{proc.pid}/maps', 'rb') as f:
        assert f.read() == b''
    assert os.listdir(f'/proc/{proc.pid}/fd') == []
    assert path.encode() in procfs.read_maps(proc.pid)
    scan = holders.scan([key])
    assert proc.pid in scan.holders.get(key, set()), 'the worker thread maps and writes the file'
    assert proc.pid not in scan.unreadable
    assert holders.deleted_mappings(proc.pid, str(tmp_path) + '/') == {}
    os.unlink(path)
    assert holders.deleted_mappings(proc.pid, str(tmp_path) + '/') == {f'leader-{fd_mode}': key}


def _fake_task_tree(root, leader_maps=b'', views=()):
    """A proc-like tree for pid 10: /proc/10/maps and one task dir per view (bytes: its maps; None: unreadable)."""
    base = os.path.join(str(root), '10')
    os.makedirs(os.path.join(base, 'task', '10'))
    with open(os.path.join(base, 'maps'), 'wb') as f:
        f.write(leader_maps)
    for i, view in enumerate(views):
        task = os.path.join(base, 'task', str(11 + i))
        os.makedirs(task)
        if view is None:
            os.mkdir(os.path.join(task, 'maps'))  # reading it fails, and not because the thread ended
        else:
            with open(os.path.join(task, 'maps'), 'wb') as f:
                f.write(view)
    return str(root)


def test_read_maps_of_an_exited_leader_is_a_live_tasks_view_or_unreadable(tmp_path):
    line = b'7f0000000000-7f0000002000 rw-s 00000000 00:1a 42 /dev/shm/k\n'
    assert procfs.read_maps(10, _fake_task_tree(tmp_path / 'a', b'', [None, line])) == line
    assert procfs.read_maps(10, _fake_task_tree(tmp_path / 'b', line, [None])) == line, 'the leader is alive'
    assert procfs.read_maps(10, _fake_task_tree(tmp_path / 'c', b'', [])) == b'', 'one task, no memory'
    with pytest.raises(OSError):
        procfs.read_maps(10, _fake_task_tree(tmp_path / 'd', b'', [None, None]))
