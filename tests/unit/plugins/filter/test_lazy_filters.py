"""A filter file imports none of the collection's code; each filter imports its own when first called (issue 41, goal 7).

ansible-core loads every filter file of the collection in every worker that looks up one of its filters, so what the
filter files import at the top is paid by every task that names a collection filter (plugin_utils/lazy.py).
"""

from __future__ import annotations

import glob
import importlib
import json
import os

import pytest

from ansible_collections.tritonops.shm.plugins.filter.shm_cleanup import FilterModule as CleanupFilters
from ansible_collections.tritonops.shm.plugins.plugin_utils.lazy import lazy
from ansible_collections.tritonops.shm.plugins.plugin_utils.report.cleanup_record import shm_list
from ansible_collections.tritonops.shm.tests.unit.fresh import fresh_python

FILTERS = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'plugins', 'filter')
PACKAGE = 'ansible_collections.tritonops.shm.plugins.'
NAMES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(FILTERS, '*.py')))


def _filters() -> dict:
    out = {}
    for name in NAMES:
        out.update(importlib.import_module(f'{PACKAGE}filter.{name}').FilterModule().filters())
    return out


def test_every_lazy_filter_names_a_function_that_exists():
    lazies = {name: f for name, f in _filters().items() if hasattr(f, 'target')}
    assert len(lazies) > 20
    for name, f in lazies.items():
        assert callable(f.target()), name
        assert f.target().__name__ == f.__name__, name


def test_no_lazy_filter_needs_an_attribute_the_wrapper_would_hide():
    """ansible-core reads accept_args_markers and accept_lazy_markers from a filter function, Jinja jinja_pass_arg
    (pass_context and the like): the lazy wrapper has none of them, so a function that sets one must not be lazy."""
    for name, f in _filters().items():
        if hasattr(f, 'target'):
            marks = {'accept_args_markers', 'accept_lazy_markers', 'jinja_pass_arg'} & set(vars(f.target()))
            assert not marks, f'{name}: {sorted(marks)} would be lost behind lazy(): map the function itself'


def test_loading_every_filter_file_imports_none_of_the_collections_code():
    # a fresh interpreter, as a worker that looks a filter up: what the files import, not what earlier tests did
    code = (
        'import importlib, json, sys\n'
        f'for name in {NAMES!r}:\n'
        f'    importlib.import_module({PACKAGE!r} + "filter." + name).FilterModule().filters()\n'
        f'print(json.dumps(sorted(m for m in sys.modules if m.startswith({PACKAGE!r}))))\n'
    )
    out = fresh_python(code)
    loaded = [m for m in json.loads(out) if not m.startswith(PACKAGE + 'filter')]
    assert loaded == [PACKAGE + 'plugin_utils', PACKAGE + 'plugin_utils.lazy']


def test_a_lazy_filter_gives_what_its_function_gives_and_its_errors():
    f = CleanupFilters().filters()['shm_list']
    assert f('a, b') == shm_list('a, b') == ['a', 'b']
    assert f.__name__ == 'shm_list'
    broken = lazy('plugin_utils.report.cleanup_record', 'no_such_filter')
    with pytest.raises(AttributeError, match='no_such_filter'):
        broken('x')
