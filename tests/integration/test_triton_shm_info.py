"""tritonops.shm.triton_shm_info against a real tritonserver and real tritonclient processes.

One scene (a server with every region state and file category) is built once
and read by the module with real ansible-playbook runs; each test checks what
an operator would look at. Error cases use real sockets on loopback ports.
"""

from __future__ import annotations

import ast
import copy
import http.server
import json
import os
import pwd
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import ansible_helpers
import pytest
import tritonrig
import yaml

INFO = 'tritonops.shm.triton_shm_info'
PATTERNS = ['client_*']
MIB = 1 << 20
AGED = (
    2.0  # seconds: the scene's min_age; its old files are waited for (tritonrig.wait_older), its young one dated ahead
)
QUERY = "{stale: system_regions[?state=='stale'].name, orphans: files[?category=='orphan'].name, dangling: summary.dangling_regions}"  # noqa: E501


def _write(path, size):
    with open(path, 'wb') as f:
        f.write(os.urandom(size))


def snapshot(server):
    """What info must not change: the server's regions and every entry of its shm dir."""
    files = {}
    for name in os.listdir(server.shm_dir):
        st = os.lstat(os.path.join(server.shm_dir, name))
        files[name] = (
            stat.S_IFMT(st.st_mode),
            stat.S_IMODE(st.st_mode),
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_uid,
        )
    return dict(regions=server.system_regions(), files=files)


def by_name(items):
    return dict((i['name'], i) for i in items)


def normalized(result):
    """The result without what legitimately differs between two reads: scan time and ages."""
    out = copy.deepcopy(result)
    out.pop('scanned_at', None)
    for rec in out.get('files', []):
        rec.pop('age_s', None)
        if 'younger than min_age' in rec.get('category_reason', ''):
            rec['category_reason'] = rec['category_reason'].split(' (')[0]  # it quotes the age
    for rec in out.get('system_regions', []):
        if rec.get('file'):
            rec['file'].pop('age_s', None)
    return out


def assert_clean_failure(result, *needles):
    """A failed module result with a clear msg containing every needle and no traceback anywhere."""
    assert result.get('failed') is True, result
    msg = result['msg']
    for needle in needles:
        assert needle in msg, 'expected %r in msg %r' % (needle, msg)
    text = json.dumps(result)
    assert 'Traceback' not in text and 'File "' not in text, text


# -- the scene: every state and category on one real server ---------------------------------


@pytest.fixture(scope='module')
def scene(tmp_path_factory):
    server = tritonrig.TritonServer(workdir=str(tmp_path_factory.mktemp('info')), shm_size='64m')
    server.start()
    try:
        s = dict(server=server)
        shm = server.shm_dir
        old = [
            os.path.join(shm, n) for n in ('client_old', 'PostgreSQL.1234', 'client_fifo', 'client_dir', 'client_link')
        ]
        _write(os.path.join(shm, 'client_old'), 64 * 1024)  # first: they age while the clients start
        _write(os.path.join(shm, 'PostgreSQL.1234'), 8192)
        os.mkfifo(os.path.join(shm, 'client_fifo'))
        os.mkdir(os.path.join(shm, 'client_dir'))
        _write(os.path.join(shm, 'client_dir', 'client_inner'), 4096)
        os.symlink('client_old', os.path.join(shm, 'client_link'))
        s['live'] = server.client('live_region', byte_size=MIB)
        s['stale'] = server.leak('stale_region', byte_size=2 * MIB)
        s['leaked_unlinked'] = server.leak('leaked_unlinked', keep_file=False)
        s['unlinked_live'] = server.client('unlinked_live')
        os.unlink(server.shm_path('unlinked_live'))
        server.leak('unlinked_by_test')
        os.unlink(server.shm_path('unlinked_by_test'))
        s['held'] = server.client('client_held', register=False)
        tritonrig.wait_older(old, AGED)
        _write(os.path.join(shm, 'client_young'), 4096)
        tritonrig.keep_young(os.path.join(shm, 'client_young'))
        s['before'] = snapshot(server)
        args = dict(url=server.url, orphan_patterns=PATTERNS, min_age=AGED, query=QUERY)
        s['info'] = ansible_helpers.run_module(INFO, args)
        s['check'] = ansible_helpers.run_module(INFO, args, check=True)
        s['plain'] = ansible_helpers.run_module(INFO, dict(url=server.url, min_age=AGED))
        s['after'] = snapshot(server)
        s['usage_after'] = server.shm_usage()
        for key in ('plain', 'info', 'check'):
            assert not s[key].get('failed'), s[key]
        yield s
    finally:
        server.cleanup()


