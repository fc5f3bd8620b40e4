"""A real Triton Inference Server test rig.

Starts ``tritonserver`` from the PyPI ``nvidia-pytriton`` wheel on loopback
addresses, each server in its own mount namespace with a private tmpfs on
/dev/shm of a chosen size (exactly what ``docker run --shm-size`` gives a
container), and runs real ``tritonclient`` processes inside that namespace to
create and register shared-memory regions. Clients are left running (live
regions) or SIGKILLed (leaked regions, the real failure).

Used by the pytest fixtures in tests/integration/conftest.py, by the demo and
by the benchmarks. Everything it starts it stops again, by pid.

CLI::

    python tests/rig/tritonrig.py serve [--shm-size 64m] [--host 127.0.0.1]
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_SCRIPT = os.path.join(HERE, 'client.py')

ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def model_config(name: str) -> str:
    """The config.pbtxt of the rig's python model NAME (ECHO_CONFIG under that name)."""
    return ECHO_CONFIG.replace('name: "echo"', 'name: "%s"' % name, 1)


# The python backend stub embeds the base interpreter, whose sys.path does not
# include this venv: put the venv's site-packages first so numpy imports.
def python_model(answer: str, imports: str = '') -> str:
    """model.py of a rig python model (a template with {sites}): answer appends one response per request."""
    return (
        'import sys\nsys.path[:0] = {sites!r}\n'
        + imports
        + 'import triton_python_backend_utils as pb_utils  # noqa: E402\n\n\n'
        'class TritonPythonModel:\n    def execute(self, requests):\n        responses = []\n'
        '        for request in requests:\n' + answer + '        return responses\n'
    )


ECHO_ANSWER = (
    '            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")\n'
    '            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy())]))\n'
)
ECHO_MODEL = python_model(ECHO_ANSWER)


