"""The cleanup playbook and the shm_cleanup role on a real fleet.

Three real tritonservers on 127.0.1.1-3, each its own inventory host with a
private /dev/shm; real tritonclient processes leak regions (SIGKILLed), others
stay alive; one server is stopped (the down host).
"""

from __future__ import annotations

import json
import os

import pytest
import tritonrig
from ansible_helpers import PYTHON, ansible_playbook

MiB = 1 << 20
REREGISTER = [{'name': 'warm', 'key': '/warm', 'byte_size': 1 * MiB}]
ORPHANS = ['client_*']
AGED = 2.0  # seconds: the cleanups' min_age (shm_cleanup_min_age)
SUMMARY_TASK = "Show the fleet's cleanup"


def inventory(servers, **host_vars):
    hosts = {}
    for server in servers:
        hosts[server.name] = dict(
            ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=server.url, **host_vars
        )
    return {'all': {'children': {'triton': {'hosts': hosts}}}}


def cleanup(servers, check=False, **extra):
    extra.setdefault('prometheus_textfile_dir', '')
    return ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inventory(servers),
        extra_vars=extra,
        check=check,
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )


def state(server):
    """What a user would look at: registered regions and the files in /dev/shm, with sizes."""
    files = {}
    for name in server.shm_files():
        st = os.lstat(os.path.join(server.shm_dir, name))
        files[name] = st.st_size
    return {'regions': server.system_regions(), 'files': files, 'used': server.shm_usage()['used_bytes']}


def host_result(res, host):
    """The host's outcome as AWX sees it: the set_stats artifact tritonops_shm_cleanup.HOST."""
    return res.data['global_custom_stats']['tritonops_shm_cleanup'][host]


@pytest.fixture
def fleet(tmp_path):
    f = tritonrig.Fleet(3, workdir=str(tmp_path), shm_size='64m')
    try:
        f.start()
        yield f
    finally:
        f.stop()


def leak_everything(server, infer=False):
    """Live clients (optionally one running inferences), stale and dangling leaks, old and young orphans, a foreign file.

    The old files are written first and waited for at the end (tritonrig.wait_older: older than AGED); the young one is
    dated ahead (tritonrig.keep_young), so it stays young through every run of the test.
    """
    old = [server.write_file('client_old', 3 * MiB), server.write_file('other_app.dat', 1 * MiB)]
    live = [server.client('live_hold', byte_size=2 * MiB)]
    # an inferring client saturates a core: one in the fleet is enough
    live.append(server.client('live_infer', byte_size=64 * 1024, mode='infer' if infer else 'hold'))
    server.leak('dead_a', byte_size=8 * MiB)
    server.leak('dead_b', byte_size=4 * MiB)
    server.leak('dangling', byte_size=2 * MiB, keep_file=False)
    tritonrig.keep_young(server.write_file('client_young', 1 * MiB))
    tritonrig.wait_older(old, AGED)
    return live


