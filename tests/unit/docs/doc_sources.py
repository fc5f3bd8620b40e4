"""What the collection's documentation says, read from the files a user reads: the Markdown pages
(README, docs/, the roles' READMEs) with their fenced blocks, the EXAMPLES of every plugin, and what the
code accepts (the modules' argument specs, the roles' argument specs, the event source's options, the
playbooks' variables). Shared by test_doc_examples.py and test_doc_options.py."""

from __future__ import annotations

import ast
import glob
import importlib
import os
import re
import textwrap
from typing import Any, NamedTuple

import yaml

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NAMESPACE = 'tritonops.shm'


class Block(NamedTuple):
    """One piece of YAML (or shell) a user may copy: where it is, its language and its text."""

    where: str  # path:line, relative to the collection
    lang: str
    text: str


def rel(path: str) -> str:
    return os.path.relpath(path, COLLECTION)


def markdown_pages() -> list[str]:
    """Every Markdown page a user reads: README*.md, docs/**/*.md and the roles' README*.md."""
    found = glob.glob(os.path.join(COLLECTION, 'README*.md'))
    found += glob.glob(os.path.join(COLLECTION, 'docs', '**', '*.md'), recursive=True)
    found += glob.glob(os.path.join(COLLECTION, 'roles', '*', 'README*.md'))
    return sorted(found)


def read(path: str) -> str:
    with open(path, encoding='utf-8') as f:
        return f.read()


FENCE = re.compile(
    r'^(?P<indent>[ \t]*)```(?P<lang>[A-Za-z0-9_+-]*)[ \t]*\n(?P<body>.*?)^[ \t]*```[ \t]*$', re.M | re.S
)


