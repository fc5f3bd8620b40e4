# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Region records as data: the fields of each region kind, defined once.

Private to the tritonops.shm collection: no stability promise to other code. Standard library only (filters and the
poller may import it), beside vocabulary.py.

A ``Field`` is one key of a region as Triton's status answer lists it: its name, its type (``TEXT`` or ``UINT64``:
Triton's uint64, never a boolean), and whether every answer carries it (``required``) or only some servers do
(``required=False``: checked when present, kept as given, never asked for). A ``Kind`` is the ordered fields of one
region kind. What reads them:

- client.check_regions: the check of every status answer, HTTP and gRPC alike (a required field missing or of the
  wrong type refuses the answer with the field's name);
- triton_grpc.status: the dict of each region, built from the protobuf message by these names (a field the
  message has and the kind declares is kept, so both transports return the same keys);
- tests/unit/plugins/module_utils/test_records.py: the modules' RETURN docs of ``system_regions`` and
  ``cuda_regions`` list every field.

**Add a region field** (a newer Triton lists, say, ``ref_count`` in its status):

1. one ``Field`` in the kind's fields here (``required=False`` when older servers lack it);
2. the fake of that newer server in tests/unit/plugins/module_utils/test_newer_servers.py, and a test there;
3. triton_shm_info's RETURN (``system_regions`` or ``cuda_regions``: test_records.py fails until it lists the field
   with its type); with a ``total``, docs/metrics.md and docs/metrics.zh.md (test_metrics_docs.py); a changelog
   fragment.

A field says what its value is, never which output shows it: what people call it (``label``), its ``unit``, and
whether its sum over a kind's registered regions means something (``total``, what that sum is called, and
``total_description``). Each output decides from that: the HTML report's region table shows the labelled fields
(html_report.py), the node_exporter textfile writes a report gauge ``tritonops_shm_<total>`` per total (metrics.py).
Not driven from here: the fleet table's and the role's record's columns, which pick summary counts (vocabulary.py),
not region fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

TEXT = 'str'
UINT64 = 'uint64'
_UINT64_END = 1 << 64


BYTES = 'bytes'
HANDLE = 'base64'  # a register value sent as base64 text over HTTP ({'b64': ...}), as its bytes over gRPC


class Field(NamedTuple):
    """One key of a region in a status answer (see the module doc), and what its value is.

    label: what people call the value, short ('size'; '' for a value that has no name of its own beside the region's);
    unit: ``BYTES`` for a size; total: the value adds up over the registered regions of its kind, and this is what the
    sum is called ('registered_bytes'; ``UINT64`` fields only), total_description: what that sum is. An optional field
    has a value only where a region carries it. The outputs choose from these (records' module doc).
    """

    name: str
    type: str
    required: bool = True
    description: str = ''
    label: str = ''
    unit: str = ''
    total: str = ''
    total_description: str = ''

    @property
    def text(self) -> bool:
        return self.type == TEXT


