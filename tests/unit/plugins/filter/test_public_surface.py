"""The collection's public filters are exactly these; the role-internal ones are private (CONTRIBUTING.md, "Public surface").

A filter that only a role or playbook of the collection calls is named ``_name``: its documentation says "Private",
carries no version_added (the release notes do not announce it) and the collection itself uses it.
"""

from __future__ import annotations

import glob
import importlib
import os

import yaml

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
FILTERS = os.path.join(ROOT, 'plugins', 'filter')
PUBLIC = {
    'shm_dir_refusal',
    'shm_html_report',
    'shm_list',
    'shm_md',
    'shm_metrics',
    'shm_metrics_file',
    'shm_redact_url',
    'shm_size',
    'triton_endpoints',
    'triton_gpus',
    'triton_kubernetes',
    'triton_node_agent',
    'triton_version',
}


def _names() -> set[str]:
    names = set()
    for path in glob.glob(os.path.join(FILTERS, '*.py')):
        module = importlib.import_module(
            f'ansible_collections.tritonops.shm.plugins.filter.{os.path.basename(path)[:-3]}'
        )
        names |= set(module.FilterModule().filters())
    return names


def _doc(name: str) -> dict:
    with open(os.path.join(FILTERS, f'{name}.yml'), encoding='utf-8') as f:
        return yaml.safe_load(f)['DOCUMENTATION']


def _collection_text() -> str:
    parts = []
    for pattern in ('roles/**/*.yml', 'roles/**/*.j2', 'playbooks/**/*.yml'):
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            with open(path, encoding='utf-8') as f:
                parts.append(f.read())
    return '\n'.join(parts)


def test_the_public_filters_are_exactly_these():
    assert {n for n in _names() if not n.startswith('_')} == PUBLIC


# private filters no role or playbook calls any more (their function serves another filter): drop them from filters()
NOT_CALLED = {'_shm_report_rows'}


def test_every_private_filter_says_so_and_the_collection_uses_it():
    private = {n for n in _names() if n.startswith('_')}
    assert len(private) == 18
    text = _collection_text()
    for name in sorted(private):
        doc = _doc(name)
        assert doc['name'] == name
        assert doc['short_description'].startswith('Private - '), name
        assert doc['description'][0].startswith('B(Private) to the roles and playbooks of tritonops.shm'), name
        assert 'version_added' not in doc, name
        assert (f'tritonops.shm.{name}' in text) != (name in NOT_CALLED), f'{name}: no role or playbook uses it'


def test_every_public_filter_is_documented_with_its_version():
    for name in PUBLIC:
        doc = _doc(name)
        assert doc['name'] == name and doc['version_added'] and not doc['short_description'].startswith('Private')


def test_no_filter_has_the_name_of_a_role():
    assert _names() & set(os.listdir(os.path.join(ROOT, 'roles'))) == set()
