"""Triton's own shared memory (issue 27): the python backend pools, named per model, and the leftovers of dead servers.

Real tritonservers (Triton 2.51 from the wheel) with two python models, ``echo`` and ``mirror``: each model instance has
its python stub and its pool file ``triton_python_backend_shm_region_<uuid>``. A server and its stubs SIGKILLed together
(as a container's end: frozen first, so that no stub unlinks its file) leave their pools in a /dev/shm that outlives them
(tritonrig.ShmNamespace); a new server in the same /dev/shm makes new ones. The cleanup playbook removes the old pools
only, the new server keeps serving.
"""

from __future__ import annotations

import os
import re
import time

import pytest
import tritonrig
from ansible_helpers import PYTHON, ansible_playbook, run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MODELS = ('echo', 'mirror')
PREFIX = 'triton_python_backend_shm_region_'
HOUR = 3600
AGED = 2.0  # seconds: the min_age here; a crashed server's pools are waited for until older (tritonrig.wait_older)


def pools(ns):
    return sorted(f for f in os.listdir(ns.shm_dir) if f.startswith(PREFIX))


def infer(server, model):
    """One inference over HTTP/JSON through the model's python stub (and its pool): the echoed data."""
    body = {'inputs': [{'name': 'INPUT0', 'shape': [4], 'datatype': 'UINT8', 'data': [1, 2, 3, 4]}]}
    status, answer = tritonrig.http_json(f'{server.url}/v2/models/{model}/infer', method='POST', body=body, timeout=30)
    assert status == 200, answer
    return answer['outputs'][0]['data']


def cleanup(server, check=False, **extra):
    host = dict(ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=server.url)
    inventory = {'all': {'children': {'triton': {'hosts': {'triton1': host}}}}}
    extra.setdefault('prometheus_textfile_dir', '')
    return ansible_playbook(
        'tritonops.shm.cleanup',
        inventory=inventory,
        extra_vars=extra,
        check=check,
        env={'ANSIBLE_SHOW_CUSTOM_STATS': '1'},
    )


def host_result(res):
    return res.data['global_custom_stats']['tritonops_shm_cleanup']['triton1']


@pytest.fixture
def crashed(tmp_path):
    """A /dev/shm holding the pools of a crashed server (older than AGED), and a new server serving in it."""
    with tritonrig.ShmNamespace('64m') as ns:
        first = tritonrig.TritonServer(workdir=str(tmp_path), namespace=ns, name='first', models=MODELS)
        second = None
        try:
            first.start()
            old = pools(ns)
            assert len(old) == len(MODELS), os.listdir(ns.shm_dir)
            tritonrig.crash(first)
            time.sleep(2)  # a stub that outlived its server would have unlinked its pool by now (0.06 to 0.3 s on 2.51)
            assert pools(ns) == old, 'a server and its stubs killed together (one killpg) leave their pools'
            tritonrig.wait_older([os.path.join(ns.shm_dir, name) for name in old], AGED)
            second = tritonrig.TritonServer(
                workdir=str(tmp_path), namespace=ns, name='second', models=MODELS, http_port=first.http_port
            ).start()
            new = sorted(set(pools(ns)) - set(old))
            assert len(new) == len(MODELS), 'the new server neither reuses nor cleans the old pools'
            yield dict(ns=ns, server=second, old=old, new=new, report_dir=tmp_path / 'report')
        finally:
            if second:
                second.stop()
            first.stop()


def test_each_pool_is_named_for_its_model_and_instance(tmp_path):
    with tritonrig.TritonServer(workdir=str(tmp_path), models=MODELS) as server:
        info = run_module(INFO, dict(url=server.url))
        assert not info.get('failed'), info
        got = {p['model']: p for p in info['backend_pools']}
        assert sorted(got) == list(MODELS), info['backend_pools']
        for model, pool in got.items():
            assert pool['instance'] == f'{model}_0_0' and pool['backend'] == 'python' and pool['state'] == 'live', pool
            assert pool['name'].startswith(PREFIX) and pool['path'] == os.path.join(server.shm_dir, pool['name'])
            # a pool starts at shm-default-byte-size (1 MiB), mapped by the server and by the model's own stub
            assert pool['size'] == pool['bytes'] == 1 << 20, pool
            comms = sorted(h['comm'] for h in pool['holders'])
            assert comms == ['triton_python_b', 'tritonserver'], pool
            assert server.pid in [h['pid'] for h in pool['holders']]
        assert got['echo']['name'] != got['mirror']['name']
        files = {f['name']: f for f in info['files']}
        assert [files[p['name']]['category'] for p in got.values()] == ['backend', 'backend']
        assert info['summary']['leftover_files'] == 0


