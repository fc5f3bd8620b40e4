"""Unit tests for the tritonops.shm._shm_fleet_table filter: the report and cleanup tables, line by line."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.shm_fleet_table import FilterModule
from ansible_collections.tritonops.shm.plugins.plugin_utils.report.fleet_table import (
    FREED_SAYS,
    freed,
    shm_fleet_table,
    shm_report_results,
    shm_report_row,
    shm_report_rows,
)

MIB = 1 << 20
OK_ROW = dict(
    host='t1',
    status='ok',
    version='2.51.0',
    shm_used_bytes=8 * MIB,
    shm_total_bytes=64 * MIB,
    shm_used_percent=12.5,
    regions=3,
    stale_regions=1,
    stale_bytes=MIB,
    dangling_regions=0,
    orphan_files=2,
    orphan_bytes=2 * MIB,
)


def cleanup_result(status='ok', changed=True, error=None, before=True, after=True, check_mode=False, acted=True):
    used = dict(used_bytes=32 * MIB, total_bytes=64 * MIB, used_percent=50.0)
    return dict(
        status=status,
        changed=changed,
        error=error,
        decision='1 stale or dangling region(s): dead',
        before=used if before else None,
        after=dict(used, used_bytes=16 * MIB, used_percent=25.0) if after else None,
        check_mode=check_mode,
        acted=acted,
        skipped=[dict(name='x', reason='y')],
        done=dict(unregistered=['dead'], removed_files=['/dev/shm/dead'], freed_bytes=MIB),
    )


@pytest.mark.parametrize(
    'row, expected',
    [
        (
            OK_ROW,
            ['t1', 'ok', '2.51.0', '8.0', 'MiB/64.0', 'MiB', '12%', '3', '1', '(1.0', 'MiB)', '0', '2', '(2.0', 'MiB)'],
        ),
        (
            dict(OK_ROW, shm_total_bytes=0),
            ['t1', 'ok', '2.51.0', 'unknown', '3', '1', '(1.0', 'MiB)', '0', '2', '(2.0', 'MiB)'],
        ),
        (dict(host='t1', status='down', error='cannot connect'), ['t1', 'DOWN', 'cannot', 'connect']),
        (dict(host='t1', status='unlocated', error='x' * 300), ['t1', 'UNLOCATED', 'x' * 197 + '...']),
    ],
)
def test_the_fleet_table_prints_one_line_per_report_row(row, expected):
    lines = shm_fleet_table([row], 'report')
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
    assert lines[1].split() == expected


def test_report_width_follows_the_longest_host():
    lines = shm_fleet_table([dict(OK_ROW, host='a-long-host-name'), dict(OK_ROW, host='b')], 'report')
    assert lines[2].index('ok') == lines[1].index('ok') == len('a-long-host-name') + 2


@pytest.mark.parametrize(
    'result, check_mode, expected',
    [
        (
            cleanup_result(),
            False,
            [
                't1',
                'ok*',
                '32.0',
                'MiB/64.0',
                'MiB',
                '50%',
                '16.0',
                'MiB/64.0',
                'MiB',
                '25%',
                '1',
                '1',
                '1.0',
                'MiB',
                '1',
                '1',
                'stale',
                'or',
                'dangling',
                'region(s):',
                'dead',
            ],
        ),
        (
            cleanup_result(changed=False, after=False, check_mode=True),
            True,
            [
                't1',
                'ok',
                '32.0',
                'MiB/64.0',
                'MiB',
                '50%',
                '(check',
                'mode)',
                '1',
                '1',
                '1.0',
                'MiB',
                '1',
                '1',
                'stale',
                'or',
                'dangling',
                'region(s):',
                'dead',
            ],
        ),
        (
            cleanup_result(
                status='failed',
                changed=False,
                before=False,
                after=False,
                error=dict(step='Query', msg='cannot connect'),
            ),
            False,
            ['t1', 'failed', '-', '-', '1', '1', '1.0', 'MiB', '1', 'FAILED', 'at', 'Query:', 'cannot', 'connect'],
        ),
        (
            None,
            False,
            [
                't1',
                'not',
                'run',
                '-',
                '-',
                '-',
                '-',
                '-',
                '-',
                'no',
                'result',
                '(unreachable,',
                'limited',
                'out',
                'or',
                'stopped',
                'early)',
            ],
        ),
    ],
)
def test_cleanup_rows(result, check_mode, expected):
    lines = shm_fleet_table([result], 'cleanup', hosts=['t1'], check_mode=check_mode)
    assert lines[0].split() == [
        'HOST',
        'STATUS',
        'SHM',
        'BEFORE',
        'SHM',
        'AFTER',
        'UNREG',
        'FILES',
        'FREED',
        'SKIP',
        'NOTE',
    ]
    assert lines[1].split() == expected
    assert lines[-2] == f'(* changed{"; check mode: what would be done, nothing was changed" if check_mode else ""})'
    assert lines[-1] == FREED_SAYS


@pytest.mark.parametrize(
    'rows, kind, hosts, match',
    [
        ([], 'other', None, "kind must be 'report' or 'cleanup'"),
        ([None], 'cleanup', ['a', 'b'], 'one result'),
    ],
)
def test_errors(rows, kind, hosts, match):
    with pytest.raises(AnsibleFilterError, match=match):
        shm_fleet_table(rows, kind, hosts=hosts)


def test_filter_module():
    assert {name: f.target() for name, f in FilterModule().filters().items()} == {
        '_shm_fleet_table': shm_fleet_table,
        '_shm_report_row': shm_report_row,
        '_shm_report_rows': shm_report_rows,
        '_shm_report_results': shm_report_results,
    }


def info_result(pid=42, reason=None):
    summary = dict(
        total_bytes=64 * MIB,
        used_bytes=8 * MIB,
        used_percent=12.5,
        system_regions=3,
        cuda_regions=0,
        healthy_regions=1,
        stale_regions=1,
        stale_bytes=MIB,
        dangling_regions=1,
        unknown_regions=0,
        orphan_files=2,
        orphan_bytes=2 * MIB,
    )
    return dict(
        server=dict(pid=pid, version='2.51.0', ready=True, shm_dir='/dev/shm', not_found_reason=reason),
        summary=summary,
        holders_complete=True,
        scanned_at=1.5,
        system_regions=[
            dict(name='a', state='healthy'),
            dict(name='b', state='stale'),
            dict(name='c', state='dangling'),
        ],
    )


@pytest.mark.parametrize(
    'info, status, error',
    [
        (info_result(), 'ok', None),
        (info_result(pid=None, reason='not found: set server_pid'), 'unlocated', 'not found: set server_pid'),
        # Triton 2.73+ through tritonfrontend: answering, but with no shared memory at all (nothing checked, not a leak)
        (
            dict(
                info_result(),
                server=dict(info_result()['server'], shm_unsupported='HTTP 503: Shared memory is not supported'),
            ),
            'unsupported',
            'HTTP 503: Shared memory is not supported',
        ),
    ],
)
def test_report_row(info, status, error):
    row = shm_report_row(info, 't1', 'http://t1:8000')
    assert (row['host'], row['url'], row['status'], row['error']) == ('t1', 'http://t1:8000', status, error)
    assert (row['regions'], row['stale'], row['dangling'], row['shm_used_percent']) == (3, ['b'], ['c'], 12.5)
    assert shm_fleet_table([row], 'report')[1].split()[:2] == ['t1', status.upper() if status != 'ok' else 'ok']


NOT_RUN_ROW = {'host': 'h2', 'status': 'not run', 'error': 'no result'}


@pytest.mark.parametrize(
    'reports, hosts, rows',
    [
        ([], [], []),
        ([{'host': 'h1', 'status': 'ok'}, None], ['h1', 'h2'], [{'host': 'h1', 'status': 'ok'}, NOT_RUN_ROW]),
        (
            [None, {'host': 'h2', 'status': 'down', 'error': 'x'}],
            ['h1', 'h2'],
            [dict(NOT_RUN_ROW, host='h1'), {'host': 'h2', 'status': 'down', 'error': 'x'}],
        ),
        ((None,), ('h2',), [NOT_RUN_ROW]),
    ],
)
def test_report_rows(reports, hosts, rows):
    assert shm_report_rows(reports, hosts) == rows


def test_report_rows_need_one_report_per_host():
    with pytest.raises(AnsibleFilterError, match='^shm_report_rows: needs one report'):
        shm_report_rows([None], ['h1', 'h2'])


# -- issue 25 and issue 26 finding 7: a host whose holders could not all be seen is never ok ----------------------------

REASON = "the module runs outside the host's initial PID namespace (...): ... set clients_share_pid_namespace: true ..."


@pytest.mark.parametrize(
    'over, error',
    [
        # inside the Triton container (issue 25)
        (dict(holders_complete=False, holders_incomplete_reason=REASON, pid_namespace='other'), REASON),
        # not root, triton_server_pid given, the shm directory unreadable (issue 26 finding 7): nothing checked
        (
            dict(
                holders_complete=False,
                pid_namespace='initial',
                holders_incomplete_reason='shm_dir /proc/42/root/dev/shm is not readable: Permission denied',
            ),
            'shm_dir /proc/42/root/dev/shm is not readable: Permission denied',
        ),
        # a result without the reason (an older module): still not ok
        (dict(holders_complete=False), 'holders could not be fully determined'),
    ],
)
def test_a_row_whose_holders_are_incomplete_is_incomplete_with_the_reason(over, error):
    row = shm_report_row(dict(info_result(), **over), 't1', 'http://t1:8000')
    assert (row['status'], row['error'], row['holders_complete']) == ('incomplete', error, False)
    assert row['pid_namespace'] == over.get('pid_namespace')
    lines = shm_fleet_table([row], 'report')
    assert lines[1].split()[:3] == ['t1', 'incomplete', '2.51.0'], (
        lines
    )  # its numbers, then why they are not the whole truth
    assert lines[2].strip() == error[:200]


def test_a_complete_row_in_another_pid_namespace_is_ok():
    """clients_share_pid_namespace: true inside a container: complete, and the row says where it ran."""
    row = shm_report_row(
        dict(info_result(), pid_namespace='other', holders_incomplete_reason=None), 't1', 'http://t1:8000'
    )
    assert (row['status'], row['pid_namespace'], row['holders_incomplete_reason']) == ('ok', 'other', None)


def test_an_incomplete_cleanup_row():
    lines = shm_fleet_table([cleanup_result(status='incomplete', changed=False)], 'cleanup', hosts=['t1'])
    assert lines[1].split()[:2] == ['t1', 'incomplete']


def test_the_row_names_the_servers_pod_and_its_clients_containers():
    info = info_result()
    info['server']['container'] = dict(runtime='containerd', pod_uid='5c1e', name='pod ml/triton-0')
    info['system_regions'][0]['holders'] = [
        dict(pid=7, comm='python', container=dict(name='pod ml/client-0')),
        dict(pid=8, comm='python'),
    ]
    row = shm_report_row(info, 't1', 'http://t1:8000')
    assert row['server_container'] == 'pod ml/triton-0'
    assert row['clients'] == ['pod ml/client-0', 'python (pid 8)']
    lines = shm_fleet_table([row], 'report')
    assert lines[2].split() == [
        'server',
        'in',
        'pod',
        'ml/triton-0;',
        'clients:',
        'pod',
        'ml/client-0,',
        'python',
        '(pid',
        '8)',
    ]
    # on the host, nobody holding: no such line; the fields are there, empty
    row = shm_report_row(info_result(), 't1', 'http://t1:8000')
    assert (row['server_container'], row['clients']) == (None, [])
    assert len(shm_fleet_table([row], 'report')) == 2


# -- issue 29: the report tells down, unlocated, unsupported and misconfigured apart -------------------------------------

DOWN = {
    'failed': True,
    'msg': 'read server metadata at http://t1:8000/v2: cannot connect to Triton (refused or unreachable)',
    'failure': {'url': 'http://t1:8000/v2', 'status': None, 'server_error': None, 'transport': 'http'},
}
UNDEFINED = {
    'failed': True,
    'exception': '(traceback unavailable)',
    'msg': "Task failed: Finalization of task args failed: 'triton_url' is undefined",
}
REFUSED = {'failed': True, 'msg': 'timeout must be more than 0 seconds'}


@pytest.mark.parametrize(
    'result, url, status, error',
    [
        (DOWN, 'http://t1:8000', 'down', DOWN['msg']),
        (UNDEFINED, None, 'misconfigured', 'triton_url is not set for this host: set it in the inventory'),
        (UNDEFINED, '  ', 'misconfigured', 'triton_url is not set for this host'),
        (DOWN, 't1:8000', 'misconfigured', "triton_url 't1:8000' is not an http, https, grpc or grpcs URL with a host"),
        (DOWN, 'ftp://t1/x', 'misconfigured', 'is not an http, https, grpc or grpcs URL'),
        (DOWN, 'http://t1:99999', 'misconfigured', 'has an invalid port'),
        (DOWN, ['http://t1:8000'], 'misconfigured', 'triton_url must be a URL string, got a list'),
        (
            REFUSED,
            'http://t1:8000',
            'misconfigured',
            'the query refused its arguments before asking the server: timeout must be more than 0 seconds',
        ),
        # a successful query with no usable URL cannot be a row of this URL either
        (info_result(), None, 'misconfigured', 'triton_url is not set'),
    ],
)
def test_a_failed_query_is_down_only_when_the_server_was_asked(result, url, status, error):
    row = shm_report_row(result, 't1', url)
    assert (row['host'], row['status']) == ('t1', status)
    assert error in row['error']
    assert shm_fleet_table([row], 'report')[1].split()[:2] == ['t1', status.upper()]


def test_a_url_with_credentials_is_never_shown():
    row = shm_report_row(DOWN, 't1', 'http://user:secret@t1:8000')
    assert row['status'] == 'down' and 'secret' not in str(row)


def test_report_results_make_one_row_per_host_whatever_happened():
    unsupported = dict(info_result(), server=dict(info_result()['server'], shm_unsupported='HTTP 503: not supported'))
    unreachable = {
        'unreachable': True,
        'msg': 'ssh: connect to host 127.0.0.1 port 1: Connection refused',
        'changed': False,
    }
    rows = shm_report_results(
        [info_result(), DOWN, UNDEFINED, unsupported, None, unreachable],
        ['a', 'b', 'c', 'd', 'e', 'f'],
        ['http://a:8000', 'http://b:8000', None, 'http://d:8000', 'http://e:8000', 'http://f:8000'],
    )
    assert [(r['host'], r['status']) for r in rows] == [
        ('a', 'ok'),
        ('b', 'down'),
        ('c', 'misconfigured'),
        ('d', 'unsupported'),
        ('e', 'not run'),
        ('f', 'not run'),
    ]
    with pytest.raises(AnsibleFilterError, match='^shm_report_results: needs one result'):
        shm_report_results([None], ['a', 'b'])


def test_cuda_regions_get_a_line_under_their_host_in_both_tables():
    """Issue 34, goal 3: the GPU memory of CUDA regions by state (report) and what the cleanup gave back (cleanup);
    hosts without CUDA regions keep one line."""
    row = dict(
        OK_ROW, cuda_regions=3, cuda_stale_regions=1, cuda_stale_bytes=1 << 30, cuda_unknown_regions=2,
        cuda_unknown_bytes=2 * MIB,
    )  # fmt: skip
    lines = shm_fleet_table([row, OK_ROW], 'report')
    assert lines[2].split() == [
        'CUDA:',
        '3',
        'region(s),',
        'stale',
        '1',
        '(1.0',
        'GiB),',
        'unknown',
        '2',
        '(2.0',
        'MiB)',
    ]
    assert len(lines) == 4 and lines[3].split()[0] == 't1'
    result = cleanup_result()
    result['done'].update(cuda_unregistered=['cuda_killed'], freed_gpu_bytes=1 << 30)
    lines = shm_fleet_table([result, cleanup_result()], 'cleanup', hosts=['t1', 't2'])
    assert lines[2].split() == [
        'CUDA:',
        '1',
        'region(s)',
        'unregistered,',
        '1.0',
        'GiB',
        'of',
        'GPU',
        'memory',
        'back',
        '(NVML)',
    ]
    assert lines[3].split()[0] == 't2'
    result['done']['freed_gpu_bytes'] = None
    assert shm_fleet_table([result], 'cleanup', hosts=['t1'])[2].endswith('1 region(s) unregistered, not measured')


def test_a_report_row_carries_the_cuda_summary():
    from ansible_collections.tritonops.shm.plugins.plugin_utils.report.fleet_table import shm_report_row

    summary = dict(
        cuda_regions=1, cuda_stale_regions=1, cuda_stale_bytes=MIB, cuda_unknown_regions=0, cuda_unknown_bytes=0
    )
    info = dict(server=dict(pid=1, version='2.51.0'), summary=summary, holders_complete=True, system_regions=[])
    row = shm_report_row(info, 'h', 'http://h:8000')
    assert (row['cuda_stale_regions'], row['cuda_stale_bytes'], row['cuda_unknown_regions']) == (1, MIB, 0)


def test_report_row_names_wedged_and_suspect_regions_and_explains_the_bytes():
    info = info_result()
    info['summary'].update(
        wedged_regions=1, wedged_bytes=4 * MIB, suspect_regions=1, registered_bytes=5 * MIB, foreign_bytes=MIB
    )
    info['summary'].update(unlinked_mapped_bytes=0, other_bytes=2 * MIB)
    info['system_regions'] += [dict(name='w', state='wedged'), dict(name='s', state='suspect')]
    info['families'] = [
        dict(
            name='nccl',
            description='NCCL',
            files=2,
            bytes=MIB,
            held_files=1,
            held_bytes=MIB,
            unheld_files=1,
            unheld_bytes=0,
            containers=['pod ml/a'],
        )
    ]
    row = shm_report_row(info, 't1', 'http://t1:8000')
    assert (row['wedged'], row['wedged_regions'], row['wedged_bytes']) == (['w'], 1, 4 * MIB)
    assert (row['suspect'], row['suspect_regions']) == (['s'], 1)
    assert row['bytes_by_category']['registered_bytes'] == 5 * MIB
    assert row['bytes_by_category']['other_bytes'] == 2 * MIB
    assert row['bytes_by_category']['backend_bytes'] is None  # not in this summary: unknown, not 0
    assert row['families'] == [
        dict(name='nccl', files=2, bytes=MIB, held_files=1, unheld_files=1, unheld_bytes=0, containers=['pod ml/a'])
    ]


def test_metrics_skipped_on_some_hosts_is_said_once_under_each_table():
    rows = [
        dict(shm_report_row(info_result(), f't{i}', f'http://t{i}:8000'), metrics_skipped=why)
        for i, why in enumerate(['/var/lib/node_exporter/textfile_collector does not exist on this host', None] * 2)
    ]
    lines = shm_fleet_table(rows, 'report')
    said = [line for line in lines if line.startswith('no metrics written')]
    assert said == [
        'no metrics written on 2 host(s) (t0, t2): /var/lib/node_exporter/textfile_collector does not exist on this '
        "host; set prometheus_textfile_dir to the node_exporter textfile directory, or '' to stop looking for one"
    ]
    assert not [line for line in shm_fleet_table(rows[1:2], 'report') if line.startswith('no metrics')]


@pytest.mark.parametrize(
    'files, unlinked, shown',
    [
        (24, 4, '28.0 MiB'),  # the files and a dangling region's memory: what df shows came back
        (24, 0, '24.0 MiB'),
        (0, None, '0 Bytes'),  # a record of before 0.3.0 has no freed_unlinked_bytes
    ],
)
def test_freed_counts_the_files_and_the_dangling_regions_memory(files, unlinked, shown):
    done = dict(freed_bytes=files * MIB)
    if unlinked is not None:
        done['freed_unlinked_bytes'] = unlinked * MIB
    assert freed(dict(done=done)) == shown
