"""Build the local test images from the venv (no registry needed), for podman and Docker.

Two images, each a reproducible rootfs tar (sorted, fixed mtimes) imported with
``podman import`` or ``docker import`` and tagged ``<server version>-<content
hash>``; an image whose tag already exists in an engine is not built again:

``tritonserver`` (``localhost/tritonops-test/tritonserver``)
    What NVIDIA's images hold where the triton_server role expects it:
    ``/opt/tritonserver/bin/tritonserver`` (on PATH), ``/opt/tritonserver/backends``
    (Triton's default backend directory, python backend without its stub) and
    the wheel's bundled libraries in ``/opt/tritonserver/lib`` (the binary's
    RPATH ``$ORIGIN/../lib``), plus the system libraries ``ldd`` finds for them
    and ``/bin/sh``. No Python: an empty ``/models``.

``rig`` (``localhost/tritonops-test/tritonrig``)
    The same plus the venv's base Python 3.12 at its own prefix (interpreter,
    libpython, the standard library without its tests and GUI parts, and the
    installed distributions ``tritonclient[http]``, ``numpy`` and ``requests`` need, from
    their metadata), the python backend stub, the rig's ``echo`` model in
    ``/models/echo`` and the rig's client at ``/opt/tritonops/client.py``. One
    image for Triton containers that serve the python ``echo`` model and for
    the client containers that share their IPC namespace.

The version in the tag comes from the binary itself, so the role's ``auto``
decision for ``--allow-client-shm`` is exercised on the real version.

Usage::

    python build_image.py [--image tritonserver|rig] [--engine podman|docker]
                          [--docker-host unix:///path.sock] [--repository REPO]

Prints the image reference on the last line of stdout.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile

from packaging.requirements import Requirement

HERE = os.path.dirname(os.path.abspath(__file__))
RIG_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), 'rig')
sys.path.insert(0, RIG_DIR)

import tritonrig  # noqa: E402  pylint: disable=wrong-import-position

DEFAULT_REPOSITORY = 'localhost/tritonops-test/tritonserver'
RIG_REPOSITORY = 'localhost/tritonops-test/tritonrig'
PREFIX = 'opt/tritonserver'
# the venv's base interpreter keeps its own prefix: the python backend stub embeds it in
# isolated mode (no PYTHONHOME), so its standard library must be where it was built
PY_PREFIX = sys.base_prefix.strip('/')
CLIENT_PATH = '/opt/tritonops/client.py'
# the distributions (and their dependencies) copied into the rig image: the client's, and requests, the collection's
# HTTP library (tritonclient[http] does not bring it), so the modules run inside a rig container through a container
# connection plugin as they would in a Triton image with Python (tests/integration/test_inside_containers.py)
CLIENT_REQUIREMENTS = ('tritonclient[http]', 'numpy', 'requests')
# standard library parts a client never imports
STDLIB_SKIP = {
    'test',
    'idlelib',
    'tkinter',
    'turtledemo',
    'ensurepip',
    'lib2to3',
    'pydoc_data',
    'site-packages',
    '__pycache__',
}
MTIME = 1700000000
PASSWD = 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n'
GROUP = 'root:x:0:\nnogroup:x:65534:\n'
PATH = '/%s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' % PREFIX
LD_PATH = '/%s/lib:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu' % PREFIX


class BuildError(RuntimeError):
    pass


def _is_elf(path):
    with open(path, 'rb') as f:
        return f.read(4) == b'\x7fELF'


def _ldd(path, env):
    """(libraries `path` needs as absolute paths, names of the ones ldd did not find)."""
    proc = subprocess.run(['ldd', path], capture_output=True, text=True, env=env, check=False)
    found, missing = [], []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if 'not found' in line:
            missing.append(line.split()[0])
            continue
        match = re.search(r'(/\S+) \(0x', line)
        if match:
            found.append(match.group(1))
    return found, missing


def _walk(top, arc_top, skip_dirs=(), skip=lambda name: False):
    """[(arc, src)] for the regular files under top, sorted, without __pycache__ and .pyc."""
    files = []
    for dirpath, dirnames, filenames in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        dirnames[:] = sorted(
            d for d in dirnames if d != '__pycache__' and not (rel == '.' and d in skip_dirs) and d != 'tests'
        )
        for name in sorted(filenames):
            src = os.path.join(dirpath, name)
            if os.path.isfile(src) and not os.path.islink(src) and not name.endswith('.pyc') and not skip(name):
                files.append((os.path.normpath(os.path.join(arc_top, rel, name)), src))
    return files


def add_system_libs(files, env, trees, strict=True):
    """Append the libraries ldd finds for the ELF files, except those inside the trees copied.

    A library ldd does not find is fine when the image gets a file of that name
    (wheels' bundled libraries are found through their users' RPATH). Otherwise
    strict fails (the python backend's libpython comes from the wheel: anything
    else is a real gap), and not strict leaves the file out of the image (it
    cannot be loaded on this host either). Returns the new list.
    """
    trees = tuple(os.path.realpath(t) + os.sep for t in trees)
    names = {os.path.basename(arc) for arc, _src in files}
    system = set()
    kept = []
    for arc, src in files:
        if _is_elf(src):
            libs, missing = _ldd(src, env)
            missing = [name for name in missing if name not in names]
            if missing and strict:
                raise BuildError('ldd %s: %s not found' % (src, ', '.join(missing)))
            if missing:
                continue
            system.update(lib for lib in libs if not os.path.realpath(lib).startswith(trees))
        kept.append((arc, src))
    return kept + [(lib.lstrip('/'), os.path.realpath(lib)) for lib in sorted(system)]


def _triton_files(paths):
    files = [('%s/bin/tritonserver' % PREFIX, paths['binary'])]
    # the python backend stub is copied there by the rig for the host's Python and needs
    # its libpython: this image has no Python, so no stub (and a stable hash)
    files += _walk(paths['backends'], PREFIX + '/backends', skip=lambda name: name == 'triton_python_backend_stub')
    files += _walk(paths['libs'], PREFIX + '/lib')
    files.append(('bin/sh', os.path.realpath('/bin/sh')))
    return files


def collect(paths):
    """[(path inside the tritonserver image, source path on this host)] for every regular file."""
    return add_system_libs(_triton_files(paths), dict(os.environ, LD_LIBRARY_PATH=paths['libs']), [paths['libs']])


def client_distributions(requirements=CLIENT_REQUIREMENTS):
    """The installed distributions the requirements need (their closure, extras and markers applied)."""
    found = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = req.name.lower().replace('_', '-')
        if key in found:
            continue
        dist = importlib.metadata.distribution(req.name)
        found[key] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({'extra': e}) for e in (req.extras or {''})):
                todo.append(sub)
    return [found[k] for k in sorted(found)]


def collect_rig(paths):
    """The tritonserver image's files plus Python, the client's packages, the stub and the client."""
    base = sys.base_prefix
    stdlib = sysconfig.get_paths()['stdlib']
    site = sysconfig.get_paths()['purelib']
    version = 'python%d.%d' % sys.version_info[:2]
    libdir = sysconfig.get_config_var('LIBDIR')
    libpython = sysconfig.get_config_var('INSTSONAME')
    files = _triton_files(paths)
    # the python backend starts its stub with `bash -c`
    files.append(('%s/backends/python/triton_python_backend_stub' % PREFIX, paths['stub_src']))
    files.append(('bin/bash', os.path.realpath('/bin/bash')))
    files.append(('%s/bin/%s' % (PY_PREFIX, version), os.path.realpath(os.path.join(base, 'bin', version))))
    if libpython and os.path.exists(os.path.join(libdir, libpython)):
        files.append(('%s/lib/%s' % (PY_PREFIX, libpython), os.path.realpath(os.path.join(libdir, libpython))))
    files += _walk(
        stdlib,
        '%s/lib/%s' % (PY_PREFIX, version),
        skip_dirs=STDLIB_SKIP | {n for n in os.listdir(stdlib) if n.startswith('config-')},
        skip=lambda name: name.startswith(('_test', '_xxtest', '_ctypes_test', '_tkinter')),
    )
    site_arc = '%s/lib/%s/site-packages' % (PY_PREFIX, version)
    for dist in client_distributions():
        for rel in dist.files or []:
            src = os.path.normpath(os.path.join(site, str(rel)))
            parts = str(rel).split('/')
            if (
                src.startswith(site + os.sep)
                and os.path.isfile(src)
                and not src.endswith('.pyc')
                and '__pycache__' not in parts
                and 'tests' not in parts
            ):
                files.append((os.path.join(site_arc, str(rel)), src))
    files.append((CLIENT_PATH.lstrip('/'), tritonrig.CLIENT_SCRIPT))
    env = dict(os.environ, LD_LIBRARY_PATH=':'.join([paths['libs'], libdir]))
    return add_system_libs(sorted(set(files)), env, [paths['libs'], base, site], strict=False)


def rig_texts():
    """In-memory files of the rig image: the rig's echo model."""
    site = '/%s/lib/python%d.%d/site-packages' % ((PY_PREFIX,) + sys.version_info[:2])
    return [
        ('models/echo/config.pbtxt', tritonrig.ECHO_CONFIG),
        ('models/echo/1/model.py', tritonrig.ECHO_MODEL.format(sites=[site])),
    ]


