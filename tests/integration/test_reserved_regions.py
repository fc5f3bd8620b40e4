"""Regions this collection registers are the operator's (reserved), in every later run.

Real tritonserver, real tritonclient processes (live ones, SIGKILLed ones), real
ansible-playbook runs of the modules and of the cleanup playbook. What is checked is
what a user sees: the server's regions, the files in its /dev/shm, the module results,
the play recap and the report files.
"""

from __future__ import annotations

import json
import os

import proxy_helpers
from ansible_helpers import PYTHON, ansible_playbook, run_module
from test_shm_cleanup import cleanup, host_result, inventory

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20
MARK = 'trusted.tritonops_shm.reserved'


def regions_by_name(info):
    return dict((r['name'], r) for r in info['system_regions'])


def test_a_registered_region_is_reserved_survives_stale_cleanup_and_goes_only_when_asked(triton):
    live = triton.client('live', byte_size=MIB)
    triton.leak('dead', byte_size=2 * MIB)
    conn = dict(url=triton.url)
    reg = run_module(REGION, dict(conn, name='warm', key='/warm', byte_size=MIB, create_file=True))
    assert reg['changed'] is True and reg['registered'] == ['warm'] and not reg.get('failed'), reg
    assert reg['marked_files'] == [triton.shm_path('warm')]
    # the mark is on the file itself, where any later run (of any playbook) finds it
    assert os.getxattr(triton.shm_path('warm'), MARK) == b'warm'
    again = run_module(REGION, dict(conn, name='warm', key='/warm', byte_size=MIB, create_file=True))
    assert again['changed'] is False and again['marked_files'] == []

    info = run_module(INFO, conn)
    regions = regions_by_name(info)
    assert regions['warm']['state'] == 'reserved' and regions['warm']['reserved'] is True
    assert regions['warm']['reclaimable'] is False
    assert regions['dead']['state'] == 'stale' and regions['dead']['reserved'] is False
    assert regions['live']['state'] == 'healthy' and regions['live']['reserved'] is False
    assert info['summary']['reserved_regions'] == 1 and info['summary']['stale_regions'] == 1

    # a bare stale cleanup (no playbook variables about warm at all) takes the dead region only
    stale = run_module(REGION, dict(conn, state='absent', stale=True))
    assert stale['unregistered'] == ['dead'] and not stale.get('failed'), stale
    assert set(triton.system_regions()) == {'live', 'warm'}
    assert 'warm' in triton.shm_files()

    # a client maps it: healthy (still the operator's); the client dies with its group: reserved again
    user = triton.client('warm_user', key='/warm', byte_size=MIB, register=False)
    regions = regions_by_name(run_module(INFO, conn))
    assert regions['warm']['state'] == 'healthy' and regions['warm']['reserved'] is True
    assert [h['pid'] for h in regions['warm']['holders']] == [user.pid]
    user.kill(keep_file=True)
    regions = regions_by_name(run_module(INFO, conn))
    assert regions['warm']['state'] == 'reserved'
    assert run_module(REGION, dict(conn, state='absent', stale=True))['changed'] is False
    assert 'warm' in triton.system_regions()

    # only the explicit selector (or a name, or all) removes it: check mode first, then for real
    before = (triton.system_regions(), triton.shm_files())
    dry = run_module(REGION, dict(conn, state='absent', reserved=True), check=True)
    assert (
        dry['changed'] is True and dry['unregistered'] == ['warm'] and dry['removed_files'] == [triton.shm_path('warm')]
    )
    assert (triton.system_regions(), triton.shm_files()) == before
    gone = run_module(REGION, dict(conn, state='absent', reserved=True))
    assert gone['unregistered'] == ['warm'] and gone['removed_files'] == [triton.shm_path('warm')]
    assert set(triton.system_regions()) == {'live'} and 'warm' not in triton.shm_files()
    assert live.alive


def test_named_and_all_unregisters_take_reserved_regions(triton):
    conn = dict(url=triton.url)
    for name in ('r1', 'r2'):
        assert (
            run_module(REGION, dict(conn, name=name, key='/' + name, byte_size=MIB, create_file=True))['changed']
            is True
        )
    named = run_module(REGION, dict(conn, state='absent', name='r1'))
    assert named['unregistered'] == ['r1'] and 'r1' not in triton.shm_files()
    every = run_module(REGION, dict(conn, state='absent', all=True))
    assert every['unregistered'] == ['r2'] and triton.system_regions() == {}


