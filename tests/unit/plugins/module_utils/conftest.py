"""Make ``ansible_collections.tritonops.shm`` importable under plain pytest, and shared helpers.

The tests run from the collection copy (``build/ansible_collections/tritonops/shm``): adding
the collections root to sys.path lets this collection's module_utils be imported next to the
collections the ``ansible`` package installs. ansible-test sets this up itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_COLLECTION)))

if _COLLECTION.split(os.sep)[-3:] == ['ansible_collections', 'tritonops', 'shm'] and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# grpcio's fork support restarts its threads in a forked child: _run_as's child must stay single-threaded
# to setns() into a mount namespace (EINVAL otherwise). Read when grpc is first imported.
os.environ.setdefault('GRPC_ENABLE_FORK_SUPPORT', 'false')

NOBODY = 65534


def _run_as(uid, func, args, setns_pid=None):
    """Run func(*args) in a forked child as uid (gid = uid), optionally inside the mount namespace of setns_pid."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.close(read)
            if setns_pid is not None:
                fd = os.open('/proc/%d/ns/mnt' % setns_pid, os.O_RDONLY)
                os.setns(fd, os.CLONE_NEWNS)
                os.close(fd)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = json.dumps(func(*args)).encode()
        except BaseException as exc:  # report anything to the parent
            out = json.dumps({'error': repr(exc)}).encode()
            code = 1
        os.write(write, out)
        os._exit(code)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b''.join(chunks))


@pytest.fixture
def as_nobody():
    """as_nobody(func, *args, setns_pid=None): func's JSON-able result, computed by a forked child running as uid 65534."""
    if os.geteuid() != 0:
        pytest.skip('needs root to drop to another user')

    def run(func, *args, **kwargs):
        return _run_as(NOBODY, func, args, setns_pid=kwargs.get('setns_pid'))

    return run


# -- RegionOps on real files: a stand-in server process, a shm directory, a complete /proc scan ----------------


def _rig():
    """tests/rig/tritonrig.py (standard library only)."""
    sys.path.insert(0, os.path.join(_COLLECTION, 'tests', 'rig'))
    try:
        import tritonrig  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    return tritonrig


@pytest.fixture(scope='session')
def wait_older():
    """wait_older(paths, seconds): the rig's bounded poll until every path's newest time (atime, mtime, ctime) is more
    than seconds old. The modules age a file from that time and utime() cannot set ctime back."""
    return _rig().wait_older


@pytest.fixture(scope='session')
def keep_young():
    """keep_young(path): the rig's, path dated an hour ahead, so it stays younger than any min_age through every run."""
    return _rig().keep_young


@pytest.fixture
def server_proc():
    """A real process standing in for tritonserver (so that the test process itself is a client)."""
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def cuda_server_proc(tmp_path, monkeypatch):
    """server_proc as a CUDA context process (CUDA-FACTS.md, fact 11: tritonserver maps /dev/nvidia-uvm): it maps a
    file that stands for the device, and gpu.UVM names that file, so the CUDA rule's positive control sees it."""
    from ansible_collections.tritonops.shm.plugins.module_utils.host import gpu

    uvm = tmp_path / 'nvidia-uvm'
    uvm.write_bytes(bytes(4096))
    monkeypatch.setattr(gpu, 'UVM', str(uvm).encode())
    code = 'import mmap, sys, time; f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 4096); print(1, flush=True)'
    proc = subprocess.Popen([sys.executable, '-c', code + '; time.sleep(300)', str(uvm)], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # mapped
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.fixture
def shm(tmp_path):
    d = tmp_path / 'shm'
    d.mkdir()
    return str(d)


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path_factory, monkeypatch):
    """Each test's runs take their locks (runlock.LOCK_DIR, root's /run/tritonops_shm) in a directory of their own."""
    from ansible_collections.tritonops.shm.plugins.module_utils.host import runlock

    path = str(tmp_path_factory.mktemp('locks') / 'tritonops_shm')
    real = runlock.lock_dir
    monkeypatch.setattr(runlock, 'LOCK_DIR', path)
    monkeypatch.setattr(runlock, 'lock_dir', lambda euid=None: path if euid is None else real(euid))
    return path


@pytest.fixture
def complete_scan(monkeypatch):
    """The real /proc scan, with processes we cannot read set aside.

    The temp dir lives on a filesystem every mount namespace of this host sees, and this
    sandbox's init cannot be read even by root, which would make every scan incomplete.
    Processes we cannot read are not ours and cannot hold our fresh temp files; the
    unreadable-process rule itself belongs to holders.py and its tests.
    """
    from ansible_collections.tritonops.shm.plugins.module_utils.host import holders

    real = holders.scan

    def scan(targets, **kwargs):
        result = real(targets, **kwargs)
        result.unreadable_ignored.extend(result.unreadable)
        result.unreadable = []
        return result

    monkeypatch.setattr(holders, 'scan', scan)
