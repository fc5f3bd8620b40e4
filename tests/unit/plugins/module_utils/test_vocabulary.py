"""The one state vocabulary (module_utils/rules/vocabulary.py): every output takes its words and its order from it.

The classification decides with it and counts in its order, the metrics label their series with it, the HTML report lists
it in its counts and sorts by its attention orders, and the user docs describe every word in the same order.
"""

from __future__ import annotations

import ast
import os
import re

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, records, results
from ansible_collections.tritonops.shm.plugins.module_utils.rules import vocabulary as v
from ansible_collections.tritonops.shm.plugins.plugin_utils.report.html_report import shm_html_report

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
WORDS = set(v.REGION_STATES) | set(v.FILE_CATEGORIES) | set(v.POOL_STATES)


def _regions(states):
    return [
        dict(name=f'r{i}', key=f'/r{i}', byte_size=1, state=s, holders=[], file=dict(path=f'/s/r{i}', exists=False))
        for i, s in enumerate(states)
    ]


def _files(categories):
    return [
        dict(name=f'f{i}', path=f'/s/f{i}', category=c, allocated_bytes=1, age_s=9999) for i, c in enumerate(categories)
    ]


def test_each_order_is_a_permutation_of_its_vocabulary():
    for words in (v.REGION_STATES, v.FILE_CATEGORIES, v.POOL_STATES):
        assert len(set(words)) == len(words)
    assert sorted(v.REGION_STATES_BY_ATTENTION) == sorted(v.REGION_STATES)
    assert set(v.ATTENTION_STATES) < set(v.REGION_STATES)
    assert v.REGION_STATES_BY_ATTENTION[: len(v.ATTENTION_STATES)] == v.ATTENTION_STATES
    assert sorted(v.POOL_STATES_BY_ATTENTION) == sorted(v.POOL_STATES)


def test_the_inventory_summary_counts_every_word_in_the_one_order():
    summary = results.summarize(dict(system=_regions(v.REGION_STATES), cuda=[]), _files(v.FILE_CATEGORIES), None)
    states = [
        k[: -len('_regions')]
        for k in summary
        if k.endswith('_regions') and k not in ('system_regions', 'cuda_regions') and not k.startswith('cuda_')
    ]
    cuda_states = [k[5:-8] for k in summary if k.startswith('cuda_') and k.endswith('_regions') and k != 'cuda_regions']
    assert tuple(cuda_states) == records.CUDA.states == v.GPU_STATES and set(v.GPU_STATES) < set(v.REGION_STATES)
    categories = [k[: -len('_files')] for k in summary if k.endswith('_files')]
    assert tuple(states) == v.REGION_STATES
    assert tuple(categories) == v.FILE_CATEGORIES
    assert all(summary[v.region_count_key(s)] == 1 for s in v.REGION_STATES)
    assert all(summary[v.file_count_key(c)] == 1 for c in v.FILE_CATEGORIES)


def _returned_words(tree: ast.Module, function: str) -> list:
    """The first element of every (word, reason) tuple that function returns, as source names or literals."""
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    out = []
    for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return)):
        if isinstance(ret.value, ast.Tuple):
            first = ret.value.elts[0]
            out.append(first.id if isinstance(first, ast.Name) else ast.literal_eval(first))
    return out


def test_the_inventory_decides_only_with_the_vocabulary_names():
    """region_state and the file category rules return vocabulary.py's names, never a word spelt on the spot."""
    with open(classification.__file__, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    names = {n: getattr(v, n) for n in dir(v) if n.isupper() and isinstance(getattr(v, n), str)}
    states = _returned_words(tree, 'region_state')
    categories = _returned_words(tree, 'file_category') + _returned_words(tree, 'backend_category')
    assert states and categories
    assert {names[n] for n in states} == set(v.REGION_STATES)
    assert {names[n] for n in categories} == set(v.FILE_CATEGORIES)
    assert v.STALE is v.STALE and v.LEFTOVER is v.LEFTOVER  # the names region_ops reads


def test_the_metric_label_sets_are_the_vocabulary_in_its_order():
    result = dict(
        server=dict(pid=1, version='2.51.0'),
        holders_complete=True,
        summary={},
        cuda_regions=[],
        system_regions=_regions(v.REGION_STATES),
        files=_files(v.FILE_CATEGORIES),
    )
    text = metrics.report_text(result, 'h', 'http://h:8000', now=0)
    assert tuple(re.findall(r'^tritonops_shm_regions\{.*,state="(\w+)"\} 1$', text, re.M)) == v.REGION_STATES
    assert tuple(re.findall(r'^tritonops_shm_files\{.*,category="(\w+)"\} 1$', text, re.M)) == v.FILE_CATEGORIES
    assert metrics.REGION_STATES is v.REGION_STATES and metrics.FILE_CATEGORIES is v.FILE_CATEGORIES


def test_the_html_counts_and_tables_follow_the_vocabulary():
    summary = {
        **{v.region_count_key(s): 1 for s in v.REGION_STATES},
        **{v.file_count_key(c): 1 for c in v.FILE_CATEGORIES},
    }
    pools = [
        dict(
            path=f'/s/p{i}',
            name=f'p{i}',
            backend='python',
            model='m',
            instance='m_0_0',
            bytes=1,
            size=1,
            holders=[],
            state=s,
            reason='r',
        )
        for i, s in enumerate(v.POOL_STATES)
    ]
    details = dict(
        server=dict(pid=1, shm_dir='/s', located_by='listener', version='2.51.0', ready=True),
        holders_complete=True,
        summary=summary,
        system_regions=_regions(v.REGION_STATES),
        files=_files(v.FILE_CATEGORIES),
        backend_pools=pools,
    )
    page = shm_html_report([dict(host='h', url='http://h:8000', status='ok')], 'report', details=[details])
    assert tuple(re.findall(r'<div(?: class="hot")? data-state="(\w+)"><dt>', page)) == v.REGION_STATES
    assert tuple(re.findall(r'<div class="hot" data-state="(\w+)">', page)) == tuple(
        s for s in v.REGION_STATES if s in v.ATTENTION_STATES
    )
    assert tuple(re.findall(r'data-category="(\w+)"', page)) == v.FILE_CATEGORIES
    assert tuple(re.findall(r'<tr data-region="\w+" data-state="(\w+)"', page)) == v.REGION_STATES_BY_ATTENTION
    assert (
        tuple(re.findall(r'<tr data-pool="\w+" data-model="\w*" data-state="(\w+)">', page))
        == v.POOL_STATES_BY_ATTENTION
    )


def test_the_concepts_pages_describe_every_word_in_the_one_order():
    for page in ('concepts.md', 'concepts.zh.md'):
        with open(os.path.join(ROOT, 'docs', page), encoding='utf-8') as f:
            rows = list(dict.fromkeys(re.findall(r'^\| `(\w+)` \|', f.read(), re.M)))  # each word's first row
        assert tuple(w for w in rows if w in v.REGION_STATES) == v.REGION_STATES, page
        assert tuple(w for w in rows if w in v.FILE_CATEGORIES) == v.FILE_CATEGORIES, page