def fenced_blocks(path: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, dedented (a block inside a list item is indented)."""
    text = read(path)
    return [
        Block(f'{rel(path)}:{text.count(chr(10), 0, m.start()) + 2}', m.group('lang'), textwrap.dedent(m.group('body')))
        for m in FENCE.finditer(text)
    ]


def prose(path: str) -> str:
    """A Markdown page without its fenced blocks."""
    return FENCE.sub('', read(path))


def python_constant(path: str, name: str) -> str | None:
    """A module-level string constant (DOCUMENTATION, EXAMPLES) of a Python file, without running it."""
    for node in ast.parse(read(path)).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, 'id', None) for t in node.targets] == [name]
            and isinstance(node.value, ast.Constant)
        ):
            return node.value.value
    return None


def plugin_files() -> list[str]:
    """Every plugin that carries its own docs: modules and event sources (Python), filters and tests (sidecar .yml
    or Python)."""
    found = glob.glob(os.path.join(COLLECTION, 'plugins', 'modules', '*.py'))
    found += glob.glob(os.path.join(COLLECTION, 'extensions', 'eda', 'plugins', 'event_source', '*.py'))
    for kind in ('filter', 'test'):
        for path in glob.glob(os.path.join(COLLECTION, 'plugins', kind, '*')):
            if path.endswith('.yml') or (path.endswith('.py') and python_constant(path, 'DOCUMENTATION')):
                found.append(path)
    return sorted(p for p in found if not os.path.basename(p).startswith('__'))


def plugin_doc(path: str, key: str) -> Any:
    """DOCUMENTATION (parsed) or EXAMPLES (text) of a plugin file; None when it has none."""
    if path.endswith('.yml'):
        return (yaml.safe_load(read(path)) or {}).get(key)
    text = python_constant(path, key)
    return yaml.safe_load(text) if text is not None and key == 'DOCUMENTATION' else text


def examples() -> list[Block]:
    """The EXAMPLES of every plugin that has some; a sidecar doc file that is not YAML at all is given whole, so
    that the YAML test names it (ansible-doc cannot read such a file either)."""
    found = []
    for path in plugin_files():
        try:
            text = plugin_doc(path, 'EXAMPLES')
        except yaml.YAMLError:
            text = read(path)
        if text is not None:
            found.append(Block(rel(path), 'yaml', text))
    return found


def yaml_blocks() -> list[Block]:
    """Every YAML a user may copy: the pages' ```yaml blocks and the plugins' EXAMPLES."""
    return [b for page in markdown_pages() for b in fenced_blocks(page) if b.lang == 'yaml'] + examples()


def shell_blocks() -> list[Block]:
    return [b for page in markdown_pages() for b in fenced_blocks(page) if b.lang in ('sh', 'bash', 'shell')]


# What the code accepts ---------------------------------------------------------------------------------------------


class _Captured(Exception):
    pass


def module_options(name: str) -> set[str]:
    """The options (and aliases) of a module, from the argument_spec its main() gives AnsibleModule."""
    module = importlib.import_module(f'ansible_collections.tritonops.shm.plugins.modules.{name}')
    seen: dict = {}

    def capture(argument_spec: dict, **kwargs: Any) -> None:
        seen.update(argument_spec)
        raise _Captured()

    if not hasattr(module, 'main'):  # the documentation of an action (plugins/action/NAME.py): its ARGUMENT_SPEC
        seen.update(importlib.import_module(f'ansible_collections.tritonops.shm.plugins.action.{name}').ARGUMENT_SPEC)
        return {n for opt, spec in seen.items() for n in [opt, *(spec.get('aliases') or [])]}
    real = module.AnsibleModule
    module.AnsibleModule = capture
    try:
        module.main()
    except _Captured:
        pass
    finally:
        module.AnsibleModule = real
    return {n for opt, spec in seen.items() for n in [opt, *(spec.get('aliases') or [])]}


def modules() -> list[str]:
    return sorted(
        os.path.basename(p)[:-3]
        for p in glob.glob(os.path.join(COLLECTION, 'plugins', 'modules', '*.py'))
        if not os.path.basename(p).startswith('__')
    )


def role_options() -> dict[str, set[str]]:
    """Each role's options, from its meta/argument_specs.yml (entry point main)."""
    found = {}
    for path in glob.glob(os.path.join(COLLECTION, 'roles', '*', 'meta', 'argument_specs.yml')):
        specs = yaml.safe_load(read(path))['argument_specs']
        found[path.split(os.sep)[-3]] = {o for entry in specs.values() for o in entry.get('options', {})}
    return found


def event_source_options() -> dict[str, set[str]]:
    return {
        os.path.basename(path)[:-3]: set(doc.get('options') or {})
        for path in glob.glob(os.path.join(COLLECTION, 'extensions', 'eda', 'plugins', 'event_source', '*.py'))
        if (doc := plugin_doc(path, 'DOCUMENTATION'))
    }


def event_source_server_keys() -> set[str]:
    """The keys one item of the poller's `servers` (the rulebooks' triton_shm_servers) may have: host, url, shm_bytes
    and the options it takes per server (PER_SERVER in module_utils/run/poll.py, what the source calls:
    connection.OPTIONS but url, and its own)."""
    from ansible_collections.tritonops.shm.extensions.eda.plugins.event_source import triton_shm

    return {'host', 'url', 'shm_bytes', *triton_shm.poll.PER_SERVER}


JINJA_VARIABLE = re.compile(r'\b([a-z_][a-z0-9_]*)\s*\|\s*default\b')
COMMENTED_VARIABLE = re.compile(r'^#\s+([a-z_][a-z0-9_]*)\b', re.M)


def playbook_variables() -> set[str]:
    """The variables the fleet playbooks and the rulebooks read: every `NAME | default(...)` in them, the names their
    header comments document one per line, and every name they use in `{{ }}` (required ones such as triton_url)."""
    found: set[str] = set()
    paths = glob.glob(os.path.join(COLLECTION, 'playbooks', '*.yml'))
    paths += glob.glob(os.path.join(COLLECTION, 'extensions', 'eda', 'rulebooks', '*.yml'))
    for path in paths:
        text = read(path)
        found |= set(JINJA_VARIABLE.findall(text))
        for expression in re.findall(r'\{\{(.*?)\}\}', text, re.S):
            found |= set(re.findall(r'(?<![.\w\'"])([a-z_][a-z0-9_]*)\b', expression))
        header = text.split('\n- ', 1)[0]
        found |= set(COMMENTED_VARIABLE.findall(header))
        found |= {w for line in header.splitlines() for w in re.findall(r'\b(triton_[a-z0-9_]+)\b', line)}
    return found
