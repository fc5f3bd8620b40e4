"""Stubs that die with their server (issue 42, goal 7), on the real Triton 2.51 from the wheel.

A python model's stub (``triton_python_backend_stub``, comm ``triton_python_b``) maps its pool
``triton_python_backend_shm_region_<uuid>`` and watches its parent: when the server is gone, the stub unlinks its pool
and exits. So a server SIGKILLed alone leaves nothing. A stub that dies with its server, or right after it and before it
notices, leaves its pool unheld: ``leftover``, reclaimed by ``backend_leftovers``.

The scene: one /dev/shm that outlives its servers (tritonrig.ShmNamespace), a live server in it that keeps serving
(the URL the modules are given: a dead server has none), and beside it servers that die: one SIGKILLed alone, its stubs
running; one whose stubs are frozen (SIGSTOP), then the server SIGKILLed, then the stubs SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest
import tritonrig
from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MODELS = ('echo', 'mirror')
PREFIX = 'triton_python_backend_shm_region_'
STUB_COMM = 'triton_python_b'  # triton_python_backend_stub, cut to 15 characters by the kernel
AGED = 2.0  # seconds: the min_age here; the dead stubs' pools are waited for until older (tritonrig.wait_older)
BOUND = 30.0  # seconds: the most any wait here may take


def pools(ns: tritonrig.ShmNamespace) -> set[str]:
    return {f for f in os.listdir(ns.shm_dir) if f.startswith(PREFIX)}


def comm(pid: int) -> str | None:
    try:
        with open(f'/proc/{pid}/comm') as f:
            return f.read().strip()
    except OSError:
        return None


def stubs_of(server: tritonrig.TritonServer) -> list[int]:
    """The server's python backend stubs: its children whose comm is the stub's."""
    children = []
    for task in os.listdir(f'/proc/{server.pid}/task'):
        with open(f'/proc/{server.pid}/task/{task}/children') as f:
            children += [int(c) for c in f.read().split()]
    return sorted(c for c in children if comm(c) == STUB_COMM)


def gone(pid: int) -> bool:
    """pid has exited (a zombie no one reaped yet maps and holds nothing) or is no more."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except OSError:
        return True


def until(what: str, predicate: Callable[[], bool], timeout: float = BOUND) -> None:
    """Return once predicate() holds, polled every 10 ms; an AssertionError naming what after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f'not within {timeout}s: {what}')
        time.sleep(0.01)


def start_doomed(tmp_path, ns: tritonrig.ShmNamespace, name: str) -> tuple[tritonrig.TritonServer, set[str], list[int]]:
    """A server with two python models in ns: the server, its own pools (new in ns) and its stubs."""
    before = pools(ns)
    server = tritonrig.TritonServer(workdir=str(tmp_path), namespace=ns, name=name, models=MODELS).start()
    own = pools(ns) - before
    stubs = stubs_of(server)
    assert len(own) == len(MODELS) and len(stubs) == len(MODELS), (own, stubs)
    return server, own, stubs


def kill_server(server: tritonrig.TritonServer) -> None:
    """SIGKILL the server process alone (its stubs are not in the signal) and reap it."""
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(timeout=BOUND)


@pytest.fixture(scope='module')
def keeper(tmp_path_factory):
    """A /dev/shm that outlives its servers, and a live server in it (the modules' URL) with one python model."""
    with tritonrig.ShmNamespace('64m') as ns:
        server = tritonrig.TritonServer(
            workdir=str(tmp_path_factory.mktemp('keeper')), namespace=ns, name='keeper', models=('echo',)
        )
        try:
            server.start()
            own = pools(ns)
            assert len(own) == 1, own
            yield ns, server, own
        finally:
            server.stop()


def test_a_server_sigkilled_alone_leaves_nothing_its_stubs_unlink_their_pools(keeper, tmp_path):
    ns, live, live_pools = keeper
    server, own, stubs = start_doomed(tmp_path, ns, 'alone')
    try:
        killed = time.monotonic()
        kill_server(server)
        until('the stubs of a server SIGKILLed alone unlink their pools', lambda: not own & pools(ns))
        took = time.monotonic() - killed
        until('the stubs of a server SIGKILLed alone exit', lambda: all(gone(p) for p in stubs))
        exited = time.monotonic() - killed
    finally:
        for pid in stubs:  # they are ours to stop, by pid, whatever happened
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()
    print(
        f'\nthe stubs unlinked their pools {took:.2f} s after the SIGKILL of their server, and exited by {exited:.2f} s'
    )
    assert took < 10, f'the stubs took {took:.2f} s (0.06 to 0.3 s measured on 2.51)'
    info = run_module(INFO, dict(url=live.url, min_age=0))
    assert not info.get('failed'), info
    assert info['summary']['leftover_files'] == 0 and pools(ns) == live_pools, info['backend_pools']


def test_stubs_that_die_right_after_their_server_leave_leftovers_the_cleanup_reclaims(keeper, tmp_path):
    ns, live, live_pools = keeper
    server, own, stubs = start_doomed(tmp_path, ns, 'with-stubs')
    try:
        for pid in stubs:
            os.kill(pid, signal.SIGSTOP)  # frozen: they cannot notice their server's end
        kill_server(server)
        for pid in stubs:
            os.kill(pid, signal.SIGKILL)  # and die right after it, before they could unlink anything
        until('the frozen stubs die of their SIGKILL', lambda: all(gone(p) for p in stubs))
    finally:
        for pid in stubs:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()
    assert own <= pools(ns), 'stubs that die with their server leave their pools'
    tritonrig.wait_older([os.path.join(ns.shm_dir, name) for name in own], AGED)

    info = run_module(INFO, dict(url=live.url, min_age=AGED))
    assert not info.get('failed'), info
    by_name = {p['name']: p for p in info['backend_pools']}
    assert {n: (by_name[n]['state'], by_name[n]['holders']) for n in own} == {n: ('leftover', []) for n in own}
    assert {by_name[n]['state'] for n in live_pools} == {'live'}
    assert (info['summary']['leftover_files'], info['summary']['leftover_bytes']) == (2, 2 << 20), info['summary']

    args = dict(url=live.url, state='absent', backend_leftovers=True, min_age=AGED)
    done, again = run_module(REGION, args), run_module(REGION, args)
    assert not done.get('failed') and done['changed'] is True, done
    assert sorted(os.path.basename(p) for p in done['removed_files']) == sorted(own), done
    assert again['changed'] is False and again['removed_files'] == [], again
    assert pools(ns) == live_pools
    status, answer = tritonrig.http_json(
        f'{live.url}/v2/models/echo/infer',
        method='POST',
        body={'inputs': [{'name': 'INPUT0', 'shape': [2], 'datatype': 'UINT8', 'data': [7, 8]}]},
        timeout=30,
    )
    assert status == 200 and answer['outputs'][0]['data'] == [7, 8], 'the live server still serves through its pool'