def test_live_client_region_is_healthy_and_names_its_holder(scene):
    region = by_name(scene['info']['system_regions'])['live_region']
    assert region['state'] == 'healthy'
    assert [h['pid'] for h in region['holders']] == [scene['live'].pid]
    assert region['holders'][0]['comm'].startswith('python')
    assert region['file']['exists'] is True
    assert region['file']['size'] == MIB


def test_sigkilled_client_region_is_stale(scene):
    region = by_name(scene['info']['system_regions'])['stale_region']
    assert scene['stale'].proc.returncode < 0  # really SIGKILLed
    assert region['state'] == 'stale'
    assert region['holders'] == []
    assert region['key'] == '/stale_region'
    assert region['byte_size'] == 2 * MIB
    assert region['file']['exists'] is True
    assert region['file']['path'] == os.path.join(scene['server'].shm_dir, 'stale_region')
    assert region['file']['inode'] == os.stat(scene['server'].shm_path('stale_region')).st_ino


def test_regions_whose_file_was_unlinked_are_dangling(scene):
    regions = by_name(scene['info']['system_regions'])
    for name in ('leaked_unlinked', 'unlinked_by_test', 'unlinked_live'):
        assert regions[name]['state'] == 'dangling', regions[name]
        assert regions[name]['file'] == dict(path=os.path.join(scene['server'].shm_dir, name), exists=False)
    # the tritonclient resource tracker unlinked it after the SIGKILL: nobody but the server maps it
    assert regions['leaked_unlinked']['holders'] == []
    assert regions['unlinked_by_test']['holders'] == []
    # a live client still maps the unlinked file: it is named, matched through the server's deleted mapping
    assert [h['pid'] for h in regions['unlinked_live']['holders']] == [scene['unlinked_live'].pid]
    assert 'still mapped' in regions['unlinked_live']['state_reason']


def test_python_backend_file_is_backend(scene):
    files = by_name(scene['info']['files'])
    backend = scene['server'].backend_files()
    assert backend
    for name in backend:
        assert files[name]['category'] == 'backend'
        assert files[name]['regions'] == []
        assert files[name]['holders'], 'the python backend stub maps its own file'
        assert scene['server'].pid not in [h['pid'] for h in files[name]['holders']]


def test_registered_files_name_their_regions(scene):
    files = by_name(scene['info']['files'])
    assert files['live_region']['category'] == 'registered'
    assert files['live_region']['regions'] == ['live_region']
    assert [h['pid'] for h in files['live_region']['holders']] == [scene['live'].pid]
    assert files['stale_region']['category'] == 'registered'
    assert files['stale_region']['holders'] == []
    for gone in ('leaked_unlinked', 'unlinked_by_test', 'unlinked_live'):
        assert gone not in files


def test_held_unregistered_file_is_in_use_even_when_it_matches_a_pattern(scene):
    rec = by_name(scene['info']['files'])['client_held']
    assert rec['category'] == 'in_use'
    assert [h['pid'] for h in rec['holders']] == [scene['held'].pid]


