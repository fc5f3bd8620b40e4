"""The layers hold: the pure rules import plain facts, never a module that reads or acts (issue 41, goal 3), and each
layer's subpackage imports only the layers above it in CONTRIBUTING's layout table (issue 41, goal 6).

Each rules module is imported alone, in a fresh interpreter, and what it pulled in is read from sys.modules:
an import added anywhere below it (directly or through another module) shows here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, facts

PACKAGE = 'ansible_collections.tritonops.shm.plugins.module_utils'
# the collection root: the directory that holds ansible_collections/
ROOT = os.path.abspath(os.path.join(os.path.dirname(facts.__file__), *(['..'] * 6)))

RULES = ('facts', 'classification', 'region_plan', 'results')  # in rules/
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
    """Every module a fresh interpreter has loaded after importing module_utils.rules.<module> alone."""
    done = subprocess.run(
        [sys.executable, '-I', '-c', PROBE, ROOT, f'{PACKAGE}.rules.{module}'],
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


# The layers, in the order of CONTRIBUTING's layout table: a module imports errors, its own layer and the layers
# before it, never one after it. Type annotations only (under TYPE_CHECKING) may name a later layer's types.
LAYERS = ('rules', 'wire', 'host', 'outputs', 'run')
MODULE_UTILS = os.path.join(ROOT, 'ansible_collections', 'tritonops', 'shm', 'plugins', 'module_utils')


def _runtime_imports(path: str) -> list:
    """(line, imported module) of every import that runs: those under ``if TYPE_CHECKING:`` are left out."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, 'id', None) == 'TYPE_CHECKING'
        for n in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            rest = node.module[len(PACKAGE) :].strip('.')
            found += [(node.lineno, f'{rest}.{a.name}'.strip('.')) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name[len(PACKAGE) :].strip('.')) for a in node.names if a.name.startswith(PACKAGE)
            ]
    return found


def layer_violations(base: str) -> list:
    """Every import of a module_utils module that reaches a later layer (or a module outside every layer)."""
    bad = []
    for layer in LAYERS:
        for name in sorted(os.listdir(os.path.join(base, layer))):
            if not name.endswith('.py'):
                continue
            for line, target in _runtime_imports(os.path.join(base, layer, name)):
                top = target.split('.')[0]
                if top == 'errors':
                    continue
                if top not in LAYERS or LAYERS.index(top) > LAYERS.index(layer):
                    bad.append(f'{layer}/{name}:{line} imports {target}')
    return bad


def test_every_module_is_in_a_layer():
    tops = {n for n in os.listdir(MODULE_UTILS) if not n.startswith(('_', '.'))}
    assert tops == {'errors.py', *LAYERS}, (
        'a module_utils file outside the layers: put it in one (CONTRIBUTING, Layout)'
    )


def test_a_layer_imports_only_the_layers_before_it():
    assert layer_violations(MODULE_UTILS) == []


def test_the_layer_check_catches_an_import_of_a_later_layer(tmp_path):
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / 'wire' / 'client.py').write_text(f'from {PACKAGE}.rules import records\n')
    (tmp_path / 'rules' / 'facts.py').write_text(
        f'from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {PACKAGE}.host.gpu import Evidence\n'
        f'from {PACKAGE}.wire.client import Client\n'
    )
    assert layer_violations(str(tmp_path)) == ['rules/facts.py:4 imports wire.client.Client']
