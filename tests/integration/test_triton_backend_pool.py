"""triton_backend_pool on real Triton 2.51 servers: a grown python backend pool reclaimed by reloading its model (issue 27).

The rig's ``grow`` model answers SIZE zero bytes: one large request grows its instance's pool, which never shrinks.
Live clients (tritonclient.http) keep sending small requests to it while the module reloads it.
"""

from __future__ import annotations

import os
import sys
import threading

import ansible_helpers
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonrig

if ansible_helpers.COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, ansible_helpers.COLLECTIONS_PATH)

from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.sizing import shm_size  # noqa: E402  pylint: disable=wrong-import-position

MODULE = 'tritonops.shm.triton_backend_pool'
MIB = 1 << 20


def infer(client, size):
    inp = httpclient.InferInput('SIZE', [1], 'INT64')
    inp.set_data_from_numpy(np.array([size], dtype=np.int64))
    return client.infer('grow', [inp]).as_numpy('OUTPUT0').nbytes


def pools(server, model_prefix='triton_python_backend_shm_region_'):
    out = {}
    for name in os.listdir(server.shm_dir):
        if name.startswith(model_prefix):
            out[name] = os.stat(os.path.join(server.shm_dir, name)).st_blocks * 512
    return out


def grow(server, size=24 * MIB):
    client = httpclient.InferenceServerClient(server.url.split('://', 1)[1])
    assert infer(client, size) == size
    client.close()


class Traffic:
    """Small requests to 'grow' from two threads until stopped; counts answers and failures."""

    def __init__(self, server):
        self.host = server.url.split('://', 1)[1]
        self.ok = 0
        self.failed = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _thread in range(2)]

    def run(self):
        client = httpclient.InferenceServerClient(self.host, network_timeout=60.0)
        while not self.stop.is_set():
            try:
                infer(client, 1024)
                self.ok += 1
            except Exception as exc:  # noqa: BLE001  pylint: disable=broad-except
                self.failed.append(str(exc))
        client.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)


@pytest.fixture
def grown(make_triton):
    server = make_triton(models=('grow', 'echo'), shm_size='128m')
    grow(server)
    return server


def test_reload_reclaims_the_grown_pool_under_live_traffic(grown):
    before = pools(grown)
    big = [n for n, b in before.items() if b > 16 * MIB]
    assert len(big) == 1, before
    args = {'url': grown.url, 'max_bytes': 8 * MIB}

    checked = ansible_helpers.run_module(MODULE, args, check=True)
    assert checked['changed'] is True, checked
    assert [r['model'] for r in checked['reloaded']] == ['grow']
    assert checked['reloaded'][0]['after_bytes'] is None
    assert pools(grown) == before  # check mode reloads nothing
    actions = {m['model']: m['action'] for m in checked['models']}
    assert actions == {'grow': 'reload', 'echo': 'keep'}, checked['models']

    with Traffic(grown) as traffic:
        result = ansible_helpers.run_module(MODULE, args)
    assert result['changed'] is True, result
    assert result['model_control'] == 'explicit'
    done = result['reloaded'][0]
    assert done['model'] == 'grow' and done['old_pools'] == big and done['old_gone'] is True, done
    assert done['before_bytes'] > 16 * MIB and done['after_bytes'] <= 2 * MIB, done
    after = pools(grown)
    assert big[0] not in after  # the old file is gone
    assert set(done['new_pools']) <= set(after) and done['new_pools']
    assert traffic.ok > 0 and traffic.failed == [], traffic.failed[:3]

    client = httpclient.InferenceServerClient(grown.url.split('://', 1)[1])
    assert infer(client, 1000) == 1000  # inference works after
    again = ansible_helpers.run_module(MODULE, args)
    assert again['changed'] is False and again['reloaded'] == [], again

    # the same server, grown again, reloaded over gRPC: a second reload of the same model really reloads
    # (Triton 2.51 ignores a load of an unchanged model: the module sends a changed parameter each time)
    grow(grown)
    second = ansible_helpers.run_module(MODULE, {'url': grown.url, 'max_percent': 10})
    assert second['changed'] is True and second['reloaded'][0]['after_bytes'] <= 2 * MIB, second


def test_reload_over_grpc(make_triton):
    server = make_triton(models=('grow',), shm_size='128m', grpc=True)
    grow(server)
    result = ansible_helpers.run_module(
        MODULE, {'url': server.grpc_scheme_url, 'max_bytes': 8 * MIB, 'models': ['grow']}
    )
    assert result['changed'] is True, result
    assert result['reloaded'][0]['old_gone'] is True and result['reloaded'][0]['after_bytes'] <= 2 * MIB