def content_hash(files, texts=()):
    digest = hashlib.sha256()
    with open(os.path.abspath(__file__), 'rb') as f:
        digest.update(f.read())
    for arc, text in texts:
        digest.update(arc.encode() + b'\0' + text.encode() + b'\0')
    for arc, src in sorted(files):
        digest.update(arc.encode() + b'\0' + oct(os.stat(src).st_mode & 0o7777).encode() + b'\0')
        with open(src, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 20), b''):
                digest.update(chunk)
    return digest.hexdigest()


def server_version(paths):
    """The server's own version, from the option table it prints before it fails on a missing repository."""
    env = dict(os.environ, LD_LIBRARY_PATH=paths['libs'])
    proc = subprocess.run(
        [
            paths['binary'],
            '--model-repository',
            '/nonexistent-tritonops-probe',
            '--allow-http',
            'false',
            '--allow-grpc',
            'false',
            '--allow-metrics',
            'false',
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    match = re.search(r'server_version\s*\|\s*([0-9]+\.[0-9]+\.[0-9]+)', proc.stdout + proc.stderr)
    if not match:
        raise BuildError(
            'could not read the server version from %s:\n%s' % (paths['binary'], (proc.stdout + proc.stderr)[-2000:])
        )
    return match.group(1)


def _dir(tar, name, mode=0o755):
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = MTIME
    tar.addfile(info)


def _text(tar, name, text, mode=0o644):
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = MTIME
    tar.addfile(info, io.BytesIO(data))


def write_rootfs(files, path, texts=()):
    texts = [('etc/passwd', PASSWD), ('etc/group', GROUP)] + list(texts)
    dirs = {'dev', 'proc', 'sys', 'etc', 'root', 'models', 'run', 'var', 'var/tmp'}
    for arc in [arc for arc, _src in files] + [arc for arc, _text in texts]:
        parent = os.path.dirname(arc)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    with tarfile.open(path, 'w', format=tarfile.GNU_FORMAT) as tar:
        _dir(tar, 'tmp', 0o1777)
        for name in sorted(dirs):
            _dir(tar, name)
        for arc, text in texts:
            _text(tar, arc, text)
        for arc, src in sorted(files):
            st = os.stat(src)
            info = tarfile.TarInfo(arc)
            info.size = st.st_size
            info.mode = st.st_mode & 0o7777
            info.mtime = MTIME
            with open(src, 'rb') as f:
                tar.addfile(info, f)


class Image:
    """One test image: its files, its config, and its reference (repository:version-hash)."""

    def __init__(self, kind='tritonserver', repository=None):
        if kind not in ('tritonserver', 'rig'):
            raise BuildError('unknown image %r (tritonserver or rig)' % kind)
        paths = tritonrig.triton_paths()
        self.kind = kind
        env = {'PATH': PATH, 'LD_LIBRARY_PATH': LD_PATH}
        if kind == 'rig':
            py = '/' + PY_PREFIX
            env = {'PATH': '%s/bin:%s' % (py, PATH), 'LD_LIBRARY_PATH': '%s:%s/lib' % (LD_PATH, py)}
            self.files, self.texts = collect_rig(paths), rig_texts()
            self.python = '%s/bin/python%d.%d' % ((py,) + sys.version_info[:2])
        else:
            self.files, self.texts = collect(paths), []
            self.python = None
        # (instruction, value); no spaces inside values (podman splits a change at whitespace)
        self.changes = [('ENV', '%s=%s' % item) for item in sorted(env.items())] + [
            ('WORKDIR', '/'),
            ('CMD', '["tritonserver","--model-repository=/models"]'),
            ('LABEL', 'org.opencontainers.image.title=tritonops.shm-test-%s' % kind),
        ]
        repository = repository or (RIG_REPOSITORY if kind == 'rig' else DEFAULT_REPOSITORY)
        self.ref = '%s:%s-%s' % (repository, server_version(paths), content_hash(self.files, self.texts)[:12])

    def change_args(self, engine):
        """--change options: podman takes INSTRUCTION=VALUE, docker a Dockerfile line."""
        sep = ' ' if engine == 'docker' else '='
        args = []
        for instruction, value in self.changes:
            args += ['--change', instruction + sep + value]
        return args


def image_exists(cli, ref, engine='podman'):
    """Whether the engine (its command line as a list, or the podman binary) has the image."""
    cli = [cli] if isinstance(cli, str) else list(cli)
    cmd = cli + (['image', 'exists', ref] if engine == 'podman' else ['image', 'inspect', '--format', '{{.Id}}', ref])
    return subprocess.run(cmd, capture_output=True, check=False, timeout=120).returncode == 0


# Held while an image is checked and imported: two test sessions (or pytest-xdist workers) that need the image at
# once import it once; the other waits for it, then finds it.
IMPORT_LOCK = os.path.join(tempfile.gettempdir(), 'tritonops-image.lock')


def ensure(image, targets):
    """Import the image into each (engine, cli) target that lacks it; the rootfs is written once.

    Returns the engines it was imported into.
    """
    with open(IMPORT_LOCK, 'a', encoding='ascii') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _import_missing(image, targets)


def _import_missing(image, targets):
    missing = [(engine, cli) for engine, cli in targets if not image_exists(cli, image.ref, engine)]
    if not missing:
        return []
    with tempfile.TemporaryDirectory(prefix='tritonops-image-') as tmp:
        rootfs = os.path.join(tmp, 'rootfs.tar')
        write_rootfs(image.files, rootfs, image.texts)
        for engine, cli in missing:
            cmd = (
                ([cli] if isinstance(cli, str) else list(cli))
                + ['import']
                + image.change_args(engine)
                + [rootfs, image.ref]
            )
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
            if proc.returncode != 0:
                raise BuildError('%s import failed (%s): %s' % (engine, proc.returncode, proc.stderr.strip()[-2000:]))
    return [engine for engine, _cli in missing]


def build(repository=DEFAULT_REPOSITORY, podman='podman', kind='tritonserver'):
    """The image for podman (built when missing): (reference, whether it was built)."""
    image = Image(kind, repository)
    return image.ref, bool(ensure(image, [('podman', podman)]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--image', choices=('tritonserver', 'rig'), default='tritonserver')
    parser.add_argument('--engine', choices=('podman', 'docker'), default='podman')
    parser.add_argument('--repository', default=None)
    parser.add_argument('--podman', default='podman')
    parser.add_argument('--docker', default='/usr/bin/docker')
    parser.add_argument('--docker-host', default=None, help='the Docker daemon, e.g. unix:///run/x/docker.sock')
    args = parser.parse_args(argv)
    cli = (
        [args.podman]
        if args.engine == 'podman'
        else [args.docker] + (['-H', args.docker_host] if args.docker_host else [])
    )
    try:
        image = Image(args.image, args.repository)
        built = ensure(image, [(args.engine, cli)])
    except (BuildError, tritonrig.RigError) as exc:
        print('build_image: %s' % exc, file=sys.stderr)
        return 1
    print('%s image %s' % ('built' if built else 'cached', image.ref), file=sys.stderr)
    print(image.ref)
    return 0


if __name__ == '__main__':
    sys.exit(main())
