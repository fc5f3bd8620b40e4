"""Numbers that add up (issue 44, goal 5), on the real Triton 2.51.

Before, a cleanup's FREED counted the removed files only: one run said 24 MiB freed while /dev/shm used fell by
28 MiB, the difference being a dangling region's memory (its client unlinked the file, Triton kept it mapped until the
unregister). Now the region module says both (freed_bytes, freed_unlinked_bytes), in check mode too, and what the
filesystem says fell is their sum.
"""

from __future__ import annotations

from ansible_helpers import run_module

REGION = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20


def test_freed_is_the_files_and_the_dangling_regions_memory_and_that_is_what_df_shows(triton):
    triton.leak('stale_one', byte_size=8 * MIB)  # the file stays: a stale region
    triton.leak('dangling_one', byte_size=6 * MIB, keep_file=False)  # the file unlinked: a dangling region
    args = dict(url=triton.url, state='absent', stale=True)

    preview = run_module(REGION, args, check=True)
    assert not preview.get('failed'), preview
    assert (preview['freed_bytes'], preview['freed_unlinked_bytes']) == (8 * MIB, 6 * MIB), preview
    assert set(triton.system_regions()) >= {'stale_one', 'dangling_one'}

    before = triton.shm_usage()['used_bytes']
    done = run_module(REGION, args)
    after = triton.shm_usage()['used_bytes']
    assert sorted(done['unregistered']) == ['dangling_one', 'stale_one'], done
    assert (done['freed_bytes'], done['freed_unlinked_bytes']) == (8 * MIB, 6 * MIB), done
    assert before - after == done['freed_bytes'] + done['freed_unlinked_bytes'], (before, after, done)

    again = run_module(REGION, args)
    assert again['changed'] is False and (again['freed_bytes'], again['freed_unlinked_bytes']) == (0, 0)
