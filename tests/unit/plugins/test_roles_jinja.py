"""Roles and playbooks keep logic out of Jinja: every expression fits on one line and none holds a loop.

Decisions belong in a module's result or a filter plugin with unit tests (shared/DESIGN.md). This test scans the
YAML of roles/ and playbooks/ (tasks, vars, defaults, meta, playbooks) as written:
- a ``{{ ... }}`` expression opens and closes on the same line;
- no ``{% ... %}`` statement (``for``, ``set``, ``if``...) at all;
- no ``for`` inside an expression (outside its string literals).
Templates (``templates/*.j2``) render documents and may loop; they are not scanned.
"""

from __future__ import annotations

import os
import re

import pytest

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCANNED = ('roles', 'playbooks')
_STRING = re.compile(r"'[^']*'|\"[^\"]*\"")
_FOR = re.compile(r'\bfor\b')


def problems(text: str) -> list[tuple[int, str]]:
    """(line, what) for each rule the YAML text breaks."""
    out = []
    for match in re.finditer(r'\{%', text):
        out.append((text.count('\n', 0, match.start()) + 1, 'a Jinja statement {% ... %}'))
    pos = 0
    while True:
        start = text.find('{{', pos)
        if start < 0:
            break
        end = text.find('}}', start + 2)
        line = text.count('\n', 0, start) + 1
        if end < 0:
            out.append((line, 'an expression that is never closed'))
            break
        body = text[start + 2 : end]
        if '\n' in body:
            out.append((line, 'an expression longer than one line'))
        if _FOR.search(_STRING.sub("''", body.replace('\\"', '').replace("\\'", ''))):
            out.append((line, 'a loop in an expression'))
        pos = end + 2
    return out


@pytest.mark.parametrize(
    'text, expected',
    [
        ('a: "{{ x | y }}"\nb: "{{ z }}"\n', []),
        ('msg: >-\n  waiting for {{ name }}\n  on {{ \'for\' ~ x }} and {{ "a for b" }}\n', []),
        ('a: >-\n  {{ x\n     + y }}\n', [(2, 'an expression longer than one line')]),
        (
            'a: |-\n  {% for i in x %}\n  {{ i }}\n  {% endfor %}\n',
            [(2, 'a Jinja statement {% ... %}'), (4, 'a Jinja statement {% ... %}')],
        ),
        ('a: "{%- set out = [] -%}{{ out }}"\n', [(1, 'a Jinja statement {% ... %}')]),
        ('a: "{{ [1, 2] | map(\'string\') | list }}"\nb: "{{ x if y for z }}"\n', [(2, 'a loop in an expression')]),
        ('a: "{{ x"\n', [(1, 'an expression that is never closed')]),
    ],
    ids=[
        'one-line',
        'for-in-text-and-strings',
        'two-lines',
        'for-statement',
        'set-statement',
        'for-in-expression',
        'unclosed',
    ],
)
def test_the_checker(text, expected):
    assert problems(text) == expected


def yaml_files() -> list[str]:
    found = []
    for top in SCANNED:
        for root, dirs, files in os.walk(os.path.join(COLLECTION, top)):
            dirs[:] = sorted(d for d in dirs if d != 'templates')
            found += [
                os.path.relpath(os.path.join(root, f), COLLECTION)
                for f in sorted(files)
                if f.endswith(('.yml', '.yaml'))
            ]
    return found


def test_the_scan_sees_the_roles_and_playbooks():
    files = yaml_files()
    assert 'roles/shm_cleanup/tasks/main.yml' in files and 'roles/triton_server/vars/main.yml' in files
    assert 'playbooks/report.yml' in files and not [f for f in files if '/templates/' in f]


@pytest.mark.parametrize('path', yaml_files())
def test_no_logic_in_jinja(path):
    with open(os.path.join(COLLECTION, path), encoding='utf-8') as f:
        found = problems(f.read())
    assert not found, '\n'.join(f'{path}:{line}: {what}' for line, what in found)
