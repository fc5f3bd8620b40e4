"""Pool prefixes read, not configured (issue 42, goal 3), on the real Triton 2.51.

Two ranks share one /dev/shm, as TensorRT-LLM runs one server per rank: each started with
``--backend-config=python,shm-region-prefix-name=prefixN_``, so their python backend pools are named ``prefixN_<uuid>``.
Before, without a pattern the user listed, those pools were ``foreign`` (never protected as the backend's, never a
leftover). Now each server's prefix is read from its own command line: a live rank's pools are ``backend``, attributed
to its model; once a rank dies with its stubs, its pools (a prefix no live server sets, the pool name's shape) are
``leftover`` and ``backend_leftovers`` reclaims them, while the live rank's pools stay.
"""

from __future__ import annotations

import tritonrig
from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'


def test_two_ranks_sharing_one_shm_their_prefixes_read_and_a_dead_ranks_pools_leftover(tmp_path):
    with tritonrig.ShmNamespace(shm_size='64m') as ns:
        ranks = []
        try:
            for rank in (0, 1):
                ranks.append(
                    tritonrig.TritonServer(
                        workdir=str(tmp_path),
                        name=f'rank{rank}',
                        namespace=ns,
                        backend_config=(f'python,shm-region-prefix-name=prefix{rank}_',),
                    ).start()
                )
            rank0, rank1 = ranks
            pools = {r: [f for f in rank0.shm_files() if f.startswith(f'prefix{r}_')] for r in (0, 1)}
            assert pools[0] and pools[1], rank0.shm_files()

            info = run_module(INFO, dict(url=rank0.url, min_age=0))
            files = {f['name']: f for f in info['files']}
            for name in pools[0] + pools[1]:
                assert files[name]['category'] == 'backend', files[name]
            assert {p['model'] for p in info['backend_pools'] if p['name'] in pools[0]} == {'echo'}, info[
                'backend_pools'
            ]
            assert "prefix 'prefix0_'" in files[pools[0][0]]['category_reason']

            tritonrig.crash(rank1)  # the rank and its stubs at once: its pools stay, unheld
            info = run_module(INFO, dict(url=rank0.url, min_age=0))
            files = {f['name']: f for f in info['files']}
            assert all(files[n]['category'] == 'leftover' for n in pools[1]), [files[n] for n in pools[1]]
            assert 'no live server sets' in files[pools[1][0]]['category_reason']
            assert all(files[n]['category'] == 'backend' for n in pools[0])

            res = run_module(REGION, dict(url=rank0.url, state='absent', backend_leftovers=True, min_age=0))
            assert not res.get('failed'), res
            assert sorted(p.rsplit('/', 1)[1] for p in res['removed_files']) == sorted(pools[1]), res
            assert set(pools[0]) <= set(rank0.shm_files()) and not set(pools[1]) & set(rank0.shm_files())
            assert (
                run_module(REGION, dict(url=rank0.url, state='absent', backend_leftovers=True, min_age=0))['changed']
                is False
            )
        finally:
            for server in ranks:
                server.stop()
