"""One way to run a module (issue 35, goal 6): operation.Operation's steps in one order, check mode as one branch, the
result from an outcome object, also after a failure part-way; every module runs through base.run_operation."""

from __future__ import annotations

import ast
import contextlib
import glob
import os

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.run import operation
from ansible_collections.tritonops.shm.tests.unit.fresh import fresh_python

MODULES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'plugins', 'modules')


class Recorder(operation.Operation):
    """An operation that records each step; execute() fails after its first step when told to."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.held = False
        self.fail = fail

    def check(self) -> None:
        self.calls.append('check')

    def read(self) -> str:
        self.calls.append('read')
        return 'reading'

    @contextlib.contextmanager
    def hold(self, reading):
        self.held = True
        try:
            yield reading
        finally:
            self.held = False
            self.calls.append('release')

    def plan(self, reading):
        self.calls.append(f'plan({reading})')
        self.outcome = {'done': []}
        return ['a', 'b']

    def preview(self, plan):
        self.calls.append('preview')
        self.outcome['done'] = list(plan)
        return self.outcome

    def execute(self, plan):
        self.calls.append('execute')
        for step in plan:
            self.outcome['done'].append(step)
            if self.fail:
                raise TritonError(f'{step} failed')
        return self.outcome

    def result(self, outcome, finished=True):
        return {'changed': bool(outcome['done']), 'done': outcome['done'], 'finished': finished}


@pytest.mark.parametrize('check_mode', [False, True])
def test_the_steps_run_in_one_order_and_check_mode_only_previews(check_mode):
    op = Recorder()
    seen_held = []
    result = operation.run_steps(op, check_mode, finish=lambda r: seen_held.append(op.held) or {'extra': 1})
    step = 'preview' if check_mode else 'execute'
    assert op.calls == ['check', 'read', 'plan(reading)', step, 'release']
    assert result == {'changed': True, 'done': ['a', 'b'], 'finished': True, 'extra': 1}
    assert seen_held == [True]  # finish (the metrics textfiles) runs while what read() took is held


def test_a_failure_part_way_reports_the_work_done_from_the_outcome():
    op = Recorder(fail=True)
    with pytest.raises(TritonError):
        operation.run_steps(op, False)
    assert op.calls[-1] == 'release'
    assert op.result(op.outcome, finished=False) == {'changed': True, 'done': ['a'], 'finished': False}


def test_region_ops_never_executes_in_check_mode():
    from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import RegionOps

    ops = RegionOps(object(), {'kind': 'system'}, check_mode=True)
    with pytest.raises(RuntimeError, match='never executes'):
        ops.execute(None)


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(MODULES, '*.py'))), ids=os.path.basename)
def test_every_module_runs_through_run_operation(path):
    """main() hands an Operation to base.run_operation; no module calls exit_json itself. A module file without main()
    is the documentation of an action of the same name (plugins/action/), which runs on the controller."""
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    if not any(isinstance(node, ast.FunctionDef) and node.name == 'main' for node in tree.body):
        action = os.path.join(os.path.dirname(MODULES), 'action', os.path.basename(path))
        assert os.path.isfile(action), f'{os.path.basename(path)}: no main() and no action plugin of that name'
        return
    calls = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, 'id', None)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    assert 'run_operation' in calls, f'{os.path.basename(path)}: main() does not call base.run_operation'
    assert 'exit_json' not in calls and 'run_module_main' not in calls


def test_the_run_protocol_imports_no_transport():
    """operation.py, the protocol every executor imports, pulls in no transport, metrics or shm directory code: run in
    a fresh interpreter, importing it loads none of them (nor Ansible)."""
    code = (
        'import sys\n'
        'from ansible_collections.tritonops.shm.plugins.module_utils.run import operation\n'
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('ansible', 'grpc', 'http.client')))))\n"
    )
    out = fresh_python(code)
    loaded = set(out.split())
    assert loaded <= {
        'ansible_collections',
        'ansible_collections.tritonops',
        'ansible_collections.tritonops.shm',
        'ansible_collections.tritonops.shm.plugins',
        'ansible_collections.tritonops.shm.plugins.module_utils',
        'ansible_collections.tritonops.shm.plugins.module_utils.run',
        'ansible_collections.tritonops.shm.plugins.module_utils.run.operation',
    }, loaded


def test_each_executor_sets_what_its_shm_directory_work_declares():
    """file_ops declares the attributes its work reads (ShmDirWork for every run, RegionFileWork for a region run): a
    class using it that does not set one fails here, not in the middle of a cleanup."""
    from ansible_collections.tritonops.shm.plugins.module_utils.run.file_ops import RegionFileWork, ShmDirWork
    from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import RegionOps
    from ansible_collections.tritonops.shm.plugins.module_utils.run.sweep import Sweep

    shm_dir = {'shm_dir': '/dev/shm'}
    for op, work in ((RegionOps(None, shm_dir), RegionFileWork), (Sweep(shm_dir), ShmDirWork)):
        declared = {n for klass in work.__mro__ for n in getattr(klass, '__annotations__', {})}
        assert declared and isinstance(op, work)
        assert [n for n in sorted(declared) if not hasattr(op, n)] == [], type(op).__name__
