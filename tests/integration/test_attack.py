"""Attacks where the separately built pieces meet (issues 25-27): an unprivileged local user's files named like this
collection's own (a backend pool, a quarantine name) in a root server's /dev/shm; and what must hold (keep it): a
holder whose only link is a private mapping, a forked child of a dead client, sockets and FIFOs, duplicate names.

Real tritonserver (2.51 from the wheel) as root in its own /dev/shm (mode 1777, as every /dev/shm); the user ``nobody``
plants files there from inside the server's mount namespace (``nsenter`` + ``setpriv``), as any local user can in the
host's /dev/shm under ``--ipc=host``. The holders are real processes in that namespace (tritonclient's own
create_shared_memory_region where a client makes its region), SIGKILLed at the end, after which the same cleanup
takes what they held: what kept it was the holder.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
import textwrap
import urllib.error

import tritonrig
from ansible_helpers import run_module

REGION = 'tritonops.shm.triton_shm_region'
INFO = 'tritonops.shm.triton_shm_info'
MIB = 1 << 20

PLANT = (
    'import os, sys\n'
    'os.chdir("/dev/shm")\n'
    'with open("triton_python_backend_shm_region_planted", "wb") as f:\n'
    '    f.truncate(1 << 20)\n'
    'with open("bait", "wb") as f:\n'
    '    f.truncate(4096)\n'
    'q = ".tritonops_shm.quarantine.%d.0123456789ab" % os.stat("bait").st_ino\n'
    'os.rename("bait", q)\n'
    'print(q)\n'
)


def test_files_nobody_plants_under_the_collections_own_names_are_never_removed_on_its_word(tmp_path):
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=()).start()
    try:
        shm = server.shm_dir
        qname = subprocess.run(
            [
                'nsenter',
                '--mount',
                '--target',
                str(server.pid),
                'setpriv',
                '--reuid',
                '65534',
                '--regid',
                '65534',
                '--clear-groups',
                '/usr/bin/python3',
                '-c',
                PLANT,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        planted = ['triton_python_backend_shm_region_planted', qname]
        assert all(os.lstat(os.path.join(shm, n)).st_uid == 65534 for n in planted)
        # root's own file under a quarantine-looking name, never recorded by a run
        lookalike = os.path.join(shm, f'.tritonops_shm.quarantine.{os.getpid()}.feedfacecafe')
        with open(lookalike, 'wb') as f:
            f.truncate(4096)

        # everything the cleanup can be asked for, at min_age 0: the planted files stay, by the owner rule
        res = run_module(
            REGION,
            dict(
                url=server.url,
                state='absent',
                stale=True,
                backend_leftovers=True,
                orphan_files=True,
                orphan_patterns=['triton_*', '.tritonops_shm.quarantine.*.0123456789ab'],
                min_age=0,
                inventory=True,
            ),
        )
        assert not res.get('failed'), res
        assert res['removed_files'] == [] and res['changed'] is False, res
        files = {os.path.basename(f['path']): f for f in res['before']['files']}
        assert (
            files[planted[0]]['category'] == 'backend' and 'owned by uid 65534' in files[planted[0]]['category_reason']
        )
        assert files[qname]['category'] == 'foreign' and 'owned by uid 65534' in files[qname]['category_reason']
        assert files[os.path.basename(lookalike)]['category'] == 'foreign', files[os.path.basename(lookalike)]
        assert all(os.path.exists(os.path.join(shm, n)) for n in planted) and os.path.exists(lookalike)
        assert not [
            n
            for n in os.listdir(shm)
            if n.startswith('.tritonops_shm.quarantine.') and n not in (qname, os.path.basename(lookalike))
        ], 'nothing renamed'

        # a stale cleanup alone never takes a quarantine-looking name the record does not list (root's or nobody's)
        stale = run_module(REGION, dict(url=server.url, state='absent', stale=True, backend_leftovers=True, min_age=0))
        assert stale['removed_files'] == [] and os.path.exists(lookalike), stale

        # the owner rule decides: with client_users naming nobody, nobody's unheld pool is a leftover like any other
        named = run_module(
            REGION, dict(url=server.url, state='absent', backend_leftovers=True, min_age=0, client_users=['nobody'])
        )
        assert [os.path.basename(p) for p in named['removed_files']] == [planted[0]], named
        assert os.path.exists(os.path.join(shm, qname)) and os.path.exists(lookalike)
    finally:
        server.stop()


# -- what held (keep it) ------------------------------------------------------------------------------------------


class Holder:
    """A script run in the server's mount namespace (its own session), its output read line by line."""

    def __init__(self, server: tritonrig.TritonServer, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            ['nsenter', '--mount', '--target', str(server.pid), sys.executable, '-c', script, server.url, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def line(self, timeout: float = 60) -> list[str]:
        ready, _w, _x = select.select([self.proc.stdout], [], [], timeout)
        words = self.proc.stdout.readline().split() if ready else []
        assert words, ('no line from the holder', self.proc.poll(), self.proc.stderr.read()[-2000:])
        return words

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + '\n')
        self.proc.stdin.flush()

    def stop(self) -> None:
        """SIGKILL its whole process group (nothing of it unlinks anything)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


def _links(pid: int, path: str) -> tuple[list[str], list[str]]:
    """(the fds of pid open on the file at path, the lines of its maps that map it) as /proc shows them."""
    fds = []
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            if os.readlink(f'/proc/{pid}/fd/{fd}') == path:
                fds.append(fd)
        except OSError:
            pass
    with open(f'/proc/{pid}/maps') as f:
        maps = [line.strip() for line in f if line.rstrip().endswith(' ' + path)]
    return fds, maps


def _region(info: dict, name: str) -> dict:
    return {r['name']: r for r in info['system_regions']}[name]


def _kept_while_held_then_taken(server, name: str, holder: int, gone, file: tuple, runs: tuple) -> None:
    """While holder alone held it, region name was healthy and kept with its file (the same inode) by a stale cleanup
    that took the dead client's region gone, and a rerun changed nothing; with the holder SIGKILLed (Holder.stop),
    the same cleanup takes the region and its file."""
    (path, ino), (info, res, again) = file, runs
    held = _region(info, name)
    assert held['state'] == 'healthy' and [h['pid'] for h in held['holders']] == [holder], held
    assert _region(info, 'gone')['state'] == 'stale'
    assert not res.get('failed') and res['changed'] is True, res
    assert res['unregistered'] == ['gone'] and res['removed_files'] == [server.shm_path(gone.key)], res
    assert again['changed'] is False and again['unregistered'] == [] and again['removed_files'] == [], again
    assert name in server.system_regions() and os.stat(path).st_ino == ino
    after = run_module(REGION, dict(url=server.url, state='absent', stale=True))
    assert after['unregistered'] == [name] and after['removed_files'] == [path], after
    assert server.system_regions() == {} and server.shm_files() == []


# A client that creates its file, registers it (Triton's register call), then keeps it only through a private
# (copy-on-write) mapping: mmap(MAP_PRIVATE) from libc (Python's mmap keeps a dup of the fd), the fd closed.
PRIVATE_MAPPER = textwrap.dedent("""
    import ctypes, json, os, sys, urllib.request
    url, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fd = os.open('/dev/shm/' + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    os.pwrite(fd, b'\\1' * size, 0)
    body = json.dumps({'key': '/' + name, 'offset': 0, 'byte_size': size}).encode()
    req = urllib.request.Request(url + '/v2/systemsharedmemory/region/%s/register' % name, data=body, method='POST')
    urllib.request.urlopen(req, timeout=10).read()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, size, 3, 2, fd, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), 'mmap')
    os.close(fd)
    ctypes.memset(addr, 7, 4096)  # its own copy of the first page: the mapping stays the file's for the rest
    print('HOLDING', os.getpid(), flush=True)
    sys.stdin.read()