def test_orphan_needs_a_pattern_match_and_the_age(scene):
    files = by_name(scene['info']['files'])
    assert files['client_old']['category'] == 'orphan'
    assert files['client_old']['age_s'] >= AGED
    assert files['client_young']['category'] == 'foreign'
    assert 'younger than min_age' in files['client_young']['category_reason']
    # without orphan_patterns (the default) nothing is orphan
    plain = by_name(scene['plain']['files'])
    assert plain['client_old']['category'] == 'foreign'
    assert scene['plain']['summary']['orphan_files'] == 0


def test_foreign_files_and_non_regular_entries_are_never_followed(scene):
    files = by_name(scene['info']['files'])
    shm = scene['server'].shm_dir
    assert files['PostgreSQL.1234']['category'] == 'foreign'
    assert files['PostgreSQL.1234']['type'] == 'file'
    for name, kind in (('client_fifo', 'fifo'), ('client_dir', 'directory'), ('client_link', 'symlink')):
        rec = files[name]
        assert rec['type'] == kind
        assert rec['category'] == 'foreign', rec
        assert rec['holders'] == []
        assert rec['inode'] == os.lstat(os.path.join(shm, name)).st_ino
    # the symlink is described as itself, not as the file it points to
    assert files['client_link']['inode'] != files['client_old']['inode']
    assert files['client_link']['size'] == len('client_old')
    # nothing below a directory is listed
    assert 'client_inner' not in files


def test_found_with_url_only(scene):
    server = scene['plain']['server']
    triton = scene['server']
    assert server['pid'] == triton.pid
    assert server['shm_dir'] == '/proc/%d/root/dev/shm' % triton.pid
    assert server['located_by'].startswith('listener')
    assert server['url'] == triton.url
    assert server['live'] is True and server['ready'] is True
    assert server['version'] == triton.api('/v2')[1]['version']
    assert 'system_shared_memory' in server['extensions']
    assert scene['plain']['shm_fs']['path'] == triton.shm_dir
    assert scene['plain']['shm_fs']['total_bytes'] == 64 * MIB
    assert scene['plain']['holders_complete'] is True
    assert scene['plain']['unreadable_processes'] == 0
    assert scene['plain']['changed'] is False


def test_check_mode_gives_the_identical_result(scene):
    assert scene['check']['changed'] is False
    assert normalized(scene['check']) == normalized(scene['info'])


def test_info_changes_nothing_on_the_server_or_in_dev_shm(scene):
    assert scene['after']['regions'] == scene['before']['regions']
    assert scene['after']['files'] == scene['before']['files']
    assert set(scene['before']['regions']) == set(
        ['live_region', 'stale_region', 'leaked_unlinked', 'unlinked_live', 'unlinked_by_test']
    )


def test_summary_counts_and_bytes(scene):
    info = scene['info']
    summary = info['summary']
    regions, files = info['system_regions'], info['files']
    assert summary['system_regions'] == len(regions) == 5
    assert summary['cuda_regions'] == len(info['cuda_regions']) == 0
    assert summary['healthy_regions'] == 1
    assert summary['stale_regions'] == 1
    assert summary['dangling_regions'] == 3
    assert summary['unknown_regions'] == 0
    # the client wrote its whole region, so the stale file occupies exactly its size
    assert summary['stale_bytes'] == 2 * MIB
    assert summary['registered_files'] == 2
    assert summary['backend_files'] == len(scene['server'].backend_files())
    assert summary['in_use_files'] == 1
    assert summary['orphan_files'] == 1
    assert summary['orphan_bytes'] == 64 * 1024
    assert summary['foreign_files'] == 5  # client_young, PostgreSQL.1234, fifo, dir, symlink
    assert len(files) == sum(
        summary[k] for k in ('registered_files', 'backend_files', 'in_use_files', 'orphan_files', 'foreign_files')
    )
    assert summary['total_bytes'] == info['shm_fs']['total_bytes'] == 64 * MIB
    assert summary['used_bytes'] == info['shm_fs']['used_bytes'] == scene['usage_after']['used_bytes']
    assert (
        summary['used_percent']
        == info['shm_fs']['used_percent']
        == round(100.0 * summary['used_bytes'] / summary['total_bytes'], 2)
    )
    assert (
        info['shm_fs']['free_bytes']
        == os.statvfs(scene['server'].shm_dir).f_bavail * os.statvfs(scene['server'].shm_dir).f_frsize
    )