def test_a_region_registered_before_the_mark_existed_gets_it_on_the_next_present(triton):
    # registered by hand (as by an older version of this collection): stale, no mark
    triton.write_file('old_warm', MIB)
    triton.api(
        '/v2/systemsharedmemory/region/old_warm/register',
        method='POST',
        body={'key': '/old_warm', 'offset': 0, 'byte_size': MIB},
    )
    conn = dict(url=triton.url)
    assert regions_by_name(run_module(INFO, conn))['old_warm']['state'] == 'stale'
    args = dict(conn, name='old_warm', key='/old_warm', byte_size=MIB)
    dry = run_module(REGION, args, check=True)
    assert dry['changed'] is True and dry['registered'] == [] and dry['marked_files'] == [triton.shm_path('old_warm')]
    assert regions_by_name(run_module(INFO, conn))['old_warm']['state'] == 'stale'
    first = run_module(REGION, args)
    second = run_module(REGION, args)
    assert (
        first['changed'] is True
        and first['registered'] == []
        and first['marked_files'] == [triton.shm_path('old_warm')]
    )
    assert second['changed'] is False
    assert regions_by_name(run_module(INFO, conn))['old_warm']['state'] == 'reserved'


def test_cleanup_rerun_with_reports_is_unchanged_and_the_rebuilt_region_survives_a_bare_stale_cleanup(
    make_triton, tmp_path
):
    servers = [make_triton(models=(), host='127.0.1.%d' % (i + 1), name='triton%d' % (i + 1)) for i in range(2)]
    for s in servers:
        s.leak('dead', byte_size=MIB)
    report_dir = str(tmp_path / 'report')
    args = dict(
        shm_cleanup_reregister=[{'name': 'warm', 'key': '/warm', 'byte_size': MIB}],
        shm_cleanup_report_dir=report_dir,
        prometheus_textfile_dir=str(tmp_path / 'prom'),
    )
    os.makedirs(str(tmp_path / 'prom'))
    first = cleanup(servers, **args)
    assert first.rc == 0, first
    for s in servers:
        assert first.stats[s.name]['changed'] > 0
        assert host_result(first, s.name)['changed'] is True
        assert set(s.system_regions()) == {'warm'}
    with open(os.path.join(report_dir, 'triton1.json')) as f:
        assert json.load(f)['done']['unregistered'] == ['dead']

    # the same job again, reports and metrics on: nothing on any Triton host changes, so nothing is "changed"
    second = cleanup(servers, **args)
    assert second.rc == 0, second
    for s in servers:
        assert second.stats[s.name]['changed'] == 0, second.stats
        assert host_result(second, s.name)['changed'] is False
        assert host_result(second, s.name)['before']['reserved_regions'] == 1
    assert second.stats['localhost']['changed'] == 0, second.stats
    # ... while the outputs are still written: the report is this run's
    with open(os.path.join(report_dir, 'triton1.json')) as f:
        assert json.load(f)['done']['unregistered'] == []
    # two servers on one machine, one textfile directory: each keeps its own file and series
    prom_files = sorted(os.listdir(str(tmp_path / 'prom')))
    assert [f.split('.')[:2] for f in prom_files] == [['tritonops_shm_cleanup', s.name] for s in servers], prom_files
    for s, name in zip(servers, prom_files):
        with open(os.path.join(str(tmp_path / 'prom'), name)) as f:
            assert f'tritonops_shm_cleanup_last_success{{host="{s.name}",triton_url="{s.url}"}} 1\n' in f.read()

    # the region the role rebuilt is the operator's: a bare module run with stale=true leaves it
    for s in servers:
        info = run_module(INFO, dict(url=s.url))
        assert regions_by_name(info)['warm']['state'] == 'reserved'
        res = run_module(REGION, dict(url=s.url, state='absent', stale=True))
        assert res['changed'] is False and 'warm' in s.system_regions() and 'warm' in s.shm_files()


