"""The node agent's execution-environment definition (docs/ee/execution-environment.yml), checked with
``ansible-builder create``: the build context it writes. No base image can be pulled here, so nothing is built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
EE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), 'docs', 'ee', 'execution-environment.yml')
BUILDER = os.path.join(os.path.dirname(sys.executable), 'ansible-builder')


def test_ansible_builder_creates_the_agents_build_context(tmp_path):
    work = tmp_path / 'ee'
    work.mkdir()
    shutil.copy(EE, work)
    (work / 'tritonops-shm-0.2.0.tar.gz').write_bytes(b'the collection tarball (ansible-galaxy collection build)')
    context = tmp_path / 'context'
    proc = subprocess.run(
        [BUILDER, 'create', '-f', 'execution-environment.yml', '-c', str(context)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    containerfile = (context / 'Containerfile').read_text()
    assert (
        'FROM quay.io/fedora/fedora-minimal:41'
        in containerfile.replace('$EE_BASE_IMAGE', 'quay.io/fedora/fedora-minimal:41')
        or 'quay.io/fedora/fedora-minimal:41' in containerfile
    )
    assert 'ansible-galaxy collection install --offline -p /usr/share/ansible/collections' in containerfile
    assert containerfile.rstrip().splitlines()[-3] == 'USER root'
    assert (context / '_build' / 'collections' / 'tritonops-shm-0.2.0.tar.gz').exists()
    requirements = (context / '_build' / 'requirements.txt').read_text()
    assert 'requests' in requirements and 'jmespath' in requirements


def test_the_definition_is_version_3():
    with open(EE) as f:
        definition = yaml.safe_load(f)
    assert definition['version'] == 3
    assert definition['dependencies']['ansible_core']['package_pip'].startswith('ansible-core>=2.19')
