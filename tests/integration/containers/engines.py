"""Real container engines for the integration tests: Triton and client containers on Docker and podman.

- :class:`DockerDaemon`: a private ``dockerd`` (Debian's docker.io, called as
  ``/usr/bin/docker``, never the docker CLI found first on PATH) with its own
  socket, data-root, exec-root, pidfile and bridge, started in its own mount
  namespace (``unshare --mount --propagation slave``), so the /dev/shm mounts
  Docker makes for its containers are not seen in PID 1's mount namespace
  (which root cannot read on the test VMs: the holder scan would be incomplete).
  One test session at a time holds it (a file lock), with the userland proxy on
  (default) or off (``--userland-proxy=false``: iptables DNAT only).
- :class:`Podman`: rootful podman, every command run inside one private mount
  namespace held by a ``sleep`` process, for the same reason (podman mounts a
  container's /dev/shm in the namespace ``podman run`` runs in).
- :func:`run_triton` / :func:`run_client`: a Triton container (published on
  127.0.0.1 or not), client containers sharing its IPC and network namespaces
  that register a system shm region and hold it or run inferences, killed with
  ``docker kill`` / ``podman kill`` as the OOM killer would.
- :class:`Pod` / :func:`create_pod`: a podman pod sharing IPC and network
  (``podman pod create --share ipc,net --shm-size``), the model of a
  Kubernetes pod whose /dev/shm is a memory-backed emptyDir: ``run_triton`` and
  ``run_client`` with ``pod=`` put their containers in it.
- :class:`Forwarder`: a ``socat`` TCP forwarder on 127.0.0.1 (one child per
  connection), stopped by pid.

Images come from build_image.py (no registry): the ``rig`` image (tritonserver,
the python backend, the ``echo`` model, Python with tritonclient and numpy, the
rig's client) and the plain ``tritonserver`` image, imported into each engine
and cached by content hash. Everything waits with a bound, and every failure
message carries the container's log tail.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import build_image
import tritonrig

STATE_DIR = '/run/tritonops-test/docker'
DATA_ROOT = '/var/lib/tritonops-test-docker'
LOCK_FILE = '/run/tritonops-test/docker.lock'
# the private daemon's own bridge and subnet: not docker0 (a foreign dockerd's), not podman's 10.88.0.0/16
BRIDGE = 'tritonops-dk0'
BRIDGE_ADDRESS = '172.31.213.1'
BRIDGE_CIDR = BRIDGE_ADDRESS + '/24'
SUBNET_PREFIX = '172.31.213.'
LABEL = 'tritonops.test.harness'
TRITON_HTTP_PORT = 8000
LOCK_TIMEOUT = float(os.environ.get('TRITONOPS_DOCKER_LOCK_TIMEOUT', '900'))


class EngineError(RuntimeError):
    """An engine or container did not do what was asked; the message says why (with logs)."""


class EngineUnavailable(EngineError):
    """The engine is not installed here (tests skip with this message)."""


def _tail(text, lines=40):
    return '\n'.join((text or '').rstrip().splitlines()[-lines:])


ERROR_LINE = re.compile(r'^(E[0-9]{4} |[^ \t-].*(?i:error|unrecognized|invalid|failed|fatal|denied|traceback))')


def log_excerpt(text, lines=40):
    """A log's error lines (glog E lines, unindented lines with an error word: not --help text), then its tail."""
    errors = [line for line in (text or '').splitlines() if ERROR_LINE.search(line)]
    head = 'errors in the log:\n%s\n' % '\n'.join(errors[-10:]) if errors else ''
    return head + 'last %d lines:\n%s' % (lines, _tail(text, lines))


def _run(cmd, timeout=120, check=True, input_text=None):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, input=input_text)
    except subprocess.TimeoutExpired as exc:
        raise EngineError('%s timed out after %ss: %s' % (shlex.join(cmd), timeout, _tail(str(exc.stderr or ''))))
    if check and proc.returncode != 0:
        raise EngineError(
            '%s failed (%s): %s' % (shlex.join(cmd), proc.returncode, _tail(proc.stderr + proc.stdout, 20))
        )
    return proc


