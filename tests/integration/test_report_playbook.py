"""The read-only report playbook on a real fleet: the table, report.json, report.md and metrics."""

from __future__ import annotations

import json
import sys
import time

import tritonrig
from ansible_helpers import COLLECTIONS_PATH, PYTHON, ansible_playbook
from prometheus_client.parser import text_string_to_metric_families

MiB = 1 << 20
AGED = 2.0  # seconds: the orphan's min_age; the test waits until the file is older (tritonrig.wait_older)


def metrics(directory, kind, host):
    """{sample name (with its labels other than host and triton_url): (value, labels)} of host's one file of kind."""
    [path] = directory.glob(f'{kind}.{host}.*.prom')
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            extra = ','.join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in ('host', 'triton_url'))
            out[sample.name + (f'{{{extra}}}' if extra else '')] = (sample.value, sample.labels)
    return out


def test_report_table_files_and_metrics(fleet, tmp_path):
    up, down = fleet.servers
    orphan = up.write_file('client_orphan', MiB)  # first: it ages while the clients start
    live = up.client('live', byte_size=2 * MiB)
    up.leak('dead', byte_size=8 * MiB)
    with open(up.shm_path('/nccl-shm-rank0'), 'wb') as f:  # another program's file: explained, never touched
        f.write(b'\1' * 2 * MiB)
    down.stop()
    tritonrig.wait_older([orphan], AGED)
    before = (up.system_regions(), up.shm_files())
    prom = {s.name: tmp_path / ('prom-' + s.name) for s in fleet.servers}
    for d in prom.values():
        d.mkdir()
    hosts = dict(
        (
            s.name,
            dict(
                ansible_connection='local',
                ansible_python_interpreter=PYTHON,
                triton_url=s.url,
                prometheus_textfile_dir=str(prom[s.name]),
            ),
        )
        for s in fleet.servers
    )
    inv = {'all': {'children': {'triton': {'hosts': hosts}}}}
    report_dir = tmp_path / 'report'
    orphans = {'shm_cleanup_orphan_patterns': ['client_*'], 'shm_cleanup_min_age': AGED}

    res = ansible_playbook(
        'tritonops.shm.report',
        inventory=inv,
        extra_vars={'report_dir': str(report_dir), **orphans},
    )

    # read-only: nothing changed on the server
    assert (up.system_regions(), up.shm_files()) == before and live.alive
    # the down host fails, after the table was printed
    assert res.stats['triton2']['failures'] == 1 and res.stats['triton1']['failures'] == 0, res

    lines = res.task("Show the fleet's shared memory")['msg']
    assert lines[0].split() == [
        'HOST',
        'STATUS',
        'TRITON',
        '/DEV/SHM',
        'USED',
        'REGIONS',
        'STALE',
        'DANGLING',
        'ORPHAN',
    ]
    row = [line for line in lines if line.startswith('triton1 ')][0].split()
    # triton1  ok  2.51.0  11.0 MiB/32.0 MiB 34%  2  1 (8.0 MiB)  0  1 (1.0 MiB)
    assert row[1] == 'ok' and row[2].startswith('2.')
    assert row[7:] == ['2', '1', '(8.0', 'MiB)', '0', '1', '(1.0', 'MiB)'], lines
    assert row[4].startswith('MiB/32.0')
    down_row = [line for line in lines if line.startswith('triton2 ')][0]
    assert 'DOWN' in down_row and 'cannot connect' in down_row

    data = json.loads((report_dir / 'report.json').read_text())
    rows = dict((r['host'], r) for r in data['hosts'])
    assert rows['triton1']['stale'] == ['dead'] and rows['triton1']['stale_bytes'] == 8 * MiB
    assert rows['triton1']['orphan_bytes'] == MiB and rows['triton1']['regions'] == 2
    assert rows['triton1']['shm_total_bytes'] == 32 * MiB
    assert rows['triton1']['shm_used_bytes'] == up.shm_usage()['used_bytes']
    assert rows['triton2']['status'] == 'down' and 'cannot connect' in rows['triton2']['error']

    md = (report_dir / 'report.md').read_text()
    assert '| triton1 | ok |' in md and '| triton2 | **down** |' in md
    assert '- **triton1**: dead' in md
    # what fills /dev/shm: the categories add up to what the filesystem says is used, nccl's file is named
    explained = rows['triton1']['bytes_by_category']
    assert explained['registered_bytes'] == 10 * MiB and explained['foreign_bytes'] == 2 * MiB
    assert sum(explained.values()) == rows['triton1']['shm_used_bytes'], explained
    assert rows['triton1']['families'][0]['name'] == 'nccl' and rows['triton1']['families'][0]['unheld_files'] == 1
    fills = md.split('## What fills /dev/shm', 1)[1]
    assert '| triton1 |' in fills and 'nccl 1 file(s), 2.0 MiB (1 unheld)' in fills and 'triton2' not in fills

    m = metrics(prom['triton1'], 'tritonops_shm', 'triton1')
    assert m['tritonops_shm_up'] == (1.0, {'host': 'triton1', 'triton_url': up.url})
    assert m['tritonops_shm_fs_size_bytes'][0] == 32 * MiB
    assert m['tritonops_shm_regions{state="stale"}'][0] == 1 and m['tritonops_shm_stale_bytes'][0] == 8 * MiB
    assert m['tritonops_shm_orphan_bytes'][0] == MiB and m['tritonops_shm_regions{state="healthy"}'][0] == 1
    assert sum(v for k, (v, _labels) in m.items() if k.startswith('tritonops_shm_regions{')) == 2
    assert m['tritonops_shm_files{category="orphan"}'][0] == 1 and m['tritonops_shm_registered_bytes'][0] == 10 * MiB
    m = metrics(prom['triton2'], 'tritonops_shm', 'triton2')
    assert m['tritonops_shm_up'][0] == 0 and 'tritonops_shm_fs_size_bytes' not in m

    # the cleanup playbook writes the last cleanup's time and outcome next to it
    start = time.time()
    res = ansible_playbook('tritonops.shm.cleanup', inventory=inv, extra_vars=orphans)
    assert res.stats['triton1']['failures'] == 0 and res.stats['triton2']['failures'] == 1, res
    m = metrics(prom['triton1'], 'tritonops_shm_cleanup', 'triton1')
    assert m['tritonops_shm_cleanup_last_success'][0] == 1
    assert m['tritonops_shm_cleanup_last_unregistered_regions'][0] == 1
    assert m['tritonops_shm_cleanup_last_removed_files'][0] == 2
    assert m['tritonops_shm_cleanup_last_freed_bytes'][0] == 9 * MiB
    assert start - 2 <= m['tritonops_shm_cleanup_last_run_timestamp_seconds'][0] <= time.time() + 2
    m = metrics(prom['triton2'], 'tritonops_shm_cleanup', 'triton2')
    assert m['tritonops_shm_cleanup_last_success'][0] == 0


