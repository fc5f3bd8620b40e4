"""Unit tests for module_utils/host/snapshot.py and classification.py: the read and the classification, on real files,
mappings and processes.

The "server" is a real process named tritonserver in its own mount namespace with a
private tmpfs on /dev/shm (as Triton in a container); it maps the registered files as
Triton does. "Clients" are real processes in that namespace that map or open files.
Only the Triton HTTP API is a fake (FakeTriton): the regions it reports are the test's.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import DiscoveryError, ShmFsError, TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.host import authority, discovery, nvml, snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.host.snapshot import Snapshot, read_server
from ansible_collections.tritonops.shm.plugins.module_utils.rules import facts
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import (
    Criteria,
    RegionFacts,
    classify,
    region_state,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules.results import info_result, summarize

# Only the tests that build a mount namespace need root; the others run as any user.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason='needs root: mount namespaces with a private /dev/shm')

MIB = 1 << 20
OLD = 3600
AGED = 2.0  # seconds: the scene's min_age; its old files are made, then waited for (wait_older), then its young one

# A process driven over stdin: "map NAME", "open NAME", "listen PORT"; answers OK or ERR.
HELPER = textwrap.dedent("""
    import ctypes, mmap, socket, sys
    ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
    keep = []
    print('READY', flush=True)
    for line in sys.stdin:
        cmd, _sep, arg = line.strip().partition(' ')
        try:
            if cmd == 'map':
                with open('/dev/shm/' + arg, 'r+b') as f:
                    keep.append(mmap.mmap(f.fileno(), 0))
            elif cmd == 'open':
                keep.append(open('/dev/shm/' + arg, 'rb'))
            elif cmd == 'listen':
                s = socket.socket()
                s.bind(('127.0.0.1', int(arg)))
                s.listen(1)
                keep.append(s)
            print('OK', flush=True)
        except Exception as exc:
            print(f'ERR {exc}', flush=True)