def test_refused_without_explicit_model_control(make_triton):
    server = make_triton(models=('grow',), shm_size='128m', model_control='none')
    grow(server)
    before = pools(server)
    for check in (True, False):
        result = ansible_helpers.run_module(MODULE, {'url': server.url, 'max_bytes': 8 * MIB}, check=check)
        assert result.get('failed') is True, result
        assert '--model-control-mode=none' in result['msg'] and 'grow' in result['msg'], result['msg']
        assert pools(server) == before


def test_under_the_limit_changes_nothing(make_triton):
    server = make_triton(models=('grow',), shm_size='128m')
    before = pools(server)
    result = ansible_helpers.run_module(MODULE, {'url': server.url, 'max_bytes': 8 * MIB})
    assert result['changed'] is False and result['reloaded'] == [], result
    assert [m['action'] for m in result['models']] == ['keep']
    assert pools(server) == before


def test_rig_grow_model_pool_grows_and_never_shrinks(make_triton):
    """The rig's grow model: the pool starts at shm-default-byte-size, grows in shm-growth-byte-size steps, never shrinks."""
    server = make_triton(
        models=('grow',),
        shm_size='128m',
        backend_config=('python,shm-default-byte-size=%d' % (2 * MIB), 'python,shm-growth-byte-size=%d' % (4 * MIB)),
    )
    ((name, size),) = [(n, os.stat(os.path.join(server.shm_dir, n)).st_size) for n in pools(server)]
    assert size == 2 * MIB
    client = httpclient.InferenceServerClient(server.url.split('://', 1)[1])
    infer(client, 10 * MIB)
    grown_size = os.stat(os.path.join(server.shm_dir, name)).st_size
    assert grown_size > 10 * MIB and (grown_size - 2 * MIB) % (4 * MIB) == 0, grown_size
    for size in (100, 1000, 100):
        infer(client, size)
    assert os.stat(os.path.join(server.shm_dir, name)).st_size == grown_size


# (requests in the order they come, shm-default-byte-size, shm-growth-byte-size): a single large request, and requests
# rising towards the largest, which leave the pool just too small for it before it grows once more
PLANNED = [
    pytest.param((32 * MIB,), MIB, MIB, id='one-32MiB-request'),
    pytest.param((3 * MIB, 20 * MIB), MIB, MIB, id='3-then-20MiB'),
    pytest.param((9 * MIB, 11 * MIB), MIB, MIB, id='9-then-11MiB'),
    pytest.param((3 * MIB, 20 * MIB), 4 * MIB, 8 * MIB, id='3-then-20MiB-4MiB-8MiB-steps'),
]


@pytest.mark.parametrize('requests, default, growth', PLANNED)
def test_the_shm_size_plan_covers_the_pool_real_requests_grow(make_triton, requests, default, growth):
    """Issue 27 goal 4: the shm_size planner's pool per instance is never smaller than what real requests of up to
    the largest tensor grow a real 2.51 pool to, whatever their order."""
    server = make_triton(
        models=('grow',),
        shm_size='160m',
        backend_config=(f'python,shm-default-byte-size={default}', f'python,shm-growth-byte-size={growth}'),
    )
    (name,) = list(pools(server))  # one instance: one pool
    client = httpclient.InferenceServerClient(server.url.split('://', 1)[1])
    sizes = []
    for size in requests:
        infer(client, size)
        sizes.append(os.stat(os.path.join(server.shm_dir, name)).st_size)
    client.close()
    plan = shm_size(
        {
            'python_models': [{'name': 'grow', 'largest_tensor_bytes': max(requests)}],
            'python_backend_shm_default_byte_size': default,
            'python_backend_shm_growth_byte_size': growth,
        }
    )
    (model,) = plan['python_backend']['models']
    assert sizes[-1] <= model['pool_bytes'], (sizes, model)
    if len(requests) == 1:  # one request: exactly the python backend's step
        assert sizes[-1] == model['one_request_pool_bytes'], (sizes, model)