def test_an_unreachable_host_is_shown_not_run_and_the_others_reported(fleet, tmp_path):
    """A host Ansible cannot reach sets no fact: the fleet table, JSON and HTML still come, with it marked 'not run'."""
    up = fleet.servers[0]
    up.leak('dead', byte_size=MiB)
    hosts = {
        up.name: dict(
            ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=up.url, prometheus_textfile_dir=''
        ),
        # nothing listens on port 1 of this machine's loopback: the connection is refused, the host unreachable
        'ghost': dict(
            ansible_connection='ssh',
            ansible_host='127.0.0.1',
            ansible_port=1,
            ansible_user='nobody',
            ansible_ssh_common_args='-o BatchMode=yes -o ConnectTimeout=5',
            triton_url='http://127.0.0.1:1',
        ),
    }
    inv = {'all': {'children': {'triton': {'hosts': hosts}}}}
    report_dir = tmp_path / 'report'

    res = ansible_playbook('tritonops.shm.report', inventory=inv, extra_vars={'report_dir': str(report_dir)})

    assert res.stats['ghost']['unreachable'] == 1, res
    lines = res.task("Show the fleet's shared memory")['msg']
    assert [line for line in lines if line.startswith(f'{up.name} ')][0].split()[1] == 'ok', lines
    assert 'NOT RUN' in [line for line in lines if line.startswith('ghost ')][0], lines
    rows = {r['host']: r for r in json.loads((report_dir / 'report.json').read_text())['hosts']}
    assert rows['ghost']['status'] == 'not run' and rows[up.name]['stale'] == ['dead']
    assert 'ghost' in (report_dir / 'report.html').read_text()


