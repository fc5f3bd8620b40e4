"""Unit tests for the modules' metrics_dir option: base.write_metrics() and metrics.write_server_metrics() on real directories.

What a module call writes (the report file, the cleanup outcome with its counter going on), and what it refuses with one
warning and nothing written: a missing directory, a symlink, a directory nobody may write, a read-only bind mount; check mode
writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics
from ansible_collections.tritonops.shm.plugins.module_utils.run import base

URL = 'http://127.0.0.1:8000'
MIB = 1 << 20


class FakeModule:
    """The parts of AnsibleModule write_metrics() uses."""

    def __init__(self, directory: str | None, host: str = 'gpu1', url: str = URL, check_mode: bool = False) -> None:
        self.params = {'metrics_dir': directory, 'metrics_host': host, 'url': url}
        self.check_mode = check_mode
        self.warnings: list[str] = []

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)


def info_result() -> dict:
    return dict(
        server=dict(url=URL, version='2.51.0', pid=42, shm_dir='/dev/shm'),
        shm_fs=dict(total_bytes=64 * MIB, used_bytes=3 * MIB),
        system_regions=[dict(name='dead', byte_size=MIB, state='stale')],
        cuda_regions=[],
        files=[dict(name='dead', category='registered', allocated_bytes=MIB)],
        summary=dict(stale_bytes=MIB, orphan_bytes=0),
        scanned_at=1764760000.0,
    )


def values(path: str) -> dict:
    """{(name, state or category): value} of one textfile, after checking the host and triton_url labels."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert (s.labels['host'], s.labels['triton_url']) == ('gpu1', URL)
            out[(s.name, s.labels.get('state') or s.labels.get('category'))] = s.value
    return out


def cleanup_outcome(freed: int, failed: bool = False) -> dict:
    result = dict(unregistered=['dead'], removed_files=['/dev/shm/dead'], freed_bytes=freed)
    return metrics.call_outcome(result, failed=failed, now=1764760100.0)


def test_the_report_file_of_an_info_call(tmp_path):
    module = FakeModule(str(tmp_path))
    out = base.write_metrics(module, report=info_result(), with_report=True)
    path = str(tmp_path / metrics.file_name(metrics.REPORT, 'gpu1', URL))
    assert out == {'metrics_files': [path]} and module.warnings == []
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    got = values(path)
    assert got[('tritonops_shm_up', None)] == 1 and got[('tritonops_shm_regions', 'stale')] == 1
    assert got[('tritonops_shm_stale_bytes', None)] == MIB
    # a server that could not be queried (the failing call): up 0, over the same file
    assert base.write_metrics(module, report=None, with_report=True) == {'metrics_files': [path]}
    assert values(path)[('tritonops_shm_up', None)] == 0 and os.listdir(tmp_path) == [os.path.basename(path)]


def test_the_cleanup_counter_goes_on_from_the_previous_file(tmp_path):
    module = FakeModule(str(tmp_path))
    name = metrics.file_name(metrics.CLEANUP, 'gpu1', URL)
    base.write_metrics(module, outcome=cleanup_outcome(3 * MIB))
    base.write_metrics(module, outcome=cleanup_outcome(2 * MIB, failed=True))  # a call that failed part-way
    got = values(str(tmp_path / name))
    assert got[('tritonops_shm_cleanup_freed_bytes_total', None)] == 5 * MIB  # the counter: 3 + 2
    assert got[('tritonops_shm_cleanup_last_freed_bytes', None)] == 2 * MIB
    assert got[('tritonops_shm_cleanup_last_success', None)] == 0
    assert got[('tritonops_shm_cleanup_last_success_timestamp_seconds', None)] == 1764760100.0
    assert got[('tritonops_shm_cleanup_last_unregistered_regions', None)] == 1


def test_both_files_in_one_call(tmp_path):
    module = FakeModule(str(tmp_path))
    out = base.write_metrics(
        module, report={'after': info_result(), 'unregistered': []}, with_report=True, outcome=cleanup_outcome(0)
    )
    assert (
        sorted(os.path.basename(p) for p in out['metrics_files'])
        == sorted(os.listdir(tmp_path))
        == sorted([metrics.file_name(metrics.REPORT, 'gpu1', URL), metrics.file_name(metrics.CLEANUP, 'gpu1', URL)])
    )


def test_two_servers_on_one_machine_keep_their_own_files(tmp_path):
    for host, url in (('gpu1', URL), ('gpu1-b', 'http://127.0.0.1:8100'), ('gpu1', 'http://127.0.0.1:8100')):
        base.write_metrics(FakeModule(str(tmp_path), host=host, url=url), report=info_result(), with_report=True)
    assert len(os.listdir(tmp_path)) == 3


