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
- ``state``: its state rule (classification.py: a region's record with ``state`` and ``state_reason``);
- ``plan_present`` and ``plan_absent``: its plans (region_plan.py: which regions state=absent selects);
- ``register`` and ``restore``: the calls that register a region of the kind, and that register again the
  registration an operator's new spec replaced;
- ``gpu_memory``: its regions are GPU memory, so an unregister measures what came back (NVML, ``freed_gpu_bytes``).

Every kind reads one snapshot of the server (snapshot.read_server, its own region list) and takes the per-server
lock like system memory: the CUDA rule decides from holders read under it.

**Add a kind**: its fields in records.py, one ``RegionKind`` here with its plans (region_plan.py), its state rule
(classification.py) and its holder evidence (for CUDA: gpu.py, read by snapshot.read_server), the client's register
call (client.py and the transports), triton_shm_region's options and RETURN docs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils import classification, records, region_plan
from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.facts import Snapshot


class RegionKind(NamedTuple):
    """One kind of region and what triton_shm_region does with it (see the module doc)."""

    record: records.Kind
    holders: str
    state: Callable[..., dict]
    plan_present: Callable[[Snapshot, dict], region_plan.Plan]
    plan_absent: Callable[..., region_plan.Plan]
    register: Callable[[Any, str, dict], object]
    restore: Callable[[Any, dict], object]
    gpu_memory: bool = False  # its regions are GPU memory: an unregister measures what NVML gives back

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def files(self) -> bool:
        """Whether its regions are backed by files of the shm directory (to remove, mark, create)."""
        return self.record.files

    def regions(self, snap: Snapshot) -> list:
        """The regions of this kind a snapshot read."""
        return snap.system if self.files else snap.cuda

    def spec(self, region: dict) -> dict:
        return self.record.spec(region)


def _register_system(client: Any, name: str, p: dict) -> object:
    return client.register_system(name, p['key'], p['offset'], p['byte_size'])


def _restore_system(client: Any, cur: dict) -> object:
    return client.register_system(cur['name'], cur['key'], cur.get('offset', 0), cur['byte_size'])


def _register_cuda(client: Any, name: str, p: dict) -> object:
    return client.register_cuda(name, p['raw_handle'], p['device_id'], p['byte_size'])


def _restore_cuda(client: Any, cur: dict) -> object:
    raise TritonError(
        f"Triton's status never shows a CUDA region's IPC handle, so the previous registration of "
        f"'{cur['name']}' cannot be made again: register it with the raw_handle of memory that its "
        'owner still holds (cudaIpcGetMemHandle in that process)'
    )


SYSTEM = RegionKind(
    record=records.SYSTEM,
    holders='the processes that map or open the backing file, by device and inode (holders.py)',
    state=classification.region_record,
    plan_present=region_plan.plan_present,
    plan_absent=region_plan.plan_absent,
    register=_register_system,
    restore=_restore_system,
)
CUDA = RegionKind(
    record=records.CUDA,
    holders="the processes with a CUDA context on the region's GPU: NVML's compute processes and /proc (gpu.py)",
    state=classification.cuda_record,
    plan_present=region_plan.plan_present_cuda,
    plan_absent=region_plan.plan_absent_cuda,
    register=_register_cuda,
    restore=_restore_cuda,
    gpu_memory=True,
)
KINDS = {k.name: k for k in (SYSTEM, CUDA)}
