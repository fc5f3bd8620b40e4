"""One source for the connection options: every copy agrees with base.connection_argument_spec().

``plugins/module_utils/run/base.py`` is the source: ``connection_argument_spec()`` (url, timeout, validate_certs, ca_path,
headers, client_cert, client_key), with ``shm_dir_argument_spec()`` (server_pid, shm_dir, clients_share_pid_namespace) and
``backend_argument_spec()`` (backend_patterns, client_users) for the modules of the action group. The copies, checked for names,
types and defaults where
they have them:
- the doc fragment tritonops.shm.triton (DOCUMENTATION, SHM_DIR, BACKEND);
- the shm_cleanup role: defaults (shm_cleanup_NAME), meta/argument_specs.yml, the module_defaults of tasks/main.yml;
- playbooks/cleanup.yml (role vars from the host variables triton_NAME) and playbooks/report.yml (module_defaults);
- the EDA source extensions/eda/plugins/event_source/triton_shm.py (its DOCUMENTATION; HTTP only: no server_pid,
  shm_dir or backend_patterns, and url is per server).
A failure names the copy and the option that drifted.
"""

from __future__ import annotations

import ast
import os
import re

import pytest
import yaml

from ansible_collections.tritonops.shm.plugins.doc_fragments.triton import ModuleDocFragment
from ansible_collections.tritonops.shm.plugins.module_utils.run.base import (
    backend_argument_spec,
    connection_argument_spec,
    shm_dir_argument_spec,
)

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLE = os.path.join(COLLECTION, 'roles', 'shm_cleanup')
EDA_SOURCE = os.path.join(COLLECTION, 'extensions', 'eda', 'plugins', 'event_source', 'triton_shm.py')

CONNECTION = connection_argument_spec()
# the connection and shm options of the doc fragment. What module_defaults of the action group can set is
# GROUP_WIDE, the options every member takes. client_users is not one:
# triton_backend_pool removes no file and refuses it (a group default of it failed the role's reload), so the
# role gives it to the two modules that judge files, each by name
PER_MODULE = ('client_users',)
GROUP = {**shm_dir_argument_spec(), **backend_argument_spec()}
GROUP_WIDE = {k: v for k, v in GROUP.items() if k not in PER_MODULE}
# a Jinja default as written in the playbooks
_LITERALS = {'none': None, 'true': True, 'false': False, '{}': {}, '[]': []}
_VAR = re.compile(r'^\{\{ (?P<var>[a-z_]+)(?: \| default\((?P<default>[^,)]*)(?P<omit_empty>, true)?\))? \}\}$')


def _load(*parts: str):
    with open(os.path.join(*parts), encoding='utf-8') as f:
        return yaml.safe_load(f)


def _default(spec: dict):
    return spec.get('default')


# an int option with no default: ansible-core 2.16 renders a null as '' (its role argument check then refuses it), so the
# role reads null, '' and 0 alike, "{{ (VAR | default(0, true) | int) or omit }}", and a playbook may pass 0 for null
_INT_OR_OMIT = re.compile(r'^\{\{ \((?P<var>\w+) \| default\(0, true\) \| int\) or omit \}\}$')


def _expression(copy: str, name: str, text: str) -> tuple[str, object, bool]:
    """(variable, its default, whether it has one) of "{{ VAR | default(X) }}"; default(omit) is the module's default."""
    int_null = _INT_OR_OMIT.match(str(text))
    if int_null and GROUP[name].get('type') == 'int' and _default(GROUP[name]) is None:
        return int_null.group('var'), None, True
    found = _VAR.match(str(text))
    assert found, f'{copy}: {name} is {text!r}, not "{{{{ VAR }}}}" or "{{{{ VAR | default(...) }}}}"'
    raw = found.group('default')
    if raw is None:
        return found.group('var'), None, False
    if raw == 'omit':
        return found.group('var'), _default(GROUP[name]), True
    value = _LITERALS[raw] if raw in _LITERALS else ast.literal_eval(raw)
    return found.group('var'), value, True


