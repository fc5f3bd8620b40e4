"""`make demo` (the README's first command) tells its story to the end: the demo itself fails on any step that does not
hold (a live client losing its region, a new client still failing after the cleanup, the bytes not adding up). Run
here with the test venv; `make demo` runs the same script with its own small venv (tests/requirements-demo.txt)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

from ansible_helpers import COLLECTIONS_PATH, ansible_env
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_demo_runs_to_the_end_and_explains_every_byte():
    proc = subprocess.run(
        [sys.executable, os.path.join(COLLECTION, 'tests', 'rig', 'demo.py')],
        capture_output=True,
        text=True,
        env=ansible_env({'ANSIBLE_COLLECTIONS_PATH': COLLECTIONS_PATH}),
        cwd=COLLECTION,
        timeout=600,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    for said in (
        'PLAY RECAP',  # ansible-playbook's own output, as a user sees it
        "freed: 50.0 MiB (44.0 MiB of files, 6.0 MiB of the dangling region's memory",
        'live client prep_live',
        'in all, what /dev/shm says is used',
        'Done in',
    ):
        assert said in out, (said, out[-4000:])
    assert 'Traceback' not in out + proc.stderr


def _locked() -> dict[str, str]:
    path = os.path.join(COLLECTION, 'tests', 'requirements-demo.txt')
    with open(path) as f:
        pins = [line.split('#')[0].strip() for line in f]
    return {canonicalize_name(name): version for name, version in (pin.split('==') for pin in pins if pin)}


def test_the_demo_venv_has_every_dependency_at_the_test_venv_s_version():
    """`make demo` installs tests/requirements-demo.txt with --no-deps: a dependency missing there breaks the demo on a
    fresh machine only, so it is held here, with the test venv's installed metadata (the same versions)."""
    locked = _locked()
    wanted = {'tritonclient': {'http'}}  # the extras the demo installs, as tritonclient[http] did
    # left out on purpose: what only an API the demo never imports needs
    left_out = {'aiohttp': "tritonclient.http.aio only: the demo's clients are synchronous (tritonclient.http)"}
    missing = []
    for name, version in locked.items():
        assert metadata.version(name) == version, (
            f'{name}: the demo pins {version}, the tests run {metadata.version(name)}'
        )
        if name == 'nvidia-pytriton':
            continue  # its server only: the Python API's dependencies are left out on purpose
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            extras = wanted.get(name, set()) | {''}
            if req.marker and not any(req.marker.evaluate({'extra': extra}) for extra in extras):
                continue
            if canonicalize_name(req.name) not in locked and req.name not in left_out:
                missing.append(f'{name} needs {text}')
    assert not missing, missing


def test_make_demo_runs_with_its_own_small_venv(tmp_path):
    """The README's first command as a newcomer runs it: `make demo` builds its venv from tests/requirements-demo.txt
    alone (--no-deps: a package missing there fails here, not only on a user's machine) and tells the story."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(('ANSIBLE_', 'PYTHON', 'VIRTUAL_ENV', 'PYTEST'))}
    build = tmp_path / 'build'
    proc = subprocess.run(
        ['make', '-s', 'demo', f'BUILD={build}'],
        capture_output=True,
        text=True,
        env=env,
        cwd=COLLECTION,
        timeout=900,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    assert 'PLAY RECAP' in out and 'in all, what /dev/shm says is used' in out and 'Done in' in out, out[-4000:]
    assert 'Traceback' not in out + proc.stderr
    venv = build / 'venv-demo'
    size = sum(f.stat().st_size for f in venv.rglob('*') if f.is_file() and not f.is_symlink())
    assert size < 350 * 2**20, f'the demo venv is {size / 2**20:.0f} MiB'
