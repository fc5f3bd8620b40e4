"""The layers hold: the pure rules import plain facts, never a module that reads or acts (issue 41, goal 3).

Each rules module is imported alone, in a fresh interpreter, and what it pulled in is read from sys.modules:
an import added anywhere below it (directly or through another module) shows here.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils import classification, facts

PACKAGE = 'ansible_collections.tritonops.shm.plugins.module_utils'
# the collection root: the directory that holds ansible_collections/
ROOT = os.path.abspath(os.path.join(os.path.dirname(facts.__file__), *(['..'] * 5)))

RULES = ('facts', 'classification', 'region_plan', 'results')
# the modules that read (/proc, the shm directory, NVML, sockets, the server) or act: none of them below the rules
READERS = (
    'snapshot',
    'shm_fs',
    'holders',
    'procfs',
    'containers',
    'rootfs',
    'discovery',
    'authority',
    'gpu',
    'nvml',
    'runlock',
    'wedged',
    'servers',
    'triton_http',
    'triton_grpc',
    'triton_aio',
    'http_reader',
    'tls',
    'client',
    'connection',
    'base',
    'region_ops',
    'region_calls',
    'file_ops',
    'sweep',
    'backend_pool',
    'metrics',
    'outputs',
)
LOOKUPS = ('pwd', 'grp')  # users and groups are resolved at the edge (the module, the executor), never in a rule

PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
importlib.import_module(sys.argv[2])
print(json.dumps(sorted(sys.modules)))
"""


def imported_by(module: str) -> set:
    """Every module a fresh interpreter has loaded after importing module_utils.<module> alone."""
    done = subprocess.run(
        [sys.executable, '-I', '-c', PROBE, ROOT, f'{PACKAGE}.{module}'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


@pytest.mark.parametrize('module', RULES)
def test_a_rule_imports_no_reader(module):
    loaded = imported_by(module)
    ours = {name.rsplit('.', 1)[1] for name in loaded if name.startswith(PACKAGE + '.')}
    assert module in ours, 'the probe imported the module'
    assert not ours & set(READERS), f'{module} pulls in the I/O layer: {sorted(ours & set(READERS))}'
    assert not loaded & set(LOOKUPS), f'{module} pulls in user lookups: {sorted(loaded & set(LOOKUPS))}'


def test_the_snapshot_is_plain_data():
    """No descriptor and no lazy pin in the facts of a read: the executor holds the shm directory it acts through."""
    fields = {f.name for f in dataclasses.fields(facts.Snapshot)}
    assert 'pinned' not in fields and not hasattr(facts.Snapshot, 'shm')
    assert facts.Snapshot.__dataclass_params__.frozen


def test_the_rules_get_resolved_users():
    """Criteria takes uids: a user name is looked up at the edge (authority.client_uids), not by the rules."""
    params = inspect.signature(classification.Criteria.of).parameters
    assert 'client_uids' in params and 'client_users' not in params
    assert classification.Criteria.of(client_uids=[1000, 1000]).client_uids == frozenset([1000])
