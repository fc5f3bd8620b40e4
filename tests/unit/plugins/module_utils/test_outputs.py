"""module_utils/outputs/outputs.py: the one writer of outputs, and that no other code of the collection writes files its own way.

The recipe "An output" in CONTRIBUTING.md says: outputs.write() on a target, action shm_output_files on the
controller, no other writer. The scan below holds it: a new writer elsewhere fails until it goes through outputs, or is
named here with why it is not an output.
"""

from __future__ import annotations

import ast
import glob
import os
import shutil
import stat
import tempfile

import pytest
import yaml

from ansible_collections.tritonops.shm.plugins.module_utils.host import wedged
from ansible_collections.tritonops.shm.plugins.module_utils.outputs import outputs
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Attempts

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')

# Files that are not outputs, each with what it writes and why it is not written through outputs.write().
NOT_OUTPUTS = {
    'plugins/module_utils/host/runlock.py': 'the run lock: a file held open and locked, never replaced',
    'plugins/module_utils/host/shm_fs.py': "a region's backing file in the shm directory, created for a registration",
}
# Tasks that write with ansible.builtin.copy or template: configuration a run changes, or a node's own state.
NOT_OUTPUT_TASKS = {
    'playbooks/node_agent.yml': "the node agent's memory of the round, on the node, as root (become), 0600",
    'playbooks/node_agent_manifest.yml': "the node agent's manifests: configuration, a change when it changes",
    'roles/triton_server/tasks/kubernetes.yml': 'a Kubernetes manifest: configuration, a change when it changes',
}
# os.NAME and tempfile.NAME that write; pathlib's write_text and write_bytes
WRITES = {
    'os': {'rename', 'replace', 'O_CREAT', 'O_WRONLY', 'O_RDWR', 'makedirs', 'mkdir'},
    'tempfile': {'mkstemp', 'NamedTemporaryFile', 'mkdtemp'},
}


def _writes(path: str) -> set[str]:
    """What in a Python file writes a file: the names above, and open() with a mode that writes."""
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in WRITES.get(node.value.id, ()):
                found.add(f'{node.value.id}.{node.attr}')
        if isinstance(node, ast.Attribute) and node.attr in ('write_text', 'write_bytes'):
            found.add(node.attr)
        if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'open':
            modes = node.args[1:2] + [k.value for k in node.keywords if k.arg == 'mode']
            if any(isinstance(m, ast.Constant) and set(str(m.value)) & set('wax+') for m in modes):
                found.add('open for writing')
    return found


def test_no_code_but_outputs_writes_files_its_own_way():
    code = [
        p
        for pattern in ('plugins/**/*.py', 'extensions/**/*.py')
        for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)
    ]
    writers = {os.path.relpath(p, ROOT): _writes(p) for p in code}
    writers = {p: w for p, w in writers.items() if w and p != 'plugins/module_utils/outputs/outputs.py'}
    assert writers.keys() - NOT_OUTPUTS.keys() == set(), {p: writers[p] for p in writers.keys() - NOT_OUTPUTS.keys()}
    assert NOT_OUTPUTS.keys() <= writers.keys(), 'a file named here writes nothing any more: drop it'


def _tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ('tasks', 'block', 'rescue', 'always', 'pre_tasks', 'post_tasks', 'handlers'):
            yield from _tasks(node.get(key) or [])


def test_no_playbook_or_role_writes_an_output_with_copy_or_template():
    paths = glob.glob(os.path.join(ROOT, 'playbooks', '*.yml')) + glob.glob(
        os.path.join(ROOT, 'roles', '*', 'tasks', '*.yml')
    )
    found = set()
    for path in paths:
        for task in _tasks(yaml.safe_load(open(path, encoding='utf-8')) or []):
            if any(k in task for k in ('ansible.builtin.copy', 'ansible.builtin.template', 'copy', 'template')):
                found.add(os.path.relpath(path, ROOT))
    assert found == set(NOT_OUTPUT_TASKS), found ^ set(NOT_OUTPUT_TASKS)


@pytest.mark.parametrize('name', ['', '.hidden', '../x', 'a/b', 'x\0y', None])
def test_only_plain_names(name):
    assert outputs.plain_name(name)


def test_a_plain_name():
    assert outputs.plain_name('report.json') is None and outputs.plain_name('h1.example.com.json') is None


