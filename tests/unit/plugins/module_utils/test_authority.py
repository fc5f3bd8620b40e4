"""Unit tests for module_utils/host/authority.py: the server's own DAC rights and the owner rule, and their use in inventory."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError
from ansible_collections.tritonops.shm.plugins.module_utils.host import authority, discovery, holders
from ansible_collections.tritonops.shm.plugins.module_utils.host.authority import Authority
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import (
    Criteria,
    broad_pattern_warnings,
    classify,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Snapshot

STATUS = """Name:\ttritonserver
Uid:\t{uid}\t{uid}\t{uid}\t{uid}
Gid:\t{gid}\t{gid}\t{gid}\t{gid}
Groups:\t{groups}
CapEff:\t{caps}
"""


def status(uid=0, gid=0, groups='', caps='000001ffffffffff'):
    return STATUS.format(uid=uid, gid=gid, groups=groups, caps=caps)


@pytest.mark.parametrize(
    'text, same_userns, expected',
    [
        (status(), True, (0, frozenset([0]), True)),
        (status(), False, (0, frozenset([0]), False)),  # root of another user namespace: not ours
        (status(caps='0000000000000000'), True, (0, frozenset([0]), False)),
        (status(caps='0000000000000002'), True, (0, frozenset([0]), False)),  # DAC_OVERRIDE without FOWNER
        (status(65534, 65534, '65534 27'), False, (65534, frozenset([65534, 27]), False)),
    ],
)
def test_parse_status(text, same_userns, expected):
    assert authority.parse_status(text, same_userns) == expected


def test_parse_status_refuses_a_text_without_ids():
    with pytest.raises(ValueError):
        authority.parse_status('Name:\tx\n', True)


def server(uid, dir_uid=0, dir_gid=0, dir_mode=0o41777, gids=(), privileged=False):
    return Authority(
        uid=uid,
        gids=frozenset(gids or [uid]),
        privileged=privileged,
        dir_uid=dir_uid,
        dir_gid=dir_gid,
        dir_mode=dir_mode,
        owner_uid=uid,
        described=f'uid {uid}',
    )


@pytest.mark.parametrize(
    'who, file_uid, allowed',
    [
        (server(0, privileged=True), 999, True),  # root on the host: anything
        (server(65534, dir_uid=0, dir_mode=0o40755), 0, False),  # the fake: a root-owned 0755 directory
        (server(65534, dir_uid=0, dir_mode=0o40755), 65534, False),  # not even its own file there
        (server(65534, dir_uid=65534, dir_mode=0o41777), 0, True),  # rootless: its own sticky /dev/shm, any file
        (server(1000, dir_uid=0, dir_mode=0o41777), 1000, True),  # a user in the host's /dev/shm: its own file
        (server(1000, dir_uid=0, dir_mode=0o41777), 0, False),  # ... not root's (sticky)
        (server(1000, dir_uid=0, dir_mode=0o40777), 0, True),  # no sticky bit: the kernel allows it
        (server(1000, dir_uid=0, dir_gid=50, dir_mode=0o40770, gids=(1000, 50)), 0, True),  # group-writable, its group
        (server(1000, dir_uid=0, dir_gid=50, dir_mode=0o40775, gids=(1000,)), 1000, False),  # not its group: other bits
    ],
)
def test_unlink_refusal_follows_the_kernels_dac_rule(who, file_uid, allowed):
    why = who.unlink_refusal(file_uid)
    assert (why is None) == allowed, why
    if why:
        assert 'no borrowed authority' in why


def test_an_unknown_authority_refuses_everything():
    who = Authority.unknown('the identity of server process 7 cannot be read')
    assert who.refusal(0, frozenset([0])) == 'not removed: the identity of server process 7 cannot be read'


def test_owner_rule():
    root = server(0, privileged=True)
    assert root.owner_refusal(0, frozenset()) is None
    assert 'owned by uid 999' in root.owner_refusal(999, frozenset())
    assert root.owner_refusal(999, frozenset([999])) is None
    assert root.refusal(999, frozenset([999])) is None


def test_client_uids_take_names_and_numbers():
    assert authority.client_uids(['0', 'root', 999, ' 1000 ']) == frozenset([0, 999, 1000])
    with pytest.raises(ParameterError, match='no user named'):
        authority.client_uids(['no-such-user-tritonops'])
    nobody = frozenset([pwd.getpwnam('nobody').pw_uid])
    assert Criteria.of(client_uids=authority.client_uids(['nobody'])).client_uids == nobody, 'the rules get uids'


def test_read_authority_of_this_process(tmp_path):
    who = authority.read_authority(os.getpid(), str(tmp_path))
    assert who.reason is None and who.uid == os.geteuid() and who.owner_uid == os.geteuid()
    assert who.privileged == (os.geteuid() == 0)
    assert authority.read_authority(os.getpid(), str(tmp_path / 'missing')).reason.startswith('the shm directory')
    assert 'cannot be read' in authority.read_authority(2**22 + 7, str(tmp_path)).reason
    given = authority.read_authority(None, str(tmp_path))  # shm_dir given, no server: the directory's owner
    assert given.owner_uid == os.stat(tmp_path).st_uid and given.unlink_refusal(12345) is None


@pytest.mark.parametrize(
    'patterns, warned',
    [(['*'], 1), (['**', 'client_*'], 1), (['client_*', '?*'], 1), (['client_*'], 0), ([], 0), (None, 0)],
)
def test_a_pattern_matching_every_name_is_warned(patterns, warned):
    assert len(broad_pattern_warnings(patterns)) == warned


def test_parse_deleted_all_keeps_every_file_of_a_name():
    lines = [
        b'7f0000000000-7f0000001000 rw-s 00000000 00:2d 11 /dev/shm/k (deleted)',
        b'7f0000001000-7f0000002000 rw-s 00000000 00:2d 12 /dev/shm/k (deleted)',
        b'7f0000002000-7f0000003000 rw-s 00000000 00:2d 12 /dev/shm/k (deleted)',
        b'7f0000003000-7f0000004000 rw-s 00000000 00:2d 13 /dev/shm/other',
    ]
    dev = os.makedev(0, 0x2D)
    assert holders.parse_deleted_all(b'\n'.join(lines)) == {'k': [(dev, 11), (dev, 12)]}
    assert holders.parse_deleted(b'\n'.join(lines)) == {'k': (dev, 12)}


# -- in the classification (literal snapshots) ----------------------------------------------------------------------

SERVER, CLIENT, DEV = 100, 200, 7
SHM = '/proc/100/root/dev/shm'


def entry(name, ino, uid=0, age=3600.0):
    return {
        'name': name,
        'path': f'{SHM}/{name}',
        'type': 'file',
        'size': 4096,
        'allocated_bytes': 4096,
        'uid': uid,
        'mode': '0600',
        'mtime': 1000.0,
        'age_s': age,
        'age_from': 'mtime',
        'inode': ino,
        'dev': DEV,
        'ctime_ns': 1,
    }


def snapshot(system, entries, held, deleted_all, who=server(0, privileged=True), shared=None):
    scan = holders.HolderScan()
    scan.holders = {(DEV, ino): set(pids) for ino, pids in held.items()}
    scan.comms = {SERVER: 'tritonserver', CLIENT: 'python'}
    scan.deleted_all = {n: [(DEV, i) for i in inos] for n, inos in deleted_all.items()}
    scan.deleted = {n: ks[-1] for n, ks in scan.deleted_all.items()}
    location = discovery.Location(SERVER, SHM, 'server_pid', [], None, shared)
    return Snapshot(
        url='http://127.0.0.1:8000',
        metadata={'version': '2.51.0'},
        regions=dict(system=system, cuda=[]),
        location=location,
        shm_dir=SHM,
        entries=entries,
        scan=scan,
        authority=who,
    )


def region(name, key):
    return {'name': name, 'key': key, 'offset': 0, 'byte_size': 4096}


def states(snap, criteria=Criteria()):
    return {r['name']: (r['state'], r['reclaimable']) for r in classify(snap, criteria).of('system')}


def test_an_unlinked_file_and_a_new_file_of_its_name_make_the_region_unknown():
    # live /k: its file (inode 1) unlinked, held by the client; a new file k (inode 2), only the server maps it
    snap = snapshot([region('live', '/k')], [entry('k', 2)], {1: [SERVER, CLIENT], 2: [SERVER]}, {'k': [1]})
    assert states(snap) == {'live': ('unknown', False)}


def test_two_unlinked_files_of_one_name_make_the_region_unknown():
    snap = snapshot([region('live', '/k')], [], {1: [SERVER, CLIENT], 2: [SERVER]}, {'k': [1, 2]})
    assert states(snap) == {'live': ('unknown', False)}


def test_a_listed_file_literally_named_deleted_is_not_an_unlinked_one():
    # maps: inode 1 (the live client's unlinked k) and inode 3 (a file named "k (deleted)", still listed)
    snap = snapshot(
        [region('live', '/k'), region('dead', '/k (deleted)')],
        [entry('k (deleted)', 3)],
        {1: [SERVER, CLIENT], 3: [SERVER]},
        {'k': [1, 3]},
    )
    assert states(snap) == {'live': ('dangling', False), 'dead': ('stale', True)}


def test_orphans_of_another_owner_or_beyond_the_servers_rights_are_foreign():
    entries = [entry('client_a', 5), entry('client_b', 6, uid=999), entry('sem.mp-1', 7)]
    files = {f['name']: f for f in classify(snapshot([], entries, {}, {}), Criteria.of(['*'], min_age=0)).files}
    assert files['client_a']['category'] == 'orphan'
    assert files['client_b']['category'] == 'foreign' and 'owned by uid 999' in files['client_b']['category_reason']
    assert (
        files['sem.mp-1']['category'] == 'foreign' and 'POSIX named semaphore' in files['sem.mp-1']['category_reason']
    )
    with_999 = classify(snapshot([], entries, {}, {}), Criteria.of(['*'], min_age=0, client_uids=[999])).files
    assert {f['name']: f['category'] for f in with_999}['client_b'] == 'orphan'
    fake = server(65534, dir_uid=0, dir_mode=0o40755)
    files = classify(snapshot([], entries, {}, {}, who=fake), Criteria.of(['*'], min_age=0, client_uids=[999])).files
    assert {f['category'] for f in files} == {'foreign'}
    nothing = classify(snapshot([], entries, {}, {}, who=None), Criteria.of(['*'], min_age=0)).files
    assert {f['category'] for f in nothing} == {'foreign'}


# -- one server per port ---------------------------------------------------------------------------------------------

LISTENER = """
import ctypes, os, socket, sys, time
ctypes.CDLL(None).prctl(15, b'tritonserver', 0, 0, 0)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen(8)
if sys.argv[2] == 'fork' and os.fork() == 0:
    time.sleep(60)
