"""Unit tests for the shm_cleanup role's filters (shm_list, shm_cleanup and its halves shm_cleanup_plan and
shm_cleanup_result): tables of cases."""
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.shm_cleanup import (
    LOCATE_STEP, READ_STEP, VERIFY_STEP, FilterModule, is_direct, shm_cleanup, shm_cleanup_plan, shm_cleanup_result, shm_list)


def region(name, state, reclaimable=None, holders=(), **extra):
    return dict(name=name, state=state, reclaimable=state == 'stale' if reclaimable is None else reclaimable,
                holders=[dict(pid=p) for p in holders], **extra)


def info(regions=(), used_percent=10.0, orphan_files=0, pid=42, not_found_reason=None):
    summary = dict(used_percent=used_percent, orphan_files=orphan_files, used_bytes=1, total_bytes=10, stale_regions=0)
    return dict(server=dict(pid=pid, version='2.51.0', shm_dir='/dev/shm', not_found_reason=not_found_reason),
                summary=summary, system_regions=list(regions), holders_complete=True, unreadable_processes=0)


@pytest.mark.parametrize('value, expected', [
    ([], []),
    (None, []),
    ('', []),
    ('a, b ,,c', ['a', 'b', 'c']),
    ([' a ', '', 'b'], ['a', 'b']),
    (('x',), ['x']),
])
def test_shm_list(value, expected):
    assert shm_list(value) == expected


def test_shm_list_refuses_a_dict():
    with pytest.raises(AnsibleFilterError, match='comma-separated'):
        shm_list({'a': 1})


DEAD = region('dead', 'stale')
LIVE = region('live', 'healthy', holders=(7,))
DANGLING_HELD = region('dheld', 'dangling', reclaimable=False, holders=(8, 9))

# (id, info, plan keywords, act, candidates, decision contains)
PLANS = [
    ('nothing-below-threshold', info([LIVE], 10.0), dict(threshold_percent=50), False, False,
     '/dev/shm use 10.0% is below the threshold 50% and no region is stale or dangling: nothing to do'),
    ('threshold-0-always-acts', info([LIVE], 10.0), dict(threshold_percent=0), True, False,
     'threshold 0%: always act (/dev/shm use 10.0%)'),
    ('over-threshold', info([LIVE], 75.0), dict(threshold_percent='50'), True, False,
     '/dev/shm use 75.0% is at or above the threshold 50%'),
    ('stale-below-threshold', info([DEAD, LIVE], 10.0), dict(threshold_percent=50), True, True,
     '1 stale or dangling region(s): dead'),
    ('stale-excluded', info([DEAD], 10.0), dict(threshold_percent=50, exclude='de*'), False, True, 'nothing to do'),
    ('stale-excluded-threshold-0', info([DEAD], 10.0), dict(exclude='de*'), True, True, 'always act'),
    ('stale-reregistered', info([DEAD], 10.0), dict(threshold_percent=50, reregister=[dict(name='dead')]), False, False,
     'nothing to do'),
    ('all-mode-has-candidates', info([LIVE], 10.0), dict(mode='all'), True, True, 'always act'),
    ('names-mode-absent-name', info([LIVE], 10.0), dict(mode='names', names='other'), True, False, 'always act'),
    ('names-mode-present-name', info([LIVE], 10.0), dict(mode='names', names=['live']), True, True, 'always act'),
    ('orphans', info([], 10.0, orphan_files=2), dict(orphan_patterns='tmp_*'), True, True, 'always act'),
    ('orphans-without-patterns', info([], 10.0, orphan_files=2), dict(), True, False, 'always act'),
]


@pytest.mark.parametrize('before, kwargs, act, candidates, decision', [p[1:] for p in PLANS], ids=[p[0] for p in PLANS])
def test_plan(before, kwargs, act, candidates, decision):
    plan = shm_cleanup_plan(before, **kwargs)
    assert (plan['act'], plan['candidates'], plan['error']) == (act, candidates, None)
    assert decision in plan['decision']


def test_plan_escapes_reregistered_names_for_the_module_exclude():
    plan = shm_cleanup_plan(info([]), exclude='keep*', reregister=[dict(name='a[1]*?')])
    assert plan['unregister_exclude'] == ['keep*', 'a[[]1][*][?]']


