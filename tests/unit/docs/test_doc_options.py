"""Every option the docs name exists in the code that should accept it.

"Named" means, precisely:
1. in every YAML a user may copy (the pages' ```yaml blocks and the plugins' EXAMPLES):
   a. the keys of a task's arguments when the task's action is one of this collection's modules
      (`tritonops.shm.triton_shm_region: {…}`) -> that module's argument_spec (options and aliases);
   b. the keys under `module_defaults` for one of its modules or `group/tritonops.shm.triton` -> that module's
      argument_spec (the group: every module of the group accepts it);
   c. the keys of a rulebook source `tritonops.shm.triton_shm: {…}` -> the event source's documented options, and the
      keys of each item of its `servers` (or of the rulebooks' `triton_shm_servers`) -> the keys the source accepts
      per server;
   d. any mapping key (inventory, vars, role vars, extra variables) starting with a role's prefix
      (`shm_cleanup_`, `triton_server_`) -> that role's meta/argument_specs.yml, or a fact the role sets;
      any other key starting with `triton_` or `self_heal_` -> a variable the playbooks or rulebooks read;
2. in shell blocks, and in the prose's code spans that are an ansible-playbook/-rulebook command or start with `-e`
   (there only names with a `_`: strace's `-e trace=` is no variable): every `-e NAME=…` / `--extra-vars NAME=…` ->
   a playbook/rulebook variable or a role option;
3. in Markdown prose (outside code blocks): every code span that is exactly one identifier starting with
   `shm_cleanup_`, `triton_server_`, `triton_` or `self_heal_` (or `NAME=…` / `NAME: …` of one) -> the same sets,
   plus the names of the collection's plugins, roles and module_utils files, and a few words the pages name that
   are not variables (OTHER_WORDS, each with its reason);
4. in plugin docs: every `O(name)` / `O(name=value)` / `O(a.b)` / `O(a[].b)` -> an option of that plugin (its first
   part), and every `O(…)` in a role's argument_specs -> an option of that role.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from doc_sources import (
    COLLECTION,
    NAMESPACE,
    event_source_options,
    event_source_server_keys,
    markdown_pages,
    module_options,
    modules,
    playbook_variables,
    plugin_doc,
    plugin_files,
    prose,
    read,
    rel,
    role_options,
    shell_blocks,
    yaml_blocks,
)

ROLE_PREFIXES = {'shm_cleanup_': 'shm_cleanup', 'triton_server_': 'triton_server'}
VARIABLE_PREFIXES = ('triton_', 'self_heal_')
ACTION_GROUP = f'group/{NAMESPACE}.triton'

# Code spans of the pages that start with triton_ but are no variables.
OTHER_WORDS = {
    'triton_python_backend_stub': "the python backend's stub process (its comm and command line)",
    'triton_region': "the rig client's region helper (tests/rig/client.py), named in prevention.md",
    'triton_python_backend_shm_region_planted': 'a file name in a test scene (reliability.md)',
    'triton_python_b': "the stub's comm: the kernel keeps 15 characters of triton_python_backend_stub",
}

MODULE_OPTIONS = {name: module_options(name) for name in modules()}
ROLE_OPTIONS = role_options()
SOURCE_OPTIONS = event_source_options()
SERVER_KEYS = event_source_server_keys()
VARIABLES = playbook_variables()


def role_facts() -> dict[str, set[str]]:
    """The facts a role sets for its caller (set_fact keys without a leading _)."""
    found: dict[str, set[str]] = {}
    for path in glob.glob(os.path.join(COLLECTION, 'roles', '*', 'tasks', '*.yml')):
        facts = found.setdefault(path.split(os.sep)[-3], set())
        for task in walk(yaml.safe_load(read(path))):
            for key in ('ansible.builtin.set_fact', 'set_fact'):
                if isinstance(task.get(key), dict):
                    facts |= {k for k in task[key] if not k.startswith('_') and k != 'cacheable'}
    return found


def walk(node: Any) -> Iterator[dict]:
    """Every mapping in a loaded YAML document."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