def test_check_mode_writes_nothing(tmp_path):
    module = FakeModule(str(tmp_path), check_mode=True)
    assert base.write_metrics(module, report=info_result(), with_report=True, outcome=cleanup_outcome(MIB)) == {
        'metrics_files': []
    }
    assert os.listdir(tmp_path) == [] and module.warnings == []


def test_no_metrics_dir_writes_nothing_and_adds_no_key(tmp_path):
    module = FakeModule(None)
    assert base.write_metrics(module, report=info_result(), with_report=True) == {}
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_one_warning_for_both_files(tmp_path):
    module = FakeModule(str(tmp_path / 'textfile_collector'))
    out = base.write_metrics(module, report=info_result(), with_report=True, outcome=cleanup_outcome(MIB))
    assert out == {'metrics_files': []} and not (tmp_path / 'textfile_collector').exists()
    assert len(module.warnings) == 1
    assert module.warnings[0].startswith(
        f'{tmp_path}/textfile_collector does not exist on this host: no metrics written'
    )


def test_a_symlinked_directory_is_one_warning_and_nothing_written(tmp_path):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (tmp_path / 'textfile_collector').symlink_to(elsewhere)
    module = FakeModule(str(tmp_path / 'textfile_collector'))
    out = base.write_metrics(module, report=info_result(), with_report=True, outcome=cleanup_outcome(MIB))
    assert out == {'metrics_files': []} and os.listdir(elsewhere) == []
    assert len(module.warnings) == 1 and f'is a symlink to {elsewhere} (not followed' in module.warnings[0]


def _write_as_nobody(directory: str) -> list:
    module = FakeModule(directory)
    out = base.write_metrics(module, report=info_result(), with_report=True, outcome=cleanup_outcome(MIB))
    return [out['metrics_files'], module.warnings]


def test_a_directory_nobody_may_write_is_one_warning(as_nobody):
    directory = tempfile.mkdtemp(prefix='tritonops-metrics-')  # pytest's tmp_path is 0700: nobody could not reach it
    try:
        os.chmod(directory, 0o755)
        written, warnings = as_nobody(_write_as_nobody, directory)
        assert written == [] and os.listdir(directory) == []
        assert warnings == [
            f'{directory} is not writable (Permission denied): no metrics written '
            f'({metrics.file_name(metrics.REPORT, "gpu1", URL)})'
        ]
    finally:
        shutil.rmtree(directory)


def test_a_read_only_bind_mount_is_one_warning(tmp_path):
    """Root cannot be stopped by permissions: a read-only mount (in a private mount namespace of a child) is what stops it."""
    if os.geteuid() != 0 or not shutil.which('unshare'):
        pytest.skip('needs root and unshare for a private mount namespace')
    directory = tmp_path / 'textfile_collector'
    directory.mkdir()
    code = (
        'import json, sys\n'
        'from ansible_collections.tritonops.shm.plugins.module_utils.run import base\n'
        f'sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n'
        'import test_base_metrics as t\n'
        f'print(json.dumps(t._write_as_nobody({str(directory)!r})))\n'
    )
    script = (
        f'mount --bind {directory} {directory} && mount -o remount,bind,ro {directory} && exec {sys.executable} -c "$0"'
    )
    proc = subprocess.run(
        ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', script, code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    )
    assert proc.returncode == 0, proc.stderr
    written, warnings = json.loads(proc.stdout.strip().splitlines()[-1])
    assert written == [] and os.listdir(directory) == []
    assert len(warnings) == 1 and warnings[0].startswith(
        f'{directory} is not writable (Read-only file system): no metrics written'
    )


@pytest.mark.parametrize('missing', ['warn', 'skip'])
def test_a_missing_directory_is_one_warning_or_with_skip_a_reason_in_the_result(tmp_path, missing):
    module = FakeModule(str(tmp_path / 'textfile_collector'))
    module.params['metrics_dir_missing'] = missing
    result = base.write_metrics(module, report=info_result(), with_report=True)
    assert result['metrics_files'] == []
    if missing == 'warn':
        assert len(module.warnings) == 1 and 'does not exist' in module.warnings[0] and 'metrics_skipped' not in result
    else:
        assert module.warnings == [] and result['metrics_skipped'].endswith('does not exist on this host')


def test_skip_never_hides_a_planted_symlink_or_a_directory_that_cannot_be_written(tmp_path):
    target = tmp_path / 'elsewhere'
    target.mkdir()
    link = tmp_path / 'textfile_collector'
    link.symlink_to(target)
    dangling = tmp_path / 'dangling'
    dangling.symlink_to(tmp_path / 'nothing')
    for path in (link, dangling):
        module = FakeModule(str(path))
        module.params['metrics_dir_missing'] = 'skip'
        result = base.write_metrics(module, report=info_result(), with_report=True)
        assert result['metrics_files'] == [] and 'metrics_skipped' not in result
        assert len(module.warnings) == 1 and 'symlink' in module.warnings[0], module.warnings
    assert os.listdir(target) == []