def test_the_cleanup_removes_the_pools_of_a_crashed_server_and_keeps_the_new_servers(crashed):
    ns, server, old, new = crashed['ns'], crashed['server'], crashed['old'], crashed['new']
    info = run_module(INFO, dict(url=server.url, min_age=AGED))
    by_name = {p['name']: p for p in info['backend_pools']}
    assert [(by_name[n]['state'], by_name[n]['model'], by_name[n]['holders']) for n in old] == [
        ('leftover', None, [])
    ] * 2
    assert sorted(by_name[n]['model'] for n in new) == list(MODELS)
    assert {by_name[n]['state'] for n in new} == {'live'}
    assert 'held by no process and older than min_age' in by_name[old[0]]['reason']
    assert (info['summary']['leftover_files'], info['summary']['leftover_bytes']) == (2, 2 << 20), info['summary']
    assert info['summary']['backend_files'] == 2

    # check mode: says what it would remove, removes nothing
    dry = cleanup(server, check=True, shm_cleanup_min_age=AGED)
    assert dry.stats['triton1']['failures'] == 0, dry
    r = host_result(dry)
    assert r['check_mode'] is True and sorted(os.path.basename(p) for p in r['done']['removed_files']) == old, r
    assert pools(ns) == sorted(old + new)

    res = cleanup(server, shm_cleanup_report_dir=str(crashed['report_dir']), shm_cleanup_min_age=AGED)
    assert res.stats['triton1']['failures'] == 0 and res.stats['triton1']['changed'] >= 1, res
    r = host_result(res)
    assert sorted(os.path.basename(p) for p in r['done']['removed_files']) == old, r
    # the HTML page: one row per model, the dead server's leftovers in a row of their own, each pool's outcome
    with open(os.path.join(crashed['report_dir'], 'report.html')) as f:
        page = f.read()
    rows = dict(
        re.findall(r'<tr data-model-total="([^"]+)"><td class="name">[^<]*</td><td class="num">([^<]*)</td>', page)
    )
    assert rows == {'echo': '1', 'mirror': '1', 'leftover': '-'}, rows
    outcome = dict(re.findall(r'data-pool="([^"]+)"[^>]*>.*?<td class="outcome">([^<]*)</td>', page))
    assert outcome == {**{n: 'removed' for n in old}, **{n: 'kept' for n in new}}, outcome
    assert (
        r['done']['freed_bytes'] == 2 << 20 and r['before']['leftover_files'] == 2 and r['after']['leftover_files'] == 0
    )
    assert pools(ns) == new
    for model in MODELS:
        assert infer(server, model) == [1, 2, 3, 4], 'the new server still serves through its pools'

    again = cleanup(server, shm_cleanup_min_age=AGED)
    assert again.stats['triton1']['failures'] == 0 and again.stats['triton1']['changed'] == 0, again
    assert host_result(again)['done']['removed_files'] == [] and pools(ns) == new


def test_leftovers_stay_unless_asked_and_a_held_pool_is_never_one(crashed):
    ns, server, old, new = crashed['ns'], crashed['server'], crashed['old'], crashed['new']
    # the region module's default: leftovers are reported, never removed
    stale = run_module(REGION, dict(url=server.url, state='absent', stale=True, inventory=True, min_age=AGED))
    assert not stale.get('failed') and stale['removed_files'] == [] and stale['changed'] is False, stale
    assert stale['before']['summary']['leftover_files'] == 2 and pools(ns) == sorted(old + new)
    # younger than min_age: not yet a leftover
    young = run_module(REGION, dict(url=server.url, state='absent', backend_leftovers=True, min_age=2 * HOUR))
    assert not young.get('failed') and young['removed_files'] == [] and young['changed'] is False, young
    # asked for: only the unheld pools of the dead server go; the live ones (held by the server and its stubs) stay
    done = run_module(REGION, dict(url=server.url, state='absent', backend_leftovers=True, min_age=AGED))
    assert not done.get('failed') and sorted(os.path.basename(p) for p in done['removed_files']) == old, done
    assert pools(ns) == new
    assert [infer(server, model) for model in MODELS] == [[1, 2, 3, 4]] * 2


def test_with_an_incomplete_holder_scan_nothing_is_leftover(crashed):
    """Without privileges the processes that map the pools cannot be read: an unheld-looking pool is not a leftover.

    The module runs as uid 0 with every capability dropped (setpriv: an empty bounding set), inside the servers' mount
    namespace where their /dev/shm is /dev/shm: it can list the files, but the kernel refuses it the maps and fds of
    the server and its stubs (a process may read those of another only with all of that process's capabilities), as
    it refuses a user who is not root. The user nobody itself cannot run the test venv's Python (under /root).
    """
    ns, server, old = crashed['ns'], crashed['server'], crashed['old']
    prefix = ('nsenter', '--mount', '--target', str(ns.pid), 'setpriv', '--bounding-set=-all', '--inh-caps=-all')
    args = dict(url=server.url, server_pid=server.pid, shm_dir='/dev/shm', min_age=AGED)
    info = run_module(INFO, args, prefix=prefix)
    assert not info.get('failed'), info
    assert info['holders_complete'] is False and info['unreadable_processes'] > 0, info
    files = {f['name']: f for f in info['files']}
    assert [files[n]['category'] for n in old] == ['backend', 'backend'], files
    assert files[old[0]]['category_reason'].endswith('holders could not be fully determined')
    assert info['summary']['leftover_files'] == 0
    assert {p['state'] for p in info['backend_pools'] if p['name'] in old} == {'unknown'}
    removed = run_module(REGION, dict(args, state='absent', backend_leftovers=True), prefix=prefix)
    assert not removed.get('failed') and removed['removed_files'] == [] and removed['changed'] is False, removed
    assert set(old) <= set(pools(ns))
    # the same read with privileges: they are leftovers
    assert run_module(INFO, args, prefix=prefix[:4])['summary']['leftover_files'] == 2
