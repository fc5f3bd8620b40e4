"""Action tritonops.shm.shm_output_files, through ansible-playbook: the one writer of the report files on the controller.

What a user of the report playbook or the cleanup role relies on: every file written whole (atomic, the mode asked
whatever the umask), JSON as to_nice_json writes it, changed=false, nothing written in check mode unless the task says
so, and nothing ever written through a planted symlink, a relative path or a name that leaves the directory.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible_helpers import ansible_playbook

TASK = 'Write the outputs'


def write(directory, files, check=False, task_check_mode=None, **args):
    """Run the action once on localhost; (the playbook's result, the task's result)."""
    task = {'name': TASK, 'tritonops.shm.shm_output_files': dict(dir=str(directory), files=files, **args)}
    if task_check_mode is not None:
        task['check_mode'] = task_check_mode
    play = [{'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}]
    res = ansible_playbook(play, check=check)
    return res, res.task(TASK)


def test_writes_every_file_whole_with_its_mode_and_reports_no_change(tmp_path):
    record = {'host': 'h1', 'changed': True, 'done': {'removed_files': ['/dev/shm/a'], 'freed_bytes': 1024}, 'x': None}
    files = {'summary.md': '# Cleanup\n\nfine\n', 'h1.json': record, 'rows.json': [1, 'two']}
    res, task = write(tmp_path / 'out' / 'deep', files, mode='0640')
    assert res.rc == 0 and res.stats['localhost']['changed'] == 0, res
    out = tmp_path / 'out' / 'deep'
    assert task['written'] == [str(out / name) for name in sorted(files)]
    assert (out / 'summary.md').read_text() == files['summary.md']
    # a dict is written as to_nice_json(indent=2) writes it, with a newline
    assert (out / 'h1.json').read_text() == json.dumps(record, indent=2, sort_keys=True, separators=(',', ': ')) + '\n'
    assert json.loads((out / 'rows.json').read_text()) == [1, 'two']
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o640}
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    inode = (out / 'h1.json').stat().st_ino
    res, task = write(out, {'h1.json': {'host': 'h1', 'changed': False}})
    assert res.rc == 0 and res.stats['localhost']['changed'] == 0, res
    assert (out / 'h1.json').stat().st_ino != inode, 'replaced by a rename, never rewritten in place'
    assert sorted(os.listdir(out)) == ['h1.json', 'rows.json', 'summary.md'], 'no temporary file left'


def test_check_mode_writes_nothing_unless_the_task_says_so(tmp_path):
    res, task = write(tmp_path / 'out', {'report.md': 'x\n'}, check=True)
    assert res.rc == 0 and task['would_write'] == [str(tmp_path / 'out' / 'report.md')], res
    assert not (tmp_path / 'out').exists()
    # the report playbook and the role: a check-mode run still leaves its report
    res, task = write(tmp_path / 'out', {'report.md': 'x\n'}, check=True, task_check_mode=False)
    assert res.rc == 0 and (tmp_path / 'out' / 'report.md').read_text() == 'x\n', res


def test_a_planted_symlink_is_never_followed(tmp_path):
    victim = tmp_path / 'victim'
    victim.mkdir()
    (victim / 'report.json').write_text('precious\n')
    (tmp_path / 'link').symlink_to(victim)
    for directory, why in ((tmp_path / 'link', 'is a symlink to'), (tmp_path / 'link' / 'sub', 'through a symlink')):
        res, task = write(directory, {'report.json': {'a': 1}}, label='report_dir')
        assert res.rc != 0 and task['msg'].startswith(f'report_dir {directory} ') and why in task['msg'], task
    assert sorted(os.listdir(victim)) == ['report.json'] and (victim / 'report.json').read_text() == 'precious\n'
    # a symlink in place of a file is replaced by the file, never written through
    real = tmp_path / 'real'
    real.mkdir()
    (real / 'report.json').symlink_to(victim / 'report.json')
    res, task = write(real, {'report.json': {'a': 1}})
    assert res.rc == 0, res
    assert not (real / 'report.json').is_symlink() and (victim / 'report.json').read_text() == 'precious\n'


@pytest.mark.parametrize(
    'args, why',
    [
        ({'dir': 'relative/reports', 'files': {'a.md': ''}}, 'is a relative path'),
        ({'files': {'../a.md': ''}}, 'one plain file name'),
        ({'files': {'.hidden': ''}}, 'one plain file name'),
        ({'files': {'a.md': ''}, 'mode': '0755'}, 'without execute bits'),
        ({'files': {'a.md': 7}}, 'must be a string, a dict or a list'),
    ],
)
def test_what_is_refused_writes_nothing(tmp_path, args, why):
    args = dict(args)
    directory = args.pop('dir', str(tmp_path / 'out'))
    res, task = write(directory, args.pop('files'), **args)
    assert res.rc != 0 and why in task['msg'], task
    assert not (tmp_path / 'out').exists() and not os.listdir(tmp_path)


def test_a_directory_in_place_of_a_file_fails_and_the_others_are_written(tmp_path):
    (tmp_path / 'report.html').mkdir()
    res, task = write(tmp_path, {'report.html': '<p>', 'report.md': 'x\n'}, label='report_dir')
    assert res.rc != 0 and 'report_dir: ' in task['msg'] and 'report.html cannot be written' in task['msg'], task
    assert (tmp_path / 'report.md').read_text() == 'x\n' and task['written'] == [str(tmp_path / 'report.md')]


def test_a_bad_name_is_said_and_every_other_file_is_still_written(tmp_path):
    res, task = write(tmp_path / 'out', {'.hidden.json': {}, 'a/b.json': {}, 'good.json': {'a': 1}})
    assert res.rc != 0 and '.hidden.json' in task['msg'] and 'a/b.json' in task['msg'], task
    assert os.listdir(tmp_path / 'out') == ['good.json'] and task['written'] == [str(tmp_path / 'out' / 'good.json')]


RECORD = "{{ {} | tritonops.shm._shm_cleanup(host=inventory_hostname, url='http://127.0.0.1:1') }}"


def test_the_cleanup_role_writes_a_record_for_every_inventory_name_in_its_directory(tmp_path):
    """Inventory names Ansible accepts but a file name cannot be as they are (a leading ".", a "/", ".."): each host's
    record is still written, as one plain file in the report directory, and nothing is written elsewhere."""
    hosts = {name: {'ansible_connection': 'local'} for name in ('.hidden', 'a/b', '..', 'good')}
    report = tmp_path / 'reports'
    play = [
        {
            'hosts': 'all',
            'gather_facts': False,
            'tasks': [
                {'ansible.builtin.set_fact': {'shm_cleanup_result': RECORD}},
                {
                    'ansible.builtin.include_role': {'name': 'tritonops.shm.shm_cleanup', 'tasks_from': 'report_files'},
                    'vars': {'shm_cleanup_report_dir': str(report)},
                },
            ],
        }
    ]
    res = ansible_playbook(play, inventory={'all': {'hosts': hosts}})
    assert res.rc == 0, res.stdout[-3000:]
    assert sorted(os.listdir(report)) == sorted(
        ['_..json', '_hidden.json', 'a_b.json', 'good.json', 'report.html', 'summary.md']
    )
    assert json.loads((report / 'a_b.json').read_text())['host'] == 'a/b'
    assert sorted(os.listdir(tmp_path)) == ['reports']
