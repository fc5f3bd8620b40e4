"""Faults: every one gives a clear error naming the server, reports what was already done, and a rerun converges.

All on the real rig: real tritonserver processes SIGKILLed or restarted, a real
forwarding proxy in front of Triton that starts failing, real web servers that
are not Triton, a really full /dev/shm. Connection refused and timeout of
triton_shm_info are in test_triton_shm_info.py; here the region module, which
changes things, meets the same faults.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import ansible_helpers
import proxy_helpers
import pytest
import tritonrig

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20


def assert_clean_failure(result, *needles):
    assert result.get('failed') is True, result
    for needle in needles:
        assert needle in result['msg'], 'expected %r in msg %r' % (needle, result['msg'])
    text = json.dumps(result)
    assert 'Traceback' not in text and 'File "' not in text, text


def basenames(paths):
    return set(os.path.basename(p) for p in paths)


# -- endpoints that are not a healthy Triton ---------------------------------------------------


class _CannedHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's canned (status, content type, body)."""

    def _answer(self):
        length = int(self.headers.get('Content-Length') or 0)
        if length:
            self.rfile.read(length)
        status, ctype, body = self.server.canned
        self.send_response(status)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815 (http.server API)

    def log_message(self, *args):
        pass


CANNED = {
    'http500': (500, 'text/html', b'<html><body><h1>500 Internal Server Error</h1>upstream crashed</body></html>'),
    'http503': (503, 'text/plain', b'503 Service Unavailable: no healthy upstream'),
    'not_json': (200, 'text/html', b'<!DOCTYPE html><html><title>Apache2 Default Page</title>It works!</html>'),
}
EXPECT = {
    'refused': ['cannot connect'],
    'timeout': ['timeout'],
    'http500': ['HTTP 500', 'upstream crashed'],
    'http503': ['HTTP 503', 'no healthy upstream'],
    'not_json': ['not Triton JSON', 'Apache2 Default Page'],
}


class Endpoint:
    """A loopback endpoint showing one fault: refused, timeout (accepts, never answers), or a canned answer."""

    def __init__(self, fault):
        self.fault = fault
        self.httpd = self.sock = None
        if fault == 'refused':
            self.port = tritonrig.free_port()
        elif fault == 'timeout':
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.bind(('127.0.0.1', 0))
            self.sock.listen(16)
            self.port = self.sock.getsockname()[1]
        else:
            self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _CannedHandler)
            self.httpd.daemon_threads = True
            self.httpd.canned = CANNED[fault]
            self.port = self.httpd.server_address[1]
            threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = 'http://127.0.0.1:%d' % self.port

    def close(self):
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self.sock:
            self.sock.close()


@pytest.mark.parametrize(
    'module,fault',
    [
        (REGION, 'refused'),
        (REGION, 'timeout'),
        (REGION, 'http500'),
        (REGION, 'http503'),
        (REGION, 'not_json'),
        (INFO, 'http500'),
        (INFO, 'http503'),
    ],
)
def test_fault_gives_a_clear_error_naming_the_server_and_touches_nothing(module, fault, tmp_path):
    shm = tmp_path / 'shm'
    shm.mkdir()
    victim = shm / 'stale_looking'
    victim.write_bytes(b'x' * 4096)
    endpoint = Endpoint(fault)
    args = dict(url=endpoint.url, shm_dir=str(shm), timeout=2)
    if module == REGION:
        args.update(state='absent', stale=True, all=True, orphan_files=True, orphan_patterns=['*'], min_age=0)
    try:
        started = time.monotonic()
        res = ansible_helpers.run_module(module, args)
        elapsed = time.monotonic() - started
    finally:
        endpoint.close()
    assert_clean_failure(res, endpoint.url, *EXPECT[fault])
    assert elapsed < 60
    if module == REGION:
        assert res['unregistered'] == [] and res['removed_files'] == [] and res['changed'] is False
    assert victim.read_bytes() == b'x' * 4096, 'a failed call must not touch the shm dir'


# -- a proxy in front of Triton that starts failing part-way --------------------------------


class FailAfter:
    """Forward the first `allowed` unregister requests, then answer 503 to every unregister."""

    def __init__(self, allowed):
        self.allowed = allowed
        self.forwarded = 0
        self.failed = 0
        self.enabled = True
        self.lock = threading.Lock()

    def __call__(self, method, path, headers):
        if not (self.enabled and path.endswith('/unregister')):
            return None
        with self.lock:
            if self.forwarded < self.allowed:
                self.forwarded += 1
                return None
            self.failed += 1
        return 503, 'text/plain', b'503 Service Unavailable: upstream connect error'