def test_cleanup_playbook_reloads_a_grown_pool_only_when_asked(make_triton):
    """The role's opt-in (shm_cleanup_reload_pools_over_*): off by default; check mode reloads nothing; a rerun is no change."""
    from test_shm_cleanup import cleanup, host_result  # pylint: disable=import-outside-toplevel

    server = make_triton(models=('grow', 'echo'), shm_size='128m', name='pools')
    grow(server)
    before = pools(server)

    default = cleanup([server])
    assert default.rc == 0, default
    assert host_result(default, 'pools')['done']['reloaded'] == [] and pools(server) == before

    checked = cleanup([server], check=True, shm_cleanup_reload_pools_over_percent=10)
    assert checked.rc == 0, checked
    record = host_result(checked, 'pools')
    assert [r['model'] for r in record['done']['reloaded']] == ['grow'] and record['changed'] is True
    assert pools(server) == before

    done = cleanup([server], shm_cleanup_reload_pools_over_percent=10, shm_cleanup_reload_pools_models='grow')
    assert done.rc == 0, done
    (reloaded,) = host_result(done, 'pools')['done']['reloaded']
    assert reloaded['model'] == 'grow' and reloaded['old_gone'] is True and reloaded['after_bytes'] <= 2 * MIB
    assert not set(reloaded['old_pools']) & set(pools(server))

    again = cleanup([server], shm_cleanup_reload_pools_over_percent=10)
    record = host_result(again, 'pools')
    assert again.rc == 0 and record['done']['reloaded'] == [] and record['changed'] is False, record


def test_cleanup_playbook_fails_the_host_with_the_reason_without_explicit_model_control(make_triton):
    from test_shm_cleanup import cleanup, host_result  # pylint: disable=import-outside-toplevel

    server = make_triton(models=('grow',), shm_size='128m', name='polling', model_control='none')
    grow(server)
    res = cleanup([server], shm_cleanup_reload_pools_over_bytes=8 * MIB)
    record = host_result(res, 'polling')
    assert res.rc != 0 and record['status'] == 'failed', record
    assert '--model-control-mode=none' in record['error']['msg'], record['error']


def test_the_pools_rulebook_reloads_the_alerting_model_only(make_triton, tmp_path):
    """A real ansible-rulebook (tritonops.shm.self_heal_pools) gets Alertmanager's POST: only a firing
    TritonShmBackendPoolLarge for an allowed host reloads, and only the model of the alert."""
    import socket  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    from test_self_healing import Rulebook, alert, host_vars, post  # pylint: disable=import-outside-toplevel

    server = make_triton(models=('grow', 'echo'), shm_size='128m', name='h1')
    grow(server)
    big = [n for n, b in pools(server).items() if b > 16 * MIB]
    echo = [n for n in pools(server) if n not in big]
    port = tritonrig.free_port()
    token = 'tok-%d' % time.monotonic_ns()
    rb = Rulebook(
        tmp_path,
        'tritonops.shm.self_heal_pools',
        {'h1': host_vars(server, tmp_path / 'prom')},
        {
            'self_heal_hosts': ['h1'],
            'self_heal_webhook_port': port,
            'self_heal_webhook_token': token,
            'self_heal_reload_pools_percent': 10,
        },
    )
    try:

        def listening():
            with socket.socket() as sock:
                return sock.connect_ex(('127.0.0.1', port)) == 0

        rb.wait('the webhook listens', listening, 90)

        def pool_alert(model, name='TritonShmBackendPoolLarge', host='h1', status='firing'):
            a = alert(name, host, status=status)
            a['labels']['model'] = model
            return a

        group = {
            'version': '4',
            'groupKey': '{}:{}',
            'status': 'firing',
            'receiver': 'pools',
            'groupLabels': {},
            'commonLabels': {},
            'commonAnnotations': {},
            'externalURL': 'http://alertmanager:9093',
            'truncatedAlerts': 0,
        }
        alerts = [
            pool_alert('grow', status='resolved'),  # resolved
            pool_alert('grow', name='TritonShmNearlyFull'),  # another alert
            pool_alert('grow', host='h2'),  # not an allowed host
            pool_alert('grow'),
        ]
        assert post(f'http://127.0.0.1:{port}/alerts', dict(group, alerts=alerts), token) == 200
        rb.wait('the grown pool is gone', lambda: not set(big) & set(pools(server)), 180)
        rb.wait('the cleanup run finished', lambda: rb.cleanups('h1') == 1, 60)
        assert max(pools(server).values()) <= 2 * MIB
        assert set(echo) <= set(pools(server))  # the other model was not reloaded
        assert rb.output().count('PLAY [Clean up Triton shared memory]') == 1
    finally:
        rb.stop()
