# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the families of other software whose files share Triton's /dev/shm (docs/shm-families.md).

One table. Each family names the software, its file name patterns and what the patterns are based on. A file of a
family is never an orphan, whatever orphan_patterns says (classification.file_category); triton_shm_info counts the
files that are not Triton's by family (files, bytes, held and unheld, the holders' containers) so that "df says 94 %
used and nothing is Triton's" has an answer; users add families of their own (the option extra_families). Pure and
standard library only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple


class Family(NamedTuple):
    name: str  # a short label: the key of families[] and of the metric's family label
    patterns: tuple  # shell-style patterns of its file names (fnmatchcase)
    what: str  # whose files, as people read it
    source: str = ''  # what the patterns are based on


FAMILIES = (
    Family('nccl', ('nccl-*',), "NCCL's shared memory", 'NCCL names its intra-node segments /dev/shm/nccl-XXXXXX'),
    Family(
        'vllm',
        ('vllm_offload_*.mmap', 'vllm_*'),
        "vLLM's shared memory (KV cache offload files, its broadcast buffers)",
        "vLLM's CPU offload connector (vllm_offload_*.mmap) and its other vllm_ segments",
    ),
    Family('sglang', ('sgl_shm_*',), "SGLang's shared memory", 'SGLang names its segments sgl_shm_*'),
    Family('psm', ('psm2_shm.*', 'psm_shm.*'), "Intel PSM and PSM2's shared memory", 'PSM2 names them psm2_shm.*'),
    Family('pytorch', ('torch_*',), "PyTorch's shared tensors", 'torch.multiprocessing names them torch_PID_...'),
    Family(
        'python_shared_memory',
        ('psm_*', 'wnsm_*'),
        "Python's multiprocessing.shared_memory (SGLang, Ray and others)",
        'CPython names an unnamed SharedMemory psm_ and 8 hex digits (wnsm_ on Windows)',
    ),
    Family(
        'mpi_ucx',
        ('vader_segment.*', 'sm_segment.*', 'ucx_shm_posix_*'),
        "Open MPI's and UCX's shared memory",
        "Open MPI's vader and sm transports, UCX's posix transport",
    ),
    Family('cuda_ipc', ('cuda.shm.*',), "the CUDA driver's IPC shared memory", "the CUDA driver's cuda.shm.* files"),
    Family('posix_semaphore', ('sem.*',), 'POSIX named semaphores (sem_open)', 'glibc names them sem.NAME'),
    Family(
        'browser',
        ('.org.chromium.*', '.com.google.Chrome.*', 'org.chromium.*', 'org.mozilla.ipc.*', 'wayland.mozilla.ipc.*'),
        'Chromium, Chrome, Electron or Firefox shared memory',
    ),
    Family('audio', ('pulse-shm-*', 'jack-*'), 'PulseAudio or JACK shared memory'),
    Family('postgresql', ('PostgreSQL.*',), "PostgreSQL's dynamic shared memory"),
    Family('qt', ('qipc_sharedmemory_*', 'qipc_systemsem_*'), "Qt's shared memory and system semaphores"),
    Family('other_runtimes', ('mono.*', 'lttng-ust-*'), "the Mono runtime's or LTTng's shared memory"),
)
OTHER = 'other'  # the files that are not Triton's and match no family


def table(extra: Iterable[Mapping] | None = None) -> tuple:
    """FAMILIES, after the users' own (extra_families: [{name, patterns, description}]), theirs first."""
    own = tuple(
        Family(str(f['name']), tuple(str(p) for p in f.get('patterns') or ()), str(f.get('description') or f['name']))
        for f in extra or ()
    )
    return own + FAMILIES


def family_of(name: str, families: Sequence[Family] = FAMILIES) -> Family | None:
    """The first family whose patterns match a file name, or None."""
    for family in families:
        if any(fnmatch.fnmatchcase(name, p) for p in family.patterns):
            return family
    return None


def describe(name: str, families: Sequence[Family] = FAMILIES) -> str | None:
    """Whose file a name of a family is, as people read it ("NCCL's shared memory (nccl-*)"), else None."""
    for family in families:
        for pattern in family.patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return f'{family.what} ({pattern})'
    return None


def check_extra(extra: Iterable[object] | None) -> str | None:
    """Why the users' extra_families cannot be used (None when they can)."""
    seen = set()
    for f in extra or ():
        if not isinstance(f, Mapping) or not f.get('name') or not f.get('patterns'):
            return f'each of extra_families needs a name and patterns, got {f!r}'
        name = str(f['name'])
        if name in seen or name == OTHER:
            return f'extra_families: the name {name!r} is given twice or is reserved'
        seen.add(name)
        if any(p in ('*', '?*', '**') for p in f['patterns']):
            return f'extra_families {name!r}: a pattern that matches every name would make every file a family file'
    return None


def count(files: Iterable[Mapping], families: Sequence[Family] = FAMILIES, not_triton: Iterable[str] = ()) -> list:
    """families[] of triton_shm_info: the files whose category is in not_triton, by family (in table order, OTHER last),
    each with its files and bytes, held and unheld, and the containers of its holders. Families with no file are left
    out."""
    wanted = set(not_triton)
    out: dict = {}
    for f in files:
        if f.get('category') not in wanted or f.get('type', 'file') != 'file':
            continue
        family = family_of(str(f.get('name')), families)
        key = family.name if family else OTHER
        rec = out.setdefault(
            key,
            {
                'name': key,
                'description': family.what if family else "files of no known family (not Triton's)",
                'files': 0,
                'bytes': 0,
                'held_files': 0,
                'held_bytes': 0,
                'unheld_files': 0,
                'unheld_bytes': 0,
                'containers': set(),
            },
        )
        size = int(f.get('allocated_bytes') or 0)
        held = bool(f.get('holders'))
        rec['files'] += 1
        rec['bytes'] += size
        rec['held_files' if held else 'unheld_files'] += 1
        rec['held_bytes' if held else 'unheld_bytes'] += size
        for h in f.get('holders') or ():
            container = h.get('container')
            if isinstance(container, Mapping) and container.get('name'):
                rec['containers'].add(str(container['name']))
    order = [fam.name for fam in families] + [OTHER]
    result = [out[name] for name in order if name in out]
    for rec in result:
        rec['containers'] = sorted(rec['containers'])
    return result
