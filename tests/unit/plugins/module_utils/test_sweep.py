"""triton_shm_sweep's parts (module_utils/run/sweep.py) on real directories, files and processes: the refusal, the plan, the
removal and check mode. The holders are this host's real processes (a child that maps a file); no server is faked."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError, ShmDirInUse
from ansible_collections.tritonops.shm.plugins.module_utils.run import sweep
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import run_steps
from ansible_collections.tritonops.shm.plugins.modules import triton_shm_sweep
from ansible_collections.tritonops.shm.tests.unit.plugins.module_args import patch_module_args
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.conftest import _rig

POOL = 'triton_python_backend_shm_region_4f5c1f8e-9b5d-4a63-8d0e-2d5c2f1a7b21'
CUSTOM = 'rank0_11111111-2222-3333-4444-555555555555'
AGED = 2.0  # seconds: the min_age of these tests; old files are waited for (_aged), young ones dated ahead
RIG = _rig()

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason='a private tmpfs and a complete holder scan need root')


@pytest.fixture
def shm(tmp_path):
    """A private tmpfs /dev/shm in a mount namespace of its own, held by a sleep (seen as /proc/PID/root/dev/shm): a
    directory no other process of the host can see, as a dead server's /dev/shm."""
    shell = 'mount -t tmpfs -o size=16m,mode=1777 tmpfs /dev/shm && touch /dev/shm/.ready && exec sleep infinity'
    holder = subprocess.Popen(['unshare', '--mount', '--propagation', 'private', 'sh', '-c', shell])
    d = f'/proc/{holder.pid}/root/dev/shm'
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(f'{d}/.ready'):
            assert holder.poll() is None and time.monotonic() < deadline, 'the tmpfs was not mounted within 10 s'
            time.sleep(0.02)
        os.unlink(f'{d}/.ready')
        yield Shm(d, str(tmp_path / 'locks'))
    finally:
        holder.kill()
        holder.wait(timeout=10)


class Shm:
    def __init__(self, path: str, lock_dir: str) -> None:
        self.path = path
        self.lock_dir = lock_dir

    def __truediv__(self, name: str):
        return pathlib.Path(self.path, name)

    def __str__(self) -> str:
        return self.path

    def __fspath__(self) -> str:
        return self.path


def _file(d, name: str, old: bool = True) -> str:
    """A 4 KiB file; old=False dates it ahead (RIG.keep_young), so it stays younger than min_age through every run.
    A file's age counts from the newest of its atime, mtime and ctime, which utime() cannot set back: _aged() waits."""
    path = os.path.join(d, name)
    with open(path, 'wb') as f:
        f.write(b'x' * 4096)
    if not old:
        RIG.keep_young(path)
    return path


def _aged(d) -> None:
    """Wait (bounded) until every file of d not dated ahead is older than AGED."""
    now = time.time()
    paths = [os.path.join(d, n) for n in os.listdir(d)]
    RIG.wait_older([p for p in paths if RIG.newest_time(p) <= now], AGED)


def _params(d, **kw) -> dict:
    p = dict(
        shm_dir=str(d),
        families=[],
        extra_families=[],
        backend_patterns=['triton_*_backend_shm_region_*'],
        client_users=[],
        min_age=AGED,
        clients_share_pid_namespace=False,
        lock_dir=getattr(d, 'lock_dir', None),
    )
    p.update(kw)
    return p


def _names(paths) -> list:
    return sorted(os.path.basename(p) for p in paths)


# -- the refusal ---------------------------------------------------------------------------------------------------


def test_a_process_whose_dev_shm_is_the_directorys_filesystem_refuses_the_sweep():
    """This very process has /dev/shm as its /dev/shm: taken as a server, it is found by the device."""
    if not os.path.isdir('/dev/shm'):
        pytest.skip('no /dev/shm')
    dev = os.stat('/dev/shm').st_dev
    uses = sweep.servers_using(dev, pids=[os.getpid()])
    assert [u.pid for u in uses] == [os.getpid()]
    message = sweep.refusal('/dev/shm', uses)
    assert f'pid {os.getpid()}' in message and 'Nothing was changed' in message


def test_another_filesystem_and_a_gone_process_do_not_refuse(tmp_path):
    other = os.stat(tmp_path).st_dev + 1_000_000  # no filesystem of this process
    assert sweep.servers_using(other, pids=[os.getpid()]) == []
    gone = subprocess.Popen([sys.executable, '-c', 'pass'])
    gone.wait()
    assert sweep.servers_using(os.stat('/').st_dev, pids=[gone.pid]) == []
    assert sweep.refusal('/x', []) is None


def test_an_unreadable_root_refuses(tmp_path):
    """A tritonserver whose root cannot be read: it cannot be shown not to use the directory."""
    proc = tmp_path / 'proc'
    (proc / '4242').mkdir(parents=True)  # listed, but no root to look into
    uses = sweep.servers_using(1, proc=str(proc), pids=[4242])
    assert [u.pid for u in uses] == [4242] and 'cannot be read' in uses[0].why


