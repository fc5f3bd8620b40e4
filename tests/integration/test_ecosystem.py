"""The collection as the Ansible ecosystem sees it.

- The tarball ``ansible-galaxy collection build`` makes is clean, installs with
  ``ansible-galaxy collection install`` and its modules run from that install in a
  fresh virtualenv that has only ansible-core and the collection's requirements.txt.
- ``meta/execution-environment.yml`` is a valid ansible-builder 3 definition, and
  ansible-builder's introspection (what builds an EE that includes this collection)
  finds the collection's Python requirements.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile

import pytest
import yaml
from ansible_helpers import BIN, COLLECTIONS_PATH, PYTHON, REPO

ANSIBLE_CORE = 'ansible-core==2.21.5'
CACHE_DIR = os.environ.get('TRITONOPS_CACHE_DIR') or os.path.join(COLLECTIONS_PATH, 'cache')

# Things that must never ship in the tarball: planted in a copy before the build.
JUNK = [
    'tests/output/junit/result.xml',
    '.pytest_cache/v/cache/lastfailed',
    'tests/unit/.pytest_cache/v/cache/nodeids',
    'plugins/modules/__pycache__/triton_shm_info.cpython-312.pyc',
    'plugins/module_utils/stray.pyc',
    '.venv/bin/python',
    'build/ansible_collections/tritonops/shm/galaxy.yml',
    'bench-results/run.json',
    '.ansible/tmp/lint.json',
    'changelogs/.plugin-cache.yaml',
    'tritonops-shm-0.0.9.tar.gz',
]
SHIPPED_DIRS = ('plugins', 'roles', 'playbooks', 'meta', 'docs', 'changelogs', 'extensions')
# What only a checkout uses (galaxy.yml's build_ignore says why): never in the tarball.
CHECKOUT_ONLY = ('tests/', 'DEVELOPERS.md', 'docs/images/')


def _run(cmd, env=None, cwd=None, timeout=600):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False)
    assert proc.returncode == 0, '%s failed (rc %s):\n%s\n%s' % (
        ' '.join(cmd),
        proc.returncode,
        proc.stdout[-3000:],
        proc.stderr[-3000:],
    )
    return proc


def _requirement_lines(path):
    with open(path) as f:
        return [line.split('#', 1)[0].strip() for line in f if line.split('#', 1)[0].strip()]


def _source_files():
    """Files of the collection a user needs (what the tarball must carry)."""
    found = set()
    for top in SHIPPED_DIRS:
        for root, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != '__pycache__']
            for name in files:
                rel = os.path.relpath(os.path.join(root, name), REPO)
                if not name.endswith('.pyc') and rel != 'changelogs/.plugin-cache.yaml' and not _checkout_only(rel):
                    found.add(rel)
    return found | {'README.md', 'requirements.txt', 'CONTRIBUTING.md'}


def _checkout_only(member):
    return any(member == path.rstrip('/') or member.startswith(path) for path in CHECKOUT_ONLY)


def _forbidden(member):
    parts = member.split('/')
    return (
        set(parts) & {'.venv', 'build', '__pycache__', '.pytest_cache', '.git', 'bench-results', '.ansible', '.ci'}
        or member.startswith('tests/output')
        or member.endswith(('.pyc', '.tar.gz', '.plugin-cache.yaml'))
        or _checkout_only(member)
    )


def _fresh_venv(requirements):
    """A new virtualenv from the base interpreter (not the test venv, no system site-packages), cached."""
    base = _run([PYTHON, '-c', 'import sys; print(sys._base_executable)']).stdout.strip()
    key = hashlib.sha256(json.dumps([base, ANSIBLE_CORE, requirements]).encode()).hexdigest()[:12]
    venv = os.path.join(CACHE_DIR, 'install-test-venv-%s' % key)
    os.makedirs(CACHE_DIR, exist_ok=True)
    with open(os.path.join(CACHE_DIR, 'install-test-venv.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(venv, '.complete')):
            shutil.rmtree(venv, ignore_errors=True)
            _run([base, '-m', 'venv', venv])
            _run(
                [
                    os.path.join(venv, 'bin', 'python'),
                    '-m',
                    'pip',
                    'install',
                    '--quiet',
                    '--disable-pip-version-check',
                    ANSIBLE_CORE,
                ]
                + requirements,
                timeout=900,
            )
            open(os.path.join(venv, '.complete'), 'w').close()
    return venv


def _fresh_env(venv, collections_path, home):
    """Only the fresh venv on PATH, only the install on the collections path."""
    return {
        'PATH': os.path.join(venv, 'bin') + ':/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
        'HOME': home,
        'LANG': 'C.UTF-8',
        'ANSIBLE_COLLECTIONS_PATH': collections_path,
        'ANSIBLE_HOME': os.path.join(home, '.ansible'),
        'ANSIBLE_LOCALHOST_WARNING': 'False',
        'ANSIBLE_INVENTORY_UNPARSED_WARNING': 'False',
        'ANSIBLE_NOCOLOR': '1',
    }


@pytest.mark.timeout(1200)
def test_built_tarball_installs_and_runs(triton, tmp_path):
    # build from a copy of the collection with the usual junk lying around
    src = tmp_path / 'src' / 'ansible_collections' / 'tritonops' / 'shm'
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns('.git', '__pycache__', '.pytest_cache', 'output'))
    for rel in JUNK:
        os.makedirs(os.path.dirname(os.path.join(src, rel)) or str(src), exist_ok=True)
        with open(os.path.join(src, rel), 'w') as f:
            f.write('junk\n')
    out = tmp_path / 'dist'
    _run([os.path.join(BIN, 'ansible-galaxy'), 'collection', 'build', '--output-path', str(out), str(src)])
    with open(os.path.join(REPO, 'galaxy.yml')) as f:
        version = yaml.safe_load(f)['version']
    tarball = out / ('tritonops-shm-%s.tar.gz' % version)
    assert tarball.exists(), os.listdir(out)

    with tarfile.open(tarball) as tar:
        members = [m.name for m in tar.getmembers()]
    junk = [m for m in members if _forbidden(m)]
    assert not junk, 'junk in the tarball: %s' % junk
    missing = _source_files() - set(members)
    assert not missing, 'files missing from the tarball: %s' % sorted(missing)
    assert {'MANIFEST.json', 'FILES.json'} <= set(members)

    # a fresh venv with only ansible-core and the collection's own requirements.txt
    venv = _fresh_venv(_requirement_lines(os.path.join(REPO, 'requirements.txt')))
    vpython = os.path.join(venv, 'bin', 'python')
    probe = _run([vpython, '-c', 'import sys, ansible; print(sys.prefix); print(ansible.__file__)']).stdout.split()
    assert probe[0] == venv and probe[1].startswith(venv), probe

    installed = tmp_path / 'installed'
    home = tmp_path / 'home'
    home.mkdir()
    env = _fresh_env(venv, str(installed), str(home))
    _run(
        [
            os.path.join(venv, 'bin', 'ansible-galaxy'),
            'collection',
            'install',
            '--offline',
            '-p',
            str(installed),
            str(tarball),
        ],
        env=env,
    )
    listed = _run(
        [os.path.join(venv, 'bin', 'ansible-galaxy'), 'collection', 'list', 'tritonops.shm', '--format', 'json'],
        env=env,
    ).stdout
    assert json.loads(listed)[str(installed / 'ansible_collections')]['tritonops.shm']['version'] == version

    # ansible-doc renders the module from the install
    doc = json.loads(
        _run([os.path.join(venv, 'bin', 'ansible-doc'), '--json', 'tritonops.shm.triton_shm_info'], env=env).stdout
    )
    entry = doc['tritonops.shm.triton_shm_info']
    assert entry['doc']['filename'].startswith(str(installed))
    assert 'url' in entry['doc']['options']

    # the module runs from the install against a real server with a leaked region
    triton.leak('leaked_install', byte_size=2 << 20)
    proc = _run(
        [
            os.path.join(venv, 'bin', 'ansible'),
            'localhost',
            '-i',
            'localhost,',
            '-c',
            'local',
            '-o',
            '-e',
            'ansible_python_interpreter=%s' % vpython,
            '-m',
            'tritonops.shm.triton_shm_info',
            '-a',
            'url=%s' % triton.url,
        ],
        env=env,
        cwd=str(tmp_path),
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('localhost |')][-1]
    assert ' | SUCCESS => ' in line, proc.stdout
    result = json.loads(line.split(' => ', 1)[1])
    assert result['changed'] is False
    assert result['server']['pid'] == triton.pid
    assert result['shm_fs']['total_bytes'] == 64 << 20
    regions = {r['name']: r for r in result['system_regions']}
    assert regions['leaked_install']['state'] == 'stale'
    assert regions['leaked_install']['byte_size'] == 2 << 20
    assert result['summary']['stale_regions'] == 1


def _ee_definition():
    with open(os.path.join(REPO, 'meta', 'execution-environment.yml')) as f:
        return yaml.safe_load(f)


def test_execution_environment_definition_is_valid(tmp_path):
    definition = _ee_definition()
    assert definition['version'] == 3
    deps = definition['dependencies']
    # the dependency files are paths relative to the collection root (introspection resolves them there)
    files = {k: deps[k] for k in ('python', 'system') if k in deps}
    assert files.get('python') == 'requirements.txt'
    for rel in files.values():
        assert not os.path.isabs(rel) and os.path.isfile(os.path.join(REPO, rel)), rel

    # stand-alone build context, as documented in the file: the definition at the collection root
    root = tmp_path / 'ee'
    root.mkdir()
    shutil.copy(os.path.join(REPO, 'meta', 'execution-environment.yml'), root / 'execution-environment.yml')
    for rel in files.values():
        shutil.copy(os.path.join(REPO, rel), root / rel)
    context = tmp_path / 'context'
    _run(
        [
            os.path.join(BIN, 'ansible-builder'),
            'create',
            '-f',
            str(root / 'execution-environment.yml'),
            '-c',
            str(context),
            '--output-filename',
            'Containerfile',
        ]
    )

    containerfile = (context / 'Containerfile').read_text()
    assert 'ARG EE_BASE_IMAGE="%s"' % definition['images']['base_image']['name'] in containerfile
    assert deps['ansible_core']['package_pip'] in containerfile
    assert deps['ansible_runner']['package_pip'] in containerfile
    assert 'COPY _build/requirements.txt requirements.txt' in containerfile
    assert '--user-pip=requirements.txt' in containerfile
    wanted = _requirement_lines(os.path.join(REPO, 'requirements.txt'))
    assert wanted and _requirement_lines(context / '_build' / 'requirements.txt') == wanted
    if 'system' in files:
        assert 'COPY _build/bindep.txt bindep.txt' in containerfile


def test_builder_introspection_finds_the_collection_requirements():
    """What ansible-builder does for an EE whose galaxy requirements include tritonops.shm."""
    proc = _run([os.path.join(BIN, 'ansible-builder'), 'introspect', COLLECTIONS_PATH])
    data = yaml.safe_load(proc.stdout)
    ours = [line.split('#', 1)[0].strip() for line in data['python'] if line.endswith('from collection tritonops.shm')]
    assert ours == _requirement_lines(os.path.join(REPO, 'requirements.txt'))
    assert not [line for line in data['system'] if 'tritonops.shm' in line]
