"""The node agent's execution environment and the rulebooks' decision environment (docs/ee/), checked with
``ansible-builder create`` (the build context each writes) and by running the build's collection step here: the
``ansible-galaxy collection install -r requirements.yml`` of its galaxy stage on the context, with a tarball built from
this checkout, and ansible-builder's own introspection of what that installed. No base image can be pulled here, so
nothing is built."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from typing import NamedTuple

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EE_DIR = os.path.join(ROOT, 'docs', 'ee')
EE = os.path.join(EE_DIR, 'execution-environment.yml')
DE = os.path.join(EE_DIR, 'decision-environment.yml')
BIN = os.path.dirname(sys.executable)
BASE = 'registry.access.redhat.com/ubi9/ubi-minimal:latest'

with open(os.path.join(ROOT, 'galaxy.yml')) as _f:
    VERSION = yaml.safe_load(_f)['version']


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, **kwargs)
    assert proc.returncode == 0, f'{cmd} failed:\n{proc.stdout}\n{proc.stderr}'
    return proc


def galaxy_install(requirements: str, installed, cwd: str | None = None) -> str:
    """``ansible-galaxy collection install --offline -r requirements`` into ``installed``, alone on the collections path
    (neither make units' build/ nor sys.path counts as installed): the path of tritonops.shm there."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env.update(
        ANSIBLE_GALAXY_DISABLE_GPG_VERIFY='1',
        ANSIBLE_COLLECTIONS_PATH=str(installed),
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH='false',
    )
    galaxy = os.path.join(BIN, 'ansible-galaxy')
    proc = run(
        [galaxy, 'collection', 'install', '--offline', '-r', requirements, '-p', str(installed)], cwd=cwd, env=env
    )
    collection = os.path.join(str(installed), 'ansible_collections', 'tritonops', 'shm')
    assert os.path.exists(os.path.join(collection, 'MANIFEST.json')), proc.stdout
    return collection


def _load(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope='module')
def tarball(tmp_path_factory) -> str:
    """The collection tarball of this checkout, as `ansible-galaxy collection build` writes it next to the definitions."""
    out = tmp_path_factory.mktemp('tarball')
    run([os.path.join(BIN, 'ansible-galaxy'), 'collection', 'build', ROOT, '--output-path', str(out)])
    (built,) = glob.glob(str(out / 'tritonops-shm-*.tar.gz'))
    return built


def _create(definition: str, tarball: str, tmp_path) -> str:
    """``ansible-builder create`` in a copy of docs/ee/ with the tarball beside the definition: the build context."""
    work = tmp_path / 'ee'
    work.mkdir()
    for name in os.listdir(EE_DIR):
        shutil.copy(os.path.join(EE_DIR, name), work)
    shutil.copy(tarball, work)
    context = tmp_path / 'context'
    run(
        [os.path.join(BIN, 'ansible-builder'), 'create', '-f', os.path.basename(definition), '-c', str(context)],
        cwd=work,
    )
    return str(context)


def _galaxy_stage(context: str, tmp_path) -> str:
    """What the Containerfile's galaxy stage runs, in /build (the context's _build): the collections path it fills."""
    installed = tmp_path / 'usr-share-ansible-collections'
    galaxy_install('requirements.yml', installed, cwd=os.path.join(context, '_build'))
    return str(installed)


def _introspect(context: str, installed: str, tmp_path) -> tuple[str, str]:
    """ansible-builder's introspection (its builder stage) over the installed collections: the pip and bindep lists."""
    build = os.path.join(context, '_build')
    pip, bindep = tmp_path / 'requirements.txt', tmp_path / 'bindep.txt'
    cmd = [sys.executable, os.path.join(build, 'scripts', 'introspect.py'), 'introspect', installed]
    for option, name in (('--user-pip', 'requirements.txt'), ('--user-bindep', 'bindep.txt')):
        if os.path.exists(os.path.join(build, name)):
            cmd.append(f'{option}={os.path.join(build, name)}')
    cmd += [f'--write-pip={pip}', f'--write-bindep={bindep}']
    run(cmd)
    return (pip.read_text() if pip.exists() else ''), (bindep.read_text() if bindep.exists() else '')


