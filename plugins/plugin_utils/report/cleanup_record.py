# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shm_cleanup role's record of one host, built from this run's module results (no decision is made here).

Private to the tritonops.shm collection: no stability promise to other code. Controller code (plugin_utils) that
the filter of the same job adapts (plugins/filter/); it imports what a filter may import (CONTRIBUTING.md, "Imports").

Documentation: plugins/filter/shm_list.yml, _shm_cleanup.yml and _shm_cleanup_exclude.yml
(``ansible-doc -t filter tritonops.shm.NAME``); the role's two filters are private (CONTRIBUTING.md, "Public surface").
triton_shm_region decides what is stale, what is excluded and whether
the /dev/shm use reaches the threshold; the role's tasks follow a fixed path; ``shm_cleanup`` only turns the results of
the steps this run took into ``shm_cleanup_result``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.module_utils.rules.patterns import literal
from ansible_collections.tritonops.shm.plugins.module_utils.rules.records import KINDS
from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import redact_url

LOCATE_STEP = 'Locate the Triton server process'
READ_STEP = "Read the server's shared memory"
VERIFY_STEP = 'Verify no stale region remains that was not skipped for a stated reason'
SUMMARY_KEYS = (
    'system_regions',
    'healthy_regions',
    'stale_regions',
    'stale_bytes',
    'reserved_regions',
    'dangling_regions',
    'unknown_regions',
    'suspect_regions',
    'orphan_files',
    'orphan_bytes',
    'backend_files',
    'leftover_files',
    'leftover_bytes',
    'foreign_files',
    'used_bytes',
    'total_bytes',
    'used_percent',
)
REREGISTER_REASON = 'kept: desired state (shm_cleanup_reregister)'
# the kinds whose regions have no file: the role cleans each in a step of its own (named by the kind), after absent
KIND_STEPS = tuple(k.name for k in KINDS.values() if not k.files)
# the role's steps in the order they run, each by the variable its task registers (its result key here)
STEPS = ('absent', *KIND_STEPS, 'present', 'after', 'reload')
REGISTERED = {f'_shm_cleanup_{step}': step for step in STEPS + ('record',)}


def _freed_gpu_bytes(by_kind: Mapping[str, Mapping]) -> int | None:
    """The GPU memory NVML showed back after the steps of the kinds of GPU memory (None when none measured it)."""
    measured = [step.get('freed_gpu_bytes') for k, step in by_kind.items() if KINDS[k].gpu]
    measured = [m for m in measured if m is not None]
    return sum(measured) if measured else None


