# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the node_exporter textfile metrics of one Triton server.

The one definition of the metric set (``METRICS``). Two files per (inventory host, URL), so that
several servers on one machine never overwrite each other's series:

- ``report_text()``: the server's shared memory as a query saw it (the report playbook, and
  triton_shm_info), file ``file_name(REPORT, host, url)``;
- ``cleanup_text()``: the outcome of the last cleanup (the shm_cleanup role), file
  ``file_name(CLEANUP, host, url)``; its counters go on from the previous file (``read_textfile()``).

``write_textfile()`` writes one of them by the one writer of outputs (outputs.py: atomic). It never fails the caller:
a missing directory, a directory reached through a symlink, or one that cannot be written gives a warning and writes
nothing. Check mode is the caller's job: do not call it in check mode.

``write_server_metrics()`` is what the modules' ``metrics_dir`` option does (module_utils/run/base.py):
the report file from the module's own result and, for triton_shm_region, the cleanup file from the
call's outcome (``call_outcome()``), its counter continued from the previous file; one warning at
most when the directory cannot take them.

Standard library only (and the collection's records.py, connection.py, metrics_text.py (the text format, both ways),
outputs.py and vocabulary.py, standard library too): the filters import it in every Ansible worker process.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics_text, outputs
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records

# the label values of tritonops_shm_regions{state} and tritonops_shm_files{category}, in the one order
from ansible_collections.tritonops.shm.plugins.module_utils.rules.vocabulary import (
    FILE_CATEGORIES,
    POOL_LEFTOVER,
    REGION_STATES,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import redact_url

REPORT = 'report'
CLEANUP = 'cleanup'
FILE_BASES = {REPORT: 'tritonops_shm', CLEANUP: 'tritonops_shm_cleanup'}

# At most this many values of the ``model`` label of tritonops_shm_backend_pool_bytes per textfile (per server): the
# models with the most pool bytes keep their name, the others are summed under OTHER_MODELS. Pools no python stub maps
# (their model cannot be read) are under UNATTRIBUTED.
MODEL_LABEL_CAP = 20
OTHER_MODELS = '_other'
UNATTRIBUTED = '_unattributed'

# the reason label of tritonops_shm_holders_complete 0, coarse so that the series stay few (the text, with pids and
# paths, is the module's holders_incomplete_reason): outside the host's initial PID namespace, the shm directory not
# read, processes that could not be inspected (not root), /proc mounted with hidepid; unknown: a result without it
HOLDERS_INCOMPLETE_REASONS = ('pid_namespace', 'shm_dir', 'unreadable_processes', 'hidepid', 'unknown')
# the holder label of tritonops_shm_held_bytes: a container's or pod's name, 'host' for processes outside containers; at
# most this many series per server (the largest), the rest summed under 'other', so a busy server stays a few series
HELD_BY_MAX = 10


class Metric(NamedTuple):
    name: str
    type: str
    help: str
    kind: str


def total_metric(field: records.Field) -> str:
    """The report gauge of a region field that adds up (records.Field.total): ``tritonops_shm_<total>``."""
    return f'tritonops_shm_{field.total}'


METRICS = {
    m.name: m
    for m in (
        Metric(
            'tritonops_shm_up',
            'gauge',
            '1 when the server answered the shared-memory query, 0 when it could not be queried.',
            REPORT,
        ),
        Metric(
            'tritonops_shm_server_located',
            'gauge',
            '1 when the tritonserver process behind the URL was found on this host, so its /dev/shm could be checked.',
            REPORT,
        ),
        Metric(
            metrics_text.HOLDERS_COMPLETE,
            'gauge',
            "1 when every process that may hold the server's files could be seen, 0 when not (nothing is then stale); "
            'pid_namespace is initial or other, reason one of HOLDERS_INCOMPLETE_REASONS (empty when complete).',
            REPORT,
        ),
        Metric(
            'tritonops_shm_report_timestamp_seconds', 'gauge', 'When the server was last queried (Unix time).', REPORT
        ),
        Metric(
            'tritonops_shm_server_container_info',
            'gauge',
            'The container or pod the server runs in (value always 1): container is its name (pod NAMESPACE/NAME, '
            'pod UID, or ENGINE ID), runtime its engine; only for a server in a container.',
            REPORT,
        ),
        Metric(
            'tritonops_shm_held_bytes',
            'gauge',
            "Bytes of registered regions' files held, by holder: a container or pod name, host for processes outside "
            f'containers; at most {HELD_BY_MAX} series, the rest summed as other.',
            REPORT,
        ),
        Metric('tritonops_shm_server_info', 'gauge', 'The Triton version the server reports (value always 1).', REPORT),
        Metric(
            'tritonops_shm_fs_size_bytes',
            'gauge',
            "Size of the server's /dev/shm (the container's --shm-size).",
            REPORT,
        ),
        Metric('tritonops_shm_fs_used_bytes', 'gauge', "Used bytes of the server's /dev/shm.", REPORT),
        # a gauge for each region field that adds up (records.py: the field's total says what the sum is)
        *(Metric(total_metric(f), 'gauge', f.total_description, REPORT) for _kind, f in records.totals()),
        Metric('tritonops_shm_regions', 'gauge', 'Registered system shared-memory regions by state.', REPORT),
        # each kind without files: its count; a kind of GPU memory: its bytes by device, GPU and state
        *(
            Metric(
                f'tritonops_shm_{k.name}_regions',
                'gauge',
                f'Registered {k.name.upper()} shared-memory regions.',
                REPORT,
            )
            for k in records.KINDS.values()
            if not k.files
        ),
        *(
            Metric(
                f'tritonops_shm_{k.name}_region_bytes',
                'gauge',
                f'GPU bytes of the registered {k.name.upper()} regions, by device (Triton device_id), uuid (the NVML GPU '
                f'the device is proven to name, empty when not proven) and state ({", ".join(k.states)}).',
                REPORT,
            )
            for k in records.KINDS.values()
            if k.gpu
        ),
        Metric(
            'tritonops_shm_gpu_server_bytes',
            'gauge',
            "GPU memory NVML charges to the server process, by device (NVML index) and uuid (the GPU's UUID): a killed "
            "client's CUDA region is charged to the server.",
            REPORT,
        ),
        Metric('tritonops_shm_stale_bytes', 'gauge', "Bytes of /dev/shm held by stale regions' files.", REPORT),
        Metric('tritonops_shm_files', 'gauge', "Files in the server's /dev/shm by category.", REPORT),
        Metric('tritonops_shm_orphan_bytes', 'gauge', 'Bytes of /dev/shm held by orphan files.', REPORT),
        Metric(
            'tritonops_shm_leftover_bytes',
            'gauge',
            "Bytes of /dev/shm held by leftover backend pools (no process holds them: a dead server's and its stubs').",
            REPORT,
        ),
        Metric(
            'tritonops_shm_family_bytes',
            'gauge',
            "Bytes of /dev/shm held by files that are not Triton's, by family of other software (nccl, vllm, sglang, ...; "
            'other for files of no known family), and held (true when a process maps or holds them).',
            REPORT,
        ),
        Metric(
            'tritonops_shm_backend_pool_bytes',
            'gauge',
            "Bytes of /dev/shm held by the held pools of Triton's Python-based backends, by model (at most "
            f'{MODEL_LABEL_CAP} model values, the rest under model="{OTHER_MODELS}"; pools no stub maps under '
            f'model="{UNATTRIBUTED}").',
            REPORT,
        ),
        Metric(
            'tritonops_shm_cleanup_last_run_timestamp_seconds',
            'gauge',
            'When the last cleanup of this server ended (Unix time).',
            CLEANUP,
        ),
        Metric(
            'tritonops_shm_cleanup_last_success',
            'gauge',
            '1 when the last cleanup succeeded, 0 when it failed.',
            CLEANUP,
        ),
        Metric(
            'tritonops_shm_cleanup_last_success_timestamp_seconds',
            'gauge',
            'When a cleanup of this server last succeeded (Unix time; 0 when none has).',
            CLEANUP,
        ),
        Metric(
            'tritonops_shm_cleanup_last_unregistered_regions',
            'gauge',
            'Regions the last cleanup unregistered.',
            CLEANUP,
        ),
        Metric(
            'tritonops_shm_cleanup_last_removed_files',
            'gauge',
            'Files the last cleanup removed from /dev/shm.',
            CLEANUP,
        ),
        Metric('tritonops_shm_cleanup_last_freed_bytes', 'gauge', 'Bytes of /dev/shm the last cleanup freed.', CLEANUP),
        Metric(
            'tritonops_shm_cleanup_freed_bytes_total',
            'counter',
            'Bytes of /dev/shm freed by every cleanup of this server that this textfile has seen.',
            CLEANUP,
        ),
    )
}


class Written(NamedTuple):
    """What write_server_metrics() did: the paths written, and the warnings (at most one per cause)."""

    paths: list
    warnings: list


def file_name(kind: str, host: str, url: str | None) -> str:
    """The textfile of one (inventory host, URL): readable host part, and a digest that keeps any two apart."""
    if kind not in FILE_BASES:
        raise ValueError(f'metrics kind must be one of {sorted(FILE_BASES)}, got {kind!r}')
    host = str(host)
    readable = re.sub(r'[^A-Za-z0-9_-]', '_', host)[:64] or '_'
    digest = hashlib.sha256(f'{host}\0{url or ""}'.encode('utf-8', 'surrogatepass')).hexdigest()[:12]
    return f'{FILE_BASES[kind]}.{readable}.{digest}.prom'


def _render(samples: Iterable[tuple], host: str, url: str | None) -> str:
    """Exposition text: samples (name, extra labels, value) grouped by metric in METRICS order, HELP and TYPE once each."""
    # a URL's user:password@ part never reaches the world-readable textfile (the modules refuse such URLs anyway)
    base = (('host', host), ('triton_url', redact_url(url)))
    by_name: dict = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append((labels, value))
    lines = []
    for name, metric in METRICS.items():
        if name not in by_name:
            continue
        help_text = metric.help.replace('\\', '\\\\').replace('\n', '\\n')
        lines += [f'# HELP {name} {help_text}', f'# TYPE {name} {metric.type}']
        lines += [metrics_text.sample(name, (*base, *labels), value) for labels, value in by_name[name]]
    return '\n'.join(lines) + '\n'


def _inventory_of(result: Mapping) -> Mapping:
    """The inventory in a module result: triton_shm_info's result itself, or triton_shm_region's ``after``."""
    after = result.get('after')
    if 'summary' not in result and isinstance(after, Mapping) and 'summary' in after:
        return after
    return result


def report_text(result: Mapping | None, host: str, url: str | None, now: float | None = None) -> str:
    """The report textfile of one server from an inventory result (None or a failed result: the server is down).

    A server that answered but whose process was not found (no ``server.pid``) gets only ``up``, ``server_located``, the version
    and the report time: nothing on the host could be checked, so no state, file or byte figure is written.
    """
    result = result or {}
    up = bool(result) and not result.get('failed')
    inv = _inventory_of(result) if up else {}
    server = inv.get('server') or {}
    located = up and server.get('pid') is not None
    scanned = inv.get('scanned_at')
    when = float(scanned) if scanned is not None else (time.time() if now is None else now)
    samples = [
        ('tritonops_shm_up', (), up),
        ('tritonops_shm_server_located', (), located),
        ('tritonops_shm_report_timestamp_seconds', (), when),
    ]
    if up and server.get('version'):
        samples.append(('tritonops_shm_server_info', (('version', server['version']),), 1))
    if located:
        holders_labels = (('pid_namespace', inv.get('pid_namespace') or ''), ('reason', holders_incomplete_cause(inv)))
        samples.append((metrics_text.HOLDERS_COMPLETE, holders_labels, inv.get('holders_complete') is True))
        regions = inv.get('system_regions') or []
        container = server.get('container')
        if isinstance(container, Mapping) and container.get('name'):
            samples.append(
                (
                    'tritonops_shm_server_container_info',
                    (('container', container['name']), ('runtime', container.get('runtime') or '')),
                    1,
                )
            )
        samples += [('tritonops_shm_held_bytes', (('holder', holder),), held) for holder, held in held_by(regions)]
        summary = inv.get('summary') or {}
        fs = inv.get('shm_fs') or {}
        if fs.get('total_bytes') is not None:
            samples += [
                ('tritonops_shm_fs_size_bytes', (), fs['total_bytes']),
                ('tritonops_shm_fs_used_bytes', (), fs.get('used_bytes') or 0),
            ]
        for kind, field in records.totals():
            of_kind = inv.get(kind.result_key) or []
            if field.required or any(field.name in r for r in of_kind):
                samples.append((total_metric(field), (), sum(int(r.get(field.name) or 0) for r in of_kind)))
        samples += [
            ('tritonops_shm_regions', (('state', s),), sum(1 for r in regions if r.get('state') == s))
            for s in REGION_STATES
        ]
        for kind in records.KINDS.values():
            if not kind.files:
                samples.append((f'tritonops_shm_{kind.name}_regions', (), len(inv.get(kind.result_key) or ())))
        for kind in records.KINDS.values():
            if kind.gpu:
                samples += gpu_region_samples(inv, kind)
        samples += gpu_server_samples(inv)
        samples.append(('tritonops_shm_stale_bytes', (), summary.get('stale_bytes') or 0))
        files = inv.get('files') or []
        samples += [
            ('tritonops_shm_files', (('category', c),), sum(1 for f in files if f.get('category') == c))
            for c in FILE_CATEGORIES
        ]
        samples.append(('tritonops_shm_orphan_bytes', (), summary.get('orphan_bytes') or 0))
        samples.append(('tritonops_shm_leftover_bytes', (), summary.get('leftover_bytes') or 0))
        for family in inv.get('families') or ():
            for held in ('true', 'false'):
                key = 'held_bytes' if held == 'true' else 'unheld_bytes'
                labels = (('family', str(family.get('name'))), ('held', held))
                samples.append(('tritonops_shm_family_bytes', labels, family.get(key) or 0))
        samples += [
            ('tritonops_shm_backend_pool_bytes', (('model', model),), value)
            for model, value in pool_bytes_by_model(inv.get('backend_pools') or ())
        ]
    return _render(samples, host, url)


def gpu_region_samples(inv: Mapping, kind: records.Kind) -> list:
    """The region bytes of one server's regions of a kind of GPU memory, by (device, uuid, state): every state of
    the kind for each device with a region. Bounded: one server's evidence proves a device_id to name one GPU or none
    (uuid empty), so a device has one uuid, and the series are devices times the kind's states."""
    by_device: dict = {}
    for r in inv.get(kind.result_key) or ():
        device = (str(r.get('device_id')), r.get('gpu_uuid') or '')
        bytes_by_state = by_device.setdefault(device, dict.fromkeys(kind.states, 0))
        if r.get('state') in bytes_by_state:
            bytes_by_state[r['state']] += int(r.get('byte_size') or 0)
    return [
        (f'tritonops_shm_{kind.name}_region_bytes', (('device', device), ('uuid', uuid), ('state', state)), value)
        for device, uuid in sorted(by_device)
        for state, value in by_device[device, uuid].items()
    ]


def gpu_server_samples(inv: Mapping) -> list:
    """The server's NVML charge per GPU read, by (device, uuid)."""
    return [
        (
            'tritonops_shm_gpu_server_bytes',
            (('device', str(g['index'])), ('uuid', g.get('uuid') or '')),
            g['server_bytes'],
        )
        for g in inv.get('gpus') or ()
        if g.get('server_bytes') is not None
    ]


def pool_bytes_by_model(pools: Iterable[Mapping], cap: int = MODEL_LABEL_CAP) -> list:
    """[(model label, bytes)] of the pools that are not leftovers: the cap models with the most bytes by name (ties by
    name), the rest summed under OTHER_MODELS; a pool without a model under UNATTRIBUTED (never counted in the cap)."""
    by_model: dict = {}
    for pool in pools:
        if pool.get('state') == POOL_LEFTOVER:
            continue
        model = pool.get('model') or UNATTRIBUTED
        by_model[model] = by_model.get(model, 0) + int(pool.get('bytes') or 0)
    unattributed = by_model.pop(UNATTRIBUTED, None)
    ranked = sorted(by_model.items(), key=lambda mv: (-mv[1], mv[0]))
    kept, rest = ranked[:cap], ranked[cap:]
    out = sorted(kept)
    if rest:
        out.append((OTHER_MODELS, sum(v for _m, v in rest)))
    if unattributed is not None:
        out.append((UNATTRIBUTED, unattributed))
    return out


def held_by(regions: Iterable[Mapping]) -> list[tuple[str, int]]:
    """[(holder, bytes)] of the registered regions' holders by container or pod ('host' outside containers), largest
    first, at most HELD_BY_MAX entries (the rest summed as 'other'); a region held from several places counts in each."""
    held: dict[str, int] = {}
    for region in regions:
        names = set()
        for holder in region.get('holders') or ():
            container = holder.get('container')
            names.add(str(container['name']) if isinstance(container, Mapping) and container.get('name') else 'host')
        for name in names:
            held[name] = held.get(name, 0) + int(region.get('byte_size') or 0)
    ordered = sorted(held.items(), key=lambda item: (-item[1], item[0]))
    if len(ordered) > HELD_BY_MAX:
        ordered = ordered[: HELD_BY_MAX - 1] + [('other', sum(v for _k, v in ordered[HELD_BY_MAX - 1 :]))]
    return ordered


def holders_incomplete_cause(inv: Mapping) -> str:
    """The coarse reason (HOLDERS_INCOMPLETE_REASONS) why an inventory's holders are incomplete, '' when complete."""
    if inv.get('holders_complete') is True:
        return ''
    if inv.get('holders_complete') is None:
        return 'unknown'
    if inv.get('pid_namespace') == 'other' and 'initial PID namespace' in str(
        inv.get('holders_incomplete_reason') or ''
    ):
        return 'pid_namespace'
    if (inv.get('server') or {}).get('shm_dir') is None:
        return 'shm_dir'
    if inv.get('unreadable_processes'):
        return 'unreadable_processes'
    return 'hidepid'


def _previous_values(text: str | None) -> dict:
    """Sample values by metric name of a textfile this module wrote for one server (one series per name)."""
    return {
        name: value for name, _labels, value in metrics_text.samples(text or '') if math.isfinite(value) and value >= 0
    }


def cleanup_text(outcome: Mapping, host: str, url: str | None, previous: str | None = None) -> str:
    """The cleanup textfile of one server from the shm_cleanup role's record (``shm_cleanup_result``).

    ``previous`` is the text of this server's previous cleanup file: the counter and the last success time go on
    from it (a missing or unreadable file starts them again, which Prometheus reads as a counter reset).
    """
    done = outcome.get('done') or {}
    success = outcome.get('status') != 'failed'
    ended = float(outcome.get('finished_epoch') or time.time())
    before = _previous_values(previous)
    freed = int(done.get('freed_bytes') or 0)  # a cleanup that failed part-way may have freed some
    last_success = ended if success else before.get('tritonops_shm_cleanup_last_success_timestamp_seconds', 0)
    samples = [
        ('tritonops_shm_cleanup_last_run_timestamp_seconds', (), ended),
        ('tritonops_shm_cleanup_last_success', (), success),
        ('tritonops_shm_cleanup_last_success_timestamp_seconds', (), last_success),
        ('tritonops_shm_cleanup_last_unregistered_regions', (), len(done.get('unregistered') or ())),
        ('tritonops_shm_cleanup_last_removed_files', (), len(done.get('removed_files') or ())),
        ('tritonops_shm_cleanup_last_freed_bytes', (), freed),
        (
            'tritonops_shm_cleanup_freed_bytes_total',
            (),
            before.get('tritonops_shm_cleanup_freed_bytes_total', 0) + freed,
        ),
    ]
    return _render(samples, host, url)


def _check_name(name: str) -> None:
    if not name.endswith('.prom') or '/' in name or name.startswith('.'):
        raise ValueError(f'metrics file name must be a plain NAME.prom, got {name!r}')


def read_textfile(directory: str, name: str) -> str | None:
    """The current text of a metrics file (None when absent, not a regular file, or unreadable); never follows symlinks."""
    _check_name(name)
    return outputs.read(directory, name)


def write_textfile(directory: str, name: str, text: str) -> outputs.WriteResult:
    """Write text to directory/name by the one writer of outputs (outputs.write(): atomic, mode 0644).

    Never raises for the directory's condition: returns written=False and a warning instead. Not for check mode.
    """
    _check_name(name)
    return outputs.write(directory, name, text, nothing='no metrics written')


def call_outcome(result: Mapping, failed: bool, now: float | None = None) -> dict:
    """The record cleanup_text() reads, from a triton_shm_region result (a failed call's partial result too).

    What the call did (also part-way), whether it failed, and when it ended.
    """
    return {
        'status': 'failed' if failed else 'ok',
        'finished_epoch': time.time() if now is None else now,
        'done': {
            'unregistered': list(result.get('unregistered') or ()),
            'removed_files': list(result.get('removed_files') or ()),
            # what /dev/shm got back: the removed files and the dangling regions' unlinked memory
            'freed_bytes': int(result.get('freed_bytes') or 0) + int(result.get('freed_unlinked_bytes') or 0),
        },
    }


def write_server_metrics(
    directory: str,
    host: str,
    url: str | None,
    report: Mapping | None = None,
    with_report: bool = False,
    outcome: Mapping | None = None,
) -> Written:
    """Write the textfiles of one (host, URL) into directory: the report (with_report; report None: the server is down)
    and the cleanup outcome (outcome not None), the cleanup counter continued from the file already there.

    Never raises for the directory's condition; a directory that cannot take the files gives one warning, not one per file.
    """
    texts = []
    if with_report:
        texts.append((file_name(REPORT, host, url), lambda: report_text(report, host, url)))
    if outcome is not None:
        name = file_name(CLEANUP, host, url)
        texts.append((name, lambda: cleanup_text(outcome, host, url, previous=read_textfile(directory, name))))
    paths, warnings = [], []
    for name, text in texts:
        done = write_textfile(directory, name, text())
        if done.written:
            paths.append(done.path)
            continue
        warnings.append(done.warning)
        if done.directory_refused:
            break  # the other file would only repeat the warning
    return Written(paths, warnings)
