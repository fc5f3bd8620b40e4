"""Unit tests for region_plan: the pure plan of triton_shm_region, on literal snapshots (no files, no processes)."""

from __future__ import annotations

import dataclasses

import pytest
from test_authority import SERVER, SHM, entry, region, snapshot

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError
from ansible_collections.tritonops.shm.plugins.module_utils.rules import region_plan
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import Criteria, classify
from ansible_collections.tritonops.shm.tests.unit.plugins.module_utils.test_region_ops import params as region_params

CLIENT_PATTERNS = ['client_*']


def params(**kw):
    """The region module's parameters for a plan: test_region_ops's, with stale and client orphans selected."""
    base = dict(
        stale=True, orphan_files=True, orphan_patterns=CLIENT_PATTERNS, backend_patterns=None, threshold_percent=0
    )
    return region_params(None, None, **{**base, **kw})


def scene(used_percent):
    """A stale region 'a' (its file held by the server only) and an old orphan file, on a shm filesystem this full."""
    snap = snapshot([region('a', '/a')], [entry('a', 1), entry('client_old', 2)], held={1: [SERVER]}, deleted_all={})
    fs = (
        None
        if used_percent is None
        else {'total_bytes': 100, 'used_bytes': int(used_percent), 'free_bytes': 0, 'used_percent': used_percent}
    )
    return dataclasses.replace(snap, fs=fs)


def plan(snap, **kw):
    p = params(**kw)
    criteria = Criteria.of(orphan_patterns=p['orphan_patterns'], min_age=p['min_age'])
    return region_plan.plan_absent(snap, classify(snap, criteria), p, criteria, lambda name: None)


@pytest.mark.parametrize(
    'percent, used, over',
    [
        (0, 40.0, True),  # no gate
        (0, None, True),  # no gate, even when the use is not known
        (30, 40.0, True),  # above
        (40, 40.0, True),  # at: the gate is open
        (50, 40.0, False),  # below
        (50, None, False),  # not known: closed
    ],
)
def test_the_threshold_gates_orphan_files_only(percent, used, over):
    p = plan(scene(used), threshold_percent=percent)
    assert p.threshold.as_dict() == {'percent': percent, 'used_percent': used, 'over': over}
    assert p.selected_names == ['a'], 'a stale region is unregistered whatever the use'
    removed = [e['name'] for e, _region in p.files]
    if over:
        assert removed == ['a', 'client_old'] and p.skipped == []
    else:
        assert removed == ['a'], 'its backing file goes whatever the use; the orphan stays'
        assert p.skipped == [{'path': f'{SHM}/client_old', 'reason': p.threshold.keep_reason()}]
        assert f'threshold_percent is {float(percent)}%' in p.skipped[0]['reason']
    assert p.changed is True


def test_below_the_threshold_with_only_orphans_nothing_changes():
    snap = dataclasses.replace(scene(10.0), regions=dict(system=[], cuda=[]), entries=[entry('client_old', 2)])
    p = plan(snap, threshold_percent=80)
    assert p.files == [] and p.selected == [] and p.changed is False
    assert p.threshold.over is False and [s['path'] for s in p.skipped] == [f'{SHM}/client_old']


@pytest.mark.parametrize(
    'kw, why',
    [
        (dict(threshold_percent=-1), 'threshold_percent must be between 0 and 100, got -1'),
        (dict(threshold_percent=101), 'threshold_percent must be between 0 and 100, got 101'),
        (
            dict(threshold_percent=50, kind='cuda', orphan_files=False),
            'threshold_percent applies to state=absent with kind=system',
        ),
        (
            dict(
                threshold_percent=50,
                state='present',
                name=['x'],
                key='/x',
                byte_size=1,
                stale=False,
                orphan_files=False,
            ),
            'threshold_percent applies to state=absent with kind=system',
        ),
    ],
)
def test_threshold_percent_is_checked(kw, why):
    with pytest.raises(ParameterError, match=why):
        region_plan.check_params(params(**kw), lambda name: None)
