"""Build a minimal local Triton image from the nvidia-pytriton wheel (no registry needed).

The image holds what NVIDIA's images hold where the role expects it:
``/opt/tritonserver/bin/tritonserver`` (on PATH), ``/opt/tritonserver/backends``
(Triton's default backend directory) and the wheel's bundled libraries in
``/opt/tritonserver/lib`` (the binary's RPATH ``$ORIGIN/../lib``), plus the
system libraries ``ldd`` finds for them and ``/bin/sh``. It is packed as a
reproducible tar (sorted, fixed mtimes) and ``podman import``-ed.

The tag is ``<server version>-<content hash>``, for example ``2.51.0-1a2b3c4d5e6f``:
the version comes from the binary itself, so the role's ``auto`` decision for
``--allow-client-shm`` is exercised on the real version, and an image whose
content hash already exists is not built again.

Usage::

    python build_image.py [--repository localhost/tritonops-test/tritonserver] [--podman podman]

Prints the image reference on the last line of stdout.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), 'rig'))

import tritonrig  # noqa: E402  pylint: disable=wrong-import-position

DEFAULT_REPOSITORY = 'localhost/tritonops-test/tritonserver'
PREFIX = 'opt/tritonserver'
MTIME = 1700000000
PASSWD = 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n'
GROUP = 'root:x:0:\nnogroup:x:65534:\n'


class BuildError(RuntimeError):
    pass


def _is_elf(path):
    with open(path, 'rb') as f:
        return f.read(4) == b'\x7fELF'


def _ldd(path, env):
    """System libraries (outside the wheel) that `path` needs, as absolute paths."""
    proc = subprocess.run(['ldd', path], capture_output=True, text=True, env=env, check=False)
    found = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if 'not found' in line:
            # the python backend's libpython comes from the wheel; anything else is a real gap
            raise BuildError('ldd %s: %s' % (path, line))
        match = re.search(r'(/\S+) \(0x', line)
        if match:
            found.append(match.group(1))
    return found


def collect(paths):
    """[(path inside the image, source path on this host)] for every regular file."""
    files = [('%s/bin/tritonserver' % PREFIX, paths['binary'])]
    for top, arc_top in ((paths['backends'], PREFIX + '/backends'), (paths['libs'], PREFIX + '/lib')):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != '__pycache__')
            for name in sorted(filenames):
                src = os.path.join(dirpath, name)
                # the python backend stub is copied there by the rig for the host's Python and
                # needs its libpython: the image has no Python, so no stub (and a stable hash)
                if os.path.isfile(src) and not name.endswith('.pyc') and name != 'triton_python_backend_stub':
                    files.append((os.path.join(arc_top, os.path.relpath(src, top)), src))
    shell = os.path.realpath('/bin/sh')
    files.append(('bin/sh', shell))
    env = dict(os.environ, LD_LIBRARY_PATH=paths['libs'])
    libs_real = os.path.realpath(paths['libs'])
    system = set()
    for _arc, src in list(files):
        if _is_elf(src):
            for lib in _ldd(src, env):
                if not os.path.realpath(lib).startswith(libs_real + os.sep):
                    system.add(lib)
    for lib in sorted(system):
        files.append((lib.lstrip('/'), os.path.realpath(lib)))
    return files


def content_hash(files):
    digest = hashlib.sha256()
    with open(os.path.abspath(__file__), 'rb') as f:
        digest.update(f.read())
    for arc, src in sorted(files):
        digest.update(arc.encode() + b'\0' + oct(os.stat(src).st_mode & 0o7777).encode() + b'\0')
        with open(src, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 20), b''):
                digest.update(chunk)
    return digest.hexdigest()


def server_version(paths):
    """The server's own version, from the option table it prints before it fails on a missing repository."""
    env = dict(os.environ, LD_LIBRARY_PATH=paths['libs'])
    proc = subprocess.run([paths['binary'], '--model-repository', '/nonexistent-tritonops-probe',
                           '--allow-http', 'false', '--allow-grpc', 'false', '--allow-metrics', 'false'],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    match = re.search(r'server_version\s*\|\s*([0-9]+\.[0-9]+\.[0-9]+)', proc.stdout + proc.stderr)
    if not match:
        raise BuildError('could not read the server version from %s:\n%s' % (paths['binary'], (proc.stdout + proc.stderr)[-2000:]))
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


def write_rootfs(files, path):
    dirs = {'dev', 'proc', 'sys', 'etc', 'root', 'models', 'run', 'var', 'var/tmp'}
    for arc, _src in files:
        parent = os.path.dirname(arc)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    with tarfile.open(path, 'w', format=tarfile.GNU_FORMAT) as tar:
        _dir(tar, 'tmp', 0o1777)
        for name in sorted(dirs):
            _dir(tar, name)
        _text(tar, 'etc/passwd', PASSWD)
        _text(tar, 'etc/group', GROUP)
        for arc, src in sorted(files):
            st = os.stat(src)
            info = tarfile.TarInfo(arc)
            info.size = st.st_size
            info.mode = st.st_mode & 0o7777
            info.mtime = MTIME
            with open(src, 'rb') as f:
                tar.addfile(info, f)


def image_exists(podman, ref):
    return subprocess.run([podman, 'image', 'exists', ref], check=False).returncode == 0


def build(repository=DEFAULT_REPOSITORY, podman='podman'):
    paths = tritonrig.triton_paths()
    files = collect(paths)
    ref = '%s:%s-%s' % (repository, server_version(paths), content_hash(files)[:12])
    if image_exists(podman, ref):
        return ref, False
    with tempfile.TemporaryDirectory(prefix='tritonops-image-') as tmp:
        rootfs = os.path.join(tmp, 'rootfs.tar')
        write_rootfs(files, rootfs)
        # podman splits a change at whitespace: no spaces inside values
        changes = ['ENV=PATH=/%s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' % PREFIX,
                   'ENV=LD_LIBRARY_PATH=/%s/lib:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu' % PREFIX,
                   'WORKDIR=/',
                   'CMD=["tritonserver","--model-repository=/models"]',
                   'LABEL=org.opencontainers.image.title=tritonops.shm-test-tritonserver']
        cmd = [podman, 'import']
        for change in changes:
            cmd += ['--change', change]
        cmd += [rootfs, ref]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError('podman import failed (%s): %s' % (proc.returncode, proc.stderr.strip()[-2000:]))
    return ref, True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--repository', default=DEFAULT_REPOSITORY)
    parser.add_argument('--podman', default='podman')
    args = parser.parse_args(argv)
    try:
        ref, built = build(args.repository, args.podman)
    except (BuildError, tritonrig.RigError) as exc:
        print('build_image: %s' % exc, file=sys.stderr)
        return 1
    print('%s image %s' % ('built' if built else 'cached', ref), file=sys.stderr)
    print(ref)
    return 0


if __name__ == '__main__':
    sys.exit(main())
