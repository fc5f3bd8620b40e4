"""The metrics feed that costs nothing extra: the module call that reads the server writes the node_exporter textfile.

Real tritonservers, two of them as two inventory hosts on one machine sharing one textfile directory: the report and
cleanup playbooks and a plain module task write one file per host and URL, through the module call itself (no task of its
own), never as a change and never in check mode; a missing directory is one warning per call and the run goes on.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

from ansible_helpers import PYTHON, ansible_playbook, run_module
from prometheus_client.parser import text_string_to_metric_families

MiB = 1 << 20


def inventory(fleet, textfile_dir) -> dict:
    hosts = {
        s.name: dict(
            ansible_connection='local',
            ansible_python_interpreter=PYTHON,
            triton_url=s.url,
            prometheus_textfile_dir=str(textfile_dir),
        )
        for s in fleet.servers
    }
    return {'all': {'children': {'triton': {'hosts': hosts}}}}


def series(directory) -> dict:
    """{(file kind, host): {sample name with its extra labels: value}}, each sample's host and triton_url checked."""
    out = {}
    for path in sorted(directory.iterdir()):
        kind, host = path.name.split('.')[:2]
        assert path.name.endswith('.prom') and stat.S_IMODE(path.stat().st_mode) == 0o644, path
        got = out.setdefault((kind, host), {})
        for family in text_string_to_metric_families(path.read_text()):
            for s in family.samples:
                labels = dict(s.labels)
                assert labels.pop('host') == host and labels.pop('triton_url'), (path, s)
                got[s.name + ''.join(f'{{{k}={v}}}' for k, v in sorted(labels.items()))] = s.value
    return out


