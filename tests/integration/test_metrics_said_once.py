"""Metrics off where nobody collects them (issue 44, goal 9), on a real fleet.

Decision: the report and cleanup playbooks keep writing the node_exporter textfiles by default, into the default
directory, where it exists. Where it does not (a host without node_exporter), the module call writes nothing and
warns nothing (metrics_dir_missing: skip); the fleet table says it once for the run, naming the hosts. A directory the
user names (prometheus_textfile_dir) that is missing still warns on each host: they asked for it.
"""

from __future__ import annotations

import json
import os

import pytest
from ansible_helpers import PYTHON, ansible_playbook

DEFAULT_DIR = '/var/lib/node_exporter/textfile_collector'


def warnings_of(res) -> list:
    return [w for host in ('triton1', 'triton2') for _n, r in res.tasks(host) for w in r.get('warnings') or ()]


@pytest.mark.skipif(os.path.lexists(DEFAULT_DIR), reason=f'{DEFAULT_DIR} exists on this machine')
def test_a_fleet_without_node_exporter_is_told_once_not_warned_per_host(fleet, tmp_path):
    hosts = {
        s.name: dict(ansible_connection='local', ansible_python_interpreter=PYTHON, triton_url=s.url)
        for s in fleet.servers
    }
    inv = {'all': {'children': {'triton': {'hosts': hosts}}}}
    for playbook, task in (
        ('tritonops.shm.report', "Show the fleet's shared memory"),
        ('tritonops.shm.cleanup', "Show the fleet's cleanup"),
    ):
        res = ansible_playbook(playbook, inventory=inv)
        assert res.rc == 0, res
        assert not [w for w in warnings_of(res) if 'metrics' in w or DEFAULT_DIR in w], warnings_of(res)
        lines = res.task(task)['msg']
        said = [line for line in lines if line.startswith('no metrics written')]
        assert said == [
            f'no metrics written on 2 host(s) (triton1, triton2): {DEFAULT_DIR} does not exist on this host; set '
            "prometheus_textfile_dir to the node_exporter textfile directory, or '' to stop looking for one"
        ], json.dumps(lines, indent=1)

    missing = str(tmp_path / 'not-there')
    res = ansible_playbook('tritonops.shm.report', inventory=inv, extra_vars={'prometheus_textfile_dir': missing})
    assert res.rc == 0, res
    assert len([w for w in warnings_of(res) if missing in w]) == 2  # asked for: warned on each host
    assert not [line for line in res.task("Show the fleet's shared memory")['msg'] if line.startswith('no metrics')]
