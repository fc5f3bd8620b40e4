# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the one state vocabulary (region states, file categories, backend pool states).

One definition, one order. classification.py decides states and categories with these names and results.py counts
them in its summary in this order; metrics.py labels its series with them; the HTML report lists them in its legend
and sorts by the attention orders below. docs/concepts.md explains each word. Standard library only and no I/O: the
filters import it.
"""

from __future__ import annotations

# region states (docs/concepts.md, "Region states")
HEALTHY = 'healthy'
STALE = 'stale'
RESERVED = 'reserved'
DANGLING = 'dangling'
UNKNOWN = 'unknown'
SUSPECT = 'suspect'  # its key is one of Triton's own backend files (a python backend pool): an attack, never healthy
WEDGED = 'wedged'  # stale, but Triton refused or deferred its unregister run after run: only a restart frees it
REGION_STATES = (HEALTHY, STALE, RESERVED, DANGLING, UNKNOWN, SUSPECT, WEDGED)
# the states a reader must look at (the HTML report marks them), most urgent first
ATTENTION_STATES = (SUSPECT, WEDGED, STALE, DANGLING, UNKNOWN)
# every state, those that need attention first: the order of a host's region table
REGION_STATES_BY_ATTENTION = ATTENTION_STATES + tuple(s for s in REGION_STATES if s not in ATTENTION_STATES)

# the states of a region of GPU memory (docs/cuda.md): stale by the CUDA rule, or unknown (records.CUDA.states)
GPU_STATES = (STALE, UNKNOWN)

# file categories (docs/concepts.md, "File categories")
REGISTERED = 'registered'
BACKEND = 'backend'
LEFTOVER = 'leftover'
IN_USE = 'in_use'
ORPHAN = 'orphan'
FOREIGN = 'foreign'
FILE_CATEGORIES = (REGISTERED, BACKEND, LEFTOVER, IN_USE, ORPHAN, FOREIGN)
# the categories of Triton's files, which a cleanup acts on or protects: always listed file by file (results.py)
TRITON_CATEGORIES = (REGISTERED, BACKEND, LEFTOVER, ORPHAN)

# backend pool states (triton_shm_info's backend_pools): held by a process, a leftover file, or not decidable
POOL_LIVE = 'live'
POOL_LEFTOVER = LEFTOVER
POOL_UNKNOWN = UNKNOWN
POOL_STATES = (POOL_LIVE, POOL_LEFTOVER, POOL_UNKNOWN)
# the pools that need attention first: the order of the HTML report's pool table
POOL_STATES_BY_ATTENTION = (POOL_LEFTOVER, POOL_UNKNOWN, POOL_LIVE)


def region_count_key(state: str) -> str:
    """The summary key that counts the regions in state (``stale`` → ``stale_regions``)."""
    return f'{state}_regions'


def file_count_key(category: str) -> str:
    """The summary key that counts the files of category (``orphan`` → ``orphan_files``)."""
    return f'{category}_files'


def region_bytes_key(state: str) -> str:
    """The summary key of the bytes the files of the regions in state occupy (``stale`` → ``stale_bytes``)."""
    return f'{state}_bytes'


def file_bytes_key(category: str) -> str:
    """The summary key of the bytes the files of category occupy (``orphan`` → ``orphan_bytes``)."""
    return f'{category}_bytes'


def kind_count_key(kind: str, state: str) -> str:
    """The summary key that counts the regions of a kind without files in state (``stale`` of CUDA's →
    ``cuda_stale_regions``)."""
    return f'{kind}_{state}_regions'


def kind_bytes_key(kind: str, state: str) -> str:
    """The summary key of the bytes of the regions of a kind without files in state (``cuda_stale_bytes``)."""
    return f'{kind}_{state}_bytes'