def promtool_check(directory) -> None:
    promtool = os.environ.get('PROMTOOL') or shutil.which('promtool')
    assert promtool, 'promtool not found (PROMTOOL)'
    for path in directory.iterdir():
        proc = subprocess.run(
            [promtool, 'check', 'metrics'],
            input=path.read_text(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), (path, proc.stdout, proc.stderr)


def task_names(res, host) -> list:
    return [name for name, _r in res.tasks(host)]


def test_two_servers_on_one_machine_keep_their_own_files_and_series(fleet, tmp_path):
    t1, t2 = fleet.servers
    t1.leak('dead', byte_size=4 * MiB)
    t2.leak('dead', byte_size=2 * MiB)
    t2.leak('dead2', byte_size=1 * MiB)
    textfiles = tmp_path / 'textfile_collector'
    textfiles.mkdir()
    inv = inventory(fleet, textfiles)

    # check mode writes nothing
    res = ansible_playbook('tritonops.shm.report', inventory=inv, check=True)
    assert res.stats['triton1']['failures'] == 0 and res.stats['triton1']['changed'] == 0, res
    res = ansible_playbook('tritonops.shm.cleanup', inventory=inv, check=True)
    assert res.stats['triton1']['failures'] == 0, res
    assert list(textfiles.iterdir()) == [] and 'dead' in t1.system_regions()

    res = ansible_playbook('tritonops.shm.report', inventory=inv)
    assert all(res.stats[s.name]['failures'] == 0 and res.stats[s.name]['changed'] == 0 for s in fleet.servers), res
    # written by the query itself: the report play has no task of its own for the metrics
    assert task_names(res, 'triton1') == [
        'Read regions, files and /dev/shm use',
        'Fail with the reason',
    ]
    info = res.task('Read regions, files and /dev/shm use', 'triton1')
    assert info['metrics_files'] == [str(p) for p in textfiles.glob('tritonops_shm.triton1.*.prom')] and not info.get(
        'warnings'
    )
    got = series(textfiles)
    assert sorted(got) == [('tritonops_shm', 'triton1'), ('tritonops_shm', 'triton2')]
    assert got[('tritonops_shm', 'triton1')]['tritonops_shm_regions{state=stale}'] == 1
    assert got[('tritonops_shm', 'triton2')]['tritonops_shm_regions{state=stale}'] == 2
    assert got[('tritonops_shm', 'triton2')]['tritonops_shm_stale_bytes'] == 3 * MiB

    res = ansible_playbook('tritonops.shm.cleanup', inventory=inv)
    assert all(res.stats[s.name]['failures'] == 0 and res.stats[s.name]['changed'] == 1 for s in fleet.servers), res
    assert not [n for n in task_names(res, 'triton1') if 'etric' in n or 'textfile' in n], task_names(res, 'triton1')
    got = series(textfiles)
    assert sorted(got) == [
        ('tritonops_shm', 'triton1'),
        ('tritonops_shm', 'triton2'),
        ('tritonops_shm_cleanup', 'triton1'),
        ('tritonops_shm_cleanup', 'triton2'),
    ]
    c1, c2 = got[('tritonops_shm_cleanup', 'triton1')], got[('tritonops_shm_cleanup', 'triton2')]
    assert c1['tritonops_shm_cleanup_last_success'] == 1 and c1['tritonops_shm_cleanup_last_unregistered_regions'] == 1
    assert (
        c2['tritonops_shm_cleanup_last_unregistered_regions'] == 2
        and c2['tritonops_shm_cleanup_last_removed_files'] == 2
    )
    assert c1['tritonops_shm_cleanup_freed_bytes_total'] == c1['tritonops_shm_cleanup_last_freed_bytes'] >= 4 * MiB
    assert c2['tritonops_shm_cleanup_freed_bytes_total'] >= 3 * MiB
    # the report file is the report's: the cleanup leaves it as the report wrote it
    assert got[('tritonops_shm', 'triton2')]['tritonops_shm_regions{state=stale}'] == 2

    # a plain module task writes its files too; the region module's counter goes on from the cleanup's file
    t1.leak('dead3', byte_size=2 * MiB)
    res = run_module(
        'tritonops.shm.triton_shm_region',
        dict(url=t1.url, state='absent', stale=True, metrics_dir=str(textfiles), metrics_host='triton1'),
    )
    assert res['changed'] and res['unregistered'] == ['dead3'], res
    assert res['metrics_files'] == [str(p) for p in textfiles.glob('tritonops_shm_cleanup.triton1.*.prom')], res
    c1_after = series(textfiles)[('tritonops_shm_cleanup', 'triton1')]
    assert c1_after['tritonops_shm_cleanup_freed_bytes_total'] == (
        c1['tritonops_shm_cleanup_freed_bytes_total'] + c1_after['tritonops_shm_cleanup_last_freed_bytes']
    )
    assert c1_after['tritonops_shm_cleanup_last_freed_bytes'] >= 2 * MiB
    res = run_module(
        'tritonops.shm.triton_shm_info', dict(url=t2.url, metrics_dir=str(textfiles), metrics_host='triton2')
    )
    assert not res['changed'] and res['metrics_files'] == [
        str(p) for p in textfiles.glob('tritonops_shm.triton2.*.prom')
    ]
    assert len(list(textfiles.iterdir())) == 4  # still one file per host and kind
    promtool_check(textfiles)


def test_a_failing_call_writes_its_outcome_and_a_missing_directory_is_one_warning(fleet, tmp_path):
    t1, t2 = fleet.servers
    t2.stop()
    textfiles = tmp_path / 'textfile_collector'
    textfiles.mkdir()
    inv = inventory(fleet, textfiles)

    res = ansible_playbook('tritonops.shm.report', inventory=inv)
    assert res.stats['triton2']['failures'] == 1 and res.stats['triton1']['failures'] == 0, res
    res = ansible_playbook('tritonops.shm.cleanup', inventory=inv)
    assert res.stats['triton2']['failures'] == 1 and res.stats['triton1']['failures'] == 0, res
    got = series(textfiles)
    # the down server: written by the failing module calls themselves
    down = got[('tritonops_shm', 'triton2')]
    assert sorted(down) == [
        'tritonops_shm_report_timestamp_seconds',
        'tritonops_shm_server_located',
        'tritonops_shm_up',
    ]
    assert down['tritonops_shm_up'] == 0 and down['tritonops_shm_server_located'] == 0
    assert got[('tritonops_shm_cleanup', 'triton2')]['tritonops_shm_cleanup_last_success'] == 0
    assert got[('tritonops_shm_cleanup', 'triton2')]['tritonops_shm_cleanup_last_success_timestamp_seconds'] == 0
    assert got[('tritonops_shm_cleanup', 'triton1')]['tritonops_shm_cleanup_last_success'] == 1
    promtool_check(textfiles)

    # a directory that does not exist: one warning per call, nothing written, the run goes on
    missing = tmp_path / 'no_node_exporter'
    inv = inventory(fleet, missing)
    res = ansible_playbook('tritonops.shm.cleanup', inventory=inv, extra_vars={'target': 'triton1'})
    assert res.stats['triton1']['failures'] == 0, res
    call = res.task(
        'tritonops.shm.shm_cleanup : Query, unregister stale regions and remove their files and orphan files', 'triton1'
    )
    assert call['metrics_files'] == [] and len(call['warnings']) == 1, call
    assert call['warnings'][0].startswith(f'{missing} does not exist on this host: no metrics written'), call
    res = ansible_playbook('tritonops.shm.report', inventory=inv, extra_vars={'target': 'triton1'})
    info = res.task('Read regions, files and /dev/shm use', 'triton1')
    assert res.stats['triton1']['failures'] == 0 and len(info['warnings']) == 1 and info['metrics_files'] == [], info
    assert not missing.exists()