# -- issue 29: down, unlocated, unsupported and misconfigured told apart --------------------------------------------


def unsupported_server():
    """Triton 2.73 through tritonfrontend: answers /v2, and 503 with its text on every shared-memory route.

    No wheel bundles a 2.73 server: this is the unit tests' versioned model (tests/fakes/fake_triton.py), served over HTTP.
    """
    if COLLECTIONS_PATH not in sys.path:  # the fake imports the collection's errors
        sys.path.insert(0, COLLECTIONS_PATH)
    # tests/fakes is on the path (conftest)
    from fake_triton import HttpFront, Triton  # pylint: disable=import-outside-toplevel

    return HttpFront(Triton('2.73.0', frontend=True))


def test_report_tells_down_unlocated_unsupported_and_misconfigured_apart(fleet, tmp_path):
    up, down = fleet.servers
    up.leak('dead', byte_size=MiB)
    down.stop()
    front = unsupported_server()
    try:
        local = dict(ansible_connection='local', ansible_python_interpreter=PYTHON, prometheus_textfile_dir='')
        hosts = {
            'ok1': dict(local, triton_url=up.url),
            'down1': dict(local, triton_url=down.url),
            'unsupported1': dict(local, triton_url=front.url),
            'nourl1': dict(local),
            'badurl1': dict(local, triton_url='127.0.0.1:8000'),
        }
        inv = {'all': {'children': {'triton': {'hosts': hosts}}}}
        report_dir = tmp_path / 'report'
        res = ansible_playbook('tritonops.shm.report', inventory=inv, extra_vars={'report_dir': str(report_dir)})
    finally:
        front.close()

    want = {
        'ok1': 'ok',
        'down1': 'down',
        'unsupported1': 'unsupported',
        'nourl1': 'misconfigured',
        'badurl1': 'misconfigured',
    }
    # an unsupported server is not a leak: it does not fail a scheduled report; the others fail after the table
    assert {h: res.stats[h]['failures'] for h in want} == {
        'ok1': 0,
        'down1': 1,
        'unsupported1': 0,
        'nourl1': 1,
        'badurl1': 1,
    }, res
    lines = res.task("Show the fleet's shared memory")['msg']
    assert {h: [line for line in lines if line.startswith(f'{h} ')][0].split()[1] for h in want} == {
        h: s if s == 'ok' else s.upper() for h, s in want.items()
    }, lines
    rows = {r['host']: r for r in json.loads((report_dir / 'report.json').read_text())['hosts']}
    assert {h: rows[h]['status'] for h in want} == want
    assert 'cannot connect' in rows['down1']['error']
    assert 'triton_url is not set' in rows['nourl1']['error'] and 'undefined' not in rows['nourl1']['error']
    assert 'is not an http, https, grpc or grpcs URL' in rows['badurl1']['error']
    assert 'not supported in this server configuration' in rows['unsupported1']['error']
    md = (report_dir / 'report.md').read_text()
    assert (
        '| nourl1 | **misconfigured** |' in md
        and '| unsupported1 | **unsupported** |' in md
        and '| down1 | **down** |' in md
    )
    page = (report_dir / 'report.html').read_text()
    for host, status in want.items():
        assert f'data-host="{host}" data-status="{status}"' in page or status == 'ok', (host, status)


def test_report_calls_a_server_it_cannot_see_unlocated_and_fails_it(fleet, tmp_path):
    """Ansible where the server's processes are invisible (a container without the host's process table)."""
    up = fleet.servers[0]
    hosts = {
        'blind1': dict(
            ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=up.url, prometheus_textfile_dir=''
        )
    }
    inv = {'all': {'children': {'triton': {'hosts': hosts}}}}
    res = ansible_playbook(
        'tritonops.shm.report',
        inventory=inv,
        extra_vars={'report_dir': str(tmp_path / 'r')},
        prefix=('unshare', '--pid', '--fork', '--mount-proc'),
    )
    assert res.stats['blind1']['failures'] == 1, res
    row = json.loads((tmp_path / 'r' / 'report.json').read_text())['hosts'][0]
    assert row['status'] == 'unlocated' and row['error'], row
