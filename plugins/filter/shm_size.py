# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shm-size planner: how big a Triton container's /dev/shm must be for a workload.

Documentation: plugins/filter/shm_size.yml (``ansible-doc -t filter tritonops.shm.shm_size``).
"""
from __future__ import annotations

import math
from fractions import Fraction

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
}
REGION_KEYS = ('byte_size', 'count')


def _fail(msg, exc=None):
    raise AnsibleFilterError('shm_size: %s' % msg, orig_exc=exc)


def _size(value, what):
    """A byte count from an int or a size string such as ``64m``; never negative."""
    if isinstance(value, bool) or value is None:
        _fail('%s must be a byte count or a size string such as "64m", got %r' % (what, value))
    if isinstance(value, str):
        try:
            value = human_to_bytes(value.strip())
        except (ValueError, TypeError) as exc:
            _fail('%s: cannot read %r as a size (use bytes or a size such as "64m", "1G")' % (what, value), exc)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        _fail('%s must be a whole number of bytes or a size string, got %r' % (what, value))
    if value < 0:
        _fail('%s must not be negative, got %r' % (what, value))
    return value


def _count(value, what):
    if isinstance(value, bool):
        _fail('%s must be a whole number, got %r' % (what, value))
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or value < 0:
        _fail('%s must be a whole number >= 0, got %r' % (what, value))
    return value


def _fraction(value, what):
    """A non-negative exact fraction from a number or a numeric string (0.25 stays exactly 1/4)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        _fail('%s must be a number, got %r' % (what, value))
    try:
        result = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError) as exc:
        _fail('%s must be a number, got %r' % (what, value), exc)
    if result < 0:
        _fail('%s must not be negative, got %r' % (what, value))
    return result


def _ceil_mib(value):
    return int(math.ceil(value / MIB)) * MIB


def docker_size(num_bytes):
    """The ``--shm-size`` spelling: whole MiB as ``720m``, anything else in bytes (``1000b``)."""
    if num_bytes % MIB == 0:
        return '%dm' % (num_bytes // MIB)
    return '%db' % num_bytes


def _regions(value):
    if value is None:
        return 0
    if not isinstance(value, list):
        _fail('client_regions must be a list of {byte_size, count}, got %r' % (value,))
    total = 0
    for index, region in enumerate(value):
        what = 'client_regions[%d]' % index
        if not isinstance(region, dict):
            _fail('%s must be a dict with byte_size (and count), got %r' % (what, region))
        unknown = sorted(set(region) - set(REGION_KEYS))
        if unknown:
            _fail('%s: unknown key(s) %s (expected byte_size, count)' % (what, ', '.join(unknown)))
        if 'byte_size' not in region:
            _fail('%s: byte_size is required' % what)
        total += _size(region['byte_size'], what + '.byte_size') * _count(region.get('count', 1), what + '.count')
    return total


def shm_size(workload=None, **overrides):
    """Plan a /dev/shm size: ``{bytes, docker, capped, breakdown}`` (see shm_size.yml)."""
    if workload is None:
        workload = {}
    if not isinstance(workload, dict):
        _fail('the input must be a dict describing the workload, got %s' % type(workload).__name__)
    spec = dict(workload)
    spec.update(overrides)
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        _fail('unknown key(s) %s (known: %s)' % (', '.join(unknown), ', '.join(sorted(DEFAULTS))))
    opts = dict(DEFAULTS)
    opts.update((k, v) for k, v in spec.items() if v is not None or k == 'host_memory_bytes')

    client_bytes = _regions(opts['client_regions'])
    instances = _count(opts['python_backend_instances'], 'python_backend_instances')
    peak = _size(opts['python_backend_peak_byte_size'], 'python_backend_peak_byte_size')
    extra = _size(opts['extra_bytes'], 'extra_bytes')
    headroom = _fraction(opts['headroom'], 'headroom')
    floor = _size(opts['floor_bytes'], 'floor_bytes')
    fraction = _fraction(opts['max_host_fraction'], 'max_host_fraction')
    if not 0 < fraction <= 1:
        _fail('max_host_fraction must be > 0 and <= 1, got %r' % (opts['max_host_fraction'],))
    host = opts['host_memory_bytes']
    if host is not None:
        host = _size(host, 'host_memory_bytes')
        if host == 0:
            _fail('host_memory_bytes must be > 0 when given (omit it to plan without a cap)')

    python_bytes = instances * peak
    subtotal = client_bytes + python_bytes + extra
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
    return {
        'bytes': planned,
        'docker': docker_size(planned),
        'capped': capped,
        'breakdown': {
            'client_regions_bytes': client_bytes,
            'python_backend_bytes': python_bytes,
            'extra_bytes': extra,
            'subtotal_bytes': subtotal,
            'headroom': float(headroom),
            'with_headroom_bytes': with_headroom,
            'floor_bytes': floor,
            'host_memory_bytes': host,
            'cap_bytes': cap,
        },
    }


class FilterModule:
    """tritonops.shm filters."""

    def filters(self):
        return {'shm_size': shm_size}