def docker_binaries():
    """(docker CLI, dockerd) from Debian's docker.io package; EngineUnavailable when it is not installed.

    A docker CLI elsewhere on PATH (e.g. /usr/local/bin/docker 28) is ignored: its
    API version is newer than what dockerd 20.10 speaks.
    """
    proc = subprocess.run(['dpkg', '-L', 'docker.io'], capture_output=True, text=True, check=False)
    paths = set(proc.stdout.split()) if proc.returncode == 0 else set()
    docker = next((p for p in ('/usr/bin/docker', '/usr/sbin/docker') if p in paths), None)
    dockerd = next((p for p in ('/usr/sbin/dockerd', '/usr/bin/dockerd') if p in paths), None)
    if not docker or not dockerd or not os.access(dockerd, os.X_OK):
        raise EngineUnavailable("Debian's docker.io package is not installed (.ci/deps installs it)")
    return docker, dockerd


def _wait(predicate, timeout, interval=0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().split(b'\0')
    except OSError:
        return []


class Engine:
    """What both engines share: the command line, images, containers created and their removal."""

    name = None

    def __init__(self):
        self.created = []
        self._images = {}
        self._serial = 0

    @property
    def cli(self):
        raise NotImplementedError

    def run(self, *args, timeout=120, check=True):
        return _run(self.cli + [str(a) for a in args], timeout=timeout, check=check)

    def inspect(self, ref):
        """`inspect` of a container as a dict, None when it does not exist."""
        proc = self.run('container', 'inspect', ref, check=False, timeout=60)
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout)[0]

    def logs(self, ref):
        proc = self.run('logs', ref, check=False, timeout=60)
        return proc.stdout + proc.stderr

    def log_tail(self, ref, lines=40):
        """The container's error lines and last lines (log_excerpt)."""
        return log_excerpt(self.logs(ref), lines)

    def image(self, kind='rig'):
        """The reference of a test image in this engine, imported when missing (cached by content hash)."""
        if kind not in self._images:
            image = build_image.Image(kind)
            build_image.ensure(image, [(self.name, self.cli)])
            self._images[kind] = image
        return self._images[kind]

    def unique_name(self, label):
        self._serial += 1
        return 'tritonops-t%d-%d-%s' % (os.getpid(), self._serial, label)

    def create(self, name, args, timeout=120):
        """`run -d --name NAME` with the harness label; the id is recorded for removal.

        When the container is created but does not start (a port taken meanwhile), it is removed.
        """
        try:
            proc = self.run(
                'run', '-d', '--name', name, '--label', '%s=%d' % (LABEL, os.getpid()), *args, timeout=timeout
            )
        except EngineError:
            self.run('rm', '--force', name, check=False, timeout=60)
            raise
        cid = proc.stdout.strip().splitlines()[-1]
        self.created.append(cid)
        return cid

    def mark(self):
        return len(self.created)

    def remove(self, ids):
        for cid in ids:
            self.run('rm', '--force', cid, check=False, timeout=60)
            if cid in self.created:
                self.created.remove(cid)

    def remove_since(self, mark):
        self.remove(list(reversed(self.created[mark:])))

    def bridge_gateway(self):
        raise NotImplementedError