def test_query_returns_the_jmespath_value(scene):
    assert scene['info']['query_result'] == dict(stale=['stale_region'], orphans=['client_old'], dangling=3)
    assert 'query_result' not in scene['plain']


ANSIBLE_KEYS = set(['changed', 'invocation', 'warnings', 'deprecations', 'action', 'failed', 'msg'])


def _return_docs():
    with open(os.path.join(ansible_helpers.REPO, 'plugins', 'modules', 'triton_shm_info.py')) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == 'RETURN':
            return yaml.safe_load(node.value.value)
    raise AssertionError('no RETURN in triton_shm_info.py')


def _undocumented(value, spec, where, allowed_extra=()):
    """Keys of value (a dict, or a list of dicts) that spec does not document, recursing where spec has contains."""
    out = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict):
            continue
        for key, sub in item.items():
            if key not in spec:
                if key not in allowed_extra:
                    out.append('%s.%s' % (where, key))
            elif spec[key].get('contains') and sub is not None:
                out.extend(_undocumented(sub, spec[key]['contains'], '%s.%s' % (where, key)))
    return out


def test_return_docs_match_the_result(scene, tmp_path):
    docs = _return_docs()
    # the same query writing its node_exporter textfile (metrics_files is returned only then)
    fed = ansible_helpers.run_module(
        INFO,
        dict(
            url=scene['server'].url,
            orphan_patterns=PATTERNS,
            query=QUERY,
            metrics_dir=str(tmp_path),
            metrics_host='triton1',
        ),
    )
    assert not fed.get('failed'), fed
    assert fed['metrics_files'] and all(os.path.dirname(p) == str(tmp_path) for p in fed['metrics_files'])
    # and where its directory does not exist, with metrics_dir_missing: skip (metrics_skipped is returned only then)
    unfed = ansible_helpers.run_module(
        INFO,
        dict(
            url=scene['server'].url,
            metrics_dir=str(tmp_path / 'no-node-exporter'),
            metrics_host='triton1',
            metrics_dir_missing='skip',
        ),
    )
    assert unfed['metrics_files'] == [] and 'does not exist' in unfed['metrics_skipped'], unfed
    assert not unfed.get('warnings'), unfed
    results = [scene['info'], scene['plain'], fed, unfed]
    # every top-level key the module returns is documented, and every key documented as always returned is there
    for res in results:
        assert set(res) - ANSIBLE_KEYS - set(docs) == set()
        assert set(k for k, v in docs.items() if v['returned'] == 'always') - set(res) == set()
    assert 'query_result' in scene['info'] and 'query_result' not in scene['plain']
    # ... and so is every nested key, at every level the docs describe (extra fields Triton returns are kept as they are)
    server_fields = set(k for r in scene['before']['regions'].values() for k in r)
    top = dict((k, v) for k, v in docs.items())
    for res in results:
        assert (
            _undocumented(
                dict((k, v) for k, v in res.items() if k not in ANSIBLE_KEYS),
                top,
                'result',
                allowed_extra=server_fields,
            )
            == []
        )
    # every documented nested key is really returned somewhere in the scene (no stale docs)
    seen = set()

    def collect(value, where):
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                for key, sub in item.items():
                    seen.add('%s.%s' % (where, key))
                    collect(sub, '%s.%s' % (where, key))

    collect(dict(scene['info']), 'result')
    collect(dict(fed), 'result')
    collect(dict(unfed), 'result')

    def documented(spec, where):
        for key, sub in spec.items():
            # a holder's container is returned only for a process in a container: this scene runs on the host
            # (test_node_agent.py and test_pod_sidecar.py see it returned by real containers and pods)
            if 'in a container' in str(sub.get('returned', '')):
                continue
            # a CUDA region cannot be registered with this CPU server, so no GPU is read: test_classification.py
            # checks a CUDA region's keys and a GPU's facts against these docs, and make test-gpu registers real ones
            if where in ('result.cuda_regions', 'result.gpus'):
                continue
            yield '%s.%s' % (where, key)
            yield from documented(sub.get('contains') or {}, '%s.%s' % (where, key))

    assert sorted(set(documented(top, 'result')) - seen) == []