print('READY', flush=True)
time.sleep(60)
"""


def _listen(port, mode='one'):
    proc = subprocess.Popen(
        [sys.executable, '-c', LISTENER, str(port), mode], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout.readline().strip() == 'READY'
    return proc


def _stop(procs):
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_two_processes_listening_on_one_port_are_refused():
    port = _port()
    procs = [_listen(port), _listen(port)]
    try:
        found = discovery.find_server('127.0.0.1', port)
        assert found.pid is None
        assert '2 processes listen on 127.0.0.1:' in found.reason and 'server_pid' in found.reason
        assert all(f'pid {p.pid}' in found.reason for p in procs)
    finally:
        _stop(procs)


def test_a_forked_child_sharing_the_socket_is_the_same_server():
    port = _port()
    procs = [_listen(port, 'fork')]
    try:
        assert (
            discovery.shared_port('127.0.0.1', port, '/proc', discovery._listening_inodes('127.0.0.1', port, '/proc'))
            is None
        )
        assert discovery.find_server('127.0.0.1', port).pid == procs[0].pid
    finally:
        _stop(procs)


def test_on_a_shared_port_only_regions_whose_files_the_named_server_maps_are_judged():
    system = [region('mine', '/a'), region('theirs', '/b'), region('gone', '/c'), region('elsewhere', '/d')]
    entries = [entry('a', 1), entry('b', 2)]
    held = {1: [SERVER], 2: [], 3: [SERVER]}
    shared = '2 processes listen on 127.0.0.1:8000 each with a socket of its own'
    snap = snapshot(system, entries, held, {'c': [3]}, shared=shared)
    assert states(snap) == {
        'mine': ('stale', True),
        'theirs': ('unknown', False),
        'gone': ('dangling', True),
        'elsewhere': ('unknown', False),
    }
    # the same regions on a port of its own: judged as before
    assert states(snapshot(system, entries, held, {'c': [3]}))['theirs'] == ('stale', True)


def test_server_pid_on_a_shared_port_is_located_with_a_warning():
    port = _port()
    procs = [_listen(port), _listen(port)]
    try:
        found = discovery.locate_server('127.0.0.1', port, f'http://127.0.0.1:{port}', server_pid=procs[0].pid)
        assert found.pid == procs[0].pid and found.shared is not None
        assert any('judged only by the regions whose files it maps' in w for w in found.warnings)
        single = _port()
        procs.append(_listen(single))
        assert discovery.locate_server('127.0.0.1', single, 'x', server_pid=procs[-1].pid).shared is None
    finally:
        _stop(procs)
