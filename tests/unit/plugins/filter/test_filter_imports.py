"""The import rule of the filter and test plugins (CONTRIBUTING.md, "Imports"), checked on the source.

Every Ansible worker imports every filter file of the collection, so a filter's imports are paid on every task. A
filter or test plugin imports the standard library, ansible, what ansible-core itself requires (jinja2, yaml), the
collection's plugin_utils (the code a filter adapts: the same rule holds for them) and its standard-library-only
module_utils; never another filter (issue 35: shared code lives in plugin_utils): the module_utils it reaches import
the standard library and other such module_utils, nothing else (never requests, grpc or tritonclient). Every import
statement counts, at the top, in a function or under try.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

PLUGINS = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'plugins')
PREFIX = 'ansible_collections.tritonops.shm.plugins.'
CORE = {'ansible', 'jinja2', 'yaml'}  # ansible-core and what it requires
STDLIB = set(sys.stdlib_module_names) | {'__future__'}


def _imports(path: str) -> list[tuple[str, int]]:
    """(module, line) of every import statement in a file; a relative import as '.' + its module."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    out = []
    # a filter's code named by plugin_utils.lazy.lazy(MODULE, name): MODULE a string or a module-level name bound to one
    strings = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'lazy' and node.args:
            arg = node.args[0]
            module = arg.value if isinstance(arg, ast.Constant) else strings.get(getattr(arg, 'id', ''), '?')
            out.append((PREFIX + module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append(('.' * node.level + (node.module or ''), node.lineno))
            elif node.module == PREFIX + 'filter' or node.module.startswith(
                (PREFIX + 'module_utils', PREFIX + 'plugin_utils')
            ):
                # from ...module_utils[.package] import x: x may be a module of the package or a name in the module
                out += [(f'{node.module}.{a.name}', node.lineno) for a in node.names]
            else:
                out.append((node.module, node.lineno))
    return out


def _is_file(plugins: str, kind: str, parts: list[str]) -> bool:
    return os.path.isfile(os.path.join(plugins, kind, *parts[:-1], parts[-1] + '.py'))


def violations(plugins: str) -> list[str]:
    """Every import of a filter or test plugin, or of a module_utils one reaches, that breaks the rule."""
    found = []
    seen = set()

    def visit(kind: str, dotted: str, via: str) -> None:
        # the longest leading part of the dotted name that is a file: a module of a layer's subpackage or of the top
        parts = dotted.split('.')
        name = next(('/'.join(parts[:n]) for n in range(len(parts), 0, -1) if _is_file(plugins, kind, parts[:n])), '')
        path = os.path.join(plugins, kind, name + '.py')
        if (kind, name) in seen or not name:
            return
        seen.add((kind, name))
        for module, line in _imports(path):
            where = f'plugins/{kind}/{name}.py:{line}'
            top = module.split('.')[0]
            if module.startswith('.'):
                found.append(f'{where}: relative import {module!r}{via}')
            elif module.startswith(PREFIX + 'module_utils.'):
                visit('module_utils', module[len(PREFIX + 'module_utils.') :], f' (through {where})')
            elif module.startswith(PREFIX + 'plugin_utils.') and kind != 'module_utils':
                visit('plugin_utils', module[len(PREFIX + 'plugin_utils.') :], f' (through {where})')
            elif module.startswith(PREFIX + 'filter.'):
                found.append(
                    f'{where}: imports the filter {module!r}{via} (shared code lives in plugins/plugin_utils/)'
                )
            elif top in STDLIB:
                continue
            elif kind != 'module_utils' and top in CORE:
                continue
            else:
                found.append(f'{where}: imports {module!r}{via}')

    for kind in ('filter', 'test'):
        for file in sorted(os.listdir(os.path.join(plugins, kind))):
            if file.endswith('.py') and file != '__init__.py':
                visit(kind, file[:-3], '')
    return found


def test_filters_import_only_the_standard_library_ansible_and_pure_module_utils():
    assert violations(PLUGINS) == []


def _tree(tmp_path, files: dict) -> str:
    for rel, text in files.items():
        path = tmp_path / 'plugins' / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for kind in ('filter', 'test', 'module_utils', 'plugin_utils'):
        (tmp_path / 'plugins' / kind).mkdir(parents=True, exist_ok=True)
    return str(tmp_path / 'plugins')


@pytest.mark.parametrize(
    'files, wanted',
    [
        ({'filter/f.py': 'import requests\n'}, "plugins/filter/f.py:1: imports 'requests'"),
        (
            {'filter/f.py': 'def f():\n    try:\n        import grpc\n    except ImportError:\n        pass\n'},
            "plugins/filter/f.py:3: imports 'grpc'",
        ),
        (
            {
                'filter/f.py': f'from {PREFIX}module_utils import m\n',
                'module_utils/m.py': 'import os\nimport requests\n',
            },
            "plugins/module_utils/m.py:2: imports 'requests' (through plugins/filter/f.py:1)",
        ),
        (
            {
                'filter/f.py': f'from {PREFIX}module_utils.a import x\n',
                'module_utils/a.py': f'from {PREFIX}module_utils.b import y\n',
                'module_utils/b.py': 'from ansible.module_utils.basic import AnsibleModule\n',
            },
            "plugins/module_utils/b.py:1: imports 'ansible.module_utils.basic' (through plugins/module_utils/a.py:1)",
        ),
        ({'test/t.py': 'from ..module_utils import m\n'}, "plugins/test/t.py:1: relative import '..module_utils'"),
        (
            {'filter/f.py': f'from {PREFIX}filter.g import h\n', 'filter/g.py': 'import re\n'},
            f"plugins/filter/f.py:1: imports the filter '{PREFIX}filter.g' (shared code lives in plugins/plugin_utils/)",
        ),
        (
            {'filter/f.py': f'from {PREFIX}plugin_utils.u import h\n', 'plugin_utils/u.py': 'import grpc\n'},
            "plugins/plugin_utils/u.py:1: imports 'grpc' (through plugins/filter/f.py:1)",
        ),
        (
            {'filter/f.py': "_CODE = 'plugin_utils.u'\nF = lazy(_CODE, 'h')\n", 'plugin_utils/u.py': 'import grpc\n'},
            "plugins/plugin_utils/u.py:1: imports 'grpc' (through plugins/filter/f.py:2)",
        ),
        (
            {'filter/f.py': "F = lazy('module_utils.m', 'h')\n", 'module_utils/m.py': 'import requests\n'},
            "plugins/module_utils/m.py:1: imports 'requests' (through plugins/filter/f.py:1)",
        ),
    ],
)
def test_the_check_finds_each_kind_of_violation(tmp_path, files, wanted):
    assert violations(_tree(tmp_path, files)) == [wanted]


def test_the_check_allows_what_the_rule_allows(tmp_path):
    files = {
        'filter/f.py': f'import json\nfrom jinja2 import Environment\nimport yaml\nfrom ansible.errors import AnsibleFilterError\n'  # noqa: E501
        f'from {PREFIX}plugin_utils.g import h\nfrom {PREFIX}module_utils import m\n',
        'plugin_utils/g.py': 'import re\nimport yaml\n',
        'module_utils/m.py': 'import re\n',
    }
    assert violations(_tree(tmp_path, files)) == []