""")


def test_a_holder_whose_only_link_is_a_private_mapping_keeps_its_region_and_file(make_triton):
    server = make_triton(models=())
    gone = server.leak('gone', byte_size=MIB)  # a dead client's region beside it: the run does act
    holder = Holder(server, PRIVATE_MAPPER, 'private', str(MIB))
    try:
        pid = int(holder.line()[1])
        path = server.shm_path('private')
        ino = os.stat(path).st_ino
        fds, maps = _links(pid, '/dev/shm/private')
        assert fds == [] and maps and all(line.split()[1].endswith('p') for line in maps), (fds, maps)
        info = run_module(INFO, dict(url=server.url))
        res = run_module(REGION, dict(url=server.url, state='absent', stale=True))
        again = run_module(REGION, dict(url=server.url, state='absent', stale=True))
    finally:
        holder.stop()
    _kept_while_held_then_taken(server, 'private', pid, gone, (path, ino), (info, res, again))


# A client (tritonclient's own create_shared_memory_region, then Triton's register call) that forks a worker; the
# worker keeps the mapping it inherited and closes its descriptors of the file; the test SIGKILLs the client alone.
FORKING_CLIENT = textwrap.dedent("""
    import json, os, sys, time, urllib.request
    import tritonclient.utils.shared_memory as shm
    url, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    handle = shm.create_shared_memory_region(name, '/' + name, size)
    body = json.dumps({'key': '/' + name, 'offset': 0, 'byte_size': size}).encode()
    req = urllib.request.Request(url + '/v2/systemsharedmemory/region/%s/register' % name, data=body, method='POST')
    urllib.request.urlopen(req, timeout=10).read()
    if os.fork() == 0:
        for fd in os.listdir('/proc/self/fd'):
            try:
                if os.readlink('/proc/self/fd/' + fd) == '/dev/shm/' + name:
                    os.close(int(fd))
            except OSError:
                pass
        print('WORKER', os.getpid(), flush=True)
        while True:
            time.sleep(1)
    time.sleep(0.2)
    print('CLIENT', os.getpid(), flush=True)
    while True:
        time.sleep(1)
