# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Region kinds as objects: what differs between system and CUDA shared memory, each said once.

Private to the tritonops.shm collection: no stability promise to other code.

A ``RegionKind`` is what triton_shm_region does differently for one kind of region; region_ops.py takes the kind
object of the ``kind`` parameter and has no branch on its name. Each kind gives:

- ``record``: its fields (records.Kind), and whether its regions are backed by files of the shm directory;
- ``holders``: its holder evidence, as the docs and messages say it (system: the processes that map or open the
  backing file, by device and inode; CUDA: the processes with a CUDA context on the region's GPU, by NVML and by
  the /proc scan, gpu.py);
- ``state``: its state rule (classification.py: (snap, region, criteria) -> the region's record with ``state`` and
  ``state_reason``; classify() applies it);
- ``plan_present`` and ``plan_absent``: its plans (region_plan.py; by default those of a kind without files:
  plan_present_memory, plan_absent_memory);
- ``register_call`` and ``restore_call``: how a region of the kind is registered, and registered again when an
  operator's new spec replaced it (by default: the client's register with the values records.Kind.register names);
- ``gpu_memory`` (records.Kind.gpu): its regions are GPU memory, so an unregister measures what came back (NVML,
  ``freed_gpu_bytes``).

Every kind reads one snapshot of the server (snapshot.read_server, its own region list) and takes the per-server
lock like system memory: the CUDA rule decides from holders read under it.

**Add a kind**: its ``Kind`` in records.py (fields, API name, register values, summary states) and one
``RegionKind`` here with its holder evidence (its state rule; for CUDA: classification.gpu_record, on what gpu.py
reads); the snapshot, the plans, the results, the metrics and the reports take it from there
(tests/unit/plugins/module_utils/test_third_kind.py); triton_shm_region's options and the RETURN docs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, records, region_plan
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Snapshot


def _register(client: Any, kind: records.Kind, name: str, p: dict) -> object:
    """Register name with the values of p the kind's register call sends (offset 0 when not given)."""
    return client.register(kind.name, name, {f: (p.get(f) or 0) if f == 'offset' else p[f] for f, _t in kind.register})


def _restore(client: Any, kind: records.Kind, cur: dict) -> object:
    """Register again a region as its status listed it: every value its register call sends is a field of it."""
    return _register(client, kind, cur['name'], cur)


class RegionKind(NamedTuple):
    """One kind of region and what triton_shm_region does with it (see the module doc)."""

    record: records.Kind
    holders: str
    state: Callable[..., dict]
    plan_present: Callable[[Snapshot, dict], region_plan.Plan] = region_plan.plan_present_memory
    plan_absent: Callable[..., region_plan.Plan] = region_plan.plan_absent_memory
    register_call: Callable[[Any, records.Kind, str, dict], object] = _register
    restore_call: Callable[[Any, records.Kind, dict], object] = _restore

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def gpu_memory(self) -> bool:
        """Whether its regions are GPU memory: an unregister measures what NVML gives back."""
        return self.record.gpu

    @property
    def files(self) -> bool:
        """Whether its regions are backed by files of the shm directory (to remove, mark, create)."""
        return self.record.files

    def regions(self, snap: Snapshot) -> list:
        """The regions of this kind a snapshot read."""
        return snap.of(self.name)

    def spec(self, region: dict) -> dict:
        return self.record.spec(region)

    def register(self, client: Any, name: str, p: dict) -> object:
        """Register a region of this kind named name with the options p."""
        return self.register_call(client, self.record, name, p)

    def restore(self, client: Any, cur: dict) -> object:
        """Register again the registration cur that an operator's new spec replaced."""
        return self.restore_call(client, self.record, cur)


def _restore_cuda(_client: Any, _kind: records.Kind, cur: dict) -> object:
    raise TritonError(
        f"Triton's status never shows a CUDA region's IPC handle, so the previous registration of "
        f"'{cur['name']}' cannot be made again: register it with the raw_handle of memory that its "
        'owner still holds (cudaIpcGetMemHandle in that process)'
    )


SYSTEM = RegionKind(
    record=records.SYSTEM,
    holders='the processes that map or open the backing file, by device and inode (holders.py)',
    state=classification.file_region_record,
    plan_present=region_plan.plan_present,
    plan_absent=region_plan.plan_absent,
)
CUDA = RegionKind(
    record=records.CUDA,
    holders="the processes with a CUDA context on the region's GPU: NVML's compute processes and /proc (gpu.py)",
    state=classification.gpu_record,
    restore_call=_restore_cuda,
)
KINDS = {k.name: k for k in (SYSTEM, CUDA)}


def rules() -> dict:
    """{kind name: its state rule} of every kind (classification.classify's rules)."""
    return {name: kind.state for name, kind in KINDS.items()}
