"""The region fields are defined once (module_utils/records.py): the status checks of both transports read them, and
the modules' RETURN docs list each of them with its type.

A field a newer Triton adds (the recipe "Add a region field" in CONTRIBUTING.md) is one records.Field: the test below
adds one the way the recipe says and sees it checked and kept over HTTP's and gRPC's status alike.
"""

from __future__ import annotations

import ast
import os

import pytest
import yaml

from ansible_collections.tritonops.shm.plugins.module_utils import client, records, triton_grpc
from ansible_collections.tritonops.shm.plugins.module_utils.errors import MalformedAnswer

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
TYPES = {records.TEXT: 'str', records.UINT64: 'int'}


def _return_doc(module: str) -> dict:
    with open(os.path.join(ROOT, 'plugins', 'modules', f'{module}.py')) as f:
        tree = ast.parse(f.read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == 'RETURN')
    return yaml.safe_load(node.value.value)


@pytest.mark.parametrize('kind, key', [(records.SYSTEM, 'system_regions'), (records.CUDA, 'cuda_regions')])
def test_the_info_modules_return_doc_lists_every_field_of_each_kind_with_its_type(kind, key):
    contains = _return_doc('triton_shm_info')[key]['contains']
    for field in kind.fields:
        assert field.name in contains, f'{key} does not document {field.name}'
        assert contains[field.name]['type'] == TYPES[field.type], field
    assert list(contains)[: len(kind.fields)] == list(kind.names()), 'the fields first, in the records order'


def test_the_client_kinds_are_the_records_kinds():
    assert client.KINDS == ('system', 'cuda') == tuple(records.KINDS)
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
    assert triton_grpc._region_dict(ref_count, newer) == _system(ref_count=3)  # pylint: disable=protected-access
    older = _Message(name='r', key='/r', offset=0, byte_size=16)
    assert triton_grpc._region_dict(ref_count, older) == _system()  # pylint: disable=protected-access
    cuda = _Message(name='c', device_id=1, byte_size=8)
    assert triton_grpc._region_dict(records.CUDA, cuda) == dict(name='c', device_id=1, byte_size=8)  # pylint: disable=protected-access
