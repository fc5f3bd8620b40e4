"""Unit tests for the shm_cleanup role's filters (shm_list, shm_cleanup_exclude and shm_cleanup, the record): tables of
cases over registered module results."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.shm_cleanup import FilterModule
from ansible_collections.tritonops.shm.plugins.plugin_utils.report.cleanup_record import (
    LOCATE_STEP,
    READ_STEP,
    VERIFY_STEP,
    node_agent_failed,
    shm_cleanup,
    shm_cleanup_exclude,
    shm_list,
)


def region(name, state, reclaimable=None, holders=(), **extra):
    return dict(
        name=name,
        state=state,
        reclaimable=state == 'stale' if reclaimable is None else reclaimable,
        holders=[dict(pid=p) for p in holders],
        **extra,
    )


def info(regions=(), used_percent=10.0, orphan_files=0, pid=42, not_found_reason=None):
    summary = dict(used_percent=used_percent, orphan_files=orphan_files, used_bytes=1, total_bytes=10, stale_regions=0)
    return dict(
        server=dict(pid=pid, version='2.51.0', shm_dir='/dev/shm', not_found_reason=not_found_reason),
        summary=summary,
        system_regions=list(regions),
        holders_complete=True,
        unreadable_processes=0,
    )


@pytest.mark.parametrize(
    'value, expected',
    [
        ([], []),
        (None, []),
        ('', []),
        ('a, b ,,c', ['a', 'b', 'c']),
        ([' a ', '', 'b'], ['a', 'b']),
        (('x',), ['x']),
    ],
)
def test_shm_list(value, expected):
    assert shm_list(value) == expected


def test_shm_list_refuses_a_dict():
    with pytest.raises(AnsibleFilterError, match='comma-separated'):
        shm_list({'a': 1})


DEAD = region('dead', 'stale')
LIVE = region('live', 'healthy', holders=(7,))
DANGLING_HELD = region('dheld', 'dangling', reclaimable=False, holders=(8, 9))
SKIPPED = {'skipped': True, 'changed': False}


def verdict(percent=0, used=10.0):
    """triton_shm_region's threshold verdict."""
    return dict(percent=float(percent), used_percent=used, over=float(percent) <= 0 or used >= float(percent))


def absent(before, threshold=None, **extra):
    """A registered triton_shm_region result (inventory=true): the state before, after, and the threshold verdict."""
    result = dict(
        before=before,
        after=before,
        changed=False,
        unregistered=[],
        pending=[],
        removed_files=[],
        freed_bytes=0,
        skipped_items=[],
        threshold=threshold or verdict(0, float(before['summary']['used_percent'])),
    )
    result.update(extra)
    return result


def record(before, settings=None, **results):
    """The record of a run whose region call read ``before`` (threshold from settings), with the other results given."""
    settings = dict(settings or {})
    threshold = verdict(settings.get('threshold_percent', 0), before['summary']['used_percent'])
    results['absent'] = absent(before, threshold, **results.pop('absent', {}))
    return shm_cleanup(results, **settings)


# (id, before, threshold_percent, what the call did, acted, decision contains)
DECISIONS = [
    (
        'nothing-below-threshold',
        info([LIVE], 10.0),
        50,
        {},
        False,
        '/dev/shm use 10.0% is below the threshold 50% and no region is stale or dangling: nothing to do',
    ),
    ('threshold-0-always-acts', info([LIVE], 10.0), 0, {}, True, 'threshold 0%: always act (/dev/shm use 10.0%)'),
    ('over-threshold', info([LIVE], 75.0), '50', {}, True, '/dev/shm use 75.0% is at or above the threshold 50%'),
    (
        'stale-below-threshold',
        info([DEAD, LIVE], 10.0),
        50,
        dict(unregistered=['dead'], after=info([LIVE])),
        True,
        '1 stale or dangling region(s): dead',
    ),
    (
        'stale-excluded',
        info([DEAD], 10.0),
        50,
        dict(skipped_items=[dict(name='dead', reason='excluded by pattern')]),
        False,
        'nothing to do',
    ),
    (
        'leftovers-below-threshold',
        info([LIVE], 10.0),
        50,
        dict(removed_files=['/dev/shm/triton_python_backend_shm_region_x']),
        True,
        '1 file(s) that no process holds (leftover backend pools)',
    ),
]


@pytest.mark.parametrize(
    'before, threshold, did, acted, decision', [d[1:] for d in DECISIONS], ids=[d[0] for d in DECISIONS]
)
def test_the_decision_is_the_module_verdict_in_words(before, threshold, did, acted, decision):
    r = record(before, dict(threshold_percent=threshold), absent=did)
    assert (r['acted'], r['error']) == (acted, None)
    assert decision in r['decision']