class Kind(NamedTuple):
    """A region kind (``system``, ``cuda``) and its fields, in the order Triton documents them.

    What the transports need: ``api``, the name of its API (HTTP: ``/v2/{api.lower()}/...``; gRPC: the methods
    ``{api}Status``, ``{api}Register``, ``{api}Unregister`` and their ``...Request`` messages), and ``register``, the
    (name, type) of each value its register call sends beside the region name, in order (``HANDLE``: base64 text).
    ``registration`` is what triton_shm_region requires of its options to register one.
    """

    name: str
    fields: tuple
    files: bool = False  # its regions are backed by files of the shm directory
    registration: tuple = ()  # what registering one takes beside its name (triton_shm_region's options)
    api: str = ''
    register: tuple = ()
    gpu: bool = False  # its regions are GPU memory: their holders are the GPU's contexts (gpu.py reads them)
    states: tuple = ()  # a kind without files: the states its summary counts (<kind>_<state>_regions, _bytes)

    @property
    def http_root(self) -> str:
        """The first segment of its HTTP paths after /v2 (``systemsharedmemory``)."""
        return self.api.lower()

    def grpc_method(self, call: str) -> str:
        """Its gRPC method for call (``Status``, ``Register``, ``Unregister``): ``SystemSharedMemoryStatus``."""
        return f'{self.api}{call}'

    @property
    def extension(self) -> str:
        """The protocol extension a server that offers this kind lists in GET /v2 (``cuda_shared_memory``)."""
        return f'{self.name}_shared_memory'

    @property
    def required(self) -> tuple:
        return tuple(f for f in self.fields if f.required)

    @property
    def optional(self) -> tuple:
        return tuple(f for f in self.fields if not f.required)

    @property
    def result_key(self) -> str:
        """The key of triton_shm_info's result that lists the regions of this kind (``system_regions``)."""
        return f'{self.name}_regions'

    def names(self) -> tuple:
        return tuple(f.name for f in self.fields)

    def spec(self, region: dict) -> dict:
        """The kind's fields of a region (what its registration is), without the state the collection adds."""
        return {k: region.get(k) for k in self.names() if k in region}

    def labelled(self, regions: Sequence[dict]) -> tuple:
        """The fields with a label, but the name, that these regions have (an optional one only when carried)."""
        return tuple(
            f for f in self.fields if f.label and f.name != 'name' and (f.required or any(f.name in r for r in regions))
        )


SYSTEM = Kind(
    'system',
    (
        Field('name', TEXT, description='The region name.', label='region'),
        Field(
            'key', TEXT, description='The shm key (a name under the shm directory, with a leading slash).', label='key'
        ),
        Field('offset', UINT64, description='Offset of the region in its file.'),
        Field(
            'byte_size',
            UINT64,
            description='Registered size in bytes.',
            label='size',
            unit=BYTES,
            total='registered_bytes',
            total_description='Sum of the byte sizes of the registered system regions.',
        ),
    ),
    files=True,
    registration=('key', 'byte_size'),
    api='SystemSharedMemory',
    register=(('key', TEXT), ('offset', UINT64), ('byte_size', UINT64)),
)
CUDA = Kind(
    'cuda',
    (
        Field('name', TEXT, description='The region name.'),
        Field('device_id', UINT64, description="The CUDA device ordinal, as the server's process numbers its GPUs."),
        Field('byte_size', UINT64, description='Registered size in bytes.'),
    ),
    registration=('raw_handle', 'device_id', 'byte_size'),
    api='CudaSharedMemory',
    register=(('raw_handle', HANDLE), ('device_id', UINT64), ('byte_size', UINT64)),
    gpu=True,
    states=('stale', 'unknown'),  # vocabulary.GPU_STATES (this file imports none: the event source loads it alone)
)
KINDS = {k.name: k for k in (SYSTEM, CUDA)}


def totals() -> tuple:
    """(kind, field) for every field whose sum over a kind's registered regions is a total, in their order."""
    return tuple((kind, f) for kind in KINDS.values() for f in kind.fields if f.total)


# -- what reads a status answer: the modules' client (client.check_regions) and the event source --


class BadRegion(ValueError):
    """A region of a status answer that is not one of its kind: its index, and the first field that is wrong (None:
    the region is not a dict). describe() says it, with the caller's escaping of what the server sent."""

    def __init__(self, kind: Kind, index: int, region: Any, field: Field | None) -> None:
        super().__init__(f'region {index} of a {kind.name} status is not one')
        self.kind, self.index, self.region, self.field = kind, index, region, field

    def describe(self, escape: Callable[[str, int], str]) -> str:
        """``region 3 has byte_size 'x', expected an integer from 0 to 2**64 - 1``, or ``region 3 is [...]``."""
        if self.field is None:
            return f'region {self.index} is {escape(repr(self.region), 200)}'
        f = self.field
        present = isinstance(self.region, dict) and f.name in self.region
        got = escape(repr(self.region[f.name]), 80) if present else 'missing'
        want = 'a string' if f.text else 'an integer from 0 to 2**64 - 1'
        return f'region {self.index} has {f.name} {got}, expected {want}'