def test_cleanup_fleet_with_a_down_host(fleet, tmp_path):
    h1, h2, h3 = fleet.servers
    live = leak_everything(h1, infer=True) + leak_everything(h2)
    h3.stop()
    backend = {s.name: s.backend_files() for s in (h1, h2)}
    assert all(backend.values())
    report_dir = str(tmp_path / 'report')
    args = dict(
        shm_cleanup_orphan_patterns=ORPHANS,
        shm_cleanup_min_age=AGED,
        shm_cleanup_reregister=REREGISTER,
        shm_cleanup_report_dir=report_dir,
    )

    # --- check mode: the whole role runs, says what it would do, touches nothing ---------
    before = {s.name: state(s) for s in (h1, h2)}
    res = cleanup(fleet.servers, check=True, **args)
    assert res.stats['triton3']['failures'] == 1, res
    for s in (h1, h2):
        assert res.stats[s.name]['failures'] == 0, res
        assert state(s) == before[s.name]
        r = host_result(res, s.name)
        assert r['check_mode'] is True and r['status'] == 'ok'
        assert sorted(r['done']['unregistered']) == ['dangling', 'dead_a', 'dead_b']
        assert sorted(os.path.basename(p) for p in r['done']['removed_files']) == ['client_old', 'dead_a', 'dead_b']
        assert r['done']['registered'] == ['warm']
    with open(os.path.join(report_dir, 'triton1.json')) as f:
        assert json.load(f)['check_mode'] is True

    # --- the real run ------------------------------------------------------------------------
    res = cleanup(fleet.servers, **args)
    assert res.rc != 0  # the down host fails the run ...
    assert res.stats['triton3']['failures'] == 1
    for s in (h1, h2):  # ... and never stops the others
        assert res.stats[s.name]['failures'] == 0, res
        regions = s.system_regions()
        files = s.shm_files()
        # stale and dangling regions and the old orphan are gone
        assert not {'dead_a', 'dead_b', 'dangling'} & set(regions)
        assert not {'dead_a', 'dead_b', 'client_old'} & set(files)
        # live clients' regions and files are intact
        for name in ('live_hold', 'live_infer') + (('live_infer_out',) if s is h1 else ()):
            assert name in regions and name in files
        # python backend, foreign and young files are intact
        assert set(backend[s.name]) <= set(files)
        assert {'other_app.dat', 'client_young'} <= set(files)
        # the re-registered region is present with its clean file
        assert regions['warm']['byte_size'] == 1 * MiB and 'warm' in files
        assert s.shm_usage()['used_bytes'] <= before[s.name]['used'] - 14 * MiB
        r = host_result(res, s.name)
        assert r['status'] == 'ok' and r['changed'] is True
        assert r['before']['stale_regions'] == 2 and r['before']['dangling_regions'] == 1
        assert r['after']['dangling_regions'] == 0
        assert r['after']['used_bytes'] < r['before']['used_bytes']
    assert all(c.alive for c in live)
    for c in live:
        assert not [line for line in c.lines if line.startswith(('ERROR', 'MISMATCH'))], c.lines[-5:]

    # the down host is shown failed with the reason, in the table and in the artifacts
    lines = res.task(SUMMARY_TASK)['msg']
    down = [line for line in lines if line.startswith('triton3 ')]
    assert down and 'FAILED' in down[0] and 'cannot connect' in down[0], lines
    assert [line for line in lines if line.startswith('triton1 ')][0].split()[1] == 'ok*'
    stats = res.data['global_custom_stats']['tritonops_shm_cleanup']
    assert set(stats) == {'triton1', 'triton2', 'triton3'}
    assert stats['triton3']['status'] == 'failed' and 'cannot connect' in stats['triton3']['error']['msg']
    assert sorted(stats['triton2']['done']['unregistered']) == ['dangling', 'dead_a', 'dead_b']

    # report files on the controller: one JSON per host, the fleet summary and the fleet's HTML page
    assert sorted(os.listdir(report_dir)) == [
        'report.html',
        'summary.md',
        'triton1.json',
        'triton2.json',
        'triton3.json',
    ]
    with open(os.path.join(report_dir, 'report.html')) as f:
        page = f.read()
    assert 'triton3' in page and 'cannot connect' in page
    with open(os.path.join(report_dir, 'triton1.json')) as f:
        j1 = json.load(f)
    assert j1['check_mode'] is False and sorted(j1['done']['unregistered']) == ['dangling', 'dead_a', 'dead_b']
    with open(os.path.join(report_dir, 'triton3.json')) as f:
        assert json.load(f)['status'] == 'failed'
    with open(os.path.join(report_dir, 'summary.md')) as f:
        md = f.read()
    assert '| triton3 | failed |' in md and 'cannot connect' in md
    assert '| triton1 | ok (changed) |' in md and 'Unregistered: dangling, dead_a, dead_b' in md

    # --- a second run converges: changed=0, the re-registered region is not "stale" ---------
    after = {s.name: state(s) for s in (h1, h2)}
    del args['shm_cleanup_report_dir']
    res = cleanup(fleet.servers, **args)
    for s in (h1, h2):
        assert res.stats[s.name]['failures'] == 0, res
        assert res.stats[s.name]['changed'] == 0, res.stats
        r = host_result(res, s.name)
        assert r['changed'] is False
        assert {'name': 'warm', 'reason': 'kept: desired state (shm_cleanup_reregister)'} in r['skipped']
        assert state(s)['regions'] == after[s.name]['regions']
        assert set(state(s)['files']) == set(after[s.name]['files'])