def test_the_exclude_escapes_reregistered_names_for_the_module():
    assert shm_cleanup_exclude('keep*', [dict(name='a[1]*?')]) == ['keep*', 'a[[]1][*][?]']
    assert shm_cleanup_exclude(None) == [] and shm_cleanup_exclude('a, b', []) == ['a', 'b']


def test_without_the_server_process_the_record_is_a_located_failure():
    r = record(info([DEAD], pid=None, not_found_reason='not here'), dict(host='h1', url='http://x'))
    assert r['acted'] is False and r['status'] == 'failed'
    assert r['error'] == dict(step=LOCATE_STEP, msg='nothing on h1 could be checked: not here')
    r = record(info([], pid=None), dict(host='h1', url='127.0.0.1:8000'))
    assert (
        r['error']['msg']
        == 'nothing on h1 could be checked: the tritonserver process behind 127.0.0.1:8000 was not found'
    )


ABSENT = dict(
    unregistered=['dead'],
    removed_files=['/dev/shm/dead'],
    freed_bytes=4096,
    skipped_items=[dict(name='kept', reason='excluded by pattern'), dict(name='warm', reason='excluded by pattern')],
)
PRESENT = dict(results=[dict(registered=['warm'], created_files=['/dev/shm/warm']), dict(skipped=True)])

