"""Unit tests for module_utils/host/rootfs.py on real temporary trees: a "root" directory that stands for /proc/PID/root.

Every test builds a root with a hostile symlink in it that, handed to the kernel in one piece, would reach a victim
directory outside the root; the resolution must stay inside the root or refuse.
"""

from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import PathRefused
from ansible_collections.tritonops.shm.plugins.module_utils.host import rootfs


@pytest.fixture
def tree(tmp_path):
    """(root, victim): root/dev/shm a real directory with one file; victim a directory outside the root."""
    root = tmp_path / 'root'
    (root / 'dev' / 'shm').mkdir(parents=True)
    (root / 'dev' / 'shm' / 'mine').write_text('inside')
    victim = tmp_path / 'victim'
    (victim / 'shm').mkdir(parents=True)
    (victim / 'shm' / 'secret').write_text('outside')
    return root, victim


def names(fd):
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def test_a_plain_path_resolves_to_the_directory_inside_the_root(tree):
    root, _victim = tree
    fd = rootfs.open_in(str(root), 'dev/shm', rootfs.REFUSE, rootfs.DIRECTORY_FLAGS)
    assert os.fstat(fd).st_ino == os.stat(root / 'dev' / 'shm').st_ino
    assert names(fd) == ['mine']


def _link(path, target):
    """Replace the directory at path by a symlink to target."""
    shutil.rmtree(path)
    os.symlink(target, path)


# every step of dev/shm/FILE, an absolute and a relative symlink: handed to the kernel, each one reaches the victim
STEPS = {
    'dev absolute': ('dev', lambda victim, root: str(victim)),
    'dev relative': ('dev', os.path.relpath),
    'shm absolute': ('dev/shm', lambda victim, root: str(victim / 'shm')),
    'shm relative': ('dev/shm', lambda victim, root: os.path.relpath(victim / 'shm', root / 'dev')),
}


@pytest.mark.parametrize('step', sorted(STEPS))
def test_a_symlink_at_any_step_is_refused_and_names_itself(tree, step):
    root, victim = tree
    where, target = STEPS[step]
    _link(root / where, target(victim, root))
    # the kernel, handed the whole path, reaches the victim: the attack is real
    assert 'secret' in os.listdir(root / 'dev' / 'shm')
    with pytest.raises(PathRefused) as exc:
        rootfs.open_in(str(root), 'dev/shm', rootfs.REFUSE, rootfs.DIRECTORY_FLAGS)
    assert f'{root}/{where} is a symlink' in exc.value.msg
    assert 'refused' in exc.value.msg


@pytest.mark.parametrize('kind', ['absolute', 'relative'])
def test_a_symlinked_file_is_refused_too(tree, kind):
    root, victim = tree
    link = root / 'dev' / 'shm' / 'planted'
    os.symlink(str(victim / 'shm' / 'secret') if kind == 'absolute' else '../../../victim/shm/secret', link)
    assert link.read_text() == 'outside'
    with pytest.raises(PathRefused):
        rootfs.open_in(str(root), 'dev/shm/planted', rootfs.REFUSE, rootfs.FILE_FLAGS)


@pytest.mark.parametrize('step', sorted(STEPS))
def test_in_root_follows_a_symlink_as_the_process_sees_it(tree, step):
    """IN_ROOT: an absolute target starts again at the root, '..' stops at the root: what the process itself reads."""
    root, victim = tree
    where, target = STEPS[step]
    _link(root / where, target(victim, root))
    # inside the root, the link's target names nothing: the process itself could not reach the victim
    with pytest.raises(FileNotFoundError):
        rootfs.open_in(str(root), 'dev/shm/secret', rootfs.IN_ROOT, rootfs.FILE_FLAGS)


def test_in_root_reads_a_kubernetes_style_projected_file(tmp_path):
    """A projected volume: namespace -> ..data/namespace, ..data -> ..2026_12_04; and /var/run -> /run."""
    root = tmp_path / 'root'
    sa = root / 'run' / 'secrets' / 'sa'
    (sa / '..2026_12_04').mkdir(parents=True)
    (sa / '..2026_12_04' / 'namespace').write_text('ml\n')
    os.symlink('..2026_12_04', sa / '..data')
    os.symlink('..data/namespace', sa / 'namespace')
    (root / 'var').mkdir()
    os.symlink('/run', root / 'var' / 'run')
    assert rootfs.read_small(str(root), '/var/run/secrets/sa/namespace') == 'ml\n'
    # REFUSE reads none of it
    assert rootfs.read_small(str(root), '/var/run/secrets/sa/namespace', policy=rootfs.REFUSE) is None


def test_dotdot_never_climbs_above_the_root(tree):
    root, victim = tree
    os.symlink('../../../../../../victim/shm/secret', root / 'etc-hostname')
    assert rootfs.read_small(str(root), 'etc-hostname') is None
    assert rootfs.read_small(str(root), '../victim/shm/secret') is None
    (root / 'up').mkdir()
    (root / 'up' / 'x').write_text('x')
    assert rootfs.read_small(str(root), 'up/../up/./x') == 'x'


def test_a_symlink_loop_is_eloop(tmp_path):
    root = tmp_path / 'root'
    root.mkdir()
    os.symlink('b', root / 'a')
    os.symlink('a', root / 'b')
    with pytest.raises(OSError) as exc:
        rootfs.open_in(str(root), 'a', rootfs.IN_ROOT)
    assert exc.value.errno == 40  # ELOOP


def test_read_small_reads_only_regular_files_and_never_blocks(tmp_path):
    root = tmp_path / 'root'
    root.mkdir()
    os.mkfifo(root / 'fifo')
    (root / 'big').write_bytes(b'a' * 10000)
    assert rootfs.read_small(str(root), 'fifo') is None  # a FIFO planted as /etc/hostname is not waited on
    assert rootfs.read_small(str(root), 'big', limit=10) == 'a' * 10
    assert rootfs.read_small(str(root), 'missing') is None


def test_root_owned_follows_only_root_symlinks(tmp_path):
    if os.geteuid() != 0:
        pytest.skip('needs root: chown of a symlink')
    root = tmp_path / 'root'
    (root / 'real').mkdir(parents=True)
    os.symlink('real', root / 'by-root')
    os.symlink('real', root / 'by-nobody')
    os.lchown(root / 'by-nobody', 65534, 65534)
    fd = rootfs.open_in(str(root), 'by-root', rootfs.ROOT_OWNED, rootfs.DIRECTORY_FLAGS)
    os.close(fd)
    with pytest.raises(PathRefused) as exc:
        rootfs.open_in(str(root), 'by-nobody', rootfs.ROOT_OWNED, rootfs.DIRECTORY_FLAGS)
    assert 'owned by uid 65534, not root' in exc.value.msg


def test_a_component_that_is_a_file_is_enotdir(tree):
    root, _victim = tree
    with pytest.raises(NotADirectoryError):
        rootfs.open_in(str(root), 'dev/shm/mine/x', rootfs.REFUSE)


def test_stat_in_does_not_follow_the_last_symlink_outside(tree):
    root, victim = tree
    os.symlink(str(victim / 'shm' / 'secret'), root / 'stub')
    assert rootfs.stat_in(str(root), 'stub') is None  # resolved in the root: /victim/... is not there
    assert rootfs.stat_in(str(root), 'dev/shm/mine').st_ino == os.stat(root / 'dev' / 'shm' / 'mine').st_ino
