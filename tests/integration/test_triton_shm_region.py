"""tritonops.shm.triton_shm_region against real tritonserver and real tritonclient processes.

Every test runs the module through ansible-playbook on a real server with a private
/dev/shm (the python backend's own file in it), with live clients, SIGKILLed clients
(stale and dangling regions) and foreign files beside them, and checks what a user would:
the server's regions, the files and their mtimes, /dev/shm usage, and the task results.
"""

from __future__ import annotations

import base64
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
import tritonrig
from ansible_helpers import COLLECTIONS_PATH, ansible_playbook, run_module

MODULE = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20
BACKEND = 'triton_python_backend_shm_region_'
# seconds: the min_age of a test with old files, which it waits for (tritonrig.wait_older: a file's age counts from its
# newest of atime, mtime and ctime, and utime() cannot set ctime back); a young file beside them is dated ahead
AGED = 2.0


# -- helpers --------------------------------------------------------------------------------------


def steps(*task_args, check=False, diff=False):
    """Run the module once per args dict in one playbook; return the results in order."""
    tasks = [
        {'name': 'step %d' % i, MODULE: args, 'register': 'r%d' % i, 'ignore_errors': True}
        for i, args in enumerate(task_args)
    ]
    play = [{'name': 'steps', 'hosts': 'localhost', 'connection': 'local', 'gather_facts': False, 'tasks': tasks}]
    res = ansible_playbook(play, check=check, diff=diff)
    try:
        return [res.task('step %d' % i) for i in range(len(task_args))]
    except KeyError:
        raise AssertionError('playbook did not run: %r\n%s' % (res, res.stdout[-3000:]))


def one(args, check=False, diff=False):
    return run_module(MODULE, args, check=check, diff=diff)


def snapshot(server):
    """Everything check mode and refused calls must leave alone: regions, entries, inodes, sizes, mtimes."""
    files = {}
    for name in server.shm_files():
        st = os.lstat(server.shm_path(name))
        files[name] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns)
    return server.system_regions(), files


def foreign(server, name='postgres_shm_1234', size=4096):
    return server.write_file(name, size, fill=b'f')


def skipped(result, key):
    return dict((i[key], i['reason']) for i in result['skipped_items'] if key in i)


def conn(server, **kw):
    kw['url'] = server.url
    return kw


# -- register -------------------------------------------------------------------------------------


def test_register_with_create_file_is_changed_then_not_changed(triton):
    other = foreign(triton)
    backend = triton.backend_files()
    assert backend
    first, second = steps(
        conn(triton, name='in0', key='/in0', byte_size=MIB, offset=4096, create_file=True),
        conn(triton, name='in0', key='/in0', byte_size=MIB, offset=4096, create_file=True),
    )
    assert first['changed'] is True and not first.get('failed'), first
    assert first['registered'] == ['in0']
    assert first['created_files'] == [os.path.join(triton.shm_dir, 'in0')]
    st = os.lstat(triton.shm_path('in0'))
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == MIB + 4096
    regions = triton.system_regions()
    assert regions['in0'] == {'name': 'in0', 'key': '/in0', 'offset': 4096, 'byte_size': MIB}
    assert [r['name'] for r in first['regions']] == ['in0']
    assert second['changed'] is False and second['registered'] == [] and second['created_files'] == []
    assert os.path.exists(other) and triton.backend_files() == backend


def test_register_a_clients_existing_file(triton):
    client = triton.client('feeder', byte_size=2 * MIB, register=False)  # a live client's file, not registered
    assert 'feeder' not in triton.system_regions()
    inode = os.lstat(triton.shm_path('feeder')).st_ino
    first, second = steps(
        conn(triton, name='feeder', key='/feeder', byte_size=2 * MIB),
        conn(triton, name='feeder', key='/feeder', byte_size=2 * MIB),
    )
    assert first['changed'] is True and first['registered'] == ['feeder'] and first['created_files'] == []
    assert triton.system_regions()['feeder']['byte_size'] == 2 * MIB
    assert os.lstat(triton.shm_path('feeder')).st_ino == inode  # used, never recreated
    assert second['changed'] is False
    assert client.alive


