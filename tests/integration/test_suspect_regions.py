"""A registration on Triton's own backend pool is suspect (issue 42, goal 6), on the real Triton 2.51.

Registering a region whose key is one of the python backend's own pool files was step 2 of the 2025 attack chain
(Triton 25.07 and later refuse it); the real 2.51 accepts it. Before, triton_shm_info called that region ``healthy``
(the stub holds the file), the pool file's category became ``registered`` and ``backend_files`` fell to 0, and nothing
warned. Now the region is ``suspect`` (counted, exported, alerted), its file stays ``backend``, a stale cleanup never
takes it, and ``suspect: true`` unregisters it without touching the pool, which keeps serving.
"""

from __future__ import annotations

import glob
import os

import tritonrig
from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'


def _infer_ok(server) -> bool:
    body = {'inputs': [{'name': 'INPUT0', 'datatype': 'UINT8', 'shape': [3], 'data': [1, 2, 3]}]}
    status, answer = tritonrig.http_json(server.url + '/v2/models/echo/infer', 'POST', body)
    return status == 200 and answer['outputs'][0]['data'] == [1, 2, 3]


def test_a_region_on_the_python_backends_own_pool_is_suspect_kept_by_stale_and_unregistered_only_when_asked(
    triton, tmp_path
):
    (pool, *_rest) = triton.backend_files()
    status, body = triton.api(
        '/v2/systemsharedmemory/region/evil/register', 'POST', {'key': '/' + pool, 'offset': 0, 'byte_size': 4096}
    )
    assert status == 200, body  # 2.51 accepts it (25.07 and later refuse it)
    triton.leak('dead', byte_size=4096)

    info = run_module(INFO, dict(url=triton.url, metrics_dir=str(tmp_path), metrics_host='t1'))
    assert not info.get('failed'), info
    regions = {r['name']: r for r in info['system_regions']}
    assert regions['evil']['state'] == 'suspect' and 'attack' in regions['evil']['state_reason'], regions['evil']
    assert regions['evil']['reclaimable'] is False
    files = {f['name']: f for f in info['files']}
    assert files[pool]['category'] == 'backend' and files[pool]['regions'] == ['evil'], files[pool]
    summary = info['summary']
    assert summary['suspect_regions'] == 1 and summary['backend_files'] == len(triton.backend_files()) >= 1, summary
    metrics = ''.join(open(p).read() for p in glob.glob(os.path.join(str(tmp_path), '*.prom')))
    assert any(
        line.startswith('tritonops_shm_regions{') and 'state="suspect"' in line and line.endswith(' 1')
        for line in metrics.splitlines()
    ), metrics[:3000]

    stale = run_module(REGION, dict(url=triton.url, state='absent', stale=True))
    assert stale['unregistered'] == ['dead'] and 'evil' in triton.system_regions(), stale

    asked = run_module(REGION, dict(url=triton.url, state='absent', suspect=True))
    assert not asked.get('failed'), asked
    assert asked['unregistered'] == ['evil'] and asked['removed_files'] == [], asked
    assert 'evil' not in triton.system_regions() and pool in triton.backend_files()
    assert _infer_ok(triton), 'the pool still serves its model'
    assert run_module(REGION, dict(url=triton.url, state='absent', suspect=True))['changed'] is False
