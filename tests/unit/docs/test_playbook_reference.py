"""docs/playbooks.md (and its 中文 page) held to the playbooks (issue 44, goal 3).

A playbook's variables are the names it reads with ``| default(...)`` (in the playbook and the task files it includes)
and the ones it requires. Each section's table lists exactly those of its playbook (the connection variables of the
report and cleanup playbooks in their own table), each with the playbook's default where it gives a literal one.
"""

from __future__ import annotations

import os
import re

import pytest
from doc_sources import COLLECTION

PLAYBOOKS = {  # playbook -> the task files it includes
    'report': (),
    'cleanup': (),
    'deploy': (),
    'node_agent': ('tasks/node_agent_server.yml',),
    'node_agent_manifest': (),
}
REQUIRED = {'report': {'triton_url'}, 'cleanup': {'triton_url'}, 'node_agent_manifest': {'node_agent_image'}}
CONNECTION_USERS = ('report', 'cleanup')  # the playbooks whose connection variables the first table lists
INTERNAL = {'ansible_python_interpreter', 'node_agent_after'}  # Ansible's own, and a registered result
READ = re.compile(r'(?<![.\w])([a-z][a-z0-9_]*)\s*\|\s*default\(([^()]*)\)')
CONNECTION = 'Connection variables'


def inputs(name: str, root: str = COLLECTION) -> dict:
    """{variable: its literal default or None} of a playbook (under root/playbooks)."""
    found: dict = {}
    for rel in (f'{name}.yml',) + PLAYBOOKS[name]:
        with open(os.path.join(root, 'playbooks', rel)) as f:
            for var, arg in READ.findall(f.read()):
                if var in INTERNAL or var.startswith('_'):
                    continue
                literal = arg.split(',')[0].strip() if not arg.startswith('[') else arg.strip()
                if literal in ('omit', 'none'):
                    literal = None
                found[var] = found.get(var) or literal
    for var in REQUIRED.get(name, ()):
        found.setdefault(var, None)
    return found


def sections(page: str) -> dict:
    """{section title: {variable: its default cell}} of the page's tables, in page order."""
    out: dict = {}
    title = None
    with open(os.path.join(COLLECTION, 'docs', page)) as f:
        for line in f:
            if line.startswith('## '):
                title = line[3:].strip()
                out[title] = {}
            cells = [c.strip() for c in line.split('|')]
            if title and line.startswith('|') and len(cells) > 3 and cells[1].startswith('`'):
                out[title][cells[1].strip('`')] = cells[2]
    return out


def section_of(page_sections: dict, playbook: str) -> dict:
    titles = [t for t in page_sections if t == f'`tritonops.shm.{playbook}`']
    assert len(titles) == 1, (playbook, list(page_sections))
    return page_sections[titles[0]]


@pytest.mark.parametrize('page', ['playbooks.md', 'playbooks.zh.md'])
@pytest.mark.parametrize('playbook', sorted(PLAYBOOKS))
def test_each_playbooks_variables_are_listed_with_their_defaults(page, playbook):
    found = sections(page)
    connection = next(v for t, v in found.items() if CONNECTION in t or t.startswith('连接变量'))
    listed = dict(section_of(found, playbook))
    wanted = inputs(playbook)
    shared = {v for v in wanted if v in connection and v not in listed} if playbook in CONNECTION_USERS else set()
    assert set(listed) == set(wanted) - shared, (
        f'{page}, {playbook}: listed but not read {sorted(set(listed) - set(wanted))}, '
        f'read but not listed {sorted(set(wanted) - shared - set(listed))}'
    )
    for var, literal in wanted.items():
        cell = listed.get(var, connection.get(var))
        if literal is not None and playbook in ('cleanup',) + tuple(p for p in PLAYBOOKS if var in listed):
            assert literal.strip("'") in cell.replace('`', ''), (page, playbook, var, literal, cell)


@pytest.mark.parametrize('page', ['playbooks.md', 'playbooks.zh.md'])
def test_the_connection_variables_are_those_the_report_and_cleanup_read(page):
    found = sections(page)
    connection = next(v for t, v in found.items() if CONNECTION in t or t.startswith('连接变量'))
    read = set().union(*(inputs(p) for p in CONNECTION_USERS))
    assert set(connection) <= read, sorted(set(connection) - read)
    assert {v for v in read if v.startswith('triton_')} <= set(connection)


def test_a_variable_a_playbook_adds_or_drops_is_seen(tmp_path):
    (tmp_path / 'playbooks').mkdir()
    with open(os.path.join(COLLECTION, 'playbooks', 'deploy.yml')) as f:
        text = f.read()
    listed = set(section_of(sections('playbooks.md'), 'deploy'))
    assert set(inputs('deploy')) == listed
    changed = text.replace('triton_deploy_serial | default(1)', '1').replace(
        "target | default('triton')", 'new_var | default(2)'
    )
    (tmp_path / 'playbooks' / 'deploy.yml').write_text(changed)
    now = set(inputs('deploy', str(tmp_path)))
    assert now != listed and 'triton_deploy_serial' not in now and 'new_var' in now
