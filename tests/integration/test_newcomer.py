"""A newcomer with the README alone: the built tarball installed into a clean virtualenv that holds only
ansible-core and the documented requirements (from PyPI), then the README's install, report and cleanup commands
and its inventory, as written (read from README.md, never retyped here), against a real tritonserver with a real
leak (a tritonclient SIGKILLed with its process group: a stale region and its file).

- as root, it works: the report shows the stale region, check mode changes nothing, the cleanup removes region
  and file;
- as the user nobody with become turned off (the README's `-e triton_become=false`), it fails clearly: the
  failure says to run as root (become), and nothing was touched.

What is not the README's: the URL of the test server replaces the inventory's http://127.0.0.1:8000, and
host_vars/ next to the inventory give the hosts a local connection and the venv's Python (what any real
inventory says about its hosts). The venv is cached under build/ keyed by its interpreter, the ansible-core
requirement and requirements.txt (make collection keeps build/, so only the first run pays for PyPI).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest
import tritonrig
import yaml
from ansible_helpers import COLLECTIONS_PATH, REPO

BUILD = COLLECTIONS_PATH  # make's BUILD, which holds ansible_collections/ (`make collection` keeps the rest)
README_URL = 'http://127.0.0.1:8000'
NOBODY = pwd.getpwnam('nobody')
SETPRIV = ['setpriv', '--reuid', str(NOBODY.pw_uid), '--regid', str(NOBODY.pw_gid), '--clear-groups', '--']


def _doc_sources():
    path = os.path.join(REPO, 'tests', 'unit', 'docs', 'doc_sources.py')
    spec = importlib.util.spec_from_file_location('doc_sources', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme() -> dict:
    """The README's commands (one shell line each, its comment cut off, run by sh as a user's shell runs it) and its
    fleet inventory."""
    docs = _doc_sources()
    blocks = docs.fenced_blocks(os.path.join(REPO, 'README.md'))
    lines = [
        re.split(r'(?:^|\s+)#(?:\s|$)', line, maxsplit=1)[0]
        for block in blocks
        if block.lang == 'sh'
        for line in block.text.splitlines()
    ]

    def command(*words: str) -> str:
        found = [line for line in lines if all(w in shlex.split(line) for w in words)]
        assert len(found) == 1, f'README.md has {len(found)} commands with {words}'
        return found[0]

    inventories = [b.text for b in blocks if b.lang == 'yaml' and b.text.startswith('# inventory.yml')]
    assert len(inventories) == 1
    requirements = [b.text for b in blocks if b.lang == 'yaml' and b.text.startswith('# collections/requirements.yml')]
    assert len(requirements) == 1
    return dict(
        requirements=requirements[0],
        install=command('ansible-galaxy', 'install'),
        pip=command('pip', 'requirements.txt'),
        report=command('ansible-playbook', 'tritonops.shm.report'),
        check=command('ansible-playbook', 'tritonops.shm.cleanup', '--check'),
        cleanup=command('ansible-playbook', 'tritonops.shm.cleanup', '-e'),
        inventory=inventories[0],
    )


def newcomer_python() -> tuple[str, str]:
    """An interpreter the user nobody can run too (the test venv's base Python may sit under /root), and the
    ansible-core a newcomer gets with it (2.19 on Python 3.11, the newest otherwise)."""
    for python in (getattr(sys, '_base_executable', sys.executable), '/usr/bin/python3'):
        probe = subprocess.run(
            SETPRIV + [python, '-c', 'import sys, venv; print("%d.%d" % sys.version_info[:2])'],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and tuple(map(int, probe.stdout.split('.'))) >= (3, 11):
            return python, 'ansible-core>=2.19,<2.20' if probe.stdout.strip() == '3.11' else 'ansible-core>=2.19'
    pytest.fail('no Python >= 3.11 that the user nobody can run (the non-root half of the test needs one)')


@pytest.fixture(scope='module')
def venv() -> str:
    """A virtualenv with only ansible-core: the README's pip line adds the documented requirements in the test."""
    python, core = newcomer_python()
    with open(os.path.join(REPO, 'requirements.txt'), 'rb') as f:
        key = hashlib.sha256(b'\0'.join([python.encode(), core.encode(), f.read()])).hexdigest()[:12]
    path = os.path.join(BUILD, f'newcomer-venv-{key}')
    if not os.path.exists(os.path.join(path, '.installed')):
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([python, '-m', 'venv', path], check=True)
        subprocess.run(
            [os.path.join(path, 'bin', 'pip'), 'install', '--quiet', '--disable-pip-version-check', core],
            check=True,
            timeout=600,
        )
        open(os.path.join(path, '.installed'), 'w').close()
    return path


def env_of(venv: str, home: str, collections: str) -> dict:
    """What a newcomer's shell has: the venv's bin first, a home; nothing of the test venv's Ansible settings."""
    return {
        'PATH': f'{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
        'HOME': home,
        'LANG': 'C.UTF-8',
        'ANSIBLE_COLLECTIONS_PATH': collections,
        'ANSIBLE_NOCOLOR': '1',
    }


def run(
    cmd: list[str] | str, cwd: str, env: dict, prefix: tuple = (), timeout: int = 600
) -> subprocess.CompletedProcess:
    """A command, or a line of shell (run by sh -c, with PWD as a shell sets it)."""
    if isinstance(cmd, str):
        cmd, env = ['sh', '-c', cmd], dict(env, PWD=cwd)
    return subprocess.run(
        list(prefix) + cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def workdir(base: str, name: str, owner: pwd.struct_passwd, inventory: str, python: str) -> str:
    """A directory (owned by owner) with the README's inventory.yml (the test server's URL in place of the
    README's) and host_vars/ for its hosts."""
    path = os.path.join(base, name)
    os.makedirs(os.path.join(path, 'host_vars'))
    with open(os.path.join(path, 'inventory.yml'), 'w') as f:
        f.write(inventory)
    for host in yaml.safe_load(inventory)['triton']['hosts']:
        with open(os.path.join(path, 'host_vars', f'{host}.yml'), 'w') as f:
            yaml.safe_dump({'ansible_connection': 'local', 'ansible_python_interpreter': python}, f)
    for root, dirs, files in os.walk(path):
        for name in dirs + files + ['.']:
            os.chown(os.path.join(root, name), owner.pw_uid, owner.pw_gid)
    return path


def report_row(cwd: str, host: str) -> dict:
    with open(os.path.join(cwd, 'shm-report', 'report.json'), encoding='utf-8') as f:
        return {row['host']: row for row in json.load(f)['hosts']}[host]


def test_the_readme_as_written_from_the_built_tarball(venv, tmp_path):
    steps = readme()
    assert README_URL in steps['inventory']
    base = tempfile.mkdtemp(prefix='tritonops-newcomer-', dir='/tmp')
    os.chmod(base, 0o755)  # nobody reaches its own directory, the installed collection and the venv
    server = tritonrig.TritonServer(workdir=str(tmp_path), shm_size='32m', models=())
    try:
        # the tarball, built as the README's `make build` does, installed with the README's command
        built = run(
            [
                os.path.join(os.path.dirname(sys.executable), 'ansible-galaxy'),
                'collection',
                'build',
                '--force',
                '--output-path',
                base,
            ],
            cwd=REPO,
            env=dict(os.environ),
        )
        assert built.returncode == 0, built.stdout + built.stderr
        collections = os.path.join(base, 'collections')
        env = env_of(venv, os.path.join(base, 'home'), collections)
        # the README's collections/requirements.yml, with the tarball it offers beside the git source (CI reaches no
        # GitHub): the same entry, `type: file`
        listed = yaml.safe_load(steps['requirements'])['collections']
        assert listed[0] == {'name': 'https://github.com/tritonops/shm.git', 'type': 'git', 'version': 'main'}, listed
        assert '#   type: file' in steps['requirements']
        (tarball,) = [n for n in os.listdir(base) if n.startswith('tritonops-shm-') and n.endswith('.tar.gz')]
        os.makedirs(collections)
        with open(os.path.join(collections, 'requirements.yml'), 'w') as f:
            yaml.safe_dump({'collections': [{'name': os.path.join(base, tarball), 'type': 'file'}]}, f)
        installed = run(steps['install'], cwd=base, env=env)
        assert installed.returncode == 0, f'README: {steps["install"]}\n{installed.stdout}{installed.stderr}'
        shipped = os.path.join(collections, 'ansible_collections', 'tritonops', 'shm')
        assert os.path.isfile(os.path.join(shipped, 'requirements.txt'))
        assert not os.path.exists(os.path.join(shipped, 'Makefile')), 'the README says the Makefile is a checkout thing'
        # the documented requirements, with the README's pip line, from the installed collection's requirements.txt
        pip = run(steps['pip'], cwd=shipped, env=env)
        assert pip.returncode == 0, pip.stdout + pip.stderr
        python = os.path.join(venv, 'bin', 'python')

        server.start()
        inventory = steps['inventory'].replace(README_URL, server.url)
        server.leak('newcomer')
        leaked = server.shm_path('/newcomer')
        assert 'newcomer' in server.system_regions() and os.path.exists(leaked)

        # as root: the report, the dry run, the cleanup
        root = workdir(base, 'as-root', pwd.getpwuid(0), inventory, python)
        report = run(steps['report'], cwd=root, env=env)
        assert report.returncode == 0, report.stdout[-4000:] + report.stderr[-2000:]
        assert os.path.isfile(os.path.join(root, 'shm-report', 'report.json')), report.stdout[-6000:]
        row = report_row(root, 'gpu-node-1')
        assert row['status'] == 'ok' and row['stale_regions'] == 1, row
        check = run(steps['check'], cwd=root, env=env)
        assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
        assert 'newcomer' in server.system_regions() and os.path.exists(leaked), 'check mode changed nothing'
        cleanup = run(steps['cleanup'], cwd=root, env=env)
        assert cleanup.returncode == 0, cleanup.stdout[-4000:] + cleanup.stderr[-2000:]
        assert 'newcomer' not in server.system_regions() and not os.path.exists(leaked)

        # as nobody, become turned off as the README says: a clear failure, nothing touched
        server.leak('newcomer')
        home = os.path.join(base, 'home-nobody')
        os.mkdir(home, 0o700)
        os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
        unprivileged = workdir(base, 'as-nobody', NOBODY, inventory, python)
        # nobody's home in passwd is /nonexistent: Ansible's remote tmp goes where a real user's home would be
        env = dict(env_of(venv, home, collections), ANSIBLE_REMOTE_TMP=f'{home}/.ansible/tmp')
        # the venv sits in the checkout's build/, which nobody may not reach (a clone made in `mktemp -d`)
        view, unview = tritonrig.reachable([venv], base)
        for step in ('report', 'cleanup'):
            res = run(f'{steps[step]} -e triton_become=false', cwd=unprivileged, env=env, prefix=view + SETPRIV)
            out = res.stdout + res.stderr
            assert res.returncode != 0, f'{step} as nobody without become succeeded:\n{out[-4000:]}'
            assert 'become: true' in out, f'{step}: the failure does not say to run as root:\n{out[-4000:]}'
            assert 'newcomer' in server.system_regions() and os.path.exists(leaked), (
                f'{step} as nobody touched the leak'
            )
        unview()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
