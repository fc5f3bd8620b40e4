"""Unit tests for module_utils/host/shm_fs.py on real temporary directories."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import stat
import tempfile
import time

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ShmFsError
from ansible_collections.tritonops.shm.plugins.module_utils.host import shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.host.shm_fs import ShmDir
from ansible_collections.tritonops.shm.plugins.module_utils.rules import facts


def test_usage_matches_statvfs(tmp_path):
    got = shm_fs.usage(str(tmp_path))
    st = os.statvfs(str(tmp_path))
    assert got['path'] == str(tmp_path)
    assert got['total_bytes'] == st.f_blocks * st.f_frsize
    assert got['free_bytes'] == st.f_bavail * st.f_frsize
    assert got['used_bytes'] == (st.f_blocks - st.f_bfree) * st.f_frsize
    assert got['used_percent'] == round(100.0 * got['used_bytes'] / got['total_bytes'], 2)


def test_usage_of_missing_dir_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        shm_fs.usage(str(tmp_path / 'missing'))


@pytest.mark.parametrize(
    'key,name',
    [
        ('/input0', 'input0'),
        ('/PostgreSQL.1234', 'PostgreSQL.1234'),
        ('/a b', 'a b'),
        ('/..x', '..x'),
    ],
)
def test_key_to_name_accepts_one_component(key, name):
    assert facts.key_to_name(key) == name


@pytest.mark.parametrize(
    'key,why',
    [
        ('', 'non-empty'),
        (None, 'non-empty'),
        ('input0', 'must start with "/"'),
        ('/', 'exactly one path component'),
        ('/a/b', 'exactly one path component'),
        ('/../etc/passwd', 'exactly one path component'),
        ('/..', 'outside the shm directory'),
        ('/.', 'outside the shm directory'),
        ('/a\x00b', 'NUL'),
    ],
)
def test_key_to_name_refuses_unsafe_keys(key, why):
    with pytest.raises(ShmFsError, match=why.replace('"', '.').replace('(', '.')):
        facts.key_to_name(key)


@pytest.mark.parametrize('name', ['', '.', '..', 'a/b', '/abs', 'a\x00'])
def test_check_name_refuses_anything_but_one_component(name):
    with pytest.raises(ShmFsError, match='unsafe file name'):
        shm_fs.check_name(name)


def make_tree(d):
    """A directory with one entry of every kind, ages set on purpose."""
    with open(os.path.join(d, 'regular'), 'wb') as f:
        f.write(b'x' * 5000)
    os.mkfifo(os.path.join(d, 'fifo'))
    os.mkdir(os.path.join(d, 'directory'))
    os.symlink('regular', os.path.join(d, 'symlink'))
    os.symlink('/nonexistent/target', os.path.join(d, 'broken'))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(d, 'socket'))
    sock.close()
    old = time.time() - 1000
    os.utime(os.path.join(d, 'regular'), (old, old))
    return old


def test_list_entries_lstats_every_kind_and_never_follows(tmp_path):
    d = str(tmp_path)
    old = make_tree(d)
    now = time.time()
    entries = {e['name']: e for e in shm_fs.list_entries(d, now=now)}
    assert sorted(entries) == ['broken', 'directory', 'fifo', 'regular', 'socket', 'symlink']
    assert [
        e['type'] for e in (entries[n] for n in ('regular', 'fifo', 'directory', 'symlink', 'broken', 'socket'))
    ] == ['file', 'fifo', 'directory', 'symlink', 'symlink', 'socket']
    reg = entries['regular']
    st = os.lstat(os.path.join(d, 'regular'))
    assert reg['path'] == os.path.join(d, 'regular')
    assert (reg['size'], reg['inode'], reg['dev'], reg['uid']) == (5000, st.st_ino, st.st_dev, st.st_uid)
    assert reg['allocated_bytes'] == st.st_blocks * 512
    assert reg['mode'] == f'{stat.S_IMODE(st.st_mode):04o}'
    assert reg['mtime'] == pytest.approx(old, abs=1e-3)
    # the age counts from the newest time: utime() set mtime back, and ctime to now (issue 42, goal 8)
    assert (reg['age_s'], reg['age_from']) == (pytest.approx(max(0.0, now - st.st_ctime), abs=0.01), 'ctime')
    link = entries['symlink']
    assert link['inode'] == os.lstat(os.path.join(d, 'symlink')).st_ino != reg['inode']
    assert link['size'] == len('regular')


def test_list_entries_is_sorted_and_age_never_negative(tmp_path):
    d = str(tmp_path)
    for name in ('c', 'a', 'b'):
        open(os.path.join(d, name), 'w').close()
    future = time.time() + 500
    os.utime(os.path.join(d, 'b'), (future, future))
    entries = shm_fs.list_entries(d)
    assert [e['name'] for e in entries] == ['a', 'b', 'c']
    assert entries[1]['age_s'] == 0.0


def test_age_counts_from_the_newest_of_atime_mtime_and_ctime(tmp_path):
    """As systemd-tmpfiles ages files: a file read, written, or renamed or chmod'ed since is young (issue 42, goal 8)."""
    path = str(tmp_path / 'f')
    open(path, 'w').close()
    t = time.time()
    later = t + 60

    def aged():
        (e,) = shm_fs.list_entries(str(tmp_path), now=later)
        return e['age_s'], e['age_from']

    os.utime(path, (t + 50, t - 3600))  # read 50 s from now, written an hour ago
    assert aged() == (pytest.approx(10.0, abs=0.01), 'atime')
    os.utime(path, (t - 3600, t + 40))  # written 40 s from now
    assert aged() == (pytest.approx(20.0, abs=0.01), 'mtime')
    os.utime(path, (t - 3600, t - 3600))  # both an hour back: ctime (the utime itself, now) is the newest
    ctime = os.lstat(path).st_ctime
    assert aged() == (pytest.approx(later - ctime, abs=0.01), 'ctime')
    assert aged()[0] < 61


