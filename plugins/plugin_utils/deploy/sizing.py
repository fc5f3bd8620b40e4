# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shm-size planner: how big a Triton container's (or pod's) /dev/shm must be for a workload.

Private to the tritonops.shm collection: no stability promise to other code. Controller code (plugin_utils) that
the filter of the same job adapts (plugins/filter/); it imports what a filter may import (CONTRIBUTING.md, "Imports").

Documentation: plugins/filter/shm_size.yml (``ansible-doc -t filter tritonops.shm.shm_size``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, NoReturn

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.formatters import human_to_bytes

MIB = 1 << 20

DEFAULTS = {
    'client_regions': [],
    'python_backend_instances': 0,
    'python_backend_peak_byte_size': MIB,
    'extra_bytes': 0,
    'headroom': 0.25,
    'host_memory_bytes': None,
    'max_host_fraction': 0.5,
    'floor_bytes': 64 * MIB,
    'server_memory_bytes': None,
    'python_models': [],
    'python_backend_shm_default_byte_size': MIB,
    'python_backend_shm_growth_byte_size': MIB,
    'python_backend_reloads': False,
    'nccl': None,
}
# NCCL's shared-memory transport (docs/sizing.md, "NCCL"): one segment per connection, about 9.2 MiB at the default
# NCCL_BUFFSIZE (4 MiB Simple + LL + LL128 buffers); the reports give 6 to 10 MB per nccl-* file
NCCL_DEFAULTS = {
    'tensor_parallel': 1,
    'pipeline_parallel': 1,
    'channels': 2,
    'segment_byte_size': 10 * MIB,
    'replicas': 1,
}
MODEL_KEYS = ('name', 'instances', 'largest_tensor_bytes')
# Triton's python backend defaults (python_backend README, "Managing Shared Memory"); measured the same on 2.51
TRITON_SHM_DEFAULT = MIB
TRITON_SHM_GROWTH = MIB
REGION_KEYS = ('byte_size', 'count')
# Options that may be None on purpose (None means "not known", not "the default").
NULLABLE = ('host_memory_bytes', 'server_memory_bytes')

# Kubernetes' binary quantities (a node's allocatable memory is "263921344Ki"); Ansible's human_to_bytes reads the rest.
_BINARY_QUANTITY = re.compile(r'^([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei)$')
_BINARY_POWER = {'Ki': 1, 'Mi': 2, 'Gi': 3, 'Ti': 4, 'Pi': 5, 'Ei': 6}

# The pod's /dev/shm: the conventional volume name, and where it is mounted in every container that shares regions.
SHM_VOLUME = 'dshm'
SHM_MOUNT_PATH = '/dev/shm'


def _fail(msg: str, exc: BaseException | None = None) -> NoReturn:
    raise AnsibleFilterError(f'shm_size: {msg}', orig_exc=exc)


def _size(value: Any, what: str) -> int:
    """A byte count from an int, a size string such as ``64m`` or a binary Kubernetes quantity (``16Gi``); never negative."""
    if isinstance(value, bool) or value is None:
        _fail(f'{what} must be a byte count or a size string such as "64m", got {value!r}')
    quantity = _BINARY_QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if quantity:
        value = int(quantity.group(1)) << (10 * _BINARY_POWER[quantity.group(2)])
    elif isinstance(value, str):
        try:
            value = human_to_bytes(value.strip())
        except (ValueError, TypeError) as exc:
            _fail(f'{what}: cannot read {value!r} as a size (use bytes or a size such as "64m", "1G")', exc)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        _fail(f'{what} must be a whole number of bytes or a size string, got {value!r}')
    if value < 0:
        _fail(f'{what} must not be negative, got {value!r}')
    return value


def size_bytes(value: Any, what: str) -> int:
    """A byte count read as the planner reads it: bytes, or a size string with binary units (``4G`` is 4 GiB)."""
    return _size(value, what)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool):
        _fail(f'{what} must be a whole number, got {value!r}')
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or value < 0:
        _fail(f'{what} must be a whole number >= 0, got {value!r}')
    return value