def test_verify_fails_when_a_client_leaks_a_cleaned_region_again_during_the_run(make_triton, tmp_path):
    """The role's verify step with a real trigger: between the unregister and the state the region module reads
    after its change, a real client registers the just-cleaned name on its own file and dies with its process group.

    The order is made certain, not left to timing: triton1 is reached through a forwarding proxy that, for the
    unregister of 'dead', sends it to Triton itself, lets the client re-register the name and die, and only then
    answers the module.
    """
    server = make_triton(models=(), host='127.0.1.1', name='triton1')
    calm = make_triton(models=(), host='127.0.1.2', name='triton2')  # a host where nothing happens meanwhile
    for s in (server, calm):
        s.leak('dead', byte_size=MIB)
    releaker = server.client('releak', key='/releak', byte_size=MIB, register=False, register_when_gone='dead')

    def releak_during_unregister(method, path, _headers):
        if method != 'POST' or path != '/v2/systemsharedmemory/region/dead/unregister':
            return None
        server.api(path, 'POST')  # the real unregister ...
        releaker.proc.wait(timeout=30)  # ... the client re-registers 'dead' on /releak and dies ...
        return 200, 'application/json', b''  # ... and only then the module gets its answer

    report_dir = str(tmp_path / 'report')
    with proxy_helpers.ForwardingProxy(server.url, fault=releak_during_unregister) as proxy:
        inv = inventory([server, calm])
        inv['all']['children']['triton']['hosts']['triton1'].update(
            triton_url=proxy.url(), triton_server_pid=server.pid
        )
        res = ansible_playbook(
            'tritonops.shm.cleanup',
            inventory=inv,
            env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
            extra_vars=dict(prometheus_textfile_dir='', shm_cleanup_report_dir=report_dir),
        )
    assert 'REGISTERED' in releaker.lines, releaker.lines
    # what the user sees: the host failed at the verify step, with the region named ...
    assert res.rc != 0 and res.stats['triton1']['failures'] == 1, res
    r = host_result(res, 'triton1')
    assert r['status'] == 'failed'
    assert r['error']['step'] == 'Verify no stale region remains that was not skipped for a stated reason'
    assert 'stale region(s) remain after cleanup' in r['error']['msg'] and 'dead' in r['error']['msg']
    # ... with the work that was done reported, in the artifacts, the table and the report file
    assert r['done']['unregistered'] == ['dead'] and r['changed'] is True
    assert res.stats['triton2']['failures'] == 0 and host_result(res, 'triton2')['status'] == 'ok'
    line = [line for line in res.task("Show the fleet's cleanup")['msg'] if line.startswith('triton1 ')][0]
    assert 'FAILED at Verify' in line and 'dead' in line
    with open(os.path.join(report_dir, 'triton1.json')) as f:
        assert json.load(f)['status'] == 'failed'
    # the server has the re-leaked region (on the client's file); the next run cleans it and is ok
    assert server.system_regions()['dead']['key'] == '/releak'
    rerun = cleanup([server])
    assert rerun.rc == 0, rerun
    assert host_result(rerun, 'triton1')['done']['unregistered'] == ['dead']
    assert server.system_regions() == {} and 'releak' not in server.shm_files()


def test_two_concurrent_stale_cleanups_report_together_exactly_what_leaked(make_triton):
    """Two jobs at once against one server (two inventory hosts for the same Triton, run in parallel forks).

    Three rounds: the two forks do not overlap every time (without the per-server lock, about one
    round in two showed both runs counting the same regions here).
    """
    server = make_triton(models=(), shm_size='64m')
    live = server.client('live', byte_size=MIB)
    hosts = dict((h, dict(ansible_connection='local', ansible_python_interpreter=PYTHON)) for h in ('job_a', 'job_b'))
    play = [
        {
            'name': 'two jobs',
            'hosts': 'all',
            'gather_facts': False,
            'tasks': [{'name': 'clean', REGION: dict(url=server.url, state='absent', stale=True), 'register': 'r'}],
        }
    ]
    for round_ in range(3):
        leaked = server.leak_many('leak%d' % round_, 300, byte_size=64 * 1024)
        leaked_bytes = sum(os.lstat(server.shm_path(n)).st_blocks * 512 for n in leaked)
        res = ansible_playbook(play, inventory={'all': {'hosts': hosts}}, args=('--forks', '2'))
        assert res.rc == 0, res
        a, b = res.task('clean', 'job_a'), res.task('clean', 'job_b')
        print(
            'FIGURE concurrent_stale_cleanup round %d: run A unregistered %d, removed %d; run B unregistered %d, removed %d'
            % (round_, len(a['unregistered']), len(a['removed_files']), len(b['unregistered']), len(b['removed_files']))
        )
        # each run reports only its own work: together exactly the leak, nothing twice
        assert not set(a['unregistered']) & set(b['unregistered'])
        assert sorted(a['unregistered'] + b['unregistered']) == sorted(leaked)
        assert not set(a['removed_files']) & set(b['removed_files'])
        assert sorted(os.path.basename(p) for p in a['removed_files'] + b['removed_files']) == sorted(leaked)
        assert a['freed_bytes'] + b['freed_bytes'] == leaked_bytes
        assert set(server.system_regions()) == {'live'}
    assert live.alive