def _good(field: Field, value: Any) -> bool:
    # exact types: a bool is an int, and not a size
    if field.text:
        return type(value) is str  # pylint: disable=unidiomatic-typecheck
    return type(value) is int and 0 <= value < _UINT64_END  # pylint: disable=unidiomatic-typecheck


def check_regions(kind: Kind, regions: Sequence) -> None:
    """BadRegion for the first region of regions that is not one of kind as Triton lists it.

    A required field must be there, an optional one is checked when present; a string field is a string, an integer
    field an unsigned 64-bit integer (Triton's uint64), never a boolean. Other keys are kept as they are.
    """
    texts = tuple(f.name for f in kind.required if f.text)
    numbers = tuple(f.name for f in kind.required if not f.text)
    optional = kind.optional
    # pylint: disable=unidiomatic-typecheck  # exact types: a bool is an int, and not a size
    top, typ, text, number = _UINT64_END, type, str, int  # locals: this runs once per region of every status read
    for index, region in enumerate(regions):
        try:  # the common case: every field there with its exact type and range, inline (no call per region)
            for name in texts:
                if typ(region[name]) is not text:
                    break
            else:
                for name in numbers:
                    value = region[name]
                    if typ(value) is not number or not 0 <= value < top:
                        break
                else:
                    if typ(region) is dict and (
                        not optional or all(f.name not in region or _good(f, region[f.name]) for f in optional)
                    ):
                        continue
        except (KeyError, TypeError, IndexError):
            pass
        raise _refusal(kind, index, region)


def _refusal(kind: Kind, index: int, region: Any) -> BadRegion:
    """The BadRegion of a region check_regions refused, naming its first bad field (none when it is not a dict)."""
    if not isinstance(region, dict):
        return BadRegion(kind, index, region, None)
    for field in kind.fields:
        present = field.name in region
        if not present and not field.required:
            continue
        if not present or not _good(field, region[field.name]):
            return BadRegion(kind, index, region, field)
    return BadRegion(kind, index, region, None)


def from_message(kind: Kind, message: Any) -> dict:
    """A region status message of Triton's gRPC API as the HTTP API lists it: every field of the kind the message has,
    the integers as Python ints, so that both transports give the same keys and one check judges them."""
    known = message.DESCRIPTOR.fields_by_name
    return {
        f.name: (getattr(message, f.name) if f.text else int(getattr(message, f.name)))
        for f in kind.fields
        if f.name in known
    }


# Sizes that cannot be true whatever the server: Triton 2.58+ refuses byte_size + offset past 2**63 - 1
ABSURD_BYTES = 1 << 63


class Implausible(ValueError):
    """A well-formed status whose figures cannot be true (a region, or the total, larger than can be)."""


def registered(kind: Kind, regions: Any, shm_bytes: int | None, escape: Callable[[str, int], str]) -> tuple[int, int]:
    """(count, registered bytes) of a status of kind (the event source's reading of one).

    ValueError when it is not a status: not a list, or a region check_regions refuses (the same answer is never up
    there and refused by the modules). Implausible when its figures cannot be true: a region or the total larger
    than shm_bytes (the whole shm filesystem, when known), or than ABSURD_BYTES. escape shows what the server sent.
    """
    if not isinstance(regions, list):
        raise ValueError('expected a JSON list of regions')
    try:
        check_regions(kind, regions)
    except BadRegion as bad:
        raise ValueError(f'not a Triton {kind.name} shared memory status: {bad.describe(escape)}') from None
    limit = min(shm_bytes, ABSURD_BYTES) if shm_bytes else ABSURD_BYTES
    whole = f'the whole shm filesystem ({shm_bytes} bytes)' if shm_bytes else 'can be'
    total = 0
    for region in regions:
        if region['byte_size'] > limit:
            shown = escape(region['name'], 80)
            raise Implausible(f'region {shown!r} has a byte_size of {region["byte_size"]}, more than {whole}')
        total += region['byte_size']
    if total > limit:
        raise Implausible(f'{len(regions)} regions register {total} bytes, more than {whole}')
    return len(regions), total