def test_threshold_above_use_changes_nothing(make_triton, tmp_path):
    server = make_triton(models=())
    old = server.write_file('client_old', 2 * MiB)
    live = server.client('live', byte_size=1 * MiB)
    server.leak('excluded_dead', byte_size=1 * MiB)
    tritonrig.wait_older([old], AGED)
    before = state(server)
    args = dict(
        shm_cleanup_orphan_patterns=ORPHANS,
        shm_cleanup_min_age=AGED,
        shm_cleanup_reregister=REREGISTER,
        shm_cleanup_exclude=['excluded_*'],
    )

    # about 6% used, threshold 50%: the only stale region is excluded, so nothing is done
    res = cleanup([server], shm_cleanup_threshold_percent=50, **args)
    assert res.rc == 0, res
    assert res.stats['triton1']['changed'] == 0
    assert state(server) == before
    r = host_result(res, 'triton1')
    assert r['acted'] is False and 'below the threshold 50' in r['decision']
    assert r['after'] == r['before']

    # threshold at or below the use: orphans go, the region is re-registered, the excluded one stays
    res = cleanup([server], shm_cleanup_threshold_percent=1, **args)
    assert res.rc == 0, res
    r = host_result(res, 'triton1')
    assert r['acted'] is True and r['changed'] is True
    assert [os.path.basename(p) for p in r['done']['removed_files']] == ['client_old']
    assert {'name': 'excluded_dead', 'reason': 'excluded by pattern'} in r['skipped']
    regions = server.system_regions()
    assert {'live', 'excluded_dead', 'warm'} == set(regions)
    assert 'client_old' not in server.shm_files() and 'live' in server.shm_files()
    assert live.alive


def test_mode_names_and_serial_batches_isolate_a_down_host(fleet):
    h1, h2, h3 = fleet.servers
    for s in (h1, h3):
        s.leak('gone', byte_size=1 * MiB)
        s.leak('stays', byte_size=1 * MiB)
    h2.stop()
    res = cleanup(fleet.servers, cleanup_serial=2, shm_cleanup_mode='names', shm_cleanup_names='gone')
    assert res.stats['triton2']['failures'] == 1, res
    # every mode queries and acts in one region module call: the down host's record names it and why it failed
    down = host_result(res, 'triton2')
    assert down['status'] == 'failed', down
    assert down['error']['step'] == 'Query, unregister stale regions and remove their files and orphan files', down
    assert 'cannot connect' in down['error']['msg'], down
    for s in (h1, h3):  # h3 runs in the second batch although h2 failed in the first
        assert res.stats[s.name]['failures'] == 0, res
        assert set(s.system_regions()) == {'stays'}
        assert 'gone' not in s.shm_files() and 'stays' in s.shm_files()
        r = host_result(res, s.name)
        assert {'name': 'stays', 'reason': 'not selected (shm_cleanup_mode=names)'} in r['skipped']


# uid 0 with every capability dropped: the kernel refuses it other processes' maps and fds, as it refuses a non-root user
UNPRIVILEGED = ('setpriv', '--bounding-set=-all', '--inh-caps=-all')


def test_without_root_the_run_says_so_and_removes_nothing(make_triton):
    """-e triton_become=false without privileges: never a silent "nothing to clean" (issue 29).

    Decided: it reports clearly rather than failing. Nothing is stale where the holders cannot all be seen, so the
    report's row and the cleanup's record are not ok (incomplete, or unlocated when the server's /dev/shm cannot be
    reached) with the reason, which names root; the leak stays, nothing changes.
    """
    server = make_triton(models=())
    server.leak('dead', byte_size=MiB)
    before = state(server)
    inv = inventory([server])
    res = ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inv,
        prefix=UNPRIVILEGED,
        extra_vars={'triton_become': False, 'prometheus_textfile_dir': ''},
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )
    r = host_result(res, 'triton1')
    assert r['status'] in ('incomplete', 'failed') and r['changed'] is False, r
    why = r['server']['holders_incomplete_reason'] if r['status'] == 'incomplete' else r['error']['msg']
    assert 'root' in why, r
    assert res.stats['triton1']['changed'] == 0 and state(server) == before
    res = ansible_playbook(
        'tritonops.shm.report',
        inventory=inv,
        prefix=UNPRIVILEGED,
        extra_vars={'triton_become': False, 'prometheus_textfile_dir': ''},
    )
    [line] = [line for line in res.task("Show the fleet's shared memory")['msg'] if line.startswith('triton1 ')]
    assert line.split()[1] in ('incomplete', 'UNLOCATED'), res.task("Show the fleet's shared memory")['msg']
