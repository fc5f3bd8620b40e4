"""Security: secrets stay secret, TLS is verified by default, the modules run no shell and touch only the shm dir.

Real tritonserver behind a real TLS proxy (Python ssl on loopback) with certificates
from CAs made in the test; the modules under strace. The not-root fail-safe (nothing
stale when /proc is not fully readable) is in test_triton_shm_info.py and
test_triton_shm_region.py.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import tempfile

import ansible_helpers
import proxy_helpers
import pytest
import tritonrig

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
SECRET = 'Bearer s3cr3t-7f1e2d9c-do-not-log'
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def require_token(method, path, headers):
    """An auth proxy: 401 unless the Authorization header carries the secret."""
    if headers.get('Authorization') != SECRET:
        return 401, 'application/json', b'{"error": "missing or wrong Authorization header"}'
    return None


@pytest.fixture(scope='module')
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp('pki'))
    ca = proxy_helpers.make_ca(d, 'test-ca')
    other = proxy_helpers.make_ca(d, 'other-ca')
    server = proxy_helpers.make_cert(d, 'proxy', ca)
    client = proxy_helpers.make_cert(d, 'client', ca, server=False)
    return dict(dir=d, ca=ca, other=other, server=server, client=client)


@pytest.fixture(scope='module')
def backend(tmp_path_factory):
    server = tritonrig.TritonServer(workdir=str(tmp_path_factory.mktemp('sec')), models=())
    server.start()
    try:
        server.leak('stale_behind_tls', byte_size=4096)
        yield server
    finally:
        server.stop()


def no_traceback(result):
    text = json.dumps(result)
    assert 'Traceback' not in text and 'Module failed' not in text, text


# -- secrets never appear in output, logs or report files ---------------------------------------


def _key_material(path):
    """The base64 lines of a PEM private key: any of them in a log means the key leaked."""
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith('-----')]


def test_headers_and_client_key_never_appear_in_output_logs_or_reports(backend, pki, tmp_path):
    tls = proxy_helpers.server_tls_context(pki['server']['cert'], pki['server']['key'], client_ca=pki['ca']['cert'])
    log = tmp_path / 'ansible.log'
    report_dir = tmp_path / 'reports'
    with proxy_helpers.ForwardingProxy(backend.url, tls=tls, fault=require_token) as proxy:
        conn = dict(
            url=proxy.url(),
            server_pid=backend.pid,
            ca_path=pki['ca']['cert'],
            headers={'Authorization': SECRET},
            client_cert=pki['client']['cert'],
            client_key=pki['client']['key'],
        )
        wrong = dict(conn, headers={'Authorization': SECRET + '-but-wrong'})
        plays = [
            {
                'name': 'secrets',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'tasks': [
                    {'name': 'info', INFO: conn, 'register': 'info'},
                    {'name': 'clean', REGION: dict(conn, state='absent', stale=True), 'register': 'clean'},
                    {'name': 'wrong token', INFO: wrong, 'register': 'wrong', 'ignore_errors': True},
                    {'name': 'show', 'ansible.builtin.debug': {'var': 'info'}},
                    {
                        'name': 'role',
                        'ansible.builtin.include_role': {'name': 'tritonops.shm.shm_cleanup'},
                        'vars': {
                            'shm_cleanup_url': proxy.url(),
                            'shm_cleanup_server_pid': backend.pid,
                            'shm_cleanup_ca_path': pki['ca']['cert'],
                            'shm_cleanup_headers': {'Authorization': SECRET},
                            'shm_cleanup_client_cert': pki['client']['cert'],
                            'shm_cleanup_client_key': pki['client']['key'],
                            'shm_cleanup_report_dir': str(report_dir),
                        },
                    },
                ],
            }
        ]
        # the human output at -vvv, with the module's invocation (its arguments) injected into every result
        env = {
            'ANSIBLE_STDOUT_CALLBACK': 'ansible.builtin.default',
            'ANSIBLE_LOG_PATH': str(log),
            'ANSIBLE_INJECT_INVOCATION': '1',
        }
        res = ansible_helpers.ansible_playbook(plays, env=env, args=['-vvv'])
        sent = [r['headers'].get('Authorization') for r in proxy.requests]
    assert res.rc == 0, res.stdout[-4000:]
    # the secret really went over the wire (the proxy let the good calls through), ...
    assert sent.count(SECRET) >= 4 and SECRET + '-but-wrong' in sent
    assert 'stale_behind_tls' not in backend.system_regions(), 'the calls through the proxy worked'
    assert 'missing or wrong Authorization header' in res.stdout
    # ... and it is nowhere a person or a log collector can read it
    texts = {'stdout': res.stdout, 'stderr': res.stderr, 'log': log.read_text()}
    for path in report_dir.rglob('*'):
        if path.is_file():
            texts[str(path)] = path.read_text(errors='replace')
    assert len(texts) > 3, 'the role wrote its report files'
    key_lines = _key_material(pki['client']['key'])
    for where, text in texts.items():
        assert 's3cr3t-7f1e2d9c' not in text, 'the header value leaked into %s' % where
        for line in key_lines:
            assert line not in text, 'client key material leaked into %s' % where
    assert 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER' in texts['stdout'], '-vvv shows the invocation, masked'


# -- https: certificates verified by default ------------------------------------------------


@pytest.fixture(scope='module')
def tls_proxy(backend, pki):
    tls = proxy_helpers.server_tls_context(pki['server']['cert'], pki['server']['key'])
    with proxy_helpers.ForwardingProxy(backend.url, tls=tls) as proxy:
        yield proxy


@pytest.fixture(scope='module')
def elsewhere_proxy(backend, pki):
    """A proxy whose certificate (from our CA) names another host only."""
    cert = proxy_helpers.make_cert(pki['dir'], 'elsewhere', pki['ca'], hosts=('triton.elsewhere.example',))
    with proxy_helpers.ForwardingProxy(
        backend.url, tls=proxy_helpers.server_tls_context(cert['cert'], cert['key'])
    ) as proxy:
        yield proxy


@pytest.fixture(scope='module')
def tls_results(tls_proxy, elsewhere_proxy, backend, pki):
    """Every TLS case in one playbook run (each task its own module run)."""
    base = dict(url=tls_proxy.url(), server_pid=backend.pid)
    cases = {
        'our ca': dict(base, ca_path=pki['ca']['cert']),
        'default store': dict(base),
        'wrong ca': dict(base, ca_path=pki['other']['cert']),
        'no verify': dict(base, validate_certs=False),
        'wrong host': dict(base, url=elsewhere_proxy.url(), ca_path=pki['ca']['cert']),
    }
    plays = [
        {
            'name': 'tls',
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'tasks': [{'name': n, INFO: a, 'ignore_errors': True} for n, a in cases.items()],
        }
    ]
    return ansible_helpers.ansible_playbook(plays)


def test_https_verified_with_ca_path(tls_results, backend):
    ok = tls_results.task('our ca')
    assert not ok.get('failed'), ok
    assert ok['server']['pid'] == backend.pid and not ok.get('warnings')


@pytest.mark.parametrize('case', ['default store', 'wrong ca', 'wrong host'])
def test_https_refused_without_the_right_ca_or_host(tls_results, tls_proxy, elsewhere_proxy, case):
    res = tls_results.task(case)
    assert res.get('failed') is True, res
    assert (
        'TLS verification failed' in res['msg']
        and (elsewhere_proxy if case == 'wrong host' else tls_proxy).url() in res['msg']
    )
    # the reason names what was wrong: the issuer for an unknown CA, the name for the wrong host
    assert 'CERTIFICATE_VERIFY_FAILED' in res['msg'], res['msg']
    if case == 'wrong host':
        # OpenSSL says 'Hostname mismatch' or 'IP address mismatch', then names what the certificate is not valid for
        assert 'mismatch, certificate is not valid for' in res['msg'], res['msg']
    else:
        assert 'unable to get local issuer certificate' in res['msg'], res['msg']
    no_traceback(res)


def test_validate_certs_false_works_and_warns(tls_results, tls_proxy):
    res = tls_results.task('no verify')
    assert not res.get('failed'), res
    assert any('validate_certs is false' in w and tls_proxy.url() in w for w in res.get('warnings', [])), res.get(
        'warnings'
    )


def test_mtls_client_certificate_required_and_accepted(backend, pki):
    tls = proxy_helpers.server_tls_context(pki['server']['cert'], pki['server']['key'], client_ca=pki['ca']['cert'])
    with proxy_helpers.ForwardingProxy(backend.url, tls=tls) as proxy:
        base = dict(url=proxy.url(), server_pid=backend.pid, ca_path=pki['ca']['cert'])
        plays = [
            {
                'name': 'mtls',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'tasks': [
                    {'name': 'without', INFO: base, 'ignore_errors': True},
                    {
                        'name': 'with',
                        INFO: dict(base, client_cert=pki['client']['cert'], client_key=pki['client']['key']),
                        'ignore_errors': True,
                    },
                ],
            }
        ]
        res = ansible_helpers.ansible_playbook(plays)
    without, with_cert = res.task('without'), res.task('with')
    assert without.get('failed') is True and proxy.url() in without['msg'], without
    no_traceback(without)
    assert not with_cert.get('failed'), with_cert
    assert with_cert['server']['pid'] == backend.pid


# -- no shell, and only paths inside the shm dir ----------------------------------------------

# os.<name> calls that start a program or a shell, and calls of that kind on any object (module.run_command, Popen, ...)
OS_SPAWN = {
    'system',
    'popen',
    'spawnl',
    'spawnle',
    'spawnlp',
    'spawnv',
    'spawnve',
    'spawnvp',
    'execl',
    'execle',
    'execlp',
    'execv',
    'execve',
    'execvp',
    'execvpe',
    'fork',
    'forkpty',
    'posix_spawn',
    'posix_spawnp',
}
ANY_SPAWN = {'run_command', 'Popen', 'check_call', 'check_output', 'getoutput', 'getstatusoutput'}
FORBIDDEN_MODULES = {'subprocess', 'pty', 'commands', 'multiprocessing', 'asyncio.subprocess'}


def _plugin_files():
    for root, _dirs, files in os.walk(os.path.join(COLLECTION, 'plugins')):
        for name in files:
            if name.endswith('.py'):
                yield os.path.join(root, name)


def test_plugins_contain_no_shell_or_process_spawning():
    offenders = []
    files = list(_plugin_files())
    assert len(files) >= 5
    for path in files:
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                offenders += ['%s: import %s' % (path, a.name) for a in node.names if a.name in FORBIDDEN_MODULES]
            elif isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_MODULES:
                offenders.append('%s: from %s import' % (path, node.module))
            elif isinstance(node, ast.Attribute) and (
                node.attr in ANY_SPAWN
                or (node.attr in OS_SPAWN and isinstance(node.value, ast.Name) and node.value.id == 'os')
            ):
                offenders.append('%s:%d: .%s' % (path, node.lineno, node.attr))
            elif isinstance(node, ast.Name) and node.id in ANY_SPAWN | OS_SPAWN - {'system', 'fork'}:
                offenders.append('%s:%d: %s' % (path, node.lineno, node.id))
            elif isinstance(node, ast.keyword) and node.arg == 'shell':
                offenders.append('%s:%d: shell=' % (path, node.lineno))
    assert offenders == []


WRITE_FLAGS = ('O_WRONLY', 'O_RDWR', 'O_CREAT', 'O_TRUNC', 'O_APPEND')
MUTATING = {
    'unlink',
    'unlinkat',
    'rmdir',
    'rename',
    'renameat',
    'renameat2',
    'mkdir',
    'mkdirat',
    'creat',
    'truncate',
    'link',
    'linkat',
    'symlink',
    'symlinkat',
    'chmod',
    'fchmodat',
    'chown',
    'lchown',
    'fchownat',
    'mknod',
    'mknodat',
    'utime',
    'utimes',
    'utimensat',
    'setxattr',
    'lsetxattr',
    'removexattr',
    'lremovexattr',
}
LOCK_DIR = '/run/tritonops_shm'  # runlock.LOCK_DIR: root's lock files
LINE = re.compile(r'^(?:(\d+) +)?(\w+)\((.*)\) += (-?\d+|\?)')


def _args(text):
    """The top-level comma-separated arguments of one strace call."""
    out, depth, cur, quoted = [], 0, '', False
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != '\\'):
            quoted = not quoted
        if not quoted:
            if ch in '[{(':
                depth += 1
            elif ch in ']})':
                depth -= 1
            elif ch == ',' and depth == 0:
                out.append(cur.strip())
                cur = ''
                continue
        cur += ch
    out.append(cur.strip())
    return out


def _unquote(arg):
    return arg[1:-1] if arg.startswith('"') else None


def traced_effects(trace):
    """From an strace -f log: (execs, clones that are not threads, [(syscall, absolute path)] of every mutating call)."""
    fds, execs, forks, effects = {}, [], [], []
    cwd = None
    for line in trace.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        _pid, call, argtext, ret = m.groups()
        args = _args(argtext)
        if call == 'execve':
            execs.append(_unquote(args[0]))
            continue
        if call in ('fork', 'vfork') or (call in ('clone', 'clone3') and 'CLONE_THREAD' not in argtext):
            forks.append(line)
            continue
        if call == 'getcwd' and ret != '-1':
            cwd = _unquote(args[0])
        if call == 'close' and args[0].isdigit():
            fds.pop(int(args[0]), None)
            continue
        # a copy of a descriptor names the same path (os.dup is fcntl(F_DUPFD_CLOEXEC); the shm directory is opened
        # once, through the server's root one component at a time, and its descriptor copied: issue 33)
        if ret.isdigit() and args[0].isdigit() and (call in ('dup', 'dup2', 'dup3') or 'F_DUPFD' in argtext):
            fds[int(ret)] = fds.get(int(args[0]))
            continue

        def resolve(dirfd, name):
            if name is None:
                return None
            if name.startswith('/'):
                return os.path.normpath(name)
            base = cwd if dirfd in ('AT_FDCWD', None) else fds.get(int(dirfd)) if dirfd.isdigit() else None
            return os.path.normpath(os.path.join(base or '<unknown fd %s>' % dirfd, name))

        if call in ('openat', 'open'):
            dirfd, name, flags = ('AT_FDCWD', args[0], args[1]) if call == 'open' else (args[0], args[1], args[2])
            path = resolve(dirfd, _unquote(name))
            if ret.isdigit():
                fds[int(ret)] = path
            if any(f in flags for f in WRITE_FLAGS):
                effects.append((call, path))
        elif call in MUTATING:
            if call.endswith('at') or call == 'renameat2':
                effects.append((call, resolve(args[0], _unquote(args[1]))))
                if call in ('renameat', 'renameat2'):  # where it went is a change too
                    effects.append((call + ' to', resolve(args[2], _unquote(args[3]))))
            else:
                effects.append((call, resolve(None, _unquote(args[0]))))
    return execs, forks, effects


def run_traced(module, args, workdir):
    """Run a module's code under strace -f, the way Ansible runs it (one python process, args in a file)."""
    args_file = os.path.join(workdir, 'args.json')
    with open(args_file, 'w') as f:
        json.dump({'ANSIBLE_MODULE_ARGS': args}, f)
    trace = os.path.join(workdir, 'strace.log')
    env = dict(os.environ, PYTHONPATH=ansible_helpers.COLLECTIONS_PATH, PYTHONDONTWRITEBYTECODE='1')
    proc = subprocess.run(
        [
            'strace',
            '-f',
            '-qq',
            '-e',
            'trace=file,process,close,getcwd,dup,dup2,dup3,fcntl',
            '-o',
            trace,
            ansible_helpers.PYTHON,
            '-m',
            'ansible_collections.tritonops.shm.plugins.modules.%s' % module.split('.')[-1],
            args_file,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=workdir,
        check=False,
    )
    result = json.loads(proc.stdout)
    with open(trace) as f:
        return result, traced_effects(f.read())


@pytest.fixture
def traced_scene(make_triton, tmp_path):
    if subprocess.run(['which', 'strace'], capture_output=True, check=False).returncode != 0:
        pytest.fail('strace is not installed (make deps installs it)')
    server = make_triton()  # with the echo model: the python backend's own file is there too
    live = server.client('live')
    stale = server.leak_many('stale', 3)
    with open(os.path.join(server.shm_dir, 'old_orphan'), 'wb') as f:
        f.write(b'x' * 4096)
    outside = tmp_path / 'outside_target'
    outside.write_text('never touched')
    os.symlink(str(outside), os.path.join(server.shm_dir, 'link_out'))
    return server, live, stale, outside


def _real(path):
    """/proc/PID/root/dev/shm/x -> the same file seen the same way; used to compare trace paths with the shm dir."""
    return os.path.normpath(path)


def test_modules_exec_nothing_and_only_touch_paths_inside_the_shm_dir(traced_scene, tmp_path):
    server, live, stale, outside = traced_scene
    shm = _real(server.shm_dir)
    work = tmp_path / 'trace'
    work.mkdir()
    info_args = dict(url=server.url, orphan_patterns=['*'], min_age=0)
    clean_args = dict(url=server.url, state='absent', stale=True, orphan_files=True, orphan_patterns=['*'], min_age=0)
    create_args = dict(url=server.url, name='made', key='/made', byte_size=4096, create_file=True)
    info, (i_execs, i_forks, i_effects) = run_traced(INFO, info_args, str(work))
    clean, (c_execs, c_forks, c_effects) = run_traced(REGION, clean_args, str(work))
    create, (r_execs, r_forks, r_effects) = run_traced(REGION, create_args, str(work))
    for res in (info, clean, create):
        assert not res.get('failed'), res
    # no process but the interpreter itself, no fork
    for execs, forks in ((i_execs, i_forks), (c_execs, c_forks), (r_execs, r_forks)):
        assert execs == [ansible_helpers.PYTHON] and forks == []
    # info writes nothing at all
    assert i_effects == []
    # a run that changes a server takes its lock: one empty file of root's own lock directory, outside the shm dir
    # (issue 33: no tenant of the shm dir can hold it hostage), and nothing else outside the shm dir
    for effects in (c_effects, r_effects):
        lock = [(c, p) for c, p in effects if p == LOCK_DIR or p.startswith(LOCK_DIR + '/')]
        assert [p for c, p in lock if c != 'mkdir'] and all(
            (c, p) == ('mkdir', LOCK_DIR) or (c == 'openat' and re.fullmatch(LOCK_DIR + r'/shm-\d+-\d+-\d+\.lock', p))
            for c, p in lock
        ), lock
        effects[:] = [e for e in effects if e not in lock]
    # cleaning: each removed file is renamed to a quarantine name inside the shm dir, its holders scanned again,
    # then that name is unlinked (issue 26: no lost race); nothing else is changed, nothing outside the shm dir
    assert all(path.startswith(shm + '/') for _call, path in c_effects), c_effects
    removed = sorted(shm + '/' + n for n in stale + ['old_orphan'])
    assert sorted(p for c, p in c_effects if c == 'renameat2') == removed
    quarantined = sorted(p for c, p in c_effects if c == 'renameat2 to')
    assert sorted(p for c, p in c_effects if c == 'unlinkat') == quarantined and len(quarantined) == len(removed)
    assert all(
        os.path.dirname(p) == shm and os.path.basename(p).startswith('.tritonops_shm.quarantine.') for p in quarantined
    )
    assert len(c_effects) == 3 * len(removed), c_effects
    assert sorted(os.path.basename(p) for p in clean['removed_files']) == sorted(stale + ['old_orphan'])
    # creating: one exclusive create (and its chmod/size) of the backing file inside the shm dir
    assert create['created_files'] == [os.path.join(server.shm_dir, 'made')]
    assert set(path for _call, path in r_effects) == {shm + '/made'}, r_effects
    # what must survive did
    assert outside.read_text() == 'never touched' and os.path.islink(os.path.join(server.shm_dir, 'link_out'))
    assert live.alive and 'live' in server.shm_files() and server.backend_files()


# -- not root: the region module removes nothing it cannot prove unheld ------------------------

from test_triton_shm_info import (  # noqa: E402  pylint: disable=wrong-import-position,unused-import
    _interpreter_wrapper,
    run_plays_wrapped,
    unprivileged_user,  # noqa: F401  the fixture
)


def _nothing():
    pass


def test_not_root_region_module_unregisters_and_removes_nothing(tmp_path, unprivileged_user):  # noqa: F811
    """Inside the server's mount namespace (as in its container), as a user who is not root, then as root.

    The info side of this fail-safe is test_triton_shm_info.py::test_not_root_nothing_is_stale_and_a_warning_says_why.
    """
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=())
    workdir = tempfile.mkdtemp(prefix='region-nonroot-', dir='/tmp')
    os.chmod(workdir, 0o755)
    cleanup = _nothing
    try:
        server.start()
        live = server.client('root_live')
        server.leak('root_stale')
        orphan = server.shm_path('client_old')
        with open(orphan, 'wb') as f:
            f.write(b'o' * 4096)
        prefix, cleanup = _interpreter_wrapper(workdir)
        prefix = ['nsenter', '--mount', '--target', str(server.pid)] + prefix
        args = dict(
            url=server.url,
            server_pid=server.pid,
            shm_dir='/dev/shm',
            state='absent',
            stale=True,
            orphan_files=True,
            orphan_patterns=['*'],
            min_age=0,
        )
        become = dict(become=True, become_user=unprivileged_user, become_method='ansible.builtin.su')
        plays = [
            {
                'name': 'region as a user who is not root, then as root',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'tasks': [
                    dict({REGION: args, 'name': 'user', 'ignore_errors': True}, **become),
                    {REGION: args, 'name': 'root'},
                ],
            }
        ]
        res = run_plays_wrapped(prefix, plays, workdir)
        assert live.alive
    finally:
        cleanup()
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    assert res.data, res
    user, root = res.task('user'), res.task('root')
    assert not user.get('failed'), user
    assert user['changed'] is False and user['unregistered'] == [] and user['removed_files'] == []
    assert any('run the module as root' in w for w in user.get('warnings', [])), user.get('warnings')
    # as root the same call finds the stale region and the orphan: the scene was real
    assert root['unregistered'] == ['root_stale'], root
    assert sorted(os.path.basename(p) for p in root['removed_files']) == ['client_old', 'root_stale']