# A model whose python backend pool grows: it answers each request with SIZE zero bytes. One large
# request grows the instance's pool (triton_python_backend_shm_region_*) to hold the output; the pool
# never shrinks afterwards, whatever the later, small requests ask (docs/backend-pools.md).
GROW_CONFIG = """name: "grow"
backend: "python"
max_batch_size: 0
input [ { name: "SIZE" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

GROW_MODEL = python_model(
    '            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])\n'
    '            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.zeros(size, dtype=np.uint8))]))\n',
    imports='import numpy as np  # noqa: E402\n',
)

# An echo that takes SLOW_SECONDS per request: a request holds its client's shared-memory region for at least that
# long, so that a test can meet the server's "currently in use" refusal every time, not by luck under load.
SLOW_SECONDS = 0.2
SLOW_MODEL = python_model(
    '            time.sleep(%r)\n' % SLOW_SECONDS + ECHO_ANSWER, imports='import time  # noqa: E402\n'
)

# The traffic shapes a reload meets (issue 33, finding 5: docs/backend-pools.md, "What a reload costs"):
# 'ens' is an ensemble whose one step is the python model 'echo'; 'bls' is a python model that answers through a
# BLS call of 'echo'; 'seq' is a stateful python model (sequence_batching): it answers the running sum of INPUT0 over
# its sequence (START resets it), so a sequence whose state is lost answers wrong or is refused.
ENSEMBLE_CONFIG = """name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "echo" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""
BLS_MODEL = python_model(
    '            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")\n'
    '            called = pb_utils.InferenceRequest(model_name="echo", requested_output_names=["OUTPUT0"],\n'
    '                                               inputs=[tensor]).exec()\n'
    '            if called.has_error():\n'
    '                raise pb_utils.TritonModelException(called.error().message())\n'
    '            out = pb_utils.get_output_tensor_by_name(called, "OUTPUT0")\n'
    '            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out.as_numpy())]))\n'
)
SEQ_CONFIG = """name: "seq"
backend: "python"
max_batch_size: 0
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
SEQ_MODEL = python_model(
    '            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().ravel()[0])\n'
    '            corrid = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().ravel()[0])\n'
    '            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().ravel()[0])\n'
    '            total = (0 if start else self.sums.get(corrid, 0)) + value\n'
    '            self.sums[corrid] = total\n'
    '            out = pb_utils.Tensor("OUTPUT0", np.array([total], dtype=np.int32))\n'
    '            responses.append(pb_utils.InferenceResponse([out]))\n',
    imports='import numpy as np  # noqa: E402\n',
).replace('class TritonPythonModel:\n', 'class TritonPythonModel:\n    sums = dict()\n\n')

# Models the rig can serve, name -> (config.pbtxt, model.py template with {sites}, or None for an ensemble): 'echo'
# and 'mirror' are the same echo code under each name, so that a server runs several python models, each with its
# own stub and backend pool (issue 27: pools are named for their model); 'grow' grows its pool on demand; 'slow'
# echoes in SLOW_SECONDS; 'ens', 'bls' and 'seq' above.
MODELS = {
    'echo': (ECHO_CONFIG, ECHO_MODEL),
    'mirror': (model_config('mirror'), ECHO_MODEL),
    'grow': (GROW_CONFIG, GROW_MODEL),
    'slow': (model_config('slow'), SLOW_MODEL),
    'ens': (ENSEMBLE_CONFIG, None),
    'bls': (model_config('bls'), BLS_MODEL),
    'seq': (SEQ_CONFIG, SEQ_MODEL),
}
PYTHON_MODELS = tuple(m for m, (_config, source) in MODELS.items() if source is not None)


# the start of a skip reason that says the server under test has no such feature (tests/integration/conftest.py
# counts every other skip as a failure when run as root)
NOT_ON_THIS_VERSION = 'not on this Triton version: '


class RigError(RuntimeError):
    """The rig could not do what was asked; the message says why."""


# The site-packages of another nvidia-pytriton (it bundles another tritonserver) for a version
# matrix, e.g. /work/venv-pytriton-old/lib/python3.12/site-packages (see tests/integration/containers/README.md).
SITE_ENV = 'TRITONRIG_PYTRITON_SITE'


def _site_packages() -> str:
    if os.environ.get(SITE_ENV):
        site = os.environ[SITE_ENV]
        if not os.path.isdir(os.path.join(site, 'pytriton')):
            raise ImportError('%s=%s has no pytriton package' % (SITE_ENV, site))
        return site
    # found, not imported: the server is all the rig uses of the wheel, and the demo's venv installs the wheel
    # without the Python API's dependencies (tests/requirements-demo.txt)
    spec = importlib.util.find_spec('pytriton')
    if spec is None or not spec.origin:
        raise ImportError('no module named pytriton')
    return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))


def _numpy_site() -> list[str]:
    """The directory this interpreter imports numpy from (none when it has none)."""
    try:
        import numpy  # pylint: disable=import-outside-toplevel
    except ImportError:
        return []
    return [os.path.dirname(os.path.dirname(os.path.abspath(numpy.__file__)))]


def triton_paths() -> dict[str, Any]:
    """Locate tritonserver, its backends and libraries inside the wheel."""
    try:
        site = _site_packages()
    except ImportError as exc:
        raise RigError('nvidia-pytriton is not installed in %s (run `make venv`): %s' % (sys.executable, exc))
    root = os.path.join(site, 'pytriton', 'tritonserver')
    paths = {
        'site': site,
        # the stub's sys.path: the wheel's site-packages, then this interpreter's, then wherever this interpreter finds
        # numpy (a venv with the system site-packages: the GPU bundle's on a machine whose Python has numpy)
        'model_path': list(dict.fromkeys([site, sysconfig.get_paths()['purelib'], *_numpy_site()])),
        'root': root,
        'binary': os.path.join(root, 'bin', 'tritonserver'),
        'backends': os.path.join(root, 'backends'),
        'libs': os.path.join(site, 'nvidia_pytriton.libs'),
        'stub_src': os.path.join(
            root, 'python_backend_stubs', '%d.%d' % sys.version_info[:2], 'triton_python_backend_stub'
        ),
        'stub': os.path.join(root, 'backends', 'python', 'triton_python_backend_stub'),
    }
    if not os.path.exists(paths['binary']):
        raise RigError('tritonserver binary not found at %s' % paths['binary'])
    return paths


def ensure_python_stub(paths: dict[str, Any]) -> None:
    """Copy the python backend stub for this interpreter into backends/python (once, atomically)."""
    if os.path.exists(paths['stub']):
        return
    if not os.path.exists(paths['stub_src']):
        raise RigError(
            'no python backend stub for Python %d.%d in the wheel (%s)' % (sys.version_info[:2] + (paths['stub_src'],))
        )
    tmp = paths['stub'] + '.%d.tmp' % os.getpid()
    shutil.copy2(paths['stub_src'], tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, paths['stub'])


def _nothing() -> None:
    pass


def reachable(targets: Iterable[str], workdir: str) -> tuple[list[str], Callable[[], None]]:
    """A command prefix, run as root, under which any user can reach every path of targets; and its cleanup.

    The test venv, its base Python and the checkout may live below directories others cannot enter (/root, mode 0700;
    a clone made in `mktemp -d`, mode 0700). In a private mount namespace each such directory is replaced by a
    world-searchable one (made in workdir) that holds bind mounts of only the entries on the way to a target, so that
    a command that drops root (setpriv, a server run as nobody) reaches them; nothing else of the directory shows.
    ([], a no-op) when every target is reachable already.
    """
    blocked: dict[str, set[str]] = {}  # parent directory others cannot enter -> its entries on the way to a target
    for target in targets:
        target = os.path.realpath(target)
        path = os.path.dirname(target)
        while path != '/':
            if not os.stat(path).st_mode & stat.S_IXOTH:
                blocked.setdefault(path, set()).add(target[len(path) + 1 :].split('/')[0])
            path = os.path.dirname(path)
    if not blocked:
        return [], _nothing
    views = []
    steps = []
    # deepest first: a view is mounted over its parent before the parent's own parent is hidden
    for parent in sorted(blocked, key=len, reverse=True):
        view = tempfile.mkdtemp(prefix='rootview-', dir=workdir)
        os.chmod(view, 0o755)
        for child in sorted(blocked[parent]):
            os.mkdir(os.path.join(view, child))
            steps.append('mount --rbind %s %s' % (os.path.join(parent, child), os.path.join(view, child)))
        steps.append('mount --rbind %s %s' % (view, parent))
        views.append((view, blocked[parent]))
    shell = ' && '.join(steps) + ' && exec "$0" "$@"'

    def cleanup() -> None:
        # what the command wrote into a hidden parent landed in its view: remove that; only ever rmdir the mount
        # points (were a mount somehow still there, it would not be empty)
        for view, children in views:
            if not os.path.isdir(view):
                continue
            for name in os.listdir(view):
                if name not in children:
                    subprocess.run(['rm', '-rf', '--one-file-system', os.path.join(view, name)], check=False)
            for child in children:
                try:
                    os.rmdir(os.path.join(view, child))
                except OSError:
                    pass
            try:
                os.rmdir(view)
            except OSError:
                pass

    return ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', shell], cleanup


def server_env(paths: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    libdirs = [paths['libs'], sysconfig.get_config_var('LIBDIR') or '']
    if env.get('LD_LIBRARY_PATH'):
        libdirs.append(env['LD_LIBRARY_PATH'])
    env['LD_LIBRARY_PATH'] = ':'.join(d for d in libdirs if d)
    env['PYTHONPATH'] = paths['site']
    return env


# Ports free_port handed out, machine-wide: "PORT TIME" lines, under flock. A port is free when asked for but its
# server binds it later (tritonserver after loading its models): meanwhile the kernel may offer it again, to the other
# pytest-xdist worker or another test session. A port handed out in the last PORT_HOLD seconds is not handed out again.
PORT_REGISTRY = os.path.join(tempfile.gettempdir(), 'tritonrig-ports')
PORT_HOLD = 900.0


def _unused_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_port(host: str = '127.0.0.1') -> int:
    """A TCP port free on host now, and not handed out by free_port (in any process here) in the last PORT_HOLD s."""
    try:
        registry = open(PORT_REGISTRY, 'a+', encoding='ascii')  # pylint: disable=consider-using-with
    except OSError:
        return _unused_port(host)
    with registry:
        fcntl.flock(registry, fcntl.LOCK_EX)
        registry.seek(0)
        now = time.time()
        recent = {}
        for line in registry:
            fields = line.split()
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and now - int(fields[1]) < PORT_HOLD:
                recent[int(fields[0])] = fields[1]
        port = _unused_port(host)
        for _attempt in range(100):
            if port not in recent:
                break
            port = _unused_port(host)
        recent[port] = f'{now:.0f}'
        registry.seek(0)
        registry.truncate()
        registry.write(''.join(f'{p} {t}\n' for p, t in recent.items()))
    return port


def http_json(url: str, method: str = 'GET', body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header('Content-Type', 'application/json')
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else None)


def newest_time(path: str) -> float:
    """The newest of path's atime, mtime and ctime (lstat): where the modules count a file's age from."""
    st = os.lstat(path)
    return max(st.st_atime, st.st_mtime, st.st_ctime)


def wait_older(paths: Iterable[str], seconds: float, timeout: float = 30.0) -> None:
    """Wait until every path's newest time (newest_time) is more than seconds old, polling the real stat.

    The modules age a file from the newest of its three times, and utime() cannot set ctime back, so a test that
    needs an "old" file makes it, waits here, and passes a min_age of seconds. A young control file is created
    after the wait. RigError after timeout seconds.
    """
    paths = list(paths)
    deadline = time.monotonic() + timeout
    while True:
        newest = max((newest_time(p) for p in paths), default=0.0)
        left = newest + seconds - time.time()
        if left < 0:
            return
        if time.monotonic() + left > deadline:
            raise RigError(f'{paths} not {seconds}s old within {timeout}s (the newest time moved)')
        time.sleep(min(left + 0.01, 0.5))


def keep_young(path: str, seconds: float = 3600.0) -> str:
    """Date path's atime and mtime seconds ahead: its age (from its newest time) stays 0 until then, so a young
    control file stays younger than any min_age through every run of a long test. Returns path."""
    ahead = time.time() + seconds
    os.utime(path, (ahead, ahead))
    return path


def crash(server: TritonServer) -> None:
    """SIGKILL a server and its python backend stubs together, as a container's end does: the server leads its own
    process group (start() makes it a session leader), and one killpg() reaches it and every stub before any stub
    can notice its parent gone and unlink its pool. The pool files stay, unheld (docs/concepts.md)."""
    os.killpg(server.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)


def _kill(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """Stop a Popen we started: SIGTERM, then SIGKILL after grace seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


