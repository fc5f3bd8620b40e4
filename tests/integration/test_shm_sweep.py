"""triton_shm_sweep (issue 42, goal 4) on the real Triton 2.51: clean a /dev/shm no server runs on, before one starts.

A server started with a custom pool prefix (``--backend-config=python,shm-region-prefix-name=sweep0_``) in a private
/dev/shm that outlives it (tritonrig.ShmNamespace) is SIGKILLed with its python stubs (tritonrig.crash): its pools stay,
unheld, as on a host whose Triton container died with ``--ipc=host``. The sweep, given only the directory, removes them
and nothing else; refuses while a server runs there; keeps a pool a process maps, and a pool-named symlink.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile

import tritonrig
from ansible_helpers import ansible_playbook, run_module

SWEEP = 'tritonops.shm.triton_shm_sweep'
PREFIX = 'sweep0_'
AGED = 2.0  # seconds: the min_age of the family step; the file is waited for (a file's age counts from its newest time)


def _write(path: str, size: int = 4096) -> str:
    with open(path, 'wb') as f:
        f.write(b'\1' * size)
    return path


def _names(paths) -> list:
    return sorted(os.path.basename(p) for p in paths)


def _server(tmp_path, ns: tritonrig.ShmNamespace) -> tritonrig.TritonServer:
    """A running server with the custom pool prefix, in ns."""
    return tritonrig.TritonServer(
        workdir=str(tmp_path), name='sweep', namespace=ns, backend_config=(f'python,shm-region-prefix-name={PREFIX}',)
    ).start()


def _crashed_server(tmp_path, ns: tritonrig.ShmNamespace) -> list:
    """Start a server with the custom prefix in ns, crash it with its stubs; its pool file names."""
    server = _server(tmp_path, ns)
    try:
        pools = [f for f in server.shm_files() if f.startswith(PREFIX)]
        assert pools, server.shm_files()
    finally:
        tritonrig.crash(server)
        server.stop()
    return pools


def _args(ns: tritonrig.ShmNamespace, **kw) -> dict:
    return dict(dict(shm_dir=ns.shm_dir, backend_patterns=[f'{PREFIX}*'], min_age=0), **kw)


def test_after_a_crash_the_sweep_removes_the_pools_of_a_custom_prefix_and_keeps_everything_else(tmp_path):
    with tritonrig.ShmNamespace(shm_size='64m') as ns:
        pools = _crashed_server(tmp_path, ns)
        foreign = _write(os.path.join(ns.shm_dir, 'client_input0'))
        nccl = _write(os.path.join(ns.shm_dir, 'nccl-a1b2c3'))

        preview = run_module(SWEEP, _args(ns), check=True)
        assert not preview.get('failed'), preview
        assert preview['changed'] is True and _names(preview['removed_files']) == sorted(pools), preview
        assert set(pools) <= set(os.listdir(ns.shm_dir)), 'check mode removed a file'

        done = run_module(SWEEP, _args(ns))
        assert done['changed'] is True and _names(done['removed_files']) == sorted(pools), done
        assert done['freed_bytes'] > 0 and done['scan']['holders_complete'] is True
        left = set(os.listdir(ns.shm_dir))
        assert not set(pools) & left and {'client_input0', 'nccl-a1b2c3'} <= left, left
        kept = {os.path.basename(k['path']): k for k in done['kept']}
        assert kept['client_input0']['category'] == 'foreign' and kept['nccl-a1b2c3']['category'] == 'foreign'

        again = run_module(SWEEP, _args(ns))
        assert again['changed'] is False and again['removed_files'] == [], again

        # families are opt-in, and keep their grace age
        young = run_module(SWEEP, _args(ns, families=['nccl'], min_age=600))
        assert young['changed'] is False and os.path.exists(nccl), young
        reasons = {os.path.basename(k['path']): k['reason'] for k in young['kept']}
        assert 'younger than min_age' in reasons['nccl-a1b2c3'], reasons
        tritonrig.wait_older([nccl], AGED)
        old = run_module(SWEEP, _args(ns, families=['nccl'], min_age=AGED))
        assert _names(old['removed_files']) == ['nccl-a1b2c3'], old
        assert os.path.exists(foreign) and not os.path.exists(nccl)
        assert run_module(SWEEP, _args(ns, families=['nccl'], min_age=AGED))['changed'] is False


def test_refused_while_a_server_runs_in_that_namespace_naming_its_pid(tmp_path):
    with tritonrig.ShmNamespace(shm_size='64m') as ns:
        server = _server(tmp_path, ns)
        try:
            before = server.shm_files()
            for check in (True, False):
                res = run_module(SWEEP, _args(ns), check=check)
                assert res.get('failed') and f'tritonserver (pid {server.pid})' in res['msg'], res
                assert 'Nothing was changed' in res['msg']
            skipped = run_module(SWEEP, _args(ns, in_use='skip'))
            assert not skipped.get('failed') and skipped['changed'] is False, skipped
            assert f'tritonserver (pid {server.pid})' in skipped['in_use'] and skipped['removed_files'] == []
            assert server.shm_files() == before
        finally:
            server.stop()


def test_a_held_pool_and_a_pool_named_symlink_are_kept(tmp_path):
    with tritonrig.ShmNamespace(shm_size='64m') as ns:
        pools = _crashed_server(tmp_path, ns)
        held = pools[0]
        target = _write(str(tmp_path / 'outside'))
        link = os.path.join(ns.shm_dir, f'{PREFIX}00000000-0000-0000-0000-000000000000')
        os.symlink(target, link)
        holder = subprocess.Popen(
            [
                sys.executable,
                '-c',
                'import mmap, sys; f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 0); f.close(); '
                'print("ready", flush=True); sys.stdin.read()',
                os.path.join(ns.shm_dir, held),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout.readline().strip() == 'ready'  # returns once the file is mapped (or the child ended)
            done = run_module(SWEEP, _args(ns))
            assert _names(done['removed_files']) == sorted(pools[1:]), done
            kept = {os.path.basename(k['path']): k for k in done['kept']}
            assert kept[held]['category'] == 'backend' and f'held by {holder.pid}' in kept[held]['reason'], kept[held]
            assert kept[os.path.basename(link)]['category'] == 'foreign', kept
            assert os.path.islink(link) and os.path.exists(target) and os.path.exists(os.path.join(ns.shm_dir, held))
        finally:
            holder.stdin.close()
            holder.wait(timeout=10)
        done = run_module(SWEEP, _args(ns))
        assert _names(done['removed_files']) == [held], done  # its holder gone, the next run takes it
        assert os.path.islink(link) and os.path.exists(target)


ROLE_SWEEP = "tritonops.shm.triton_server : Sweep the host's /dev/shm before the server starts"


def test_the_triton_server_role_sweeps_the_hosts_dev_shm_before_a_container_with_ipc_host():
    """The role's step runs before the engine's tasks with ipc_mode host (check mode: nothing changes on this host),
    and not with a private /dev/shm or triton_server_shm_sweep: false. The engine is unreachable on purpose: the role
    stops at it, after the sweep."""
    base = dict(
        triton_server_engine='docker',
        triton_server_check_collection=False,
        triton_server_docker_host='unix:///nonexistent/docker.sock',
        triton_server_image='nvcr.io/nvidia/tritonserver:24.10-py3',
    )
    seen = {}
    for case, extra in (
        ('host', dict(triton_server_ipc_mode='host')),
        ('off', dict(triton_server_ipc_mode='host', triton_server_shm_sweep=False)),
        ('private', dict(triton_server_ipc_mode='private')),
    ):
        play = [
            {
                'name': 'the role',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'roles': [{'role': 'tritonops.shm.triton_server', 'vars': dict(base, **extra)}],
            }
        ]
        seen[case] = ansible_playbook(play, check=True).task(ROLE_SWEEP)
    assert not seen['host'].get('skipped') and not seen['host'].get('failed'), seen['host']
    assert seen['host']['changed'] is False and 'removed_files' in seen['host']
    assert seen['off'].get('skipped') and seen['private'].get('skipped'), seen


# -- not root: a user who cannot see every process removes nothing ------------------------------------------------

from test_triton_shm_info import (  # noqa: E402  pylint: disable=wrong-import-position,unused-import
    _interpreter_wrapper,
    run_plays_wrapped,
    unprivileged_user,  # noqa: F401  the fixture
)


def test_as_a_user_who_cannot_see_every_process_nothing_is_removed(unprivileged_user):  # noqa: F811
    """The user's own directory and its own unheld, old pool: the user cannot read root's processes, so the scan is
    incomplete and the sweep decides nothing (where a tritonserver of root runs meanwhile, its root cannot be read
    either, and the sweep is refused: nothing is removed in both cases)."""
    user = pwd.getpwnam(unprivileged_user)
    workdir = tempfile.mkdtemp(prefix='sweep-nonroot-', dir='/tmp')
    os.chmod(workdir, 0o755)
    cleanup = None
    try:
        shm, locks = os.path.join(workdir, 'shm'), os.path.join(workdir, 'locks')
        for d, mode in ((shm, 0o755), (locks, 0o700)):
            os.mkdir(d, mode)
            os.chown(d, user.pw_uid, user.pw_gid)
        pool = _write(os.path.join(shm, 'triton_python_backend_shm_region_0c4e5f6a-1b2c-4d3e-8f9a-0b1c2d3e4f5a'))
        os.chown(pool, user.pw_uid, user.pw_gid)
        prefix, cleanup = _interpreter_wrapper(workdir)
        plays = [
            {
                'name': 'sweep as a user who is not root',
                'hosts': 'localhost',
                'connection': 'local',
                'gather_facts': False,
                'tasks': [
                    {
                        'name': 'user',
                        SWEEP: dict(shm_dir=shm, min_age=0, in_use='skip', lock_dir=locks),
                        'become': True,
                        'become_user': unprivileged_user,
                        'become_method': 'ansible.builtin.su',
                    }
                ],
            }
        ]
        res = run_plays_wrapped(prefix, plays, workdir)
        assert res.data, res
        done = res.task('user')
        assert not done.get('failed') and done['changed'] is False and done['removed_files'] == [], done
        assert os.path.exists(pool)
        if done['in_use'] is None:
            assert done['scan']['holders_complete'] is False, done
            assert any('it decides nothing' in w for w in done.get('warnings', [])), done.get('warnings')
        else:
            assert 'cannot be read' in done['in_use'], done['in_use']
    finally:
        if cleanup is not None:
            cleanup()
        subprocess.run(['rm', '-rf', '--one-file-system', workdir], check=False)
