# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the shm_cleanup role decides and records, as pure functions of its settings and module results.

Documentation: plugins/filter/shm_list.yml and shm_cleanup.yml (``ansible-doc -t filter tritonops.shm.NAME``).
The role calls one filter, ``shm_cleanup``, with this run's module results; it returns the plan (what the role
does next and what it hands the modules) and the record (``shm_cleanup_result``). ``shm_cleanup_plan`` and
``shm_cleanup_result`` are its two halves, kept apart for the unit tests.
"""
from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.module_utils.client import redact_url
from ansible_collections.tritonops.shm.plugins.module_utils.patterns import literal, matches

LOCATE_STEP = 'Locate the Triton server process'
READ_STEP = "Read the server's shared memory"
VERIFY_STEP = 'Verify no stale region remains that was not skipped for a stated reason'
SUMMARY_KEYS = ('system_regions', 'healthy_regions', 'stale_regions', 'stale_bytes', 'reserved_regions', 'dangling_regions',
                'unknown_regions', 'orphan_files', 'orphan_bytes', 'backend_files', 'leftover_files', 'leftover_bytes',
                'foreign_files', 'used_bytes', 'total_bytes', 'used_percent')
REREGISTER_REASON = 'kept: desired state (shm_cleanup_reregister)'
# the task files main.yml includes after its first step
QUERY_FIRST_TASKS = 'query_first.yml'
REREGISTER_TASKS = 'reregister.yml'
RESULT_KEYS = ('direct', 'query', 'absent', 'present', 'after', 'reload')


def shm_list(value: Any) -> list[str]:
    """A list of non-empty, stripped strings from a list or a comma-separated string (AWX surveys)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(',')
    elif not isinstance(value, (list, tuple)):
        raise AnsibleFilterError(f'shm_list: expected a list or a comma-separated string, got {value!r}')
    return [s for s in (str(v).strip() for v in value) if s]


def _summary(summary: dict | None) -> dict | None:
    return {k: summary.get(k) for k in SUMMARY_KEYS} if summary else None


def _ran(result: dict | None) -> bool:
    return bool(result) and not result.get('skipped')


def _read(result: dict | None) -> dict:
    """A triton_shm_info result that read the server, else {} (not run, skipped, or failed)."""
    return result if _ran(result) and not result.get('failed') else {}


def is_direct(mode: str = 'stale', threshold_percent: Any = 0, orphan_patterns: Any = None) -> bool:
    """Whether one region module call can query and act at once: nothing to decide before acting.

    Mode stale acts on every stale region whatever the threshold; the threshold gates only orphan files (and
    re-registering, which runs after): without orphan patterns or a threshold, the role acts at once.
    """
    return mode == 'stale' and (float(threshold_percent) <= 0 or not shm_list(orphan_patterns))


def shm_cleanup_plan(before: dict, mode: str = 'stale', names: Any = None, exclude: Any = None, reregister: Any = None,
                     orphan_patterns: Any = None, threshold_percent: Any = 0, host: str = '', url: str = '',
                     backend_leftovers: bool = False) -> dict:
    """Decide from a triton_shm_info result whether the role acts, and what it hands the region module.

    ``before`` is {} when the server has not been read yet: the plan then holds only what the settings decide.
    Leftover backend pools (with backend_leftovers) are dead like stale regions: they make the role act whatever the
    threshold.
    """
    names, exclude, orphan_patterns = shm_list(names), shm_list(exclude), shm_list(orphan_patterns)
    reregister_names = [r['name'] for r in reregister or ()]
    regions = before.get('system_regions') or []
    summary = before.get('summary') or {}
    plan = dict(names=names, orphan_patterns=orphan_patterns, reregister_names=reregister_names,
                unregister_exclude=exclude + [literal(n) for n in reregister_names],
                backend_leftovers=bool(backend_leftovers), act=False, candidates=False, decision='', error=None)
    if not before:
        return plan
    server = before.get('server') or {}
    if server.get('pid') is None:
        reason = server.get('not_found_reason') or f'the tritonserver process behind {redact_url(url)} was not found'
        plan['error'] = dict(step=LOCATE_STEP, msg=f'nothing on {host} could be checked: {reason}')
        return plan
    if server.get('shm_unsupported'):
        # Triton 2.73+ through tritonfrontend: no shared memory at all; not a leak, but nothing was checked either
        plan['error'] = dict(step=READ_STEP, msg=f"nothing on {host} could be checked: {server['shm_unsupported']}")
        return plan
    # stale regions, and dangling ones no client maps any more: what stale cleanup removes
    dead = [r['name'] for r in regions if r.get('reclaimable') and r['name'] not in reregister_names]
    plan['dead'] = dead
    selectable = [n for n in dead if not matches(n, exclude)]
    region_names = [r['name'] for r in regions]
    used = float(summary.get('used_percent') or 0)
    threshold = float(threshold_percent)
    over = used >= threshold
    leftovers = int(summary.get('leftover_files') or 0) if backend_leftovers else 0
    plan['act'] = over or bool(selectable) or leftovers > 0
    if threshold <= 0:
        plan['decision'] = f'threshold 0%: always act (/dev/shm use {used:.1f}%)'
    elif over:
        plan['decision'] = f'/dev/shm use {used:.1f}% is at or above the threshold {threshold_percent}%'
    elif selectable:
        plan['decision'] = f"{len(selectable)} stale or dangling region(s): {', '.join(selectable)}"
    elif leftovers:
        plan['decision'] = f'{leftovers} leftover backend pool(s) that no process holds'
    else:
        plan['decision'] = (f'/dev/shm use {used:.1f}% is below the threshold {threshold_percent}% '
                            'and no region is stale or dangling: nothing to do')
    plan['candidates'] = bool(
        (mode == 'stale' and dead)   # excluded ones too: the module names them in skipped_items
        or (mode == 'all' and [n for n in region_names if n not in reregister_names])
        or (mode == 'names' and [n for n in names if n in region_names])
        or (orphan_patterns and (summary.get('orphan_files') or 0) > 0)
        or leftovers > 0)
    return plan