def test_bad_query_fails_clearly(scene):
    res = ansible_helpers.run_module(INFO, dict(url=scene['server'].url, query='files[?category=='))
    assert_clean_failure(res, 'files[?category==', 'not a valid JMESPath expression')


def test_missing_shm_dir_fails_clearly(scene, tmp_path):
    missing = str(tmp_path / 'no-such-dir')
    res = ansible_helpers.run_module(INFO, dict(url=scene['server'].url, shm_dir=missing))
    assert_clean_failure(res, missing, 'No such file or directory')


def test_nonexistent_server_pid_fails_clearly(scene):
    pid = int(open('/proc/sys/kernel/pid_max').read()) + 1  # can never exist
    res = ansible_helpers.run_module(INFO, dict(url=scene['server'].url, server_pid=pid))
    assert_clean_failure(res, 'server_pid %d' % pid, 'does not exist', scene['server'].url)


# -- connection errors: real sockets on loopback --------------------------------------------------


def test_connection_refused_names_the_url():
    url = 'http://127.0.0.1:%d' % tritonrig.free_port()
    res = ansible_helpers.run_module(INFO, dict(url=url))
    assert_clean_failure(res, url, 'cannot connect')


def test_server_that_never_answers_times_out():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        sock.listen(8)  # the kernel accepts connections; nobody ever answers
        url = 'http://127.0.0.1:%d' % sock.getsockname()[1]
        started = time.monotonic()
        res = ansible_helpers.run_module(INFO, dict(url=url, timeout=1))
        assert time.monotonic() - started < 30
    assert_clean_failure(res, url, 'timeout')


class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        body = b'<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body>It works</body></html>'
        self.send_response(200)
        self.send_header('Content-Type', 'text/html')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_another_web_server_on_the_port_is_not_triton():
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _HtmlHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = 'http://127.0.0.1:%d' % httpd.server_address[1]
        res = ansible_helpers.run_module(INFO, dict(url=url))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert_clean_failure(res, url, 'not Triton JSON', 'Welcome to nginx')


class RestrictedServer(tritonrig.TritonServer):
    """A real server whose shared-memory API needs a header (tritonserver --http-restricted-api)."""

    def command(self):
        return super().command() + ['--http-restricted-api=shared-memory:admin-key=s3cret-token']


def test_http_error_reports_the_servers_own_error_and_headers_get_through(tmp_path):
    server = RestrictedServer(workdir=str(tmp_path), models=())
    server.start()
    try:
        res = ansible_helpers.run_module(INFO, dict(url=server.url))
        assert_clean_failure(
            res,
            server.url + '/v2/systemsharedmemory/status',
            'HTTP 403',
            "This API is restricted, expecting header 'admin-key'",
        )
        assert res['failure']['status'] == 403
        ok = ansible_helpers.run_module(INFO, dict(url=server.url, headers={'admin-key': 's3cret-token'}))
    finally:
        server.cleanup()
    assert not ok.get('failed'), ok
    assert ok['server']['pid'] == server.pid
    assert 's3cret-token' not in json.dumps(ok), 'headers are no_log'


# -- not root: the unreadable-processes fail-safe -------------------------------------------------


@pytest.fixture
def unprivileged_user():
    name = 'tritonops-t%d' % os.getpid()
    subprocess.run(
        ['useradd', '--system', '--no-create-home', '--home-dir', '/nonexistent', '--shell', '/bin/sh', name],
        check=True,
        capture_output=True,
    )
    try:
        yield name
    finally:
        subprocess.run(['userdel', name], check=False, capture_output=True)