class Podman(Engine):
    """Rootful podman, all commands inside one private mount namespace (held by a `sleep`)."""

    name = 'podman'

    def __init__(self, podman=None):
        super().__init__()
        self.podman = podman or shutil.which('podman')
        self.holder = None
        self.pods = []

    @property
    def cli(self):
        if self.holder is None:
            raise EngineError('Podman engine not started')
        return ['nsenter', '--mount', '--target', str(self.holder.pid), self.podman]

    def start(self):
        if not self.podman:
            raise EngineUnavailable('podman is not installed (.ci/deps installs it)')
        if self.holder is None:
            # the test machine's containers.conf (default ulimits this VM can set, runc), before the first container:
            # whichever podman test runs first (test_triton_server_role's setup.sh writes it too)
            conf = subprocess.run(
                [os.path.join(os.path.dirname(os.path.abspath(__file__)), 'podman-conf.sh')],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if conf.returncode:
                raise EngineError('podman-conf.sh failed (%d): %s' % (conf.returncode, conf.stderr))
            self.holder = subprocess.Popen(
                ['unshare', '--mount', '--propagation', 'slave', 'sleep', 'infinity'],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            # the namespace exists once unshare has exec'ed sleep
            if (
                not _wait(
                    lambda: _cmdline(self.holder.pid)[:1] == [b'sleep'] or self.holder.poll() is not None, 10, 0.02
                )
                or self.holder.poll() is not None
            ):
                err = self.holder.stderr.read().decode() if self.holder.poll() is not None else ''
                self.holder = None
                raise EngineError('could not start the mount namespace holder for podman: %s' % err)
        return self

    def remove_pods(self, ids):
        """`pod rm --force` (the pod's containers go with it)."""
        for pod_id in ids:
            self.run('pod', 'rm', '--force', pod_id, check=False, timeout=120)
            if pod_id in self.pods:
                self.pods.remove(pod_id)

    def stop(self):
        try:
            if self.holder is not None:
                self.remove(list(reversed(self.created)))
                self.remove_pods(list(reversed(self.pods)))
        finally:
            if self.holder is not None:
                self.holder.kill()
                self.holder.wait(timeout=10)
                self.holder = None

    def bridge_gateway(self):
        proc = self.run('network', 'inspect', 'podman', timeout=60)
        return json.loads(proc.stdout)[0]['subnets'][0]['gateway']


class DockerDaemon(Engine):
    """A private dockerd in its own mount namespace, one test session at a time."""

    name = 'docker'

    def __init__(self, state_dir=STATE_DIR, data_root=DATA_ROOT, bridge=BRIDGE, bridge_cidr=BRIDGE_CIDR):
        super().__init__()
        self.docker, self.dockerd = docker_binaries()
        self.state_dir = state_dir
        self.data_root = data_root
        self.bridge = bridge
        self.bridge_cidr = bridge_cidr
        self.socket = os.path.join(state_dir, 'docker.sock')
        self.pidfile = os.path.join(state_dir, 'docker.pid')
        self.exec_root = os.path.join(state_dir, 'exec')
        self.logfile = os.path.join(state_dir, 'dockerd.log')
        self.proc = None
        self.userland_proxy = None
        self._lock = None
        self._made_bridge = False

    @property
    def host(self):
        """The daemon for DOCKER_HOST / docker_host: unix:///run/tritonops-test/docker/docker.sock."""
        return 'unix://' + self.socket

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def cli(self):
        return [self.docker, '-H', self.host]

    def _acquire(self, timeout):
        os.makedirs(os.path.dirname(LOCK_FILE), exist_ok=True)
        self._lock = open(LOCK_FILE, 'a+')  # pylint: disable=consider-using-with
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() > deadline:
                self._lock.close()
                self._lock = None
                raise EngineError(
                    'another test session holds the private dockerd (%s) for more than %ss' % (LOCK_FILE, timeout)
                )
            time.sleep(1)

    def _release(self):
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def _stop_stale(self):
        """A dockerd left by a session that died (we hold the lock: it is nobody's now), stopped by its pid."""
        try:
            with open(self.pidfile) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return
        if pid and _pid_alive(pid) and any(arg.endswith(self.socket.encode()) for arg in _cmdline(pid)):
            os.kill(pid, signal.SIGTERM)
            if not _wait(lambda: not _pid_alive(pid), 30):
                os.kill(pid, signal.SIGKILL)
                _wait(lambda: not _pid_alive(pid), 10)
        if not _pid_alive(pid):
            for path in (self.pidfile, self.socket):
                if os.path.exists(path):
                    os.unlink(path)

    def _refuse_foreign_dockerd(self):
        """Another dockerd in this network namespace would lose its DNAT rules: dockerd recreates the DOCKER chains at start."""
        for entry in os.listdir('/proc'):
            if entry.isdigit():
                try:
                    with open('/proc/%s/comm' % entry) as f:
                        comm = f.read().strip()
                except OSError:
                    continue
                if comm == 'dockerd':
                    raise EngineUnavailable(
                        'a dockerd (pid %s) already runs on this host; the private test dockerd would '
                        'recreate its iptables chains: run the Docker tests where no other dockerd runs' % entry
                    )

    def _ensure_bridge(self):
        shown = _run(['ip', '-o', '-4', 'addr', 'show', 'dev', self.bridge], check=False)
        if shown.returncode != 0:
            _run(['ip', 'link', 'add', 'name', self.bridge, 'type', 'bridge'])
            self._made_bridge = True
            shown = _run(['ip', '-o', '-4', 'addr', 'show', 'dev', self.bridge])
        if self.bridge_cidr not in shown.stdout.split():
            if shown.stdout.strip():
                raise EngineError('bridge %s exists with another address: %s' % (self.bridge, shown.stdout.strip()))
            _run(['ip', 'addr', 'add', self.bridge_cidr, 'dev', self.bridge])
        _run(['ip', 'link', 'set', self.bridge, 'up'])

    def _remove_firewall_rules(self):
        """Delete the iptables rules dockerd left for this bridge/subnet (its empty chains stay, as after any dockerd)."""
        subnet = self.bridge_cidr.rsplit('.', 1)[0] + '.'
        for table in ('nat', 'filter'):
            proc = _run(['iptables', '-t', table, '-S'], check=False)
            for line in reversed(proc.stdout.splitlines()):
                if line.startswith('-A ') and (self.bridge in line or subnet in line):
                    _run(['iptables', '-t', table, '-D'] + shlex.split(line)[1:], check=False)

    def start(self, userland_proxy=True, timeout=90.0, lock_timeout=LOCK_TIMEOUT):
        if self.proc is not None:
            return self
        if self._lock is None:
            self._acquire(lock_timeout)
        try:
            os.makedirs(self.exec_root, exist_ok=True)
            os.makedirs(self.data_root, exist_ok=True)
            self._stop_stale()
            self._refuse_foreign_dockerd()
            self._ensure_bridge()
            cmd = [
                'unshare',
                '--mount',
                '--propagation',
                'slave',
                self.dockerd,
                '--host',
                self.host,
                '--data-root',
                self.data_root,
                '--exec-root',
                self.exec_root,
                '--pidfile',
                self.pidfile,
                '--bridge',
                self.bridge,
                # ip_forward stays as it is: dockerd would set it and FORWARD policy DROP for the whole host
                '--ip-forward=false',
                '--userland-proxy=%s' % ('true' if userland_proxy else 'false'),
            ]
            with open(self.logfile, 'ab') as log:
                # unshare execs dockerd: this pid is dockerd's
                self.proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            self.userland_proxy = userland_proxy
            ok = _wait(
                lambda: (
                    self.proc.poll() is not None
                    or (os.path.exists(self.socket) and self.run('version', check=False, timeout=20).returncode == 0)
                ),
                timeout,
                0.5,
            )
            if not ok or self.proc.poll() is not None:
                log = self.log_tail()
                self._terminate()
                raise EngineError('dockerd did not start within %ss (%s):\n%s' % (timeout, shlex.join(cmd), log))
            # containers left by a session that died are ours (private data-root): remove them
            left = self.run('ps', '-aq', '--filter', 'label=' + LABEL, check=False).stdout.split()
            if left:
                self.run('rm', '--force', *left, check=False)
        except BaseException:
            if self.proc is None:
                self._release()
            raise
        return self

    def log_tail(self, ref=None, lines=40):
        """The daemon's log tail (no ref), or a container's."""
        if ref is not None:
            return super().log_tail(ref, lines)
        try:
            with open(self.logfile, errors='replace') as f:
                return _tail(f.read()[-200000:], lines)
        except OSError:
            return ''

    def _terminate(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, userland_proxy=True, timeout=90.0):
        """Stop the daemon (its containers stop with it) and start it again with the userland proxy on or off."""
        self._terminate()
        return self.start(userland_proxy=userland_proxy, timeout=timeout)

    def set_userland_proxy(self, enabled):
        """Restart only when the mode differs."""
        if self.proc is None or self.userland_proxy != bool(enabled):
            self.restart(userland_proxy=bool(enabled))
        return self

    def stop(self):
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.remove(list(reversed(self.created)))
        finally:
            try:
                self._terminate()
                self._remove_firewall_rules()
                if self._made_bridge:
                    _run(['ip', 'link', 'delete', self.bridge], check=False)
            finally:
                self._release()

    def bridge_gateway(self):
        return self.bridge_cidr.split('/')[0]


class Pod:
    """A podman pod whose containers share IPC and network, as a Kubernetes pod's do.

    Its infra container holds the namespaces: the pod's /dev/shm (``--shm-size``, what
    a memory-backed emptyDir is in Kubernetes) and its IP on the podman bridge.
    """

    def __init__(self, engine: Podman, pod_id: str, name: str, shm_size: str) -> None:
        self.engine = engine
        self.id = pod_id
        self.name = name
        self.shm_size = shm_size
        info = json.loads(engine.run('pod', 'inspect', pod_id, timeout=60).stdout)
        info = info[0] if isinstance(info, list) else info
        self.infra_id = info['InfraContainerID']
        self.shared = sorted(info.get('SharedNamespaces') or [])
        self.ip = None

    def start(self, timeout: float = 60.0) -> Pod:
        """Start the infra container (the pod's namespaces exist from then on) and read the pod's IP."""
        self.engine.run('pod', 'start', self.id, timeout=timeout)
        state = self.engine.inspect(self.infra_id) or {}
        settings = state.get('NetworkSettings', {})
        self.ip = settings.get('IPAddress') or next(
            (n.get('IPAddress') for n in (settings.get('Networks') or {}).values() if n.get('IPAddress')), None
        )
        if not self.ip:
            raise EngineError(f'pod {self.name} has no IP address: {settings}')
        return self

    def remove(self) -> None:
        self.engine.remove_pods([self.id])

    def __repr__(self) -> str:
        return f'Pod({self.name} ip={self.ip} shm={self.shm_size} shared={",".join(self.shared)})'


def create_pod(engine: Podman, shm_size: str = '64m', name: str | None = None, share: str = 'ipc,net') -> Pod:
    """`podman pod create --share ipc,net --shm-size SIZE`, started; removed by the caller (or at the engine's stop).

    share='pid,ipc,net' also shares the PID namespace (Kubernetes' shareProcessNamespace: true).
    """
    if engine.name != 'podman':
        raise EngineUnavailable(f'pods need podman, not {engine.name}')
    name = name or engine.unique_name('pod')
    proc = engine.run(
        'pod',
        'create',
        '--name',
        name,
        '--share',
        share,
        '--shm-size',
        shm_size,
        '--label',
        f'{LABEL}={os.getpid()}',
        timeout=120,
    )
    pod_id = proc.stdout.strip().splitlines()[-1]
    engine.pods.append(pod_id)
    try:
        return Pod(engine, pod_id, name, shm_size).start()
    except EngineError:
        engine.remove_pods([pod_id])
        raise


def http_status(url, path='/v2/health/ready', timeout=5.0):
    """The HTTP status of GET url+path, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url + path, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


class Container:
    """A container this harness started: its engine, id and name, state and log."""

    def __init__(self, engine, cid, name):
        self.engine = engine
        self.id = cid
        self.name = name

    def inspect(self):
        return self.engine.inspect(self.id)

    @property
    def alive(self):
        state = self.inspect()
        return bool(state and state['State'].get('Running'))

    def log_tail(self, lines=40):
        return self.engine.log_tail(self.id, lines)

    def remove(self):
        self.engine.remove([self.id])


class TritonContainer(Container):
    """A Triton container: where it answers, its host pid and its /dev/shm seen from the host."""

    def __init__(
        self,
        engine: Engine,
        cid: str,
        name: str,
        image: str,
        shm_size: str,
        network: str | None,
        host_port: int | None,
        http_port: int,
        pod: Pod | None = None,
    ) -> None:
        super().__init__(engine, cid, name)
        self.image = image
        self.shm_size = shm_size
        self.network = network
        self.host_port = host_port
        self.http_port = http_port
        self.pod = pod
        state = engine.inspect(cid) or {}
        self.pid = state.get('State', {}).get('Pid') or None
        self.ip = pod.ip if pod is not None else None
        if network != 'host' and pod is None:
            settings = state.get('NetworkSettings', {})
            self.ip = settings.get('IPAddress') or next(
                (n.get('IPAddress') for n in (settings.get('Networks') or {}).values() if n.get('IPAddress')), None
            )

    @property
    def published_url(self):
        """http://127.0.0.1:HOSTPORT when the HTTP port is published (Docker with or without the userland proxy)."""
        return 'http://127.0.0.1:%d' % self.host_port if self.host_port else None

    @property
    def container_url(self):
        """http://CONTAINER_IP:8000 on a bridge network; with host networking, the loopback URL it listens on."""
        if self.network == 'host':
            return 'http://127.0.0.1:%d' % self.http_port
        return 'http://%s:%d' % (self.ip, self.http_port) if self.ip else None

    @property
    def url(self):
        """The URL a user would give: the published one when published, else the container's own."""
        return self.published_url or self.container_url

    @property
    def shm_dir(self):
        return '/proc/%d/root/dev/shm' % self.pid

    def shm_path(self, key):
        return os.path.join(self.shm_dir, key.lstrip('/'))

    def shm_files(self):
        return sorted(os.listdir(self.shm_dir))

    def api(self, path, method='GET', body=None, url=None):
        return tritonrig.http_json((url or self.url) + path, method=method, body=body)

    def system_regions(self):
        return {r['name']: r for r in self.api('/v2/systemsharedmemory/status')[1]}

    def wait_ready(self, timeout=120.0, url=None):
        url = url or self.url
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if http_status(url, timeout=2) == 200:
                return self
            if not self.alive:
                break
            time.sleep(0.3)
        raise EngineError(
            '%s container %s is not ready at %s/v2/health/ready (running: %s); log:\n%s'
            % (self.engine.name, self.name, url, self.alive, self.log_tail())
        )

    def __repr__(self):
        return 'TritonContainer(%s %s pid=%s url=%s ip=%s)' % (self.engine.name, self.name, self.pid, self.url, self.ip)


def run_triton(
    engine: Engine,
    shm_size: str = '64m',
    publish: bool = True,
    network: str | None = None,
    models=(),
    name: str | None = None,
    image: str = 'rig',
    args=(),
    command: list | None = None,
    ipc: str = 'shareable',
    extra=(),
    ready_timeout: float = 120.0,
    pod: Pod | None = None,
) -> TritonContainer:
    """Start a Triton container and wait until it is ready.

    shm_size: ``--shm-size``; publish: publish the HTTP port on 127.0.0.1 at a free
    host port; network: None (the engine's default bridge) or 'host' (Triton then
    listens on 127.0.0.1 at a free port); models: models to load (``'echo'`` needs
    the rig image); image: 'rig' or 'tritonserver' (or a reference); args: extra
    tritonserver arguments; command: the whole command instead; ipc: the IPC mode
    (``shareable`` lets clients join it); extra: more engine ``run`` options.
    pod: a :class:`Pod` to run in; its IPC (and /dev/shm, the pod's ``--shm-size``)
    and network are the container's, so shm_size, ipc, network and publish do not apply.
    """
    ref = engine.image(image).ref if image in ('rig', 'tritonserver') else image
    name = name or engine.unique_name('triton')
    opts = ['--shm-size', shm_size] if pod is None else ['--pod', pod.id]
    if ipc and pod is None:
        opts += ['--ipc', ipc]
    http_port, host_port = TRITON_HTTP_PORT, None
    if pod is not None:
        shm_size = pod.shm_size
    elif network == 'host':
        http_port = tritonrig.free_port()
        opts += ['--network', 'host']
    else:
        if network:
            opts += ['--network', network]
        if publish:
            host_port = tritonrig.free_port()
            opts += ['-p', f'127.0.0.1:{host_port}:{TRITON_HTTP_PORT}']
    if command is None:
        command = [
            'tritonserver',
            '--model-repository=/models',
            '--model-control-mode=explicit',
            '--allow-grpc=false',
            '--allow-metrics=false',
            f'--http-port={http_port}',
        ]
        if network == 'host':
            command.append('--http-address=127.0.0.1')
        command += [f'--load-model={m}' for m in models] + list(args)
    cid = engine.create(name, opts + list(extra) + [ref] + list(command))
    triton = TritonContainer(engine, cid, name, ref, shm_size, network, host_port, http_port, pod)
    if ready_timeout:
        try:
            triton.wait_ready(ready_timeout)
        except EngineError:
            triton.remove()
            raise
    return triton


class ClientContainer(Container):
    """A tritonclient process in its own container, in the server's IPC and network namespaces."""

    def __init__(self, triton, cid, name, region, key, byte_size, mode):
        super().__init__(triton.engine, cid, name)
        self.triton = triton
        self.region = region
        self.key = key
        self.byte_size = byte_size
        self.mode = mode

    @property
    def lines(self):
        return [line.strip() for line in self.engine.logs(self.id).splitlines()]

    def wait_ready(self, timeout=90.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if 'READY' in self.lines:
                return self
            if not self.alive:
                break
            time.sleep(0.3)
        raise EngineError(
            'client container %s did not print READY (running: %s); log:\n%s\nserver log:\n%s'
            % (self.name, self.alive, self.log_tail(), self.triton.log_tail(15))
        )

    def kill(self, timeout=30.0):
        """`docker kill` / `podman kill` (SIGKILL to the whole container): the region and its file stay."""
        self.engine.run('kill', self.id, check=False, timeout=60)
        if not _wait(lambda: not self.alive, timeout):
            raise EngineError('client container %s still runs %ss after kill' % (self.name, timeout))

    def stop(self, timeout=10):
        """SIGTERM (the client exits cleanly, without unregistering), then remove."""
        self.engine.run('stop', '-t', str(timeout), self.id, check=False, timeout=timeout + 60)
        self.remove()

    def __repr__(self):
        return 'ClientContainer(%s %s region=%s key=%s)' % (self.engine.name, self.name, self.region, self.key)


def run_client(
    triton: TritonContainer,
    name: str,
    byte_size: int,
    mode: str = 'hold',
    key: str | None = None,
    count: int = 0,
    pause: float = 0.0,
    register: bool = True,
    fill: bool = True,
    init: bool = True,
    extra=(),
    ready_timeout: float = 90.0,
) -> ClientContainer:
    """Start the rig's client in a container sharing triton's IPC and network namespaces.

    It creates system shm region ``name`` (key ``/name`` unless given) of
    byte_size bytes in the server's /dev/shm, registers it over
    http://127.0.0.1:<Triton's port> and holds it (mode 'hold') or runs
    inferences through it on the ``echo`` model (mode 'infer'; the server needs
    ``models=('echo',)``). count > 0 registers count regions NAME_i / KEY_i.
    Returns once it printed READY.

    init (``--init``): an init process is the container's PID 1, so `kill` kills
    the client and its resource tracker at once and the file stays (a stale
    region). Without it the client is PID 1; when it dies its pipe to the
    tracker closes before the kernel kills the rest of the container, and the
    tracker sometimes unlinks the file first (a dangling region): a race.
    extra: more engine ``run`` options.
    """
    engine = triton.engine
    image = engine.image('rig')
    key = key or '/' + name
    cname = engine.unique_name('client-' + name.replace('/', '_'))
    opts = ['--ipc', 'container:' + triton.id] + (['--init'] if init else []) + list(extra)
    if triton.pod is not None:
        # a sidecar: the pod gives it the server's IPC namespace (/dev/shm) and network
        opts = ['--pod', triton.pod.id] + opts[2:]
    elif triton.network == 'host':
        opts += ['--network', 'host']
    else:
        opts += ['--network', 'container:' + triton.id]
    cmd = [
        image.python,
        build_image.CLIENT_PATH,
        '--url',
        f'http://127.0.0.1:{triton.http_port}',
        '--name',
        name,
        '--key',
        key,
        '--byte-size',
        str(byte_size),
        '--mode',
        mode,
    ]
    if count:
        cmd += ['--count', str(count)]
    if pause:
        cmd += ['--pause', str(pause)]
    if not register:
        cmd.append('--no-register')
    if not fill:
        cmd.append('--no-fill')
    cid = engine.create(cname, opts + [image.ref] + cmd)
    client = ClientContainer(triton, cid, cname, name, key, byte_size, mode)
    try:
        client.wait_ready(ready_timeout)
    except EngineError:
        engine.remove([cid])
        raise
    return client


class Forwarder:
    """socat on 127.0.0.1:port forwarding each connection (a forked child) to a Triton URL; stopped by pid."""

    def __init__(self, target_url, host='127.0.0.1', port=None):
        self.socat = shutil.which('socat')
        if not self.socat:
            raise EngineUnavailable('socat is not installed (.ci/deps installs it)')
        target = target_url.split('://', 1)[-1].rstrip('/')
        self.target_host, self.target_port = target.rsplit(':', 1)
        self.host = host
        self.port = port or tritonrig.free_port(host)
        self.proc = None

    @property
    def url(self):
        return 'http://%s:%d' % (self.host, self.port)

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def start(self, timeout=15.0):
        cmd = [
            self.socat,
            'TCP-LISTEN:%d,bind=%s,fork,reuseaddr' % (self.port, self.host),
            'TCP:%s:%s' % (self.target_host, self.target_port),
        ]
        # own session: its forked children are stopped with it
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )

        def listening():
            if self.proc.poll() is not None:
                return True
            with socket.socket() as sock:
                sock.settimeout(1)
                return sock.connect_ex((self.host, self.port)) == 0

        if not _wait(listening, timeout, 0.05) or self.proc.poll() is not None:
            err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ''
            self.stop()
            raise EngineError('socat did not listen on %s:%d: %s' % (self.host, self.port, err))
        return self

    def stop(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def forward(target_url, host='127.0.0.1', port=None):
    """A started Forwarder to target_url."""
    return Forwarder(target_url, host, port).start()