def test_write_replaces_whole_with_the_mode_asked_and_leaves_no_temporary(tmp_path):
    old = os.umask(0o077)
    try:
        res = outputs.write(str(tmp_path), 'r.md', 'one\n', mode=0o640)
    finally:
        os.umask(old)
    assert res == outputs.WriteResult(str(tmp_path / 'r.md'), True, None)
    assert stat.S_IMODE((tmp_path / 'r.md').stat().st_mode) == 0o640
    inode = (tmp_path / 'r.md').stat().st_ino
    assert outputs.write(str(tmp_path), 'r.md', 'two\n').written
    assert (tmp_path / 'r.md').stat().st_ino != inode and (tmp_path / 'r.md').read_text() == 'two\n'
    assert os.listdir(tmp_path) == ['r.md']


def test_make_dir_creates_parents_and_refuses_a_path_through_a_symlink(tmp_path):
    assert outputs.make_dir(str(tmp_path / 'a' / 'b')) is None
    assert stat.S_IMODE((tmp_path / 'a' / 'b').stat().st_mode) == 0o755
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (tmp_path / 'link').symlink_to(elsewhere)
    assert 'through a symlink' in outputs.make_dir(str(tmp_path / 'link' / 'new'))
    assert not (elsewhere / 'new').exists()
    (tmp_path / 'file').write_text('')
    assert 'Not a directory' in outputs.make_dir(str(tmp_path / 'file' / 'sub'))


def test_a_report_dir_must_be_absolute(tmp_path):
    assert 'is a relative path' in outputs.report_dir_refusal('reports')
    assert outputs.report_dir_refusal(str(tmp_path / 'new')) is None


def test_a_symlink_swapped_in_after_the_check_is_never_followed(tmp_path, monkeypatch):
    """The race: the directory passes dir_refusal(), then a component becomes a symlink before the open. The walk opens
    each component with O_NOFOLLOW, so the swap is refused as well, and nothing lands in the link's target."""
    elsewhere = tmp_path / 'elsewhere'
    (elsewhere / 'sub').mkdir(parents=True)
    (tmp_path / 'reports').symlink_to(elsewhere)
    monkeypatch.setattr(outputs, 'dir_refusal', lambda directory, missing_ok=False: None)  # the check was raced
    res = outputs.write(str(tmp_path / 'reports' / 'sub'), 'report.json', '{}')
    assert not res.written and res.directory_refused and 'symlink' in res.warning
    assert outputs.make_dir(str(tmp_path / 'reports' / 'new')) is not None
    assert sorted(p.name for p in elsewhere.rglob('*')) == ['sub'], 'nothing made or written through the link'


def test_make_dir_sets_the_mode_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        assert outputs.make_dir(str(tmp_path / 'x' / 'y'), mode=0o750) is None
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / 'x').stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / 'x' / 'y').stat().st_mode) == 0o750


def test_a_directory_on_a_search_only_path_is_written_as_a_lookup_would(as_nobody):
    """A component nobody may list but may pass (0711, a home directory) is no obstacle, as for any path lookup."""
    top = tempfile.mkdtemp(prefix='tritonops-outputs-')
    try:
        os.chmod(top, 0o711)
        inner = os.path.join(top, 'inner')
        os.mkdir(inner)
        os.chown(inner, 65534, 65534)
        res = as_nobody(outputs.write, inner, 'r.md', 'x\n')
        assert res[1] is True, res
        assert open(os.path.join(inner, 'r.md')).read() == 'x\n'
    finally:
        shutil.rmtree(top)


# -- what the attack review of round 4 found (each failed before its fix) --


def test_a_path_that_changes_while_it_is_resolved_is_a_refusal_never_an_exception(tmp_path, monkeypatch):
    """realpath() raised EINVAL when a component was swapped between its lstat and its readlink: the metrics written
    after a cleanup then lost the cleanup's result. Any such error is a refusal now, and so is a NUL."""

    def swapped(path):
        raise OSError(22, 'Invalid argument', path)

    monkeypatch.setattr(os.path, 'realpath', swapped)
    assert 'changed while it was checked' in outputs.dir_refusal(str(tmp_path))
    res = outputs.write(str(tmp_path), 'r.md', 'x')
    assert not res.written and 'changed while it was checked' in res.warning
    monkeypatch.undo()
    assert 'NUL' in outputs.dir_refusal(str(tmp_path) + '\0x')
    assert not outputs.write(str(tmp_path) + '\0x', 'r.md', 'x').written
    assert outputs.dir_refusal('/' + str(tmp_path)) is None, 'a leading // is no symlink'