def _interpreter_wrapper(workdir):
    """A command prefix that lets an unprivileged user run the venv's interpreter and the collection copy
    (tritonrig.reachable: the venv and its base Python may sit below directories others cannot enter).
    Returns (prefix, cleanup).
    """
    needed = [
        os.path.realpath(ansible_helpers.PYTHON),
        sys.base_prefix,
        os.path.dirname(os.path.dirname(os.path.abspath(ansible_helpers.PYTHON))),  # the venv itself
        ansible_helpers.COLLECTIONS_PATH,
    ]
    return tritonrig.reachable(needed, workdir)


def run_plays_wrapped(prefix, plays, workdir):
    path = os.path.join(workdir, 'playbook.yml')
    with open(path, 'w') as f:
        yaml.safe_dump(plays, f, sort_keys=False)
    cmd = prefix + [os.path.join(ansible_helpers.BIN, 'ansible-playbook'), '-i', 'localhost,', path]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=ansible_helpers.ansible_env(), timeout=300, cwd=workdir, check=False
    )
    data = None
    try:
        data = json.loads(proc.stdout[proc.stdout.index('{') :])
    except ValueError:
        pass
    return ansible_helpers.PlaybookResult(proc, data)


def test_not_root_nothing_is_stale_and_a_warning_says_why(tmp_path, unprivileged_user):
    """Run inside the server's mount namespace (as in the container itself), as root and as a user who is not."""
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=())
    workdir = tempfile.mkdtemp(prefix='info-nonroot-', dir='/tmp')
    os.chmod(workdir, 0o755)
    cleanup = None
    try:
        server.start()
        live = server.client('root_live')
        server.leak('root_stale')
        orphan = server.shm_path('client_old')
        _write(orphan, 4096)
        tritonrig.wait_older([orphan], 1)
        assert pwd.getpwnam(unprivileged_user).pw_uid != 0
        prefix, cleanup = _interpreter_wrapper(workdir)
        prefix = ['nsenter', '--mount', '--target', str(server.pid)] + prefix
        common = dict(url=server.url, server_pid=server.pid, orphan_patterns=PATTERNS, min_age=1)
        become = dict(become=True, become_user=unprivileged_user, become_method='ansible.builtin.su')
        plays = [
            {
                'name': 'info as root and as a user who is not',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'tasks': [
                    dict({INFO: dict(common, shm_dir='/dev/shm'), 'name': 'user'}, **become),
                    dict(
                        {
                            INFO: dict(common, shm_dir=server.shm_dir),
                            'name': 'user private shm_dir',
                            'ignore_errors': True,
                        },
                        **become,
                    ),
                    {'name': 'root', INFO: dict(common, shm_dir='/dev/shm')},
                ],
            }
        ]
        res = run_plays_wrapped(prefix, plays, workdir)
        assert live.alive
    finally:
        if cleanup is not None:
            cleanup()
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    assert res.data, res
    root, user, private = res.task('root'), res.task('user'), res.task('user private shm_dir')
    # as root the scene really has a stale region, a healthy one and an orphan
    assert root['holders_complete'] is True, root.get('warnings')
    assert dict((r['name'], r['state']) for r in root['system_regions']) == dict(
        root_live='healthy', root_stale='stale'
    )
    assert by_name(root['files'])['client_old']['category'] == 'orphan'
    # as a user who cannot read root's processes: nothing is stale, nothing orphan, and it says why
    assert not user.get('failed'), user
    assert user['unreadable_processes'] > 0
    assert user['holders_complete'] is False
    assert dict((r['name'], r['state']) for r in user['system_regions']) == dict(
        root_live='unknown', root_stale='unknown'
    )
    assert user['summary']['stale_regions'] == 0
    assert by_name(user['files'])['client_old']['category'] == 'foreign'
    assert user['summary']['orphan_files'] == 0
    assert any('run the module as root' in w and 'could not be inspected' in w for w in user.get('warnings', [])), (
        user.get('warnings')
    )
    # the server's /dev/shm seen from outside (behind /proc/PID/root) is not readable for that user: a clear failure
    assert_clean_failure(private, server.shm_dir, 'Permission denied')