""")


class Proc:
    def __init__(self, cmd):
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.pid = self.proc.pid
        line = self.proc.stdout.readline().strip()
        if line != 'READY':
            self.kill()
            raise RuntimeError(f'helper did not start: {line!r} {self.proc.stderr.read()}')

    def do(self, *commands):
        for command in commands:
            self.proc.stdin.write(command + '\n')
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
            if answer != 'OK':
                raise RuntimeError(f'{command}: {answer}')
        return self

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Namespace:
    """A fake-Triton server process with a private /dev/shm, and clients inside its mount namespace."""

    def __init__(self):
        shell = 'mount -t tmpfs -o size=16m,mode=1777 tmpfs /dev/shm && exec "$0" "$@"'
        self.server = Proc(
            [
                'unshare',
                '--mount',
                '--propagation',
                'private',
                'sh',
                '-c',
                shell,
                sys.executable,
                '-c',
                HELPER,
                'tritonserver',
            ]
        )
        self.procs = [self.server]
        self.shm_dir = f'/proc/{self.server.pid}/root/dev/shm'

    def client(self, comm='client'):
        proc = Proc(['nsenter', '--mount', '--target', str(self.server.pid), sys.executable, '-c', HELPER, comm])
        self.procs.append(proc)
        return proc

    def path(self, name):
        return os.path.join(self.shm_dir, name)

    def write(self, name, size=4096):
        with open(self.path(name), 'wb') as f:
            f.write(b'\1' * size)
        return self.path(name)

    def close(self):
        for proc in self.procs:
            proc.kill()


class FakeTriton:
    """Only the HTTP API is fake: the metadata and region lists a real server would return."""

    def __init__(self, system=(), cuda=(), extensions=('system_shared_memory', 'cuda_shared_memory'), port=None):
        self.host = '127.0.0.1'
        self.port = port or _free_port()
        self.base = f'http://127.0.0.1:{self.port}'
        self.system = [dict(r) for r in system]
        self.cuda = [dict(r) for r in cuda]
        self.extensions = list(extensions)
        self.calls = []

    def server_metadata(self):
        self.calls.append('metadata')
        return dict(name='triton', version='2.51.0', extensions=list(self.extensions))

    def status(self, kind):
        self.calls.append(kind)
        if kind == 'cuda' and 'cuda_shared_memory' not in self.extensions:
            raise AssertionError('cuda status asked of a server without the extension')
        return [dict(r) for r in (self.system if kind == 'system' else self.cuda)]


class Read:
    """read_server() with the read options, then classify() with the criteria: what triton_shm_info does.

    The snapshot's fields (pid, shm_dir, located_by, warnings, scan) read through.
    """

    def __init__(self, triton, orphan_patterns=None, min_age=300, backend_patterns=None, **options):
        options.setdefault('read_nvml', lambda: nvml.Reading((), 'NVML cannot be loaded (this scene has no GPU)'))
        self.snap = read_server(triton, **options)
        self.criteria = Criteria.of(orphan_patterns, min_age, backend_patterns)

    def __getattr__(self, name):
        return getattr(self.snap, name)

    def result(self, live=None, ready=None):
        return info_result(self.snap, classify(self.snap, self.criteria), live=live, ready=ready)


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def region(name, key=None, byte_size=4096, offset=0):
    return dict(name=name, key=key or '/' + name, offset=offset, byte_size=byte_size)


def by_name(items):
    return {i['name']: i for i in items}


# -- the scene -----------------------------------------------------------------------------------------

REGIONS = [
    region('live', byte_size=MIB),
    region('stale', byte_size=2 * MIB),
    region('gone'),
    region('gone_held'),
    region('two_a', key='/shared', byte_size=2048),
    region('two_b', key='/shared', byte_size=2048, offset=2048),
    region('badkey', key='no_slash'),
    region('dirkey', key='/adir'),
    region('extra_fields'),
]
CUDA = [dict(name='gpu0', device_id=0, byte_size=1024)]


@pytest.fixture(scope='module')
def ns(wait_older):
    if os.geteuid() != 0:
        pytest.skip('needs root: mount namespaces with a private /dev/shm')
    space = Namespace()
    try:
        client = space.client('client')
        for name, size in (
            ('live', MIB),
            ('stale', 2 * MIB),
            ('gone', 4096),
            ('gone_held', 4096),
            ('shared', 4096),
            ('extra_fields', 4096),
        ):
            space.write(name, size)
            space.server.do('map ' + name)  # Triton maps every registered file
        client.do('map live', 'map gone_held')
        os.unlink(space.path('gone'))
        os.unlink(space.path('gone_held'))
        os.mkdir(space.path('adir'))
        space.write('held_file')
        client.do('open held_file')
        space.write('server_only')
        space.server.do('open server_only')
        space.write('triton_python_backend_shm_region_1234', 8192)
        space.server.do('map triton_python_backend_shm_region_1234')  # Triton maps its python backend's pools
        old = [space.write('client_old', 65536), space.write('PostgreSQL.7', 4096)]
        os.mkfifo(space.path('client_fifo'))
        os.mkdir(space.path('client_dir'))
        os.symlink('client_old', space.path('client_link'))
        wait_older(old + [space.path(n) for n in ('client_fifo', 'client_dir', 'client_link')], AGED)
        space.write('client_young', 4096)  # after the wait (`result` writes it again just before its read)
        space.client_proc = client
        yield space
    finally:
        space.close()


def scene_triton():
    system = [dict(r) for r in REGIONS]
    system[-1]['ref_count'] = 1  # newer servers add fields: they are kept
    return FakeTriton(system=system, cuda=CUDA)


@pytest.fixture(scope='module')
def result(ns):
    ns.write('client_young', 4096)  # written again: younger than AGED now, whichever test made the scene
    inv = Read(scene_triton(), server_pid=ns.server.pid, orphan_patterns=['client_*'], min_age=AGED)
    assert inv.scan.complete, inv.scan.incomplete_reason()
    return inv.result(live=True, ready=False)


def test_region_held_by_a_client_is_healthy(result, ns):
    live = by_name(result['system_regions'])['live']
    assert live['state'] == 'healthy'
    assert live['holders'] == [dict(pid=ns.client_proc.pid, comm='client')]
    assert live['file']['exists'] is True and live['file']['size'] == MIB
    assert live['file']['inode'] == os.stat(ns.path('live')).st_ino


def test_region_held_only_by_the_server_is_stale(result):
    stale = by_name(result['system_regions'])['stale']
    assert stale['state'] == 'stale'
    assert stale['holders'] == []
    assert 'client is gone' in stale['state_reason']
    assert stale['reclaimable'] is True
    assert by_name(result['system_regions'])['live']['reclaimable'] is False


def test_region_whose_file_is_missing_is_dangling(result, ns):
    regions = by_name(result['system_regions'])
    assert regions['gone']['state'] == 'dangling'
    assert regions['gone']['file'] == dict(path=ns.path('gone'), exists=False)
    assert regions['gone']['holders'] == []
    # found through the server's own "(deleted)" mapping: the client that still maps it is named
    assert regions['gone_held']['state'] == 'dangling'
    assert regions['gone_held']['holders'] == [dict(pid=ns.client_proc.pid, comm='client')]
    assert 'still mapped by a client' in regions['gone_held']['state_reason']
    # a dangling region's memory is freed by unregistering it, unless a client still maps the file
    assert regions['gone']['reclaimable'] is True
    assert regions['gone_held']['reclaimable'] is False


def test_regions_that_cannot_be_located_safely_are_unknown(result):
    regions = by_name(result['system_regions'])
    assert regions['badkey']['state'] == 'unknown'
    assert regions['badkey']['file'] is None
    assert 'cannot be located safely' in regions['badkey']['state_reason']
    assert regions['dirkey']['state'] == 'unknown'
    assert regions['dirkey']['file']['type'] == 'directory'
    assert 'not a regular file' in regions['dirkey']['state_reason']


def test_two_regions_on_one_file(result):
    regions = by_name(result['system_regions'])
    assert regions['two_a']['state'] == regions['two_b']['state'] == 'stale'
    shared = by_name(result['files'])['shared']
    assert shared['category'] == 'registered'
    assert shared['regions'] == ['two_a', 'two_b']


def test_extra_region_fields_are_kept(result):
    extra = by_name(result['system_regions'])['extra_fields']
    assert extra['ref_count'] == 1
    assert {k: extra[k] for k in ('name', 'key', 'offset', 'byte_size')} == region('extra_fields')


def test_file_categories(result, ns):
    files = by_name(result['files'])
    cats = {n: f['category'] for n, f in files.items()}
    assert cats == {
        'live': 'registered',
        'stale': 'registered',
        'shared': 'registered',
        'extra_fields': 'registered',
        'adir': 'foreign',
        'held_file': 'in_use',
        'server_only': 'in_use',
        'triton_python_backend_shm_region_1234': 'backend',
        'client_old': 'orphan',
        'client_young': 'foreign',
        'PostgreSQL.7': 'foreign',
        'client_fifo': 'foreign',
        'client_dir': 'foreign',
        'client_link': 'foreign',
    }
    assert files['held_file']['holders'] == [dict(pid=ns.client_proc.pid, comm='client')]
    # the server never shows as a holder, but a file only it holds is still in use
    assert files['server_only']['holders'] == []
    assert 'tritonserver' in files['server_only']['category_reason']
    assert files['live']['holders'] == [dict(pid=ns.client_proc.pid, comm='client')]
    assert files['stale']['holders'] == []
    assert 'younger than min_age' in files['client_young']['category_reason']
    assert files['PostgreSQL.7']['category_reason'] == (
        "PostgreSQL's dynamic shared memory (PostgreSQL.*): never an orphan, whatever orphan_patterns says"
    )
    for name, kind in (('client_fifo', 'fifo'), ('client_dir', 'directory'), ('client_link', 'symlink')):
        assert files[name]['type'] == kind
        assert files[name]['category_reason'] == f'not a regular file ({kind})'
    assert files['client_link']['inode'] == os.lstat(ns.path('client_link')).st_ino != files['client_old']['inode']
    assert 'dev' not in files['live']


def test_cuda_regions_are_reported_unknown(result):
    assert [(r['name'], r['device_id'], r['state']) for r in result['cuda_regions']] == [('gpu0', 0, 'unknown')]
    assert result['cuda_regions'][0]['state_reason'] == (
        'NVML cannot be loaded (this scene has no GPU): whether a client still has a CUDA context cannot be told'
    )
    assert result['cuda_regions'][0]['reclaimable'] is False and result['cuda_regions'][0]['holders'] == []


def test_a_cuda_region_returns_exactly_the_keys_triton_shm_info_documents(result):
    # the integration test of the RETURN docs runs a CPU server, which cannot register a CUDA region
    import ast

    import yaml

    root = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
    with open(os.path.join(root, 'plugins', 'modules', 'triton_shm_info.py')) as f:
        tree = ast.parse(f.read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == 'RETURN')
    documented = yaml.safe_load(node.value.value)['cuda_regions']['contains']
    assert set(result['cuda_regions'][0]) == set(documented)


def test_server_and_summary(result, ns):
    server = result['server']
    assert server['pid'] == ns.server.pid
    assert server['shm_dir'] == ns.shm_dir
    assert server['located_by'] == f'server_pid; shm_dir from /proc/{ns.server.pid}/root'
    assert (server['live'], server['ready'], server['version']) == (True, False, '2.51.0')
    s = result['summary']
    assert (s['system_regions'], s['cuda_regions']) == (len(REGIONS), 1)
    assert (s['healthy_regions'], s['stale_regions'], s['dangling_regions'], s['unknown_regions']) == (1, 4, 2, 2)
    st = os.stat(ns.path('stale')), os.stat(ns.path('shared')), os.stat(ns.path('extra_fields'))
    # two stale regions on one file: its bytes count once (that is what removing it frees)
    assert s['stale_bytes'] == sum(x.st_blocks * 512 for x in st) == 2 * MIB + 4096 + 4096
    assert (s['registered_files'], s['backend_files'], s['in_use_files'], s['orphan_files'], s['foreign_files']) == (
        4,
        1,
        2,
        1,
        6,
    )
    assert s['orphan_bytes'] == os.stat(ns.path('client_old')).st_blocks * 512 == 65536
    usage = os.statvfs(ns.shm_dir)
    assert s['total_bytes'] == result['shm_fs']['total_bytes'] == usage.f_blocks * usage.f_frsize == 16 * MIB
    assert s['used_percent'] == result['shm_fs']['used_percent']
    assert result['unreadable_processes'] == 0 and result['holders_complete'] is True


def test_min_age_zero_makes_a_young_match_orphan(ns):
    inv = Read(scene_triton(), server_pid=ns.server.pid, orphan_patterns=['client_*'], min_age=0)
    files = by_name(inv.result()['files'])
    assert files['client_young']['category'] == 'orphan'
    assert files['held_file']['category'] == 'in_use'


def test_no_patterns_no_orphans(ns):
    files = by_name(Read(scene_triton(), server_pid=ns.server.pid).result()['files'])
    assert files['client_old']['category'] == 'foreign'
    assert files['triton_python_backend_shm_region_1234']['category'] == 'backend'


def test_backend_files_are_backend_even_when_a_pattern_matches(ns):
    inv = Read(scene_triton(), server_pid=ns.server.pid, orphan_patterns=['*'], min_age=0)
    files = by_name(inv.result()['files'])
    assert files['triton_python_backend_shm_region_1234']['category'] == 'backend'
    # issue 26: a pattern that matches everything no longer reaches a well-known family of other software
    assert files['PostgreSQL.7']['category'] == 'foreign'


def test_not_root_nothing_is_stale_or_orphan(ns, as_nobody):
    """Inside the server's mount namespace as uid 65534: root's processes cannot be read."""

    def classify():
        inv = Read(scene_triton(), server_pid=ns.server.pid, shm_dir='/dev/shm', orphan_patterns=['client_*'])
        res = inv.result()
        return dict(
            states={r['name']: r['state'] for r in res['system_regions']},
            reclaimable=sorted(r['name'] for r in res['system_regions'] if r['reclaimable']),
            cats={f['name']: f['category'] for f in res['files']},
            unreadable=res['unreadable_processes'],
            complete=res['holders_complete'],
            warnings=inv.warnings,
        )

    got = as_nobody(classify, setns_pid=ns.server.pid)
    assert 'error' not in got, got
    assert got['unreadable'] >= 2 and got['complete'] is False
    assert 'stale' not in got['states'].values() and 'healthy' not in got['states'].values()
    assert got['states']['stale'] == got['states']['live'] == 'unknown'
    assert got['states']['gone'] == 'dangling', 'a missing file is missing whoever looks'
    assert got['reclaimable'] == [], 'with holders unknown, not even a dangling region may be cleaned'
    assert 'orphan' not in got['cats'].values()
    assert got['cats']['client_old'] == 'foreign'
    assert any('no region is reported stale' in w and 'run the module as root' in w for w in got['warnings'])


# -- locating the server and its directory -----------------------------------------------------------


def test_server_found_by_its_listening_port(ns):
    port = _free_port()
    listener = ns.client('tritonserver')  # a tritonserver process in that namespace, serving the port
    listener.do(f'listen {port}')
    inv = Read(FakeTriton(port=port))
    assert inv.pid == listener.pid
    assert inv.shm_dir == f'/proc/{listener.pid}/root/dev/shm'
    assert inv.located_by == (
        f'listener: tritonserver (pid {listener.pid}) owns the listening socket 127.0.0.1:{port}; '
        f'shm_dir from /proc/{listener.pid}/root'
    )
    assert inv.result()['server']['not_found_reason'] is None
    assert inv.warnings == []


def test_no_server_and_no_shm_dir_still_returns_the_api_data():
    triton = FakeTriton(system=[region('r')])
    res = Read(triton).result()
    assert res['server']['pid'] is None and res['server']['shm_dir'] is None
    assert res['shm_fs'] is None and res['files'] == []
    assert [(r['name'], r['state']) for r in res['system_regions']] == [('r', 'unknown')]
    assert res['summary']['used_percent'] is None
    assert res['holders_complete'] is False


def test_no_server_and_no_shm_dir_warns_why():
    inv = Read(FakeTriton(system=[region('r')]))
    assert len(inv.warnings) == 1
    assert 'tritonserver process for http://127.0.0.1:' in inv.warnings[0]
    assert (
        'cannot open a TCP connection to 127.0.0.1:' in inv.warnings[0]
        and 'file and holder data are missing' in inv.warnings[0]
    )
    reason = inv.result()['server']['not_found_reason']
    assert reason.startswith('the tritonserver process behind 127.0.0.1:') and reason in inv.warnings[0]


def test_shm_dir_without_a_known_server_never_calls_anything_stale(ns):
    inv = Read(scene_triton(), shm_dir=ns.shm_dir)
    res = inv.result()
    states = {r['name']: r['state'] for r in res['system_regions']}
    assert 'stale' not in states.values()
    assert not any(r['reclaimable'] for r in res['system_regions'])
    assert states['live'] == 'healthy'
    assert res['server']['located_by'] == 'shm_dir given'
    assert any('cannot be told apart from clients' in w for w in inv.warnings)


def test_nonexistent_server_pid_names_the_url():
    pid = int(open('/proc/sys/kernel/pid_max').read()) + 1
    triton = FakeTriton()
    with pytest.raises(DiscoveryError, match=rf'server_pid {pid} \(given for {triton.base}\) does not exist'):
        Read(triton, server_pid=pid)


def test_unreadable_shm_dir_fails_only_when_asked(tmp_path):
    missing = str(tmp_path / 'missing')
    with pytest.raises(ShmFsError, match=f'shm_dir {missing} is not readable: No such file or directory') as err:
        Read(FakeTriton(system=[region('r')]), shm_dir=missing, require_readable_dir=True)
    # why, and what to do (issue 29)
    assert 'the shm_dir option names it, and it does not exist on this host' in err.value.msg
    assert "leave shm_dir out to use the server's own" in err.value.msg
    inv = Read(FakeTriton(system=[region('r')]), shm_dir=missing)
    assert inv.shm_dir is None
    assert any(missing in w and 'file and holder data are missing' in w for w in inv.warnings)
    assert [r['state'] for r in inv.result()['system_regions']] == ['unknown']


def test_server_without_system_shared_memory_is_refused():
    triton = FakeTriton(extensions=('classification', 'binary_tensor_data'))
    with pytest.raises(TritonError) as err:
        Read(triton)
    assert f'server at {triton.base} (Triton 2.51.0) does not offer the system_shared_memory extension' in err.value.msg
    assert 'extensions: classification, binary_tensor_data' in err.value.msg
    # why, and what to do (issue 29)
    assert 'no shared-memory API' in err.value.msg and 'check that the URL reaches tritonserver itself' in err.value.msg
    assert triton.calls == ['metadata']


def test_cuda_status_is_only_asked_when_the_server_offers_it(tmp_path):
    triton = FakeTriton(extensions=('system_shared_memory',))
    res = Read(triton, shm_dir=str(tmp_path)).result()
    assert res['cuda_regions'] == []
    assert 'cuda' not in triton.calls


def test_summarize_without_filesystem():
    regions = [
        dict(state='stale', file=dict(path='/s/a', exists=True, allocated_bytes=10)),
        dict(state='stale', file=dict(path='/s/b', exists=True, allocated_bytes=5)),
        dict(state='stale', file=dict(path='/s/b', exists=True, allocated_bytes=5)),
        dict(state='dangling', file=dict(path='/s/c', exists=False)),
    ]
    s = summarize(dict(system=regions, cuda=[]), [], None)
    assert (s['stale_regions'], s['stale_bytes'], s['dangling_regions'], s['used_bytes'], s['total_bytes']) == (
        3,
        15,
        1,
        None,
        None,
    )


# -- reserved regions and custom backend patterns ------------------------------------------------------

MARK = 'trusted.tritonops_shm.reserved'


@needs_root
def test_reserved_is_decided_by_the_mark_on_the_file_naming_the_region():
    space = Namespace()
    try:
        for name in ('mine', 'mine_used', 'theirs', 'other_name'):
            space.write(name, 4096)
            space.server.do('map ' + name)
        for name in ('mine', 'mine_used'):
            os.setxattr(space.path(name), MARK, name.encode())
        os.setxattr(space.path('other_name'), MARK, b'someone_else')  # the mark names another region
        space.client('user').do('map mine_used')
        triton = FakeTriton(system=[region(n) for n in ('mine', 'mine_used', 'theirs', 'other_name')])
        res = Read(triton, server_pid=space.server.pid).result()
    finally:
        space.close()
    regions = by_name(res['system_regions'])
    states = {n: (r['state'], r['reserved'], r['reclaimable']) for n, r in regions.items()}
    assert states == {
        'mine': ('reserved', True, False),  # the operator's, nobody maps it yet
        'mine_used': ('healthy', True, False),  # the operator's, a client maps it
        'theirs': ('stale', False, True),
        'other_name': ('stale', False, True),
    }
    assert MARK in regions['mine']['state_reason'] and 'never stale' in regions['mine']['state_reason']
    assert res['summary']['reserved_regions'] == 1 and res['summary']['stale_regions'] == 2
    # a reserved region's file counts in no stale bytes
    assert res['summary']['stale_bytes'] == 2 * 4096


def test_reserved_needs_complete_holders_like_stale(ns, as_nobody):
    """Not root: the mark cannot even be read (trusted.*), and nothing is stale or reserved."""
    os.setxattr(ns.path('stale'), MARK, b'stale')
    try:

        def classify():
            inv = Read(scene_triton(), server_pid=ns.server.pid, shm_dir='/dev/shm')
            return {r['name']: r['state'] for r in inv.result()['system_regions']}

        states = as_nobody(classify, setns_pid=ns.server.pid)
        assert states['stale'] == 'unknown' and 'reserved' not in states.values()
        own = by_name(Read(scene_triton(), server_pid=ns.server.pid).result()['system_regions'])
        assert own['stale']['state'] == 'reserved'
    finally:
        os.removexattr(ns.path('stale'), MARK)


@pytest.mark.parametrize(
    'patterns, category',
    [
        (None, 'foreign'),  # default: only Triton's own prefix
        (['triton_python_backend_shm_region_*', 'myprefix_*'], 'leftover'),  # a backend file no process holds
        (['myprefix_*'], 'leftover'),
    ],
)
def test_backend_patterns_name_the_backend_files(ns, patterns, category):
    ns.write('myprefix_1', 4096)
    try:
        inv = Read(
            scene_triton(),
            server_pid=ns.server.pid,
            orphan_patterns=['*'] if patterns is None else [],
            min_age=0,
            backend_patterns=patterns,
        )
        files = by_name(inv.result()['files'])
    finally:
        os.unlink(ns.path('myprefix_1'))
    assert files['myprefix_1']['category'] == ('orphan' if patterns is None else category)
    assert files['myprefix_1']['backend'] == (None if patterns is None else 'python')
    # the list adds to triton_*_backend_shm_region_* (every Python-based backend's files), never replaces it:
    # the backend's own prefix stays a backend file, even under orphan_patterns ['*']
    assert files['triton_python_backend_shm_region_1234']['category'] == 'backend'
    assert files['triton_python_backend_shm_region_1234']['backend'] == 'python'


# -- classification is pure: literal snapshots, no /proc, no server ------------------------------------

SERVER = 100
CLIENT = 200
SHM = '/proc/100/root/dev/shm'
BACKEND_FILE = 'triton_python_backend_shm_region_0'


# the server of the literal snapshots: root in the module's user namespace, in a 1777 root-owned /dev/shm
ROOT_SERVER = authority.Authority(
    uid=0,
    gids=frozenset([0]),
    privileged=True,
    dir_uid=0,
    dir_gid=0,
    dir_mode=0o41777,
    owner_uid=0,
    described='pid 100, uid 0 in this user namespace, privileged',
)


def entry(name, ino, kind='file', size=4096, age=0.0):
    return {
        'name': name,
        'path': f'{SHM}/{name}',
        'type': kind,
        'size': size,
        'allocated_bytes': size,
        'uid': 0,
        'mode': '0600',
        'mtime': 1000.0,
        'age_s': age,
        'age_from': 'mtime',
        'inode': ino,
        'dev': 7,
        'ctime_ns': 1,
    }


def literal_scan(held, complete=True, deleted=None):
    """A facts.HolderScan as one /proc pass would leave it: held = {inode: pids}."""
    scan = facts.HolderScan()
    scan.holders = {(7, ino): set(pids) for ino, pids in held.items()}
    scan.comms = {SERVER: 'tritonserver', CLIENT: 'python'}
    scan.deleted = dict(deleted or {})
    scan.unreadable = [] if complete else [4242]
    return scan


def literal_snapshot(pid=SERVER, shm_dir=SHM, complete=True, marks=None):
    system = [
        region('live'),
        region('stale'),
        region('mine'),
        region('gone'),
        region('badkey', key='no_slash'),
        region('dirkey', key='/adir'),
    ]
    entries = [
        entry('live', 1),
        entry('stale', 2),
        entry('mine', 3),
        entry('adir', 4, kind='directory'),
        entry('held', 5),
        entry(BACKEND_FILE, 6, age=OLD),
        entry('client_old', 8, age=OLD),
        entry('client_young', 9, age=10.0),
        entry('other', 10, age=OLD),
    ]
    scan = literal_scan(
        {1: [SERVER, CLIENT], 2: [SERVER], 3: [SERVER], 5: [CLIENT], 6: [SERVER]},
        complete=complete,
        deleted={'gone': (7, 11)},
    )
    location = discovery.Location(pid, shm_dir, 'server_pid; shm_dir from /proc/100/root', [], None)
    metadata = {'name': 'triton', 'version': '2.51.0', 'extensions': ['system_shared_memory']}
    return Snapshot(
        url='http://127.0.0.1:8000',
        metadata=metadata,
        regions=dict(system=system, cuda=[]),
        location=location,
        shm_dir=shm_dir,
        fs={
            'path': shm_dir,
            'total_bytes': 1 << 26,
            'used_bytes': 1 << 20,
            'free_bytes': 63 << 20,
            'used_percent': 1.56,
        },
        entries=entries if shm_dir else [],
        scan=scan if shm_dir else None,
        marks={'mine': 'mine', 'stale': None, 'live': None} if marks is None else marks,
        scanned_at=5.0,
        authority=ROOT_SERVER if shm_dir else None,
    )


def states(records):
    return {r['name']: (r['state'], r['reclaimable']) for r in records.of('system')}


def test_a_literal_snapshot_is_classified_into_every_state_and_category():
    records = classify(literal_snapshot(), Criteria.of(['client_*'], min_age=300))
    assert states(records) == {
        'live': ('healthy', False),
        'stale': ('stale', True),
        'mine': ('reserved', False),
        'gone': ('dangling', True),
        'badkey': ('unknown', False),
        'dirkey': ('unknown', False),
    }
    regions = by_name(records.of('system'))
    assert regions['live']['holders'] == [{'pid': CLIENT, 'comm': 'python'}]
    assert regions['live']['state_reason'] == f'held by {CLIENT} (python)'
    assert regions['gone']['file'] == {'path': f'{SHM}/gone', 'exists': False}
    assert regions['mine']['reserved'] is True and regions['stale']['reserved'] is False
    assert {f['name']: f['category'] for f in records.files} == {
        'live': 'registered',
        'stale': 'registered',
        'mine': 'registered',
        'adir': 'foreign',
        'held': 'in_use',
        BACKEND_FILE: 'backend',
        'client_old': 'orphan',
        'client_young': 'foreign',
        'other': 'foreign',
    }
    files = by_name(records.files)
    assert (
        files['client_young']['category_reason']
        == 'matches an orphan pattern but is younger than min_age (10.0s < 300s)'
    )
    assert 'dev' not in files['live'] and 'ctime_ns' not in files['live']


def test_a_literal_snapshot_without_complete_holders_has_nothing_stale_reserved_or_orphan():
    records = classify(literal_snapshot(complete=False), Criteria.of(['client_*'], min_age=0))
    assert states(records)['stale'] == states(records)['mine'] == ('unknown', False)
    assert states(records)['gone'] == ('dangling', False)
    assert states(records)['live'] == ('healthy', False)
    assert 'orphan' not in {f['category'] for f in records.files}
    assert by_name(records.files)['client_old']['category_reason'] == 'holders could not be fully determined'


def test_a_literal_snapshot_without_the_server_process_or_directory():
    # without the server's pid its own mapping cannot be told apart: a client's, so never stale
    no_pid = classify(literal_snapshot(pid=None))
    assert states(no_pid)['stale'] == ('healthy', False) and states(no_pid)['gone'] == ('dangling', False)
    assert by_name(no_pid.of('system'))['stale']['state_reason'] == f'held by {SERVER} (tritonserver)'
    no_dir = classify(literal_snapshot(shm_dir=None))
    assert {s for s, _r in states(no_dir).values()} == {'unknown'} and no_dir.files == []
    result = info_result(literal_snapshot(shm_dir=None), no_dir)
    assert result['holders_complete'] is False and result['unreadable_processes'] == 0
    assert result['scanned_at'] == 5.0 and result['server']['not_found_reason'] is None


@pytest.mark.parametrize(
    'given, state, reason',
    [
        (RegionFacts(shm_dir_known=False), 'unknown', 'the shm directory of the server is not known'),
        (RegionFacts(True, key_error='bad key'), 'unknown', 'backing file cannot be located safely: bad key'),
        (RegionFacts(True, path='/s/a'), 'dangling', 'backing file /s/a is missing'),
        (
            RegionFacts(True, path='/s/a', holders=({'pid': 5, 'comm': 'py'},)),
            'dangling',
            'backing file /s/a is missing (still mapped by a client)',
        ),
        (
            RegionFacts(True, path='/s/a', file_type='symlink'),
            'unknown',
            'backing path is a symlink, not a regular file',
        ),
        (
            RegionFacts(True, path='/s/a', file_type='file', holders=({'pid': 5, 'comm': 'py'},)),
            'healthy',
            'held by 5 (py)',
        ),
        (
            RegionFacts(True, path='/s/a', file_type='file', server_known=True),
            'unknown',
            'holders could not be fully determined',
        ),
        (
            RegionFacts(True, path='/s/a', file_type='file', holders_complete=True),
            'unknown',
            'the server process is not known, so its own mapping cannot be told apart',
        ),
        (
            RegionFacts(True, path='/s/a', file_type='file', holders_complete=True, server_known=True, reserved=True),
            'reserved',
            'registered by tritonops.shm (its file carries the mark trusted.tritonops_shm.reserved) and not mapped by a client yet: '  # noqa: E501
            'desired state, never stale',
        ),
        (
            RegionFacts(True, path='/s/a', file_type='file', holders_complete=True, server_known=True),
            'stale',
            'no process but the server holds the backing file: the client is gone',
        ),
    ],
)
def test_region_state_rules_in_order(given, state, reason):
    assert region_state(given) == (state, reason)


# -- backend pools (issue 27): the model of each pool, and the leftovers of dead servers ----------------

STUB = 300
STUB_ARGV = [
    '/opt/tritonserver/backends/python/triton_python_backend_stub',
    '/models/echo/1/model.py',
    'triton_python_backend_shm_region_0',
    '1048576',
    '1048576',
    str(SERVER),
    '/opt/tritonserver/backends/python',
    '336',
    'echo_0_0',
    'DEFAULT',
]
LEFTOVER_FILE = 'triton_vllm_backend_shm_region_dead'
YOUNG_FILE = 'triton_python_backend_shm_region_young'


def pool_snapshot(complete=True):
    """The literal snapshot, with the backend file mapped by its python stub, and a dead server's and a young pool."""
    snap = literal_snapshot(complete=complete)
    entries = snap.entries + [entry(LEFTOVER_FILE, 12, size=8192, age=OLD), entry(YOUNG_FILE, 13, age=1.0)]
    scan = snap.scan
    scan.holders[(7, 6)] = {SERVER, STUB}
    scan.comms[STUB] = 'triton_python_b'
    return dataclasses.replace(
        snap, entries=entries, scan=scan, pool_holders={STUB: stub_holder(STUB_ARGV)}, server_facts=SERVER_FACTS
    )