def shm_list(value: Any) -> list[str]:
    """A list of non-empty, stripped strings from a list or a comma-separated string (AWX surveys)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(',')
    elif not isinstance(value, (list, tuple)):
        raise AnsibleFilterError(f'shm_list: expected a list or a comma-separated string, got {value!r}')
    return [s for s in (str(v).strip() for v in value) if s]


def shm_cleanup_exclude(exclude: Any, reregister: Any = None) -> list[str]:
    """The region module's exclude: the role's patterns, and the names of its re-registered regions as literal patterns."""
    return shm_list(exclude) + [literal(str(r['name'])) for r in reregister or ()]


def node_agent_failed(rows: Any, checks: Any = None) -> list[str]:
    """The node agent's failed servers, one text each: 'NAME: why' for each row whose cleanup failed or that the round's
    deadline left out, then 'NAME (check after the cleanup): why' for each server whose check after the cleanup failed
    or did not run (its cleanup did not fail)."""
    out, failed = [], set()
    for row in rows or ():
        if isinstance(row, dict) and row.get('status') == 'not_reached':
            failed.add(row.get('name'))
            out.append(f"{row.get('name')}: not reached before the round's deadline (node_agent_round_timeout)")
        elif isinstance(row, dict) and row.get('status') == 'failed':
            failed.add(row.get('name'))
            err = row.get('error') or {}
            step = f" at '{err['step']}'" if err.get('step') else ''
            out.append(f'{row.get("name")}{step}: {err.get("msg") or "failed"}')
    for check in checks or ():
        if not isinstance(check, dict) or 'holders_complete' in check:
            continue
        name = (check.get('node_agent_server') or {}).get('name')
        if name in failed:
            continue
        why = check.get('msg') or 'failed'
        if check.get('skipped'):
            why = "not run: the server's bound (node_agent_server_timeout) was spent by its cleanup"
        out.append(f'{name} (check after the cleanup): {why}')
    return out


def _summary(summary: dict | None) -> dict | None:
    return {k: summary.get(k) for k in SUMMARY_KEYS} if summary else None


def _ran(result: Any) -> bool:
    return isinstance(result, dict) and bool(result) and not result.get('skipped')


def _this_run(results: dict, failed_step: str | None) -> dict:
    """The results of the steps this run reached: none after the step that failed (an earlier run's may still be set)."""
    out = dict.fromkeys(STEPS)
    for step in STEPS:
        out[step] = results.get(step) if _ran(results.get(step)) else None
        if step == failed_step:
            break
    return out


def _server_error(before: dict, host: str, url: str) -> dict | None:
    """Nothing on the host could be checked: the server process was not found, or the server has no shared memory."""
    server = before.get('server') or {}
    if server.get('pid') is None:
        reason = server.get('not_found_reason') or f'the tritonserver process behind {redact_url(url)} was not found'
        return dict(step=LOCATE_STEP, msg=f'nothing on {host} could be checked: {reason}')
    if server.get('shm_unsupported'):
        # Triton 2.73+ through tritonfrontend: no shared memory at all; not a leak, but nothing was checked either
        return dict(step=READ_STEP, msg=f'nothing on {host} could be checked: {server["shm_unsupported"]}')
    return None


def _decision(threshold: dict, absent: dict, threshold_percent: Any) -> str:
    """The module's gate, in words: its threshold verdict and what it cleaned whatever the threshold."""
    used = float(threshold.get('used_percent') or 0)
    percent = threshold.get('percent', threshold_percent)
    if float(percent or 0) <= 0:
        return f'threshold 0%: always act (/dev/shm use {used:.1f}%)'
    if threshold.get('over'):
        return f'/dev/shm use {used:.1f}% is at or above the threshold {threshold_percent}%'
    regions = list(absent.get('unregistered') or []) + list(absent.get('pending') or [])
    if regions:
        return f'{len(regions)} stale or dangling region(s): {", ".join(regions)}'
    if absent.get('removed_files'):
        return f'{len(absent["removed_files"])} file(s) that no process holds (leftover backend pools)'
    return (
        f'/dev/shm use {used:.1f}% is below the threshold {threshold_percent}% '
        'and no region is stale or dangling: nothing to do'
    )


def _role_skips(
    regions: list[dict], reregister_names: list[str], mode: str, names: list[str], taken: Collection[str] = ()
) -> list[dict]:
    """Regions the role leaves alone that the region module's selection does not name, with the module's classification
    (taken: the regions this run unregistered)."""
    out = []
    for r in regions:
        name, state = r['name'], r.get('state')
        if name in reregister_names:
            if state in ('stale', 'dangling', 'reserved'):
                out.append(dict(name=name, reason=REREGISTER_REASON))
        elif state == 'dangling' and r.get('holders'):
            pids = ', '.join(str(h['pid']) for h in r['holders'])
            out.append(dict(name=name, reason=f'dangling but still mapped by {pids}: its client is alive'))
        elif state == 'dangling' and not r.get('reclaimable'):
            out.append(dict(name=name, reason='dangling, but its holders could not be fully determined'))
        elif state == 'unknown':
            out.append(dict(name=name, reason=f'state unknown: {r.get("state_reason") or ""}'))
        elif state == 'suspect' and name not in taken:
            out.append(
                dict(name=name, reason=f'suspect: {r.get("state_reason") or ""} (shm_cleanup_suspect unregisters it)')
            )
        elif mode == 'names' and state in ('stale', 'dangling') and name not in names:
            out.append(dict(name=name, reason='not selected (shm_cleanup_mode=names)'))
    return out


def _verify(
    before_regions: list[dict], after_regions: list[dict], skipped: list[dict], reregister_names: list[str]
) -> dict | None:
    """A region dead at the query and still dead afterwards, with no reason recorded, fails the host.

    Only regions already dead at the query count: a client that dies while the role runs leaves a region that is
    stale afterwards through no fault of this run (the next run cleans it).
    """
    dead = {r['name'] for r in before_regions if r.get('reclaimable')}
    kept = {s['name'] for s in skipped if 'name' in s} | set(reregister_names)
    left = [r['name'] for r in after_regions if r.get('reclaimable') and r['name'] in dead and r['name'] not in kept]
    if left:
        return dict(
            step=VERIFY_STEP, msg=f'stale region(s) remain after cleanup, with no reason recorded: {", ".join(left)}'
        )
    return None


def shm_cleanup(
    results: dict | None,
    mode: str = 'stale',
    names: Any = None,
    reregister: Any = None,
    threshold_percent: Any = 0,
    verify: bool = True,
    check_mode: bool = False,
    host: str = '',
    url: str = '',
    finished_at: str = '',
    finished_epoch: Any = 0,
    failure: dict | None = None,
    failed_step: str | Mapping | None = None,
) -> dict:
    """The role's record of one host (``shm_cleanup_result``): what was found, decided, done, left alone and why.

    ``results`` holds the registered results of the role's steps: ``absent`` (the triton_shm_region call, with
    inventory=true: the state before and after, and its ``threshold`` verdict), ``cuda`` (the kind=cuda call: stale
    CUDA regions unregistered, ``freed_gpu_bytes`` measured), ``present`` (the re-register loop),
    ``after`` (triton_shm_info after re-registering) and ``reload`` (triton_backend_pool). ``failed_step`` names the step
    (or its registered variable) that failed: results of later steps are an earlier run's and are not read; ``record``
    (the task that records, failed by the record's own error) is no step failure.
    """
    results = results or {}
    unknown = sorted(set(results) - set(STEPS))
    if unknown:
        raise AnsibleFilterError(f'shm_cleanup: unknown results {", ".join(unknown)} (expected {", ".join(STEPS)})')
    if isinstance(failed_step, Mapping):
        failed_step = next(iter(failed_step), None)  # ansible-core 2.21 gives a task's register as {name: projection}
    failed_step = REGISTERED.get(failed_step or '', failed_step)
    if failed_step == 'record':
        # the record failed the host by itself (its own error below): every step ran
        failure = failed_step = None
    ran = _this_run(results, failed_step)
    absent = ran['absent'] or {}
    before = absent.get('before') or {}
    reregister_names = [str(r['name']) for r in reregister or ()]
    server = before.get('server') or {}
    server_error = _server_error(before, host, url) if before else None
    threshold = absent.get('threshold') or {}
    present = [r for r in ((ran['present'] or {}).get('results') or []) if not r.get('skipped')]
    by_kind = {k: ran[k] or {} for k in KIND_STEPS}
    done = dict(
        unregistered=list(absent.get('unregistered') or []),
        pending=list(absent.get('pending') or []),
        removed_files=list(absent.get('removed_files') or []),
        freed_bytes=absent.get('freed_bytes') or 0,
        # the dangling regions' unlinked memory that came back with their unregister
        freed_unlinked_bytes=absent.get('freed_unlinked_bytes') or 0,
        registered=[n for r in present for n in r.get('registered') or []],
        created_files=[p for r in present for p in r.get('created_files') or []],
        reloaded=list((ran['reload'] or {}).get('reloaded') or []),
        # each kind's step (kind=cuda): its regions unregistered (or deferred), and the GPU memory NVML shows back
        **{
            f'{k}_unregistered': list(step.get('unregistered') or []) + list(step.get('pending') or [])
            for k, step in by_kind.items()
        },
        freed_gpu_bytes=_freed_gpu_bytes(by_kind),
    )
    # the module's verdict: at or over the threshold (0: always), or it cleaned what never waits for it
    acted = (
        bool(before)
        and server_error is None
        and bool(
            threshold.get('over', True)
            or done['unregistered']
            or done['pending']
            or done['removed_files']
            or any(done[f'{k}_unregistered'] for k in KIND_STEPS)
        )
    )
    regions = before.get('system_regions') or []
    skipped = [
        s for s in absent.get('skipped_items') or [] if s.get('name') is None or s['name'] not in reregister_names
    ]
    skipped += _role_skips(regions, reregister_names, mode, shm_list(names), done['unregistered'])
    skipped += [dict(s, kind=k) for k, step in by_kind.items() for s in step.get('skipped_items') or []]
    after = (
        ran['after'] if present and ran['after'] and ran['after'].get('summary') is not None else absent.get('after')
    )
    before_summary = _summary(before.get('summary'))
    if after:
        after_summary = _summary(after.get('summary'))
    elif check_mode and acted:
        after_summary = None
    else:
        after_summary = before_summary
    # a server that was read but could not be checked: its cause, not the task that stopped on it
    error = server_error or failure
    if error is None and acted and verify:
        after_regions = (
            after.get('system_regions') if after else [r for r in regions if r['name'] not in done['unregistered']]
        )
        error = _verify(regions, after_regions or [], skipped, reregister_names)
    return dict(
        host=host,
        url=redact_url(url),
        check_mode=bool(check_mode),
        finished_at=finished_at,
        finished_epoch=int(finished_epoch),
        server=dict(
            version=server.get('version'),
            pid=server.get('pid'),
            shm_dir=server.get('shm_dir'),
            holders_complete=before.get('holders_complete'),
            unreadable_processes=before.get('unreadable_processes'),
            holders_incomplete_reason=before.get('holders_incomplete_reason'),
            pid_namespace=before.get('pid_namespace'),
            container=(server.get('container') or {}).get('name'),
        ),
        mode=mode,
        threshold_percent=threshold_percent,
        acted=acted,
        decision=_decision(threshold, absent, threshold_percent) if acted or (before and server_error is None) else '',
        before=before_summary,
        after=after_summary,
        done=done,
        skipped=skipped,
        error=error,
        # the cleanup call wrote no textfile: its directory does not exist (metrics_dir_missing: skip)
        metrics_skipped=absent.get('metrics_skipped'),
        # incomplete: the holders could not all be seen, so nothing was stale (never 'ok': issue 25, issue 26 finding 7)
        status='failed' if error else ('incomplete' if before.get('holders_complete') is False else 'ok'),
        changed=bool(
            done['unregistered']
            or done['pending']
            or done['removed_files']
            or done['registered']
            or done['reloaded']
            or any(done[f'{k}_unregistered'] for k in KIND_STEPS)
        ),
    )
