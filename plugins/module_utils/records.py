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
   with its type), and a changelog fragment.

Still spelt out by hand (issue 35 has the plan): a field's metric (metrics.py), its report columns (the HTML report,
the fleet table) and the role's record filter.
"""

from __future__ import annotations

from typing import NamedTuple

TEXT = 'str'
UINT64 = 'uint64'


class Field(NamedTuple):
    """One key of a region in a status answer (see the module doc)."""

    name: str
    type: str
    required: bool = True
    description: str = ''

    @property
    def text(self) -> bool:
        return self.type == TEXT


class Kind(NamedTuple):
    """A region kind (``system``, ``cuda``) and its fields, in the order Triton documents them."""

    name: str
    fields: tuple

    @property
    def required(self) -> tuple:
        return tuple(f for f in self.fields if f.required)

    @property
    def optional(self) -> tuple:
        return tuple(f for f in self.fields if not f.required)

    def names(self) -> tuple:
        return tuple(f.name for f in self.fields)


SYSTEM = Kind(
    'system',
    (
        Field('name', TEXT, description='The region name.'),
        Field('key', TEXT, description='The shm key (a name under the shm directory, with a leading slash).'),
        Field('offset', UINT64, description='Offset of the region in its file.'),
        Field('byte_size', UINT64, description='Registered size in bytes.'),
    ),
)
CUDA = Kind(
    'cuda',
    (
        Field('name', TEXT, description='The region name.'),
        Field('device_id', UINT64, description="The CUDA device ordinal, as the server's process numbers its GPUs."),
        Field('byte_size', UINT64, description='Registered size in bytes.'),
    ),
)
KINDS = {k.name: k for k in (SYSTEM, CUDA)}