STUB_PROGRAM = (8, 1234)  # (st_dev, st_ino) of the server's backends/python/triton_python_backend_stub
SERVER_FACTS = facts.ServerFacts(SERVER, start=100, uids=(0, 0, 0, 0), mnt_ns=4026531841, stub=STUB_PROGRAM)


def stub_holder(argv, **kw):
    """A holder with every piece of evidence of the server's own stub (pool_attribution), but what kw changes."""
    evidence = dict(argv=argv, ppid=SERVER, start=150, uids=(0, 0, 0, 0), mnt_ns=4026531841, exe=STUB_PROGRAM)
    evidence.update(kw)
    return facts.PoolHolder(STUB, **evidence)


def test_backend_pools_are_named_for_their_model_and_a_pool_no_process_holds_is_leftover():
    snap = pool_snapshot()
    records = classify(snap, Criteria.of(min_age=300))
    files = by_name(records.files)
    assert (files[BACKEND_FILE]['category'], files[LEFTOVER_FILE]['category'], files[YOUNG_FILE]['category']) == (
        'backend',
        'leftover',
        'backend',
    )
    assert files[LEFTOVER_FILE]['backend'] == 'vllm'
    assert 'held by no process and older than min_age' in files[LEFTOVER_FILE]['category_reason']
    assert 'younger than min_age (1.0s < 300s)' in files[YOUNG_FILE]['category_reason']
    result = info_result(snap, records)
    pools = result['backend_pools']
    assert [(p['name'], p['model'], p['instance'], p['state']) for p in pools] == [
        (BACKEND_FILE, 'echo', 'echo_0_0', 'live'),
        (YOUNG_FILE, None, None, 'unknown'),
        (LEFTOVER_FILE, None, None, 'leftover'),
    ]
    assert pools[0] == {
        'path': f'{SHM}/{BACKEND_FILE}',
        'name': BACKEND_FILE,
        'backend': 'python',
        'model': 'echo',
        'instance': 'echo_0_0',
        'bytes': 4096,
        'size': 4096,
        'holders': [{'pid': SERVER, 'comm': 'tritonserver'}, {'pid': STUB, 'comm': 'triton_python_b'}],
        'state': 'live',
        'reason': files[BACKEND_FILE]['category_reason'],
        'unattributed_reason': None,
    }
    s = result['summary']
    assert (s['backend_files'], s['backend_bytes'], s['leftover_files'], s['leftover_bytes']) == (2, 8192, 1, 8192)


