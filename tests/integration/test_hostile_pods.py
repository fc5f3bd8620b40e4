"""Issue 33: hostile pods and co-tenants, each attack for real, with the modules run as root as the node agent runs them.

- **Paths through another root.** A pod's root (uid 0, Docker's default capabilities, its own PID and mount
  namespaces) runs a process named tritonserver that chroots into a directory whose ``dev/shm`` (or ``dev``) is a
  symlink, absolute or relative, to a directory of the node's files, and lists those files as its regions. Handed to
  the kernel whole, /proc/PID/root/dev/shm reaches the node's files (0.2.0 removed them, three of three). The node's
  files here live on a tmpfs of a mount namespace of the test's own (a host's /run is one), so that the holder scan is
  complete on this machine, whose PID 1 cannot be read.
- **One server, one row.** A fake that answers 500 on the shm status and one that never answers, both with a lower
  pid than a real server with a killed client's region: one node agent round still cleans the real one.
- **Lock squatting.** A uid-0 process of another PID namespace holds the flock on the server's /dev/shm.
- **Reload on a stranger's word.** nobody, a co-tenant of the server's 1777 /dev/shm, holds a 20 MiB pool file from a
  process whose command line says it is the stub of model echo.
- **Reload under a sequence.** A stateful model is reloaded only with the opt-in.

Each attack fails on 0.2.0 (the modules as they were) and passes now.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
import threading
import time

import ansible_helpers
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonrig

REGION = 'tritonops.shm.triton_shm_region'
INFO = 'tritonops.shm.triton_shm_info'
POOL = 'tritonops.shm.triton_backend_pool'
NOBODY = '65534'
VICTIMS = ('important.conf', 'id_ed25519', 'app.db')
# Docker's (and containerd's) default capabilities of a container's root
DOCKER_CAPS = (
    'chown,dac_override,fowner,fsetid,kill,setgid,setuid,setpcap,net_bind_service,net_raw,sys_chroot,mknod,'
    'audit_write,setfcap'
)

# A process that says it is tritonserver: it answers Triton's API (metadata, health, the shm status, unregister),
# listing NAMES as its system regions; then, with --chroot DIR, it chroots into DIR (what a pod's root may do).
# --status-error answers 500 on the status; --hang accepts and never answers anything. Its command line has
# --http-port PORT, as tritonserver's (anyone can write one): the node agent takes it for an HTTP port.
FAKE = textwrap.dedent("""
    import argparse, ctypes, json, os, socket, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    p = argparse.ArgumentParser()
    p.add_argument('--http-port', dest='port', type=int, required=True)  # as tritonserver's: the node agent reads it
    p.add_argument('names', nargs='*')
    p.add_argument('--chroot')
    p.add_argument('--status-error', action='store_true')
    p.add_argument('--hang', action='store_true')
    a = p.parse_args()
    ctypes.CDLL(None).prctl(15, b'tritonserver', 0, 0, 0)
    regions = {n: {'name': n, 'key': '/' + n, 'offset': 0, 'byte_size': 16} for n in a.names}
    META = {'name': 'triton', 'version': '2.51.0', 'extensions': ['system_shared_memory']}

    class H(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        def log_message(self, *args):
            pass
        def answer(self, body, code=200):
            data = json.dumps(body).encode()
            self.send_response(code)
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
                if a.status_error:
                    return self.answer({'error': 'internal error'}, 500)
                return self.answer(list(regions.values()))
            self.answer({})
        def do_POST(self):
            self.rfile.read(int(self.headers.get('Content-Length') or 0))
            parts = self.path.split('/')
            if len(parts) == 6 and parts[5] == 'unregister':
                regions.pop(parts[4], None)
            self.answer({})

    if a.hang:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(('127.0.0.1', a.port))
        s.listen(64)
        print('READY', flush=True)
        held = []
        while True:
            held.append(s.accept()[0])  # never answered
    server = ThreadingHTTPServer(('127.0.0.1', a.port), H)
    if a.chroot:
        os.chroot(a.chroot)
        os.chdir('/')
    print('READY', flush=True)
    server.serve_forever()
""")


class Fake:
    """A fake tritonserver started with prefix (namespaces, a user); pid is the fake's own pid as the host sees it."""

    def __init__(self, script: str, args: list[str], prefix: list[str] = ()) -> None:
        self.port = tritonrig.free_port()
        self.proc = subprocess.Popen(
            [*prefix, '/usr/bin/python3', script, '--http-port', str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if line != 'READY':
            self.proc.kill()
            raise AssertionError(f'fake did not start: {line!r} {self.proc.stderr.read()[-2000:]}')
        self.pid = _descendant_named(self.proc.pid, 'tritonserver')
        self.url = f'http://127.0.0.1:{self.port}'

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _descendant_named(pid: int, comm: str, timeout: float = 10.0) -> int:
    """pid or the first process below it (by /proc children) whose comm is comm (prefixes exec, or fork: unshare)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        todo = [pid]
        while todo:
            p = todo.pop(0)
            try:
                with open(f'/proc/{p}/comm') as f:
                    if f.read().strip() == comm:
                        return p
                with open(f'/proc/{p}/task/{p}/children') as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                continue
        time.sleep(0.02)
    raise AssertionError(f'no {comm} below {pid}')


@pytest.fixture
def workdir():
    """A directory every user can read and traverse (pytest's tmp_path is root's own)."""
    path = tempfile.mkdtemp(prefix='hostile-pods-')
    os.chmod(path, 0o755)
    with open(os.path.join(path, 'fake.py'), 'w') as f:
        f.write(FAKE)
    os.chmod(os.path.join(path, 'fake.py'), 0o644)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node_files():
    """The node's files: VICTIMS in NS/vparent/shm, on the tmpfs of a mount namespace of the test's own, and a
    root-only directory there too. Yields (namespace, vparent path as the host reaches it)."""
    ns = tritonrig.ShmNamespace(shm_size='8m').start()
    vparent = os.path.join(ns.shm_dir, 'vparent')
    os.makedirs(os.path.join(vparent, 'shm'))
    for name in VICTIMS:
        path = os.path.join(vparent, 'shm', name)
        with open(path, 'wb') as f:
            f.write(b'node secret\n')
        os.chmod(path, 0o600)
    try:
        yield ns, vparent
    finally:
        ns.stop()


def left(vparent: str) -> list[str]:
    return sorted(os.listdir(os.path.join(vparent, 'shm')))


def _pod_root(workdir: str, step: str, kind: str, vparent: str) -> str:
    """The fake pod's root directory, with a symlink (absolute or relative) at step: dev, dev/shm, or each file."""
    root = os.path.join(workdir, 'podroot')
    os.makedirs(os.path.join(root, 'dev'))
    targets = {'dev': vparent, 'shm': os.path.join(vparent, 'shm')}
    if step == 'file':
        os.makedirs(os.path.join(root, 'dev', 'shm'))
        for name in VICTIMS:
            link = os.path.join(root, 'dev', 'shm', name)
            target = os.path.join(vparent, 'shm', name)
            os.symlink(target if kind == 'absolute' else os.path.relpath(target, os.path.dirname(link)), link)
        return root
    link = os.path.join(root, 'dev') if step == 'dev' else os.path.join(root, 'dev', 'shm')
    if step == 'dev':
        os.rmdir(link)
    target = targets[step]
    os.symlink(target if kind == 'absolute' else os.path.relpath(target, os.path.dirname(link)), link)
    return root


def pod_root_fake(workdir: str, root: str, names=VICTIMS) -> Fake:
    """The hostile pod: uid 0 with Docker's default capabilities, its own PID and mount namespaces, chrooted."""
    prefix = [
        'unshare', '--pid', '--fork', '--kill-child', '--mount', '--propagation', 'private',
        'setpriv', f'--bounding-set=-all,{",".join("+" + c for c in DOCKER_CAPS.split(","))}', '--',
    ]  # fmt: skip
    return Fake(os.path.join(workdir, 'fake.py'), [*names, '--chroot', root], prefix)


STEPS = [(step, kind) for step in ('dev', 'shm', 'file') for kind in ('absolute', 'relative')]


@pytest.mark.parametrize('step, kind', STEPS, ids=[f'{s}-{k}' for s, k in STEPS])
def test_a_pod_root_that_chroots_through_a_symlink_gets_no_node_file_removed(workdir, node_files, step, kind):
    ns, vparent = node_files
    root = _pod_root(workdir, step, kind, vparent)
    # the attack is real: handed to the kernel whole, the server's /dev/shm is the node's directory
    fake = pod_root_fake(workdir, root)
    try:
        seen = os.listdir(f'/proc/{fake.pid}/root/dev/shm')
        assert sorted(seen) == sorted(VICTIMS)
        with open(f'/proc/{fake.pid}/status') as f:
            status = f.read()
        assert '\nUid:\t0\t0\t0\t0' in status, 'the pod runs as root'
        res = ansible_helpers.run_module(REGION, {'url': fake.url, 'state': 'absent', 'stale': True})
        assert not res.get('failed'), res
        assert left(vparent) == sorted(VICTIMS), f'node files removed: {res.get("removed_files")}'
        assert res['removed_files'] == [] and res['unregistered'] == []
        info = ansible_helpers.run_module(INFO, {'url': fake.url})
        assert info['server']['pid'] == fake.pid
        if step == 'file':
            # the directory is the pod's own; each file is a symlink: never a regular file, never removed
            assert {r['state'] for r in info['system_regions']} == {'unknown'}
            assert {f['category'] for f in info['files']} == {'foreign'}
        else:
            assert info['holders_complete'] is False and info['server']['shm_dir'] is None
            where = f'/proc/{fake.pid}/root/dev' + ('' if step == 'dev' else '/shm')
            assert f'{where} is a symlink' in info['holders_incomplete_reason'], info['holders_incomplete_reason']
            assert {r['state'] for r in info['system_regions']} == {'unknown'}
    finally:
        fake.stop()


def test_the_node_agent_finds_the_hostile_pod_by_itself_and_removes_nothing(workdir, node_files):
    """The node agent lists the fake by itself (a tritonserver listening on a port) and fails its round, naming it."""
    ns, vparent = node_files
    fake = pod_root_fake(workdir, _pod_root(workdir, 'shm', 'absolute', vparent))
    try:
        res = ansible_helpers.ansible_playbook(
            'tritonops.shm.node_agent',
            inventory='node1,',
            extra_vars={
                'target': 'node1',
                'node_agent_select': rf'\(pid {fake.pid}\)$',
                'node_agent_server_timeout': 60,
                'node_agent_state_file': os.path.join(workdir, 'node_agent.json'),  # not the machine's own
            },
        )
        assert left(vparent) == sorted(VICTIMS)
        assert res.rc != 0, res
        msg = res.task('Fail for the servers whose holders could not all be seen', host='node1')['msg']
        assert f'tritonserver (pid {fake.pid})' in msg and 'is a symlink' in msg, msg
    finally:
        fake.stop()


def test_a_bind_mount_of_a_root_only_directory_is_the_pods_view_and_lends_it_no_authority(workdir, node_files):
    """The pod's /dev/shm is a bind mount of a root-only node directory (mode 0700), the pod's process nobody in a user
    namespace of its own: the path is resolved in its root (a mount, not a symlink), and the owner of that root may not
    remove anything in a directory it cannot write: nothing is removed."""
    ns, vparent = node_files
    rootonly = os.path.join(vparent, 'shm')
    os.chmod(rootonly, 0o700)
    root = os.path.join(workdir, 'podroot')
    os.makedirs(os.path.join(root, 'dev', 'shm'))
    shell = f'mount --bind {rootonly} {root}/dev/shm && exec "$@"'
    prefix = [
        'nsenter', '--mount', '--target', str(ns.pid), 'unshare', '--mount', '--propagation', 'private',
        'sh', '-c', shell, 'sh',
        'setpriv', '--reuid', NOBODY, '--regid', NOBODY, '--clear-groups', 'unshare', '--user', '--map-root-user',
    ]  # fmt: skip
    fake = Fake(os.path.join(workdir, 'fake.py'), [*VICTIMS, '--chroot', root], prefix)
    try:
        res = ansible_helpers.run_module(REGION, {'url': fake.url, 'state': 'absent', 'stale': True})
        assert not res.get('failed'), res
        assert left(vparent) == sorted(VICTIMS)
        why = {os.path.basename(s.get('path', s.get('name'))): s['reason'] for s in res.get('skipped_items', [])}
        for name in VICTIMS:
            assert 'no borrowed authority' in why.get(name, ''), res
    finally:
        fake.stop()


# -- one server, one row ------------------------------------------------------------------------------------------


def test_one_node_agent_round_cleans_the_real_server_beside_a_failing_and_a_hanging_one(workdir, tmp_path):
    """Two fakes with lower pids than the real server: one answers 500 on the status, one never answers. The round
    cleans the real server's stale region, gives each fake its own failed row, and ends within its bounds."""
    script = os.path.join(workdir, 'fake.py')
    failing = Fake(script, ['--status-error'])
    hanging = Fake(script, ['--hang'])
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=())
    try:
        server.start()
        assert failing.pid < hanging.pid < server.pid
        server.leak('dead', byte_size=1 << 20)
        assert 'dead' in server.system_regions()
        pids = '|'.join(str(p) for p in (failing.pid, hanging.pid, server.pid))
        start = time.monotonic()
        res = ansible_helpers.ansible_playbook(
            'tritonops.shm.node_agent',
            inventory='node1,',
            extra_vars={
                'target': 'node1',
                'node_agent_select': rf'\(pid ({pids})\)$',
                'node_agent_server_timeout': 20,
                'shm_cleanup_timeout': 3,
                'node_agent_state_file': str(tmp_path / 'node_agent.json'),  # not the machine's own
            },
            timeout=600,
        )
        took = time.monotonic() - start
        assert 'dead' not in server.system_regions(), res.stdout[-3000:]
        assert 'dead' not in server.shm_files()
        assert res.rc != 0
        msg = res.task('Fail for the servers whose cleanup or check failed (every other server was cleaned)', 'node1')
        text = msg['msg']
        assert f'tritonserver (pid {failing.pid})' in text and '500' in text, text
        assert f'tritonserver (pid {hanging.pid})' in text, text
        assert f'tritonserver (pid {server.pid})' not in text, text
        print(f'FIGURE one_row: the round with a failing and a hanging server took {took:.1f}s')
        assert took < 240, took
    finally:
        server.cleanup()
        failing.stop()
        hanging.stop()


# -- lock squatting -----------------------------------------------------------------------------------------------

SQUAT = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print('LOCKED', flush=True)
    time.sleep(600)
""")


def test_a_uid0_sidecar_holding_the_shm_directory_flock_stalls_no_cleanup(tmp_path):
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=())
    squatter = None
    try:
        server.start()
        server.leak('dead', byte_size=1 << 20)
        # a rootful sidecar: uid 0, its own PID namespace, the server's /dev/shm
        squatter = subprocess.Popen(
            ['nsenter', '--mount', '--target', str(server.pid), 'unshare', '--pid', '--fork', '--kill-child',
             '/usr/bin/python3', '-c', SQUAT, '/dev/shm'],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert squatter.stdout.readline().strip() == 'LOCKED'
        holder = _descendant_named(squatter.pid, 'python3')
        start = time.monotonic()
        play = [
            {
                'name': 'clean',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'tasks': [{'name': 'the module', REGION: {'url': server.url, 'state': 'absent', 'stale': True}}],
            }
        ]
        res = ansible_helpers.ansible_playbook(play, timeout=120)
        took = time.monotonic() - start
        result = res.task('the module')
        assert result['unregistered'] == ['dead'] and server.shm_files() == [], result
        warned = [w for w in result.get('warnings', []) if 'not waiting for it' in w]
        assert warned and f'pid {holder} (python3, uid 0)' in warned[0], result.get('warnings')
        print(f'FIGURE lock_squat: cleanup done in {took:.1f}s with a uid-0 sidecar holding the flock')
        assert took < 60, took
    finally:
        if squatter is not None:
            squatter.kill()
            squatter.wait()
        server.cleanup()


# -- reload on a stranger's word ----------------------------------------------------------------------------------

# nobody's pool: a 20 MiB triton_python_backend_shm_region_* file, mapped by a process whose command line is a
# python stub's, naming the model echo (argv[1] .../echo/1/model.py, argv[8] echo_0_0)
STRANGER = textwrap.dedent("""
    import mmap, os, sys, time
    name = sys.argv[1]
    fd = os.open('/dev/shm/' + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 20 << 20)
    m = mmap.mmap(fd, 20 << 20)
    m.write(b'\\1' * (20 << 20))
    print('READY', flush=True)
    time.sleep(600)
""")


def test_a_pool_claimed_by_a_strangers_command_line_is_never_reloaded(workdir, tmp_path):
    models = os.path.join(workdir, 'evil', 'echo', '1')
    os.makedirs(models)
    for d in ('evil', 'evil/echo', 'evil/echo/1'):
        os.chmod(os.path.join(workdir, d), 0o755)
    with open(os.path.join(models, 'model.py'), 'w') as f:
        f.write(STRANGER)
    os.chmod(os.path.join(models, 'model.py'), 0o644)
    server = tritonrig.TritonServer(workdir=str(tmp_path / 'srv'), models=('echo',))
    stranger = None
    try:
        server.start()
        echo_pools = server.backend_files()
        name = 'triton_python_backend_shm_region_stranger'
        argv = ['triton_python_backend_stub', os.path.join(models, 'model.py'), name, '1048576', '1048576',
                str(server.pid), '/usr/lib', '0', 'echo_0_0', 'DEFAULT']  # fmt: skip
        code = f'import os; os.execv("/usr/bin/python3", {argv!r})'
        stranger = subprocess.Popen(
            ['nsenter', '--mount', '--target', str(server.pid), 'setpriv', '--reuid', NOBODY, '--regid', NOBODY,
             '--clear-groups', '/usr/bin/python3', '-c', code],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert stranger.stdout.readline().strip() == 'READY'
        with open(f'/proc/{stranger.pid}/cmdline', 'rb') as f:
            assert f.read().split(b'\0')[0] == b'triton_python_backend_stub'
        res = ansible_helpers.run_module(POOL, {'url': server.url, 'max_percent': 25})
        assert not res.get('failed'), res
        assert res['reloaded'] == [] and res['changed'] is False, res
        assert set(echo_pools) <= set(server.backend_files()), 'echo was reloaded'
        # what the self_heal_pools rulebook hands over for an alert naming echo (shm_cleanup_reload_pools_models)
        res = ansible_helpers.run_module(POOL, {'url': server.url, 'max_percent': 25, 'models': ['echo']})
        assert not res.get('failed') and res['reloaded'] == [] and res['changed'] is False, res
        assert set(echo_pools) <= set(server.backend_files()), 'echo was reloaded on the alert'
        info = ansible_helpers.run_module(INFO, {'url': server.url})
        pools = {p['name']: p for p in info['backend_pools']}
        assert pools[name]['model'] is None
        assert (
            f'pid {stranger.pid} is not a child of the server process {server.pid}'
            in (pools[name]['unattributed_reason'])
        ), pools[name]
        assert "its command line's model 'echo' is not believed" in pools[name]['unattributed_reason']
        # the real stub's pool is still the echo model's
        assert [p['model'] for n, p in pools.items() if n in echo_pools] == ['echo'] * len(echo_pools)
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait()
        server.cleanup()


# -- reload under a sequence --------------------------------------------------------------------------------------


class Sequences:
    """A client streaming sequences of 5 requests to model seq, checking each running sum."""

    def __init__(self, url: str) -> None:
        self.url = url.split('://', 1)[1]
        self.stop = threading.Event()
        self.answered = 0
        self.failed: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        client = httpclient.InferenceServerClient(self.url)
        seq = 100
        while not self.stop.is_set():
            seq += 1
            total = 0
            for k in range(1, 6):
                total += k
                inp = httpclient.InferInput('INPUT0', [1], 'INT32')
                inp.set_data_from_numpy(np.array([k], dtype=np.int32))
                try:
                    out = client.infer('seq', [inp], sequence_id=seq, sequence_start=k == 1, sequence_end=k == 5)
                    ok = int(out.as_numpy('OUTPUT0')[0]) == total
                    err = '' if ok else 'wrong sum'
                except Exception as exc:  # noqa: BLE001  pylint: disable=broad-except
                    err = str(exc)
                self.answered += 1
                if err:
                    self.failed.append(err)
                    break

    def __enter__(self) -> Sequences:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_a_stateful_model_is_reloaded_only_with_the_opt_in(tmp_path):
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=('seq',))
    try:
        server.start()
        with Sequences(server.url) as traffic:
            time.sleep(1)
            res = ansible_helpers.run_module(POOL, {'url': server.url, 'max_bytes': 1})
            time.sleep(1)
        assert not res.get('failed') and res['changed'] is False and res['reloaded'] == [], res
        (model,) = res['models']
        assert model['model'] == 'seq' and model['action'] == 'skip', model
        assert 'the model is stateful (sequence_batching)' in model['reason'] and 'allow_stateful' in model['reason']
        assert any("model 'seq' is over the limit and is not reloaded" in w for w in res.get('warnings', []))
        assert traffic.answered > 20 and traffic.failed == [], (traffic.answered, traffic.failed[:3])
        with Sequences(server.url) as traffic:
            time.sleep(1)
            res = ansible_helpers.run_module(POOL, {'url': server.url, 'max_bytes': 1, 'allow_stateful': True})
            time.sleep(1)
        assert not res.get('failed') and res['changed'] is True, res
        assert [r['model'] for r in res['reloaded']] == ['seq'] and res['reloaded'][0]['old_gone'] is True
        print(f'FIGURE stateful_reload: opt-in reload, {len(traffic.failed)} of {traffic.answered} requests failed')
    finally:
        server.cleanup()