# (id, before, settings, results, status, changed, skipped reasons by name)
RESULTS = [
    ('nothing-to-do', info([LIVE]), dict(threshold_percent=50), {}, 'ok', False, {}),
    (
        'cleaned-and-verified',
        info([DEAD, LIVE]),
        {},
        dict(absent=dict(ABSENT, after=info([LIVE]))),
        'ok',
        True,
        {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'},
    ),
    (
        'reregistered',
        info([DEAD, region('warm', 'stale')]),
        dict(reregister=[dict(name='warm')]),
        dict(
            absent=dict(ABSENT, after=info([region('warm', 'stale')])),
            present=PRESENT,
            after=info([region('warm', 'healthy')]),
        ),
        'ok',
        True,
        {'kept': 'excluded by pattern', 'warm': 'kept: desired state (shm_cleanup_reregister)'},
    ),
    (
        'dead-again-after',
        info([DEAD]),
        {},
        dict(absent=dict(ABSENT, after=info([DEAD]))),
        'failed',
        True,
        {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'},
    ),
    (
        'dead-again-not-verified',
        info([DEAD]),
        dict(verify=False),
        dict(absent=dict(ABSENT, after=info([DEAD]))),
        'ok',
        True,
        {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'},
    ),
    (
        'died-during-the-run-is-not-ours',
        info([LIVE]),
        {},
        dict(absent=dict(after=info([region('live', 'stale')]))),
        'ok',
        False,
        {},
    ),
    (
        'dangling-held-unknown-and-unselected',
        info([DANGLING_HELD, region('u', 'unknown', state_reason='why'), region('other', 'stale')]),
        dict(mode='names', names='x'),
        {},
        'ok',
        False,
        {
            'dheld': 'dangling but still mapped by 8, 9: its client is alive',
            'u': 'state unknown: why',
            'other': 'not selected (shm_cleanup_mode=names)',
        },
    ),
    (
        'suspect-left-with-its-reason-unless-unregistered',
        info(
            [region('evil', 'suspect', state_reason='its key is a pool'), region('evil2', 'suspect', state_reason='x')]
        ),
        {},
        dict(absent=dict(unregistered=['evil2'])),
        'ok',
        True,
        {'evil': 'suspect: its key is a pool (shm_cleanup_suspect unregisters it)'},
    ),
    (
        'dangling-unresolved',
        info([region('d', 'dangling', reclaimable=False)]),
        {},
        {},
        'ok',
        False,
        {'d': 'dangling, but its holders could not be fully determined'},
    ),
    (
        'step-failed',
        info([DEAD]),
        dict(failure=dict(step='Unregister', msg='boom')),
        dict(absent=ABSENT),
        'failed',
        True,
        {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'},
    ),
]


@pytest.mark.parametrize(
    'before, settings, results, status, changed, skipped', [r[1:] for r in RESULTS], ids=[r[0] for r in RESULTS]
)
def test_result(before, settings, results, status, changed, skipped):
    r = record(before, settings, **results)
    assert (r['status'], r['changed']) == (status, changed)
    assert {s['name']: s['reason'] for s in r['skipped']} == skipped
    assert (r['error'] is None) == (status == 'ok')


# the record's done of a run that did nothing: every key, empty
NOTHING_DONE = dict(
    unregistered=[],
    pending=[],
    removed_files=[],
    freed_bytes=0,
    freed_unlinked_bytes=0,
    registered=[],
    created_files=[],
    reloaded=[],
    cuda_unregistered=[],
    freed_gpu_bytes=None,
)


def test_result_verify_failure_names_the_region():
    r = record(info([DEAD]), absent=dict(ABSENT, after=info([DEAD])))
    assert r['error'] == dict(
        step=VERIFY_STEP, msg='stale region(s) remain after cleanup, with no reason recorded: dead'
    )
    assert r['done'] == dict(NOTHING_DONE, unregistered=['dead'], removed_files=['/dev/shm/dead'], freed_bytes=4096)


@pytest.mark.parametrize(
    'check_mode, threshold, after, expected',
    [
        (False, 50, None, 'before'),  # nothing done: after equals before
        (True, 50, None, 'before'),  # check mode, nothing to do: still before
        (True, 0, None, None),  # check mode, acted: not measured
        (False, 0, info([], 3.0), 'after'),  # measured again
    ],
)
def test_result_after_summary(check_mode, threshold, after, expected):
    before = info([LIVE], 10.0)
    r = record(before, dict(threshold_percent=threshold, check_mode=check_mode), absent=dict(after=after))
    want = dict(before=r['before'], after=dict(r['before'], used_percent=3.0), **{'None': None})[str(expected)]
    assert r['after'] == want
    assert r['before']['used_percent'] == 10.0


def test_results_of_steps_that_did_not_run_are_ignored():
    """Skipped steps, and the steps after the one that failed: registered results of an earlier run are not this run's."""
    r = record(info([LIVE]), dict(threshold_percent=50), present=SKIPPED, after=info([DEAD]), reload=SKIPPED)
    assert (r['status'], r['changed'], r['skipped']) == ('ok', False, [])
    assert r['done'] == NOTHING_DONE
    assert r['after'] == r['before']
    failed = dict(before=info([LIVE]), failed=True, msg='boom')
    for failed_step in ('absent', '_shm_cleanup_absent', {'_shm_cleanup_absent': '_task.polymorphic_result'}):
        r = shm_cleanup(
            dict(absent=failed, present=PRESENT, after=info([DEAD]), reload=dict(reloaded=['m'])),
            failure=dict(step='Query', msg='boom'),
            failed_step=failed_step,
        )
        assert r['done']['registered'] == [] and r['done']['reloaded'] == [] and r['status'] == 'failed'


def test_result_of_a_host_whose_query_failed():
    failure = dict(step='Query', msg='cannot connect')
    r = shm_cleanup(
        {'absent': {'failed': True, 'msg': 'cannot connect'}}, failure=failure, host='h', url='u', finished_epoch='17'
    )
    assert (r['status'], r['changed'], r['before'], r['after'], r['acted'], r['decision']) == (
        'failed',
        False,
        None,
        None,
        False,
        '',
    )
    assert r['server']['version'] is None and r['finished_epoch'] == 17 and r['error'] == failure


def test_filter_module_exposes_the_filters():
    assert {name: f.target() for name, f in FilterModule().filters().items()} == {
        'shm_list': shm_list,
        '_shm_cleanup': shm_cleanup,
        '_shm_cleanup_exclude': shm_cleanup_exclude,
        '_node_agent_failed': node_agent_failed,
    }


def test_node_agent_failed_names_each_failed_server_once():
    rows = [
        {'name': 'good', 'status': 'ok', 'error': None},
        {'name': 'bad', 'status': 'failed', 'error': {'step': 'Query', 'msg': 'HTTP 500'}},
        {'name': 'gone', 'status': 'failed', 'error': {'step': '', 'msg': ''}},
    ]
    checks = [
        {'node_agent_server': {'name': 'good'}, 'holders_complete': True},
        {'node_agent_server': {'name': 'bad'}, 'msg': 'HTTP 500 again', 'failed': False},
        {'node_agent_server': {'name': 'late'}, 'msg': 'timed out', 'failed': False},
    ]
    assert node_agent_failed(rows, checks) == [
        "bad at 'Query': HTTP 500",
        'gone: failed',
        'late (check after the cleanup): timed out',
    ]
    assert node_agent_failed([], None) == [] and node_agent_failed(None) == []


def test_node_agent_failed_names_the_servers_the_rounds_deadline_left_out_and_the_checks_not_run():
    rows = [
        {'name': 'late', 'status': 'not_reached', 'error': {'step': '', 'msg': 'no record was made'}},
        {'name': 'slow', 'status': 'ok', 'error': None},
    ]
    checks = [
        {'node_agent_server': {'name': 'late'}},
        {'node_agent_server': {'name': 'slow'}, 'skipped': True, 'skip_reason': 'Conditional result was False'},
    ]
    assert node_agent_failed(rows, checks) == [
        "late: not reached before the round's deadline (node_agent_round_timeout)",
        "slow (check after the cleanup): not run: the server's bound (node_agent_server_timeout) was spent by its cleanup",
    ]


# (id, results, settings, unregistered, registered, after used_percent)
STEPS = [
    ('nothing-to-clean', dict(absent=absent(info([LIVE]))), {}, [], [], 10.0),
    ('cleaned', dict(absent=absent(info([DEAD, LIVE]), after=info([LIVE], 4.0), **ABSENT)), {}, ['dead'], [], 4.0),
    (
        'reregistered',
        dict(
            absent=absent(info([DEAD]), after=info([], 4.0), **ABSENT),
            present=PRESENT,
            after=info([region('warm', 'reserved')], 5.0),
        ),
        dict(reregister=[dict(name='warm')]),
        ['dead'],
        ['warm'],
        5.0,
    ),
    # the re-register step skipped (below the threshold): an earlier run's query after it is not this run's
    (
        'reregister-skipped',
        dict(absent=absent(info([LIVE]), verdict(50)), present=SKIPPED, after=info([DEAD], 1.0)),
        dict(threshold_percent=50, reregister=[dict(name='warm')]),
        [],
        [],
        10.0,
    ),
]


@pytest.mark.parametrize(
    'results, settings, unregistered, registered, used_after', [s[1:] for s in STEPS], ids=[s[0] for s in STEPS]
)
def test_record_of_the_steps(results, settings, unregistered, registered, used_after):
    r = shm_cleanup(results, host='h1', url='http://x', **settings)
    assert r['done']['unregistered'] == unregistered and r['done']['registered'] == registered
    assert r['after']['used_percent'] == used_after
    assert (r['host'], r['url'], r['status']) == ('h1', 'http://x', 'ok')


def test_a_failed_call_keeps_the_work_done_and_its_reason():
    partial = absent(info([DEAD, LIVE]), failed=True, msg='boom', **ABSENT)
    del partial['after']
    r = shm_cleanup(dict(absent=partial), failure=dict(step='Query, unregister', msg='boom'))
    assert (r['status'], r['error'], r['changed']) == ('failed', dict(step='Query, unregister', msg='boom'), True)
    assert r['done']['unregistered'] == ['dead'] and r['before']['used_percent'] == 10.0


def test_an_unlocated_server_is_reported_as_such_whatever_task_stopped():
    results = dict(
        absent=dict(
            failed=True, msg='stale cleanup needs the process', before=info([DEAD], pid=None, not_found_reason='hidden')
        )
    )
    failure = dict(step='some task', msg='stale cleanup needs the process')
    r = shm_cleanup(results, failure=failure, host='h1')
    assert r['error'] == dict(step=LOCATE_STEP, msg='nothing on h1 could be checked: hidden')
    assert (r['status'], r['changed']) == ('failed', False)
    r = shm_cleanup(results, host='h1')
    assert r['error'] == dict(step=LOCATE_STEP, msg='nothing on h1 could be checked: hidden')


def test_nothing_read_yet_records_the_failure_only():
    failure = dict(step='Query', msg='cannot connect')
    r = shm_cleanup(
        {'absent': {'failed': True, 'msg': 'cannot connect'}}, failure=failure, host='h', finished_epoch='17'
    )
    assert (r['status'], r['error'], r['before'], r['after'], r['acted']) == ('failed', failure, None, None, False)
    assert r['finished_epoch'] == 17


def test_unknown_results_are_refused():
    with pytest.raises(AnsibleFilterError, match='^shm_cleanup: unknown results befor '):
        shm_cleanup({'befor': {}})


def test_a_pending_region_is_recorded_as_pending_with_its_reason_and_is_a_change():
    """Triton 24.12+: the unregister was accepted but the region is still listed (requests in flight)."""
    reason = (
        'pending: unregistered, but still listed by the server after 10s (requests in flight: it goes when they finish)'
    )
    did = dict(
        ABSENT,
        unregistered=[],
        pending=['dead'],
        removed_files=[],
        freed_bytes=0,
        after=info([DEAD]),
        skipped_items=[
            dict(name='dead', reason=reason),
            dict(path='/dev/shm/dead', reason="region 'dead' is still registered"),
        ],
    )
    r = record(info([DEAD]), absent=did)
    assert r['done']['pending'] == ['dead'] and r['done']['unregistered'] == []
    assert (r['status'], r['changed'], r['error']) == ('ok', True, None), 'a stated reason: not a verify failure'
    assert {s.get('name') or s.get('path'): s['reason'] for s in r['skipped']}['dead'] == reason


def test_a_server_without_shared_memory_fails_the_host_with_the_plain_reason():
    """Triton 2.73+ through tritonfrontend: the module reports it, the role never calls that host ok."""
    before = info([])
    before['server'] = dict(
        before['server'],
        shm_unsupported='read system shared memory status at U: HTTP 503: '
        'Shared memory is not supported in this server configuration.; not a leak',
    )
    r = record(before, dict(host='h1', url='U'))
    assert r['acted'] is False
    assert r['error'] == dict(
        step=READ_STEP, msg=f'nothing on h1 could be checked: {before["server"]["shm_unsupported"]}'
    )
    assert r['status'] == 'failed' and 'not supported in this server configuration' in r['error']['msg']


def test_leftover_backend_pools_removed_below_the_threshold_are_an_action():
    query = info([region('live', 'healthy', holders=[7])])
    query['summary'].update(leftover_files=2, leftover_bytes=2 << 20)
    r = record(
        query, dict(threshold_percent=50), absent=dict(removed_files=['/dev/shm/a', '/dev/shm/b'], freed_bytes=2 << 20)
    )
    assert (r['acted'], r['changed']) == (True, True)
    assert r['decision'] == '2 file(s) that no process holds (leftover backend pools)'
    assert (r['before']['leftover_files'], r['before']['leftover_bytes']) == (2, 2 << 20)


# -- issue 25 / issue 26 finding 7: a cleanup whose holders could not all be seen is never ok -------------------------


def test_a_cleanup_whose_holders_are_incomplete_is_incomplete_with_the_reason():
    before = dict(
        info([region('a', 'unknown', state_reason='holders could not be fully determined')]),
        holders_complete=False,
        pid_namespace='other',
        holders_incomplete_reason='outside the initial namespace',
    )
    r = record(before)
    assert (r['status'], r['changed'], r['error']) == ('incomplete', False, None)
    assert r['server']['holders_complete'] is False and r['server']['pid_namespace'] == 'other'
    assert r['server']['holders_incomplete_reason'] == 'outside the initial namespace'
    assert record(dict(before, holders_complete=True, holders_incomplete_reason=None))['status'] == 'ok'


# --- reclaiming grown python backend pools (opt-in, issue 27) ------------------------------------------------

RELOADED = [
    dict(
        model='grow',
        before_bytes=35651584,
        after_bytes=1048576,
        old_pools=['a'],
        new_pools=['b'],
        old_gone=True,
        seconds=2.5,
    )
]


def test_the_models_reloaded_are_recorded_and_are_a_change():
    r = record(info([LIVE]), reload=dict(changed=True, reloaded=RELOADED, models=[]))
    assert r['done']['reloaded'] == RELOADED and r['changed'] is True and r['status'] == 'ok'
    # the reload step skipped (not opted in): nothing reloaded
    r = record(info([LIVE]), reload=SKIPPED)
    assert r['done']['reloaded'] == [] and r['changed'] is False


def test_the_cuda_step_is_recorded_with_the_gpu_memory_measured_back():
    """Issue 34: the kind=cuda call's unregisters (and deferred ones) and its NVML measure are the record's; a CUDA
    region it kept is a skip with its reason and kind; the row changed even when no system region was touched."""
    cuda = dict(
        changed=True,
        unregistered=['cuda_killed'],
        pending=['cuda_busy'],
        freed_gpu_bytes=1 << 30,
        skipped_items=[dict(name='cuda_live', reason='still in use after 10s')],
    )
    r = record(info([LIVE], 10.0), dict(threshold_percent=50), cuda=cuda)
    assert r['done']['cuda_unregistered'] == ['cuda_killed', 'cuda_busy'] and r['done']['freed_gpu_bytes'] == 1 << 30
    assert (r['status'], r['changed'], r['acted']) == ('ok', True, True)
    assert r['skipped'] == [dict(name='cuda_live', reason='still in use after 10s', kind='cuda')]
    failed = shm_cleanup(
        dict(
            absent=absent(info([LIVE]), verdict(0, 1.0)),
            cuda=dict(failed=True, msg='boom'),
            reload=dict(reloaded=['m']),
        ),
        failure=dict(step='Unregister stale CUDA regions', msg='boom'),
        failed_step='_shm_cleanup_cuda',
    )
    assert failed['status'] == 'failed' and failed['done']['reloaded'] == []  # later steps are an earlier run's
