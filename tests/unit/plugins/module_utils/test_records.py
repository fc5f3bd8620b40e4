"""The region fields are defined once (module_utils/rules/records.py): the status checks of both transports read them, and
the modules' RETURN docs list each of them with its type.

A field a newer Triton adds (the recipe "Add a region field" in CONTRIBUTING.md) is one records.Field: the test below
adds one the way the recipe says and sees it checked and kept over HTTP's and gRPC's status alike.
"""

from __future__ import annotations

import ast
import os

import pytest
import yaml

from ansible_collections.tritonops.shm.plugins.module_utils.errors import MalformedAnswer
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.wire import client

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
TYPES = {records.TEXT: 'str', records.UINT64: 'int'}


def _return_doc(module: str) -> dict:
    with open(os.path.join(ROOT, 'plugins', 'modules', f'{module}.py')) as f:
        tree = ast.parse(f.read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == 'RETURN')
    return yaml.safe_load(node.value.value)


@pytest.mark.parametrize('kind, key', [(kind, kind.result_key) for kind in records.KINDS.values()])
def test_the_info_modules_return_doc_lists_every_field_of_each_kind_with_its_type(kind, key):
    contains = _return_doc('triton_shm_info')[key]['contains']
    for field in kind.fields:
        assert field.name in contains, f'{key} does not document {field.name}'
        assert contains[field.name]['type'] == TYPES[field.type], field
    assert list(contains)[: len(kind.fields)] == list(kind.names()), 'the fields first, in the records order'


def test_the_client_kinds_are_the_records_kinds():
    assert tuple(records.KINDS) == ('system', 'cuda')
    assert [client.record_kind(k) for k in records.KINDS] == list(records.KINDS.values())
    for kind in records.KINDS.values():
        assert kind.required == kind.fields, 'every field Triton 2.51 lists is required'
        assert kind.names()[0] == 'name' and 'byte_size' in kind.names()


def _system(**extra):
    return dict(name='r', key='/r', offset=0, byte_size=16, **extra)


def test_each_required_field_is_checked_by_name_and_type():
    for field in records.SYSTEM.fields:
        bad = _system()
        del bad[field.name]
        with pytest.raises(MalformedAnswer, match=f'region 0 has {field.name} missing'):
            client.check_regions('system', [bad], 'w', 'u', 'http')
        bad = _system()
        bad[field.name] = True if field.text else 'x'
        with pytest.raises(MalformedAnswer, match=f'region 0 has {field.name} '):
            client.check_regions('system', [bad], 'w', 'u', 'http')


class _Message:
    """A protobuf region status message as tritonclient's stubs make it: attributes and DESCRIPTOR.fields_by_name."""

    def __init__(self, **fields):
        self.__dict__.update(fields)
        self.DESCRIPTOR = type('D', (), {'fields_by_name': dict.fromkeys(fields)})()


@pytest.fixture
def ref_count(monkeypatch):
    """The recipe: a newer Triton lists ref_count (optional: 2.51 does not), one Field added to the system kind."""
    kind = records.SYSTEM._replace(
        fields=records.SYSTEM.fields + (records.Field('ref_count', records.UINT64, required=False),)
    )
    monkeypatch.setitem(records.KINDS, 'system', kind)
    return kind


def test_an_optional_field_is_kept_when_present_checked_by_type_and_never_asked_for(ref_count):
    regions = [_system(ref_count=2), _system(), _system(extra='kept as given')]
    assert client.check_regions('system', regions, 'w', 'u', 'http') == regions
    with pytest.raises(MalformedAnswer, match="region 1 has ref_count 'two', expected an integer"):
        client.check_regions('system', [_system(), _system(ref_count='two')], 'w', 'u', 'http')
    with pytest.raises(MalformedAnswer, match='region 0 has ref_count True'):
        client.check_regions('system', [_system(ref_count=True)], 'w', 'u', 'http')


def test_the_grpc_status_keeps_the_fields_the_kind_declares_and_the_message_has(ref_count):
    newer = _Message(name='r', key='/r', offset=0, byte_size=16, ref_count=3, unknown_field=9)
    assert records.from_message(ref_count, newer) == _system(ref_count=3)
    older = _Message(name='r', key='/r', offset=0, byte_size=16)
    assert records.from_message(ref_count, older) == _system()
    cuda = _Message(name='c', device_id=1, byte_size=8)
    assert records.from_message(records.CUDA, cuda) == dict(name='c', device_id=1, byte_size=8)


# The same recipe carried to where a field is shown: one Field with a label and a total, declared before the
# modules that read records are imported (as a records.py that lists it would be), in a fresh interpreter.
RECIPE = r"""
import json, sys
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
REF = records.Field('ref_count', records.UINT64, required=False, description='References.', label='refs',
                    total='region_references', total_description='Sum of the ref_count of the system regions.')
records.SYSTEM = records.SYSTEM._replace(fields=records.SYSTEM.fields + (REF,))
records.KINDS['system'] = records.SYSTEM
from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics
from ansible_collections.tritonops.shm.plugins.plugin_utils.report.html_report import shm_html_report

regions = json.loads(sys.argv[1])
inv = dict(server=dict(pid=42, version='2.74.0', shm_dir='/dev/shm'), summary={}, system_regions=regions,
           cuda_regions=[], files=[], holders_complete=True, scanned_at=1.0)
row = dict(host='t1', url='http://t1:8000', status='ok', error=None)
print(json.dumps(dict(text=metrics.report_text(inv, 't1', 'http://t1:8000'),
                      page=shm_html_report([row], 'report', details=[inv]))))
"""


def _shown(regions):
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, '-c', RECIPE, json.dumps(regions)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    )
    return json.loads(out.stdout)


def test_a_field_with_a_label_and_a_total_shows_in_the_report_and_the_textfile_from_its_one_declaration():
    held = dict(state='healthy', holders=[])
    shown = _shown([_system(ref_count=2, **held), dict(_system(ref_count=3, **held), name='s', key='/s')])
    assert '# TYPE tritonops_shm_region_references gauge' in shown['text']
    assert 'tritonops_shm_region_references{host="t1",triton_url="http://t1:8000"} 5' in shown['text']
    assert '<th>refs</th>' in shown['page'] and '<td class="num">3</td>' in shown['page']
    # a server that does not list the optional field: neither a column of dashes nor a gauge that says 0
    older = _shown([_system(**held)])
    assert 'tritonops_shm_region_references' not in older['text'] and '<th>refs</th>' not in older['page']
    assert 'tritonops_shm_registered_bytes{host="t1",triton_url="http://t1:8000"} 16' in older['text']


def test_totals_are_integers_and_their_gauges_are_declared_once():
    from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics

    for _kind, field in records.totals():
        assert field.type == records.UINT64, field
        assert metrics.METRICS[metrics.total_metric(field)].help == field.total_description
    assert [metrics.total_metric(f) for _k, f in records.totals()] == ['tritonops_shm_registered_bytes']


def test_a_field_says_what_its_value_is_never_which_output_shows_it():
    """No Field attribute names an output (a column, a metric, a page): the outputs decide from what a value is."""
    outputs = ('column', 'metric', 'html', 'gauge', 'table', 'report', 'prom')
    assert not [a for a in records.Field._fields if any(o in a for o in outputs)]