def test_with_an_incomplete_scan_no_backend_file_is_leftover():
    records = classify(pool_snapshot(complete=False), Criteria.of(min_age=0))
    files = by_name(records.files)
    assert files[LEFTOVER_FILE]['category'] == 'backend'
    assert files[LEFTOVER_FILE]['category_reason'].endswith('holders could not be fully determined')
    pools = by_name(info_result(pool_snapshot(complete=False), records)['backend_pools'])
    assert pools[LEFTOVER_FILE]['state'] == 'unknown' and pools[BACKEND_FILE]['state'] == 'live'


@pytest.mark.parametrize(
    'argv, expected',
    [
        (STUB_ARGV, ('echo', 'echo_0_0')),
        # a Python-based backend's own model.py (vllm): the model is the instance name without _GROUP_INDEX
        (
            STUB_ARGV[:1] + ['/opt/tritonserver/backends/vllm/model.py'] + STUB_ARGV[2:8] + ['llama_3_0_1', 'DEFAULT'],
            ('llama_3', 'llama_3_0_1'),
        ),
        (['/usr/bin/python3', '/models/echo/1/model.py'] + STUB_ARGV[2:], (None, None)),  # not a stub
        (STUB_ARGV[:8], (None, None)),  # too few arguments
        (
            STUB_ARGV[:2] + ['triton_python_backend_shm_region_other'] + STUB_ARGV[3:],
            (None, None),
        ),  # another pool's stub
    ],
)
def test_the_stub_command_line_names_the_model_and_instance(argv, expected):
    snap = dataclasses.replace(pool_snapshot(), pool_holders={STUB: stub_holder(argv)})
    pools = by_name(info_result(snap, classify(snap))['backend_pools'])
    assert (pools[BACKEND_FILE]['model'], pools[BACKEND_FILE]['instance']) == expected


