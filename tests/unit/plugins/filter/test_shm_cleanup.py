"""Unit tests for the shm_cleanup role's filters (shm_list, shm_cleanup_plan, shm_cleanup_result): tables of cases."""
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.shm_cleanup import (
    LOCATE_STEP, VERIFY_STEP, FilterModule, shm_cleanup_plan, shm_cleanup_result, shm_list)


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
    assert dict((s['name'], s['reason']) for s in r['skipped']) == skipped
    assert (r['error'] is None) == (status == 'ok')


def test_result_verify_failure_names_the_region():
    r = result(info([DEAD]), absent=ABSENT, after=info([DEAD]))
    assert r['error'] == dict(step=VERIFY_STEP, msg='stale region(s) remain after cleanup, with no reason recorded: dead')
    assert r['done'] == dict(unregistered=['dead'], removed_files=['/dev/shm/dead'], freed_bytes=4096, registered=[], created_files=[])


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
    assert r['done'] == dict(unregistered=[], removed_files=[], freed_bytes=0, registered=[], created_files=[])
    assert r['after'] == r['before']


def test_result_of_a_host_whose_query_failed():
    r = shm_cleanup_result({'failed': True, 'msg': 'cannot connect'}, {}, failure=dict(step='Query', msg='cannot connect'),
                           host='h', url='u', finished_epoch='17')
    assert (r['status'], r['changed'], r['before'], r['after'], r['acted'], r['decision']) == ('failed', False, None, None, False, '')
    assert r['server']['version'] is None and r['finished_epoch'] == 17


def test_filter_module_exposes_the_filters():
    assert set(FilterModule().filters()) == {'shm_list', 'shm_cleanup_plan', 'shm_cleanup_result'}
