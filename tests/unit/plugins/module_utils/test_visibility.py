"""The visibility rule (issue 25): a holder scan sees every process only from the host's initial PID namespace.

procfs.pid_namespace() on fake proc trees (what the kernel shows in each case) and on real PID namespaces
(``unshare --pid --fork --mount-proc``); holders.visibility() and scan() on top of it; the snapshot and
triton_shm_info's result keys. RegionOps under the rule: tests/unit/plugins/module_utils/test_region_ops.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.host import discovery, holders, procfs
from ansible_collections.tritonops.shm.plugins.module_utils.host.snapshot import Snapshot, read_server
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import classify
from ansible_collections.tritonops.shm.plugins.module_utils.rules.results import info_result

INITIAL_HERE = os.stat('/proc/self/ns/pid').st_ino == procfs.INITIAL_PID_NS_INODE
needs_initial = pytest.mark.skipif(not INITIAL_HERE, reason="the tests run outside the host's initial PID namespace")
COLLECTION_ROOT = os.path.abspath(__file__).rsplit('/ansible_collections/', 1)[0]  # what sys.path needs


def fake_proc(root, self_target: str | None, ns_target: str | None, ns_is_file: bool = False) -> str:
    """A proc-like tree: self -> self_target (None: no self), PID/ns/pid -> ns_target (or a plain file)."""
    proc = str(root)
    if self_target is None:
        return proc
    os.makedirs(os.path.join(proc, self_target, 'ns'))
    os.symlink(self_target, os.path.join(proc, 'self'))
    pid_link = os.path.join(proc, self_target, 'ns', 'pid')
    if ns_is_file:
        with open(pid_link, 'w') as f:
            f.write('pid')
    elif ns_target is not None:
        os.symlink(ns_target, pid_link)
    return proc


@needs_initial
def test_the_hosts_own_proc_is_the_initial_namespace():
    ns = procfs.pid_namespace()
    assert ns.initial is True and 'pid:[4026531836]' in ns.detail
    assert holders.visibility() == holders.Visibility(holders.INITIAL, True, None, False)


@needs_initial
def test_a_proc_whose_self_is_us_and_whose_namespace_is_the_initial_one(tmp_path):
    proc = fake_proc(tmp_path, str(os.getpid()), '/proc/self/ns/pid')
    assert procfs.pid_namespace(proc).initial is True


@pytest.mark.parametrize(
    'self_target,ns_target,ns_is_file,why',
    [
        (None, None, False, 'self does not resolve'),  # a descendant namespace's proc: we are not in it
        ('1', '/proc/self/ns/pid', False, "self is 1, not the module's pid"),  # an ancestor's proc: another number
        ('OWN', None, True, 'PID namespace is pid:['),  # our namespace has a dynamic inode
        ('OWN', '/nonexistent/ns', False, 'ns/pid cannot be read'),
    ],
)
def test_any_other_proc_or_namespace_is_not_the_initial_one(tmp_path, self_target, ns_target, ns_is_file, why):
    proc = fake_proc(tmp_path, str(os.getpid()) if self_target == 'OWN' else self_target, ns_target, ns_is_file)
    ns = procfs.pid_namespace(proc)
    assert ns.initial is False
    assert why in ns.detail
    vis = holders.visibility(proc)
    assert vis.pid_namespace == holders.OTHER and vis.complete is False
    assert (
        why in vis.reason and 'clients_share_pid_namespace: true' in vis.reason and 'docs/kubernetes.md' in vis.reason
    )
    shared = holders.visibility(proc, clients_share_pid_namespace=True)
    assert shared == holders.Visibility(holders.OTHER, True, None, True), 'the operator states it: complete'


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.tritonops.shm.plugins.module_utils.host import holders, procfs
ns = procfs.pid_namespace()
scan = holders.scan([(1, 2)])
shared = holders.scan([(1, 2)], visible=holders.visibility(clients_share_pid_namespace=True))
print(json.dumps(dict(initial=ns.initial, detail=ns.detail, complete=scan.complete, reason=scan.incomplete_reason(),
                      shared=shared.complete, ns=shared.visibility.pid_namespace)))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('unshare'), reason='needs root and unshare')
def test_a_real_child_pid_namespace_is_not_the_initial_one():
    """A real PID namespace with its own /proc, as in a container: the scan is incomplete unless the option says so."""
    out = subprocess.run(
        ['unshare', '--pid', '--fork', '--mount-proc', sys.executable, '-c', CHILD, COLLECTION_ROOT],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    got = json.loads(out)
    assert got['initial'] is False and "not the host's initial one" in got['detail']
    assert got['complete'] is False and "outside the host's initial PID namespace" in got['reason']
    assert got['shared'] is True and got['ns'] == 'other'


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('unshare'), reason='needs root and unshare')
@needs_initial
def test_the_hosts_proc_read_from_a_child_pid_namespace_is_not_trusted():
    """A child PID namespace that still sees the host's /proc (no --mount-proc): self names another pid."""
    out = subprocess.run(
        ['unshare', '--pid', '--fork', sys.executable, '-c', CHILD, COLLECTION_ROOT],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    got = json.loads(out)
    assert got['initial'] is False and "not the module's pid 1" in got['detail']
    assert got['complete'] is False


def test_scan_joins_every_reason_and_keeps_the_older_ones_first():
    other = holders.Visibility(holders.OTHER, False, 'outside the initial namespace')
    scan = holders.HolderScan(other)
    assert not scan.complete and scan.incomplete_reason() == 'outside the initial namespace'
    scan.unreadable = [7]
    assert scan.incomplete_reason().startswith('1 process(es) could not be inspected (pids 7)')
    assert scan.incomplete_reason().endswith('; outside the initial namespace')
    assert holders.HolderScan().complete, 'a scan built by hand judges no visibility'


def _snapshot(vis, scan=True):
    loc = discovery.Location(pid=4242, shm_dir='/x', located_by='server_pid', warnings=[], reason=None)
    entries = [
        dict(
            name='a',
            path='/x/a',
            type='file',
            dev=77,
            inode=1,
            size=4096,
            allocated_bytes=4096,
            uid=0,
            mode='0600',
            mtime=0,
            age_s=3600,
            age_from='mtime',
        )
    ]
    hs = holders.HolderScan(vis) if scan else None
    if hs is not None:
        hs.holders[(77, 1)] = {4242}  # only the server maps it
    return Snapshot(
        url='http://127.0.0.1:1',
        metadata={'version': '2.51.0'},
        entries=entries,
        location=loc,
        regions=dict(system=[dict(name='a', key='/a', offset=0, byte_size=4096)], cuda=[]),
        shm_dir='/x' if scan else None,
        scan=hs,
        visibility=vis,
    )


def test_an_incomplete_visibility_makes_nothing_stale_orphan_or_reclaimable():
    other = holders.Visibility(holders.OTHER, False, 'outside the initial namespace')
    snap = _snapshot(other)
    records = classify(snap)
    assert [(r['state'], r['reclaimable']) for r in records.of('system')] == [('unknown', False)]
    res = info_result(snap, records)
    assert res['holders_complete'] is False and res['pid_namespace'] == 'other'
    assert res['holders_incomplete_reason'] == 'outside the initial namespace'
    shared = _snapshot(holders.Visibility(holders.OTHER, True, None, True))
    res = info_result(shared, classify(shared))
    assert (
        res['holders_complete'] is True and res['holders_incomplete_reason'] is None and res['pid_namespace'] == 'other'
    )
    assert [r['state'] for r in res['system_regions']] == ['stale']


def test_without_a_scan_the_reason_names_the_directory_and_the_namespace():
    other = holders.Visibility(holders.OTHER, False, 'outside the initial namespace')
    snap = _snapshot(other, scan=False)
    assert snap.holders_incomplete_reason.startswith('the shm directory of the server is not known')
    assert snap.holders_incomplete_reason.endswith('; outside the initial namespace')


def test_a_server_not_found_from_another_namespace_says_it_may_be_invisible_from_here(monkeypatch):
    """A pod's sidecar without the pod's PID namespace: the server's process is not in its /proc at all."""
    other = holders.Visibility(holders.OTHER, False, 'outside the initial namespace')
    monkeypatch.setattr(holders, 'visibility', lambda proc='/proc', share=False: other)
    loc = discovery.Location(
        pid=None, shm_dir=None, located_by=None, warnings=[], reason='no process owns 127.0.0.1:8000'
    )
    monkeypatch.setattr(discovery, 'locate_server', lambda *args: loc)

    class Client:
        base, host, port = 'http://127.0.0.1:8000', '127.0.0.1', 8000

        def server_metadata(self):
            return {'version': '2.51.0', 'extensions': ['system_shared_memory']}

        def status(self, kind):
            return []

    snap = read_server(Client())
    assert snap.server_reason == 'no process owns 127.0.0.1:8000; outside the initial namespace'
    assert snap.holders_incomplete_reason == (
        'the shm directory of the server is not known: no process owns 127.0.0.1:8000; outside the initial namespace'
    )
    assert info_result(snap, classify(snap))['server']['not_found_reason'] == snap.server_reason