@pytest.mark.parametrize(
    'change, why',
    [
        (dict(ppid=1), f'pid {STUB} is not a child of the server process {SERVER} (its parent is 1)'),
        (dict(start=50), f'pid {STUB} started before the server process {SERVER}'),
        (dict(uids=(65534,) * 4), f"pid {STUB} runs as uid 65534, not as the server's user (uid 0)"),
        (dict(mnt_ns=1), f"pid {STUB} is not in the server's mount namespace"),
        (dict(exe=(8, 99)), f"pid {STUB} does not run the server's python backend stub"),
        (dict(exe=None), f"pid {STUB} does not run the server's python backend stub"),
    ],
)
def test_a_command_line_alone_names_no_model(change, why):
    """Issue 33, finding 4: a process that calls itself triton_python_backend_stub and names a model on its command line
    is believed only with the evidence it cannot fake: the server's child, its user, its mount namespace, its stub."""
    snap = dataclasses.replace(pool_snapshot(), pool_holders={STUB: stub_holder(STUB_ARGV, **change)})
    pool = by_name(info_result(snap, classify(snap))['backend_pools'])[BACKEND_FILE]
    assert pool['model'] is None and pool['instance'] is None and pool['state'] == 'live'
    assert pool['unattributed_reason'].startswith(why), pool['unattributed_reason']
    assert "its command line's model 'echo' is not believed" in pool['unattributed_reason']