class Built(NamedTuple):
    """What a definition's build would contain, short of pulling the base image."""

    containerfile: str
    collections: str  # the galaxy stage's /usr/share/ansible/collections
    pip: str  # the introspection's Python requirements
    bindep: str  # and system packages


def _build(definition: str, tarball: str, tmp_path) -> Built:
    context = _create(definition, tarball, tmp_path)
    with open(os.path.join(context, 'Containerfile')) as f:
        containerfile = f.read()
    assert f'ARG EE_BASE_IMAGE="{BASE}"' in containerfile
    assert 'ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml' in containerfile
    assert os.path.exists(os.path.join(context, '_build', 'collections', os.path.basename(tarball)))
    installed = _galaxy_stage(context, tmp_path)
    return Built(containerfile, installed, *_introspect(context, installed, tmp_path))


def test_the_agents_image_installs_the_collection_and_its_python_needs(tarball, tmp_path):
    built = _build(EE, tarball, tmp_path)
    assert built.containerfile.rstrip().splitlines()[-3] == 'USER root'
    # the collection's meta/execution-environment.yml brings requirements.txt: nothing is listed twice by hand
    assert 'jmespath>=0.10  # from collection tritonops.shm' in built.pip
    assert 'requests>=2.25  # from collection tritonops.shm' in built.pip
    assert 'procps-ng [platform:rpm]' in built.bindep


def test_the_decision_environment_has_ansible_rulebook_java_17_and_the_collection(tarball, tmp_path):
    built = _build(DE, tarball, tmp_path)
    assert 'ENV JAVA_HOME=/usr/lib/jvm/jre-17-openjdk' in built.containerfile
    assert 'RUN ansible-rulebook --version' in built.containerfile
    assert os.path.isdir(
        os.path.join(built.collections, 'ansible_collections', 'tritonops', 'shm', 'extensions', 'eda')
    )
    assert 'ansible-rulebook>=1.1,<2' in built.pip
    assert 'java-17-openjdk-headless [platform:rpm]' in built.bindep


def test_the_rulebooks_need_no_collection_but_this_one():
    """The decision environment installs tritonops.shm only: every source, filter and action collection the rulebooks
    name is this one or ansible-rulebook's own eda.builtin."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, 'extensions', 'eda', 'rulebooks', '*.yml')):
        for ruleset in _load(path):
            for source in ruleset['sources']:
                names |= {k for k in source if '.' in k}
                names |= {k for f in source.get('filters') or [] for k in f}
            for rule in ruleset['rules']:
                actions = rule.get('actions') or [rule['action']]
                names |= {a.get('name', '') for action in actions for a in action.values() if isinstance(a, dict)}
    collections = {'.'.join(n.split('.')[:2]) for n in names if n.count('.') >= 2}
    assert collections and collections <= {'tritonops.shm', 'eda.builtin'}, collections


def test_both_definitions_are_version_3_on_a_supported_base_tagged_with_the_collections_version():
    requirements = _load(os.path.join(EE_DIR, 'requirements.yml'))
    assert requirements['collections'] == [{'name': f'collections/tritonops-shm-{VERSION}.tar.gz', 'type': 'file'}]
    for path in (EE, DE):
        definition = _load(path)
        assert definition['version'] == 3
        # UBI 9 (supported to 2032), never again a Fedora release that reaches its end of life within a year
        assert definition['images']['base_image']['name'] == BASE, path
        assert definition['dependencies']['galaxy'] == 'requirements.yml'
        assert definition['dependencies']['ansible_core']['package_pip'].startswith('ansible-core>=2.19')
    # the images' tags in the build commands of the three definitions (meta/'s is the stand-alone minimal EE)
    for path in (EE, DE, os.path.join(ROOT, 'meta', 'execution-environment.yml')):
        with open(path) as f:
            tags = set(re.findall(r' -t \S+:(\S+)', f.read()))
        assert tags == {VERSION}, (path, tags)
