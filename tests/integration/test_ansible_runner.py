"""The report and cleanup playbooks through ansible-runner, the way AWX runs a job.

Real servers and real (SIGKILLed) tritonclient processes; the assertions are on what
AWX shows: job status and rc, job events (per task and host, with results), the
artifacts directory (job_events/, stdout, status, rc) and the set_stats data it stores
as job artifacts (playbook_on_stats -> artifact_data).
"""

from __future__ import annotations

import glob
import json
import os

import ansible_runner
import pytest
from ansible_helpers import BIN, COLLECTIONS_PATH, PYTHON

# ansible-runner's pexpect mode forks from the (threaded) pytest process, as it does in AWX
pytestmark = pytest.mark.filterwarnings('ignore:This process .* is multi-threaded:DeprecationWarning')

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'


def _inventory(hosts):
    return {
        'all': {
            'children': {
                'triton': {
                    'hosts': {
                        name: {'ansible_connection': 'local', 'ansible_python_interpreter': PYTHON, 'triton_url': url}
                        for name, url in hosts.items()
                    }
                }
            }
        }
    }


def _run(tmp_path, ident, playbook, hosts, extravars):
    private = tmp_path / 'runner'
    private.mkdir(exist_ok=True)
    envvars = {
        'PATH': BIN + os.pathsep + os.environ.get('PATH', ''),
        'ANSIBLE_COLLECTIONS_PATH': COLLECTIONS_PATH,
        'ANSIBLE_PYTHON_INTERPRETER': PYTHON,
        'ANSIBLE_HOST_KEY_CHECKING': 'False',
        'ANSIBLE_RETRY_FILES_ENABLED': 'False',
        'ANSIBLE_NOCOLOR': '1',
    }
    runner = ansible_runner.run(
        private_data_dir=str(private),
        ident=ident,
        playbook=playbook,
        inventory=_inventory(hosts),
        extravars=extravars,
        envvars=envvars,
        quiet=True,
        timeout=600,
    )
    return runner, private / 'artifacts' / ident


def _events(runner, event, host=None, action=None):
    found = []
    for ev in runner.events:
        data = ev.get('event_data', {})
        if ev.get('event') != event or (host and data.get('host') != host):
            continue
        if action and action not in (data.get('task_action'), data.get('resolved_action')):
            continue
        found.append(ev)
    return found


def _artifact_data(runner):
    stats = _events(runner, 'playbook_on_stats')
    assert len(stats) == 1
    return stats[0]['event_data'].get('artifact_data', {})


def _check_artifacts(runner, artifacts, status, rc):
    assert (artifacts / 'status').read_text().strip() == status
    assert (artifacts / 'rc').read_text().strip() == str(rc)
    on_disk = sorted(glob.glob(str(artifacts / 'job_events' / '*.json')))
    assert len(on_disk) == len(list(runner.events))
    for path in on_disk[:3] + on_disk[-3:]:
        with open(path) as f:
            assert json.load(f)['uuid']
    return (artifacts / 'stdout').read_text()


@pytest.mark.timeout(600)
def test_report_then_cleanup_through_ansible_runner(triton, tmp_path):
    live = triton.client('live_client', byte_size=1 << 20)
    triton.leak('leaked_runner', byte_size=4 << 20)
    report_dir = tmp_path / 'report'

    # report: read-only, one table, per-host module results in the events
    runner, artifacts = _run(
        tmp_path,
        'report',
        'tritonops.shm.report',
        {'h1': triton.url},
        {'target': 'triton', 'report_dir': str(report_dir), 'prometheus_textfile_dir': ''},
    )
    assert (runner.status, runner.rc) == ('successful', 0), runner.stdout.read()[-4000:]
    stdout = _check_artifacts(runner, artifacts, 'successful', 0)
    info = _events(runner, 'runner_on_ok', host='h1', action=INFO)
    assert len(info) == 1
    res = info[0]['event_data']['res']
    assert res['changed'] is False
    assert res['summary']['stale_regions'] == 1
    assert {r['name']: r['state'] for r in res['system_regions']} == {
        'live_client': 'healthy',
        'leaked_runner': 'stale',
    }
    assert runner.stats['failures'] == {} and 'h1' not in runner.stats['changed']  # localhost writes the report files
    table = [line for line in stdout.splitlines() if 'h1' in line and 'ok' in line and '2.51' in line]
    assert table, stdout[-3000:]
    assert json.loads((report_dir / 'report.json').read_text())['hosts'][0]['stale'] == ['leaked_runner']
    assert 'leaked_runner' in triton.system_regions()

    # cleanup: the stale region and its file go, the live client's stay; AWX artifacts carry the outcome
    runner, artifacts = _run(
        tmp_path,
        'cleanup',
        'tritonops.shm.cleanup',
        {'h1': triton.url},
        {'target': 'triton', 'prometheus_textfile_dir': ''},
    )
    assert (runner.status, runner.rc) == ('successful', 0), runner.stdout.read()[-4000:]
    _check_artifacts(runner, artifacts, 'successful', 0)
    region = _events(runner, 'runner_on_ok', host='h1', action=REGION)
    # one call for every kind: the system part, then the CUDA part (the server offers CUDA shared memory; this CPU
    # server lists none), its result under kinds.cuda
    assert len(region) == 1 and region[0]['event_data']['res']['kinds']['cuda']['unregistered'] == []
    res = region[0]['event_data']['res']
    assert res['changed'] is True
    assert res['unregistered'] == ['leaked_runner']
    assert runner.stats['changed'].get('h1')
    outcome = _artifact_data(runner)['tritonops_shm_cleanup']['h1']
    assert outcome['status'] == 'ok'
    assert outcome['done']['unregistered'] == ['leaked_runner']
    assert outcome['done']['freed_bytes'] >= 4 << 20

    regions = triton.system_regions()
    assert 'leaked_runner' not in regions and 'live_client' in regions
    files = triton.shm_files()
    assert 'leaked_runner' not in files and 'live_client' in files
    assert live.alive


@pytest.mark.timeout(600)
def test_a_down_server_fails_its_host_in_the_job(triton, tmp_path):
    """AWX shows the job failed, the down host failed with the reason, the other host ok."""
    triton.leak('leaked_fleet', byte_size=1 << 20)
    down = 'http://127.0.0.1:%d' % _closed_port()
    hosts = {'up': triton.url, 'down': down}
    runner, artifacts = _run(
        tmp_path, 'cleanup', 'tritonops.shm.cleanup', hosts, {'target': 'triton', 'prometheus_textfile_dir': ''}
    )
    assert (runner.status, runner.rc) == ('failed', 2)
    _check_artifacts(runner, artifacts, 'failed', 2)
    assert set(runner.stats['failures']) == {'down'}
    failed = _events(runner, 'runner_on_failed', host='down')
    assert failed and any('127.0.0.1' in json.dumps(ev['event_data']['res']) for ev in failed)
    outcomes = _artifact_data(runner)['tritonops_shm_cleanup']
    assert outcomes['up']['status'] == 'ok' and outcomes['up']['done']['unregistered'] == ['leaked_fleet']
    assert outcomes['down']['status'] == 'failed' and outcomes['down']['error']['msg']
    assert 'leaked_fleet' not in triton.system_regions()


def _closed_port():
    import socket  # pylint: disable=import-outside-toplevel

    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]