class Client:
    """A real tritonclient process inside a server's mount namespace."""

    def __init__(
        self,
        server: TritonServer,
        name: str,
        key: str,
        byte_size: int,
        register: bool = True,
        mode: str = 'hold',
        offset: int = 0,
        count: int = 0,
        pause: float = 0.0,
        register_when_gone: str | None = None,
        model: str = 'echo',
    ) -> None:
        self.server = server
        self.name = name
        self.key = key
        self.byte_size = byte_size
        self.offset = offset
        cmd = [
            'nsenter',
            '--mount',
            '--target',
            str(server.pid),
            sys.executable,
            CLIENT_SCRIPT,
            '--url',
            server.url,
            '--name',
            name,
            '--key',
            key,
            '--byte-size',
            str(byte_size),
            '--offset',
            str(offset),
            '--mode',
            mode,
        ]
        if not register:
            cmd.append('--no-register')
        if count:
            cmd += ['--count', str(count)]
        if pause:
            cmd += ['--pause', str(pause)]
        if register_when_gone:
            cmd += ['--register-when-gone', register_when_gone]
        if model != 'echo':
            cmd += ['--model', model]
        # own session: the client and the resource tracker multiprocessing starts for its
        # SharedMemory form one process group, like a client container's processes
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.lines: list[str] = []
        line = self._readline(timeout=30 + count * 0.05)
        if not line.startswith('READY'):
            err = ''
            if self.proc.poll() is not None:
                err = self.proc.stderr.read()
            self.stop()
            raise RigError('client %s did not become ready: %r %s' % (name, line, err.strip()[-2000:]))
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _readline(self, timeout: float) -> str:
        result: list[str] = []

        def read() -> None:
            result.append(self.proc.stdout.readline())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        return result[0].strip() if result else ''

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, keep_file: bool = True) -> None:
        """SIGKILL the client: it vanishes without unregistering (a leak).

        keep_file=True kills its whole process group at once (as the OOM killer or a
        container runtime does), so nothing unlinks the file: the region is stale.
        keep_file=False kills only the client; tritonclient's SharedMemory resource
        tracker then unlinks the file while Triton keeps it registered and mapped:
        the region is dangling and its memory stays allocated.
        """
        if self.alive:
            if keep_file:
                os.killpg(self.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        self.proc.wait(timeout=10)
        if not keep_file:
            deadline = time.monotonic() + 10
            while os.path.exists(self.server.shm_path(self.key)) and time.monotonic() < deadline:
                time.sleep(0.05)

    def stop(self) -> None:
        _kill(self.proc, grace=5)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


LEADER_EXIT_SOURCE = os.path.join(HERE, 'leader_exit.c')


def build_leader_exit(workdir: str) -> str:
    """Compile tests/rig/leader_exit.c with cc into workdir; the program's path."""
    out = os.path.join(workdir, 'leader_exit')
    if not os.path.exists(out):
        subprocess.run(['cc', '-O2', '-pthread', '-o', out, LEADER_EXIT_SOURCE], check=True, capture_output=True)
    return out


class LeaderExitClient:
    """A real client whose main thread has exited while a worker thread maps and writes its file (leader_exit.c).

    prefix runs it elsewhere (``nsenter --mount --target PID`` for a server's /dev/shm, ``podman exec`` ...); the
    program prints its pid as it sees it, and self.pid is the host's (the Popen's, when no prefix changes it).
    """

    def __init__(self, program: str, path: str, size: int, fd: str = 'close', prefix: Sequence[str] = ()) -> None:
        self.proc = subprocess.Popen(
            [*prefix, program, path, str(size), fd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        if not line or not line[0].startswith('READY'):
            self.stop()
            raise RigError('leader_exit did not become ready: %r %s' % (line, self.proc.stderr.read()[-2000:]))
        self.pid = self._program_pid(int(line[0].split()[1]))
        deadline = time.monotonic() + 10
        while not self.leader_gone():
            if time.monotonic() > deadline:
                self.stop()
                raise RigError('leader_exit %d: its main thread did not exit within 10 s' % self.pid)
            time.sleep(0.01)

    def _program_pid(self, own: int) -> int:
        """The host's pid of the program: the Popen's, or (a prefix that forks, as unshare --fork does) the one
        descendant in another PID namespace that calls itself own."""
        pid = self.proc.pid
        for _depth in range(4):
            if own == pid or not os.path.exists('/proc/%d/task/%d/children' % (pid, pid)):
                return pid
            with open('/proc/%d/task/%d/children' % (pid, pid)) as f:
                children = f.read().split()
            if len(children) != 1:
                return pid
            pid = int(children[0])
        return pid

    def leader_gone(self) -> bool:
        """The kernel shows the main thread exited: /proc/PID/maps empty while another task runs."""
        try:
            with open('/proc/%d/maps' % self.pid, 'rb') as f:
                empty = not f.read()
            return empty and len(os.listdir('/proc/%d/task' % self.pid)) > 1
        except OSError:
            return False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=10)


class ShmNamespace:
    """A mount namespace with a private tmpfs /dev/shm that outlives the servers run in it.

    Held open by a ``sleep`` process; ``TritonServer(namespace=ns)`` runs tritonserver
    inside it, so a server can be SIGKILLed and another started on the same /dev/shm
    (the files stay, as on a host whose Triton container restarts with ``--ipc=host``).
    """

    def __init__(self, shm_size: str = '64m') -> None:
        self.shm_size = shm_size
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def shm_dir(self) -> str:
        return '/proc/%d/root/dev/shm' % self.pid

    def start(self, timeout: float = 10.0) -> ShmNamespace:
        if os.geteuid() != 0:
            raise RigError('the rig needs root (mount namespaces and tmpfs mounts)')
        shell = (
            'mount -t tmpfs -o size=%s,mode=1777 tmpfs /dev/shm && touch /dev/shm/.rig-ns-ready && exec sleep infinity'
            % self.shm_size
        )
        self.proc = subprocess.Popen(
            ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', shell],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        marker = os.path.join(self.shm_dir, '.rig-ns-ready')
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RigError('namespace holder exited with %s: %s' % (self.proc.returncode, self.proc.stderr.read()))
            if os.path.exists(marker):
                os.unlink(marker)
                return self
            time.sleep(0.05)
        self.stop()
        raise RigError('namespace holder did not mount its /dev/shm within %ss' % timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> ShmNamespace:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TritonServer:
    """One real tritonserver with a private /dev/shm.

    grpc=True also serves gRPC on ``grpc_url`` (host:port) for clients that register
    regions the HTTP API cannot address. http=False turns HTTP off (``--allow-http=false``,
    implies grpc): ``url`` is then the ``grpc://`` URL, readiness is asked over gRPC and the
    rig's clients speak gRPC. grpc_tls=dict(cert=, key=, ca=[, root=, client_cert=, client_key=])
    serves gRPC over TLS (``--grpc-use-ssl``; ca: what the rig's own gRPC calls trust; root: also
    require client certificates from that CA, the rig presenting client_cert/client_key).
    namespace=ShmNamespace runs the server in that namespace's /dev/shm instead of a new one
    of its own. backend_config: extra ``--backend-config`` values, e.g.
    ``('python,shm-region-prefix-name=my_prefix_',)``. extra_args: more tritonserver options, e.g.
    ``('--reuse-http-port', 'true')``. run_as=USER: the server runs as that user in a user namespace of its own
    (``unshare -Urm`` as USER, with its own tmpfs /dev/shm: what rootless podman does), models=() only.
    models: 'echo' (echoes INPUT0), 'mirror' (the same under another name) and 'grow'
    (answers SIZE zero bytes: one large request grows its python backend pool). model_control:
    ``--model-control-mode`` (explicit by default: the rig loads ``models`` itself; 'none' loads the
    whole repository and refuses the repository API's load and unload).
    """

    def __init__(
        self,
        workdir: str | None = None,
        shm_size: str = '64m',
        host: str = '127.0.0.1',
        http_port: int | None = None,
        models: Iterable[str] = ('echo',),
        name: str = 'triton',
        grpc: bool = False,
        namespace: ShmNamespace | None = None,
        http: bool = True,
        grpc_tls: dict[str, str] | None = None,
        backend_config: Iterable[str] = (),
        extra_args: Iterable[str] = (),
        run_as: str | None = None,
        model_control: str = 'explicit',
    ) -> None:
        self.name = name
        self.extra_args = list(extra_args)
        self.run_as = run_as
        self.model_control = model_control
        self.backend_config = list(backend_config)
        self.host = host
        self.shm_size = shm_size
        self.models = list(models)
        self.http = http
        self.grpc_tls = grpc_tls
        self.grpc_port = free_port(host) if (grpc or not http or grpc_tls) else None
        self.namespace = namespace
        self._own_workdir = workdir is None
        self._unview: Callable[[], None] = _nothing  # reachable()'s cleanup, for a server run_as a user
        self.workdir = workdir or tempfile.mkdtemp(prefix='tritonrig-')
        os.makedirs(self.workdir, exist_ok=True)
        self.http_port = (http_port or free_port(host)) if http else None
        self.proc: subprocess.Popen | None = None
        self.clients: list[Client] = []
        self.log_path = os.path.join(self.workdir, '%s.log' % name)
        self.paths = triton_paths()

    @property
    def url(self) -> str:
        """The URL the modules use: HTTP, or the grpc:// URL when HTTP is off."""
        if not self.http:
            return self.grpc_scheme_url
        return 'http://%s:%d' % (self.host, self.http_port)

    @property
    def grpc_scheme_url(self) -> str | None:
        """grpc://HOST:PORT (grpcs:// with TLS), as the modules take it."""
        return '%s://%s' % ('grpcs' if self.grpc_tls else 'grpc', self.grpc_url) if self.grpc_port else None

    @property
    def grpc_url(self) -> str | None:
        return '%s:%s' % (self.host, self.grpc_port) if self.grpc_port else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def shm_dir(self) -> str:
        return '/proc/%d/root/dev/shm' % self.pid

    def _model_repository(self) -> str:
        repo = os.path.join(self.workdir, 'models-%s' % self.name)
        for model in self.models:
            if model not in MODELS:
                continue
            config, source = MODELS[model]
            os.makedirs(os.path.join(repo, model, '1'), exist_ok=True)
            with open(os.path.join(repo, model, 'config.pbtxt'), 'w') as f:
                f.write(config)
            if source is not None:
                with open(os.path.join(repo, model, '1', 'model.py'), 'w') as f:
                    f.write(source.format(sites=self.paths['model_path']))
        os.makedirs(repo, exist_ok=True)
        return repo

    def command(self) -> list[str]:
        args = [
            self.paths['binary'],
            '--model-repository',
            self._model_repository(),
            '--backend-directory',
            self.paths['backends'],
            '--allow-metrics',
            'false',
            '--model-control-mode',
            self.model_control,
            '--log-verbose',
            '0',
        ]
        if self.http:
            args += ['--http-address', self.host, '--http-port', str(self.http_port)]
        else:
            args += ['--allow-http', 'false']
        if self.grpc_port:
            args += ['--allow-grpc', 'true', '--grpc-address', self.host, '--grpc-port', str(self.grpc_port)]
            if self.grpc_tls:
                args += [
                    '--grpc-use-ssl',
                    'true',
                    '--grpc-server-cert',
                    self.grpc_tls['cert'],
                    '--grpc-server-key',
                    self.grpc_tls['key'],
                ]
                if self.grpc_tls.get('root'):
                    args += ['--grpc-root-cert', self.grpc_tls['root'], '--grpc-use-ssl-mutual', 'true']
        else:
            args += ['--allow-grpc', 'false']
        if self.model_control == 'explicit':  # other modes load every model of the repository themselves
            for model in self.models:
                args += ['--load-model', model]
        for value in self.backend_config:
            args += ['--backend-config', value]
        args += self.extra_args
        if self.run_as is not None:
            shell = 'mount -t tmpfs -o size=%s,mode=1777 tmpfs /dev/shm && exec "$0" "$@"' % self.shm_size
            return [
                'setpriv',
                '--reuid',
                self.run_as,
                '--regid',
                self.run_as,
                '--clear-groups',
                'unshare',
                '--user',
                '--map-root-user',
                '--mount',
                '--propagation',
                'private',
                'sh',
                '-c',
                shell,
            ] + args
        if self.namespace is not None:
            # nsenter execs the server: its pid is the server's
            return ['nsenter', '--mount', '--target', str(self.namespace.pid)] + args
        shell = 'mount -t tmpfs -o size=%s,mode=1777 tmpfs /dev/shm && exec "$0" "$@"' % self.shm_size
        return ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', shell] + args

    def start(self, timeout: float = 90.0) -> TritonServer:
        if os.geteuid() != 0:
            raise RigError('the rig needs root (mount namespaces and tmpfs mounts)')
        if self.proc is not None and self.proc.poll() is None:
            # a second start would lose the running process (never stopped): `with TritonServer(...)` starts it once
            raise RigError(f'{self.name} already runs (pid {self.proc.pid}): stop it before starting it again')
        if self.models:
            ensure_python_stub(self.paths)
        command = self.command()
        if self.run_as is not None:  # the user reaches the wheel, its libraries and the model repository
            needed = [self.paths['root'], self.paths['libs'], self.workdir, *self.paths['model_path']]
            libdir = sysconfig.get_config_var('LIBDIR')
            if self.models and libdir:
                needed.append(libdir)  # the python backend stub's libpython
            prefix, self._unview = reachable(needed, self.workdir)
            command = prefix + command
        log = open(self.log_path, 'wb')
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(self.paths),
            cwd=self.workdir,
            start_new_session=True,  # its own process group, with its stubs: crash() kills them together
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RigError(
                    'tritonserver %s exited with %s before it was ready; log %s:\n%s'
                    % (self.name, self.proc.returncode, self.log_path, self.log_tail())
                )
            if self._ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RigError(
            'tritonserver %s not ready at %s within %ss; log %s:\n%s'
            % (self.name, self.url, timeout, self.log_path, self.log_tail())
        )

    def _ready(self) -> bool:
        if self.http:
            try:
                return http_json(self.url + '/v2/health/ready', timeout=2)[0] == 200
            except (urllib.error.URLError, ConnectionError, OSError):
                return False
        from tritonclient.utils import InferenceServerException  # pylint: disable=import-outside-toplevel

        try:
            with self.grpc_client() as client:
                return client.is_server_ready(client_timeout=2)
        except InferenceServerException:
            return False

    def grpc_client(self) -> Any:
        """A tritonclient.grpc client of this server (TLS and client certificate as the server requires)."""
        import tritonclient.grpc as grpcclient  # pylint: disable=import-outside-toplevel

        tls = self.grpc_tls or {}
        return grpcclient.InferenceServerClient(
            self.grpc_url,
            ssl=bool(tls),
            root_certificates=tls.get('ca'),
            private_key=tls.get('client_key'),
            certificate_chain=tls.get('client_cert'),
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors='replace') as f:
                return ''.join(f.readlines()[-lines:])
        except OSError:
            return '(no log)'

    def client(
        self,
        name: str,
        key: str | None = None,
        byte_size: int = 1 << 20,
        register: bool = True,
        mode: str = 'hold',
        offset: int = 0,
        pause: float = 0.0,
        register_when_gone: str | None = None,
        model: str = 'echo',
    ) -> Client:
        """Start a live tritonclient process that creates (and registers) a region (pause: seconds between inferences).

        model: the python model the client's infer mode asks ('slow': each request holds the region SLOW_SECONDS).

        register_when_gone=REGION: the client creates its region unregistered, waits until REGION is not in the
        server's status, registers its region under the name REGION and SIGKILLs its own process group (a client
        that re-leaks a region while a cleanup runs).
        """
        client = Client(
            self,
            name,
            key or '/' + name,
            byte_size,
            register=register,
            mode=mode,
            offset=offset,
            pause=pause,
            register_when_gone=register_when_gone,
            model=model,
        )
        self.clients.append(client)
        return client

    def leak_many(self, prefix: str, count: int, byte_size: int = 4096) -> list[str]:
        """count stale regions PREFIX_i (keys /PREFIX_i) from one client, then SIGKILL it with its group.

        Returns the region names. Much faster than count leak() calls (one process, one connection).
        """
        client = Client(self, prefix, '/' + prefix, byte_size, count=count)
        self.clients.append(client)
        client.kill(keep_file=True)
        return ['%s_%d' % (prefix, i) for i in range(count)]

    def leak(self, name: str, key: str | None = None, byte_size: int = 1 << 20, keep_file: bool = True) -> Client:
        """Create and register a region from a client, then SIGKILL the client (see Client.kill)."""
        client = self.client(name, key=key, byte_size=byte_size)
        client.kill(keep_file=keep_file)
        return client

    def api(self, path: str, method: str = 'GET', body: Any = None) -> tuple[int, Any]:
        return http_json(self.url + path, method=method, body=body)

    def system_regions(self) -> dict[str, dict[str, Any]]:
        if not self.http:
            with self.grpc_client() as client:
                regions = client.get_system_shared_memory_status().regions.values()
            return {
                r.name: dict(name=r.name, key=r.key, offset=int(r.offset), byte_size=int(r.byte_size)) for r in regions
            }
        return {r['name']: r for r in self.api('/v2/systemsharedmemory/status')[1]}

    def shm_files(self) -> list[str]:
        return sorted(os.listdir(self.shm_dir))

    def shm_path(self, name: str) -> str:
        return os.path.join(self.shm_dir, name.lstrip('/'))

    def write_file(self, name: str, size: int, fill: bytes = b'\1') -> str:
        """A file in the server's /dev/shm written with size bytes (so it really uses shm); wait_older() ages it."""
        path = self.shm_path(name)
        with open(path, 'wb') as f:
            f.write(fill * size)
        return path

    def version(self) -> str:
        """The server's version, from GET /v2 (e.g. '2.51.0')."""
        return self.api('/v2')[1]['version']

    def shm_usage(self) -> dict[str, int]:
        st = os.statvfs(self.shm_dir)
        return {'total_bytes': st.f_blocks * st.f_frsize, 'used_bytes': (st.f_blocks - st.f_bfree) * st.f_frsize}

    def backend_files(self) -> list[str]:
        return [f for f in self.shm_files() if f.startswith('triton_python_backend_shm_region_')]

    def kill(self) -> None:
        """SIGKILL the server (a crash): nothing is unregistered; its namespace's files stay if it has one."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        for client in self.clients:
            client.stop()
        self.clients = []
        _kill(self.proc, grace=15)
        self._unview()
        self._unview = _nothing

    def cleanup(self) -> None:
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class Fleet:
    """Several servers, each on its own loopback address 127.0.1.N."""

    def __init__(
        self,
        count: int,
        workdir: str | None = None,
        shm_size: str = '64m',
        base: str = '127.0.1.',
        models: Iterable[str] = ('echo',),
        port: int | None = None,
    ) -> None:
        self.workdir = workdir or tempfile.mkdtemp(prefix='tritonfleet-')
        self.servers = [
            TritonServer(
                workdir=self.workdir,
                shm_size=shm_size,
                host='%s%d' % (base, i + 1),
                http_port=port,
                models=models,
                name='triton%d' % (i + 1),
            )
            for i in range(count)
        ]

    def start(self) -> Fleet:
        try:
            for server in self.servers:
                server.start()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='cmd', required=True)
    serve = sub.add_parser('serve', help='start one server and wait until interrupted')
    serve.add_argument('--shm-size', default='64m')
    serve.add_argument('--host', default='127.0.0.1')
    serve.add_argument('--port', type=int, default=None)
    serve.add_argument('--no-models', action='store_true')
    args = parser.parse_args(argv)
    server = TritonServer(
        shm_size=args.shm_size, host=args.host, http_port=args.port, models=() if args.no_models else ('echo',)
    )
    try:
        server.start()
        print(
            json.dumps({'url': server.url, 'pid': server.pid, 'shm_dir': server.shm_dir, 'log': server.log_path}),
            flush=True,
        )
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.cleanup()
    return 0


if __name__ == '__main__':
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