def _fragment_options() -> dict:
    options = {}
    for text in (ModuleDocFragment.DOCUMENTATION, ModuleDocFragment.SHM_DIR, ModuleDocFragment.BACKEND):
        options.update(yaml.safe_load(text)['options'])
    return options


def _eda_options() -> dict:
    tree = ast.parse(open(EDA_SOURCE, encoding='utf-8').read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, 'id', None) for t in node.targets] == ['DOCUMENTATION']:
            return yaml.safe_load(node.value.value)['options']
    raise AssertionError(f'{EDA_SOURCE} has no DOCUMENTATION')


def test_the_source_is_what_this_test_expects():
    """The names this test maps to role variables and host variables; a new option must be added to every copy."""
    assert list(CONNECTION) == ['url', 'timeout', 'validate_certs', 'ca_path', 'headers', 'client_cert', 'client_key']
    assert list(GROUP) == list(CONNECTION) + [
        'server_pid',
        'shm_dir',
        'clients_share_pid_namespace',
        'backend_patterns',
        'client_users',
    ]


@pytest.mark.parametrize('name', list(GROUP))
def test_doc_fragment(name):
    spec, doc = GROUP[name], _fragment_options().get(name)
    assert doc is not None, f'doc fragment tritonops.shm.triton: {name} is not documented'
    assert doc['type'] == spec['type'], f'doc fragment: {name} is {doc["type"]}, the argument spec says {spec["type"]}'
    assert doc.get('elements') == spec.get('elements'), f'doc fragment: elements of {name}'
    assert _default(doc) == _default(spec), (
        f'doc fragment: {name} defaults to {_default(doc)!r}, base to {_default(spec)!r}'
    )
    assert bool(doc.get('required')) == bool(spec.get('required')), f'doc fragment: required of {name}'


def test_doc_fragment_has_no_other_option():
    assert sorted(_fragment_options()) == sorted(GROUP)


@pytest.mark.parametrize('name', list(GROUP))
def test_role_defaults_and_argument_specs(name):
    spec, var = GROUP[name], f'shm_cleanup_{name}'
    defaults = _load(ROLE, 'defaults', 'main.yml')
    options = _load(ROLE, 'meta', 'argument_specs.yml')['argument_specs']['main']['options']
    assert var in options, f'meta/argument_specs.yml: {var} is missing'
    option = options[var]
    assert option['type'] == spec['type'], (
        f'meta/argument_specs.yml: {var} is {option["type"]}, base says {spec["type"]}'
    )
    assert option.get('elements') == spec.get('elements'), f'meta/argument_specs.yml: elements of {var}'
    assert bool(option.get('required')) == bool(spec.get('required')), f'meta/argument_specs.yml: required of {var}'
    if spec.get('required'):
        assert var not in defaults, f'defaults/main.yml: {var} is required and has no default'
        return
    assert var in defaults, f'defaults/main.yml: {var} is missing'
    assert defaults[var] == _default(spec), (
        f'defaults/main.yml: {var} is {defaults[var]!r}, base defaults to {_default(spec)!r}'
    )
    assert option.get('default') == _default(spec), (
        f'meta/argument_specs.yml: {var} defaults to {option.get("default")!r}'
    )


def _role_module_defaults() -> dict:
    block = _load(ROLE, 'tasks', 'main.yml')[0]
    return block['module_defaults']['group/tritonops.shm.triton']


def test_role_module_defaults_set_every_option_of_the_group():
    assert list(_role_module_defaults()) == list(GROUP_WIDE)


