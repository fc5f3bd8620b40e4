"""The event source shares the modules' core: it imports their module_utils (standard library only, run by its path),
and what they decide is what the modules decide (issue 35, goal 4; issue 41, goal 5)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import MalformedAnswer, ParameterError
from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.run.base import connection_argument_spec
from ansible_collections.tritonops.shm.plugins.module_utils.wire import client, connection

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
SOURCE = os.path.join(ROOT, 'extensions', 'eda', 'plugins', 'event_source', 'triton_shm.py')
STDLIB = set(sys.stdlib_module_names) | {'__future__'}


PROBE = """
import json, runpy, sys
bare = set(sys.modules)
runpy.run_path(sys.argv[1])
print(json.dumps(sorted(set(sys.modules) - bare)))
"""


def test_the_event_source_runs_by_its_path_on_the_standard_library_and_the_collections_module_utils():
    """ansible-rulebook runs a source with runpy.run_path, the collection not on sys.path: the source binds its own
    collection as the package, and pulls in the standard library and module_utils only (grpc for grpc:// URLs)."""
    done = subprocess.run([sys.executable, '-I', '-c', PROBE, SOURCE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    package = 'ansible_collections.tritonops.shm.plugins.module_utils'
    names = ('wire.connection', 'rules.records', 'outputs.metrics_text', 'wire.triton_aio', 'wire.client')
    assert {f'{package}.{name}' for name in names} <= loaded
    outside = {n for n in loaded if n.split('.')[0] not in STDLIB | {'ansible_collections'}}
    assert not outside, outside


def test_the_event_source_alone_without_its_collection_says_what_it_needs(tmp_path):
    alone = tmp_path / 'extensions' / 'eda' / 'plugins' / 'event_source'
    alone.mkdir(parents=True)
    with open(SOURCE, encoding='utf-8') as f:
        (alone / 'triton_shm.py').write_text(f.read(), encoding='utf-8')
    done = subprocess.run(
        [sys.executable, '-I', '-c', PROBE, str(alone / 'triton_shm.py')], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0 and 'install the whole tritonops.shm collection' in done.stderr, done.stderr


def _copy_of_the_collection(at) -> str:
    """A collection at at/ansible_collections/tritonops/shm with this one's module_utils and source; the source's path."""
    root = at / 'ansible_collections' / 'tritonops' / 'shm'
    shutil.copytree(os.path.join(ROOT, 'plugins', 'module_utils'), root / 'plugins' / 'module_utils')
    (root / 'extensions' / 'eda' / 'plugins' / 'event_source').mkdir(parents=True)
    shutil.copy(SOURCE, root / 'extensions' / 'eda' / 'plugins' / 'event_source' / 'triton_shm.py')
    return str(root / 'extensions' / 'eda' / 'plugins' / 'event_source' / 'triton_shm.py')


def test_the_event_source_run_by_its_path_uses_its_own_collection_never_another_copy(tmp_path):
    """Another copy of the collection on sys.path does not win over the collection the file is in; a second copy's
    source run in the same process is refused, naming both places, and never runs the first copy's code."""
    a, b = _copy_of_the_collection(tmp_path / 'a'), _copy_of_the_collection(tmp_path / 'b')
    probe = (
        'import runpy, sys\nfor path in sys.argv[1:]:\n    print(runpy.run_path(path)["poll"].triton_aio.__file__)\n'
    )
    env = {**os.environ, 'PYTHONPATH': str(tmp_path / 'b')}
    done = subprocess.run([sys.executable, '-c', probe, a], capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(tmp_path / 'a' / 'ansible_collections')), done.stdout
    done = subprocess.run([sys.executable, '-I', '-c', probe, a, b], capture_output=True, text=True, check=False)
    assert done.returncode != 0 and done.stdout.count('\n') == 1, (done.stdout, done.stderr)
    refusal = done.stderr.strip().splitlines()[-1]
    assert refusal.startswith('ImportError') and str(tmp_path / 'a') in refusal and str(tmp_path / 'b') in refusal


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
        source.poll.summarize(answer)
        event = None
    except source.poll.Implausible:
        event = None  # figures, not form: the modules have no shm_bytes to compare with
    except ValueError as exc:
        event = str(exc).split('shared memory status: ', 1)[1]
    assert event == modules


def test_the_event_source_shows_urls_as_the_modules_do(source):
    for url in ('http://u:pw@h:8000/p?q=1', 'https://h:8443', 'grpc://a:b@10.0.0.1:8001'):
        assert source.poll.redact_url(url) == connection.redact_url(url) == client.redact_url(url)
    assert source.poll.records is records  # the one definition, imported as the modules import it


def test_each_connection_option_of_the_modules_is_one_of_the_event_source_with_the_same_default(source):
    """One table (connection.OPTIONS): the modules' argument spec and the source's per-server options come from it."""
    spec = connection_argument_spec()
    assert set(spec) - {'url'} <= set(source.poll.PER_SERVER)
    (server,), _interval = source.parse_args({'servers': [{'host': 'h', 'url': 'http://h:8000'}]})
    for name, option in spec.items():
        if name != 'url':
            assert server[name] == option.get('default'), name
    assert spec['url']['fallback'][1] == ['TRITON_URL']


HEADERS = [
    {'Authorization': 'Bearer abc'},
    {'X Key': 'v'},
    {'X-Key': 'v\n'},
    {'X-Key': ' v'},
    {'X-Key': 'v\x00w'},
    {'': 'v'},
    {'X-Key': 'tab\tinside'},
    {'X-Key': 'caf\u00e9'},
    {'X-Key': '\u4e2d'},
    {'X-Key': 'a\x85b'},
]


@pytest.mark.parametrize('headers', HEADERS, ids=range(len(HEADERS)))
def test_the_event_source_and_the_modules_accept_and_refuse_the_same_headers(source, headers):
    try:
        client.check_headers(headers)
        modules = None
    except ParameterError as exc:
        modules = exc.msg.split(': ', 1)[1]
    try:
        source.parse_args({'servers': [{'host': 'h', 'url': 'http://h:1'}], 'headers': headers})
        event = None
    except source.ConfigError as exc:
        event = str(exc).split('headers: ', 1)[1]
    assert event == modules
    for value in headers.values():
        assert modules is None or value.strip() not in (modules or '') or len(value.strip()) < 2


def test_the_event_source_reads_the_holders_series_metrics_py_writes(source):
    """The writer (metrics.py through metrics_text) and the source's reader agree, labels escaped both ways."""
    host, url = 'gpu"1\\n', 'http://triton:8000'
    for complete, namespace, reason in ((True, 'initial', None), (False, 'other', 'pid_namespace')):
        inv = {'holders_complete': complete, 'server': {'pid': 7, 'shm_dir': '/dev/shm'}, 'pid_namespace': namespace}
        inv['holders_incomplete_reason'] = None if complete else 'not in the initial PID namespace'
        text = metrics.report_text(inv, host, url, now=1.0)
        seen = source.poll.holders_from_metrics(text, host, 'triton:8000/')
        assert (seen.complete, seen.reason) == (complete, reason)
    assert source.poll.holders_from_metrics(text, 'other', url).complete is None


def test_the_event_source_sends_a_header_as_the_modules_do_in_latin_1(source):
    """The same option puts the same bytes on the wire: the modules' HTTP transport writes its headers in Latin-1, and so
    does the event source's request (it wrote UTF-8: c3 a9 for an e-acute where the modules sent e9)."""
    wire = source.poll.connection.wire_config({'url': 'http://h:1', 'headers': {'X-Key': 'caf\u00e9'}})
    request = source.poll.connection.http_request(wire, '/v2', 'application/json')
    assert b'X-Key: caf\xe9\r\n' in request and b'\xc3\xa9' not in request