ROLE_FACTS = role_facts()
ACTION_GROUP_MEMBERS = yaml.safe_load(read(os.path.join(COLLECTION, 'meta', 'runtime.yml')))['action_groups']['triton']
PLUGIN_NAMES = {os.path.basename(p).rsplit('.', 1)[0] for p in plugin_files()}
PLUGIN_NAMES |= {
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(COLLECTION, 'plugins', 'module_utils', '**', '*.py'), recursive=True)
}
PLUGIN_NAMES |= set(ROLE_OPTIONS)


def known_variable(name: str) -> bool:
    """A role's option or fact (by its prefix), or a variable the playbooks or rulebooks read (triton_server_pid is
    the playbooks' host variable, not the triton_server role's)."""
    roles = [role for prefix, role in ROLE_PREFIXES.items() if name.startswith(prefix)]
    return name in VARIABLES or any(name in ROLE_OPTIONS[role] | ROLE_FACTS.get(role, set()) for role in roles)


def named_in_yaml(loaded: Any) -> Iterator[tuple[str, str]]:
    """(what, name) for every name the YAML uses that this collection must accept; what is 'module M',
    'source S' or 'variable'."""
    for mapping in walk(loaded):
        for key, value in mapping.items():
            if not isinstance(key, str):
                continue
            short = key[len(NAMESPACE) + 1 :] if key.startswith(f'{NAMESPACE}.') else None
            if short in MODULE_OPTIONS and isinstance(value, dict):
                yield from ((f'module {short}', option) for option in value)
            elif short in SOURCE_OPTIONS and isinstance(value, dict):
                yield from ((f'source {short}', option) for option in value)
                yield from server_keys(value.get('servers'))
            elif key == 'triton_shm_servers':
                yield from server_keys(value)
            elif key == 'module_defaults' and isinstance(value, dict):
                for target, options in value.items():
                    members = ACTION_GROUP_MEMBERS if target == ACTION_GROUP else [target[len(NAMESPACE) + 1 :]]
                    for option in options or {}:
                        if not all(option in MODULE_OPTIONS.get(m, set()) for m in members):
                            yield f'module_defaults {target}', option
            if key.startswith(tuple(ROLE_PREFIXES) + VARIABLE_PREFIXES) and re.fullmatch(r'[a-z0-9_]+', key):
                yield 'variable', key


def server_keys(servers: Any) -> Iterator[tuple[str, str]]:
    for item in servers if isinstance(servers, list) else []:
        yield from (('servers[]', k) for k in item if isinstance(item, dict))


def accepted(what: str, name: str) -> bool:
    if what == 'servers[]':
        return name in SERVER_KEYS
    if what.startswith('module '):
        return name in MODULE_OPTIONS[what.split()[1]]
    if what.startswith('source '):
        return name in SOURCE_OPTIONS[what.split()[1]]
    if what.startswith('module_defaults'):
        return False
    return known_variable(name)


def yaml_cases() -> list[tuple[str, str, str]]:
    cases = []
    for block in yaml_blocks():
        try:
            loaded = yaml.safe_load(block.text)
        except yaml.YAMLError:
            continue  # test_doc_examples.py::test_yaml_parses names it
        cases += [(block.where, what, name) for what, name in named_in_yaml(loaded)]
    return sorted(set(cases))


EXTRA_VAR = re.compile(r'(?:-e|--extra-vars)[ =]["\']?([A-Za-z_][A-Za-z0-9_]*)=')


def shell_cases() -> list[tuple[str, str]]:
    """-e NAME=… in shell blocks, and in the prose's code spans."""
    cases = {(block.where, name) for block in shell_blocks() for name in EXTRA_VAR.findall(block.text)}
    for page in markdown_pages():
        for span in re.findall(r'`([^`]+)`', prose(page)):
            if 'ansible-playbook' in span or 'ansible-rulebook' in span:
                cases |= {(rel(page), name) for name in EXTRA_VAR.findall(span)}
            elif span.startswith(('-e ', '--extra-vars')):  # strace's -e trace=, inject= have no _
                cases |= {(rel(page), name) for name in EXTRA_VAR.findall(span) if '_' in name}
    return sorted(cases)