def _role_skips(regions: list[dict], plan: dict, mode: str) -> list[dict]:
    """Regions the role leaves alone that the region module does not name, with the reason."""
    out = []
    for r in regions:
        name, state = r['name'], r.get('state')
        if name in plan['reregister_names']:
            if state in ('stale', 'dangling', 'reserved'):
                out.append(dict(name=name, reason=REREGISTER_REASON))
        elif state == 'dangling' and r.get('holders'):
            pids = ', '.join(str(h['pid']) for h in r['holders'])
            out.append(dict(name=name, reason=f'dangling but still mapped by {pids}: its client is alive'))
        elif state == 'dangling' and not r.get('reclaimable'):
            out.append(dict(name=name, reason='dangling, but its holders could not be fully determined'))
        elif state == 'unknown':
            out.append(dict(name=name, reason=f"state unknown: {r.get('state_reason') or ''}"))
        elif mode == 'names' and state in ('stale', 'dangling') and name not in plan['names']:
            out.append(dict(name=name, reason='not selected (shm_cleanup_mode=names)'))
    return out


def shm_cleanup_result(before: dict | None, plan: dict, absent: dict | None = None, present: dict | None = None,
                       after: dict | None = None, failure: dict | None = None, mode: str = 'stale', threshold_percent: Any = 0,
                       check_mode: bool = False, verify: bool = True, host: str = '', url: str = '', finished_at: str = '',
                       finished_epoch: Any = 0, reloaded: list | None = None) -> dict:
    """The role's record of one host: what was found, decided, done, left alone and why, and how it ended.

    reloaded: the models triton_backend_pool reloaded (its ``reloaded``), when the role reloads.
    """
    before = before or {}
    server = before.get('server') or {}
    if not plan.get('act'):
        # the act steps did not run: results registered by an earlier run of the role in the same play are not ours
        absent = present = after = None
    absent = absent if _ran(absent) else {}
    present = [r for r in ((present or {}).get('results') or []) if not r.get('skipped')]
    done = dict(unregistered=list(absent.get('unregistered') or []), pending=list(absent.get('pending') or []),
                removed_files=list(absent.get('removed_files') or []),
                freed_bytes=absent.get('freed_bytes') or 0,
                registered=[n for r in present for n in r.get('registered') or []],
                created_files=[p for r in present for p in r.get('created_files') or []],
                reloaded=list(reloaded or []))
    regions = before.get('system_regions') or []
    reregister_names = plan.get('reregister_names') or []
    skipped = [s for s in absent.get('skipped_items') or [] if s.get('name') is None or s['name'] not in reregister_names]
    skipped += _role_skips(regions, plan, mode)
    acted = bool(plan.get('act'))
    measured_after = after if _ran(after) and after.get('summary') is not None else None
    before_summary = _summary(before.get('summary'))
    if measured_after is not None:
        after_summary = _summary(measured_after['summary'])
    elif check_mode and acted:
        after_summary = None
    else:
        after_summary = before_summary
    error = failure or plan.get('error')
    if error is None and acted and verify:
        # only regions already dead at the query count: a client that dies while the role runs leaves
        # a region that is stale afterwards through no fault of this run (the next run cleans it)
        after_regions = (measured_after.get('system_regions') if measured_after is not None
                         else [r for r in regions if r['name'] not in done['unregistered']])
        skipped_names = [s['name'] for s in skipped if 'name' in s]
        dead = plan.get('dead') or []
        leftover = [r['name'] for r in after_regions or [] if r.get('reclaimable') and r['name'] in dead
                    and r['name'] not in skipped_names and r['name'] not in reregister_names]
        if leftover:
            error = dict(step=VERIFY_STEP, msg=f"stale region(s) remain after cleanup, with no reason recorded: {', '.join(leftover)}")
    return dict(
        host=host, url=redact_url(url), check_mode=bool(check_mode), finished_at=finished_at, finished_epoch=int(finished_epoch),
        server=dict(version=server.get('version'), pid=server.get('pid'), shm_dir=server.get('shm_dir'),
                    holders_complete=before.get('holders_complete'), unreadable_processes=before.get('unreadable_processes'),
                    holders_incomplete_reason=before.get('holders_incomplete_reason'),
                    pid_namespace=before.get('pid_namespace'),
                    container=(server.get('container') or {}).get('name')),
        mode=mode, threshold_percent=threshold_percent, acted=acted, decision=plan.get('decision') or '',
        before=before_summary, after=after_summary, done=done, skipped=skipped, error=error,
        # incomplete: the holders could not all be seen, so nothing was stale (never 'ok': issue 25, issue 26 finding 7)
        status='failed' if error else ('incomplete' if before.get('holders_complete') is False else 'ok'),
        changed=bool(done['unregistered'] or done['pending'] or done['removed_files'] or done['registered'] or done['reloaded']))


