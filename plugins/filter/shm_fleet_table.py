# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's rows and the fleet tables the report and cleanup playbooks print, as pure functions.

Documentation: plugins/filter/shm_fleet_table.yml and shm_report_row.yml (``ansible-doc -t filter tritonops.shm.NAME``).
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError
from jinja2 import Environment
from jinja2.filters import do_filesizeformat, do_truncate

_ENV = Environment()
NOT_RUN = 'no result (unreachable, limited out or stopped early)'


def _size(value):
    return do_filesizeformat(value or 0, True)


def _truncate(text, length):
    return do_truncate(_ENV, str(text), length, True)


def _used(summary):
    return '%s/%s %.0f%%' % (_size(summary['used_bytes']), _size(summary['total_bytes']), float(summary['used_percent']))


def _report(rows, width):
    fmt = '%-' + str(width) + 's  %-9s  %-8s  %-26s  %7s  %17s  %8s  %17s'
    out = [fmt % ('HOST', 'STATUS', 'TRITON', '/DEV/SHM USED', 'REGIONS', 'STALE', 'DANGLING', 'ORPHAN')]
    for r in rows:
        if r.get('status') == 'ok':
            used = 'unknown'
            if r['shm_total_bytes']:
                used = _used(dict(used_bytes=r['shm_used_bytes'], total_bytes=r['shm_total_bytes'], used_percent=r['shm_used_percent']))
            out.append(fmt % (r['host'], 'ok', r['version'], used, r['regions'],
                              '%d (%s)' % (int(r['stale_regions']), _size(r['stale_bytes'])), r['dangling_regions'],
                              '%d (%s)' % (int(r['orphan_files']), _size(r['orphan_bytes']))))
        else:
            out.append(('%-' + str(width) + 's  %-9s  %s') % (r['host'], str(r.get('status')).upper(), _truncate(r.get('error'), 200)))
    return out


def _cleanup(rows, width, check_mode):
    fmt = '%-' + str(width) + 's  %-7s  %-25s  %-25s  %5s  %5s  %9s  %4s  %s'
    out = [fmt % ('HOST', 'STATUS', 'SHM BEFORE', 'SHM AFTER', 'UNREG', 'FILES', 'FREED', 'SKIP', 'NOTE')]
    for host, r in rows:
        if not r:
            out.append(fmt % (host, 'not run', '-', '-', '-', '-', '-', '-', NOT_RUN))
            continue
        before, after = r.get('before') or {}, r.get('after') or {}
        if r['status'] == 'failed':
            note = 'FAILED at %s: %s' % (r['error']['step'], r['error']['msg'])
        else:
            note = r.get('decision') or ''
        if after.get('total_bytes'):
            used_after = _used(after)
        else:
            used_after = '(check mode)' if r.get('check_mode') and r.get('acted') else '-'
        done = r['done']
        out.append(fmt % (host, r['status'] + ('*' if r.get('changed') else ''), _used(before) if before.get('total_bytes') else '-',
                          used_after, len(done['unregistered']), len(done['removed_files']), _size(done['freed_bytes']),
                          len(r.get('skipped') or ()), _truncate(note, 160)))
    out.append('(* changed%s)' % ('; check mode: what would be done, nothing was changed' if check_mode else ''))
    return out


ROW_SUMMARY = (('shm_total_bytes', 'total_bytes'), ('shm_used_bytes', 'used_bytes'), ('shm_used_percent', 'used_percent'),
               ('regions', 'system_regions'), ('cuda_regions', 'cuda_regions'), ('healthy_regions', 'healthy_regions'),
               ('stale_regions', 'stale_regions'), ('stale_bytes', 'stale_bytes'), ('dangling_regions', 'dangling_regions'),
               ('unknown_regions', 'unknown_regions'), ('orphan_files', 'orphan_files'), ('orphan_bytes', 'orphan_bytes'))


def shm_report_row(info, host, url):
    """One host's row of the report playbook from its triton_shm_info result (status ok, or unlocated without the process)."""
    server = info['server']
    summary = info['summary']
    located = server.get('pid') is not None
    row = dict(host=host, url=url, status='ok' if located else 'unlocated',
               error=None if located else server.get('not_found_reason'),
               version=server.get('version'), ready=server.get('ready'), shm_dir=server.get('shm_dir'))
    row.update((key, summary.get(src)) for key, src in ROW_SUMMARY)
    regions = info.get('system_regions') or []
    row.update(holders_complete=info.get('holders_complete'),
               stale=[r['name'] for r in regions if r.get('state') == 'stale'],
               dangling=[r['name'] for r in regions if r.get('state') == 'dangling'],
               scanned_at=info.get('scanned_at'))
    return row


def shm_fleet_table(rows, kind, hosts=None, check_mode=False):
    """Lines of the fleet table of ``kind`` (report: rows of tritonops_shm_report; cleanup: shm_cleanup_result per host)."""
    if kind == 'report':
        width = max([4] + [len(str(r['host'])) for r in rows])
        return _report(rows, width)
    if kind == 'cleanup':
        hosts = list(hosts or ())
        if len(hosts) != len(rows):
            raise AnsibleFilterError('shm_fleet_table: cleanup needs one result (or null) per host in hosts')
        width = max([4] + [len(h) for h in hosts])
        return _cleanup(list(zip(hosts, rows)), width, check_mode)
    raise AnsibleFilterError("shm_fleet_table: kind must be 'report' or 'cleanup', got %r" % (kind,))


class FilterModule(object):
    def filters(self):
        return dict(shm_fleet_table=shm_fleet_table, shm_report_row=shm_report_row)