CODE_SPAN = re.compile(r'`([a-z_][a-z0-9_]*[a-z0-9])(?:[=:][^`]*)?`')


def prose_cases() -> list[tuple[str, str]]:
    cases = set()
    for page in markdown_pages():
        for name in CODE_SPAN.findall(prose(page)):
            if name.startswith(tuple(ROLE_PREFIXES) + VARIABLE_PREFIXES):
                cases.add((rel(page), name))
    return sorted(cases)


OPTION_REFERENCE = re.compile(r'\bO\((?:tritonops\.shm\.([a-z0-9_]+)#(module|role):(?:[a-z0-9_]+:)?)?([^)=]+)')


def plugin_reference_cases() -> list[tuple[str, str, frozenset]]:
    """(where, reference, options of the plugin or role it refers to): its own, or the one it names in
    O(tritonops.shm.NAME#module:option) / O(tritonops.shm.ROLE#role:ENTRY:option)."""

    def options_of(owner: str, kind: str, own: frozenset) -> frozenset:
        if not owner:
            return own
        return frozenset(MODULE_OPTIONS.get(owner, set()) if kind == 'module' else ROLE_OPTIONS.get(owner, set()))

    cases = []
    for path in plugin_files():
        try:
            doc = plugin_doc(path, 'DOCUMENTATION') or {}
        except yaml.YAMLError:
            continue  # test_doc_examples.py::test_yaml_parses names the file
        name = os.path.basename(path).rsplit('.', 1)[0]
        # a module's options from its argument_spec (its doc fragments' options included)
        own = frozenset(MODULE_OPTIONS[name] if '/modules/' in path else (doc.get('options') or {}))
        for owner, kind, ref in OPTION_REFERENCE.findall(yaml.safe_dump(doc, width=1 << 20)):
            cases.append((rel(path), ref, options_of(owner, kind, own)))
    for role, options in ROLE_OPTIONS.items():
        path = os.path.join(COLLECTION, 'roles', role, 'meta', 'argument_specs.yml')
        for owner, kind, ref in OPTION_REFERENCE.findall(read(path)):
            cases.append((rel(path), ref, options_of(owner, kind, frozenset(options))))
    return sorted(set(cases))


def test_the_sources_are_found():
    assert {'triton_shm_info', 'triton_shm_region'} <= set(MODULE_OPTIONS)
    assert {'url', 'state', 'stale', 'headers'} <= MODULE_OPTIONS['triton_shm_region']
    assert {'shm_cleanup_mode', 'shm_cleanup_url'} <= ROLE_OPTIONS['shm_cleanup']
    assert 'servers' in SOURCE_OPTIONS['triton_shm']
    assert {'triton_url', 'triton_headers', 'prometheus_textfile_dir', 'report_dir', 'target'} <= VARIABLES
    assert len(yaml_cases()) > 100 and len(prose_cases()) > 50 and len(plugin_reference_cases()) > 50


@pytest.mark.parametrize('where, what, name', yaml_cases())
def test_yaml_names_exist(where, what, name):
    assert accepted(what, name), (
        f'{where}: no playbook, rulebook or role reads {name!r}'
        if what == 'variable'
        else f'{where}: {what} has no option {name!r}'
    )


@pytest.mark.parametrize('where, name', shell_cases())
def test_extra_vars_exist(where, name):
    assert name in VARIABLES or known_variable(name), f'{where}: -e {name}=… is read by no playbook, rulebook or role'


@pytest.mark.parametrize('where, name', prose_cases())
def test_prose_names_exist(where, name):
    assert known_variable(name) or name in PLUGIN_NAMES or name in OTHER_WORDS, (
        f'{where}: `{name}` is no role option, role fact, playbook or rulebook variable, nor a plugin'
    )


@pytest.mark.parametrize('where, ref, options', plugin_reference_cases())
def test_option_references_exist(where, ref, options):
    assert re.split(r'[.\[]', ref)[0] in options, f'{where}: O({ref}) names no option of its own plugin or role'