def test_re_register_a_changed_spec_shows_before_and_after(triton):
    triton.client('in0', byte_size=2 * MIB)
    first, second = steps(
        conn(triton, name='in0', key='/in0', byte_size=MIB, offset=MIB),
        conn(triton, name='in0', key='/in0', byte_size=MIB, offset=MIB),
        diff=True,
    )
    assert first['changed'] is True and first['unregistered'] == ['in0'] and first['registered'] == ['in0']
    assert first['diff']['before']['regions'] == [{'name': 'in0', 'key': '/in0', 'offset': 0, 'byte_size': 2 * MIB}]
    assert first['diff']['after']['regions'] == [{'name': 'in0', 'key': '/in0', 'offset': MIB, 'byte_size': MIB}]
    assert triton.system_regions()['in0'] == {'name': 'in0', 'key': '/in0', 'offset': MIB, 'byte_size': MIB}
    assert second['changed'] is False


def test_register_check_mode_touches_nothing(triton):
    triton.client('in0', byte_size=MIB)
    before = snapshot(triton)
    new, changed = steps(
        conn(triton, name='fresh', key='/fresh', byte_size=MIB, create_file=True),
        conn(triton, name='in0', key='/in0', byte_size=MIB // 2),
        check=True,
        diff=True,
    )
    assert new['changed'] is True and new['registered'] == ['fresh']
    assert new['created_files'] == [os.path.join(triton.shm_dir, 'fresh')]
    assert changed['changed'] is True and changed['registered'] == ['in0']
    assert changed['diff']['after']['regions'][0]['byte_size'] == MIB // 2
    assert [r['byte_size'] for r in changed['regions'] if r['name'] == 'in0'] == [MIB // 2]  # predicted
    assert snapshot(triton) == before


# -- unregister -----------------------------------------------------------------------------------


def test_stale_cleanup_spares_live_backend_and_foreign_and_frees_memory(triton):
    live = triton.client('live', byte_size=MIB)
    triton.leak('dead', byte_size=4 * MIB)
    triton.leak('gone', byte_size=4 * MIB, keep_file=False)  # dangling: file unlinked, memory still mapped
    assert 'gone' not in triton.shm_files() and 'gone' in triton.system_regions()
    other = foreign(triton)
    backend = triton.backend_files()
    used = triton.shm_usage()['used_bytes']
    first, second = steps(conn(triton, state='absent', stale=True), conn(triton, state='absent', stale=True))
    assert first['changed'] is True, first
    assert first['unregistered'] == ['dead', 'gone']
    assert first['removed_files'] == [os.path.join(triton.shm_dir, 'dead')]
    assert first['freed_bytes'] >= 4 * MIB
    assert sorted(triton.system_regions()) == ['live']
    assert 'live' in triton.shm_files() and live.alive
    assert os.path.exists(other) and triton.backend_files() == backend
    # both the stale file and the dangling region's memory are given back
    assert triton.shm_usage()['used_bytes'] <= used - 8 * MIB
    assert first['shm_used_bytes_before'] - first['shm_used_bytes_after'] >= 8 * MIB
    assert second['changed'] is False and second['unregistered'] == [] and second['removed_files'] == []


def test_inventory_is_what_queries_right_before_and_after_see(triton):
    """inventory returns the state this run selected from and the state after its change, as triton_shm_info reports them."""
    orphan = triton.write_file('client_old', MIB, fill=b'x')  # first: it ages while the clients start
    live = triton.client('live', byte_size=MIB)
    triton.leak('dead', byte_size=2 * MIB)
    triton.leak('gone', byte_size=MIB, keep_file=False)
    tritonrig.wait_older([orphan], AGED)
    orphans = dict(orphan_files=True, orphan_patterns=['client_*'], min_age=AGED)
    args = conn(triton, state='absent', stale=True, inventory=True, **orphans)
    first = run_module('tritonops.shm.triton_shm_info', conn(triton, orphan_patterns=['client_*'], min_age=AGED))
    checked = steps(args, check=True)[0]
    assert 'after' not in checked and checked['unregistered'] == ['dead', 'gone']
    assert (
        [(r['name'], r['state']) for r in checked['before']['system_regions']]
        == [(r['name'], r['state']) for r in first['system_regions']]
        == [('dead', 'stale'), ('gone', 'dangling'), ('live', 'healthy')]
    )
    assert checked['before']['summary'] == first['summary'] and checked['before']['summary']['orphan_files'] == 1
    acted, nothing = steps(args, args)
    assert acted['before']['summary'] == first['summary']
    assert acted['unregistered'] == ['dead', 'gone'] and not acted.get('failed'), acted
    after = acted['after']
    query = run_module('tritonops.shm.triton_shm_info', conn(triton, orphan_patterns=['client_*'], min_age=AGED))
    # the same picture a query right after gives: regions with their states, files, counts, usage
    assert [(r['name'], r['state']) for r in after['system_regions']] == [('live', 'healthy')]
    assert [(r['name'], r['state']) for r in query['system_regions']] == [('live', 'healthy')]
    assert [h['pid'] for h in after['system_regions'][0]['holders']] == [live.pid]
    assert sorted(f['name'] for f in after['files']) == sorted(f['name'] for f in query['files'])
    assert 'dead' not in [f['name'] for f in after['files']] and 'client_old' not in [f['name'] for f in after['files']]
    assert after['summary'] == query['summary']
    assert after['summary']['stale_regions'] == 0 and after['summary']['orphan_files'] == 0
    assert after['holders_complete'] is True and after['server']['pid'] == query['server']['pid']
    assert after['server']['located_by'] == query['server']['located_by']
    assert acted['shm_used_bytes_after'] == after['summary']['used_bytes']
    # nothing left to do: the state is still returned, unchanged
    assert nothing['changed'] is False and nothing['after']['summary'] == query['summary']


def test_threshold_percent_gates_orphans_but_not_stale_regions(triton):
    """Below threshold_percent a stale region and its file still go; the orphan file stays until the use reaches it."""
    orphan = triton.write_file('client_old', MIB)
    triton.leak('dead', byte_size=4 * MIB)
    tritonrig.wait_older([orphan], AGED)
    usage = triton.shm_usage()
    used = 100.0 * usage['used_bytes'] / usage['total_bytes']
    gate = round(used + 20.0, 1)  # 64 MiB: 20% is about 13 MiB above what is used now
    args = conn(
        triton,
        state='absent',
        stale=True,
        orphan_files=True,
        orphan_patterns=['client_*'],
        min_age=AGED,
        threshold_percent=gate,
    )
    below = one(args)
    assert below['changed'] is True and below['unregistered'] == ['dead'], below
    assert below['removed_files'] == [triton.shm_path('dead')] and os.path.exists(orphan)
    assert below['threshold']['percent'] == gate and below['threshold']['over'] is False
    assert below['threshold']['used_percent'] == pytest.approx(used, abs=0.5)
    assert 'kept below the threshold' in skipped(below, 'path')[orphan]
    foreign(triton, 'postgres_fill', size=24 * MIB)  # the use climbs past the gate
    over, again = steps(args, args)
    assert over['changed'] is True and over['removed_files'] == [orphan] and not os.path.exists(orphan), over
    assert over['threshold']['over'] is True and over['threshold']['used_percent'] >= gate
    assert again['changed'] is False and again['threshold']['over'] is True


def test_absent_check_mode_reports_exactly_what_the_real_run_does(triton):
    old = foreign(triton, 'client_input_old')
    triton.client('live', byte_size=MIB)
    triton.leak('dead', byte_size=2 * MIB)
    triton.leak('gone', byte_size=2 * MIB, keep_file=False)
    tritonrig.wait_older([old], AGED)
    before = snapshot(triton)
    args = conn(triton, state='absent', stale=True, orphan_files=True, orphan_patterns=['client_input_*'], min_age=AGED)
    (check,) = steps(args, check=True, diff=True)
    assert snapshot(triton) == before
    assert check['changed'] is True
    assert check['unregistered'] == ['dead', 'gone']
    assert sorted(check['removed_files']) == sorted(triton.shm_path(n) for n in ('client_input_old', 'dead'))
    assert check['shm_used_bytes_after'] == check['shm_used_bytes_before']
    assert [r['name'] for r in check['regions']] == ['live']
    assert [r['name'] for r in check['diff']['before']['regions']] == ['dead', 'gone', 'live']
    assert [r['name'] for r in check['diff']['after']['regions']] == ['live']
    assert sorted(check['diff']['before']['files']) == sorted(check['removed_files'])
    (real,) = steps(args, diff=True)
    assert real['unregistered'] == check['unregistered']
    assert sorted(real['removed_files']) == sorted(check['removed_files'])
    assert real['freed_bytes'] == check['freed_bytes']
    assert real['diff']['after']['regions'] == check['diff']['after']['regions']


def test_named_absent_is_changed_then_not_changed(triton):
    triton.leak('dead', byte_size=MIB)
    first, second, never = steps(
        conn(triton, state='absent', name='dead'),
        conn(triton, state='absent', name='dead'),
        conn(triton, state='absent', name=['never_registered']),
    )
    assert first['changed'] is True and first['unregistered'] == ['dead']
    assert first['removed_files'] == [triton.shm_path('dead')]
    assert 'dead' not in triton.system_regions() and 'dead' not in triton.shm_files()
    assert second['changed'] is False
    assert never['changed'] is False and not never.get('failed')


def test_named_absent_of_a_live_region_unregisters_but_keeps_the_held_file(triton):
    live = triton.client('live', byte_size=MIB)
    res = one(conn(triton, state='absent', name='live'))
    assert res['changed'] is True and res['unregistered'] == ['live'] and res['removed_files'] == []
    assert 'live' not in triton.system_regions()
    assert os.path.exists(triton.shm_path('live')) and live.alive
    assert skipped(res, 'path')[triton.shm_path('live')].startswith('held by %d' % live.pid)
    assert any("region 'live' is unregistered as asked" in w and 'is kept' in w for w in res.get('warnings', []))


def test_all_is_explicit_and_respects_exclude(triton):
    live = triton.client('live', byte_size=MIB)
    triton.client('warmup_0', byte_size=MIB)
    triton.leak('dead', byte_size=MIB)
    no_selector, only_exclude = steps(conn(triton, state='absent'), conn(triton, state='absent', exclude=['warmup_*']))
    for res in (no_selector, only_exclude):
        assert res.get('failed') and 'needs a selector' in res['msg'], res
    assert sorted(triton.system_regions()) == ['dead', 'live', 'warmup_0']
    first, second = steps(
        conn(triton, state='absent', all=True, exclude=['warmup_*']),
        conn(triton, state='absent', all=True, exclude=['warmup_*']),
    )
    assert first['changed'] is True and first['unregistered'] == ['dead', 'live']
    assert first['removed_files'] == [triton.shm_path('dead')]
    assert skipped(first, 'name') == {'warmup_0': 'excluded by pattern'}
    assert skipped(first, 'path')[triton.shm_path('live')].startswith('held by %d' % live.pid)
    assert sorted(triton.system_regions()) == ['warmup_0']
    assert os.path.exists(triton.shm_path('live')) and os.path.exists(triton.shm_path('warmup_0'))
    assert second['changed'] is False


def test_remove_file_false_then_orphan_cleanup(triton):
    triton.leak('dead', byte_size=MIB)
    kept, kept_again = steps(
        conn(triton, state='absent', stale=True, remove_file=False),
        conn(triton, state='absent', stale=True, remove_file=False),
    )
    assert kept['changed'] is True and kept['unregistered'] == ['dead'] and kept['removed_files'] == []
    assert 'dead' in triton.shm_files() and 'dead' not in triton.system_regions()
    assert kept_again['changed'] is False
    # now an unregistered, unheld file: an orphan once it matches a pattern and is old enough
    young, first, second = steps(
        conn(triton, state='absent', orphan_files=True, orphan_patterns=['dead'], min_age=3600),
        conn(triton, state='absent', orphan_files=True, orphan_patterns=['dead'], min_age=0),
        conn(triton, state='absent', orphan_files=True, orphan_patterns=['dead'], min_age=0),
    )
    assert young['changed'] is False
    assert first['changed'] is True and first['removed_files'] == [triton.shm_path('dead')]
    assert 'dead' not in triton.shm_files()
    assert second['changed'] is False


def test_bulk_many_regions_in_one_call(triton):
    names = triton.leak_many('bulk', 300)
    live = triton.client('live', byte_size=MIB)
    assert set(names) <= set(triton.system_regions())
    used = triton.shm_usage()['used_bytes']
    first, second = steps(conn(triton, state='absent', stale=True), conn(triton, state='absent', stale=True))
    assert first['changed'] is True
    assert sorted(first['unregistered']) == sorted(names)
    assert sorted(first['removed_files']) == sorted(triton.shm_path(n) for n in names)
    assert sorted(triton.system_regions()) == ['live'] and live.alive
    assert not [f for f in triton.shm_files() if f.startswith('bulk_')]
    assert triton.shm_usage()['used_bytes'] <= used - 300 * 4096
    assert second['changed'] is False


# -- safety invariants ----------------------------------------------------------------------------


def test_orphan_patterns_never_take_backend_foreign_young_held_or_odd_files(triton):
    backend = triton.backend_files()  # Triton's own, whatever their age (its stubs hold them)
    old = foreign(triton, 'client_input_old')
    os.mkfifo(triton.shm_path('old_fifo'))
    os.mkdir(triton.shm_path('old_dir'))
    holder = triton.client('client_input_held', byte_size=MIB, register=False)  # held: in use, whatever its age
    triton.client('registered', byte_size=MIB)
    tritonrig.wait_older([old, triton.shm_path('old_fifo'), triton.shm_path('old_dir')], AGED)
    young = tritonrig.keep_young(foreign(triton, 'client_input_young'))
    first, second = steps(
        conn(triton, state='absent', orphan_files=True, orphan_patterns=['*'], min_age=AGED),
        conn(triton, state='absent', orphan_files=True, orphan_patterns=['*'], min_age=AGED),
    )
    assert first['changed'] is True and first['removed_files'] == [old], first
    assert first['unregistered'] == []
    assert triton.backend_files() == backend
    assert os.path.exists(young) and holder.alive and os.path.exists(triton.shm_path('client_input_held'))
    assert stat.S_ISFIFO(os.lstat(triton.shm_path('old_fifo')).st_mode) and os.path.isdir(triton.shm_path('old_dir'))
    assert 'registered' in triton.shm_files() and 'registered' in triton.system_regions()
    assert second['changed'] is False


def test_a_symlinked_backing_file_is_never_followed(triton, tmp_path):
    target = tmp_path / 'precious'
    target.write_bytes(b'p' * 8192)
    mtime = target.stat().st_mtime_ns
    triton.leak('victim', byte_size=MIB)
    os.unlink(triton.shm_path('victim'))
    os.symlink(str(target), triton.shm_path('victim'))
    stale, named, again = steps(
        conn(triton, state='absent', stale=True),
        conn(triton, state='absent', name='victim'),
        conn(triton, state='absent', all=True, orphan_files=True, orphan_patterns=['*'], min_age=0),
    )
    assert stale['changed'] is False and [r['name'] for r in stale['regions']] == ['victim']  # unknown: not stale
    assert named['changed'] is True and named['unregistered'] == ['victim'] and named['removed_files'] == []
    assert 'not a regular file' in skipped(named, 'path')[triton.shm_path('victim')]
    assert again['removed_files'] == []
    assert os.path.islink(triton.shm_path('victim'))
    assert target.read_bytes() == b'p' * 8192 and target.stat().st_mtime_ns == mtime


def test_present_errors_say_why_and_touch_nothing(triton, tmp_path):
    triton.client('small', byte_size=MIB, register=False)
    outside = tmp_path / 'outside'
    outside.write_bytes(b'o' * MIB)
    os.symlink(str(outside), triton.shm_path('link'))
    os.mkfifo(triton.shm_path('fifo'))
    foreign(triton)
    refused = 'http://127.0.0.1:%d' % tritonrig.free_port()
    handle = base64.b64encode(b'\0' * 64).decode()
    cases = [
        (dict(key='/../etc/passwd', byte_size=4096, create_file=True), 'exactly one path component'),
        (dict(key='/a/b', byte_size=4096, create_file=True), 'exactly one path component'),
        (dict(key='no_slash', byte_size=4096, create_file=True), 'must start with "/"'),
        (dict(key='/..', byte_size=4096, create_file=True), 'outside the shm directory'),
        (dict(key='/link', byte_size=4096), 'is a symlink, not a regular file'),
        (dict(key='/fifo', byte_size=4096), 'is a fifo, not a regular file'),
        (dict(key='/small', byte_size=0), 'byte_size must be a positive'),
        (dict(key='/small', byte_size=-1), 'byte_size must be a positive'),
        (dict(key='/small', byte_size=MIB, offset=1), 'past the end of'),
        (dict(key='/missing', byte_size=4096), 'does not exist'),
        (dict(kind='cuda', raw_handle=handle, device_id=0, byte_size=4096), 'failed to register shared memory region'),
        (dict(key='/small', byte_size=4096, name=['bad', 'bad2']), 'one region per task'),
        (dict(key='/small', byte_size=4096, url=refused), 'cannot connect to Triton'),
    ]
    before = snapshot(triton)
    results = steps(*[dict(conn(triton, name='bad'), **args) for args, _why in cases])
    for (args, why), res in zip(cases, results):
        assert res.get('failed') is True, (args, res)
        assert why in res['msg'], (args, res['msg'])
        assert res['changed'] is False and res.get('registered', []) == []
    cuda = results[[args.get('kind') for args, _why in cases].index('cuda')]
    assert cuda['msg'].startswith("register cuda region 'bad' at http://127.0.0.1:")
    assert cuda['failure']['server_error'] == 'failed to register shared memory region: invalid args'
    assert refused in results[-1]['msg']
    assert snapshot(triton) == before
    assert outside.read_bytes() == b'o' * MIB


def test_real_in_use_text_is_recognised_and_retried(make_triton):
    """Each of the client's requests holds its region SLOW_SECONDS (the 'slow' model), with as long idle between them:
    the server refuses the unregister while a request is in flight, and the module retries until it lands idle."""
    triton = make_triton(shm_size='64m', models=('slow',))
    if tuple(int(p) for p in triton.version().split('.')[:2]) < (2, 50):
        pytest.skip(
            tritonrig.NOT_ON_THIS_VERSION + 'Triton %s has no "in use" refusal: unregistering a busy region can crash '
            'it (server#3207; 2.48 did in this test)' % triton.version()
        )
    if COLLECTIONS_PATH not in sys.path:
        sys.path.insert(0, COLLECTIONS_PATH)
    from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
    from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient

    busy = triton.client('busy', byte_size=64 * 1024, mode='infer', model='slow', pause=tritonrig.SLOW_SECONDS)
    api = TritonClient(triton.url)
    seen = None
    tries = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tries += 1
        try:
            api.unregister('system', 'busy')
        except TritonError as exc:
            seen = exc
            break
        api.register(
            'system', 'busy', dict(key='/busy', offset=0, byte_size=64 * 1024)
        )  # it was idle this time: put it back
        time.sleep(0.01)
    assert seen is not None, 'the server never reported the busy region in use (%d tries in 60 s)' % tries
    assert seen.in_use, seen.server_error
    assert seen.server_error == "Cannot unregister shared memory region 'busy', it is currently in use."
    res = one(conn(triton, state='absent', name='busy', in_use_timeout=30))
    assert res['changed'] is True and res['unregistered'] == ['busy']
    assert 'busy' not in triton.system_regions()
    assert os.path.exists(triton.shm_path('busy')) and busy.alive  # held: kept
    print('FIGURE in_use: refused after %d unregister tries' % tries)
    busy.stop()
    triton.kill()  # a server whose busy region was pulled from under a client can take long to stop


def _server_maps(server, prefix):
    with open('/proc/%d/maps' % server.pid, 'rb') as f:
        return f.read().count(b'/dev/shm/' + prefix.encode())


def _stop_part_way(triton, prefix, args):
    """Run the module on 1000 stale regions and SIGSTOP the server once the first of them is unregistered.

    (result, stopped, names). Under load the watcher can notice too late, when the module has already had every
    answer: the result is then a success, and the caller tries again with fresh regions.
    """
    names = triton.leak_many(prefix, 1000)
    result = {}
    worker = threading.Thread(target=lambda: result.update(one(args)))
    worker.start()
    stopped = False
    try:
        while worker.is_alive():
            if _server_maps(triton, prefix + '_') < len(names):  # the module is unregistering: the server goes away
                os.kill(triton.pid, signal.SIGSTOP)
                stopped = True
                break
            time.sleep(0.001)
        worker.join(timeout=120)
    finally:
        if stopped:
            os.kill(triton.pid, signal.SIGCONT)
    return result, stopped, names


def test_a_failure_part_way_reports_what_was_done_and_a_rerun_converges(triton):
    args = conn(triton, state='absent', stale=True, timeout=2)
    tries = []
    for attempt in range(3):
        prefix = 'part%d' % attempt
        result, stopped, names = _stop_part_way(triton, prefix, args)
        tries.append((stopped, result.get('failed'), len(result.get('unregistered') or ())))
        if stopped and result.get('failed'):
            break
        # the stop came after the last answer: a plain success, which must have cleaned everything
        assert not result.get('failed') and sorted(result['unregistered']) == sorted(names), result
    assert stopped and result.get('failed') is True, 'never stopped part-way in 3 tries: %s' % tries
    assert 'no answer within 2.0s' in result['msg']
    done = result['unregistered']
    assert 0 < len(done) < len(names)
    regions = triton.system_regions()
    assert not set(done) & set(regions)
    # the files of the regions confirmed unregistered are removed even though the task failed
    assert sorted(result['removed_files']) == sorted(triton.shm_path(n) for n in done)
    rerun, settled = steps(args, args)
    assert rerun['changed'] is True and not rerun.get('failed')
    assert not [n for n in triton.system_regions() if n.startswith(prefix + '_')]
    # at most the one region whose answer was lost when the server stopped leaves an unregistered file
    left = [f for f in triton.shm_files() if f.startswith(prefix + '_')]
    assert len(left) <= 1
    assert settled['changed'] is False


def test_a_restarted_server_leaves_orphans_that_patterns_clean(tmp_path):
    ns = tritonrig.ShmNamespace(shm_size='64m').start()
    servers = []
    try:
        first = tritonrig.TritonServer(workdir=str(tmp_path), namespace=ns, name='first')
        servers.append(first)
        first.start()
        leaked = first.leak_many('client_input', 3, byte_size=MIB)
        first.kill()  # a crash: nothing unregistered, the files stay
        second = tritonrig.TritonServer(workdir=str(tmp_path), namespace=ns, name='second')
        servers.append(second)
        second.start()
        assert second.system_regions() == {}
        backend = second.backend_files()
        assert backend
        assert set(leaked) <= set(second.shm_files())
        stale, orphans, again = steps(
            conn(second, state='absent', stale=True),
            conn(
                second,
                state='absent',
                stale=True,
                orphan_files=True,
                orphan_patterns=['client_input_*', BACKEND + '*'],
                min_age=0,
            ),
            conn(
                second,
                state='absent',
                stale=True,
                orphan_files=True,
                orphan_patterns=['client_input_*', BACKEND + '*'],
                min_age=0,
            ),
        )
        assert stale['changed'] is False
        assert orphans['changed'] is True
        assert sorted(orphans['removed_files']) == sorted(second.shm_path(n) for n in leaked)
        assert second.backend_files() == backend  # Triton's own files: never removed, whatever the patterns
        assert again['changed'] is False
    finally:
        for server in servers:
            server.stop()
        ns.stop()


def test_families_opt_in_removes_a_dead_processs_files_of_those_families_only(triton):
    """Issue 42, goal 2: families: [nccl] removes the NCCL files no process holds (older than min_age), under the orphan
    rules; a held NCCL file, a vLLM file and a file of no family stay. Check mode tells exactly that and touches nothing."""
    for name in ('nccl-dead01', 'nccl-live01', 'vllm_offload_0.mmap', 'mystery.bin'):
        triton.write_file(name, MIB)
    holder = subprocess.Popen(
        [sys.executable, '-c', 'import mmap,os,sys,time\nfd=os.open(sys.argv[1],os.O_RDWR)\nm=mmap.mmap(fd,0)\n'
         "print('READY',flush=True)\ntime.sleep(600)", triton.shm_path('nccl-live01')],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == 'READY'
        before = snapshot(triton)
        args = conn(triton, state='absent', families=['nccl'], min_age=0)
        check, real, again = one(args, check=True), one(args), one(args)
        assert snapshot(triton)[1].keys() - {'nccl-dead01'} == before[1].keys() - {'nccl-dead01'}
        for res in (check, real):
            assert [os.path.basename(p) for p in res['removed_files']] == ['nccl-dead01'], res
            kept = skipped(res, 'path')
            assert 'held by' in kept[triton.shm_path('nccl-live01')], kept
        assert 'nccl-dead01' not in triton.shm_files() and again['changed'] is False
        assert {'nccl-live01', 'vllm_offload_0.mmap', 'mystery.bin'} <= set(triton.shm_files())
        refused = one(conn(triton, state='absent', families=['ncl']))
        assert refused.get('failed') and 'no family' in refused['msg'], refused
    finally:
        holder.kill()
        holder.wait()
