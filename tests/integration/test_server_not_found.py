"""A host whose Triton server process cannot be found is never reported "ok".

The scene is real: a real tritonserver with a stale region (a real client killed with its
process group) and a live one, and Ansible run where the server's processes are invisible,
as from a container that does not share the host's process table (an AWX execution
environment on the Triton host, say): `unshare --pid --fork --mount-proc`. The server
answers on its URL, but nothing on the host can be checked.
"""

from __future__ import annotations

import json

import pytest
from ansible_helpers import PYTHON, ansible_playbook, run_module
from prometheus_client.parser import text_string_to_metric_families

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
BLIND = ('unshare', '--pid', '--fork', '--mount-proc')
MiB = 1 << 20


@pytest.fixture
def scene(make_triton):
    triton = make_triton(models=())
    live = triton.client('live', byte_size=MiB)
    triton.leak('dead', byte_size=4 * MiB)
    before = (triton.system_regions(), triton.shm_files())
    assert sorted(before[0]) == ['dead', 'live']
    yield triton, live, before
    assert live.alive


def _inventory(triton, **hostvars):
    host = dict(ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=triton.url, **hostvars)
    return {'all': {'children': {'triton': {'hosts': {'t1': host}}}}}


def _blind_playbook(playbook, triton, tmp_path, report_var):
    """Run a fleet playbook on one host where the server is invisible: (result, report dir, metrics dict)."""
    report_dir = tmp_path / 'report'
    prom = tmp_path / 'prom'
    prom.mkdir()
    res = ansible_playbook(
        playbook,
        inventory=_inventory(triton, prometheus_textfile_dir=str(prom)),
        extra_vars={report_var: str(report_dir)},
        prefix=BLIND,
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )
    metrics = {}
    for path in prom.iterdir():
        metrics.update(
            (s.name, s.value) for fam in text_string_to_metric_families(path.read_text()) for s in fam.samples
        )
    return res, report_dir, metrics


def test_info_says_why_and_nothing_is_stale(scene):
    triton, _live, _before = scene
    res = run_module(INFO, dict(url=triton.url), prefix=BLIND)
    assert not res.get('failed'), res
    assert res['server']['pid'] is None and res['server']['shm_dir'] is None and res['server']['located_by'] is None
    reason = res['server']['not_found_reason']
    assert 'the tritonserver process behind 127.0.0.1:%d was not found' % triton.http_port in reason
    assert 'could not be read' in reason and 'set server_pid or shm_dir' in reason and 'become: true' in reason
    assert any(reason in w for w in res['warnings'])
    assert sorted((r['name'], r['state']) for r in res['system_regions']) == [('dead', 'unknown'), ('live', 'unknown')]
    assert res['summary']['stale_regions'] == 0 and res['shm_fs'] is None


def test_region_stale_cleanup_fails_with_the_reason_and_touches_nothing(scene):
    triton, _live, before = scene
    res = run_module(REGION, dict(url=triton.url, state='absent', stale=True), prefix=BLIND)
    assert res.get('failed') is True, res
    assert res['msg'].startswith(
        'stale cleanup needs the tritonserver process behind %s and its shm directory, '
        'and the process was not found: the tritonserver process behind' % triton.url
    ), res['msg']
    assert 'set server_pid or shm_dir' in res['msg']
    assert (triton.system_regions(), triton.shm_files()) == before
    # the same call where the server can be seen does the work: the scene was real
    res = run_module(REGION, dict(url=triton.url, state='absent', stale=True))
    assert res['unregistered'] == ['dead'], res


def test_cleanup_playbook_fails_the_host_with_the_reason_everywhere(scene, tmp_path):
    triton, _live, before = scene
    res, report_dir, metrics = _blind_playbook('tritonops.shm.cleanup', triton, tmp_path, 'shm_cleanup_report_dir')
    assert res.rc != 0, res
    assert res.stats['t1']['failures'] == 1, res.stats
    assert (triton.system_regions(), triton.shm_files()) == before
    with open(report_dir / 't1.json') as f:
        report = json.load(f)
    assert report['status'] == 'failed' and report['changed'] is False
    assert report['error']['step'] == 'Locate the Triton server process'
    assert (
        'nothing on t1 could be checked: the tritonserver process behind 127.0.0.1:%d was not found' % triton.http_port
        in report['error']['msg']
    )
    assert report['done']['unregistered'] == [] and report['done']['removed_files'] == []
    summary = (report_dir / 'summary.md').read_text()
    assert '| t1 | failed |' in summary and 'Locate the Triton server process' in summary
    failed = res.task('tritonops.shm.shm_cleanup : Fail the host with the reason', host='t1')
    assert failed['failed'] is True
    assert failed['msg'].startswith(
        "shm_cleanup failed on t1 at 'Locate the Triton server process': nothing on t1 could be checked"
    )
    stats = res.data['global_custom_stats']['tritonops_shm_cleanup']['t1']
    assert stats['status'] == 'failed' and 'could be checked' in stats['error']['msg']
    assert metrics['tritonops_shm_cleanup_last_success'] == 0


def test_report_playbook_shows_the_host_unlocated_and_fails_it(scene, tmp_path):
    triton, _live, before = scene
    res, report_dir, metrics = _blind_playbook('tritonops.shm.report', triton, tmp_path, 'report_dir')
    assert res.rc != 0 and res.stats['t1']['failures'] == 1, res
    assert (triton.system_regions(), triton.shm_files()) == before
    with open(report_dir / 'report.json') as f:
        row = json.load(f)['hosts'][0]
    assert row['status'] == 'unlocated' and 'was not found' in row['error']
    table = '\n'.join(res.task("Show the fleet's shared memory", host='localhost')['msg'])
    assert 'UNLOCATED' in table and 'was not found' in table
    md = (report_dir / 'report.md').read_text()
    assert '| t1 | **unlocated** |' in md and 'whose server process was not found' in md
    assert metrics['tritonops_shm_up'] == 1 and metrics['tritonops_shm_server_located'] == 0
    # nothing could be checked: no state, file or byte figure (tritonops_shm_regions replaced tritonops_shm_stale_regions)
    assert 'tritonops_shm_regions' not in metrics and 'tritonops_shm_stale_bytes' not in metrics