def shm_cleanup(results: dict | None, mode: str = 'stale', names: Any = None, exclude: Any = None, reregister: Any = None,
                orphan_patterns: Any = None, threshold_percent: Any = 0, verify: bool = True, check_mode: bool = False,
                host: str = '', url: str = '', finished_at: str = '', finished_epoch: Any = 0,
                failure: dict | None = None, backend_leftovers: bool = False, reload_pools_over_bytes: Any = 0,
                reload_pools_over_percent: Any = 0) -> dict:
    """One step of the role: this run's module results so far -> {plan, record}.

    ``results`` holds the registered results ``direct`` (the one-call path's region module), ``query``
    (triton_shm_info), ``absent`` (the query path's region module), ``present`` (the re-register loop) and
    ``after`` (the query after re-registering), and ``reload`` (triton_backend_pool, when reload_pools_over_bytes or
    reload_pools_over_percent is above 0). Only the results of the steps this run took are read: the path comes from
    the settings, and the re-register results count only when the plan re-registers.
    """
    results = results or {}
    unknown = sorted(set(results) - set(RESULT_KEYS))
    if unknown:
        raise AnsibleFilterError(f"shm_cleanup: unknown results {', '.join(unknown)} (expected {', '.join(RESULT_KEYS)})")
    reregister = list(reregister or ())
    direct = is_direct(mode, threshold_percent, orphan_patterns)
    if direct:
        absent = results.get('direct')
        before = (absent or {}).get('before') or {} if _ran(absent) else {}
    else:
        absent = results.get('absent')
        before = _read(results.get('query'))
    plan = shm_cleanup_plan(before, mode=mode, names=names, exclude=exclude, reregister=reregister,
                            orphan_patterns=orphan_patterns, threshold_percent=threshold_percent, host=host, url=url,
                            backend_leftovers=backend_leftovers)
    rereg = bool(plan['act'] and reregister)
    if direct:
        include = REREGISTER_TASKS if rereg else ''
    else:
        include = QUERY_FIRST_TASKS
    plan.update(direct=direct, include=include, unregister=bool(not direct and plan['act'] and plan['candidates']),
                reregister=rereg, exclude=plan.pop('unregister_exclude'), orphan_files=bool(plan['orphan_patterns']),
                unregister_names=plan['names'] if mode == 'names' else [])
    if rereg:
        present, after = results.get('present'), results.get('after')
    else:
        present, after = None, (absent or {}).get('after') if _ran(absent) else None
    if before and plan['error']:
        # a server that was read but whose process was not found: the plan names that cause, not the task that stopped
        failure = None
    plan.update(_reload_plan(reload_pools_over_bytes, reload_pools_over_percent))
    reload = results.get('reload') if plan['reload_pools'] else None
    record = shm_cleanup_result(before, plan, absent=absent, present=present, after=after, failure=failure, mode=mode,
                                threshold_percent=threshold_percent, check_mode=check_mode, verify=verify, host=host, url=url,
                                finished_at=finished_at, finished_epoch=finished_epoch,
                                reloaded=(reload or {}).get('reloaded') if _ran(reload) else None)
    return dict(plan=plan, record=record)


def _reload_plan(over_bytes: Any, over_percent: Any) -> dict:
    """Whether the role reloads models whose python backend pools grew (triton_backend_pool), and with which limits."""
    try:
        max_bytes = int(over_bytes or 0)
        max_percent = float(over_percent or 0)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f'shm_cleanup: reload_pools_over_bytes and reload_pools_over_percent must be numbers, '
                                 f'got {over_bytes!r} and {over_percent!r}', orig_exc=exc)
    if max_bytes < 0 or max_percent < 0:
        raise AnsibleFilterError('shm_cleanup: reload_pools_over_bytes and reload_pools_over_percent must not be negative')
    return dict(reload_pools=bool(max_bytes or max_percent), reload_max_bytes=max_bytes or None,
                reload_max_percent=max_percent or None)


class FilterModule:
    def filters(self) -> dict:
        return dict(shm_list=shm_list, shm_cleanup=shm_cleanup)