def test_proxy_failing_part_way_reports_what_was_done_and_a_rerun_converges(make_triton):
    server = make_triton(models=())
    live = server.client('live_in', byte_size=MIB)
    leaked = server.leak_many('leaked', 20, byte_size=64 * 1024)
    baseline_files = set(server.shm_files()) - set(leaked)
    fault = FailAfter(allowed=5)
    with proxy_helpers.ForwardingProxy(server.url, fault=fault) as proxy:
        args = dict(url=proxy.url(), server_pid=server.pid, state='absent', stale=True)
        first = ansible_helpers.run_module(REGION, args)
        assert_clean_failure(first, proxy.url(), 'HTTP 503', 'upstream connect error', 'unregister system region')
        done = first['unregistered']
        assert len(done) == 5 and set(done) <= set(leaked)
        assert first['changed'] is True
        # the regions confirmed unregistered had their files removed; the others stay registered with their files
        assert basenames(first['removed_files']) == set(done)
        regions = server.system_regions()
        left = set(leaked) - set(done)
        assert set(regions) == left | {'live_in'}
        assert left <= set(server.shm_files())
        assert not set(done) & set(server.shm_files())
        # the proxy recovers: the same task converges
        fault.enabled = False
        second = ansible_helpers.run_module(REGION, args)
        third = ansible_helpers.run_module(REGION, args)
    assert not second.get('failed') and second['changed'] is True, second
    assert set(second['unregistered']) == left
    assert basenames(second['removed_files']) == left
    assert not third.get('failed') and third['changed'] is False, third
    assert set(server.system_regions()) == {'live_in'}
    assert set(server.shm_files()) == baseline_files
    assert live.alive


# -- tritonserver SIGKILLed in the middle of a 1,000-region bulk unregister ----------------------


def _run_and_kill_when(server, args, remaining_at_most):
    """Run the module in a thread; SIGKILL the server once it has unregistered some regions.

    Returns (result, regions left registered when the server was killed, seconds to the kill).
    """
    box = {}
    thread = threading.Thread(target=lambda: box.update(res=ansible_helpers.run_module(REGION, args)))
    started = time.monotonic()
    thread.start()
    left = None
    while thread.is_alive():
        try:
            count = len(server.system_regions())
        except OSError:
            break
        if count <= remaining_at_most:
            server.kill()
            left = count
            break
        time.sleep(0.005)
    killed_after = time.monotonic() - started
    thread.join(timeout=300)
    assert left is not None, 'the module finished before the server could be killed: %s' % box.get('res')
    return box['res'], left, killed_after


def test_server_sigkilled_mid_bulk_unregister_then_a_rerun_converges(tmp_path):
    """--ipc=host-like: the shm dir outlives the server; the module was given it (shm_dir)."""
    with tritonrig.ShmNamespace('64m') as ns:
        server = tritonrig.TritonServer(workdir=str(tmp_path), models=(), namespace=ns, name='first')
        restarted = None
        try:
            server.start()
            leaked = server.leak_many('bulk', 1000, byte_size=4096)
            assert len(server.system_regions()) == 1000
            args = dict(url=server.url, shm_dir=ns.shm_dir, state='absent', stale=True)
            res, left, killed_after = _run_and_kill_when(server, args, remaining_at_most=995)
            assert_clean_failure(res, server.url, 'cannot connect')
            done = res['unregistered']
            print(
                'FIGURE sigkill_mid_bulk: killed after %.2fs with %d registered; module reported %d unregistered, %d files removed'  # noqa: E501
                % (killed_after, left, len(done), len(res['removed_files']))
            )
            assert 0 < len(done) < 1000 and set(done) <= set(leaked)
            # a region the server has confirmed unregistered may lose its file; no other file was touched
            assert basenames(res['removed_files']) <= set(done)
            files = set(os.listdir(ns.shm_dir))
            assert set(leaked) - set(done) <= files
            assert len(files) == 1000 - len(res['removed_files'])

            # "converges": the restarted server has no registrations (Triton keeps them in memory), so the
            # leftover files are no region's: not stale, never removed without a pattern ...
            restarted = tritonrig.TritonServer(
                workdir=str(tmp_path), models=(), namespace=ns, name='restarted', http_port=server.http_port
            ).start()
            args = dict(url=restarted.url, state='absent', stale=True)
            rerun = ansible_helpers.run_module(REGION, args)
            assert not rerun.get('failed') and rerun['changed'] is False, rerun
            assert set(os.listdir(ns.shm_dir)) == files
            info = ansible_helpers.run_module(INFO, dict(url=restarted.url))
            assert info['server']['pid'] == restarted.pid
            cats = dict((f['name'], f['category']) for f in info['files'])
            assert set(cats) == files and set(cats.values()) == {'foreign'}
            # ... and removed by pattern, all of them, in one call
            args.update(orphan_files=True, orphan_patterns=['bulk_*'], min_age=0)
            clean = ansible_helpers.run_module(REGION, args)
            again = ansible_helpers.run_module(REGION, args)
        finally:
            if restarted:
                restarted.stop()
            server.stop()
        assert not clean.get('failed') and clean['changed'] is True, clean
        assert basenames(clean['removed_files']) == files
        assert clean['shm_used_bytes_after'] == 0
        assert os.listdir(ns.shm_dir) == []
        assert again['changed'] is False