def test_plan_without_the_server_process_is_a_located_failure():
    plan = shm_cleanup_plan(info([DEAD], pid=None, not_found_reason='not here'), host='h1', url='http://x')
    assert plan['act'] is False
    assert plan['error'] == dict(step=LOCATE_STEP, msg='nothing on h1 could be checked: not here')
    plan = shm_cleanup_plan(info([], pid=None), host='h1', url='127.0.0.1:8000')
    assert plan['error']['msg'] == 'nothing on h1 could be checked: the tritonserver process behind 127.0.0.1:8000 was not found'


def result(before, plan_kwargs=None, **kwargs):
    plan = shm_cleanup_plan(before, **(plan_kwargs or {}))
    return shm_cleanup_result(before, plan, **kwargs)


ABSENT = dict(unregistered=['dead'], removed_files=['/dev/shm/dead'], freed_bytes=4096,
              skipped_items=[dict(name='kept', reason='excluded by pattern'), dict(name='warm', reason='excluded by pattern')])
PRESENT = dict(results=[dict(registered=['warm'], created_files=['/dev/shm/warm']), dict(skipped=True)])

# (id, before, plan keywords, result keywords, status, changed, skipped reasons by name)
RESULTS = [
    ('nothing-to-do', info([LIVE]), dict(threshold_percent=50), {}, 'ok', False, {}),
    ('cleaned-and-verified', info([DEAD, LIVE]), {}, dict(absent=ABSENT, after=info([LIVE])), 'ok', True,
     {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'}),
    ('reregistered', info([DEAD, region('warm', 'stale')]), dict(reregister=[dict(name='warm')]),
     dict(absent=ABSENT, present=PRESENT, after=info([region('warm', 'healthy')])), 'ok', True,
     {'kept': 'excluded by pattern', 'warm': 'kept: desired state (shm_cleanup_reregister)'}),
    ('dead-again-after', info([DEAD]), {}, dict(absent=ABSENT, after=info([DEAD])), 'failed', True,
     {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'}),
    ('dead-again-not-verified', info([DEAD]), {}, dict(absent=ABSENT, after=info([DEAD]), verify=False), 'ok', True,
     {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'}),
    ('died-during-the-run-is-not-ours', info([LIVE]), {}, dict(after=info([region('live', 'stale')])), 'ok', False, {}),
    ('dangling-held-unknown-and-unselected',
     info([DANGLING_HELD, region('u', 'unknown', state_reason='why'), region('other', 'stale')]),
     dict(mode='names', names='x'), dict(mode='names'), 'ok', False,
     {'dheld': 'dangling but still mapped by 8, 9: its client is alive', 'u': 'state unknown: why',
      'other': 'not selected (shm_cleanup_mode=names)'}),
    ('dangling-unresolved', info([region('d', 'dangling', reclaimable=False)]), {}, {}, 'ok', False,
     {'d': 'dangling, but its holders could not be fully determined'}),
    ('step-failed', info([DEAD]), {}, dict(absent=ABSENT, failure=dict(step='Unregister', msg='boom')), 'failed', True,
     {'kept': 'excluded by pattern', 'warm': 'excluded by pattern'}),
]


@pytest.mark.parametrize('before, plan_kwargs, kwargs, status, changed, skipped', [r[1:] for r in RESULTS],
                         ids=[r[0] for r in RESULTS])
def test_result(before, plan_kwargs, kwargs, status, changed, skipped):
    r = result(before, plan_kwargs, **kwargs)
    assert (r['status'], r['changed']) == (status, changed)
    assert {s['name']: s['reason'] for s in r['skipped']} == skipped
    assert (r['error'] is None) == (status == 'ok')


def test_result_verify_failure_names_the_region():
    r = result(info([DEAD]), absent=ABSENT, after=info([DEAD]))
    assert r['error'] == dict(step=VERIFY_STEP, msg='stale region(s) remain after cleanup, with no reason recorded: dead')
    assert r['done'] == dict(unregistered=['dead'], pending=[], removed_files=['/dev/shm/dead'], freed_bytes=4096, registered=[],
                             created_files=[], reloaded=[])


@pytest.mark.parametrize('check_mode, threshold, after, expected', [
    (False, 50, None, 'before'),          # nothing done: after equals before
    (True, 50, None, 'before'),           # check mode, nothing to do: still before
    (True, 0, None, None),                # check mode, acted: not measured
    (False, 0, info([], 3.0), 'after'),   # measured again
])
def test_result_after_summary(check_mode, threshold, after, expected):
    before = info([LIVE], 10.0)
    r = result(before, dict(threshold_percent=threshold), threshold_percent=threshold, check_mode=check_mode,
               after=after or {'skipped': True})
    want = dict(before=r['before'], after=dict(r['before'], used_percent=3.0), **{'None': None})[str(expected)]
    assert r['after'] == want
    assert r['before']['used_percent'] == 10.0


def test_results_of_steps_that_did_not_run_are_ignored():
    """Nothing to do: registered results of an earlier run of the role in the same play are not this run's work."""
    r = result(info([LIVE]), dict(threshold_percent=50), absent=ABSENT, present=PRESENT, after=info([DEAD]))
    assert (r['status'], r['changed'], r['skipped']) == ('ok', False, [])
    assert r['done'] == dict(unregistered=[], pending=[], removed_files=[], freed_bytes=0, registered=[], created_files=[],
                             reloaded=[])
    assert r['after'] == r['before']


def test_result_of_a_host_whose_query_failed():
    r = shm_cleanup_result({'failed': True, 'msg': 'cannot connect'}, {}, failure=dict(step='Query', msg='cannot connect'),
                           host='h', url='u', finished_epoch='17')
    assert (r['status'], r['changed'], r['before'], r['after'], r['acted'], r['decision']) == ('failed', False, None, None, False, '')
    assert r['server']['version'] is None and r['finished_epoch'] == 17


def test_filter_module_exposes_the_filters():
    assert FilterModule().filters() == {'shm_list': shm_list, 'shm_cleanup': shm_cleanup}


# --- shm_cleanup: the role's one step -------------------------------------------------------------------------

SKIPPED = {'skipped': True, 'changed': False}


def direct(before, **extra):
    """A registered triton_shm_region result of the one-call path (inventory=true): the state before and after."""
    result = dict(before=before, after=before, changed=False, unregistered=[], removed_files=[], freed_bytes=0, skipped_items=[])
    result.update(extra)
    return result


# (id, settings, direct?)
PATHS = [
    ('defaults', {}, True),
    ('threshold-without-orphan-patterns', dict(threshold_percent=80), True),
    ('orphan-patterns-without-threshold', dict(orphan_patterns='tmp_*'), True),
    ('threshold-and-orphan-patterns', dict(threshold_percent='80', orphan_patterns=['tmp_*']), False),
    ('threshold-and-empty-patterns', dict(threshold_percent=80, orphan_patterns=' , '), True),
    ('mode-all', dict(mode='all'), False),
    ('mode-names', dict(mode='names', names='a'), False),
]


@pytest.mark.parametrize('settings, expected', [p[1:] for p in PATHS], ids=[p[0] for p in PATHS])
def test_the_path_comes_from_the_settings(settings, expected):
    assert is_direct(**{k: v for k, v in settings.items() if k != 'names'}) is expected
    plan = shm_cleanup({}, **settings)['plan']
    assert plan['direct'] is expected
    assert plan['include'] == ('' if expected else 'query_first.yml')
    assert (plan['act'], plan['unregister'], plan['reregister'], plan['error']) == (False, False, False, None)


def test_the_first_call_gets_the_exclude_list_and_the_orphan_patterns_from_the_settings():
    plan = shm_cleanup({'direct': None}, exclude='keep*', reregister=[dict(name='a[1]')], orphan_patterns='tmp_*, x')['plan']
    assert plan['exclude'] == ['keep*', 'a[[]1]']
    assert (plan['orphan_files'], plan['orphan_patterns'], plan['unregister_names']) == (True, ['tmp_*', 'x'], [])
    assert shm_cleanup({}, mode='names', names='a, b')['plan']['unregister_names'] == ['a', 'b']
    assert shm_cleanup({}, mode='all', names='a, b')['plan']['unregister_names'] == []


OLD = dict(unregistered=['old'], removed_files=['/dev/shm/old'], freed_bytes=1, skipped_items=[])
OLD_PRESENT = dict(results=[dict(registered=['old_warm'], created_files=[])])
WARM = [dict(name='warm', key='/warm', byte_size=1)]

# (id, results, settings, include, unregister, reregister, unregistered, registered, after used_percent)
STEPS = [
    ('direct-nothing-to-clean', dict(direct=direct(info([LIVE]))), {}, '', False, False, [], [], 10.0),
    ('direct-cleaned', dict(direct=direct(info([DEAD, LIVE]), after=info([LIVE], 4.0), **ABSENT)), {}, '', False, False,
     ['dead'], [], 4.0),
    # the plan after the first step (re-registering has not run yet): the state after is not measured
    ('direct-then-reregister', dict(direct=direct(info([DEAD]), after=info([], 4.0), **ABSENT)), dict(reregister=WARM),
     'reregister.yml', False, True, ['dead'], [], 10.0),
    ('direct-reregistered', dict(direct=direct(info([DEAD]), after=info([], 4.0), **ABSENT), present=PRESENT,
                                 after=info([region('warm', 'reserved')], 5.0)),
     dict(reregister=WARM), 'reregister.yml', False, True, ['dead'], ['warm'], 5.0),
    # the query path's results of an earlier run of the role in the same play are not this run's
    ('direct-ignores-the-query-path', dict(direct=direct(info([LIVE])), query=info([DEAD]), absent=OLD, present=OLD_PRESENT,
                                           after=info([DEAD])), {}, '', False, False, [], [], 10.0),
    ('query-nothing-to-do', dict(direct=SKIPPED, query=info([LIVE]), absent=SKIPPED),
     dict(threshold_percent=50, orphan_patterns='tmp_*'), 'query_first.yml', False, False, [], [], 10.0),
    ('query-acted', dict(direct=SKIPPED, query=info([DEAD, LIVE]), absent=dict(ABSENT, after=info([LIVE], 3.0))),
     dict(threshold_percent=50, orphan_patterns='tmp_*'), 'query_first.yml', True, False, ['dead'], [], 3.0),
    ('query-over-threshold-nothing-to-clean', dict(query=info([LIVE], 75.0), absent=SKIPPED),
     dict(threshold_percent=50, orphan_patterns='tmp_*'), 'query_first.yml', False, False, [], [], 75.0),
    ('query-reregisters-without-candidates', dict(query=info([LIVE], 75.0), absent=SKIPPED, present=PRESENT,
                                                  after=info([LIVE, region('warm', 'reserved')], 76.0)),
     dict(mode='all', reregister=[dict(name='live')]), 'query_first.yml', False, True, [], ['warm'], 76.0),
    # nothing to do: the re-register results of an earlier run are not this run's
    ('query-nothing-to-do-ignores-old-reregister', dict(query=info([LIVE]), absent=SKIPPED, present=OLD_PRESENT,
                                                        after=info([], 1.0)),
     dict(threshold_percent=50, orphan_patterns='tmp_*', reregister=WARM), 'query_first.yml', False, False, [], [], 10.0),
    ('names', dict(query=info([DEAD, LIVE]), absent=dict(ABSENT, after=info([LIVE], 3.0))), dict(mode='names', names='dead'),
     'query_first.yml', True, False, ['dead'], [], 3.0),
]


@pytest.mark.parametrize('results, settings, include, unregister, reregister, unregistered, registered, used_after',
                         [s[1:] for s in STEPS], ids=[s[0] for s in STEPS])
def test_step(results, settings, include, unregister, reregister, unregistered, registered, used_after):
    step = shm_cleanup(results, host='h1', url='http://x', **settings)
    plan, record = step['plan'], step['record']
    assert (plan['include'], plan['unregister'], plan['reregister']) == (include, unregister, reregister)
    assert record['done']['unregistered'] == unregistered and record['done']['registered'] == registered
    assert record['after']['used_percent'] == used_after
    assert (record['host'], record['url'], record['status']) == ('h1', 'http://x', 'ok')


def test_the_plan_after_the_query_unregisters_a_stale_region_below_the_threshold():
    plan = shm_cleanup(dict(direct=SKIPPED, query=info([DEAD, LIVE])), threshold_percent=50, orphan_patterns='tmp_*')['plan']
    assert (plan['include'], plan['act'], plan['unregister'], plan['reregister']) == ('query_first.yml', True, True, False)
    assert plan['decision'] == '1 stale or dangling region(s): dead'


def test_step_record_is_the_record_of_its_halves():
    """The step hands shm_cleanup_result exactly what the role handed it before: the same record."""
    before, absent = info([DEAD, LIVE]), dict(ABSENT, after=info([LIVE], 3.0))
    settings = dict(threshold_percent=50, orphan_patterns='tmp_*', host='h', url='u', finished_at='t', finished_epoch=5)
    plan_settings = {k: v for k, v in settings.items() if k not in ('finished_at', 'finished_epoch')}
    plan = shm_cleanup_plan(before, **plan_settings)
    expected = shm_cleanup_result(before, plan, absent=absent, after=absent['after'], threshold_percent=50, host='h', url='u',
                                  finished_at='t', finished_epoch=5)
    assert shm_cleanup(dict(query=before, absent=absent), **settings)['record'] == expected


def test_a_failed_query_is_reported_with_its_own_reason():
    """A down server on the query path: the failed task and its message, not 'process not found'."""
    failed = {'failed': True, 'msg': 'cannot connect to http://x: refused'}
    failure = dict(step="Query the server's regions, files and /dev/shm use", msg=failed['msg'])
    r = shm_cleanup(dict(query=failed), mode='names', names='a', host='h', url='http://x', failure=failure)['record']
    assert (r['status'], r['error'], r['acted'], r['decision'], r['before']) == ('failed', failure, False, '', None)


def test_a_failed_direct_call_keeps_the_work_done_and_its_reason():
    partial = direct(info([DEAD, LIVE]), failed=True, msg='boom', **ABSENT)
    del partial['after']
    r = shm_cleanup(dict(direct=partial), failure=dict(step='Query, unregister', msg='boom'))['record']
    assert (r['status'], r['error'], r['changed']) == ('failed', dict(step='Query, unregister', msg='boom'), True)
    assert r['done']['unregistered'] == ['dead'] and r['before']['used_percent'] == 10.0


@pytest.mark.parametrize('results', [
    dict(direct=dict(failed=True, msg='stale cleanup needs the process', before=info([DEAD], pid=None, not_found_reason='hidden'))),
    dict(query=info([DEAD], pid=None, not_found_reason='hidden')),
], ids=['direct', 'query'])
def test_an_unlocated_server_is_reported_as_such_whatever_task_stopped(results):
    settings = dict(mode='stale' if 'direct' in results else 'all', host='h1')
    failure = dict(step='some task', msg='stale cleanup needs the process')
    r = shm_cleanup(results, failure=failure, **settings)['record']
    assert r['error'] == dict(step=LOCATE_STEP, msg='nothing on h1 could be checked: hidden')
    assert (r['status'], r['changed']) == ('failed', False)
    r = shm_cleanup(results, **settings)['record']
    assert r['error'] == dict(step=LOCATE_STEP, msg='nothing on h1 could be checked: hidden')


def test_nothing_read_yet_records_the_failure_only():
    failure = dict(step='Query', msg='cannot connect')
    r = shm_cleanup({'direct': {'failed': True, 'msg': 'cannot connect'}}, failure=failure, host='h', finished_epoch='17')['record']
    assert (r['status'], r['error'], r['before'], r['after'], r['acted']) == ('failed', failure, None, None, False)
    assert r['finished_epoch'] == 17


def test_unknown_results_are_refused():
    with pytest.raises(AnsibleFilterError, match='^shm_cleanup: unknown results befor '):
        shm_cleanup({'befor': {}})


def test_a_pending_region_is_recorded_as_pending_with_its_reason_and_is_a_change():
    """Triton 24.12+: the unregister was accepted but the region is still listed (requests in flight)."""
    reason = 'pending: unregistered, but still listed by the server after 10s (requests in flight: it goes when they finish)'
    absent = dict(ABSENT, unregistered=[], pending=['dead'], removed_files=[], freed_bytes=0,
                  skipped_items=[dict(name='dead', reason=reason), dict(path='/dev/shm/dead', reason="region 'dead' is still registered")])
    r = result(info([DEAD]), absent=absent, after=info([DEAD]))
    assert r['done']['pending'] == ['dead'] and r['done']['unregistered'] == []
    assert (r['status'], r['changed'], r['error']) == ('ok', True, None), 'a stated reason: not a verify failure'
    assert {s.get('name') or s.get('path'): s['reason'] for s in r['skipped']}['dead'] == reason


def test_a_server_without_shared_memory_fails_the_host_with_the_plain_reason():
    """Triton 2.73+ through tritonfrontend: triton_shm_info reports it, the role never calls that host ok."""
    before = info([])
    before['server'] = dict(before['server'], shm_unsupported='read system shared memory status at U: HTTP 503: '
                            'Shared memory is not supported in this server configuration.; not a leak')
    plan = shm_cleanup_plan(before, host='h1', url='U')
    assert plan['act'] is False
    assert plan['error'] == dict(step=READ_STEP, msg=f"nothing on h1 could be checked: {before['server']['shm_unsupported']}")
    r = shm_cleanup_result(before, plan)
    assert r['status'] == 'failed' and 'not supported in this server configuration' in r['error']['msg']


def test_leftover_backend_pools_make_the_role_act_whatever_the_threshold():
    query = info([region('live', 'healthy', holders=[7])])
    query['summary'].update(leftover_files=2, leftover_bytes=2 << 20)
    settings = dict(threshold_percent=50, orphan_patterns='tmp_*')
    plan = shm_cleanup(dict(query=query), backend_leftovers=True, **settings)['plan']
    assert (plan['act'], plan['candidates'], plan['unregister'], plan['backend_leftovers']) == (True, True, True, True)
    assert plan['decision'] == '2 leftover backend pool(s) that no process holds'
    # off: reported (the summary counts them), never a reason to act
    off = shm_cleanup(dict(query=query), backend_leftovers=False, **settings)
    assert (off['plan']['act'], off['plan']['backend_leftovers']) == (False, False)
    assert (off['record']['before']['leftover_files'], off['record']['before']['leftover_bytes']) == (2, 2 << 20)
    # the one-call path hands the setting to the module
    assert shm_cleanup({'direct': None}, backend_leftovers=True)['plan']['backend_leftovers'] is True


# -- issue 25 / issue 26 finding 7: a cleanup whose holders could not all be seen is never ok -------------------------

def test_a_cleanup_whose_holders_are_incomplete_is_incomplete_with_the_reason():
    before = dict(info([region('a', 'unknown', state_reason='holders could not be fully determined')]),
                  holders_complete=False, pid_namespace='other', holders_incomplete_reason='outside the initial namespace')
    r = result(before)
    assert (r['status'], r['changed'], r['error']) == ('incomplete', False, None)
    assert r['server']['holders_complete'] is False and r['server']['pid_namespace'] == 'other'
    assert r['server']['holders_incomplete_reason'] == 'outside the initial namespace'
    assert result(dict(before, holders_complete=True, holders_incomplete_reason=None))['status'] == 'ok'


# --- reclaiming grown python backend pools (opt-in, issue 27) ------------------------------------------------

RELOADED = [dict(model='grow', before_bytes=35651584, after_bytes=1048576, old_pools=['a'], new_pools=['b'], old_gone=True,
                 seconds=2.5)]


@pytest.mark.parametrize('settings, reload_pools, max_bytes, max_percent', [
    ({}, False, None, None),
    (dict(reload_pools_over_bytes=0, reload_pools_over_percent='0'), False, None, None),
    (dict(reload_pools_over_bytes='1073741824'), True, 1073741824, None),
    (dict(reload_pools_over_percent='25'), True, None, 25.0),
    (dict(reload_pools_over_bytes=1 << 20, reload_pools_over_percent=10), True, 1 << 20, 10.0),
], ids=['off-by-default', 'zero-is-off', 'bytes-as-a-survey-string', 'percent', 'both'])
def test_the_reload_is_opt_in_and_its_limits_come_from_the_settings(settings, reload_pools, max_bytes, max_percent):
    plan = shm_cleanup({}, **settings)['plan']
    assert (plan['reload_pools'], plan['reload_max_bytes'], plan['reload_max_percent']) == (reload_pools, max_bytes, max_percent)


def test_the_models_reloaded_are_recorded_and_are_a_change():
    results = dict(direct=direct(info([LIVE])), reload=dict(changed=True, reloaded=RELOADED, models=[]))
    record = shm_cleanup(results, reload_pools_over_percent=25)['record']
    assert record['done']['reloaded'] == RELOADED and record['changed'] is True and record['status'] == 'ok'
    # the same results without the opt-in: an earlier run's reload result is not this run's
    record = shm_cleanup(results)['record']
    assert record['done']['reloaded'] == [] and record['changed'] is False
    skipped = shm_cleanup(dict(direct=direct(info([LIVE])), reload=SKIPPED), reload_pools_over_bytes=1)['record']
    assert skipped['done']['reloaded'] == [] and skipped['changed'] is False


@pytest.mark.parametrize('settings', [dict(reload_pools_over_bytes=-1), dict(reload_pools_over_percent='many')])
def test_bad_reload_limits_are_refused(settings):
    with pytest.raises(AnsibleFilterError, match='reload_pools_over'):
        shm_cleanup({}, **settings)