def test_text_utf8_cannot_carry_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    (tmp_path / 'a.prom').write_text('good 1\n')
    res = outputs.write(str(tmp_path), 'a.prom', 'bad \udcff')
    assert not res.written and 'UTF-8 cannot carry' in res.warning and not res.directory_refused
    assert os.listdir(tmp_path) == ['a.prom'] and (tmp_path / 'a.prom').read_text() == 'good 1\n'


def test_an_interrupted_write_removes_its_temporary_and_goes_on_being_interrupted(tmp_path, monkeypatch):
    class TimeUp(BaseException):
        pass

    def interrupted(fd):
        raise TimeUp()

    (tmp_path / 'a.prom').write_text('good 1\n')
    monkeypatch.setattr(os, 'fsync', interrupted)
    with pytest.raises(TimeUp):
        outputs.write(str(tmp_path), 'a.prom', 'new 2\n')
    assert os.listdir(tmp_path) == ['a.prom'] and (tmp_path / 'a.prom').read_text() == 'good 1\n'


def test_a_killed_run_s_temporary_is_removed_by_a_later_write_once_it_is_old(tmp_path):
    old, fresh = tmp_path / (outputs.TMP_PREFIX + 'old'), tmp_path / (outputs.TMP_PREFIX + 'fresh')
    for f in (old, fresh):
        f.write_text('half')
    hour_ago = os.stat(old).st_mtime - outputs.STALE_TMP_AGE - 60
    os.utime(old, (hour_ago, hour_ago))
    assert outputs.write(str(tmp_path), 'r.md', 'x').written
    assert sorted(os.listdir(tmp_path)) == sorted([fresh.name, 'r.md']), 'a fresh one may be being written: kept'


def test_a_name_of_255_bytes_is_written(tmp_path):
    name = 'h' * 250 + '.json'
    assert outputs.write(str(tmp_path), name, '{}').written and (tmp_path / name).read_text() == '{}'


def test_a_directory_another_user_made_first_in_tmp_is_refused(as_nobody):
    """A world-writable sticky directory (/tmp): another user may make the report directory first and then swap or
    forge what root writes in it. Such a directory (or one on the way) is refused, whoever asks; the caller's own or
    root's is fine, and so is one that is made now."""
    shared = tempfile.mkdtemp(prefix='tritonops-outputs-')
    try:
        os.chmod(shared, 0o1777)
        planted = os.path.join(shared, 'reports')
        as_nobody(os.mkdir, planted, 0o755)
        assert os.stat(planted).st_uid == 65534
        res = outputs.write(planted, 'report.json', '{}')
        assert not res.written and 'uid 65534' in res.warning and os.listdir(planted) == []
        assert 'uid 65534' in outputs.make_dir(os.path.join(planted, 'sub'))
        assert not os.path.exists(os.path.join(planted, 'sub'))
        mine = os.path.join(shared, 'mine', 'deep')
        assert outputs.make_dir(mine) is None and outputs.write(mine, 'report.json', '{}').written
        # anyone may write in a directory without the sticky bit: refused as the report's directory and on the way
        os.chmod(os.path.join(shared, 'mine'), 0o777)
        assert 'no sticky bit' in outputs.write(mine, 'report.json', '{}').warning
    finally:
        shutil.rmtree(shared)


def test_the_wedged_record_goes_through_the_one_atomic_write_0600_and_clears_a_killed_runs_temporary(tmp_path):
    """The run's private state beside the lock (wedged.py) is written by write_at: read back by the next run, 0600
    whatever the umask, and a temporary file a killed run left there (it stayed for good with wedged.py's own writer)
    goes with a later write."""
    killed = tmp_path / f'{outputs.TMP_PREFIX}killed'
    killed.write_bytes(b'{"server"')
    os.utime(killed, (1, 1))
    attempts = {'leak_0': Attempts(3, 1700000000.0, ('/k', 0, 4096))}
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    old = os.umask(0)
    try:
        outputs.write_at(fd, wedged.record_name(7, 9), wedged.encoded('42:1000', attempts), 0o600)
    finally:
        os.umask(old)
        os.close(fd)
    assert os.listdir(tmp_path) == [wedged.record_name(7, 9)]
    assert stat.S_IMODE(os.stat(tmp_path / wedged.record_name(7, 9)).st_mode) == 0o600
    assert wedged.read(str(tmp_path), 7, 9, '42:1000') == attempts
    assert wedged.read(str(tmp_path), 7, 9, '43:1000') == {}  # another server process starts from 0
