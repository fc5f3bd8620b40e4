"""Unit tests for region_ops.RegionOps: the ordering and safety rules of triton_shm_region.

Files are real (a temp directory plays the server's shm directory), holders come from
the real /proc scan, and the "server process" is a real child process. Only the Triton
HTTP API is a fake, for the error paths a real server cannot produce on demand
(refusals part-way, "in use" every time, a region re-appearing between plan and unlink).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat
import subprocess
import sys
import time

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ParameterError,
    RegionInUse,
    ServerNotFound,
    TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.host import holders, nvml, procfs, shm_fs
from ansible_collections.tritonops.shm.plugins.module_utils.host import snapshot as snapshot_mod
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, facts, region_plan
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import RegionOps
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient

# the text of Triton 2.51 (checked against the real server in tests/integration/test_triton_shm_region.py)
IN_USE = "Cannot unregister shared memory region '%s', it is currently in use."
KIB = 1024
AGED = 2.0  # seconds: the min_age of the tests with old files (wait_older); a young one beside them is dated ahead


class FakeTriton:
    """The Triton shared-memory API of one server, in memory. Files are checked in the real shm dir."""

    host = '127.0.0.1'
    port = 9
    base = 'http://127.0.0.1:9'

    def __init__(
        self,
        shm_dir,
        regions=(),
        in_use=None,
        fail_unregister_at=None,
        refuse_register=(),
        on_unregister=None,
        cuda=(),
        cuda_handles=None,
    ):
        self.shm_dir = shm_dir
        self.cuda_handles = cuda_handles  # {name: raw_handle}: when given, CUDA registers are accepted (never listed)
        self.regions = {r['name']: dict(r) for r in regions}
        self.cuda = {r['name']: dict(r) for r in cuda}
        self.in_use = dict(in_use or {})  # name -> refusals left (-1: always)
        self.fail_unregister_at = fail_unregister_at  # the Nth unregister call fails (connection lost)
        self.refuse_register = set(refuse_register)  # (name, byte_size) the server refuses
        self.on_unregister = on_unregister
        self.calls = []
        self.unregister_calls = 0

    unaddressable = staticmethod(TritonClient.unaddressable)  # the names HTTP cannot carry, as over HTTP

    def server_metadata(self):
        self.calls.append(('metadata',))
        return dict(name='triton', version='2.51.0', extensions=['system_shared_memory', 'cuda_shared_memory'])

    def status(self, kind):
        self.calls.append(('status', kind))
        regions = self.regions if kind == 'system' else self.cuda
        return [dict(regions[n]) for n in sorted(regions)]

    def _file_exists(self, key):
        return os.path.lexists(os.path.join(self.shm_dir, key.lstrip('/')))

    def unregister(self, kind, name):
        self.unregister_calls += 1
        regions = self.regions if kind == 'system' else self.cuda
        key = regions.get(name, {}).get('key')
        self.calls.append(('unregister', kind, name, self._file_exists(key) if key else None))
        if self.fail_unregister_at is not None and self.unregister_calls >= self.fail_unregister_at:
            raise TritonError(
                f"unregister {kind} region '{name}' at {self.base}: cannot connect to Triton (refused or unreachable)",
                url=self.base,
            )
        left = self.in_use.get(name, 0)
        if left:
            self.in_use[name] = left - 1 if left > 0 else left
            raise RegionInUse(
                f"unregister {kind} region '{name}' at {self.base}: HTTP 500: {IN_USE % name}",
                url=self.base,
                status=500,
                server_error=IN_USE % name,
            )
        regions.pop(name, None)
        if self.on_unregister:
            self.on_unregister(name)

    def register(self, kind, name, values):
        if kind == 'system':
            return self.register_system(name, values['key'], values['offset'], values['byte_size'])
        return self.register_cuda(name, values['raw_handle'], values['device_id'], values['byte_size'])

    def register_system(self, name, key, offset, byte_size):
        self.calls.append(('register', 'system', name, key, offset, byte_size))
        if any(r['key'] == key for r in self.regions.values()):  # Triton 2.51: one region per key
            msg = f"failed to register shared memory region '{name}': invalid args"
            raise TritonError(
                f"register system region '{name}' at {self.base}: HTTP 400: {msg}",
                url=self.base,
                status=400,
                server_error=msg,
            )
        if (name, byte_size) in self.refuse_register or not self._file_exists(key):
            msg = f"Unable to open shared memory region: '{key}'"
            raise TritonError(
                f"register system region '{name}' at {self.base}: HTTP 500: {msg}",
                url=self.base,
                status=500,
                server_error=msg,
            )
        self.regions[name] = dict(name=name, key=key, offset=offset, byte_size=byte_size)

    def register_cuda(self, name, raw_handle_b64, device_id, byte_size):
        self.calls.append(('register', 'cuda', name, device_id, byte_size))
        if self.cuda_handles is not None and name not in self.cuda:
            self.cuda[name] = dict(name=name, device_id=device_id, byte_size=byte_size)
            self.cuda_handles[name] = raw_handle_b64
            return
        msg = 'failed to register shared memory region: invalid args'
        raise TritonError(
            f"register cuda region '{name}' at {self.base}: HTTP 400: {msg}",
            url=self.base,
            status=400,
            server_error=msg,
        )

    def actions(self):
        return [c for c in self.calls if c[0] in ('register', 'unregister')]


class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


# server_proc, shm and complete_scan: conftest.py (shared with test_newer_servers.py)
pytestmark = pytest.mark.usefixtures('complete_scan')


def make_file(shm_dir, name, size=64 * KIB, fill=True):
    """A file in shm_dir; wait_older() ages it (its age counts from the newest of atime, mtime and ctime)."""
    path = os.path.join(shm_dir, name)
    with open(path, 'wb') as f:
        if fill:
            f.write(b'\1' * size)
        else:
            f.truncate(size)
    return path


def region(name, key=None, byte_size=64 * KIB, offset=0):
    return dict(name=name, key=key or '/' + name, offset=offset, byte_size=byte_size)


def params(shm_dir, pid, **kw):
    p = dict(
        state='absent',
        kind='system',
        name=[],
        key=None,
        offset=0,
        byte_size=None,
        create_file=False,
        raw_handle=None,
        device_id=None,
        stale=False,
        all=False,
        orphan_files=False,
        orphan_patterns=[],
        min_age=300,
        exclude=[],
        remove_file=True,
        in_use_timeout=10,
        server_pid=pid,
        shm_dir=shm_dir,
        reserved=False,
        backend_patterns=list(facts.BACKEND_PATTERNS),
        inventory=False,
    )
    p.update(kw)
    return p


def run(client, shm_dir, pid, check_mode=False, clock=None, serialise=False, **kw):
    """One module run, as triton_shm_region does it: the result from RegionOps.result(), the diff, the warnings."""
    warnings = []
    clock = clock or FakeClock()
    ops = RegionOps(
        client,
        params(shm_dir, pid, **kw),
        check_mode=check_mode,
        warn=warnings.append,
        sleep=clock.sleep,
        clock=clock.clock,
        serialise=serialise,
    )
    try:
        ops.run()
        result = ops.result(diff=True)
    finally:
        ops.release()
    result['warnings'] = warnings
    return result


def snapshot(shm_dir):
    out = {}
    for name in sorted(os.listdir(shm_dir)):
        st = os.lstat(os.path.join(shm_dir, name))
        out[name] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def reasons(result, key):
    return {item.get(key): item['reason'] for item in result['skipped_items'] if key in item}


# -- the ordinary path ----------------------------------------------------------------------------


def test_stale_regions_are_unregistered_first_then_their_files_removed(shm, server_proc):
    paths = [make_file(shm, 'a'), make_file(shm, 'b')]
    fake = FakeTriton(shm, regions=[region('a'), region('b')])
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['changed'] is True
    assert res['unregistered'] == ['a', 'b']
    assert sorted(res['removed_files']) == sorted(paths)
    assert res['freed_bytes'] >= 2 * 64 * KIB
    assert not any(os.path.exists(p) for p in paths)
    # invariant 2: each file still existed when its region was unregistered
    assert fake.actions() == [('unregister', 'system', 'a', True), ('unregister', 'system', 'b', True)]
    assert res['regions'] == []
    rerun = run(fake, shm, server_proc.pid, stale=True)
    assert rerun['changed'] is False and rerun['unregistered'] == [] and rerun['removed_files'] == []


def test_plan_is_pure(shm, server_proc):
    """Issue 41, goal 5: plan() decides and records nothing; preview() and execute() build the outcome from the plan
    (with inventory, the plan carries the read as triton_shm_info shows it: the result's before)."""
    make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    ops = RegionOps(fake, params(shm, server_proc.pid, stale=True, inventory=True, orphan_patterns=['client_*']))
    with ops.hold(ops.read()) as reading:
        started = dataclasses.asdict(ops.outcome)
        plan = ops.plan(reading)
        assert dataclasses.asdict(ops.outcome) == started and ops.outcome.before_result is reading.inventory
        assert plan.selected_names == ['a'] and plan.inventory['system_regions'][0]['name'] == 'a'
        assert ops.preview(plan).before_result is plan.inventory
    assert fake.actions() == []


@pytest.mark.parametrize('leak', ['with its file', 'dangling'])
def test_a_cleanup_reads_the_server_once_after_acting(shm, server_proc, leak):
    """Issue 41, goal 5: after the unregisters, one wait for them to leave the status, then one read of the server (with
    inventory, the holder re-check before the unlinks when files are removed) from which the regions, the inventory
    and the diff after all come; before, the status was read again beside it."""
    if leak == 'with its file':
        make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    res = run(fake, shm, server_proc.pid, stale=True, inventory=True, orphan_patterns=['client_*'])
    assert res['unregistered'] == ['a'] and res['regions'] == [] and res['after']['system_regions'] == []
    assert res['diff']['after']['regions'] == []
    last = max(i for i, call in enumerate(fake.calls) if call[0] == 'unregister')
    assert fake.calls[last + 1 :] == [('status', 'system'), ('metadata',), ('status', 'system')]


@pytest.mark.parametrize('refusal', ['ENOSYS', 'EINVAL', 'EOVERFLOW'])
def test_a_file_that_cannot_be_quarantined_is_never_unlinked_in_place(shm, server_proc, monkeypatch, refusal):
    """Issue 40, goal 5: with the quarantine rename refused (no RENAME_NOREPLACE; EOVERFLOW as the owner too), the file
    is kept with the reason (0.2.x unlinked it in place after the re-check: a client opening it meanwhile lost it)."""
    import errno

    path = make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    code = getattr(errno, refusal)

    def refuse(*_args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(shm_fs, '_renameat2', refuse)
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['unregistered'] == ['a'] and res['removed_files'] == [] and os.path.exists(path)
    (skip,) = [i for i in res['skipped_items'] if i.get('path') == path]
    assert 'cannot rename it to a quarantine name' in skip['reason'] and 'not removed' in skip['reason'], skip


def test_check_mode_reports_the_plan_and_touches_nothing(shm, server_proc, wait_older, keep_young):
    make_file(shm, 'a')
    wait_older([make_file(shm, 'old_orphan')], AGED)
    keep_young(make_file(shm, 'young_orphan'))
    fake = FakeTriton(shm, regions=[region('a')])
    before = snapshot(shm)
    orphans = dict(orphan_files=True, orphan_patterns=['*orphan'], min_age=AGED)
    res = run(fake, shm, server_proc.pid, check_mode=True, stale=True, **orphans)
    assert res['changed'] is True
    assert res['unregistered'] == ['a']
    assert sorted(os.path.basename(p) for p in res['removed_files']) == ['a', 'old_orphan']
    assert res['freed_bytes'] >= 2 * 64 * KIB
    assert res['regions'] == []  # predicted
    assert fake.actions() == []
    assert snapshot(shm) == before
    assert res['shm_used_bytes_after'] == res['shm_used_bytes_before']
    # and the real run does exactly that
    real = run(fake, shm, server_proc.pid, stale=True, **orphans)
    assert (real['unregistered'], sorted(real['removed_files'])) == (res['unregistered'], sorted(res['removed_files']))


def test_names_the_client_cannot_address_are_skipped_in_the_plan_so_check_mode_tells_the_truth(shm, server_proc):
    make_file(shm, 'a')
    make_file(shm, 'sp')
    fake = FakeTriton(shm, regions=[region('a'), region('a b', key='/sp')])
    check = run(fake, shm, server_proc.pid, check_mode=True, stale=True)
    real = run(fake, shm, server_proc.pid, stale=True)
    for res in (check, real):
        assert res['unregistered'] == ['a'] and [os.path.basename(p) for p in res['removed_files']] == ['a']
        assert 'grpc://' in reasons(res, 'name')['a b']
        assert reasons(res, 'path') == {os.path.join(shm, 'sp'): "region 'a b' stays registered"}
    assert fake.actions() == [('unregister', 'system', 'a', True)], 'never sent'
    assert os.path.exists(os.path.join(shm, 'sp'))


def test_diff_lists_regions_before_and_after_and_the_files(shm, server_proc):
    make_file(shm, 'a')
    make_file(shm, 'keep')
    fake = FakeTriton(shm, regions=[region('a'), region('keep')])
    res = run(fake, shm, server_proc.pid, name=['a'])
    assert [r['name'] for r in res['diff']['before']['regions']] == ['a', 'keep']
    assert [r['name'] for r in res['diff']['after']['regions']] == ['keep']
    assert res['diff']['before']['files'] == [os.path.join(shm, 'a')]


def test_exclude_patterns_are_never_touched(shm, server_proc):
    for n in ('a', 'warmup_1', 'warmup_2'):
        make_file(shm, n)
    fake = FakeTriton(shm, regions=[region('a'), region('warmup_1'), region('warmup_2')])
    res = run(fake, shm, server_proc.pid, all=True, exclude=['warmup_*'])
    assert res['unregistered'] == ['a']
    assert reasons(res, 'name') == {'warmup_1': 'excluded by pattern', 'warmup_2': 'excluded by pattern'}
    assert sorted(fake.regions) == ['warmup_1', 'warmup_2']
    assert os.path.exists(os.path.join(shm, 'warmup_1'))


def test_remove_file_false_keeps_the_file(shm, server_proc):
    path = make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    res = run(fake, shm, server_proc.pid, stale=True, remove_file=False)
    assert res['unregistered'] == ['a'] and res['removed_files'] == []
    assert os.path.exists(path)


def test_a_file_shared_by_a_region_that_stays_is_kept(shm, server_proc):
    path = make_file(shm, 'shared')
    fake = FakeTriton(shm, regions=[region('one', key='/shared'), region('two', key='/shared')])
    res = run(fake, shm, server_proc.pid, name=['one'])
    assert res['unregistered'] == ['one']
    assert reasons(res, 'path') == {path: 'also backs a region that stays registered'}
    assert os.path.exists(path)


# -- invariant 1: a held file is never unlinked ---------------------------------------------------


@pytest.mark.parametrize('selector', [dict(stale=True), dict(name=['live']), dict(all=True)])
def test_a_live_clients_file_survives(shm, server_proc, selector):
    path = make_file(shm, 'live')
    fake = FakeTriton(shm, regions=[region('live')])
    with open(path, 'r+b') as f:
        m = mmap.mmap(f.fileno(), 0)  # this test process is the live client
        try:
            res = run(fake, shm, server_proc.pid, **selector)
        finally:
            m.close()
    assert os.path.exists(path)
    assert res['removed_files'] == []
    if 'stale' in selector:
        assert res['changed'] is False and 'live' in fake.regions  # healthy: not selected at all
    else:
        # the operator asked: unregistered, but the file is kept, said so and warned about
        assert res['unregistered'] == ['live']
        assert reasons(res, 'path')[path].startswith(f'held by {os.getpid()}')
        assert any("region 'live' is unregistered as asked" in w and 'is kept' in w for w in res['warnings'])


# -- invariant 2 and 10: in use -------------------------------------------------------------------


def test_in_use_is_retried_with_backoff_until_it_succeeds(shm, server_proc):
    make_file(shm, 'busy')
    fake = FakeTriton(shm, regions=[region('busy')], in_use={'busy': 3})
    clock = FakeClock()
    res = run(fake, shm, server_proc.pid, clock=clock, name=['busy'], in_use_timeout=10)
    assert res['unregistered'] == ['busy']
    assert len([c for c in fake.actions() if c[0] == 'unregister']) == 4
    assert len(clock.sleeps) == 3 and clock.sleeps == sorted(clock.sleeps) and clock.sleeps[0] < clock.sleeps[-1]
    assert res['removed_files'] == [os.path.join(shm, 'busy')]


def test_a_region_that_stays_in_use_is_skipped_and_its_file_never_unlinked(shm, server_proc):
    path = make_file(shm, 'busy')
    make_file(shm, 'idle')
    fake = FakeTriton(shm, regions=[region('busy'), region('idle')], in_use={'busy': -1})
    clock = FakeClock()
    res = run(fake, shm, server_proc.pid, clock=clock, stale=True, in_use_timeout=2)
    assert res['unregistered'] == ['idle']
    assert 'still in use after 2' in reasons(res, 'name')['busy']
    assert 'currently in use' in reasons(res, 'name')['busy']
    assert reasons(res, 'path') == {path: "region 'busy' is still registered"}
    assert os.path.exists(path) and 'busy' in fake.regions
    assert sum(clock.sleeps) <= 2 and len(clock.sleeps) >= 3


def test_in_use_timeout_zero_tries_once(shm, server_proc):
    make_file(shm, 'busy')
    fake = FakeTriton(shm, regions=[region('busy')], in_use={'busy': -1})
    clock = FakeClock()
    res = run(fake, shm, server_proc.pid, clock=clock, name=['busy'], in_use_timeout=0)
    assert clock.sleeps == [] and res['changed'] is False
    assert 'busy' in reasons(res, 'name')


# -- invariant 3: holders re-checked right before the unlink --------------------------------------
# (with inventory=true the re-check is a full read of the server, which is also the state returned after)


@pytest.mark.parametrize('inventory', [False, True])
def test_a_client_appearing_after_the_plan_keeps_the_file(shm, server_proc, inventory):
    path = make_file(shm, 'a')
    maps = []

    def attach(name):  # a client maps the file between the plan and the unlink
        with open(path, 'r+b') as f:
            maps.append(mmap.mmap(f.fileno(), 0))

    fake = FakeTriton(shm, regions=[region('a')], on_unregister=attach)
    try:
        res = run(fake, shm, server_proc.pid, stale=True, inventory=inventory)
    finally:
        for m in maps:
            m.close()
    assert res['unregistered'] == ['a']
    assert os.path.exists(path) and res['removed_files'] == []
    assert 're-checked before removal' in reasons(res, 'path')[path]
    assert str(os.getpid()) in reasons(res, 'path')[path]
    if inventory:
        assert res['before']['system_regions'][0]['state'] == 'stale'
        files = {f['name']: f for f in res['after']['files']}
        assert res['after']['system_regions'] == [] and files['a']['category'] == 'in_use'
        assert os.getpid() in [h['pid'] for h in files['a']['holders']]


@pytest.mark.parametrize('inventory', [False, True])
def test_a_client_process_appearing_after_the_plan_keeps_the_file(shm, server_proc, inventory):
    path = make_file(shm, 'a')
    procs = []
    holder = 'import mmap, sys, time\nf = open(sys.argv[1], "r+b")\nm = mmap.mmap(f.fileno(), 0)\nprint("up", flush=True)\ntime.sleep(60)\n'  # noqa: E501

    def attach(name):
        p = subprocess.Popen([sys.executable, '-c', holder, path], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == 'up'

    fake = FakeTriton(shm, regions=[region('a')], on_unregister=attach)
    try:
        res = run(fake, shm, server_proc.pid, stale=True, inventory=inventory)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert os.path.exists(path)
    assert reasons(res, 'path')[path].startswith(f'held by {procs[0].pid}')


# -- invariant 4: inside the directory, no symlinks, regular files only ---------------------------


@pytest.mark.parametrize('inventory', [False, True])
def test_a_file_replaced_by_a_symlink_after_the_plan_is_not_followed(shm, server_proc, tmp_path, inventory):
    path = make_file(shm, 'a')
    target = tmp_path / 'precious'
    target.write_bytes(b'keep me')

    def swap(name):
        os.unlink(path)
        os.symlink(str(target), path)

    fake = FakeTriton(shm, regions=[region('a')], on_unregister=swap)
    res = run(fake, shm, server_proc.pid, stale=True, inventory=inventory)
    assert res['removed_files'] == []
    assert os.path.islink(path) and target.read_bytes() == b'keep me'
    assert 'not a regular file' in reasons(res, 'path')[path]
    assert any('symlink' in w for w in res['warnings'])


@pytest.mark.parametrize('inventory', [False, True])
def test_a_file_replaced_by_another_file_after_the_plan_is_kept(shm, server_proc, inventory):
    path = make_file(shm, 'a')

    def swap(name):  # a client recreates the file (a new inode, renamed into place)
        os.rename(make_file(shm, 'a.new', size=KIB), path)

    fake = FakeTriton(shm, regions=[region('a')], on_unregister=swap)
    res = run(fake, shm, server_proc.pid, stale=True, inventory=inventory)
    assert os.path.exists(path) and 'replaced since it was checked' in reasons(res, 'path')[path]


@pytest.mark.parametrize('make', ['symlink', 'fifo', 'directory'])
def test_a_non_regular_backing_path_is_never_removed(shm, server_proc, tmp_path, make):
    path = os.path.join(shm, 'odd')
    target = tmp_path / 'outside'
    target.write_bytes(b'x' * 100)
    if make == 'symlink':
        os.symlink(str(target), path)
    elif make == 'fifo':
        os.mkfifo(path)
    else:
        os.mkdir(path)
    fake = FakeTriton(shm, regions=[region('odd')])
    res = run(fake, shm, server_proc.pid, stale=True, orphan_files=True, orphan_patterns=['*'], min_age=0)
    assert res['unregistered'] == []  # its state is unknown: never stale
    res = run(fake, shm, server_proc.pid, all=True, orphan_files=True, orphan_patterns=['*'], min_age=0)
    assert res['unregistered'] == ['odd'] and res['removed_files'] == []
    assert 'not a regular file' in reasons(res, 'path')[path]
    assert os.path.lexists(path) and target.read_bytes() == b'x' * 100


@pytest.mark.parametrize(
    'key,why',
    [
        ('/../etc/passwd', 'one path component'),
        ('/..', 'outside the shm directory'),
        ('/a/b', 'one path component'),
        ('no_slash', 'must start with "/"'),
        ('/nul\x00byte', 'NUL'),
        ('/', 'one path component'),
    ],
)
def test_present_refuses_unsafe_keys_before_anything(shm, server_proc, key, why):
    fake = FakeTriton(shm)
    before = snapshot(shm)
    with pytest.raises(ParameterError, match=why):
        run(fake, shm, server_proc.pid, state='present', name=['r'], key=key, byte_size=KIB, create_file=True)
    assert fake.calls == [] and snapshot(shm) == before


# -- invariant 5: backend and foreign files, orphans by pattern and age ---------------------------


def test_orphan_removal_respects_categories_patterns_and_age(shm, server_proc, wait_older, keep_young):
    backend = make_file(shm, facts.BACKEND_PREFIX + 'abc')
    old = make_file(shm, 'client_input_0')
    other = make_file(shm, 'postgres_shm')
    held = make_file(shm, 'client_input_held')
    wait_older([backend, old, other, held], AGED)
    young = keep_young(make_file(shm, 'client_input_1'))
    os.mkfifo(os.path.join(shm, 'client_input_fifo'))
    os.mkdir(os.path.join(shm, 'client_input_dir'))
    fake = FakeTriton(shm)
    with open(held, 'r+b') as f:
        m = mmap.mmap(f.fileno(), 0)
        try:
            res = run(fake, shm, server_proc.pid, orphan_files=True, orphan_patterns=['client_input_*'], min_age=AGED)
            assert res['removed_files'] == [old]
            res_all = run(fake, shm, server_proc.pid, orphan_files=True, orphan_patterns=['*'], min_age=AGED)
            rerun = run(fake, shm, server_proc.pid, orphan_files=True, orphan_patterns=['*'], min_age=AGED)
        finally:
            m.close()
    # even "*" never takes the backend file, a young file, a held file, a FIFO or a directory
    assert res_all['removed_files'] == [other]
    for path in (backend, young, held):
        assert os.path.exists(path)
    assert stat.S_ISFIFO(os.lstat(os.path.join(shm, 'client_input_fifo')).st_mode)
    assert os.path.isdir(os.path.join(shm, 'client_input_dir'))
    assert rerun['changed'] is False and rerun['removed_files'] == []


# -- invariant 6: incomplete holders --------------------------------------------------------------


@pytest.mark.parametrize('inventory', [False, True])
def test_incomplete_holders_make_nothing_stale_and_remove_nothing(shm, server_proc, monkeypatch, inventory):
    real = holders.scan

    def incomplete(targets, **kwargs):
        result = real(targets, **kwargs)
        result.unreadable = [4242]
        return result

    monkeypatch.setattr(holders, 'scan', incomplete)
    path = make_file(shm, 'a')
    orphan = make_file(shm, 'client_input_0')
    fake = FakeTriton(shm, regions=[region('a')])
    before = snapshot(shm)
    res = run(
        fake, shm, server_proc.pid, stale=True, orphan_files=True, orphan_patterns=['*'], min_age=0, inventory=inventory
    )
    assert res['changed'] is False and fake.actions() == [] and snapshot(shm) == before
    assert any('holders are incomplete' in w for w in res['warnings'])
    res = run(
        fake, shm, server_proc.pid, name=['a'], orphan_files=True, orphan_patterns=['*'], min_age=0, inventory=inventory
    )
    assert res['unregistered'] == ['a']  # named: the operator asked
    assert reasons(res, 'path') == {path: 'holders could not be fully determined'}
    assert os.path.exists(path) and os.path.exists(orphan)


# -- invariant 6: the visibility rule (issue 25) ---------------------------------------------------


@pytest.fixture
def other_pid_namespace(monkeypatch):
    """The module as in a container: its PID namespace is not the host's initial one (procfs.pid_namespace)."""
    monkeypatch.setattr(holders, 'pid_namespace', lambda proc='/proc': procfs.PidNamespace(False, 'a test namespace'))


@pytest.mark.parametrize('inventory', [False, True])
def test_outside_the_initial_pid_namespace_nothing_is_stale_and_nothing_removed(
    shm, server_proc, other_pid_namespace, inventory
):
    """Issue 25: a client in another container is invisible here: its live region must not look stale."""
    path = make_file(shm, 'a')
    orphan = make_file(shm, 'client_input_0')
    fake = FakeTriton(shm, regions=[region('a'), region('gone', key='/gone')])
    before = snapshot(shm)
    res = run(
        fake, shm, server_proc.pid, stale=True, orphan_files=True, orphan_patterns=['*'], min_age=0, inventory=inventory
    )
    assert res['changed'] is False and fake.actions() == [] and snapshot(shm) == before
    assert res['holders_complete'] is False and res['pid_namespace'] == 'other'
    assert 'a test namespace' in res['holders_incomplete_reason']
    assert 'clients_share_pid_namespace: true' in res['holders_incomplete_reason']
    assert any('holders are incomplete' in w and 'a test namespace' in w for w in res['warnings'])
    assert os.path.exists(path) and os.path.exists(orphan)


def test_outside_the_initial_pid_namespace_the_option_makes_the_scan_complete(shm, server_proc, other_pid_namespace):
    """clients_share_pid_namespace: the operator states every client is visible here: stale regions go, as on the host."""
    path = make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    res = run(fake, shm, server_proc.pid, stale=True, clients_share_pid_namespace=True)
    assert res['unregistered'] == ['a'] and res['removed_files'] == [path]
    assert (
        res['holders_complete'] is True and res['holders_incomplete_reason'] is None and res['pid_namespace'] == 'other'
    )


def test_in_the_initial_pid_namespace_the_result_says_so(shm, server_proc):
    make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    res = run(fake, shm, server_proc.pid, stale=True, check_mode=True)
    assert (
        res['pid_namespace'] == 'initial'
        and res['holders_complete'] is True
        and res['holders_incomplete_reason'] is None
    )


# -- invariant 6: a server that cannot be found ---------------------------------------------------


@pytest.mark.parametrize(
    'selector,shm_given,what',
    [
        (
            dict(stale=True),
            True,
            'stale cleanup needs the tritonserver process behind http://127.0.0.1:9 and its shm directory, '
            'and the process was not found: ',
        ),
        (dict(stale=True), False, 'stale cleanup needs'),
        (dict(orphan_files=True, orphan_patterns=['*'], min_age=0), False, 'orphan_files cleanup needs'),
        (
            dict(stale=True, orphan_files=True, orphan_patterns=['*'], min_age=0),
            False,
            'stale and orphan_files cleanup needs',
        ),
    ],
)
def test_stale_or_orphan_cleanup_without_the_server_fails_with_the_reason(shm, selector, shm_given, what):
    """Nothing listens on the fake's port 9: discovery fails, and a silent no-op would report 'ok'."""
    make_file(shm, 'a')
    make_file(shm, 'client_input_0')
    fake = FakeTriton(shm, regions=[region('a')])
    before = snapshot(shm)
    with pytest.raises(ServerNotFound) as err:
        run(fake, shm if shm_given else None, None, **selector)
    assert what in str(err.value)
    assert 'cannot open a TCP connection to 127.0.0.1:9' in str(err.value) and 'set server_pid or shm_dir' in str(
        err.value
    )
    assert fake.actions() == [] and snapshot(shm) == before


def test_a_refused_cleanup_keeps_the_state_before_with_inventory(shm):
    """The role's record names why nothing was checked from the call's before (server.pid None: 'Locate the Triton
    server process'): a plan that refuses (the server process not found) still leaves the read in the failed result."""
    make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')])
    ops = RegionOps(fake, params(shm, None, stale=True, inventory=True), warn=lambda m: None)
    with pytest.raises(ServerNotFound):
        ops.run()
    before = ops.result(finished=False)['before']
    assert before['server']['pid'] is None and 'not found' in before['server']['not_found_reason']
    assert [r['name'] for r in before['system_regions']] == ['a'] and fake.actions() == []


def test_orphan_cleanup_with_shm_dir_but_no_server_still_works(shm):
    """shm_dir given, server unknown: orphans can still be judged (the server's own files count as held)."""
    orphan = make_file(shm, 'client_input_0')
    fake = FakeTriton(shm)
    res = run(fake, shm, None, orphan_files=True, orphan_patterns=['client_*'], min_age=0)
    assert res['removed_files'] == [orphan]


# -- invariant 8: a failure part-way --------------------------------------------------------------


def test_a_failure_part_way_reports_what_was_done_and_a_rerun_converges(shm, server_proc):
    names = [f'r{i}' for i in range(6)]
    for n in names:
        make_file(shm, n)
    fake = FakeTriton(shm, regions=[region(n) for n in names], fail_unregister_at=4)
    ops = RegionOps(fake, params(shm, server_proc.pid, stale=True), warn=lambda m: None)
    with pytest.raises(TritonError, match='cannot connect'):
        ops.absent()
    done = ops.result(finished=False)
    assert done['changed'] is True
    assert done['unregistered'] == names[:3]
    # the files of the regions confirmed unregistered are removed, the others kept with their regions
    assert sorted(os.path.basename(p) for p in done['removed_files']) == names[:3]
    assert sorted(os.listdir(shm)) == names[3:] and sorted(fake.regions) == names[3:]
    fake.fail_unregister_at = None
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['unregistered'] == names[3:] and os.listdir(shm) == [] and fake.regions == {}
    assert run(fake, shm, server_proc.pid, stale=True)['changed'] is False


def test_a_failure_before_anything_is_done_is_not_changed(shm, server_proc):
    make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')], fail_unregister_at=1)
    ops = RegionOps(fake, params(shm, server_proc.pid, stale=True), warn=lambda m: None)
    with pytest.raises(TritonError):
        ops.absent()
    assert ops.result(finished=False)['changed'] is False and os.path.exists(os.path.join(shm, 'a'))


# -- present ---------------------------------------------------------------------------------------


def test_present_creates_the_file_exclusively_and_is_idempotent(shm, server_proc):
    fake = FakeTriton(shm)
    res = run(
        fake,
        shm,
        server_proc.pid,
        state='present',
        name=['in0'],
        key='/in0',
        offset=KIB,
        byte_size=4 * KIB,
        create_file=True,
    )
    path = os.path.join(shm, 'in0')
    assert res['changed'] is True and res['registered'] == ['in0'] and res['created_files'] == [path]
    st = os.lstat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 5 * KIB
    assert [r['name'] for r in res['regions']] == ['in0']
    again = run(
        fake,
        shm,
        server_proc.pid,
        state='present',
        name=['in0'],
        key='/in0',
        offset=KIB,
        byte_size=4 * KIB,
        create_file=True,
    )
    assert again['changed'] is False and again['created_files'] == [] and os.lstat(path).st_ino == st.st_ino


def test_present_changed_spec_re_registers_with_diff(shm, server_proc):
    make_file(shm, 'in0', size=8 * KIB)
    fake = FakeTriton(shm, regions=[region('in0', byte_size=4 * KIB)])
    res = run(fake, shm, server_proc.pid, state='present', name=['in0'], key='/in0', byte_size=8 * KIB)
    assert res['changed'] is True and res['unregistered'] == ['in0'] and res['registered'] == ['in0']
    assert res['diff']['before']['regions'] == [region('in0', byte_size=4 * KIB)]
    assert res['diff']['after']['regions'] == [region('in0', byte_size=8 * KIB)]
    assert fake.regions['in0']['byte_size'] == 8 * KIB


def test_a_refused_re_register_restores_the_previous_spec(shm, server_proc):
    make_file(shm, 'in0', size=8 * KIB)
    fake = FakeTriton(shm, regions=[region('in0', byte_size=4 * KIB)], refuse_register={('in0', 8 * KIB)})
    ops = RegionOps(
        fake,
        params(shm, server_proc.pid, state='present', name=['in0'], key='/in0', byte_size=8 * KIB),
        warn=lambda m: None,
    )
    with pytest.raises(TritonError, match='previous spec was registered again'):
        ops.present()
    assert fake.regions['in0'] == region('in0', byte_size=4 * KIB)
    assert ops.result(finished=False)['changed'] is False


def test_a_refused_register_takes_back_the_file_it_created(shm, server_proc):
    fake = FakeTriton(shm, refuse_register={('in0', KIB)})
    ops = RegionOps(
        fake,
        params(shm, server_proc.pid, state='present', name=['in0'], key='/in0', byte_size=KIB, create_file=True),
        warn=lambda m: None,
    )
    with pytest.raises(TritonError, match='Unable to open'):
        ops.present()
    assert (
        os.listdir(shm) == []
        and ops.result(finished=False)['created_files'] == []
        and ops.result(finished=False)['changed'] is False
    )


def test_present_check_mode_creates_and_registers_nothing(shm, server_proc):
    fake = FakeTriton(shm)
    res = run(
        fake,
        shm,
        server_proc.pid,
        check_mode=True,
        state='present',
        name=['in0'],
        key='/in0',
        byte_size=KIB,
        create_file=True,
    )
    assert (
        res['changed'] is True and res['registered'] == ['in0'] and res['created_files'] == [os.path.join(shm, 'in0')]
    )
    assert os.listdir(shm) == [] and fake.actions() == []
    assert res['regions'] == [region('in0', byte_size=KIB)]


@pytest.mark.parametrize(
    'setup,kw,error,why',
    [
        ('none', dict(byte_size=KIB), shm_fs.ShmFsError, 'does not exist'),
        ('small', dict(byte_size=4 * KIB, offset=KIB), shm_fs.ShmFsError, r'past the end of .* \(4096 bytes\)'),
        ('symlink', dict(byte_size=KIB), shm_fs.ShmFsError, 'is a symlink, not a regular file'),
        ('fifo', dict(byte_size=KIB), shm_fs.ShmFsError, 'is a fifo, not a regular file'),
        ('small', dict(byte_size=0), ParameterError, 'byte_size must be a positive'),
        ('small', dict(byte_size=-5), ParameterError, 'byte_size must be a positive'),
        ('small', dict(byte_size=KIB, offset=-1), ParameterError, 'offset must be 0 or more'),
    ],
)
def test_present_errors_touch_nothing(shm, server_proc, tmp_path, setup, kw, error, why):
    path = os.path.join(shm, 'in0')
    target = tmp_path / 'outside'
    target.write_bytes(b'y' * 8192)
    if setup == 'small':
        make_file(shm, 'in0', size=4 * KIB)
    elif setup == 'symlink':
        os.symlink(str(target), path)
    elif setup == 'fifo':
        os.mkfifo(path)
    fake = FakeTriton(shm)
    before = snapshot(shm)
    with pytest.raises(error, match=why):
        run(fake, shm, server_proc.pid, state='present', name=['in0'], key='/in0', **kw)
    assert fake.actions() == [] and snapshot(shm) == before and target.read_bytes() == b'y' * 8192


def test_create_file_without_a_known_shm_directory_fails_before_any_call(shm):
    """Nothing listens on the fake's port 9 and no server_pid or shm_dir is given: there is nowhere to create the file."""
    fake = FakeTriton(shm)
    with pytest.raises(ServerNotFound, match="create_file needs the server's shm directory, which was not found"):
        run(fake, None, None, state='present', name=['in0'], key='/in0', byte_size=KIB, create_file=True)
    assert fake.actions() == [] and os.listdir(shm) == []


def test_cuda_register_refusal_carries_the_servers_message(shm, server_proc):
    fake = FakeTriton(shm)
    ops = RegionOps(
        fake,
        params(
            shm,
            server_proc.pid,
            state='present',
            kind='cuda',
            name=['g'],
            raw_handle='AAAA',
            device_id=0,
            byte_size=KIB,
        ),
        warn=lambda m: None,
    )
    with pytest.raises(TritonError, match='failed to register shared memory region: invalid args'):
        ops.present()
    assert ops.result(finished=False)['changed'] is False


def test_cuda_present_registers_the_given_handle_over_a_listed_region_of_the_same_spec(shm, server_proc):
    """Issue 29: the status never shows a CUDA region's handle, so a leftover of the same name, device and size (a dead
    client's handle) is not proof of the given one: the given raw_handle is always registered, the listed one first
    unregistered. Every run is a change, check mode included."""
    fake = FakeTriton(shm, cuda=[dict(name='g', device_id=0, byte_size=KIB)], cuda_handles={'g': 'T0xE'})
    args = dict(state='present', kind='cuda', name=['g'], raw_handle='TkVX', device_id=0, byte_size=KIB)
    checked = run(fake, shm, server_proc.pid, check_mode=True, **args)
    assert checked['changed'] is True and checked['registered'] == ['g'] and fake.actions() == []
    assert fake.cuda_handles == {'g': 'T0xE'}
    res = run(fake, shm, server_proc.pid, **args)
    assert res['changed'] is True and res['registered'] == ['g'] and res['unregistered'] == ['g'], res
    assert fake.cuda_handles == {'g': 'TkVX'} and res['regions'] == [dict(name='g', device_id=0, byte_size=KIB)]
    assert [c[:3] for c in fake.actions()] == [('unregister', 'cuda', 'g'), ('register', 'cuda', 'g')]
    assert res['diff'] == {
        'before': {'regions': [dict(name='g', device_id=0, byte_size=KIB)]},
        'after': {'regions': [dict(name='g', device_id=0, byte_size=KIB)]},
    }


def test_a_refused_cuda_handle_over_a_listed_region_says_what_happened_why_and_what_to_do(shm, server_proc):
    fake = FakeTriton(shm, cuda=[dict(name='g', device_id=0, byte_size=KIB)])  # refuses every CUDA register
    with pytest.raises(TritonError) as err:
        run(
            fake,
            shm,
            server_proc.pid,
            state='present',
            kind='cuda',
            name=['g'],
            raw_handle='TkVX',
            device_id=0,
            byte_size=KIB,
        )
    msg = err.value.msg
    assert 'failed to register shared memory region: invalid args' in msg and 'the region is now unregistered' in msg
    assert "Triton's status never shows a CUDA region's IPC handle" in msg and 'cudaIpcGetMemHandle' in msg
    assert fake.cuda == {}


def test_a_re_register_of_a_region_in_use_says_it_kept_its_spec_and_what_to_do(shm, server_proc):
    make_file(shm, 'in0')
    fake = FakeTriton(shm, regions=[region('in0', byte_size=KIB)], in_use={'in0': -1})
    with pytest.raises(TritonError) as err:
        run(fake, shm, server_proc.pid, state='present', name=['in0'], key='/in0', byte_size=2 * KIB, in_use_timeout=1)
    msg = err.value.msg
    assert msg.startswith("re-register system region 'in0': it stays in use: Triton refused to unregister")
    assert 'requests are in flight' in msg and 'keeps its current spec' in msg and 'in_use_timeout' in msg
    assert fake.regions['in0']['byte_size'] == KIB


def test_cuda_absent_named_and_stale(shm, cuda_server_proc, monkeypatch):
    """stale=true takes a CUDA region only when the CUDA rule calls it stale (test_cuda_rule.py has the rule): not when
    NVML cannot be read, and yes when NVML lists no context but the server's on the GPU (a killed client's region,
    CUDA-FACTS.md fact 5). A name is unregistered whatever its state."""
    fake = FakeTriton(
        shm, cuda=[dict(name='g', device_id=0, byte_size=KIB), dict(name='h', device_id=0, byte_size=KIB)]
    )
    monkeypatch.setattr(nvml, 'read', lambda: nvml.Reading((), 'NVML cannot be loaded (no GPU here)'))
    warnings = []
    ops = RegionOps(fake, params(shm, cuda_server_proc.pid, kind='cuda', stale=True), warn=warnings.append)
    ops.absent()
    assert ops.result(finished=False)['changed'] is False and set(fake.cuda) == {'g', 'h'}
    assert any('leaves 2 CUDA region(s) that are not stale' in w and 'NVML cannot be loaded' in w for w in warnings)
    only_the_server = nvml.Gpu(0, 0, 'GPU-0', False, (nvml.GpuProcess(cuda_server_proc.pid, 1606 << 20),))
    monkeypatch.setattr(nvml, 'read', lambda: nvml.Reading((only_the_server,)))
    res = run(fake, shm, cuda_server_proc.pid, kind='cuda', stale=True)
    assert res['unregistered'] == ['g', 'h'] and fake.cuda == {}
    fake.cuda['g'] = dict(name='g', device_id=0, byte_size=KIB)
    monkeypatch.setattr(nvml, 'read', lambda: nvml.Reading((), 'NVML cannot be loaded (no GPU here)'))
    res = run(fake, shm, cuda_server_proc.pid, kind='cuda', name=['g'])
    assert res['unregistered'] == ['g'] and fake.cuda == {}
    assert run(fake, shm, cuda_server_proc.pid, kind='cuda', name=['g'])['changed'] is False


def test_a_cuda_run_reads_the_server_and_holds_its_lock_like_system_memory(shm, server_proc, tmp_path):
    """Issue 35, goal 2: a kind is an object; kind=cuda reads the snapshot and takes the per-server lock (the CUDA rule
    of issue 34 decides from holders read under it). Before, kind=cuda read the status alone and took no lock."""
    fake = FakeTriton(shm, cuda=[dict(name='g', device_id=0, byte_size=KIB)])
    ops = RegionOps(
        fake,
        params(shm, server_proc.pid, kind='cuda', name=['g']),
        warn=lambda m: None,
        serialise=True,
        lock_dir=str(tmp_path),
    )
    locked = []
    fake.on_unregister = lambda name: locked.append(ops.lock is not None)
    ops.run()
    res = ops.result()
    assert locked == [True] and ops.lock is None, 'the unregister ran under the lock, released at the end'
    assert res['unregistered'] == ['g'] and res['regions'] == [] and fake.cuda == {}
    assert res['holders_complete'] is True and res['pid_namespace'] == 'initial'
    assert ('metadata',) in fake.calls and ('status', 'system') not in fake.calls, 'the one list of its kind'


def test_a_deferred_cuda_unregister_is_pending_like_a_system_one(shm, server_proc):
    """Triton 24.12+ keeps an unregistered region listed while requests are in flight, for CUDA regions too: the run
    says pending, as for system memory (before, kind=cuda reported it unregistered and never looked again)."""
    fake = FakeTriton(shm, cuda=[dict(name='g', device_id=0, byte_size=KIB)])
    listed = dict(name='g', device_id=0, byte_size=KIB)
    fake.on_unregister = lambda name: fake.cuda.setdefault(name, dict(listed))  # still listed after the unregister
    res = run(fake, shm, server_proc.pid, kind='cuda', name=['g'], in_use_timeout=1)
    assert res['pending'] == ['g'] and res['unregistered'] == [] and res['changed'] is True
    assert 'still listed' in res['skipped_items'][0]['reason']


def test_region_ops_and_region_plan_have_no_branch_on_a_kind_name():
    root = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'plugins', 'module_utils')
    for name in ('run/region_ops.py', 'run/region_calls.py', 'run/file_ops.py', 'rules/region_plan.py'):
        with open(os.path.join(root, name)) as f:
            code = f.read()
        assert "kind == 'cuda'" not in code and "kind'] == 'cuda'" not in code, name
        assert "== 'system'" not in code and "!= 'system'" not in code, name


# -- reserved regions, Triton versions beyond 2.51, overlapping runs ------------------------------------

MARK = 'trusted.tritonops_shm.reserved'
# Triton 24.12 and later, registering a name that is still listed (deferred unregister)
ALREADY = "shared memory region '%s' already in manager"


class DeferringTriton(FakeTriton):
    """Triton >= 24.12: an unregister succeeds, the region stays listed for `defer[name]` more status reads."""

    def __init__(self, shm_dir, defer, version='2.53.0', **kw):
        super().__init__(shm_dir, **kw)
        self.defer = dict(defer)
        self.leaving = {}
        self.version = version

    def server_metadata(self):
        meta = super().server_metadata()
        meta['version'] = self.version
        return meta

    def status(self, kind):
        out = super().status(kind)
        for name in sorted(self.leaving):
            left = self.leaving[name]
            if left == 0:
                del self.leaving[name]
                continue
            self.leaving[name] = left - 1 if left > 0 else left
            out.append(dict(self.leaving_spec[name]))
        return out

    def unregister(self, kind, name):
        spec = self.regions.get(name)
        super().unregister(kind, name)
        if spec is not None and name in self.defer:
            self.leaving_spec = getattr(self, 'leaving_spec', {})
            self.leaving_spec[name] = spec
            self.leaving[name] = self.defer.pop(name)

    def register_system(self, name, key, offset, byte_size):
        if name in self.leaving:
            msg = ALREADY % name
            self.calls.append(('register', 'system', name, key, offset, byte_size))
            raise TritonError(
                f"register system region '{name}' at {self.base}: HTTP 400: {msg}",
                url=self.base,
                status=400,
                server_error=msg,
            )
        super().register_system(name, key, offset, byte_size)


def _unlinked_while_listed(fake, shm_dir):
    """Names whose file was gone while the fake still listed them (invariant 2)."""
    bad = []
    real_status = fake.status

    def status(kind):
        out = real_status(kind)
        bad.extend(r['name'] for r in out if not os.path.exists(os.path.join(shm_dir, r['key'].lstrip('/'))))
        return out

    fake.status = status
    return bad


def test_deferred_unregister_waits_until_the_region_is_gone_before_unlinking(shm, server_proc):
    for name in ('a', 'b'):
        make_file(shm, name)
    fake = DeferringTriton(shm, defer={'a': 3}, regions=[region('a'), region('b')])
    bad = _unlinked_while_listed(fake, shm)
    clock = FakeClock()
    res = run(fake, shm, server_proc.pid, clock=clock, stale=True)
    assert res['unregistered'] == ['a', 'b'] and os.listdir(shm) == []
    assert sorted(os.path.basename(p) for p in res['removed_files']) == ['a', 'b']
    assert bad == [] and clock.sleeps, 'the status was polled until a was gone, and no file went while listed'
    assert res['warnings'] == []


def test_deferred_unregister_past_in_use_timeout_keeps_the_file_and_says_why(shm, server_proc):
    make_file(shm, 'busy')
    fake = DeferringTriton(shm, defer={'busy': -1}, regions=[region('busy')])
    bad = _unlinked_while_listed(fake, shm)
    clock = FakeClock()
    res = run(fake, shm, server_proc.pid, clock=clock, stale=True, in_use_timeout=2)
    # pending, not unregistered: the server accepted the unregister but still lists the region
    assert res['unregistered'] == [] and res['pending'] == ['busy'] and res['changed'] is True
    assert res['removed_files'] == [] and os.listdir(shm) == ['busy']
    assert 'still listed by the server after 2' in reasons(res, 'name')['busy']
    assert "region 'busy' is still registered" in reasons(res, 'path')[os.path.join(shm, 'busy')]
    assert any('still listed' in w for w in res['warnings'])
    assert bad == [] and 1.5 <= sum(clock.sleeps) <= 2.0


def test_deferred_unregister_before_re_registering_a_changed_spec(shm, server_proc):
    make_file(shm, 'in0', size=128 * KIB)
    fake = DeferringTriton(shm, defer={'in0': 2}, regions=[region('in0', byte_size=64 * KIB)])
    res = run(fake, shm, server_proc.pid, state='present', name=['in0'], key='/in0', byte_size=128 * KIB)
    assert res['registered'] == ['in0'] and fake.regions['in0']['byte_size'] == 128 * KIB
    registers = [c for c in fake.calls if c[0] == 'register']
    assert len(registers) == 1, 'registered once, after the old spec left the status (no "already in manager")'


def test_deferred_unregister_that_never_ends_is_not_registered_again(shm, server_proc):
    make_file(shm, 'in0', size=128 * KIB)
    fake = DeferringTriton(shm, defer={'in0': -1}, regions=[region('in0', byte_size=64 * KIB)])
    with pytest.raises(TritonError) as err:
        run(
            fake, shm, server_proc.pid, state='present', name=['in0'], key='/in0', byte_size=128 * KIB, in_use_timeout=1
        )
    assert 'still listed after 1' in err.value.msg and 'run again later' in err.value.msg
    assert not [c for c in fake.calls if c[0] == 'register']
    assert os.path.exists(os.path.join(shm, 'in0'))


def test_a_new_registration_of_the_same_name_is_not_a_deferred_one(shm, server_proc):
    """A client registering the cleaned name again (another key) must not keep the old file."""
    make_file(shm, 'old')
    make_file(shm, 'new')

    def reregister(name):
        fake.regions[name] = region(name, key='/new')

    fake = FakeTriton(shm, regions=[region('dead', key='/old')], on_unregister=reregister)
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['unregistered'] == ['dead'] and res['removed_files'] == [os.path.join(shm, 'old')]
    assert os.listdir(shm) == ['new']


@pytest.mark.parametrize(
    'key, why',
    [
        ('/triton_python_backend_shm_region_7', 'reserves for its python backend'),
        ('/mybackend_3', 'matches backend_patterns'),
    ],
)
def test_keys_of_backend_files_are_refused_before_any_call(shm, server_proc, key, why):
    fake = FakeTriton(shm)
    with pytest.raises(ParameterError) as err:
        run(
            fake,
            shm,
            server_proc.pid,
            state='present',
            name=['x'],
            key=key,
            byte_size=KIB,
            create_file=True,
            backend_patterns=['triton_python_backend_shm_region_*', 'mybackend_*'],
        )
    assert why in str(err.value) and 'choose another key' in str(err.value)
    assert fake.calls == [] and os.listdir(shm) == []


@pytest.mark.parametrize('version, warned', [('2.48.0', True), ('2.49.1', True), ('2.50.0', False), ('2.51.0', False)])
def test_unregistering_a_held_region_warns_on_servers_older_than_2_50(shm, server_proc, version, warned):
    path = make_file(shm, 'live')
    with open(path, 'r+b') as f:  # this test process is the live client
        held = mmap.mmap(f.fileno(), 0)
    try:
        fake = DeferringTriton(shm, defer={}, version=version, regions=[region('live'), region('other')])
        make_file(shm, 'other')
        res = run(fake, shm, server_proc.pid, name=['live', 'other'])
    finally:
        held.close()
    crash = [w for w in res['warnings'] if '#3207' in w]
    assert bool(crash) is warned
    if warned:
        assert 'older than 2.50' in crash[0] and 'live' in crash[0] and 'other' not in crash[0].split('region(s)')[1]


def _mark(path, name):
    os.setxattr(path, MARK, name.encode())


@pytest.fixture
def xattrs(shm):
    try:
        _mark(make_file(shm, '.probe'), 'x')
    except OSError as exc:
        pytest.skip(f'no trusted.* extended attributes here: {exc}')
    os.unlink(os.path.join(shm, '.probe'))


def test_registering_marks_the_file_and_stale_never_selects_it(shm, server_proc, xattrs):
    res = run(
        FakeTriton(shm),
        shm,
        server_proc.pid,
        state='present',
        name=['warm'],
        key='/warm',
        byte_size=KIB,
        create_file=True,
    )
    path = os.path.join(shm, 'warm')
    assert res['marked_files'] == [path] and os.getxattr(path, MARK) == b'warm'
    fake = FakeTriton(shm, regions=[region('warm', byte_size=KIB)])
    again = run(
        fake, shm, server_proc.pid, state='present', name=['warm'], key='/warm', byte_size=KIB, create_file=True
    )
    assert again['changed'] is False and again['marked_files'] == []
    stale = run(fake, shm, server_proc.pid, stale=True)
    assert stale['changed'] is False and 'warm' in fake.regions and os.path.exists(path)
    dry = run(fake, shm, server_proc.pid, reserved=True, check_mode=True)
    assert dry['unregistered'] == ['warm'] and 'warm' in fake.regions
    gone = run(fake, shm, server_proc.pid, reserved=True)
    assert gone['unregistered'] == ['warm'] and gone['removed_files'] == [path] and fake.regions == {}


def test_marking_that_fails_is_a_warning_not_a_failure(shm, server_proc, monkeypatch):
    def refuse(*_args):
        raise OSError(95, 'Operation not supported')

    monkeypatch.setattr(os, 'setxattr', refuse)
    fake = FakeTriton(shm)
    res = run(fake, shm, server_proc.pid, state='present', name=['warm'], key='/warm', byte_size=KIB, create_file=True)
    assert res['registered'] == ['warm'] and res['marked_files'] == [] and 'warm' in fake.regions
    assert any('could not be marked' in w and 'Operation not supported' in w for w in res['warnings'])


def test_a_file_another_run_removed_first_is_not_counted(shm, server_proc):
    for name in ('a', 'b'):
        make_file(shm, name)

    def other_run_unlinks(name):
        if name == 'b':
            os.unlink(os.path.join(shm, 'a'))  # another job got to a's file first

    fake = FakeTriton(shm, regions=[region('a'), region('b')], on_unregister=other_run_unlinks)
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['removed_files'] == [os.path.join(shm, 'b')] and res['freed_bytes'] == 64 * KIB
    assert 'already removed' in reasons(res, 'path')[os.path.join(shm, 'a')]


@pytest.mark.parametrize('version, removed', [('2.51.0', True), ('2.53.0', False)])
def test_a_status_lost_after_unregistering_keeps_files_only_where_unregisters_may_be_deferred(
    shm, server_proc, version, removed
):
    make_file(shm, 'a')
    make_file(shm, 'b')
    fake = DeferringTriton(shm, defer={}, version=version, regions=[region('a'), region('b')], fail_unregister_at=2)
    real_status = fake.status

    def status(kind):
        if fake.unregister_calls:
            raise TritonError(
                f'read system shared memory status at {fake.base}: no answer within 2s (timeout)', url=fake.base
            )
        return real_status(kind)

    fake.status = status
    with pytest.raises(TritonError):
        run(fake, shm, server_proc.pid, stale=True)
    # 'a' was unregistered (answered) before the connection was lost
    assert 'a' not in fake.regions
    assert os.path.exists(os.path.join(shm, 'a')) is not removed
    assert os.path.exists(os.path.join(shm, 'b'))


def test_backend_leftovers_removes_only_unheld_old_backend_files_through_the_removal_path(
    shm, server_proc, wait_older, keep_young
):
    """Issue 27: a backend file no process holds is a dead server's pool; one any process maps stays, as does a young one."""
    dead = make_file(shm, 'triton_python_backend_shm_region_dead')
    vllm = make_file(shm, 'triton_vllm_backend_shm_region_dead')
    held = make_file(shm, 'triton_python_backend_shm_region_live')
    wait_older([dead, vllm, held], AGED)
    young = keep_young(make_file(shm, 'triton_python_backend_shm_region_young'))
    with open(held, 'r+b') as f:
        mapping = mmap.mmap(f.fileno(), 0)  # this test process maps it, as a stub maps its pool
    try:
        fake = FakeTriton(shm)
        off = run(fake, shm, server_proc.pid, stale=True)
        assert off['removed_files'] == [] and off['changed'] is False
        dry = run(fake, shm, server_proc.pid, check_mode=True, backend_leftovers=True, min_age=AGED)
        assert sorted(dry['removed_files']) == [dead, vllm] and dry['changed'] is True
        assert all(os.path.exists(p) for p in (dead, vllm, young, held))
        res = run(fake, shm, server_proc.pid, backend_leftovers=True, inventory=True, min_age=AGED)
        assert sorted(res['removed_files']) == [dead, vllm] and res['freed_bytes'] == 2 * 64 * KIB
        assert not os.path.exists(dead) and not os.path.exists(vllm) and os.path.exists(young) and os.path.exists(held)
        cats = {f['name']: f['category'] for f in res['before']['files']}
        assert cats == {
            'triton_python_backend_shm_region_dead': 'leftover',
            'triton_vllm_backend_shm_region_dead': 'leftover',
            'triton_python_backend_shm_region_young': 'backend',
            'triton_python_backend_shm_region_live': 'backend',
        }
        assert res['after']['summary']['leftover_files'] == 0
        again = run(fake, shm, server_proc.pid, backend_leftovers=True, min_age=AGED)
        assert again['removed_files'] == [] and again['changed'] is False
        assert fake.actions() == []  # no region was touched
    finally:
        mapping.close()


def test_a_leftover_held_by_the_time_of_the_unlink_is_kept(shm, server_proc, monkeypatch, wait_older):
    """The re-check right before the unlink: a process that maps the pool after the plan keeps it."""
    pool = make_file(shm, 'triton_python_backend_shm_region_x')
    wait_older([pool], AGED)
    st = os.stat(pool)  # by (dev, inode): at the re-check the file is under its quarantine name
    kept = []
    real = holders.scan

    def scan(targets, **kwargs):
        result = real(targets, **kwargs)
        if kept:  # the second scan, the re-check: a stub has mapped it since
            result.holders.setdefault((st.st_dev, st.st_ino), set()).add(server_proc.pid + 1)
        kept.append(1)
        return result

    monkeypatch.setattr(holders, 'scan', scan)
    res = run(FakeTriton(shm), shm, server_proc.pid, backend_leftovers=True, min_age=AGED)
    assert res['removed_files'] == [] and os.path.exists(pool)
    assert [s['path'] for s in res['skipped_items']] == [pool]
    assert 're-checked before removal' in res['skipped_items'][0]['reason']


def test_a_file_read_written_renamed_or_chmodded_since_is_young_whatever_its_mtime(shm, server_proc, wait_older):
    """Issue 42, goal 8: a file's age counts from the newest of its atime, mtime and ctime, as systemd-tmpfiles ages
    files. An orphan, a leftover pool or a family's file whose mtime was set back an hour, but that was read, chmod'ed
    or renamed since (or whose mtime was just set back: that is a ctime change too), is young at min_age 60; one whose
    three times are all older than min_age goes."""
    groups = {'client_input_': 'orphan', facts.BACKEND_PREFIX: 'leftover', 'nccl-': 'nccl'}
    hour_ago = time.time() - 3600
    paths = {}
    for prefix in groups:
        for what in ('old', 'read', 'chmod', 'torename', 'backdated'):
            paths[prefix + what] = make_file(shm, prefix + what)
            os.utime(paths[prefix + what], (hour_ago, hour_ago))
    wait_older(paths.values(), AGED)
    for prefix in groups:
        read = paths[prefix + 'read']
        with open(read, 'rb') as f:
            f.read(1)
        assert os.stat(read).st_atime > hour_ago + 1, 'reading it set its atime (relatime: atime was not after mtime)'
        os.chmod(paths[prefix + 'chmod'], 0o640)
        os.rename(paths[prefix + 'torename'], os.path.join(shm, prefix + 'renamed'))
        os.utime(paths[prefix + 'backdated'], (hour_ago, hour_ago))
    fake = FakeTriton(shm)
    asked = dict(orphan_files=True, orphan_patterns=['client_input_*'], backend_leftovers=True, families=['nccl'])
    res = run(fake, shm, server_proc.pid, min_age=AGED, **asked)  # first: the touched files are younger than AGED
    assert sorted(res['removed_files']) == sorted(paths[prefix + 'old'] for prefix in groups)
    young = run(fake, shm, server_proc.pid, check_mode=True, inventory=True, min_age=60, **asked)
    assert young['removed_files'] == [] and young['changed'] is False, young['removed_files']
    ages = {f['name']: f['age_from'] for f in young['before']['files']}
    for prefix in groups:
        for what in ('read', 'chmod', 'renamed', 'backdated'):
            assert os.path.exists(os.path.join(shm, prefix + what)), prefix + what
        assert (ages[prefix + 'read'], ages[prefix + 'chmod'], ages[prefix + 'renamed']) == ('atime', 'ctime', 'ctime')


def test_backend_leftovers_is_for_system_files_only(shm, server_proc):
    with pytest.raises(ParameterError, match='backend_leftovers applies to kind=system only'):
        run(FakeTriton(shm), shm, server_proc.pid, kind='cuda', backend_leftovers=True)


# -- issue 26: files marked before the unregister, quarantined before the unlink -----------------------


def _cleanup_mark(path):
    return shm_fs.read_cleanup_record(os.path.dirname(path)).get(os.lstat(path).st_ino)


def test_files_are_marked_before_their_regions_are_unregistered_and_unmarked_once_removed(shm, server_proc):
    path = make_file(shm, 'a')
    seen = []
    fake = FakeTriton(shm, regions=[region('a')], on_unregister=lambda name: seen.append(_cleanup_mark(path)))
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['removed_files'] == [path]
    assert seen[0] is not None and seen[0].region == 'a' and seen[0].name == 'a'
    assert seen[0].server == snapshot_mod.server_identity(server_proc.pid)
    assert shm_fs.read_cleanup_record(shm) == {}


def test_a_region_kept_registered_loses_its_mark(shm, server_proc):
    path = make_file(shm, 'a')
    fake = FakeTriton(shm, regions=[region('a')], in_use={'a': -1})
    res = run(fake, shm, server_proc.pid, stale=True, in_use_timeout=0)
    assert os.path.exists(path) and res['removed_files'] == [] and _cleanup_mark(path) is None


def _killed_run_left(shm, name, server, quarantined=False):
    """A file as a run killed after its unregister leaves it: recorded, no longer registered."""
    path = make_file(shm, name)
    st = os.lstat(path)
    with shm_fs.ShmDir(shm) as d:
        d.write_cleanup_record({st.st_ino: shm_fs.CleanupMark(name, name, server)})
        if quarantined:
            q = d.quarantine(name, st.st_dev, st.st_ino)
            return os.path.join(shm, q.name)
    return path


@pytest.mark.parametrize('quarantined', [False, True])
def test_a_rerun_finishes_what_a_killed_run_left_and_info_says_why(shm, server_proc, quarantined):
    left = _killed_run_left(shm, 'a', snapshot_mod.server_identity(server_proc.pid), quarantined)
    fake = FakeTriton(shm, regions=[])
    snap = snapshot_mod.read_server(fake, server_pid=server_proc.pid, shm_dir=shm)
    files = {f['path']: f for f in classification.classify(snap).files}
    assert files[left]['category'] == 'orphan' and 'stopped before removing' in files[left]['category_reason']
    assert run(fake, shm, server_proc.pid, stale=True, check_mode=True)['removed_files'] == [left]
    assert os.path.exists(left)
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['removed_files'] == [left] and os.listdir(shm) == [] and shm_fs.read_cleanup_record(shm) == {}
    assert run(fake, shm, server_proc.pid, stale=True)['changed'] is False


def test_a_mark_of_another_server_process_is_left_to_orphan_patterns(shm, server_proc):
    left = _killed_run_left(shm, 'a', '1:1')  # a server that has since restarted
    fake = FakeTriton(shm, regions=[])
    res = run(fake, shm, server_proc.pid, stale=True)
    assert res['changed'] is False and os.path.exists(left)
    snap = snapshot_mod.read_server(fake, server_pid=server_proc.pid, shm_dir=shm)
    assert classification.classify(snap).files[0]['category'] == 'foreign'


def test_a_held_quarantined_file_goes_back_to_its_name_or_stays_when_the_name_is_taken(shm, server_proc, monkeypatch):
    paths = [make_file(shm, 'a'), make_file(shm, 'b')]
    maps = []
    real_rescan = snapshot_mod.rescan

    def attach_then_rescan(snap, *a, **kw):  # in the window: a client holds a's file, b's name is taken again
        for name in ('a', 'b'):
            q = [
                n
                for n in os.listdir(shm)
                if facts.is_quarantine_name(n) and os.lstat(os.path.join(shm, n)).st_ino == snap.entry(name)['inode']
            ][0]
            with open(os.path.join(shm, q), 'r+b') as f:
                maps.append(mmap.mmap(f.fileno(), 0))
        make_file(shm, 'b', size=KIB)
        return real_rescan(snap, *a, **kw)

    monkeypatch.setattr(snapshot_mod, 'rescan', attach_then_rescan)
    fake = FakeTriton(shm, regions=[region('a'), region('b')])
    try:
        res = run(fake, shm, server_proc.pid, stale=True)
    finally:
        for m in maps:
            m.close()
    assert res['removed_files'] == []
    why = reasons(res, 'path')
    assert why[paths[0]].startswith(f'held by {os.getpid()}') and 're-checked before removal' in why[paths[0]]
    assert _cleanup_mark(paths[0]) is None and os.path.getsize(paths[0]) == 64 * KIB
    assert 'stays under' in why[paths[1]] and os.path.getsize(paths[1]) == KIB
    kept = [n for n in os.listdir(shm) if facts.is_quarantine_name(n)]
    assert len(kept) == 1 and any('created again' in w for w in res['warnings'])
    # the one left in quarantine stays recorded: a later stale cleanup removes it once nobody holds it
    assert _cleanup_mark(os.path.join(shm, kept[0])).name == 'b'
    snap = snapshot_mod.read_server(fake, server_pid=server_proc.pid, shm_dir=shm)
    assert snap.leftover(kept[0]) is not None


# -- attacks where the pieces meet: two root runs that overlap -------------------------------------------------------


def test_two_root_runs_that_overlap_keep_each_others_record(shm, server_proc):
    """Two root runs that do not share a lock: one on the host (its lock in the host's /run) and one inside the
    server's container (its own /run), both acting at once. B records its file, unregisters its region and is
    SIGKILLed before its unlink while A is still running. A's end must not write back its own stale copy of the
    record: B's file stays recorded, and the next stale cleanup finishes it. (Before issue 33 the same overlap came
    from a flock that another user squatted on the shm directory.)"""
    pid = server_proc.pid
    for name in ('a', 'b'):
        make_file(shm, name)
    fake = FakeTriton(shm, regions=[region('a'), region('b')])

    def b_records_unregisters_and_is_killed(name):
        if name != 'a':
            return
        ops_b = RegionOps(fake, params(shm, pid, name=['b']), warn=lambda m: None, serialise=False)
        snap_b = snapshot_mod.read_server(fake, server_pid=pid, shm_dir=shm, on_located=ops_b._located)
        recs = classification.classify(snap_b)
        plan_b = region_plan.plan_absent(snap_b, recs, ops_b.params, ops_b.criteria, fake.unaddressable)
        ops_b._mark_files(snap_b, plan_b.files)
        fake.regions.pop('b')  # B's unregister answered; SIGKILL: no unlink, no end of run

    fake.on_unregister = b_records_unregisters_and_is_killed
    res = run(fake, shm, pid, name=['a'], serialise=True)
    assert res['removed_files'] == [os.path.join(shm, 'a')]
    b_ino = os.lstat(os.path.join(shm, 'b')).st_ino
    assert b_ino in shm_fs.read_cleanup_record(shm), "A's end erased the record of B's file"
    fake.on_unregister = None
    again = run(fake, shm, pid, stale=True, serialise=True)
    assert again['removed_files'] == [os.path.join(shm, 'b')] and shm_fs.read_cleanup_record(shm) == {}


def test_a_held_leftover_whose_name_is_taken_in_the_window_is_finished_by_a_later_cleanup(
    shm, server_proc, monkeypatch, wait_older
):
    """A failed rename-back: a leftover pool (no region, so not in the record) is mapped in the window and its name is
    created again meanwhile (any user can, in a 1777 /dev/shm). It stays under its quarantine name: it must be
    recorded then, or no later cleanup ever finishes it (a quarantine name matches no backend pattern)."""
    name = 'triton_python_backend_shm_region_x'
    wait_older([make_file(shm, name)], AGED)
    maps = []
    real_rescan = snapshot_mod.rescan

    def attach_then_rescan(snap, *a, **kw):
        q = [n for n in os.listdir(shm) if facts.is_quarantine_name(n)][0]
        with open(os.path.join(shm, q), 'r+b') as f:
            maps.append(mmap.mmap(f.fileno(), 0))
        make_file(shm, name, size=KIB)  # the name taken again (young: not a leftover itself)
        return real_rescan(snap, *a, **kw)

    monkeypatch.setattr(snapshot_mod, 'rescan', attach_then_rescan)
    try:
        res = run(FakeTriton(shm), shm, server_proc.pid, backend_leftovers=True, min_age=AGED)
    finally:
        monkeypatch.setattr(snapshot_mod, 'rescan', real_rescan)
        for m in maps:
            m.close()
    assert res['removed_files'] == [] and 'stays under' in res['skipped_items'][0]['reason']
    kept = [n for n in os.listdir(shm) if facts.is_quarantine_name(n)]
    assert len(kept) == 1
    # nobody holds it any more: the next cleanup (the role's: stale and backend_leftovers) finishes it, and only it
    again = run(FakeTriton(shm), shm, server_proc.pid, stale=True, backend_leftovers=True, min_age=AGED)
    assert again['removed_files'] == [os.path.join(shm, kept[0])], again
    assert os.listdir(shm) == [name] and shm_fs.read_cleanup_record(shm) == {}


# -- wedged regions (issue 42, goal 5) ------------------------------------------------------------------------


def _wedged_run(fake, shm, pid, lock_dir, clock=None):
    clock = clock or FakeClock()
    ops = RegionOps(
        fake,
        params(shm, pid, stale=True, wedged_after=3, in_use_timeout=2),
        warn=lambda m: None,
        sleep=clock.sleep,
        clock=clock.clock,
        serialise=True,
        lock_dir=lock_dir,
    )
    try:
        ops.run()
        return ops.result(), clock
    finally:
        ops.release()


def _state_of(shm, pid, lock_dir, name):
    snap = snapshot_mod.read_server(FakeTritonFor.last, server_pid=pid, shm_dir=shm, lock_dir=lock_dir)
    crit = classification.Criteria.of(wedged_after=3)
    return {r['name']: r for r in classification.classify(snap, crit).of('system')}[name]


class FakeTritonFor:
    last = None


@pytest.mark.parametrize('how', ['refused', 'deferred'])
def test_a_region_triton_will_not_let_go_is_wedged_after_three_runs_then_tried_once_a_run(
    shm, server_proc, tmp_path, how
):
    """Triton 2.53 and later: a leaked reference keeps a region in use (2.50-2.52: refused; 2.53+: deferred, listed)
    for good. Three stale cleanups that each leave it registered make it wedged (counted beside the run lock); the
    fourth tries it once, waiting for nothing, and reports why; once Triton lets it go, it is forgotten."""
    make_file(shm, 'w')
    fake = FakeTriton(shm, regions=[region('w')], in_use={'w': -1} if how == 'refused' else None)
    if how == 'deferred':
        listed = dict(region('w'))
        fake.on_unregister = lambda name: fake.regions.setdefault(name, dict(listed))
    FakeTritonFor.last = fake
    locks = str(tmp_path / 'locks')
    for run_no in (1, 2, 3):
        res, clock = _wedged_run(fake, shm, server_proc.pid, locks)
        assert 'w' in fake.regions and res['removed_files'] == [], res
        assert clock.sleeps, 'a stale region is waited for, up to in_use_timeout'
        assert _state_of(shm, server_proc.pid, locks, 'w')['state'] == ('wedged' if run_no == 3 else 'stale')
    rec = _state_of(shm, server_proc.pid, locks, 'w')
    assert '3 consecutive runs' in rec['state_reason'] and 'restart' in rec['state_reason'] and rec['reclaimable']
    calls = fake.unregister_calls
    res, clock = _wedged_run(fake, shm, server_proc.pid, locks)
    assert fake.unregister_calls == calls + 1 and clock.sleeps == [], 'tried once, nothing waited out'
    assert any('wedged' in i['reason'] or 'pending' in i['reason'] for i in res['skipped_items']), res
    # Triton lets it go at last (a restart, or the reference returned): unregistered, its file removed, forgotten
    fake.in_use.clear()
    fake.on_unregister = None
    res, _clock = _wedged_run(fake, shm, server_proc.pid, locks)
    assert res['unregistered'] == ['w'] and 'w' not in fake.regions
    assert not [n for n in os.listdir(locks) if n.endswith('.wedged.json')], 'the record is gone with the region'


# -- a server that stops answering between the unregisters and the unlinks (review of issue 41) -----------------------


class _StopsAfterUnregister(FakeTriton):
    """Answers the read, the unregisters and the status that shows them gone, then stops answering (a crash, a
    restart) before the holder re-check."""

    statuses_after = 0

    def status(self, kind):
        if self.unregister_calls:
            self.statuses_after += 1
        if self.statuses_after > 1:
            raise TritonError(
                f'status at {self.base}: cannot connect to Triton (refused or unreachable)', url=self.base
            )
        return super().status(kind)

    def server_metadata(self):
        if self.unregister_calls:
            raise TritonError(
                f'metadata at {self.base}: cannot connect to Triton (refused or unreachable)', url=self.base
            )
        return super().server_metadata()


def _quarantined(shm):
    return [n for n in os.listdir(shm) if facts.is_quarantine_name(n)]


@pytest.mark.parametrize('inventory', [False, True])
def test_the_files_of_unregistered_regions_go_even_when_the_server_stops_answering_before_the_recheck(
    shm, server_proc, inventory
):
    """The re-check needs the holders, not the server: with inventory (a full read of the server as the re-check) a
    server gone after its unregisters no longer leaves the file under its quarantine name, unreported."""
    path = make_file(shm, 'a')
    fake = _StopsAfterUnregister(shm, regions=[region('a')])
    warnings = []
    ops = RegionOps(
        fake,
        params(shm, server_proc.pid, stale=True, inventory=inventory),
        warn=warnings.append,
        sleep=FakeClock().sleep,
        clock=FakeClock().clock,
        serialise=False,
    )
    try:
        if inventory:
            with pytest.raises(TritonError):  # the state after cannot be read: the call fails, after its safe work
                ops.run()
        else:
            ops.run()
    finally:
        ops.release()
    res = ops.result(finished=not inventory)
    assert res['unregistered'] == ['a'] and res['removed_files'] == [path], res
    assert not os.path.exists(path) and _quarantined(shm) == []
    if inventory:
        assert any('the holders were re-checked alone' in w for w in warnings), warnings


def test_a_recheck_that_fails_gives_every_quarantined_file_its_name_back(shm, server_proc, monkeypatch):
    """No re-check, no unlink: a file already renamed to its quarantine name is renamed back and reported."""
    path = make_file(shm, 'a')

    def unreadable(_snap, *_a, **_k):
        raise OSError('proc went away')

    monkeypatch.setattr(snapshot_mod, 'rescan', unreadable)
    fake = _StopsAfterUnregister(shm, regions=[region('a')])
    ops = RegionOps(
        fake,
        params(shm, server_proc.pid, stale=True),
        sleep=FakeClock().sleep,
        clock=FakeClock().clock,
        serialise=False,
    )
    try:
        with pytest.raises(OSError, match='proc went away'):
            ops.run()
    finally:
        ops.release()
    res = ops.result(finished=False)
    assert os.path.exists(path) and _quarantined(shm) == [], sorted(os.listdir(shm))
    assert res['removed_files'] == [] and [s['path'] for s in res['skipped_items']] == [path]
    assert 'could not be checked again before the unlink: not removed' in res['skipped_items'][0]['reason']
