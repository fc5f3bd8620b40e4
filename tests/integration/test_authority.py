"""Issue 26: no borrowed authority, one server per URL, files matched by (device, inode), whose files go.

Real tritonservers (the rig), a real rootless tritonserver (``unshare -Ur`` as nobody, its own tmpfs), a real
unprivileged user (nobody) running a fake "tritonserver" in its own user and mount namespaces, real clients.
Each test fails on the code before issue 26 (see the report of the change) and passes after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
import time

import ansible_helpers
import pytest
import tritonrig

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
NOBODY = '65534'
AGED = 2.0  # seconds: an orphan's min_age; the test waits until the file is older (tritonrig.wait_older)


def run(module, **args):
    return ansible_helpers.run_module(module, args)


def register(server, name, key, byte_size=4096):
    """Register a region from outside (an unauthenticated client's call)."""
    status, _body = server.api(
        f'/v2/systemsharedmemory/region/{name}/register',
        method='POST',
        body={'key': key, 'offset': 0, 'byte_size': byte_size},
    )
    assert status == 200


def client_files(server):
    """The files of a server's /dev/shm but its python backend's (the echo model's)."""
    return sorted(f for f in server.shm_files() if f not in server.backend_files())


def reasons(result):
    return {s.get('path', s.get('name')): s['reason'] for s in result.get('skipped_items', [])}


@pytest.fixture
def open_dir():
    """A directory every user can read and traverse (pytest's tmp_path is root's own)."""
    path = tempfile.mkdtemp(prefix='authority-')
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- finding 1: a fake "tritonserver" in an unprivileged user namespace lends root nothing --------------------

FAKE_SERVER = textwrap.dedent("""
    import ctypes, json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    ctypes.CDLL(None).prctl(15, b'tritonserver', 0, 0, 0)
    port, names = int(sys.argv[1]), sys.argv[2:]
    regions = {n: {'name': n, 'key': '/' + n, 'offset': 0, 'byte_size': 16} for n in names}
    META = {'name': 'triton', 'version': '2.51.0', 'extensions': ['system_shared_memory']}

    class H(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        def log_message(self, *a):
            pass
        def answer(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            if self.path == '/v2':
                return self.answer(META)
            if self.path.startswith('/v2/health/'):
                return self.answer({})
            if self.path == '/v2/systemsharedmemory/status':
                return self.answer(list(regions.values()))
            self.answer({})
        def do_POST(self):
            self.rfile.read(int(self.headers.get('Content-Length') or 0))
            parts = self.path.split('/')
            if len(parts) == 6 and parts[5] == 'unregister':
                regions.pop(parts[4], None)
            self.answer({})

    print('READY', flush=True)
    ThreadingHTTPServer(('127.0.0.1', port), H).serve_forever()
""")

VICTIMS = ('important.conf', 'id_ed25519', 'app.db')


@pytest.fixture
def fake_server(open_dir):
    """nobody, in its own user and mount namespaces, bind-mounts a root-owned directory over its /dev/shm and
    runs a fake "tritonserver" whose status lists that directory's files as its regions.

    The root-owned directory is on a tmpfs of a mount namespace of the test's own (as a host's /run or /dev/shm
    is), so that the holder scan is complete here (this sandbox's PID 1 cannot be read).
    """
    ns = tritonrig.ShmNamespace(shm_size='8m').start()
    victims = os.path.join(ns.shm_dir, 'victims')
    os.mkdir(victims, 0o755)
    for name in VICTIMS:
        path = os.path.join(victims, name)
        with open(path, 'wb') as f:
            f.write(b'secret\n')
        os.chmod(path, 0o600)
    script = os.path.join(open_dir, 'fake.py')
    with open(script, 'w') as f:
        f.write(FAKE_SERVER)
    os.chmod(script, 0o644)
    port = tritonrig.free_port()
    nobody = ['setpriv', '--reuid', NOBODY, '--regid', NOBODY, '--clear-groups']
    shell = 'mount --bind /dev/shm/victims /dev/shm && exec /usr/bin/python3 "$0" "$@"'
    proc = subprocess.Popen(
        ['nsenter', '--mount', '--target', str(ns.pid)]
        + nobody
        + ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c', shell, script, str(port), *VICTIMS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line == 'READY', proc.stderr.read()
        # nobody's own rm is refused: the directory is root's
        rm = subprocess.run(
            ['nsenter', '--mount', '--target', str(ns.pid)] + nobody + ['rm', '-f', '/dev/shm/victims/app.db'],
            capture_output=True,
            text=True,
            check=False,
        )
        assert rm.returncode != 0 and os.path.exists(os.path.join(victims, 'app.db')), rm
        yield dict(url=f'http://127.0.0.1:{port}', pid=proc.pid, victims=victims)
    finally:
        proc.kill()
        proc.wait()
        ns.stop()


def test_a_fake_server_in_a_user_namespace_gets_root_to_remove_nothing(fake_server):
    res = run(
        REGION, url=fake_server['url'], state='absent', stale=True, orphan_files=True, orphan_patterns=['*'], min_age=0
    )
    assert not res.get('failed'), res
    left = sorted(os.listdir(fake_server['victims']))
    assert left == sorted(VICTIMS), f"root removed files on an unprivileged user's word: {res.get('removed_files')}"
    assert res['removed_files'] == []
    why = {os.path.basename(k): v for k, v in reasons(res).items()}
    for name in VICTIMS:
        assert 'no borrowed authority' in why.get(name, ''), res
    # the info module says the same: nothing there is the fake's to remove
    info = run(INFO, url=fake_server['url'], orphan_patterns=['*'], min_age=0)
    assert info['server']['pid'] == fake_server['pid']
    assert {f['category'] for f in info['files']} <= {'foreign', 'registered'}


def test_a_rootless_server_still_gets_its_own_leaks_cleaned(open_dir):
    """A real tritonserver run by nobody in a user namespace of its own (as rootless podman runs it): the files its
    clients leave (owned by the server's user on the host) are cleaned as before."""
    server = tritonrig.TritonServer(workdir=open_dir, models=(), run_as=NOBODY, shm_size='16m')
    server.start()
    try:
        make = 'head -c 65536 /dev/zero > /dev/shm/rootless_leak && head -c 4096 /dev/zero > /dev/shm/client_old'
        subprocess.run(['nsenter', '--user', '--mount', '--target', str(server.pid), 'sh', '-c', make], check=True)
        assert os.stat(server.shm_path('rootless_leak')).st_uid == int(NOBODY)
        register(server, 'rl', '/rootless_leak', 65536)
        tritonrig.wait_older([server.shm_path('client_old')], AGED)
        orphans = dict(orphan_files=True, orphan_patterns=['client_*'], min_age=AGED)
        res = run(REGION, url=server.url, state='absent', stale=True, **orphans)
        assert not res.get('failed'), res
        assert res['unregistered'] == ['rl']
        assert sorted(os.path.basename(p) for p in res['removed_files']) == ['client_old', 'rootless_leak']
        assert server.shm_files() == []
    finally:
        server.cleanup()


@pytest.mark.skipif(os.uname().machine != 'x86_64', reason='system call numbers are x86_64 ones')
def test_a_rootless_servers_file_is_quarantined_as_its_owner_never_unlinked_in_place(open_dir, tmp_path):
    """Issue 40, goal 5. On a tmpfs mounted in another user namespace root's ids are not mapped, so the kernel refuses
    root the quarantine rename (EOVERFLOW); 0.2.x then unlinked the file in place after the re-check, and a client that
    opened and mapped it by name in between lost it. Now the rename runs as the directory's owner (mapped there): the
    module, stopped in its first unlink (after the rename and the re-check), has left no file under the region's name,
    so a client opening it finds nothing rather than a file about to go."""
    from test_races import ModuleRun  # the strace-stopped module run

    server = tritonrig.TritonServer(workdir=open_dir, models=(), run_as=NOBODY, shm_size='16m')
    server.start()
    stopped = None
    try:
        subprocess.run(
            [
                'nsenter',
                '--user',
                '--mount',
                '--target',
                str(server.pid),
                'sh',
                '-c',
                'head -c 65536 /dev/zero > /dev/shm/rl',
            ],
            check=True,
        )
        register(server, 'rl', '/rl', 65536)
        stopped = ModuleRun(
            REGION, dict(url=server.url, state='absent', stale=True), tmp_path, delay_in=('unlinkat',), delay_s=30
        )
        assert stopped.wait_stopped(('unlinkat',), timeout=120), 'the module never reached its first unlink'
        names = server.shm_files()
        assert 'rl' not in names, 'the file is still under its name at the unlink: a client could open it'
        (quarantined,) = [n for n in names if n.startswith('.tritonops_shm.quarantine.')]
        assert os.stat(server.shm_path(quarantined)).st_uid == int(NOBODY)
        stopped.kill()
        stopped = None
        # the rerun finishes what the killed run left, as the owner again
        res = run(REGION, url=server.url, state='absent', stale=True)
        assert not res.get('failed'), res
        assert server.shm_files() == [] and 'rl' not in server.system_regions(), (server.shm_files(), res)
    finally:
        if stopped is not None:
            stopped.kill()
        server.cleanup()


# -- finding 2: two servers on one port ---------------------------------------------------------------------


def two_on_one_port(make_triton):
    """Two real servers with --reuse-http-port on one port, each listening (the second one's readiness is answered
    by the first: wait until it holds its own listening socket)."""
    port = tritonrig.free_port()
    servers = [
        make_triton(models=(), http_port=port, extra_args=('--reuse-http-port', 'true'), shm_size='16m')
        for _server in range(2)
    ]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listing = subprocess.run(
            ['ss', '-ltnpH', f'sport = :{port}'], capture_output=True, text=True, check=False
        ).stdout
        if all(f'pid={s.pid},' in listing for s in servers):
            return servers
        time.sleep(0.2)
    raise AssertionError(f'both servers did not listen on {port}: {listing}')


def test_two_servers_sharing_a_port_are_refused_unless_server_pid_says_which(make_triton):
    x, y = two_on_one_port(make_triton)
    # a live client on each: whichever server a call reaches, the other's region must never be judged by its files
    for server in (x, y):
        server.write_file('live_' + server.name, 4096)
    res = run(REGION, url=x.url, state='absent', stale=True)
    assert res.get('failed'), res
    assert 'listen on 127.0.0.1' in res['msg'] and 'server_pid' in res['msg'], res['msg']
    info = run(INFO, url=x.url)
    assert info['server']['pid'] is None and 'reuse-http-port' in info['server']['not_found_reason']
    assert info['summary']['stale_regions'] == 0
    # server_pid says which: that one is judged by its own files
    named = run(INFO, url=x.url, server_pid=x.pid)
    assert named['server']['pid'] == x.pid and not named.get('failed')


# -- finding 4: unlinked-but-mapped files are matched by (device, inode) ------------------------------------


def test_a_live_clients_unlinked_file_is_not_judged_by_a_new_file_of_its_name(triton):
    live = triton.client('live', key='/k', byte_size=4096)
    os.unlink(triton.shm_path('k'))  # the live client unlinks its file right after registering it
    triton.write_file('k', 4096)  # a dead client's file under the same name ...
    register(triton, 'dead', '//k')  # ... registered as //k (Triton 2.51 opens /dev/shm/k)
    res = run(REGION, url=triton.url, state='absent', stale=True)
    assert not res.get('failed'), res
    assert 'live' in triton.system_regions(), 'the live client lost its region'
    assert live.alive
    info = run(INFO, url=triton.url)
    state = {r['name']: r for r in info['system_regions']}['live']
    assert state['state'] == 'unknown' and 'cannot be told' in state['state_reason']


def test_a_file_literally_named_deleted_is_not_the_live_clients(triton):
    # a dead client's file literally named "k (deleted)": Triton's maps print it as an unlinked /dev/shm/k
    triton.write_file('k (deleted)', 4096)
    register(triton, 'dead', '/k (deleted)')
    live = triton.client('live', key='/k', byte_size=4096)
    os.unlink(triton.shm_path('k'))  # the live client unlinks its file right after registering it
    res = run(REGION, url=triton.url, state='absent', stale=True)
    assert not res.get('failed'), res
    regions = triton.system_regions()
    assert 'live' in regions and live.alive, f'the live client lost its region: {res.get("unregistered")}'
    assert res['unregistered'] == ['dead'] and 'dead' not in regions
    assert client_files(triton) == []


# -- finding 5: another program's file is never removed on a client's word ----------------------------------

PG = 'PostgreSQL.1804289383'


def _plant_pg(triton):
    path = triton.write_file(PG, 4096)
    os.chown(path, 999, 999)
    os.chmod(path, 0o600)
    register(triton, 'pg', '/' + PG)
    return path


def test_a_file_of_another_user_is_kept_unless_client_users_names_it(triton):
    path = _plant_pg(triton)
    triton.leak('normal', byte_size=4096)  # a normal leak: the client ran as the server's user (root)
    res = run(REGION, url=triton.url, state='absent', stale=True)
    assert not res.get('failed'), res
    assert sorted(res['unregistered']) == ['normal', 'pg']  # unregistering is harmless: Triton only unmaps it
    assert os.path.exists(path), "another program's file was removed on a client's word"
    assert 'owned by uid 999' in reasons(res)[path]
    assert [os.path.basename(p) for p in res['removed_files']] == ['normal']
    # the operator says uid 999 runs clients: now it goes
    register(triton, 'pg', '/' + PG)
    res = run(REGION, url=triton.url, state='absent', stale=True, client_users=['999'])
    assert not res.get('failed'), res
    assert res['unregistered'] == ['pg'] and res['removed_files'] == [path]
    assert not os.path.exists(path)


# -- finding 8: well-known families of other software are never orphans --------------------------------------

OTHERS = (
    '.org.chromium.Chromium.Xy12',
    'sem.mp-7f3a',
    'pulse-shm-1234567',
    'vader_segment.node1.1a2b.0',
    'PostgreSQL.42',
    'nccl-AbCdEf',
    'torch_123_456',
)


def test_other_softwares_files_are_never_orphans_even_under_a_bare_star(triton):
    for name in OTHERS:
        triton.write_file(name, 4096)
    triton.write_file('client_left', 4096)
    other_user = triton.write_file('someone_elses', 4096)
    os.chown(other_user, 1000, 1000)
    res = run(REGION, url=triton.url, state='absent', orphan_files=True, orphan_patterns=['*'], min_age=0)
    assert not res.get('failed'), res
    assert [os.path.basename(p) for p in res['removed_files']] == ['client_left']
    assert client_files(triton) == sorted(OTHERS + ('someone_elses',))
    assert any('matches every file name' in w for w in res.get('warnings', [])), res.get('warnings')
    info = run(INFO, url=triton.url, orphan_patterns=['*'], min_age=0)
    files = {f['name']: f for f in info['files']}
    assert all(files[n]['category'] == 'foreign' and 'never an orphan' in files[n]['category_reason'] for n in OTHERS)
    assert 'owned by uid 1000' in files['someone_elses']['category_reason']


def _mapped_shm_names(pid):
    with open(f'/proc/{pid}/maps') as f:
        return {line.split('/dev/shm/', 1)[1].strip() for line in f if '/dev/shm/' in line}


def test_with_server_pid_on_a_shared_port_the_other_servers_regions_are_never_touched(make_triton):
    """The kernel picks X or Y for each connection to the shared port: the runs go on until at least two of them
    were answered by Y (its status lists only its own regions, so each run's answer shows which server it reached),
    and one by X. The code before the fix unregisters Y's regions in each run Y answers (their files in X's /dev/shm
    are held by nobody: stale)."""
    x, y = two_on_one_port(make_triton)
    names, on_y = [], set()
    for i in range(64):  # the same file name in both servers' /dev/shm; each register lands on either server
        name = f'shared_{i}'
        x.write_file(name, 4096)
        y.write_file(name, 4096)
        register(x, 'r_' + name, '/' + name)
        names.append(name)
        on_y = _mapped_shm_names(y.pid) & set(names)
        if len(names) >= 8 and 2 <= len(on_y) <= len(names) - 2:
            break
    assert 2 <= len(on_y) <= len(names) - 2, f'the kernel did not spread {len(names)} registers over both servers'
    y_regions = {'r_' + n for n in on_y}
    x_regions = {'r_' + n for n in names} - y_regions
    answered = []
    for _attempt in range(30):
        res = run(REGION, url=x.url, server_pid=x.pid, state='absent', stale=True, inventory=True)
        assert not res.get('failed'), res
        assert any('judged only by the regions whose files it maps' in w for w in res.get('warnings', [])), res
        assert _mapped_shm_names(y.pid) & set(names) == on_y, (
            f'a region of server Y was unregistered: {res["unregistered"]}'
        )
        seen = {r['name']: r for r in res['before']['system_regions']}
        if set(seen) & y_regions:  # Y answered the status: its regions were judged, none by X's files
            assert set(seen) == y_regions, sorted(seen)
            assert all(r['state'] == 'unknown' and 'port is shared' in r['state_reason'] for r in seen.values()), seen
            assert res['unregistered'] == [] and res['removed_files'] == [], res
            answered.append('Y')
        else:  # X answered: its own regions, mapped by nobody but X, are stale and go (in its first such run)
            assert set(seen) <= x_regions, sorted(seen)
            assert set(res['unregistered']) == set(seen), res['unregistered']
            answered.append('X')
        if answered.count('Y') >= 2 and 'X' in answered:
            break
    print('FIGURE shared_port_runs: %s (%d of %d regions on Y)' % (''.join(answered), len(on_y), len(names)))
    assert answered.count('Y') >= 2 and 'X' in answered, f'the kernel sent the runs to {answered}'
    # Triton maps every registered file: Y still serves all its regions from its files; X let its stale ones go
    assert set(os.listdir(y.shm_dir)) >= on_y and _mapped_shm_names(y.pid) & set(names) == on_y
    assert _mapped_shm_names(x.pid) & set(names) == set()