def test_a_custom_stub_in_the_models_own_directory_is_the_servers_too():
    holder = stub_holder(STUB_ARGV, exe=(8, 77), own_stub=(8, 77))
    snap = dataclasses.replace(pool_snapshot(), pool_holders={STUB: holder})
    assert by_name(info_result(snap, classify(snap))['backend_pools'])[BACKEND_FILE]['model'] == 'echo'
    snap = dataclasses.replace(snap, server_facts=None)
    pool = by_name(info_result(snap, classify(snap))['backend_pools'])[BACKEND_FILE]
    assert pool['model'] is None and pool['unattributed_reason'].startswith('the server process cannot be read')


@pytest.mark.parametrize(
    'argv, expected',
    [
        ([], ('/opt/tritonserver/backends', ())),
        (
            ['--model-repository', '/m', '--backend-directory=/b', '--model-store=/s', '--backend-directory', '/c'],
            ('/c', ('/m', '/s')),
        ),
    ],
)
def test_server_dirs_from_the_command_line(argv, expected):
    assert snapshot.server_dirs(['tritonserver', *argv]) == expected


def test_outside_the_initial_pid_namespace_no_backend_file_is_leftover():
    """The visibility rule (issue 25): a scan that cannot see other PID namespaces' processes calls nothing leftover."""
    snap = pool_snapshot()
    snap.scan.visibility = facts.Visibility(
        facts.OTHER, False, "the module runs outside the host's initial PID namespace"
    )
    records = classify(snap, Criteria.of(min_age=0))
    assert by_name(records.files)[LEFTOVER_FILE]['category'] == 'backend'
    assert info_result(snap, records)['summary']['leftover_files'] == 0
    # the operator's statement that every client shares this PID namespace makes it complete again
    snap.scan.visibility = facts.Visibility(facts.OTHER, True, None, True)
    assert by_name(classify(snap, Criteria.of(min_age=0)).files)[LEFTOVER_FILE]['category'] == 'leftover'


