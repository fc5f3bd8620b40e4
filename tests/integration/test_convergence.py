"""Every run converges, whatever it could not write (issue 40, goal 4), on the real rig.

Before it unregisters, a stale cleanup records the files it will remove (an extended attribute on the shm directory);
that record let a later run recognise what a stopped run left. Two scenes where it cannot be written:

- a read-only shm directory: before, every stale region was unregistered and no file removed (``changed: true``), and
  once the directory was writable again a rerun left the files as ``foreign`` for good. Now the regions stay
  registered, skipped with the reason, and the first run on a writable directory finishes both;
- a full tmpfs (blocks and inodes: tmpfs charges extended attributes to inodes) and the run SIGKILLed after its
  quarantine rename, stopped in its first unlink (strace's delay injection, as in test_races.py): before, the
  quarantined files stayed ``foreign`` through every rerun. Now a file under the collection's quarantine name for its
  very inode is an orphan that the next stale cleanup removes, with the usual re-checks.
"""

from __future__ import annotations

import errno
import os
import subprocess

import ansible_helpers
import pytest
from test_races import ModuleRun

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20
QUARANTINE = '.tritonops_shm.quarantine.'

pytestmark = pytest.mark.skipif(os.uname().machine != 'x86_64', reason='system call numbers are x86_64 ones')


def _mount(server, options):
    subprocess.run(
        ['nsenter', '--mount', '--target', str(server.pid), 'mount', '-o', 'remount,' + options, '/dev/shm'],
        check=True,
        capture_output=True,
    )


def _stale(server):
    return ansible_helpers.run_module(REGION, dict(url=server.url, state='absent', stale=True))


def test_a_read_only_shm_directory_keeps_stale_regions_registered_and_one_writable_run_finishes(make_triton, tmp_path):
    server = make_triton(models=(), shm_size='32m')
    stale = server.leak_many('ro', 5, byte_size=MIB)
    # the server maps its files for writing, so its tmpfs cannot be remounted read-only: the module is given the same
    # directory through a read-only bind mount in the server's mount namespace (same device and inodes)
    view = tmp_path / 'ro-shm'
    view.mkdir()
    ns = ['nsenter', '--mount', '--target', str(server.pid)]
    subprocess.run(ns + ['mount', '--bind', '/dev/shm', str(view)], check=True, capture_output=True)
    subprocess.run(ns + ['mount', '-o', 'remount,bind,ro', str(view)], check=True, capture_output=True)
    try:
        first = ansible_helpers.run_module(
            REGION,
            dict(
                url=server.url,
                server_pid=server.pid,
                shm_dir='/proc/%d/root%s' % (server.pid, view),
                state='absent',
                stale=True,
            ),
        )
    finally:
        subprocess.run(ns + ['umount', str(view)], check=True, capture_output=True)
    assert not first.get('failed'), first
    assert first['changed'] is False and first['unregistered'] == [] and first['removed_files'] == [], first
    assert set(stale) <= set(server.system_regions()) and set(stale) <= set(server.shm_files())
    reasons = {i['name']: i['reason'] for i in first['skipped_items'] if 'name' in i}
    assert set(reasons) >= set(stale) and all('read-only' in reasons[n] for n in stale), first['skipped_items']
    assert any('kept registered' in w for w in first.get('warnings', [])), first.get('warnings')
    second = _stale(server)
    assert sorted(second['unregistered']) == sorted(stale), second
    assert not set(stale) & set(server.shm_files()) and not set(stale) & set(server.system_regions())
    assert _stale(server)['changed'] is False


def _fill(server):
    """Fill the server's tmpfs: its blocks with one file, its inodes (nr_inodes lowered to what is in use, plus a few)
    with empty files; returns the names made."""
    made = []
    with open(os.path.join(server.shm_dir, 'filler'), 'wb') as f:
        made.append('filler')
        try:
            while True:
                f.write(b'\0' * MIB)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    used = os.statvfs(server.shm_dir)
    _mount(server, 'nr_inodes=%d' % (used.f_files - used.f_ffree + 4))
    for i in range(100):
        try:
            with open(os.path.join(server.shm_dir, 'inode%d' % i), 'wb'):
                made.append('inode%d' % i)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            break
    else:
        raise AssertionError('the tmpfs never ran out of inodes')
    return made


def test_a_full_tmpfs_and_a_kill_after_the_quarantine_rename_converge_in_one_more_run(make_triton, tmp_path):
    server = make_triton(models=(), shm_size='16m')
    stale = server.leak_many('full', 6, byte_size=MIB)
    _fill(server)
    run = ModuleRun(
        REGION, dict(url=server.url, state='absent', stale=True), tmp_path, delay_in=('unlinkat',), delay_s=30
    )
    try:
        assert run.wait_stopped(('unlinkat',), timeout=120), 'the module never reached its first unlink'
    finally:
        run.kill()
    assert not set(stale) & set(server.system_regions()), 'stopped after the unregisters'
    quarantined = [n for n in server.shm_files() if n.startswith(QUARANTINE)]
    assert quarantined, server.shm_files()
    # nothing recorded them: the record did not fit on the full tmpfs
    info = ansible_helpers.run_module(INFO, dict(url=server.url))
    files = {f['name']: f for f in info['files']}
    assert all(
        files[n]['category'] == 'orphan' and 'quarantine name' in files[n]['category_reason'] for n in quarantined
    )
    rerun = _stale(server)
    assert not rerun.get('failed'), rerun
    left = [n for n in server.shm_files() if n.startswith(QUARANTINE) or n in stale]
    assert left == [], left
    assert _stale(server)['changed'] is False
