"""The event source shares the modules' core: the module_utils it loads by path are standard library only, and what
they decide is what the modules decide (issue 35, goal 4)."""

from __future__ import annotations

import ast
import os
import re
import sys

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils import client, records, urls
from ansible_collections.tritonops.shm.plugins.module_utils.errors import MalformedAnswer

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
SOURCE = os.path.join(ROOT, 'extensions', 'eda', 'plugins', 'event_source', 'triton_shm.py')
STDLIB = set(sys.stdlib_module_names) | {'__future__'}


def _loaded_by_path() -> list[str]:
    with open(SOURCE, encoding='utf-8') as f:
        return re.findall(r"load_by_path\('([a-z_]+)'\)", f.read())


def test_what_the_event_source_loads_by_path_imports_only_the_standard_library():
    names = _loaded_by_path()
    assert {'records', 'urls', 'http_reader', 'tls', 'errors'} <= set(names)
    for name in names:
        path = os.path.join(ROOT, 'plugins', 'module_utils', f'{name}.py')
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [a.name.split('.')[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                tops = [(node.module or '.').split('.')[0] if not node.level else '.']
            else:
                continue
            assert set(tops) <= STDLIB, f'{name}.py:{node.lineno} imports {tops}: the event source cannot load it'


@pytest.fixture(scope='module')
def source():
    from ansible_collections.tritonops.shm.extensions.eda.plugins.event_source import triton_shm

    return triton_shm


ANSWERS = [
    [dict(name='a', key='/a', offset=0, byte_size=16)],
    [dict(name='a', key='/a', offset=0, byte_size=16, ref_count=1)],  # a field the kind does not declare: kept
    [dict(name='a', offset=0, byte_size=16)],
    [dict(name='a', key='/a', offset=0, byte_size='16')],
    [dict(name='a', key='/a', offset=True, byte_size=16)],
    [dict(name=7, key='/a', offset=0, byte_size=16)],
    [dict(name='a', key='/a', offset=0, byte_size=1 << 64)],
    ['a'],
    [None],
]


@pytest.mark.parametrize('answer', ANSWERS, ids=range(len(ANSWERS)))
def test_the_event_source_and_the_modules_accept_and_refuse_the_same_status_answers(source, answer):
    try:
        client.check_regions('system', answer, 'GET x', 'http://h:1', 'http')
        modules = None
    except MalformedAnswer as exc:
        modules = exc.msg.split('shared memory status: ', 1)[1].split('; nothing', 1)[0]
    try:
        source.summarize(answer)
        event = None
    except source.Implausible:
        event = None  # figures, not form: the modules have no shm_bytes to compare with
    except ValueError as exc:
        event = str(exc).split('shared memory status: ', 1)[1]
    assert event == modules


def test_the_event_source_shows_urls_as_the_modules_do(source):
    for url in ('http://u:pw@h:8000/p?q=1', 'https://h:8443', 'grpc://a:b@10.0.0.1:8001'):
        assert source.redact_url(url) == urls.redact_url(url) == client.redact_url(url)
    assert source.records is not records  # loaded by path: its own copy of the one definition
    assert source.records.SYSTEM.names() == records.SYSTEM.names()