""")


def test_a_forked_child_still_mapping_the_file_after_its_parent_died_keeps_region_and_file(make_triton):
    server = make_triton(models=())
    gone = server.leak('gone', byte_size=MIB)
    holder = Holder(server, FORKING_CLIENT, 'forked', str(MIB))
    try:
        worker = int(holder.line()[1])
        client = int(holder.line()[1])
        path = server.shm_path('forked')
        ino = os.stat(path).st_ino
        os.kill(client, signal.SIGKILL)  # the registering client dies; its worker goes on
        if client == holder.proc.pid:
            holder.proc.wait(timeout=10)
        assert not os.path.exists(f'/proc/{client}') and os.path.isdir(f'/proc/{worker}')
        fds, maps = _links(worker, '/dev/shm/forked')
        assert fds == [] and maps, (fds, maps)
        info = run_module(INFO, dict(url=server.url))
        res = run_module(REGION, dict(url=server.url, state='absent', stale=True))
        again = run_module(REGION, dict(url=server.url, state='absent', stale=True))
        assert os.path.isdir(f'/proc/{worker}')
    finally:
        holder.stop()
    # the worker SIGKILLed too (with the client's resource tracker, which would unlink the file): then it goes
    _kept_while_held_then_taken(server, 'forked', worker, gone, (path, ino), (info, res, again))


# A local program's Unix socket (listening) and another's left behind (closed, never unlinked) in the shm directory;
# on each line read, the listening one is connected to again.
SOCKETS = textwrap.dedent("""
    import os, socket, sys
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.bind('/dev/shm/old_sock')
    old.close()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind('/dev/shm/client_sock')
    live.listen(4)
    print('LISTENING', os.getpid(), flush=True)
    for _line in sys.stdin:
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.connect('/dev/shm/client_sock')
        conn, _addr = live.accept()
        peer.sendall(b'ping')
        print('ANSWERED', conn.recv(4).decode(), flush=True)
        conn.close()
        peer.close()
