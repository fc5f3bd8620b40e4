"""Unit tests for module_utils/run/backend_pool.py: which models triton_backend_pool reloads, and how it asks.

plan() is pure: literal backend_pools records (inventory.pool_records' shape) in, one ModelPlan per model out.
The reload is asked of a fake client that records its calls; wait_gone runs on real files.
"""

from __future__ import annotations

import os
import threading

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.host import shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.run import backend_pool
from ansible_collections.tritonops.shm.plugins.module_utils.run.backend_pool import KEEP, RELOAD, SKIP, Threshold

MIB = 1 << 20


def pool(model, instance, mib, state='live', name=None):
    return {
        'path': f'/dev/shm/{name or instance}',
        'name': name or f'triton_python_backend_shm_region_{instance}',
        'backend': 'python',
        'model': model,
        'instance': instance,
        'bytes': mib * MIB,
        'size': mib * MIB,
        'holders': [],
        'state': state,
        'reason': '',
    }


POOLS = [
    pool('grow', 'grow_0_0', 20),
    pool('grow', 'grow_0_1', 12),  # 32 MiB over two instances
    pool('echo', 'echo_0_0', 1),
    pool(None, None, 50, name='triton_python_backend_shm_region_x'),  # no stub maps it: no model to reload
    pool(None, None, 80, state='leftover', name='triton_python_backend_shm_region_dead'),
]