def test_shm_dir_create_is_exclusive_and_sized(tmp_path):
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('region', 1 << 20, mode=0o640)
        assert st.st_size == 1 << 20
        assert stat.S_IMODE(os.lstat(str(tmp_path / 'region')).st_mode) == 0o640
        assert sd.lstat('region').st_ino == st.st_ino
        with pytest.raises(ShmFsError, match='cannot create region .*File exists'):
            sd.create('region', 10)
        assert os.path.getsize(str(tmp_path / 'region')) == 1 << 20, 'an existing file is never truncated'
        assert sd.lstat('missing') is None
    assert sd.fd is None


def test_shm_dir_create_never_follows_a_symlink(tmp_path):
    outside = tmp_path / 'outside'
    outside.mkdir()
    shm = tmp_path / 'shm'
    shm.mkdir()
    os.symlink(str(outside / 'target'), str(shm / 'link'))
    with ShmDir(str(shm)) as sd:
        with pytest.raises(ShmFsError, match='cannot create link'):
            sd.create('link', 4096)
    assert not (outside / 'target').exists()


def test_shm_dir_unlink_removes_only_the_classified_file(tmp_path):
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('victim', 8192)
        with open(str(tmp_path / 'victim'), 'r+b') as f:
            f.write(b'y' * 8192)
        allocated = os.lstat(str(tmp_path / 'victim')).st_blocks * 512
        assert sd.unlink('victim', st.st_dev, st.st_ino) == allocated
        assert not (tmp_path / 'victim').exists()
        assert sd.unlink('victim', st.st_dev, st.st_ino) == 0, 'already gone is not an error'


def test_shm_dir_unlink_refuses_a_replaced_file(tmp_path):
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('r', 10)
        os.rename(str(tmp_path / 'r'), str(tmp_path / 'r.old'))  # keeps its inode from being reused
        sd.create('r', 10)
        with pytest.raises(ShmFsError, match='was replaced since it was checked'):
            sd.unlink('r', st.st_dev, st.st_ino)
        assert (tmp_path / 'r').exists()


@pytest.mark.parametrize('kind', ['symlink', 'directory', 'fifo'])
def test_shm_dir_unlink_refuses_non_regular_entries(tmp_path, kind):
    target = tmp_path / 'target'
    target.write_bytes(b'keep')
    path = str(tmp_path / 'entry')
    if kind == 'symlink':
        os.symlink(str(target), path)
    elif kind == 'directory':
        os.mkdir(path)
    else:
        os.mkfifo(path)
    st = os.lstat(path)
    with ShmDir(str(tmp_path)) as sd:
        with pytest.raises(ShmFsError, match=f'is a {kind}, not a regular file'):
            sd.unlink('entry', st.st_dev, st.st_ino)
    assert os.path.lexists(path)
    assert target.read_bytes() == b'keep'