def test_a_dev_shm_that_is_a_symlink_in_the_servers_root_is_followed_there(tmp_path):
    """A server whose /dev/shm is a symlink (/dev/shm -> /run/shm, resolved inside its root) uses /run/shm."""
    root = tmp_path / 'root'
    (root / 'run' / 'shm').mkdir(parents=True)
    (root / 'dev').mkdir()
    os.symlink('/run/shm', root / 'dev' / 'shm')
    (tmp_path / 'proc' / '4242').mkdir(parents=True)
    os.symlink(root, tmp_path / 'proc' / '4242' / 'root')
    uses = sweep.servers_using(os.stat(root / 'run' / 'shm').st_dev, proc=str(tmp_path / 'proc'), pids=[4242])
    assert [u.pid for u in uses] == [4242] and 'runs with it as its /dev/shm' in uses[0].why


def test_tritonserver_pids_reads_comm_and_program():
    """Processes named tritonserver are found; this test's own process is not one."""
    assert os.getpid() not in sweep.tritonserver_pids()


# -- the plan and the removal, on a real directory -------------------------------------------------------------------


@needs_root
def test_sweep_removes_unheld_old_pools_only_and_check_mode_first_changes_nothing(shm):
    d = shm
    _file(d, POOL)
    _file(d, CUSTOM)
    _file(d, 'triton_python_backend_shm_region_young', old=False)
    _file(d, 'client_input0')
    _file(d, 'nccl-abc123')
    os.symlink('/etc/hostname', d / 'triton_python_backend_shm_region_link')
    params = _params(d, backend_patterns=['triton_*_backend_shm_region_*', 'rank0_*'])
    _aged(d)

    preview = run_steps(sweep.Sweep(params, check_mode=True), True)
    assert preview['changed'] is True
    assert _names(preview['removed_files']) == sorted([POOL, CUSTOM])
    assert (d / POOL).exists() and (d / CUSTOM).exists()
    assert preview['freed_bytes'] >= 8192

    done = run_steps(sweep.Sweep(params), False)
    assert done['changed'] is True and _names(done['removed_files']) == sorted([POOL, CUSTOM]), done
    kept = {os.path.basename(k['path']): k for k in done['kept']}
    assert set(kept) == {
        'triton_python_backend_shm_region_young',
        'client_input0',
        'nccl-abc123',
        'triton_python_backend_shm_region_link',
    }
    assert 'younger than min_age' in kept['triton_python_backend_shm_region_young']['reason']
    assert kept['triton_python_backend_shm_region_link']['category'] == 'foreign'
    assert os.path.islink(d / 'triton_python_backend_shm_region_link') and os.path.exists('/etc/hostname')
    assert done['kept_counts'] == {'backend': 1, 'foreign': 3}
    assert not any(n.startswith('.tritonops_shm.quarantine.') for n in os.listdir(d))

    again = run_steps(sweep.Sweep(params), False)
    assert again['changed'] is False and again['removed_files'] == []


@needs_root
def test_a_file_a_killed_sweep_left_under_its_quarantine_name_is_finished(shm):
    """Invariant 8: a run killed between its quarantine rename and its unlink; the next one removes the file."""
    path = _file(shm, POOL)
    quarantined = os.path.join(shm, f'.tritonops_shm.quarantine.{os.stat(path).st_ino}.0123456789ab')
    os.rename(path, quarantined)
    done = run_steps(sweep.Sweep(_params(shm)), False)
    assert done['removed_files'] == [quarantined] and not os.path.exists(quarantined), done


@needs_root
def test_families_are_opt_in_and_keep_their_grace_age(shm):
    d = shm
    _file(d, 'nccl-old')
    _file(d, 'nccl-young', old=False)
    _file(d, 'vllm_offload_1.mmap')
    _aged(d)
    done = run_steps(sweep.Sweep(_params(d, families=['nccl'])), False)
    assert _names(done['removed_files']) == ['nccl-old'], done
    kept = {os.path.basename(k['path']): k['reason'] for k in done['kept']}
    assert 'younger than min_age' in kept['nccl-young']
    assert 'vllm_offload_1.mmap' in kept