""")


def test_unix_sockets_and_fifos_in_the_shm_directory_are_never_removed_even_under_a_bare_star(make_triton):
    server = make_triton(models=())
    gone = server.leak('gone', byte_size=MIB)
    left = server.write_file('client_left', 4096)
    os.mkfifo(server.shm_path('client_fifo'))
    holder = Holder(server, SOCKETS)
    try:
        assert holder.line()[0] == 'LISTENING'
        kinds = {'client_fifo': stat.S_ISFIFO, 'client_sock': stat.S_ISSOCK, 'old_sock': stat.S_ISSOCK}
        before = {n: os.lstat(server.shm_path(n)).st_ino for n in kinds}
        everything = dict(
            url=server.url,
            state='absent',
            stale=True,
            backend_leftovers=True,
            orphan_files=True,
            orphan_patterns=['*'],
            min_age=0,
        )
        res = run_module(REGION, everything)
        again = run_module(REGION, everything)
        info = run_module(INFO, dict(url=server.url, orphan_patterns=['*'], min_age=0))
        holder.send('ping')
        answered = holder.line()
    finally:
        holder.stop()
    assert not res.get('failed') and res['changed'] is True, res
    assert res['unregistered'] == ['gone'], res
    assert sorted(res['removed_files']) == sorted([server.shm_path(gone.key), left]), res['removed_files']
    assert again['changed'] is False and again['removed_files'] == [], again
    for name, kind in kinds.items():
        st = os.lstat(server.shm_path(name))
        assert kind(st.st_mode) and st.st_ino == before[name], name
    assert answered == ['ANSWERED', 'ping'], 'the listening socket still takes connections'
    files = {f['name']: f for f in info['files']}
    assert files['client_fifo']['category'] == 'foreign' and '(fifo)' in files['client_fifo']['category_reason']
    for name in ('client_sock', 'old_sock'):
        assert files[name]['category'] == 'foreign' and '(socket)' in files[name]['category_reason'], files[name]
    assert sorted(server.shm_files()) == sorted(kinds)


def _register(server: tritonrig.TritonServer, name: str, key: str, byte_size: int = MIB) -> tuple[int, str]:
    """Triton's register call from outside: (HTTP status, body)."""
    try:
        status, body = server.api(
            f'/v2/systemsharedmemory/region/{name}/register',
            method='POST',
            body={'key': key, 'offset': 0, 'byte_size': byte_size},
        )
        return status, json.dumps(body)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_two_regions_whose_keys_name_one_file_keep_it_while_either_stays(make_triton):
    """Triton 2.51 refuses a second region on a key already registered, but takes //dup beside /dup: shm_open strips
    the leading slashes and opens the same /dev/shm/dup. A dead client's regions one (/dup) and two (//dup)."""
    server = make_triton(models=())
    client = server.client('one', key='/dup', byte_size=MIB)
    refused = _register(server, 'again', '/dup')
    alias = _register(server, 'two', '//dup')
    client.kill(keep_file=True)
    path = server.shm_path('dup')
    ino = os.stat(path).st_ino
    assert refused[0] in (400, 500) and 'again' not in server.system_regions(), refused
    assert alias[0] == 200, alias
    with open(f'/proc/{server.pid}/maps') as f:
        assert sum(line.rstrip().endswith(' /dev/shm/dup') for line in f) == 2, 'Triton maps the file once per region'
    info = run_module(INFO, dict(url=server.url))
    stale = run_module(REGION, dict(url=server.url, state='absent', stale=True))
    states = {r['name']: r for r in info['system_regions']}
    assert states['one']['state'] == 'stale' and states['two']['state'] == 'unknown', states
    assert not stale.get('failed') and stale['changed'] is True and stale['unregistered'] == ['one'], stale
    assert stale['removed_files'] == [], 'the file of region two, still registered, was removed'
    # the server itself still maps it (for two) when the holders are scanned again right before the unlink
    why = {s['path']: s['reason'] for s in stale['skipped_items'] if 'path' in s}
    assert why == {path: f'held by {server.pid} (tritonserver) (re-checked before removal)'}, why
    assert os.stat(path).st_ino == ino and sorted(server.system_regions()) == ['two']
    assert server.shm_files() == ['dup'], 'renamed back from its quarantine name'
    with open(f'/proc/{server.pid}/maps') as f:
        assert [line for line in f if line.rstrip().endswith(' /dev/shm/dup')], 'Triton still maps it for two'
    # two unregistered by name: its key is not located, so its file is left to the orphan patterns
    named = run_module(REGION, dict(url=server.url, state='absent', name=['two']))
    orphan = run_module(
        REGION, dict(url=server.url, state='absent', orphan_files=True, orphan_patterns=['dup'], min_age=0)
    )
    assert named['unregistered'] == ['two'] and named['removed_files'] == [], named
    assert orphan['removed_files'] == [path], orphan
    assert server.system_regions() == {} and server.shm_files() == []


def test_a_region_name_registered_twice_is_refused_by_triton_and_the_first_is_kept(make_triton):
    server = make_triton(models=())
    live = server.client('dup', key='/first', byte_size=MIB)
    second = server.client('second', key='/second', byte_size=MIB, register=False)
    status, body = _register(server, 'dup', '/second')
    second.kill(keep_file=True)  # the second client dies after its refused register: its file is a plain leftover
    regions = server.system_regions()
    assert status == 400 and "region 'dup' already in manager" in body, (status, body)
    assert regions['dup']['key'] == '/first', regions
    stale = run_module(REGION, dict(url=server.url, state='absent', stale=True))
    info = run_module(INFO, dict(url=server.url))
    assert not stale.get('failed') and stale['changed'] is False and stale['unregistered'] == [], stale
    dup = _region(info, 'dup')
    assert dup['state'] == 'healthy' and [h['pid'] for h in dup['holders']] == [live.pid], dup
    assert server.system_regions()['dup']['key'] == '/first' and live.alive
    assert sorted(server.shm_files()) == ['first', 'second']
    # the client gone: its region goes, and the refused one's file is not the region's
    live.kill(keep_file=True)
    after = run_module(REGION, dict(url=server.url, state='absent', stale=True))
    assert after['unregistered'] == ['dup'] and after['removed_files'] == [server.shm_path('first')], after
    assert server.shm_files() == ['second']