# -- pool prefixes read from the servers' command lines (issue 42, goal 3) --------------------------------------


def test_the_pool_prefix_a_command_line_sets():
    pool_prefix = snapshot.pool_prefix
    assert pool_prefix(['tritonserver', '--backend-config=python,shm-region-prefix-name=prefix0_']) == 'prefix0_'
    assert pool_prefix(['tritonserver', '--backend-config', 'python,shm-region-prefix-name=r1_']) == 'r1_'
    assert pool_prefix(['tritonserver', '--backend-config=python,shm-default-byte-size=1048576']) is None
    assert pool_prefix(['tritonserver', '--backend-config=onnxruntime,shm-region-prefix-name=x']) is None
    assert pool_prefix(None) is None


def test_pool_names_of_live_prefixes_and_of_a_dead_ranks_family():
    uuid = '31274a2d-1650-4a25-b33f-bfadc290be1a'
    names = facts.PoolNames({'prefix0_': 10}, (re.compile(f'(prefix[0-9]+_){facts.POOL_TAIL}'),))
    assert 'server process 10' in names.of(f'prefix0_{uuid}')
    assert 'no live server sets' in names.of(f'prefix3_{uuid}')
    assert 'no live server sets' in names.of('prefix3__2'), 'an older backend numbers its pools'
    assert names.of(f'prefix3_{uuid}.bak') is None, "a pool's shape, or nothing"
    assert names.of(f'prefixA_{uuid}') is None and names.of(f'other_{uuid}') is None
    assert names.of('prefix0_notes') is None