@pytest.mark.parametrize('name', ['../escape', '..', 'sub/file', ''])
def test_shm_dir_refuses_names_outside_the_dir(tmp_path, name):
    shm = tmp_path / 'shm'
    (shm / 'sub').mkdir(parents=True)
    (shm / 'sub' / 'file').write_bytes(b'x')
    (tmp_path / 'escape').write_bytes(b'x')
    with ShmDir(str(shm)) as sd:
        with pytest.raises(ShmFsError, match='unsafe file name'):
            sd.unlink(name, 0, 0)
        with pytest.raises(ShmFsError, match='unsafe file name'):
            sd.create(name, 1)
    assert (tmp_path / 'escape').exists() and (shm / 'sub' / 'file').exists()


def test_shm_dir_of_missing_directory_says_why(tmp_path):
    with pytest.raises(ShmFsError, match='cannot open shm directory .*missing: No such file or directory'):
        ShmDir(str(tmp_path / 'missing'))


def test_shm_dir_unlink_refuses_a_file_changed_since_it_was_checked(tmp_path):
    """Same device and inode is not enough: a file removed and created again can reuse the inode number."""
    path = tmp_path / 'region'
    path.write_bytes(b'x' * 4096)
    with ShmDir(str(tmp_path)) as d:
        st = d.lstat('region')
        time.sleep(0.05)  # past the kernel's coarse timestamp granularity
        os.chmod(str(path), 0o600)  # any inode change moves ctime, as a re-creation would
        with pytest.raises(ShmFsError, match='changed since it was checked'):
            d.unlink('region', st.st_dev, st.st_ino, st.st_ctime_ns)
        assert path.exists()
        now = d.lstat('region')
        assert d.unlink('region', now.st_dev, now.st_ino, now.st_ctime_ns) == now.st_blocks * 512
        assert not path.exists()


# -- the quarantine rename and the cleanup mark (issue 26: 3, 6) ------------------------------------


def test_quarantine_renames_inside_the_dir_and_restore_gives_the_name_back(tmp_path):
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('f', 4096)
        q = sd.quarantine('f', st.st_dev, st.st_ino, st.st_ctime_ns)
        assert not (tmp_path / 'f').exists() and facts.is_quarantine_name(q.name)
        assert os.listdir(str(tmp_path)) == [q.name] and (q.dev, q.ino, q.original) == (st.st_dev, st.st_ino, 'f')
        assert q.ctime_ns is None  # the rename changed it: the unlink checks device and inode
        assert sd.restore(q.name, 'f') is True
        assert os.lstat(str(tmp_path / 'f')).st_ino == st.st_ino and os.listdir(str(tmp_path)) == ['f']


def test_restore_never_replaces_a_file_created_again_meanwhile(tmp_path):
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('f', 4096)
        q = sd.quarantine('f', st.st_dev, st.st_ino)
        new = sd.create('f', 10)  # a client created its file again while the old one was quarantined
        assert sd.restore(q.name, 'f') is False
        assert os.lstat(str(tmp_path / 'f')).st_ino == new.st_ino and (tmp_path / q.name).exists()


def test_quarantine_checks_like_unlink_and_leaves_what_it_refuses(tmp_path):
    target = tmp_path / 'target'
    target.write_bytes(b'keep')
    os.symlink(str(target), str(tmp_path / 'link'))
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('r', 10)
        with pytest.raises(ShmFsError, match='not a regular file'):
            sd.quarantine('link', st.st_dev, st.st_ino)
        with pytest.raises(ShmFsError, match='was replaced since it was checked'):
            sd.quarantine('r', st.st_dev, st.st_ino + 1)
        with pytest.raises(ShmFsError, match='changed since it was checked'):
            sd.quarantine('r', st.st_dev, st.st_ino, st.st_ctime_ns - 1)
        assert sd.quarantine('gone', st.st_dev, st.st_ino) is None
    assert sorted(os.listdir(str(tmp_path))) == ['link', 'r', 'target']


