"""Unit tests for the tritonops.shm.shm_metrics and shm_metrics_file filters: the module_utils metrics, as filters."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.shm_metrics import (
    FilterModule,
    shm_dir_refusal,
    shm_metrics,
    shm_metrics_file,
)
from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics, outputs

URL = 'http://127.0.0.1:8000'


def test_the_filters_are_the_module_utils_functions():
    result = dict(
        server=dict(pid=1, version='2.51.0'),
        shm_fs=dict(total_bytes=10, used_bytes=5),
        system_regions=[],
        files=[],
        summary={},
        scanned_at=7.0,
    )
    assert shm_metrics(result, 'report', 't1', URL) == metrics.report_text(result, 't1', URL)
    record = dict(status='ok', finished_epoch=9, done=dict(unregistered=['x'], removed_files=[], freed_bytes=4))
    previous = metrics.cleanup_text(record, 't1', URL)
    assert shm_metrics(record, 'cleanup', 't1', URL, previous='') == previous
    assert 'tritonops_shm_cleanup_freed_bytes_total{host="t1",triton_url="http://127.0.0.1:8000"} 8\n' in shm_metrics(
        record, 'cleanup', 't1', URL, previous=previous
    )
    assert shm_metrics_file('cleanup', 't1', URL) == metrics.file_name('cleanup', 't1', URL)
    assert set(FilterModule().filters()) == {'shm_metrics', 'shm_metrics_file', 'shm_dir_refusal'}


def test_shm_dir_refusal_is_metrics_dir_refusal(tmp_path):
    (tmp_path / 'link').symlink_to(tmp_path)
    assert shm_dir_refusal(str(tmp_path / 'link')) == outputs.dir_refusal(str(tmp_path / 'link'))
    assert shm_dir_refusal(str(tmp_path / 'new')) == '' and shm_dir_refusal(str(tmp_path)) == ''
    with pytest.raises(AnsibleFilterError):
        shm_dir_refusal('')


def test_shm_dir_refusal_refuses_a_relative_path():
    # Ansible would write it inside the installed collection (a local task runs in its playbook's directory)
    assert shm_dir_refusal('shm-report') == (
        'shm-report is a relative path: the report would be written inside the installed collection (Ansible runs '
        "the controller's tasks in the playbook's directory); give an absolute path, e.g. $PWD/shm-report"
    )


@pytest.mark.parametrize(
    'call, match',
    [
        (lambda: shm_metrics({}, 'other', 't1', URL), "kind must be 'report' or 'cleanup'"),
        (lambda: shm_metrics(None, 'cleanup', 't1', URL), 'cleanup needs the shm_cleanup_result dict'),
        (lambda: shm_metrics_file('other', 't1', URL), 'shm_metrics_file: metrics kind must be one of'),
    ],
)
def test_errors(call, match):
    with pytest.raises(AnsibleFilterError, match=match):
        call()