def _fraction(value: Any, what: str) -> Fraction:
    """A non-negative exact fraction from a number or a numeric string (0.25 stays exactly 1/4)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        _fail(f'{what} must be a number, got {value!r}')
    try:
        result = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError) as exc:
        _fail(f'{what} must be a number, got {value!r}', exc)
    if result < 0:
        _fail(f'{what} must not be negative, got {value!r}')
    return result


def _ceil_mib(value: Any) -> int:
    return int(math.ceil(value / MIB)) * MIB


def docker_size(num_bytes: int) -> str:
    """The ``--shm-size`` spelling: whole MiB as ``720m``, anything else in bytes (``1000b``)."""
    if num_bytes % MIB == 0:
        return f'{num_bytes // MIB}m'
    return f'{num_bytes}b'


def kubernetes_quantity(num_bytes: int) -> str:
    """A Kubernetes quantity: whole MiB as ``720Mi``, anything else as plain bytes (``1000``)."""
    if num_bytes % MIB == 0:
        return f'{num_bytes // MIB}Mi'
    return str(num_bytes)


def pod_shm(
    shm_bytes: int,
    server_memory_bytes: int | None = None,
    python_pools: bool = False,
    server_args: list | None = None,
) -> dict:
    """The pod spec fragment for a /dev/shm of shm_bytes: the memory-backed emptyDir, its mount, the memory limit to set.

    The suggested memory limit is the /dev/shm plus the server's own memory when that is known, else the /dev/shm
    alone (a floor, never enough by itself); ``memory_limit_includes_server`` says which. python_pools: the pod
    serves python-based models, whose pools a container restart leaves in the emptyDir (one more note).
    server_args: the tritonserver arguments the plan assumes (the python backend's growth settings).
    """
    size_limit = kubernetes_quantity(shm_bytes)
    known = server_memory_bytes is not None
    limit_bytes = _ceil_mib(shm_bytes + (server_memory_bytes or 0))
    limit = kubernetes_quantity(limit_bytes)
    if known:
        limit_note = (
            f'Set resources.limits.memory of the Triton container to at least {limit}: the {size_limit} of '
            f"/dev/shm plus the server's own {kubernetes_quantity(_ceil_mib(server_memory_bytes))}."
        )
    else:
        limit_note = (
            f'Set resources.limits.memory of the Triton container to {size_limit} (the /dev/shm) PLUS the '
            "server's own memory (tritonserver and its python backend stubs, measured at peak): give it as "
            'server_memory_bytes and the plan adds it. A limit of the /dev/shm alone gets the container '
            'OOM-killed when /dev/shm fills.'
        )
    return {
        'volume': {'name': SHM_VOLUME, 'emptyDir': {'medium': 'Memory', 'sizeLimit': size_limit}},
        'volume_mount': {'name': SHM_VOLUME, 'mountPath': SHM_MOUNT_PATH},
        'size_limit': size_limit,
        'memory_limit': limit,
        'memory_limit_bytes': limit_bytes,
        'memory_limit_includes_server': known,
        'server_args': list(server_args or ()),
        'notes': [
            'A memory-backed emptyDir (medium: Memory) is a tmpfs: the pages written to it count against the memory '
            "limit of the container that writes them, and against the pod's memory.",
            limit_note,
            "Kubernetes sizes the tmpfs to the smaller of sizeLimit and the sum of the memory limits of the pod's "
            'containers (SizeMemoryBackedVolumes: beta and on since 1.22, GA in 1.32): a lower memory limit gives a '
            'smaller /dev/shm than planned.',
            f'When the volume\'s usage exceeds sizeLimit the kubelet evicts the pod ("Usage of EmptyDir volume '
            f'"{SHM_VOLUME}" exceeds the limit", kubernetes/kubernetes#28272). Regions leaked by killed clients count '
            'until they are cleaned up.',
            *(
                [
                    "The python backend's pools (triton_python_backend_shm_region_*) count too, and a memory-backed emptyDir "
                    'survives a container restart (kubernetes/kubernetes#81001): each crash of the Triton container leaves its '
                    'pools behind as leftovers, until the cleanup removes them (tritonops.shm.shm_cleanup, '
                    'shm_cleanup_backend_leftovers) or the pod is evicted.'
                ]
                if python_pools
                else []
            ),
            f'Mount the volume at {SHM_MOUNT_PATH} in every container of the pod that shares regions with Triton '
            "(clients, sidecars); the pod's containers already share the IPC namespace.",
        ],
    }


def _items(value: Any, name: str, keys: tuple, required: str) -> list:
    """[(its name in messages, item)] of a list of dicts with only keys and always required; AnsibleFilterError else."""
    if value is None:
        return []
    shape = '{' + ', '.join(keys) + '}'
    if not isinstance(value, list):
        _fail(f'{name} must be a list of {shape}, got {value!r}')
    out = []
    for index, item in enumerate(value):
        what = f'{name}[{index}]'
        if not isinstance(item, dict):
            _fail(
                f'{what} must be a dict with {required} (and {", ".join(k for k in keys if k != required)}), got {item!r}'
            )
        unknown = sorted(set(item) - set(keys))
        if unknown:
            _fail(f'{what}: unknown key(s) {", ".join(unknown)} (expected {", ".join(keys)})')
        if required not in item:
            _fail(f'{what}: {required} is required')
        out.append((what, item))
    return out


def _regions(value: Any) -> int:
    return sum(
        _size(region['byte_size'], f'{what}.byte_size') * _count(region.get('count', 1), f'{what}.count')
        for what, region in _items(value, 'client_regions', REGION_KEYS, 'byte_size')
    )


def pool_bytes(largest: int, default: int, growth: int) -> int:
    """The size one python backend instance's pool reaches for one request of largest bytes (inputs plus outputs).

    It starts at default; a request that does not fit grows it by growth * (largest // growth + 1) (the python
    backend's own step: the tensor, rounded down to growth, plus one growth). It never shrinks. Measured on Triton
    2.51 (docs/backend-pools.md): 32 MiB from 1 MiB/1 MiB gives 34 MiB; 20 MiB from 4 MiB/8 MiB gives 28 MiB.
    """
    if largest < default:
        return default
    return default + growth * (largest // growth + 1)


def pool_bound(largest: int, default: int, growth: int) -> int:
    """The most one instance's pool can reach for requests of up to largest bytes, arriving in any order.

    A pool grows only for a request that does not fit it, so only while it is smaller than that request plus its
    bookkeeping (less than one growth step), and each time by growth * (request // growth + 1). Requests rising to
    largest can therefore leave it just too small for largest, then grow it once more: at most
    largest + growth + growth * (largest // growth + 1). Measured on Triton 2.51: 3 MiB then 20 MiB from 1 MiB/1 MiB
    steps gives 27 MiB (one 20 MiB request: 22 MiB; this bound: 42 MiB).
    """
    if largest < default:
        return default
    return largest + growth + growth * (largest // growth + 1)


def _models(value: Any, default: int, growth: int) -> list:
    """The per-model pool plan of python_models: [{name, instances, largest_tensor_bytes, pool_bytes, bytes, growth_bytes, explanation}]."""  # noqa: E501
    out = []
    for index, (what, model) in enumerate(_items(value, 'python_models', MODEL_KEYS, 'largest_tensor_bytes')):
        name = str(model.get('name') or f'model{index}')
        instances = _count(model.get('instances', 1), f'{what}.instances')
        largest = _size(model['largest_tensor_bytes'], f'{what}.largest_tensor_bytes')
        once = pool_bytes(largest, default, growth)
        pool = pool_bound(largest, default, growth)
        if pool == default:
            why = (
                f'{name}: {instances} instance(s) x {pool} bytes: its largest tensor ({largest} bytes) fits the '
                f'starting pool (shm-default-byte-size {default})'
            )
        else:
            why = (
                f'{name}: {instances} instance(s) x {pool} bytes: each pool starts at {default} bytes '
                f'(shm-default-byte-size) and grows in {growth}-byte steps (shm-growth-byte-size) for a request that '
                f'does not fit it, and never shrinks. One request of {largest} bytes takes a new pool to {once} bytes '
                f'({default} + {growth} x ({largest} // {growth} + 1)); requests rising to {largest} bytes can leave '
                f'it just too small for the largest first, then grow it once more: at most {largest} + {growth} + '
                f'{growth} x ({largest} // {growth} + 1) = {pool} bytes, which is planned'
            )
        out.append(
            {
                'name': name,
                'instances': instances,
                'largest_tensor_bytes': largest,
                'pool_bytes': pool,
                'one_request_pool_bytes': once,
                'bytes': instances * pool,
                'growth_bytes': instances * (pool - default),
                'explanation': why,
            }
        )
    return out


def _python_backend(models: list, default: int, growth: int, reloads: bool) -> dict:
    """The python backend part of the plan: the pools per model, the reload headroom, the server arguments."""
    reload_bytes = max((m['instances'] for m in models), default=0) * default if reloads else 0
    args = []
    if default != TRITON_SHM_DEFAULT:
        args.append(f'--backend-config=python,shm-default-byte-size={default}')
    if growth != TRITON_SHM_GROWTH:
        args.append(f'--backend-config=python,shm-growth-byte-size={growth}')
    notes = [m['explanation'] for m in models]
    if reload_bytes:
        notes.append(
            f"{reload_bytes} bytes for a reload (tritonops.shm.triton_backend_pool): a reloaded model's new "
            f'instances get new pools of {default} bytes while the old ones are still there (about a second '
            'on Triton 2.51); one model at a time, the one with the most instances'
        )
    if models:
        notes.append(
            'Pools never shrink: a pool grown by one large request keeps its size until its model is '
            'reloaded or the server restarts (docs/backend-pools.md).'
        )
    return {
        'shm_default_byte_size': default,
        'shm_growth_byte_size': growth,
        'server_args': args,
        'models': models,
        'pools_bytes': sum(m['bytes'] for m in models),
        'growth_bytes': sum(m['growth_bytes'] for m in models),
        'reload_bytes': reload_bytes,
        'notes': notes,
    }


def nccl_plan(value: Any) -> dict:
    """NCCL's nccl-* segments in the shm directory for ranks of tensor and pipeline parallel models on one node.

    Each rank of a replica keeps, per channel, a send and a receive connection to its ring neighbours when tensor
    parallel (tp > 1), and to the stages before and after it when pipeline parallel (pp > 1); each connection is one
    segment. segments = replicas * tp * pp * ((2 if tp > 1 else 0) + (2 if pp > 1 else 0)) * channels.
    """
    if value is None:
        return {'segments': 0, 'bytes': 0, 'explanation': 'no NCCL ranks planned'}
    if not isinstance(value, dict):
        _fail(f'nccl must be a dict ({", ".join(NCCL_DEFAULTS)}), got {type(value).__name__}')
    unknown = sorted(set(value) - set(NCCL_DEFAULTS))
    if unknown:
        _fail(f'nccl: unknown key(s) {", ".join(unknown)} (known: {", ".join(sorted(NCCL_DEFAULTS))})')
    opts = dict(NCCL_DEFAULTS)
    opts.update((k, v) for k, v in value.items() if v is not None)
    tp = _count(opts['tensor_parallel'], 'nccl.tensor_parallel')
    pp = _count(opts['pipeline_parallel'], 'nccl.pipeline_parallel')
    channels = _count(opts['channels'], 'nccl.channels')
    replicas = _count(opts['replicas'], 'nccl.replicas')
    segment = _size(opts['segment_byte_size'], 'nccl.segment_byte_size')
    if min(tp, pp) < 1:
        _fail('nccl.tensor_parallel and nccl.pipeline_parallel must be at least 1')
    per_rank = ((2 if tp > 1 else 0) + (2 if pp > 1 else 0)) * channels
    ranks = replicas * tp * pp
    segments = ranks * per_rank
    return {
        'ranks': ranks,
        'segments_per_rank': per_rank,
        'segments': segments,
        'bytes': segments * segment,
        'explanation': (
            f'{replicas} replica(s) x tp {tp} x pp {pp} = {ranks} rank(s), each with {per_rank} nccl-* segment(s) '
            f'(a send and a receive connection per ring neighbour and pipeline stage, {channels} channel(s)) '
            f'of {segment} bytes'
        ),
    }


def shm_size(workload: dict | None = None, **overrides: Any) -> dict:
    """Plan a /dev/shm size: ``{bytes, docker, capped, breakdown, kubernetes}`` (see shm_size.yml)."""
    if workload is None:
        workload = {}
    if not isinstance(workload, dict):
        _fail(f'the input must be a dict describing the workload, got {type(workload).__name__}')
    spec = dict(workload)
    spec.update(overrides)
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        _fail(f'unknown key(s) {", ".join(unknown)} (known: {", ".join(sorted(DEFAULTS))})')
    opts = dict(DEFAULTS)
    opts.update((k, v) for k, v in spec.items() if v is not None or k in NULLABLE)

    client_bytes = _regions(opts['client_regions'])
    instances = _count(opts['python_backend_instances'], 'python_backend_instances')
    peak = _size(opts['python_backend_peak_byte_size'], 'python_backend_peak_byte_size')
    extra = _size(opts['extra_bytes'], 'extra_bytes')
    headroom = _fraction(opts['headroom'], 'headroom')
    floor = _size(opts['floor_bytes'], 'floor_bytes')
    fraction = _fraction(opts['max_host_fraction'], 'max_host_fraction')
    if not 0 < fraction <= 1:
        _fail(f'max_host_fraction must be > 0 and <= 1, got {opts["max_host_fraction"]!r}')
    host = opts['host_memory_bytes']
    if host is not None:
        host = _size(host, 'host_memory_bytes')
        if host == 0:
            _fail('host_memory_bytes must be > 0 when given (omit it to plan without a cap)')
    server_memory = opts['server_memory_bytes']
    if server_memory is not None:
        server_memory = _size(server_memory, 'server_memory_bytes')

    shm_default = _size(opts['python_backend_shm_default_byte_size'], 'python_backend_shm_default_byte_size')
    shm_growth = _size(opts['python_backend_shm_growth_byte_size'], 'python_backend_shm_growth_byte_size')
    if shm_default == 0 or shm_growth == 0:
        _fail('python_backend_shm_default_byte_size and python_backend_shm_growth_byte_size must be > 0')
    reloads = opts['python_backend_reloads']
    if not isinstance(reloads, bool):
        _fail(f'python_backend_reloads must be true or false, got {reloads!r}')
    python = _python_backend(_models(opts['python_models'], shm_default, shm_growth), shm_default, shm_growth, reloads)

    nccl = nccl_plan(opts['nccl'])
    python_bytes = instances * peak
    subtotal = client_bytes + python_bytes + python['pools_bytes'] + python['reload_bytes'] + nccl['bytes'] + extra
    with_headroom = _ceil_mib(subtotal * (1 + headroom))
    planned = max(floor, with_headroom)
    cap = None
    capped = False
    if host is not None:
        exact_cap = int(math.floor(host * fraction))
        cap = exact_cap // MIB * MIB or exact_cap
        if planned > cap:
            planned = cap
            capped = True
    kubernetes = pod_shm(
        planned, server_memory, python_pools=bool(python['models'] or instances), server_args=python['server_args']
    )
    return {
        'bytes': planned,
        'docker': docker_size(planned),
        'capped': capped,
        'breakdown': {
            'client_regions_bytes': client_bytes,
            'python_backend_bytes': python_bytes,
            'python_models_bytes': python['pools_bytes'],
            'python_growth_bytes': python['growth_bytes'],
            'python_reload_bytes': python['reload_bytes'],
            'nccl_bytes': nccl['bytes'],
            'extra_bytes': extra,
            'subtotal_bytes': subtotal,
            'headroom': float(headroom),
            'with_headroom_bytes': with_headroom,
            'floor_bytes': floor,
            'host_memory_bytes': host,
            'cap_bytes': cap,
        },
        'python_backend': python,
        'nccl': nccl,
        'kubernetes': kubernetes,
    }
