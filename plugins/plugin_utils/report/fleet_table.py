# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's rows and the fleet tables the report and cleanup playbooks print, as pure functions.

Private to the tritonops.shm collection: no stability promise to other code. Controller code (plugin_utils) that
the filter of the same job adapts (plugins/filter/); it imports what a filter may import (CONTRIBUTING.md, "Imports").

Private to the report and cleanup playbooks (CONTRIBUTING.md, "Public surface"). Documentation:
plugins/filter/_shm_fleet_table.yml, _shm_report_row.yml, _shm_report_rows.yml and _shm_report_results.yml
(``ansible-doc -t filter tritonops.shm._NAME``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from jinja2 import Environment
from jinja2.filters import do_filesizeformat, do_truncate

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.rules.records import KINDS
from ansible_collections.tritonops.shm.plugins.module_utils.rules.vocabulary import (
    FILE_CATEGORIES,
    kind_bytes_key,
    kind_count_key,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import GRPC_SCHEMES, split_url
from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import redact_url

_ENV = Environment()
NOT_RUN = 'no result (unreachable, limited out or stopped early)'
# a host whose holders could not all be seen (issue 25: outside the host's initial PID namespace; an unreadable
# shm directory; processes the module could not read): nothing there is stale, and its row is never ok
INCOMPLETE = 'incomplete'
# the report's statuses that do not fail the host: its numbers are shown (ok, incomplete), or the server has no shared
# memory to leak (unsupported: 2.73 tritonfrontend, not a leak), so a scheduled report keeps passing
PASSING = ('ok', INCOMPLETE, 'unsupported')
URL_SCHEMES = ('http', 'https') + tuple(GRPC_SCHEMES)
# the kinds whose regions have no file: a line each under their host, their counts in each row
_KINDS_WITHOUT_FILES = tuple(k for k in KINDS.values() if not k.files)


def _size(value: Any) -> str:
    return do_filesizeformat(value or 0, True)


def _truncate(text: Any, length: int) -> str:
    return do_truncate(_ENV, str(text), length, True)


def _used(summary: dict) -> str:
    return f'{_size(summary["used_bytes"])}/{_size(summary["total_bytes"])} {float(summary["used_percent"]):.0f}%'


def _report_line(width: int, *cells: Any) -> str:
    host, status, triton, used, regions, stale, dangling, orphan = (str(c) for c in cells)
    return (
        f'{host:<{width}}  {status:<9}  {triton:<8}  {used:<26}  {regions:>7}  {stale:>17}  {dangling:>8}  {orphan:>17}'
    )


def _report(rows: list, width: int) -> list[str]:
    out = [_report_line(width, 'HOST', 'STATUS', 'TRITON', '/DEV/SHM USED', 'REGIONS', 'STALE', 'DANGLING', 'ORPHAN')]
    for r in rows:
        if r.get('status') in ('ok', INCOMPLETE):
            used = 'unknown'
            if r['shm_total_bytes']:
                used = _used(
                    dict(
                        used_bytes=r['shm_used_bytes'],
                        total_bytes=r['shm_total_bytes'],
                        used_percent=r['shm_used_percent'],
                    )
                )
            out.append(
                _report_line(
                    width,
                    r['host'],
                    r['status'],
                    r['version'],
                    used,
                    r['regions'],
                    f'{int(r["stale_regions"] or 0)} ({_size(r["stale_bytes"])})',
                    r['dangling_regions'],
                    f'{int(r["orphan_files"] or 0)} ({_size(r["orphan_bytes"])})',
                )
            )
            if r.get('server_container') or r.get('clients'):  # who: the server's pod or container, its clients'
                who = f'server in {r["server_container"]}' if r.get('server_container') else 'server on the host'
                clients = ', '.join(r.get('clients') or ()) or 'none'
                out.append(f'{"":<{width}}  {"":<9}  {_truncate(f"{who}; clients: {clients}", 200)}')
            for kind in _KINDS_WITHOUT_FILES:  # GPU memory: CUDA regions by state (docs/cuda.md)
                if r.get(kind.result_key):
                    by_state = ', '.join(
                        f'{s} {int(r.get(kind_count_key(kind.name, s)) or 0)} '
                        f'({_size(r.get(kind_bytes_key(kind.name, s)))})'
                        for s in kind.states
                    )
                    line = f'{kind.name.upper()}: {r[kind.result_key]} region(s), {by_state}'
                    out.append(f'{"":<{width}}  {"":<9}  {line}')
            if r['status'] == INCOMPLETE:  # what was not checked, under the numbers it qualifies
                out.append(f'{"":<{width}}  {"":<9}  {_truncate(r.get("error"), 200)}')
        else:
            out.append(
                f'{str(r["host"]):<{width}}  {str(r.get("status")).upper():<9}  {_truncate(r.get("error"), 200)}'
            )
    return out + _metrics_skipped([(r.get('host'), r.get('metrics_skipped')) for r in rows])


def _cleanup_line(width: int, *cells: Any) -> str:
    host, status, before, after, unreg, files, freed, skip, note = (str(c) for c in cells)
    return f'{host:<{width}}  {status:<7}  {before:<25}  {after:<25}  {unreg:>5}  {files:>5}  {freed:>9}  {skip:>4}  {note}'


def _cleanup(rows: list, width: int, check_mode: bool) -> list[str]:
    out = [_cleanup_line(width, 'HOST', 'STATUS', 'SHM BEFORE', 'SHM AFTER', 'UNREG', 'FILES', 'FREED', 'SKIP', 'NOTE')]
    for host, r in rows:
        if not r:
            out.append(_cleanup_line(width, host, 'not run', '-', '-', '-', '-', '-', '-', NOT_RUN))
            continue
        before, after = r.get('before') or {}, r.get('after') or {}
        if r['status'] == 'failed':
            note = f'FAILED at {r["error"]["step"]}: {r["error"]["msg"]}'
        else:
            note = r.get('decision') or ''
        if after.get('total_bytes'):
            used_after = _used(after)
        else:
            used_after = '(check mode)' if r.get('check_mode') and r.get('acted') else '-'
        done = r['done']
        out.append(
            _cleanup_line(
                width,
                host,
                r['status'] + ('*' if r.get('changed') else ''),
                _used(before) if before.get('total_bytes') else '-',
                used_after,
                len(done['unregistered']),
                len(done['removed_files']),
                freed(r),
                len(r.get('skipped') or ()),
                _truncate(note, 160),
            )
        )
        for kind in _KINDS_WITHOUT_FILES:  # GPU memory: what the CUDA step unregistered and NVML showed back
            gone = done.get(f'{kind.name}_unregistered')
            if gone:
                back = done.get('freed_gpu_bytes')
                shown = 'not measured' if back is None else f'{_size(back)} of GPU memory back (NVML)'
                out.append(f'{"":<{width}}  {"":<7}  {kind.name.upper()}: {len(gone)} region(s) unregistered, {shown}')
    out.append(f'(* changed{"; check mode: what would be done, nothing was changed" if check_mode else ""})')
    out.append(FREED_SAYS)
    out += _metrics_skipped([(host, r.get('metrics_skipped')) for host, r in rows if r])
    return out


FREED_SAYS = (
    '(FREED: the removed files and the memory of the dangling regions unregistered, which Triton kept mapped; '
    'SHM AFTER also moves with what clients did meanwhile)'
)


def freed(record: dict) -> str:
    """The FREED cell of a cleanup record: the bytes of the files removed and of the dangling regions' unlinked memory
    that came back with their unregister (in check mode, what would be)."""
    done = record.get('done') or {}
    return _size(int(done.get('freed_bytes') or 0) + int(done.get('freed_unlinked_bytes') or 0))


def _metrics_skipped(hosts: list) -> list[str]:
    """One line for the hosts whose module call wrote no metrics because the textfile directory does not exist there
    (metrics_dir_missing: skip): said once for the run, not warned per host."""
    skipped = [(host, why) for host, why in hosts if why]
    if not skipped:
        return []
    names = ', '.join(str(h) for h, _why in skipped[:10]) + (
        f' and {len(skipped) - 10} more' if len(skipped) > 10 else ''
    )
    return [
        f'no metrics written on {len(skipped)} host(s) ({names}): {skipped[0][1]}; set prometheus_textfile_dir to '
        "the node_exporter textfile directory, or '' to stop looking for one"
    ]


ROW_SUMMARY = (
    ('shm_total_bytes', 'total_bytes'),
    ('shm_used_bytes', 'used_bytes'),
    ('shm_used_percent', 'used_percent'),
    ('regions', 'system_regions'),
    # each kind without files: its count, and its count and bytes in each of its states (cuda_stale_regions, ...)
    *(
        (key, key)
        for kind in _KINDS_WITHOUT_FILES
        for key in (
            kind.result_key,
            *(k for s in kind.states for k in (kind_count_key(kind.name, s), kind_bytes_key(kind.name, s))),
        )
    ),
    ('healthy_regions', 'healthy_regions'),
    ('stale_regions', 'stale_regions'),
    ('stale_bytes', 'stale_bytes'),
    ('dangling_regions', 'dangling_regions'),
    ('unknown_regions', 'unknown_regions'),
    ('orphan_files', 'orphan_files'),
    ('orphan_bytes', 'orphan_bytes'),
    ('suspect_regions', 'suspect_regions'),
    ('wedged_regions', 'wedged_regions'),
    ('wedged_bytes', 'wedged_bytes'),
)
# the bytes that explain what the shm filesystem uses (results.summarize): each file category, then the rest
ROW_BYTES = tuple(f'{c}_bytes' for c in FILE_CATEGORIES) + ('unlinked_mapped_bytes', 'other_bytes')
ROW_FAMILY = ('name', 'files', 'bytes', 'held_files', 'unheld_files', 'unheld_bytes', 'containers')


def shm_report_row(info: dict, host: str, url: Any = None) -> dict:
    """One host's row of the report playbook from its triton_shm_info result, failed or not.

    Status ok; incomplete when the holders could not all be seen (holders_complete false: error is
    holders_incomplete_reason); unlocated without the process; unsupported when the server offers no shared memory
    (server.shm_unsupported); misconfigured or down when the query failed (shm_report_failure).
    """
    if not isinstance(info, Mapping) or info.get('failed') or 'server' not in info or url_problem(url) is not None:
        return shm_report_failure(info, host, url)
    server = info['server']
    summary = info['summary']
    located = server.get('pid') is not None
    status, error = ('ok', None) if located else ('unlocated', server.get('not_found_reason'))
    if located and info.get('holders_complete') is False:
        status, error = INCOMPLETE, info.get('holders_incomplete_reason') or 'holders could not be fully determined'
    if server.get('shm_unsupported'):
        # Triton 2.73+ through tritonfrontend: no shared memory at all, so nothing was checked (not a leak)
        status, error = 'unsupported', server['shm_unsupported']
    row = dict(
        host=host,
        url=redact_url(url),
        status=status,
        error=error,
        version=server.get('version'),
        ready=server.get('ready'),
        shm_dir=server.get('shm_dir'),
    )
    row.update((key, summary.get(src)) for key, src in ROW_SUMMARY)
    regions = info.get('system_regions') or []
    row.update(
        holders_complete=info.get('holders_complete'),
        holders_incomplete_reason=info.get('holders_incomplete_reason'),
        pid_namespace=info.get('pid_namespace'),
        server_container=container_name(server.get('container')),
        clients=client_names(regions),
        stale=[r['name'] for r in regions if r.get('state') == 'stale'],
        dangling=[r['name'] for r in regions if r.get('state') == 'dangling'],
        wedged=[r['name'] for r in regions if r.get('state') == 'wedged'],
        suspect=[r['name'] for r in regions if r.get('state') == 'suspect'],
        bytes_by_category={key: summary.get(key) for key in ROW_BYTES},
        families=[{k: f.get(k) for k in ROW_FAMILY} for f in info.get('families') or () if isinstance(f, Mapping)],
        scanned_at=info.get('scanned_at'),
        metrics_skipped=info.get('metrics_skipped'),
    )
    return row


def url_problem(url: Any) -> str | None:
    """Why triton_url cannot be a Triton server's URL (missing, not a string, another scheme, no host, a bad port), or None."""
    if url is None or (isinstance(url, str) and not url.strip()):
        return (
            'triton_url is not set for this host: set it in the inventory (a host or group variable), '
            'e.g. triton_url: http://127.0.0.1:8000'
        )
    if not isinstance(url, str):
        return f'triton_url must be a URL string, got a {type(url).__name__}'
    try:
        split_url(
            url.strip(),
            URL_SCHEMES,
            f'triton_url {redact_url(url)!r} is not an http, https, grpc or grpcs URL with a host, '
            'e.g. http://127.0.0.1:8000',
        )
    except TritonError as exc:
        return exc.msg
    return None


def shm_report_failure(result: Any, host: str, url: Any = None) -> dict:
    """One host's row of the report playbook when its query failed: misconfigured or down.

    misconfigured: triton_url is missing or not a URL, or the module refused its arguments before asking the server (a bad
    variable: no ``failure`` in the result); down: the server was asked and did not answer, or answered with an error (the
    module's ``failure``).
    """
    result = result if isinstance(result, Mapping) else {}
    msg = str(result.get('msg') or result.get('module_stderr') or 'the query failed')
    problem = url_problem(url)
    if problem is not None:
        status, error = 'misconfigured', problem
    elif result.get('failure') is not None:
        status, error = 'down', msg
    else:
        status, error = 'misconfigured', f'the query refused its arguments before asking the server: {msg}'
    return dict(
        host=host,
        url=redact_url(url) if isinstance(url, str) else None,
        status=status,
        error=error,
        scanned_at=time.time(),
    )


def container_name(container: Any) -> str | None:
    """The name of a module result's container or pod (server.container, a holder's container), None when none."""
    return str(container.get('name')) if isinstance(container, Mapping) and container.get('name') else None


def client_names(regions: list) -> list[str]:
    """Who holds the registered regions, by container or pod ('pod ml/client-0'), else by process ('python (pid 7)')."""
    names = {
        container_name(h.get('container')) or f'{h.get("comm") or "?"} (pid {h.get("pid")})'
        for r in regions or ()
        for h in r.get('holders') or ()
    }
    return sorted(names)


def shm_report_results(results: list, hosts: list, urls: list | None = None) -> list[dict]:
    """The report's rows from the hosts' triton_shm_info results (failed ones too), in the order of hosts.

    A host without a result (unreachable, limited out) is 'not run'; urls are the hosts' triton_url (None when unset).
    """
    results, hosts = list(results or ()), list(hosts or ())
    urls = list(urls) if urls is not None else [None] * len(hosts)
    if not len(results) == len(hosts) == len(urls):
        raise AnsibleFilterError(
            'shm_report_results: needs one result (or null) and one URL (or null) per host in hosts'
        )
    # an unreachable host's registered result is no query: 'not run'
    return shm_report_rows(
        [shm_report_row(r, h, u) if r and not r.get('unreachable') else None for r, h, u in zip(results, hosts, urls)],
        hosts,
    )


def shm_report_rows(reports: list, hosts: list) -> list[dict]:
    """The report's rows, one per host: its tritonops_shm_report, or a 'not run' row when it has none."""
    reports, hosts = list(reports or ()), list(hosts or ())
    if len(reports) != len(hosts):
        raise AnsibleFilterError('shm_report_rows: needs one report (or null) per host in hosts')
    return [r if r else dict(host=h, status='not run', error='no result') for h, r in zip(hosts, reports)]


def shm_fleet_table(rows: list, kind: str, hosts: list | None = None, check_mode: bool = False) -> list[str]:
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
    raise AnsibleFilterError(f"shm_fleet_table: kind must be 'report' or 'cleanup', got {kind!r}")