def test_report_as_a_user_who_cannot_read_the_shm_dir_is_incomplete_never_ok(tmp_path, unprivileged_user):
    """Issue 26 finding 7: the report playbook run as a user who is not root, with triton_server_pid set, cannot read
    the server's /dev/shm (behind /proc/PID/root). A 4 MiB leak is really there. The row was `status: ok`; now it is
    `incomplete`, with the reason, in the table, report.json, report.md and report.html."""
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=())
    workdir = tempfile.mkdtemp(prefix='report-nonroot-', dir='/tmp')
    os.chmod(workdir, 0o755)
    report_dir = os.path.join(workdir, 'report')
    textfiles = os.path.join(workdir, 'textfiles')  # the user's own node_exporter textfile directory
    os.mkdir(textfiles)
    os.chown(textfiles, pwd.getpwnam(unprivileged_user).pw_uid, -1)
    cleanup = None
    metrics = ''
    try:
        server.start()
        server.leak('leaked', byte_size=4 << 20)
        prefix, cleanup = _interpreter_wrapper(workdir)
        host = dict(
            ansible_connection='local',
            ansible_python_interpreter=ansible_helpers.PYTHON,
            triton_url=server.url,
            triton_server_pid=server.pid,
            ansible_become=True,
            ansible_become_user=unprivileged_user,
            ansible_become_method='ansible.builtin.su',
        )
        inventory = os.path.join(workdir, 'inventory.yml')
        with open(inventory, 'w') as f:
            yaml.safe_dump({'all': {'children': {'triton': {'hosts': {'t1': host}}}}}, f)
        cmd = prefix + [
            os.path.join(ansible_helpers.BIN, 'ansible-playbook'),
            '-i',
            inventory,
            'tritonops.shm.report',
            '-e',
            json.dumps({'report_dir': report_dir, 'prometheus_textfile_dir': textfiles}),
        ]
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=ansible_helpers.ansible_env(),
            timeout=300,
            cwd=workdir,
            check=False,
        )
        with open(os.path.join(report_dir, 'report.json')) as f:
            rows = json.load(f)['hosts']
        with open(os.path.join(report_dir, 'report.md')) as f:
            markdown = f.read()
        with open(os.path.join(report_dir, 'report.html')) as f:
            page = f.read()
        for name in os.listdir(textfiles):
            with open(os.path.join(textfiles, name)) as f:
                metrics += f.read()
        assert 'leaked' in server.system_regions()  # the leak was there all along
    finally:
        if cleanup is not None:
            cleanup()
        server.cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    [row] = rows
    assert row['status'] == 'incomplete', row
    assert row['holders_complete'] is False and 'is not readable' in row['error'], row
    assert '| t1 | **incomplete** |' in markdown and 'is not readable' in markdown
    assert 'data-status="incomplete"' in page and 'is not readable' in page
    # and the metrics: the holders incomplete, for that reason
    (line,) = [x for x in metrics.splitlines() if x.startswith('tritonops_shm_holders_complete{')]
    assert line.endswith(' 0') and ('reason="shm_dir"' in line or 'reason="unreadable_processes"' in line), line
    # the fleet table (in the json callback's output): the row's numbers under status incomplete, never ok
    assert any(line.strip().strip('",').split()[:2] == ['t1', 'incomplete'] for line in proc.stdout.splitlines()), (
        proc.stdout
    )