@pytest.mark.parametrize('module', ['triton_shm_info', 'triton_shm_region'])
def test_role_gives_client_users_to_the_modules_that_judge_files(module):
    defaults = _load(ROLE, 'tasks', 'main.yml')[0]['module_defaults']
    assert defaults[f'tritonops.shm.{module}']['client_users'] == '{{ shm_cleanup_client_users }}'
    assert 'client_users' not in defaults.get('tritonops.shm.triton_backend_pool', {})


@pytest.mark.parametrize('name', list(GROUP_WIDE))
def test_role_module_defaults(name):
    var, default, has_default = _expression('roles/shm_cleanup/tasks/main.yml', name, _role_module_defaults()[name])
    assert var == f'shm_cleanup_{name}'
    # a role variable is always defined: only omit (the module's own default) may stand for a null
    assert not has_default or default == _default(GROUP[name]), f'tasks/main.yml: {name} defaults to {default!r}'


def _cleanup_role_vars() -> dict:
    play = _load(COLLECTION, 'playbooks', 'cleanup.yml')[0]
    return play['roles'][0]['vars']


def _report_module_defaults() -> dict:
    play = _load(COLLECTION, 'playbooks', 'report.yml')[0]
    return play['tasks'][0]['module_defaults']['group/tritonops.shm.triton']


def _host_var(name: str) -> str:
    return f'triton_{name}'


# the role's own variables, not host variables of the playbooks: the report playbook takes them from the role's names
ROLE_ONLY = ('backend_patterns', 'client_users')
# (copy, the option's value there)
PLAYBOOK_COPIES = [
    ('playbooks/cleanup.yml', lambda: {k[len('shm_cleanup_') :]: v for k, v in _cleanup_role_vars().items()}),
    ('playbooks/report.yml', _report_module_defaults),
]


@pytest.mark.parametrize('copy, values', PLAYBOOK_COPIES, ids=[c[0] for c in PLAYBOOK_COPIES])
def test_playbooks(copy, values):
    values = values()
    expected = [n for n in GROUP if n not in ROLE_ONLY]
    assert [n for n in values if n in GROUP and n not in ROLE_ONLY] == expected, f'{copy}: the connection options'
    with open(os.path.join(COLLECTION, copy), encoding='utf-8') as f:
        header = f.read().split('\n- ')[0]
    for name in expected:
        var, default, has_default = _expression(copy, name, values[name])
        assert var == _host_var(name), f'{copy}: {name} comes from {var}, not {_host_var(name)}'
        assert var in header, f'{copy}: the header comment does not list {var}'
        spec = GROUP[name]
        if spec.get('required'):
            assert not has_default, f'{copy}: {var} is required and has no default'
        else:
            assert has_default, f'{copy}: {var} needs a default when the host does not set it'
            null = (None, 0) if spec.get('type') == 'int' and _default(spec) is None else (_default(spec),)
            assert default in null, f'{copy}: {var} defaults to {default!r}, base to {_default(spec)!r}'


@pytest.mark.parametrize('name', ROLE_ONLY)
def test_report_playbook_uses_the_roles_backend_patterns(name):
    """The report classifies files as the cleanup role does: with the role's backend patterns and client users when set."""
    var, default, has_default = _expression('playbooks/report.yml', name, _report_module_defaults()[name])
    assert (var, default, has_default) == (f'shm_cleanup_{name}', _default(GROUP[name]), True)


@pytest.mark.parametrize('name', [n for n in CONNECTION if n != 'url'])
def test_eda_source(name):
    spec, options = CONNECTION[name], _eda_options()
    assert name in options, f'EDA source: {name} is not an option'
    option = options[name]
    assert option['type'] == spec['type'], f'EDA source: {name} is {option["type"]}, base says {spec["type"]}'
    if 'default' in option:
        assert option['default'] == _default(spec), (
            f'EDA source: {name} defaults to {option["default"]!r}, base to {_default(spec)!r}'
        )


def test_eda_source_takes_the_url_per_server():
    options = _eda_options()
    assert 'url' not in options and 'url' in ' '.join(options['servers']['description'])
