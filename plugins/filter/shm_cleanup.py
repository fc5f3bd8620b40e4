# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the shm_cleanup role decides and reports, as pure functions of module results.

Documentation: plugins/filter/shm_list.yml, shm_cleanup_plan.yml, shm_cleanup_result.yml,
shm_fleet_table.yml (``ansible-doc -t filter tritonops.shm.NAME``).
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.module_utils.patterns import literal, matches

LOCATE_STEP = 'Locate the Triton server process'
VERIFY_STEP = 'Verify no stale region remains that was not skipped for a stated reason'
SUMMARY_KEYS = ('system_regions', 'healthy_regions', 'stale_regions', 'stale_bytes', 'reserved_regions', 'dangling_regions',
                'unknown_regions', 'orphan_files', 'orphan_bytes', 'backend_files', 'foreign_files', 'used_bytes',
                'total_bytes', 'used_percent')
REREGISTER_REASON = 'kept: desired state (shm_cleanup_reregister)'


def shm_list(value):
    """A list of non-empty, stripped strings from a list or a comma-separated string (AWX surveys)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(',')
    elif not isinstance(value, (list, tuple)):
        raise AnsibleFilterError('shm_list: expected a list or a comma-separated string, got %r' % (value,))
    return [s for s in (str(v).strip() for v in value) if s]


def _summary(summary):
    return dict((k, summary.get(k)) for k in SUMMARY_KEYS) if summary else None


def shm_cleanup_plan(before, mode='stale', names=None, exclude=None, reregister=None, orphan_patterns=None,
                     threshold_percent=0, host='', url=''):
    """Decide from a triton_shm_info result whether the role acts, and what it hands the region module."""
    names, exclude, orphan_patterns = shm_list(names), shm_list(exclude), shm_list(orphan_patterns)
    reregister_names = [r['name'] for r in reregister or ()]
    regions = before.get('system_regions') or []
    summary = before.get('summary') or {}
    plan = dict(names=names, orphan_patterns=orphan_patterns, reregister_names=reregister_names,
                unregister_exclude=exclude + [literal(n) for n in reregister_names],
                act=False, candidates=False, decision='', error=None)
    server = before.get('server') or {}
    if server.get('pid') is None:
        reason = server.get('not_found_reason') or 'the tritonserver process behind %s was not found' % url
        plan['error'] = dict(step=LOCATE_STEP, msg='nothing on %s could be checked: %s' % (host, reason))
        return plan
    # stale regions, and dangling ones no client maps any more: what stale cleanup removes
    dead = [r['name'] for r in regions if r.get('reclaimable') and r['name'] not in reregister_names]
    plan['dead'] = dead
    selectable = [n for n in dead if not matches(n, exclude)]
    region_names = [r['name'] for r in regions]
    used = float(summary.get('used_percent') or 0)
    threshold = float(threshold_percent)
    over = used >= threshold
    plan['act'] = over or bool(selectable)
    if threshold <= 0:
        plan['decision'] = 'threshold 0%%: always act (/dev/shm use %.1f%%)' % used
    elif over:
        plan['decision'] = '/dev/shm use %.1f%% is at or above the threshold %s%%' % (used, threshold_percent)
    elif selectable:
        plan['decision'] = '%d stale or dangling region(s): %s' % (len(selectable), ', '.join(selectable))
    else:
        plan['decision'] = ('/dev/shm use %.1f%% is below the threshold %s%% and no region is stale or dangling: nothing to do'
                            % (used, threshold_percent))
    plan['candidates'] = bool(
        (mode == 'stale' and dead)   # excluded ones too: the module names them in skipped_items
        or (mode == 'all' and [n for n in region_names if n not in reregister_names])
        or (mode == 'names' and [n for n in names if n in region_names])
        or (orphan_patterns and (summary.get('orphan_files') or 0) > 0))
    return plan


def _role_skips(regions, plan, mode):
    """Regions the role leaves alone that the region module does not name, with the reason."""
    out = []
    for r in regions:
        name, state = r['name'], r.get('state')
        if name in plan['reregister_names']:
            if state in ('stale', 'dangling', 'reserved'):
                out.append(dict(name=name, reason=REREGISTER_REASON))
        elif state == 'dangling' and r.get('holders'):
            pids = ', '.join(str(h['pid']) for h in r['holders'])
            out.append(dict(name=name, reason='dangling but still mapped by %s: its client is alive' % pids))
        elif state == 'dangling' and not r.get('reclaimable'):
            out.append(dict(name=name, reason='dangling, but its holders could not be fully determined'))
        elif state == 'unknown':
            out.append(dict(name=name, reason='state unknown: %s' % (r.get('state_reason') or '')))
        elif mode == 'names' and state in ('stale', 'dangling') and name not in plan['names']:
            out.append(dict(name=name, reason='not selected (shm_cleanup_mode=names)'))
    return out


def _ran(result):
    return bool(result) and not result.get('skipped')


def shm_cleanup_result(before, plan, absent=None, present=None, after=None, failure=None, mode='stale',
                       threshold_percent=0, check_mode=False, verify=True, host='', url='', finished_at='', finished_epoch=0):
    """The role's record of one host: what was found, decided, done, left alone and why, and how it ended."""
    before = before or {}
    server = before.get('server') or {}
    if not plan.get('act'):
        # the act steps did not run: results registered by an earlier run of the role in the same play are not ours
        absent = present = after = None
    absent = absent if _ran(absent) else {}
    present = [r for r in ((present or {}).get('results') or []) if not r.get('skipped')]
    done = dict(unregistered=list(absent.get('unregistered') or []), removed_files=list(absent.get('removed_files') or []),
                freed_bytes=absent.get('freed_bytes') or 0,
                registered=[n for r in present for n in r.get('registered') or []],
                created_files=[p for r in present for p in r.get('created_files') or []])
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
            error = dict(step=VERIFY_STEP, msg='stale region(s) remain after cleanup, with no reason recorded: %s'
                         % ', '.join(leftover))
    return dict(
        host=host, url=url, check_mode=bool(check_mode), finished_at=finished_at, finished_epoch=int(finished_epoch),
        server=dict(version=server.get('version'), pid=server.get('pid'), shm_dir=server.get('shm_dir'),
                    holders_complete=before.get('holders_complete'), unreadable_processes=before.get('unreadable_processes')),
        mode=mode, threshold_percent=threshold_percent, acted=acted, decision=plan.get('decision') or '',
        before=before_summary, after=after_summary, done=done, skipped=skipped, error=error,
        status='failed' if error else 'ok',
        changed=bool(done['unregistered'] or done['removed_files'] or done['registered']))


class FilterModule(object):
    def filters(self):
        return dict(shm_list=shm_list, shm_cleanup_plan=shm_cleanup_plan, shm_cleanup_result=shm_cleanup_result)
