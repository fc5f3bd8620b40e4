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
   with its type); with a ``metric``, docs/metrics.md and docs/metrics.zh.md (test_metrics_docs.py); a changelog
   fragment.

A field shows itself where it says: ``column`` in the HTML report's region table (html_report.py), ``metric`` as a
report gauge of the node_exporter textfile (metrics.py). Not driven from here: the fleet table's and the role's
record's columns, which pick summary counts (vocabulary.py), not region fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

TEXT = 'str'
UINT64 = 'uint64'


BYTES = 'bytes'


class Field(NamedTuple):
    """One key of a region in a status answer (see the module doc), and where it is shown.

    column: its heading in the HTML report's region table ('' for none; an optional field's column appears when a
    region carries it); unit: ``BYTES`` for a size (shown as one); metric, metric_help: a report gauge (metrics.py)
    that sums the field over the registered regions of its kind ('' for none; ``UINT64`` fields only; an optional
    field's gauge is written when a region carries it).
    """

    name: str
    type: str
    required: bool = True
    description: str = ''
    column: str = ''
    unit: str = ''
    metric: str = ''
    metric_help: str = ''

    @property
    def text(self) -> bool:
        return self.type == TEXT


class Kind(NamedTuple):
    """A region kind (``system``, ``cuda``) and its fields, in the order Triton documents them."""

    name: str
    fields: tuple
    files: bool = False  # its regions are backed by files of the shm directory
    registration: tuple = ()  # what registering one takes beside its name (triton_shm_region's options)

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

    def columns(self, regions: Sequence[dict]) -> tuple:
        """The fields with a report column, but the name, that regions show (an optional one only when carried)."""
        return tuple(
            f
            for f in self.fields
            if f.column and f.name != 'name' and (f.required or any(f.name in r for r in regions))
        )


SYSTEM = Kind(
    'system',
    (
        Field('name', TEXT, description='The region name.', column='region'),
        Field(
            'key', TEXT, description='The shm key (a name under the shm directory, with a leading slash).', column='key'
        ),
        Field('offset', UINT64, description='Offset of the region in its file.'),
        Field(
            'byte_size',
            UINT64,
            description='Registered size in bytes.',
            column='size',
            unit=BYTES,
            metric='tritonops_shm_registered_bytes',
            metric_help='Sum of the byte sizes of the registered system regions.',
        ),
    ),
    files=True,
    registration=('key', 'byte_size'),
)
CUDA = Kind(
    'cuda',
    (
        Field('name', TEXT, description='The region name.'),
        Field('device_id', UINT64, description="The CUDA device ordinal, as the server's process numbers its GPUs."),
        Field('byte_size', UINT64, description='Registered size in bytes.'),
    ),
    registration=('raw_handle', 'device_id', 'byte_size'),
)
KINDS = {k.name: k for k in (SYSTEM, CUDA)}


def metric_fields() -> tuple:
    """(kind, field) for every field with a report gauge, kinds and fields in their order."""
    return tuple((kind, f) for kind in KINDS.values() for f in kind.fields if f.metric)
