"""The fleet playbooks on every supported controller (issue 44, goal 1), installed from the built tarball.

ansible-core 2.16 (the enterprise automation platform's floor; ``make integration`` builds build/venv-2.16 and exports
its bin directory as TRITONOPS_CORE_216) and the newest (the venv's). Each installs the collection tarball that
``ansible-galaxy collection build`` makes of this checkout into a collections path of its own, then runs, against a
real Triton 2.51 with a live and a killed client: the report, the cleanup in check mode (nothing changes), the cleanup
(the killed client's region and file go, the live one stays) and the cleanup again (changed=0). Before, 2.16 failed the
cleanup at the role's argument check (``shm_cleanup_server_pid`` rendered as a string) and the collection said it
needs 2.19.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import ansible_helpers
import pytest

MIB = 1 << 20
COLLECTION = os.path.join(ansible_helpers.COLLECTIONS_PATH, 'ansible_collections', 'tritonops', 'shm')
CORES = {'2.16': os.environ.get('TRITONOPS_CORE_216'), 'newest': os.path.dirname(ansible_helpers.PYTHON)}


@pytest.fixture(scope='module')
def tarball(tmp_path_factory):
    out = tmp_path_factory.mktemp('tarball')
    subprocess.run(
        [os.path.join(CORES['newest'], 'ansible-galaxy'), 'collection', 'build', COLLECTION, '--output-path', str(out)],
        check=True,
        capture_output=True,
    )
    (name,) = os.listdir(out)
    return os.path.join(str(out), name)


def _recap(stdout: str, host: str) -> dict:
    found = re.search(rf'^{host}\s+: (.*)$', stdout, re.M)
    assert found, stdout[-3000:]
    return {k: int(v) for k, v in re.findall(r'(\w+)=(\d+)', found.group(1))}


@pytest.mark.parametrize('core', sorted(CORES))
def test_the_fleet_playbooks_on_each_controller_from_the_tarball(core, tarball, make_triton, tmp_path):
    bindir = CORES[core]
    assert bindir and os.path.exists(os.path.join(bindir, 'ansible-playbook')), (
        f'ansible-core {core} is not installed: `make integration` builds build/venv-2.16 (TRITONOPS_CORE_216={bindir})'
    )
    collections = tmp_path / 'collections'
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(collections),  # this copy only, not the checkout's build
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH='false',
        ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
        ANSIBLE_NOCOLOR='1',
    )
    subprocess.run(
        [os.path.join(bindir, 'ansible-galaxy'), 'collection', 'install', '--force', tarball, '-p', str(collections)],
        check=True,
        capture_output=True,
        env=env,
    )
    assert os.path.exists(collections / 'ansible_collections' / 'tritonops' / 'shm' / 'MANIFEST.json')
    version = subprocess.run(
        [os.path.join(bindir, 'ansible-playbook'), '--version'], capture_output=True, text=True, check=True
    )
    assert (core == 'newest') or f'core {core}.' in version.stdout, version.stdout
    server = make_triton(models=(), shm_size='32m')
    live = server.client('live', byte_size=MIB)
    server.leak('dead', byte_size=2 * MIB)
    inventory = tmp_path / 'inventory.yml'
    host = {
        'ansible_connection': 'local',
        'ansible_python_interpreter': ansible_helpers.PYTHON,  # the modules' requirements are there
        'triton_url': server.url,
    }
    inventory.write_text(json.dumps({'all': {'children': {'triton': {'hosts': {'t1': host}}}}}))

    def play(name, *extra):
        cmd = [os.path.join(bindir, 'ansible-playbook'), '-i', str(inventory), f'tritonops.shm.{name}', *extra]
        cmd += ['-e', f'report_dir={tmp_path / "report"}', '-e', 'prometheus_textfile_dir=']
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, (core, name, proc.stdout[-4000:], proc.stderr[-2000:])
        assert 'does not support Ansible version' not in proc.stderr, proc.stderr
        return _recap(proc.stdout, 't1')

    play('report')
    report = json.loads((tmp_path / 'report' / 'report.json').read_text())
    (row,) = [r for r in report['hosts'] if r['host'] == 't1'] if 'hosts' in report else [report]
    assert 'dead' in json.dumps(row), json.dumps(report)[:2000]
    before = (sorted(server.system_regions()), sorted(server.shm_files()))
    assert play('cleanup', '--check')['failed'] == 0
    assert (sorted(server.system_regions()), sorted(server.shm_files())) == before, 'check mode changed something'
    first = play('cleanup')
    assert first['changed'] >= 1 and sorted(server.system_regions()) == ['live'], first
    assert 'dead' not in server.shm_files() and live.alive
    assert play('cleanup')['changed'] == 0
