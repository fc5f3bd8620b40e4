"""A /dev/shm that other software fills with 100,000 files (issue 42, goal 1), on the real Triton 2.51.

Before, triton_shm_info returned one record per file: 40.6 MB of JSON to the controller (and to AWX's job events) and
25 s for the call. Now the default answer lists every file of Triton's and the 1,000 largest of the rest, counts what
it leaves out (files_omitted) and still counts every file in the summary and the families; file_records=all lists
every file. The test checks what a user would: the answer's size, that nothing of Triton's is missing from it, that the
figures still add up, and that a stale cleanup beside those files removes the leaks and nothing else.
"""

from __future__ import annotations

import json
import os
import time

from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
SMALL = 100_000  # empty files of three families
BIG = 30  # 64 KiB files of no known family: among the largest, they must be listed
KIB = 1024


def _fill(shm_dir: str) -> None:
    shapes = ('nccl-shm-%d', 'vllm_offload_%d.mmap', 'sgl_shm_%d')
    for i in range(SMALL):
        with open(os.path.join(shm_dir, shapes[i % 3] % i), 'wb'):
            pass
    for i in range(BIG):
        with open(os.path.join(shm_dir, f'big_other_{i}'), 'wb') as f:
            f.write(b'\1' * 64 * KIB)


def test_100k_files_a_small_answer_that_still_explains_every_byte(triton):
    leaked = [f'leak_{i}' for i in range(3)]
    for name in leaked:
        triton.leak(name, byte_size=64 * KIB)
    _fill(triton.shm_dir)
    pools = triton.backend_files()
    assert pools, "the echo model runs a python stub: its pool is one of Triton's files"

    started = time.monotonic()
    info = run_module(INFO, dict(url=triton.url))
    limited_s = time.monotonic() - started
    assert not info.get('failed'), info
    size = len(json.dumps(info))
    print(
        f'\n100,030 other files: default answer {size / 1e6:.2f} MB in {limited_s:.1f} s (ansible-playbook, whole run)'
    )
    assert size < 1_000_000, size

    listed = {f['name']: f for f in info['files']}
    for name in leaked + pools:  # every file of Triton's is listed
        assert name in listed, name
    assert {r['name'] for r in info['system_regions'] if r['state'] == 'stale'} == set(leaked)
    others = [f for f in info['files'] if f['category'] in ('foreign', 'in_use')]
    assert len(others) == 1000, len(others)
    assert {f'big_other_{i}' for i in range(BIG)} <= set(listed)  # the largest are the ones listed
    summary = info['summary']
    assert summary['foreign_files'] == SMALL + BIG
    assert info['files_omitted']['files'] == SMALL + BIG - 1000
    assert info['files_omitted']['by_category'] == {'foreign': SMALL + BIG - 1000}
    families = {f['name']: f for f in info['families']}
    assert families['nccl']['files'] + families['vllm']['files'] + families['sglang']['files'] == SMALL
    assert families['other']['files'] == BIG and families['other']['bytes'] == BIG * 64 * KIB
    categories = sum(
        summary[f'{c}_bytes'] for c in ('registered', 'backend', 'leftover', 'in_use', 'orphan', 'foreign')
    )
    assert categories == summary['files_bytes']
    assert summary['files_bytes'] + summary['unlinked_mapped_bytes'] + summary['other_bytes'] == summary['used_bytes']

    res = run_module(REGION, dict(url=triton.url, state='absent', stale=True))
    assert not res.get('failed'), res
    assert sorted(res['unregistered']) == sorted(leaked)
    assert len(os.listdir(triton.shm_dir)) == SMALL + BIG + len(pools)

    # every file on request (at 2,030 other files: listing 100,030 through ansible-playbook takes half a minute)
    for i in range(2000, SMALL):
        os.unlink(os.path.join(triton.shm_dir, ('nccl-shm-%d', 'vllm_offload_%d.mmap', 'sgl_shm_%d')[i % 3] % i))
    limited = run_module(INFO, dict(url=triton.url))
    everything = run_module(INFO, dict(url=triton.url, file_records='all'))
    assert len(limited['files']) == 1000 + len(pools) and limited['files_omitted']['files'] == 1030
    assert [f['name'] for f in everything['files']] == sorted(os.listdir(triton.shm_dir))
    assert everything['files_omitted'] == {'files': 0, 'bytes': 0, 'by_category': {}}
    for key in ('foreign_files', 'foreign_bytes', 'backend_files', 'files_bytes'):
        assert everything['summary'][key] == limited['summary'][key], key