def test_server_and_its_private_shm_gone_mid_bulk_the_error_names_the_server(make_triton):
    """A container's private /dev/shm dies with it: the error is the server's, the files that could not go are listed."""
    server = make_triton(models=())
    leaked = server.leak_many('bulk', 1000, byte_size=4096)
    res, left, _killed_after = _run_and_kill_when(
        server, dict(url=server.url, state='absent', stale=True), remaining_at_most=995
    )
    assert_clean_failure(res, server.url, 'unregister system region', 'cannot connect')
    assert 0 < len(res['unregistered']) < 1000 and set(res['unregistered']) <= set(leaked)
    assert res['removed_files'] == []
    not_removed = [s for s in res['skipped_items'] if s.get('path')]
    assert basenames(s['path'] for s in not_removed) == set(res['unregistered'])
    assert all('cannot open shm directory' in s['reason'] for s in not_removed)


# -- tritonserver restarted between info and action ------------------------------------------


def test_server_restarted_between_info_and_action_leaves_orphans_cleaned_only_by_pattern(tmp_path):
    with tritonrig.ShmNamespace('64m') as ns:
        server = tritonrig.TritonServer(workdir=str(tmp_path), models=(), namespace=ns, name='before').start()
        restarted = None
        try:
            live = server.client('client_live', byte_size=MIB)
            leaked = server.leak_many('client_leak', 5, byte_size=MIB)
            info = ansible_helpers.run_module(INFO, dict(url=server.url))
            assert info['summary']['stale_regions'] == 5
            server.kill()
            restarted = tritonrig.TritonServer(
                workdir=str(tmp_path), models=(), namespace=ns, name='after', http_port=server.http_port
            ).start()
            assert restarted.system_regions() == {}
            base = dict(url=restarted.url, state='absent', stale=True)
            no_pattern = ansible_helpers.run_module(REGION, base)
            young = ansible_helpers.run_module(REGION, dict(base, orphan_files=True, orphan_patterns=['client_*']))
            after = ansible_helpers.run_module(INFO, dict(url=restarted.url, orphan_patterns=['client_*'], min_age=0))
            pattern = ansible_helpers.run_module(
                REGION, dict(base, orphan_files=True, orphan_patterns=['client_*'], min_age=0)
            )
            files_left = set(os.listdir(ns.shm_dir))
            assert live.alive
        finally:
            if restarted:
                restarted.stop()
            server.stop()
    for res in (no_pattern, young):
        assert not res.get('failed') and res['changed'] is False and res['removed_files'] == [], res
    cats = dict((f['name'], f['category']) for f in after['files'])
    assert cats == dict([(n, 'orphan') for n in leaked] + [('client_live', 'in_use')])
    assert after['summary']['stale_regions'] == 0
    assert pattern['changed'] is True and basenames(pattern['removed_files']) == set(leaked)
    assert files_left == {'client_live'}, 'the live client keeps its file'


# -- the shm filesystem full -----------------------------------------------------------------


def test_shm_full_new_client_fails_info_works_cleanup_frees_and_the_client_succeeds(make_triton):
    server = make_triton(models=(), shm_size='16m')
    live = server.client('live', byte_size=2 * MIB)
    leaked = server.leak_many('leak', 14, byte_size=MIB)
    assert server.shm_usage()['used_bytes'] == 16 * MIB
    # a real new client: tritonclient creates the region (sparse), then writes its tensor into a full tmpfs
    cmd = [
        'nsenter',
        '--mount',
        '--target',
        str(server.pid),
        sys.executable,
        tritonrig.CLIENT_SCRIPT,
        '--url',
        server.url,
        '--name',
        'newcomer',
        '--key',
        '/newcomer',
        '--byte-size',
        str(2 * MIB),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, start_new_session=True, check=False)
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr)
    assert 'newcomer' not in server.system_regions()
    info = ansible_helpers.run_module(INFO, dict(url=server.url))
    assert not info.get('failed'), info
    assert info['shm_fs']['used_percent'] >= 99.0
    assert info['summary']['stale_regions'] == 14 and info['summary']['stale_bytes'] == 14 * MIB
    clean = ansible_helpers.run_module(
        REGION,
        dict(url=server.url, state='absent', stale=True, orphan_files=True, orphan_patterns=['newcomer*'], min_age=0),
    )
    assert not clean.get('failed'), clean
    assert set(clean['unregistered']) == set(leaked)
    assert clean['freed_bytes'] >= 14 * MIB
    print(
        'FIGURE shm_full: used %.1f%% before, freed %d bytes, used %d bytes after'
        % (info['shm_fs']['used_percent'], clean['freed_bytes'], clean['shm_used_bytes_after'])
    )
    newcomer = server.client('newcomer', byte_size=2 * MIB)
    assert newcomer.alive and 'newcomer' in server.system_regions()
    assert live.alive and 'live' in server.system_regions()