@needs_root
def test_a_held_pool_is_kept(shm):
    d = shm
    path = _file(d, POOL)
    holder = subprocess.Popen(
        [
            sys.executable,
            '-c',
            'import mmap, sys; f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 0); f.close(); '
            'print("ready", flush=True); sys.stdin.read()',
            path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == 'ready'
        _aged(d)
        done = run_steps(sweep.Sweep(_params(d)), False)
        assert done['changed'] is False and (d / POOL).exists()
        (kept,) = done['kept']
        assert kept['category'] == 'backend' and f'held by {holder.pid}' in kept['reason'], kept
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


@needs_root
def test_a_file_of_another_owner_is_kept(shm):
    """No borrowed authority: the directory is root's, the pool another user's, not among client_users."""
    d = shm
    os.chown(_file(d, POOL), 65534, 65534)
    _aged(d)
    done = run_steps(sweep.Sweep(_params(d)), False)
    assert done['changed'] is False and (d / POOL).exists()
    assert 'owned by uid 65534' in done['kept'][0]['reason']
    done = run_steps(sweep.Sweep(_params(d, client_users=['65534'])), False)
    assert _names(done['removed_files']) == [POOL]


@needs_root
def test_an_incomplete_scan_decides_nothing(shm):
    """Outside the host's initial PID namespace (here: the module's visibility judged from another proc) nothing goes."""
    d = shm
    _file(d, POOL)
    _aged(d)
    snap = sweep.read_dir(str(d))
    blind = snap.scan
    blind.unreadable.append(1)  # one process that could not be read
    planned = sweep.plan_sweep(snap, sweep.criteria_of(_params(d), orphans=False))
    assert planned.files == []
    assert any('it decides nothing' in w for w in planned.warnings)


def test_check_refuses_bad_parameters(tmp_path):
    with pytest.raises(ParameterError, match='absolute'):
        sweep.Sweep(_params('relative/dir')).check()
    with pytest.raises(ParameterError, match='no family'):
        sweep.Sweep(_params(tmp_path, families=['nosuch'])).check()
    with pytest.raises(ParameterError, match='min_age'):
        sweep.Sweep(_params(tmp_path, min_age=-1)).check()


def test_a_live_process_on_the_directory_stops_the_sweep_before_anything_is_read(tmp_path, monkeypatch):
    """read_dir raises ShmDirInUse (the module fails, also in check mode) when servers_using finds one."""
    d = tmp_path / 'shm'
    d.mkdir()
    _file(d, POOL)
    monkeypatch.setattr(sweep, 'tritonserver_pids', lambda proc='/proc': [os.getpid()])
    if os.stat('/dev/shm').st_dev != os.stat(d).st_dev:
        # this process's /dev/shm is not the directory's filesystem: not refused
        assert sweep.read_dir(str(d)).entries
    with pytest.raises(ShmDirInUse, match=f'pid {os.getpid()}'):
        sweep.read_dir('/dev/shm')


def test_in_use_skip_changes_nothing_and_says_why(monkeypatch):
    # a directory of this test's own on /dev/shm's filesystem (the device is what refuses): /dev/shm itself is shared
    # with every other run on the host, whose lock on it would add a warning of its own
    if not os.path.isdir('/dev/shm'):
        pytest.skip('no /dev/shm')
    d = tempfile.mkdtemp(prefix='tritonops-sweep-', dir='/dev/shm')
    try:
        monkeypatch.setattr(sweep, 'tritonserver_pids', lambda proc='/proc': [os.getpid()])
        warnings = []
        done = run_steps(sweep.Sweep(_params(d, in_use='skip'), warn=warnings.append), False)
        assert done['changed'] is False and done['removed_files'] == [] and done['kept'] == []
        assert f'pid {os.getpid()}' in done['in_use'] and warnings == [done['in_use']]
    finally:
        shutil.rmtree(d)


def test_the_module_fails_on_a_relative_directory(capsys):
    with patch_module_args(dict(shm_dir='relative')):
        with pytest.raises(SystemExit):
            triton_shm_sweep.main()
    out = capsys.readouterr().out
    result = json.loads(out[out.index('{') :])
    assert result['failed'] and 'absolute' in result['msg']


def _link_as_user(target: str, names: list) -> list:
    """In the tmpfs's mount namespace, as nobody: hard links to target under names in /dev/shm."""
    for name in names:
        os.link(target, f'/dev/shm/{name}')
    return sorted(os.listdir('/dev/shm'))


@needs_root
def test_a_hard_link_a_user_made_to_roots_file_is_not_a_pool_nor_a_quarantined_file(shm, as_nobody):
    """A hostile user links a file of root's (readable and writable by all, so protected_hardlinks lets anyone link it;
    elsewhere on the same tmpfs) under a pool name and under the collection's quarantine name for that very inode.
    Both names are root's file (uid 0, the directory's owner): neither is Triton's, and removing them would touch root's
    file (its ctime, its link count) and report bytes freed that are not. Kept, in check mode too."""
    d = shm
    os.mkdir(d / 'app', 0o755)
    target = d / 'app' / 'state'
    target.write_bytes(b'x' * 4096)
    os.chmod(target, 0o666)
    quarantine = f'.tritonops_shm.quarantine.{os.stat(target).st_ino}.0123456789ab'
    holder_pid = int(str(d).split('/')[2])
    planted = as_nobody(_link_as_user, '/dev/shm/app/state', [POOL, quarantine], setns_pid=holder_pid)
    assert planted == sorted([POOL, quarantine, 'app']), planted
    _aged(d)
    preview = run_steps(sweep.Sweep(_params(d), check_mode=True), True)
    assert preview['removed_files'] == [] and preview['changed'] is False, preview
    done = run_steps(sweep.Sweep(_params(d)), False)
    assert done['removed_files'] == [] and done['freed_bytes'] == 0, done
    assert os.stat(target).st_nlink == 3 and (d / POOL).exists() and (d / quarantine).exists()
    kept = {os.path.basename(k['path']): k['reason'] for k in done['kept']}
    assert 'hard links' in kept[POOL] and 'hard links' in kept[quarantine], kept