CASES = [
    # id, threshold, fs_total, models, index, expected {model: action}
    ('bytes-per-model-total', Threshold(max_bytes=30 * MIB), None, (), None, {'grow': RELOAD, 'echo': KEEP}),
    ('at-the-limit-is-not-over', Threshold(max_bytes=32 * MIB), None, (), None, {'grow': KEEP, 'echo': KEEP}),
    ('percent-of-the-fs', Threshold(max_percent=20), 128 * MIB, (), None, {'grow': RELOAD, 'echo': KEEP}),
    ('percent-under', Threshold(max_percent=30), 128 * MIB, (), None, {'grow': KEEP, 'echo': KEEP}),
    (
        'smaller-limit-wins',
        Threshold(max_bytes=MIB // 2, max_percent=90),
        128 * MIB,
        (),
        None,
        {'grow': RELOAD, 'echo': RELOAD},
    ),
    ('percent-without-fs-size', Threshold(max_percent=1), None, (), None, {'grow': SKIP, 'echo': SKIP}),
    ('only-named-models', Threshold(max_bytes=0), None, ('echo',), None, {'echo': RELOAD}),
    (
        'not-ready-in-the-index',
        Threshold(max_bytes=MIB),
        None,
        (),
        [{'name': 'grow', 'state': 'UNAVAILABLE'}],
        {'grow': SKIP, 'echo': KEEP},
    ),
    (
        'ready-in-the-index',
        Threshold(max_bytes=MIB),
        None,
        (),
        [{'name': 'grow', 'state': 'READY'}],
        {'grow': RELOAD, 'echo': KEEP},
    ),
]


@pytest.mark.parametrize(
    'threshold, fs_total, models, index, expected', [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_plan(threshold, fs_total, models, index, expected):
    plans = backend_pool.plan(POOLS, fs_total, threshold, models, index)
    assert {p.model: p.action for p in plans} == expected


def test_a_plan_sums_the_instances_and_names_its_pools_and_why():
    (grow,) = [p for p in backend_pool.plan(POOLS, None, Threshold(max_bytes=30 * MIB)) if p.model == 'grow']
    assert grow.bytes == 32 * MIB and grow.limit == 30 * MIB
    assert grow.instances == ['grow_0_0', 'grow_0_1']
    assert grow.pools == ['triton_python_backend_shm_region_grow_0_0', 'triton_python_backend_shm_region_grow_0_1']
    assert 'over the limit of 31457280 bytes' in grow.reason
    assert set(grow.as_dict()) == {'model', 'action', 'bytes', 'limit', 'instances', 'pools', 'reason'}


def test_leftovers_and_pools_of_no_model_are_never_planned():
    plans = backend_pool.plan(POOLS, None, Threshold(max_bytes=0))
    assert [p.model for p in plans] == ['echo', 'grow']


@pytest.mark.parametrize(
    'argv, mode',
    [
        (['tritonserver', '--model-repository', '/m'], 'none'),
        (['tritonserver', '--model-control-mode=explicit'], 'explicit'),
        (['tritonserver', '--model-control-mode', 'EXPLICIT', '--load-model', 'a'], 'explicit'),
        (['tritonserver', '--model-control-mode=poll', '--repository-poll-secs', '5'], 'poll'),
        (['tritonserver', '--model-control-mode=explicit', '--model-control-mode=none'], 'none'),
        (None, None),
    ],
)
def test_model_control_from_the_command_line(argv, mode):
    assert backend_pool.model_control(argv) == mode


def test_refusal_says_the_mode_and_the_way_out():
    assert backend_pool.refusal('explicit') is None and backend_pool.refusal(None) is None
    why = backend_pool.refusal('none')
    assert '--model-control-mode=none' in why and '--model-control-mode=explicit' in why


def test_server_argv_reads_the_command_line_of_a_real_process():
    assert backend_pool.server_argv(os.getpid())[0].endswith(('python', 'python3', 'python3.12', 'pytest'))
    assert backend_pool.server_argv(None) is None
    assert backend_pool.server_argv(2**22 + 7) is None


class FakeClient:
    def __init__(self):
        self.calls = []

    def model_config(self, name):
        self.calls.append(('model_config', name))
        return {'name': name, 'backend': 'python', 'parameters': {'own': {'string_value': 'kept'}}}

    def load_model(self, name, config=None, timeout=None):
        self.calls.append(('load_model', name, config, timeout))


def test_a_reload_sends_the_model_s_own_config_with_a_new_parameter_each_time():
    """Triton 2.51 ignores a load of an unchanged model: every reload must change something (a new stamp)."""
    client = FakeClient()
    backend_pool.reload_model(client, 'grow', timeout=60, stamp='1')
    backend_pool.reload_model(client, 'grow', timeout=60)
    first_call, second_call = [c for c in client.calls if c[0] == 'load_model']
    first, second = first_call[2], second_call[2]
    assert first_call[3] == 60
    assert first['parameters'] == {
        'own': {'string_value': 'kept'},
        backend_pool.RELOAD_PARAMETER: {'string_value': '1'},
    }
    assert second['parameters'][backend_pool.RELOAD_PARAMETER] != first['parameters'][backend_pool.RELOAD_PARAMETER]
    assert first['name'] == 'grow' and first['backend'] == 'python'


def test_reload_config_does_not_change_the_config_it_was_given():
    config = {'name': 'grow'}
    assert backend_pool.reload_config(config, 's')['parameters'] == {
        backend_pool.RELOAD_PARAMETER: {'string_value': 's'}
    }
    assert config == {'name': 'grow'}


def test_wait_gone_returns_when_the_files_go_or_names_those_left(tmp_path):
    a, b = tmp_path / 'a', tmp_path / 'b'
    a.write_bytes(b'x')
    b.write_bytes(b'x')
    timer = threading.Timer(0.2, a.unlink)
    timer.start()
    shm = shm_fs.pin(str(tmp_path))
    assert backend_pool.wait_gone(shm, ['a'], wait=5) == []
    assert backend_pool.wait_gone(shm, ['a', 'b'], wait=0.1) == ['b']


# -- issue 33, finding 5: a stateful or decoupled model is not reloaded by default ---------------------------------


@pytest.mark.parametrize(
    'config, starts',
    [
        ({'name': 'seq', 'sequence_batching': {'max_sequence_idle_microseconds': 1000}}, 'the model is stateful'),
        ({'name': 'dec', 'model_transaction_policy': {'decoupled': True}}, 'the model is decoupled'),
        ({'name': 'echo', 'model_transaction_policy': {'decoupled': False}}, None),
        ({'name': 'echo'}, None),
    ],
)
def test_stateful_refusal_from_the_completed_config(config, starts):
    why = backend_pool.stateful_refusal(config)
    if starts is None:
        assert why is None
    else:
        assert why.startswith(starts) and why.endswith('allow_stateful: true reloads it anyway')


def test_a_refused_model_over_the_limit_is_skipped_with_the_reason_and_the_others_reloaded():
    refusals = {'grow': 'the model is stateful (sequence_batching): drops sequences'}
    plans = {p.model: p for p in backend_pool.plan(POOLS, None, Threshold(max_bytes=0), refusals=refusals)}
    assert plans['grow'].action == SKIP and plans['echo'].action == RELOAD
    assert plans['grow'].reason.endswith('not reloaded: the model is stateful (sequence_batching): drops sequences')
    # under the limit, the refusal does not matter: kept
    plans = {p.model: p for p in backend_pool.plan(POOLS, None, Threshold(max_bytes=40 * MIB), refusals=refusals)}
    assert plans['grow'].action == KEEP