def test_every_byte_of_the_shm_directory_is_explained(triton):
    """Issue 42, goal 1: bytes for every region state and file category, and the categories add up to what the
    filesystem says is used, the rest named: a live, a killed and a dangling client (its file unlinked, still mapped by
    the server), the python backend's pool, an orphan-shaped file and a foreign one."""
    triton.client('live', byte_size=2 * MIB)
    triton.leak('dead', byte_size=3 * MIB)
    triton.leak('gone', byte_size=4 * MIB, keep_file=False)
    triton.write_file('postgres_shm_1', 5 * MIB)
    info = ansible_helpers.run_module(INFO, dict(url=triton.url))
    s = info['summary']
    assert s['healthy_bytes'] == 2 * MIB and s['stale_bytes'] == 3 * MIB, s
    assert s['dangling_bytes'] == 4 * MIB == s['unlinked_mapped_bytes'], s
    assert s['foreign_bytes'] >= 5 * MIB and s['registered_bytes'] == 5 * MIB, s
    categories = sum(s[c + '_bytes'] for c in ('registered', 'backend', 'leftover', 'in_use', 'orphan', 'foreign'))
    assert categories == s['files_bytes'] == sum(f['allocated_bytes'] for f in info['files'])
    assert s['files_bytes'] + s['unlinked_mapped_bytes'] + s['other_bytes'] == s['used_bytes'], s
    assert s['other_bytes'] < 64 * 1024, 'nothing else uses this private /dev/shm: at most a few pages'


def test_the_files_that_are_not_tritons_are_counted_by_family_held_and_unheld(triton, tmp_path):
    """Issue 42, goal 1: NCCL, vLLM, Python shared_memory and PyTorch files beside a real 2.51's regions, some held by a
    live process, some left by a dead one. triton_shm_info counts them by family with their bytes, the textfile
    exports them, and not even orphan_patterns '*' makes any of them an orphan."""
    made = {
        'nccl-Xy12ab': 3 * MIB,
        'vllm_offload_0.mmap': 2 * MIB,
        'psm_1a2b3c4d': MIB,
        'torch_4711_0': MIB,
        'mystery.bin': 4096,
    }
    for name, size in made.items():
        triton.write_file(name, size)
    holder = subprocess.Popen(
        [sys.executable, '-c', HOLD_FILES, triton.shm_path('nccl-Xy12ab'), triton.shm_path('torch_4711_0')],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == 'READY'
        info = ansible_helpers.run_module(
            INFO, dict(url=triton.url, orphan_patterns=['*'], min_age=0, metrics_dir=str(tmp_path), metrics_host='t1')
        )
        fams = {f['name']: f for f in info['families']}
        assert (fams['nccl']['held_files'], fams['nccl']['held_bytes']) == (1, 3 * MIB), fams['nccl']
        assert (fams['vllm']['unheld_files'], fams['vllm']['unheld_bytes']) == (1, 2 * MIB), fams['vllm']
        assert fams['python_shared_memory']['unheld_files'] == 1 and fams['pytorch']['held_files'] == 1
        assert 'other' not in fams, 'mystery.bin is an orphan here (a name of no family, under orphan_patterns *)'
        files = {f['name']: f for f in info['files']}
        assert all(files[n]['category'] in ('foreign', 'in_use') for n in made if n != 'mystery.bin')
        assert files['mystery.bin']['category'] == 'orphan', "only a name of no family may be an orphan on a '*'"
        text = ''.join(open(p).read() for p in info['metrics_files'])
        (line,) = [
            x
            for x in text.splitlines()
            if x.startswith('tritonops_shm_family_bytes{') and 'family="nccl"' in x and 'held="true"' in x
        ]
        assert line.endswith(f' {3 * MIB}'), line
    finally:
        holder.kill()
        holder.wait()


# a process that opens and maps the files given and waits (a live NCCL peer, a live PyTorch worker)
HOLD_FILES = """
import mmap, os, sys, time
maps = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDWR)
    maps.append(mmap.mmap(fd, 0))
    os.close(fd)
print('READY', flush=True)
time.sleep(600)
"""
