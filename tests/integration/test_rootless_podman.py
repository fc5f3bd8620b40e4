"""A real Triton 2.51 in a rootless podman container (issue 40, goal 5).

A user with subordinate ids runs ``podman run -p 127.0.0.1:PORT:8000 --shm-size=64m`` of the rig image (imported from
the venv's files, no registry), with real clients in the container (``podman exec``), one of them SIGKILLed with its
process group (a stale region, its file kept). The modules run on the host as root with the URL alone:

- discovery follows rootless podman's port forwarder: ``rootlessport`` holds the host's listening socket from the
  container's network namespace and connects onward from there (0.2.x accepted no socket owner outside the socket's
  own namespace: "the process owning 127.0.0.1:PORT ... could not be read", nothing done, the host not ok);
- the container's /dev/shm is a tmpfs mounted in the user's namespace, where root's ids are not mapped: the quarantine
  rename runs as the directory's owner (0.2.x unlinked in place after the re-check);
- the live client's region and file are kept, the killed one's unregistered and removed, a rerun changes nothing.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time

import build_image
import pytest
import tritonrig
from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20
IMAGE = 'localhost/tritonops-test/rootless-rig:1'


def _sub_ids(user: str, base: int) -> None:
    for path in ('/etc/subuid', '/etc/subgid'):
        with open(path, 'a', encoding='ascii') as f:
            f.write(f'{user}:{base}:65536\n')


def _drop_sub_ids(user: str) -> None:
    for path in ('/etc/subuid', '/etc/subgid'):
        with open(path, encoding='ascii') as f:
            kept = [line for line in f if not line.startswith(user + ':')]
        with open(path, 'w', encoding='ascii') as f:
            f.writelines(kept)


class Rootless:
    """A user of its own with subordinate ids, running podman rootless in a mount namespace of its own."""

    def __init__(self) -> None:
        self.user = 'tritonops-rl%d' % (os.getpid() % 100000)
        subprocess.run(['useradd', '--create-home', '--shell', '/bin/sh', self.user], check=True, capture_output=True)
        entry = pwd.getpwnam(self.user)
        self.uid, self.home = entry.pw_uid, entry.pw_dir
        _sub_ids(self.user, 400000 + (os.getpid() % 1000) * 65536)
        self.runtime = f'/run/user/{self.uid}'
        os.makedirs(self.runtime, exist_ok=True)
        os.chown(self.runtime, self.uid, entry.pw_gid)
        os.chmod(self.runtime, 0o700)

    def podman(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ['unshare', '--mount', '--propagation', 'slave', 'runuser', '-u', self.user, '--']
        cmd += ['env', f'XDG_RUNTIME_DIR={self.runtime}', f'HOME={self.home}', 'podman', *args]
        # from the user's home: the checkout may sit where the user cannot go (a clone in a 0700 mktemp directory)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.home)
        if check and proc.returncode != 0:
            raise AssertionError(f'podman {" ".join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}')
        return proc

    def import_rig(self) -> None:
        image = build_image.Image('rig', build_image.RIG_REPOSITORY)
        tar = os.path.join(self.home, 'rig.tar')  # where the user can read it (pytest's directories are root's)
        build_image.write_rootfs(image.files, tar, image.texts)
        os.chmod(tar, 0o644)
        self.podman('import', *image.change_args('podman'), tar, IMAGE)
        os.unlink(tar)
        self.python = image.python

    def remove(self) -> None:
        self.podman('rm', '--force', '--all', '--time', '0', check=False, timeout=120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = subprocess.run(
                ['pgrep', '-u', str(self.uid)], capture_output=True, text=True, check=False
            ).stdout.split()
            if not pids:
                break
            for pid in pids:  # the test user's own processes only (conmon, slirp4netns, rootlessport, catatonit)
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        subprocess.run(['userdel', '--remove', self.user], check=False, capture_output=True)
        subprocess.run(['rm', '-rf', '--one-file-system', self.runtime, self.home], check=False)
        _drop_sub_ids(self.user)


@pytest.fixture
def rootless():
    r = Rootless()
    try:
        r.import_rig()
        yield r
    finally:
        r.remove()


def _client_pid(name: str, uid: int) -> int:
    """The host's pid of the rig client of region name, run by uid (started by podman exec: its own process group)."""
    for _attempt in range(200):
        found = subprocess.run(
            ['pgrep', '-u', str(uid), '-f', f'client.py .*--name {name} '], capture_output=True, text=True, check=False
        )
        pids = found.stdout.split()
        if len(pids) == 1:
            return int(pids[0])
        time.sleep(0.05)
    raise AssertionError(f'client {name} not found once: {pids}')


def _registered(url: str) -> set:
    status, body = tritonrig.http_json(url + '/v2/systemsharedmemory/status')
    assert status == 200, body
    return {r['name'] for r in body}


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_rootless_podman_triton_is_found_by_url_and_its_stale_region_reclaimed_as_the_owner(rootless):
    port = tritonrig.free_port()
    url = f'http://127.0.0.1:{port}'
    rootless.podman(
        'run', '--detach', '--name', 'triton', '--publish', f'127.0.0.1:{port}:8000', '--shm-size', '64m',
        IMAGE, 'tritonserver', '--model-repository=/models', '--model-control-mode=explicit',
    )  # fmt: skip

    def ready() -> bool:
        try:
            return tritonrig.http_json(url + '/v2/health/ready', timeout=2)[0] == 200
        except OSError:
            return False

    _wait(ready, 120, 'the rootless tritonserver did not become ready')
    for name in ('live', 'dead'):
        rootless.podman(
            'exec', '--detach', 'triton', rootless.python, build_image.CLIENT_PATH, '--url', 'http://127.0.0.1:8000',
            '--name', name, '--key', '/' + name, '--byte-size', str(MIB), '--mode', 'hold',
        )  # fmt: skip
    _wait(lambda: _registered(url) >= {'live', 'dead'}, 60, 'the clients did not register')
    live = _client_pid('live', rootless.uid)
    os.killpg(_client_pid('dead', rootless.uid), signal.SIGKILL)  # the client and its resource tracker: the file stays

    info = run_module(INFO, dict(url=url))
    assert not info.get('failed'), info
    server = info['server']
    assert server['pid'] is not None and 'rootlessport' in server['located_by'], json.dumps(server)[:2000]
    states = {r['name']: r['state'] for r in info['system_regions']}
    assert states == {'live': 'healthy', 'dead': 'stale'}, states
    shm = server['shm_dir']
    assert os.stat(shm).st_uid == rootless.uid, 'the tmpfs belongs to the container root, the user'

    result = run_module(REGION, dict(url=url, state='absent', stale=True))
    assert not result.get('failed'), result
    assert result['unregistered'] == ['dead'] and [os.path.basename(p) for p in result['removed_files']] == ['dead']
    assert _registered(url) == {'live'} and sorted(os.listdir(shm)) == ['live']
    os.kill(live, 0)  # the live client runs on
    assert run_module(REGION, dict(url=url, state='absent', stale=True))['changed'] is False
