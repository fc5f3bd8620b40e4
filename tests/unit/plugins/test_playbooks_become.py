"""The fleet playbooks become root by default, and -e triton_become=false turns it off (issue 29).

Every play of a fleet playbook that runs on the Triton hosts says ``become: "{{ triton_become | default(true) }}"``;
plays on the controller (the fleet table, the report files) do not become.
"""

from __future__ import annotations

import os

import pytest
import yaml

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BECOME = '{{ triton_become | default(true) }}'
FLEET = ('report.yml', 'cleanup.yml', 'deploy.yml', 'node_agent.yml')


def plays(name: str) -> list[dict]:
    with open(os.path.join(COLLECTION, 'playbooks', name)) as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize('name', FLEET)
def test_the_plays_on_the_triton_hosts_become_root_by_default(name):
    on_hosts = [p for p in plays(name) if p['hosts'] != 'localhost' and not p['name'].startswith('Fail the hosts')]
    assert on_hosts and all(p.get('become') == BECOME for p in on_hosts), [
        (p['name'], p.get('become')) for p in on_hosts
    ]


@pytest.mark.parametrize('name', FLEET)
def test_plays_on_the_controller_never_become(name):
    assert all('become' not in p for p in plays(name) if p['hosts'] == 'localhost')