def test_a_file_linked_elsewhere_after_the_plan_is_neither_quarantined_nor_unlinked(tmp_path):
    """A hard link made between the read and the act (another program's name for the same file): refused at the act,
    as the plan refuses it (classification.removal_refusal); the file keeps both names."""
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('f', 10)
        q = sd.quarantine('f', st.st_dev, st.st_ino)
        os.link(str(tmp_path / q.name), str(tmp_path / 'other'))
        with pytest.raises(ShmFsError, match='has 2 hard links'):
            sd.unlink(q.name, q.dev, q.ino)
        assert sd.restore(q.name, 'f') is True
        with pytest.raises(ShmFsError, match='has 2 hard links'):
            sd.quarantine('f', st.st_dev, st.st_ino)
    assert sorted(os.listdir(str(tmp_path))) == ['f', 'other'] and os.stat(str(tmp_path / 'f')).st_nlink == 2


@pytest.fixture
def tmpfs_dir():
    """A directory on tmpfs (/dev/shm): ext4 keeps all of an inode's attributes in one block, tmpfs has no such limit."""
    if not os.path.isdir('/dev/shm'):
        pytest.skip('no /dev/shm')
    path = tempfile.mkdtemp(prefix='shm-fs-test-', dir='/dev/shm')
    yield pathlib.Path(path)
    shutil.rmtree(path)


def test_cleanup_record_round_trips_in_chunks_and_leaves_the_files_alone(tmpfs_dir):
    if os.geteuid() != 0:
        pytest.skip('trusted.* attributes need root')
    tmp_path = tmpfs_dir
    with ShmDir(str(tmp_path)) as sd:
        st = sd.create('f', 4096)
        record = {st.st_ino + i: shm_fs.CleanupMark(f'region {i}', f'file_{i}', '42:1234') for i in range(3000)}
        sd.write_cleanup_record(record)
        assert shm_fs.read_cleanup_record(str(tmp_path)) == record
        assert len([n for n in os.listxattr(str(tmp_path)) if n.startswith(shm_fs.CLEANUP_XATTR)]) > 1
        assert os.lstat(str(tmp_path / 'f')).st_ctime_ns == st.st_ctime_ns  # no file is touched
        sd.write_cleanup_record({st.st_ino: record[st.st_ino]})
        assert shm_fs.read_cleanup_record(str(tmp_path)) == {st.st_ino: record[st.st_ino]}
        sd.write_cleanup_record({})
        assert shm_fs.read_cleanup_record(str(tmp_path)) == {}
        assert not [n for n in os.listxattr(str(tmp_path)) if n.startswith(shm_fs.CLEANUP_XATTR)]


def test_a_pinned_directory_whose_path_no_longer_leads_to_it_is_not_acted_on(tmp_path):
    """A server that died takes its private /dev/shm with it: the descriptor still reaches the old directory, but a
    ShmDir (what unlinks and renames) refuses it, as when the directory cannot be opened (test_faults.py)."""
    shm = tmp_path / 'shm'
    shm.mkdir()
    (shm / 'f').write_bytes(b'x')
    pinned = shm_fs.pin(str(shm))
    with shm_fs.ShmDir(pinned) as d:
        assert d.lstat('f') is not None
    os.rename(shm, tmp_path / 'gone')
    with pytest.raises(ShmFsError, match='cannot open shm directory .*No such file'):
        shm_fs.ShmDir(pinned)
    shm.mkdir()  # another directory at the same path
    with pytest.raises(ShmFsError, match='no longer the directory that was read'):
        shm_fs.ShmDir(pinned)
    assert (tmp_path / 'gone' / 'f').exists()
    pinned.close()


def test_own_quarantine_is_the_quarantine_name_of_that_very_inode():
    """issue 40, goal 4: a file under the quarantine name a cleanup gives its own inode is past its region's
    unregister; any other name (another inode's, a short or foreign token, a prefix alone) is not."""
    prefix = shm_fs.QUARANTINE_PREFIX
    assert facts.own_quarantine(f'{prefix}42.0123456789ab', 42)
    assert not facts.own_quarantine(f'{prefix}42.0123456789ab', 43)
    assert not facts.own_quarantine(f'{prefix}42.0123456789a', 42)
    assert not facts.own_quarantine(f'{prefix}42.0123456789aB', 42)
    assert not facts.own_quarantine(f'{prefix}42', 42)
    assert not facts.own_quarantine('42.0123456789ab', 42)
