# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet's shared memory as one self-contained HTML page (report and cleanup playbooks), as a pure function.

Private to the tritonops.shm collection: no stability promise to other code. Controller code (plugin_utils) that
the filter of the same job adapts (plugins/filter/); it imports what a filter may import (CONTRIBUTING.md, "Imports").

Documentation: plugins/filter/shm_html_report.yml (``ansible-doc -t filter tritonops.shm.shm_html_report``).

No script, no external style sheet, font or image: the page works offline and as an AWX artifact, and its
Content-Security-Policy forbids scripts and every fetch. Every value is escaped by ``_h`` (html.escape), so a
region or file name is text whatever it contains. Standard library only (filters are imported by every worker).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.rules import vocabulary as v

# the one vocabulary (module_utils/rules/vocabulary.py), in the one order of the inventory and the metrics
STATES = v.REGION_STATES
CATEGORIES = v.FILE_CATEGORIES
# the kinds whose regions have no file: counted by state beside the system regions' states (a summary key each)
_KINDS_WITHOUT_FILES = tuple(k for k in records.KINDS.values() if not k.files)
# backend pools that need attention come first
POOL_ORDER = {state: i for i, state in enumerate(v.POOL_STATES_BY_ATTENTION)}
# hosts that need attention come first, in this order
SEVERITY = {
    'failed': 0,
    'down': 1,
    'misconfigured': 2,
    'unlocated': 3,
    'incomplete': 4,
    'unsupported': 5,
    'not run': 6,
    'ok': 7,
}
# regions that need attention come first in a host's table
STATE_ORDER = {state: i for i, state in enumerate(v.REGION_STATES_BY_ATTENTION)}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'; base-uri 'none'"
NOT_RUN = 'no result (unreachable, limited out or stopped early)'

CSS = """
:root{--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;--muted:#57606a;--line:#d0d7de;--stale:#cf222e;--live:#0969da;
--orphan:#bf8700;--other:#8c959f;--free:#eaeef2}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","Noto Sans CJK SC",sans-serif;margin:0;
color:#1f2328;background:#f6f8fa}
header,main{max-width:1200px;margin:0 auto;padding:12px 20px}
header{background:#fff;border-bottom:1px solid var(--line);max-width:none}
header>div{max-width:1160px;margin:0 auto}
h1{font-size:22px;margin:4px 0}
h2{font-size:17px;margin:0}
.muted{color:var(--muted)}
.fleet{display:flex;gap:18px;flex-wrap:wrap;margin:6px 0}
.fleet span b{font-size:18px}
#attention{border:2px solid var(--bad);background:#ffebe9;border-radius:6px;padding:8px 14px;margin:12px 0}
#attention h2{color:var(--bad)}
#attention ul{margin:6px 0;padding-left:18px}
#attention a{color:inherit}
section.host{background:#fff;border:1px solid var(--line);border-left:6px solid var(--ok);border-radius:6px;
padding:10px 14px;margin:12px 0}
section.host.bad{border-left-color:var(--bad)}
section.host.warn{border-left-color:var(--warn)}
.hosthead{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.badge{display:inline-block;padding:0 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;background:var(--ok);
text-transform:uppercase}
.badge.bad{background:var(--bad)}
.badge.warn{background:var(--warn)}
.error{color:var(--bad);font-weight:600;white-space:pre-wrap;overflow-wrap:anywhere}
.note{color:var(--warn);overflow-wrap:anywhere}
.located{overflow-wrap:anywhere;margin:4px 0}
.bar{display:flex;height:18px;border:1px solid var(--line);border-radius:4px;overflow:hidden;background:var(--free);
margin:4px 0}
.bar span{display:block;height:100%}
.seg-stale{background:var(--stale)}
.seg-live{background:var(--live)}
.seg-orphan{background:var(--orphan)}
.seg-other{background:var(--other)}
.seg-free{background:var(--free);border:1px solid var(--line)}
.legend{font-size:12px;color:var(--muted)}
.legend i{display:inline-block;width:10px;height:10px;margin:0 3px 0 10px;vertical-align:middle}
.counts{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0;padding:0}
.counts div{border:1px solid var(--line);border-radius:4px;padding:1px 8px;min-width:70px}
.counts dt{font-size:11px;color:var(--muted);margin:0}
.counts dd{margin:0;font-weight:600}
.counts div.hot{border-color:var(--bad);background:#ffebe9}
table{border-collapse:collapse;width:100%;margin:6px 0;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.name,td.key,td.path{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-wrap:anywhere}
td.name,td.path{min-width:14em}
td.key{min-width:7em}
td.num{text-align:right;white-space:nowrap}
.state{font-weight:600}
.state-stale,.state-dangling{color:var(--bad)}
.state-unknown{color:var(--warn)}
.state-healthy{color:var(--ok)}
.state-reserved{color:var(--live)}
.state-leftover{color:var(--orphan)}
.state-live{color:var(--ok)}
h3{font-size:14px;margin:10px 0 2px}
footer{max-width:1200px;margin:0 auto;padding:8px 20px 20px;color:var(--muted);font-size:12px}
"""


class _Html(str):
    """Markup built by _h: inserted as it is. Every other value is escaped."""


def _h(tag: str, *children: Any, **attrs: Any) -> _Html:
    """One element; attribute values and every child that is not _Html are escaped (class_ -> class, data_x -> data-x)."""
    parts = [tag]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip('_').replace('_', '-')
        parts.append(name if value is True else f'{name}="{html.escape(str(value), quote=True)}"')
    inner = ''.join(_text(c) for c in children)
    return _Html(f'<{" ".join(parts)}>{inner}</{tag}>')


def _text(value: Any) -> str:
    if value is None:
        return ''
    if isinstance(value, _Html):
        return value
    if isinstance(value, (list, tuple)):
        return ''.join(_text(v) for v in value)
    return html.escape(str(value), quote=False)  # text: < > & (attribute values escape quotes too)


def _size(value: Any) -> str:
    """Bytes in binary units, as the text tables show them (1.0 MiB)."""
    n = float(value or 0)
    if n < 1024:
        return f'{int(n)} B'
    for unit in ('KiB', 'MiB', 'GiB', 'TiB', 'PiB'):
        n /= 1024
        if n < 1024 or unit == 'PiB':
            return f'{n:.1f} {unit}'
    return ''  # pragma: no cover


def _age(seconds: Any) -> str:
    if seconds is None:
        return '-'
    s = int(float(seconds))
    if s < 120:
        return f'{s} s'
    if s < 7200:
        return f'{s // 60} min'
    if s < 172800:
        return f'{s // 3600} h'
    return f'{s // 86400} d'


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _holders(holders: Any) -> str:
    return ', '.join(f'{h.get("comm") or "?"} (pid {h.get("pid")}{_in_container(h)})' for h in holders or ()) or '-'


def _in_container(item: Mapping) -> str:
    """', pod ml/client-0' for a holder or server the host shows in a container or pod, else ''."""
    container = item.get('container')
    return f', {container["name"]}' if isinstance(container, Mapping) and container.get('name') else ''


def _bar(label: str, used: int, total: int, stale: int = 0, orphan: int = 0, registered: int | None = None) -> _Html:
    """A usage bar: stale, live registered, orphan and other used bytes as parts of the filesystem's size."""
    if total <= 0:
        return _h('p', f'{label}: size unknown (the shm directory was not read)', class_='muted')
    stale = min(stale, used)
    orphan = min(orphan, used - stale)
    live = 0 if registered is None else min(max(registered - stale, 0), used - stale - orphan)
    other = max(used - stale - orphan - live, 0)
    segments = []
    for cls, part, name in (
        ('seg-stale', stale, 'stale'),
        ('seg-live', live, 'registered, not stale'),
        ('seg-orphan', orphan, 'orphan files'),
        ('seg-other', other, 'other use'),
    ):
        if part > 0:
            segments.append(
                _h('span', class_=cls, title=f'{name}: {_size(part)}', style=f'width:{100.0 * part / total:.3f}%')
            )
    percent = 100.0 * used / total
    caption = f'{label}: {_size(used)} used of {_size(total)} ({percent:.1f}%)'
    parts = [f'stale {_size(stale)}', f'orphan {_size(orphan)}']
    if registered is not None:
        parts.insert(0, f'registered {_size(registered)}')
    return _Html(
        _h('div', caption, '; ', '; '.join(parts), class_='legend', data_used=used, data_total=total)
        + _h('div', segments, class_='bar', role='img', aria_label=caption, data_bar=label)
    )


def _legend() -> _Html:
    return _h(
        'p',
        [
            _Html(f'<i class="{cls}"></i>{_h("span", name)}')
            for cls, name in (
                ('seg-stale', 'stale regions'),
                ('seg-live', 'registered, not stale'),
                ('seg-orphan', 'orphan files'),
                ('seg-other', 'other use'),
                ('seg-free', 'free'),
            )
        ],
        class_='legend',
    )


def _counts(summary: Mapping, kinds: bool = True) -> _Html:
    """The counts of a summary: its region states, with kinds the regions of each kind without files by state, then its
    file categories."""
    items = []
    for state in STATES:
        n = _int(summary.get(v.region_count_key(state)))
        hot = n > 0 and state in v.ATTENTION_STATES
        items.append(_h('div', _h('dt', state), _h('dd', n), class_='hot' if hot else None, data_state=state))
    for kind in _KINDS_WITHOUT_FILES:
        count = summary.get(kind.result_key)
        if count is None or not kinds:
            continue
        label = kind.name.upper()
        items.append(_h('div', _h('dt', label), _h('dd', _int(count)), data_state=kind.name))
        for state in kind.states:  # GPU memory: a stale CUDA region pins its GPU memory until unregistered
            key = v.kind_count_key(kind.name, state)
            if _int(count) and summary.get(key) is not None:  # only where regions of the kind are registered
                n = _int(summary[key])
                size = _size(summary.get(v.kind_bytes_key(kind.name, state)))
                hot = n > 0 and state in v.ATTENTION_STATES
                items.append(
                    _h(
                        'div',
                        _h('dt', f'{label} {state} ({size})'),
                        _h('dd', n),
                        class_='hot' if hot else None,
                        data_state=f'{kind.name}_{state}',
                    )
                )
    for category in CATEGORIES:
        key = v.file_count_key(category)
        if key in summary:
            items.append(_h('div', _h('dt', f'{category} files'), _h('dd', _int(summary[key])), data_category=category))
    return _h('dl', items, class_='counts')


def _registered_bytes(inventory: Mapping) -> int | None:
    files = inventory.get('files')
    if files is None:
        return None
    return sum(_int(f.get('allocated_bytes')) for f in files if f.get('category') == v.REGISTERED)


def _field_cell(field: records.Field, value: Any) -> _Html:
    """A region field's cell: a size, a number, or text ('-' when the region lacks it)."""
    if field.unit == records.BYTES:
        return _h('td', _size(value), class_='num')
    if not field.text:
        return _h('td', '-' if value is None else str(value), class_='num')
    return _h('td', value or '-', class_='key')


def _regions_table(regions: Sequence[Mapping], outcome: dict | None = None) -> _Html:
    if not regions:
        return _h('p', 'No system region is registered.', class_='muted')
    # the region fields with a label (records.py: the name first, an optional field only when a region carries it)
    fields = records.SYSTEM.labelled(regions)
    head = ['region', 'state', *(f.label for f in fields), 'holders', 'why']  # holders: processes besides the server
    if outcome is not None:
        head.append('this run')
    rows = []
    for r in sorted(regions, key=lambda r: (STATE_ORDER.get(r.get('state'), 9), str(r.get('name')))):
        state = str(r.get('state') or v.UNKNOWN)
        cells = [
            _h('td', r.get('name'), class_='name'),
            _h('td', state, class_=f'state state-{state}'),
            *(_field_cell(f, r.get(f.name)) for f in fields),
            _h('td', _holders(r.get('holders')), class_='holders'),
            _h('td', r.get('state_reason') or ''),
        ]
        if outcome is not None:
            cells.append(_h('td', outcome.get(r.get('name'), 'kept'), class_='outcome'))
        rows.append(_h('tr', cells, data_region=r.get('name'), data_state=state))
    return _h('table', _h('thead', _h('tr', [_h('th', c) for c in head])), _h('tbody', rows), class_='regions')


def _orphans_table(files: Sequence[Mapping], removed: set | None = None, check_mode: bool = False) -> _Html:
    orphans = [f for f in files if f.get('category') == v.ORPHAN]
    if not orphans:
        return _h('p', 'No orphan file.', class_='muted')
    head = ['file', 'size', 'age', 'why']
    if removed is not None:
        head.append('this run')
    rows = []
    for f in sorted(orphans, key=lambda f: str(f.get('name'))):
        cells = [
            _h('td', f.get('name'), class_='path'),
            _h('td', _size(f.get('allocated_bytes')), class_='num'),
            _h('td', _age(f.get('age_s')), class_='num'),
            _h('td', f.get('category_reason') or ''),
        ]
        if removed is not None:
            gone = f.get('path') in removed
            cells.append(
                _h('td', ('would be removed' if check_mode else 'removed') if gone else 'kept', class_='outcome')
            )
        rows.append(_h('tr', cells, data_file=f.get('name')))
    return _h('table', _h('thead', _h('tr', [_h('th', c) for c in head])), _h('tbody', rows), class_='orphans')


def _bytes_table(summary: Mapping, families: Any) -> _Html:
    """What fills the shm directory: the bytes of each file category (Triton's, then the rest), the server's unlinked
    mappings and the rest of what the filesystem says is used, then the files that are not Triton's by family."""
    rows = []
    for category in CATEGORIES:
        key = v.file_bytes_key(category)
        if summary.get(key) is not None:
            rows.append(
                _h(
                    'tr',
                    _h('td', f'{category} files'),
                    _h('td', _int(summary.get(v.file_count_key(category))), class_='num'),
                    _h('td', _size(summary[key]), class_='num'),
                    data_bytes=category,
                )
            )
    for key, name in (('unlinked_mapped_bytes', "server's unlinked mappings"), ('other_bytes', 'other use')):
        if summary.get(key) is not None:
            rows.append(
                _h('tr', _h('td', name), _h('td', ''), _h('td', _size(summary[key]), class_='num'), data_bytes=key)
            )
    if not rows:
        return _Html('')
    out = _h(
        'table',
        _h('thead', _h('tr', [_h('th', c) for c in ('what', 'files', 'bytes')])),
        _h('tbody', rows),
        class_='bytes',
    )
    fams = [f for f in families if isinstance(f, Mapping)] if isinstance(families, (list, tuple)) else []
    if fams:
        head = ['family', 'files', 'bytes', 'held', 'unheld', 'holders in']
        fam_rows = [
            _h(
                'tr',
                _h('td', f.get('name'), title=f.get('description') or ''),
                _h('td', _int(f.get('files')), class_='num'),
                _h('td', _size(f.get('bytes')), class_='num'),
                _h('td', f'{_int(f.get("held_files"))} ({_size(f.get("held_bytes"))})', class_='num'),
                _h('td', f'{_int(f.get("unheld_files"))} ({_size(f.get("unheld_bytes"))})', class_='num'),
                _h('td', ', '.join(str(c) for c in f.get('containers') or ())),
                data_family=f.get('name'),
            )
            for f in fams
        ]
        out = _Html(
            out
            + _h('p', "Files that are not Triton's, by family (docs/shm-families.md):", class_='muted')
            + _h('table', _h('thead', _h('tr', [_h('th', c) for c in head])), _h('tbody', fam_rows), class_='families')
        )
    return out


def restart_note(summary: Mapping) -> str | None:
    """What a restart of the server would free, when regions are wedged (only a restart frees them), else None."""
    n = _int(summary.get(v.region_count_key(v.WEDGED)))
    if not n:
        return None
    return (
        f'needs a restart: {n} wedged region(s) that Triton keeps refusing to unregister; '
        f'a restart of the server frees {_size(summary.get(v.region_bytes_key(v.WEDGED)))}'
    )


def _pools_table(pools: Sequence[Mapping], removed: set | None = None, check_mode: bool = False) -> _Html:
    """The pools of Triton's Python-based backends, one row per pool (a model instance), by model; leftovers first."""
    if not pools:
        return _h('p', 'No python backend pool.', class_='muted')
    head = ['model', 'instance', 'backend', 'pool size', 'bytes', 'state', 'holders', 'file', 'why']
    if removed is not None:
        head.append('this run')
    rows = []
    for p in sorted(
        pools,
        key=lambda p: (
            POOL_ORDER.get(p.get('state'), 9),
            str(p.get('model') or '~'),
            str(p.get('instance') or ''),
            str(p.get('name')),
        ),
    ):
        state = str(p.get('state') or v.POOL_UNKNOWN)
        cells = [
            _h('td', p.get('model') or '-', class_='name'),
            _h('td', p.get('instance') or '-', class_='key'),
            _h('td', p.get('backend') or '-'),
            _h('td', _size(p.get('size')), class_='num'),
            _h('td', _size(p.get('bytes')), class_='num'),
            _h('td', state, class_=f'state state-{state}'),
            _h('td', _holders(p.get('holders')), class_='holders'),
            _h('td', p.get('name'), class_='path'),
            _h('td', p.get('reason') or ''),
        ]
        if removed is not None:
            gone = p.get('path') in removed
            cells.append(
                _h('td', ('would be removed' if check_mode else 'removed') if gone else 'kept', class_='outcome')
            )
        rows.append(_h('tr', cells, data_pool=p.get('name'), data_model=p.get('model') or '', data_state=state))
    return _Html(
        _models_table(pools)
        + _h('table', _h('thead', _h('tr', [_h('th', c) for c in head])), _h('tbody', rows), class_='pools')
    )


def _models_table(pools: Sequence[Mapping]) -> _Html:
    """One row per model: its instances, pools, bytes and largest pool; the leftovers of dead servers (which no live
    stub names) in a row of their own, last."""
    models: dict = {}
    for p in pools:
        key = v.POOL_LEFTOVER if p.get('state') == v.POOL_LEFTOVER else str(p.get('model') or '-')
        m = models.setdefault(key, dict(instances=set(), pools=0, bytes=0, largest=0))
        m['pools'] += 1
        m['bytes'] += _int(p.get('bytes'))
        m['largest'] = max(m['largest'], _int(p.get('bytes')))
        if p.get('instance'):
            m['instances'].add(p['instance'])
    order = sorted(models, key=lambda k: (k == v.POOL_LEFTOVER, -models[k]['bytes'], k))
    rows = [
        _h(
            'tr',
            _h('td', 'leftover (dead servers)' if k == v.POOL_LEFTOVER else k, class_='name'),
            _h('td', str(len(models[k]['instances'])) if k != v.POOL_LEFTOVER else '-', class_='num'),
            _h('td', str(models[k]['pools']), class_='num'),
            _h('td', _size(models[k]['bytes']), class_='num'),
            _h('td', _size(models[k]['largest']), class_='num'),
            data_model_total=k,
        )
        for k in order
    ]
    head = ['model', 'instances', 'pools', 'bytes', 'largest pool']
    return _h('table', _h('thead', _h('tr', [_h('th', c) for c in head])), _h('tbody', rows), class_='pool-models')


def _located(server: Mapping) -> _Html:
    """How the server process was found (located_by, pid, shm directory, version), or why not."""
    facts = [f'pid {server.get("pid")}{_in_container(server)}', f'shm directory {server.get("shm_dir")}']
    if server.get('version'):
        facts.append(f'Triton {server["version"]}{" (ready)" if server.get("ready") else ""}')
    if server.get('pid') is not None:
        how = server.get('located_by') or 'given (server_pid or shm_dir)'
        return _h(
            'div',
            _h('p', _h('b', 'Server found: '), how, class_='located'),
            _h('p', ' · '.join(facts), class_='muted'),
            data_located='true',
        )
    if server.get('not_found_reason'):
        return _h(
            'p',
            _h('b', 'Server process not found: '),
            server['not_found_reason'],
            class_='located error',
            data_located='false',
        )
    return _Html('')


def _tone(status: str) -> str | None:
    return None if status == 'ok' else ('warn' if status in ('not run', 'incomplete', 'unsupported') else 'bad')


class _Host:
    """What the page shows for one host, from a report row or a cleanup record and the inventory read."""

    def __init__(self, host: str, status: str, url: Any = None, error: Any = None) -> None:
        self.host, self.status, self.url, self.error = str(host), status, url, error
        self.body: list = []
        self.error_shown_below = False  # the body already says it (an unlocated server's reason)
        self.restart: str | None = None  # restart_note: the server needs a restart (wedged regions)

    def section(self, index: int) -> _Html:
        tone = _tone(self.status)
        head = _h(
            'div',
            _h('h2', self.host),
            _h('span', self.status, class_=f'badge {tone}' if tone else 'badge'),
            _h('span', self.url or '', class_='muted'),
            class_='hosthead',
        )
        error = _h('p', self.error, class_='error') if self.error and not self.error_shown_below else ''
        return _h(
            'section',
            head,
            error,
            self.body,
            class_=f'host {tone}' if tone else 'host',
            id=f'host-{index}',
            data_host=self.host,
            data_status=self.status,
        )


def _inventory_body(
    inventory: Mapping,
    summary: Mapping,
    outcome: dict | None = None,
    removed: set | None = None,
    check_mode: bool = False,
    label: str = '/dev/shm',
) -> list:
    server = inventory.get('server') or {}
    out = [_located(server)]
    if inventory.get('holders_complete') is False and server.get('pid') is not None:
        why = inventory.get('holders_incomplete_reason')
        if why:
            out.append(
                _h(
                    'p',
                    _h('b', 'Holders could not be fully determined: '),
                    why,
                    '. No region is called stale here, and nothing is removed.',
                    class_='note',
                    data_incomplete='true',
                )
            )
        else:
            out.append(
                _h(
                    'p',
                    f'Holders could not be fully determined ({_int(inventory.get("unreadable_processes"))} '
                    'unreadable process(es)): no region is called stale here.',
                    class_='note',
                )
            )
    out.append(
        _bar(
            label,
            _int(summary.get('used_bytes')),
            _int(summary.get('total_bytes')),
            _int(summary.get('stale_bytes')),
            _int(summary.get('orphan_bytes')),
            _registered_bytes(inventory),
        )
    )
    out.append(_counts(summary))
    restart = restart_note(summary)
    if restart:
        out.append(_h('p', _h('b', 'Restart: '), restart, class_='note', data_restart='true'))
    out.append(_h('h3', 'Regions'))
    out.append(_regions_table(inventory.get('system_regions') or [], outcome))
    out.append(_h('h3', 'Orphan files'))
    out.append(_orphans_table(inventory.get('files') or [], removed, check_mode))
    if inventory.get('backend_pools') is not None:
        out.append(_h('h3', 'Python backend pools by model'))
        out.append(_pools_table(inventory['backend_pools'], removed, check_mode))
    explained = _bytes_table(summary, inventory.get('families'))
    if explained:
        out.append(_h('h3', f'What fills {label}'))
        out.append(explained)
    return out


def _report_host(row: Mapping, info: Mapping | None) -> _Host:
    status = str(row.get('status') or 'not run')
    item = _Host(row.get('host', '?'), status, row.get('url'), row.get('error'))
    if info and info.get('summary') is not None and status in ('ok', 'unlocated', 'incomplete'):
        item.body = _inventory_body(info, info['summary'])
        item.restart = restart_note(info['summary'])
        item.error_shown_below = (
            status == 'unlocated'
            and row.get('error') == (info.get('server') or {}).get('not_found_reason')
            or status == 'incomplete'
            and row.get('error') == info.get('holders_incomplete_reason')
        )
    elif status == 'ok':  # a row without the module result: the row's own numbers
        item.body = [
            _bar(
                '/dev/shm',
                _int(row.get('shm_used_bytes')),
                _int(row.get('shm_total_bytes')),
                _int(row.get('stale_bytes')),
                _int(row.get('orphan_bytes')),
            ),
            _counts(
                {
                    **{v.region_count_key(s): row.get(v.region_count_key(s)) for s in STATES},
                    **{
                        key: row.get(key)
                        for kind in _KINDS_WITHOUT_FILES
                        for key in (
                            kind.result_key,
                            *(v.kind_count_key(kind.name, s) for s in kind.states),
                            *(v.kind_bytes_key(kind.name, s) for s in kind.states),
                        )
                    },
                }
            ),
        ]
    return item


def _read(result: Any) -> Mapping | None:
    """The inventory a cleanup record was made from: its triton_shm_region call's ``before`` (inventory=true)."""
    if isinstance(result, Mapping) and not result.get('skipped') and isinstance(result.get('before'), Mapping):
        if isinstance(result['before'].get('summary'), Mapping):
            return result['before']
    return None


def _cleanup_host(host: str, result: Mapping | None, region_result: Any, check_mode: bool) -> _Host:
    if not result:
        return _Host(host, 'not run', error=NOT_RUN)
    error = result.get('error')
    item = _Host(
        host,
        str(result.get('status') or 'failed'),
        result.get('url'),
        f"failed at '{error.get('step')}': {error.get('msg')}" if error else None,
    )
    done = result.get('done') or {}
    would = check_mode or result.get('check_mode')
    outcome = {n: 'would be unregistered' if would else 'unregistered' for n in done.get('unregistered') or ()}
    outcome.update(
        (s['name'], f'skipped: {s.get("reason")}') for s in result.get('skipped') or () if s.get('name') is not None
    )
    outcome.update(
        (n, 'pending: unregister accepted, still listed (requests in flight), file kept')
        for n in done.get('pending') or ()
    )
    files, unlinked = int(done.get('freed_bytes') or 0), int(done.get('freed_unlinked_bytes') or 0)
    freed = f'{"would free" if would else "freed"} {_size(files + unlinked)}'
    if unlinked:  # the dangling regions' memory: no file to remove, Triton kept it mapped until the unregister
        freed += f" ({_size(files)} of files, {_size(unlinked)} of the dangling regions' memory)"
    lines = []
    if result.get('decision'):
        lines.append(_h('p', _h('b', 'Decision: '), result['decision']))
    if item.status == 'ok' or any(done.get(k) for k in ('unregistered', 'pending', 'removed_files', 'registered')):
        pending = f'{len(done["pending"])} pending, ' if done.get('pending') else ''
        lines.append(
            _h(
                'p',
                _h('b', 'Done: '),
                f'{len(done.get("unregistered") or ())} region(s) unregistered, {pending}'
                f'{len(done.get("removed_files") or ())} file(s) removed, {freed}, '
                f'{len(done.get("registered") or ())} region(s) re-registered',
                ' (check mode: nothing was changed)' if would else '',
                class_='done',
            )
        )
    before, after = result.get('before'), result.get('after')
    inventory = _read(region_result) if before else None
    if inventory is not None:
        body = _inventory_body(
            inventory,
            inventory['summary'],
            outcome,
            set(done.get('removed_files') or ()),
            bool(would),
            '/dev/shm before',
        )
        lines = body[:1] + lines + body[1:]  # how the server was found, then what was decided and done
        item.restart = restart_note(inventory['summary'])
        reason = (inventory.get('server') or {}).get('not_found_reason')
        item.error_shown_below = bool(reason and item.error and reason in item.error)
    elif before:
        lines.append(
            _bar(
                '/dev/shm before',
                _int(before.get('used_bytes')),
                _int(before.get('total_bytes')),
                _int(before.get('stale_bytes')),
                _int(before.get('orphan_bytes')),
            )
        )
        lines.append(_counts(before, kinds=False))
    if after and after != before:  # measured after acting (the record repeats before when nothing was done)
        lines.append(
            _bar(
                '/dev/shm after',
                _int(after.get('used_bytes')),
                _int(after.get('total_bytes')),
                _int(after.get('stale_bytes')),
                _int(after.get('orphan_bytes')),
            )
        )
    nameless = [s for s in result.get('skipped') or () if s.get('name') is None]
    if nameless:
        lines.append(_h('h3', 'Files left alone'))
        lines.append(_h('ul', [_h('li', _h('code', s.get('path')), ': ', s.get('reason')) for s in nameless]))
    item.body = lines
    return item


def _page(items: list, kind: str, generated_at: str, check_mode: bool, title: str) -> str:
    order = sorted(range(len(items)), key=lambda i: (SEVERITY.get(items[i].status, 0), i))
    problems = [i for i in order if items[i].status != 'ok' or items[i].restart]
    fleet = [
        _h('span', _h('b', len(items)), ' host(s)'),
        _h('span', _h('b', sum(1 for it in items if it.status == 'ok')), ' ok', data_fleet='ok'),
        _h('span', _h('b', len(problems)), ' need attention', data_fleet='attention'),
    ]
    for status in ('failed', 'down', 'misconfigured', 'unlocated', 'incomplete', 'unsupported', 'not run'):
        n = sum(1 for it in items if it.status == status)
        if n:
            fleet.append(_h('span', _h('b', n), f' {status}', data_fleet=status))
    restarts = [it for it in items if it.restart]
    if restarts:
        fleet.append(_h('span', _h('b', len(restarts)), ' need a restart', data_fleet='restart'))
    attention = ''
    if problems:
        lines = [
            _h(
                'li',
                _h('a', items[i].host, href=f'#host-{i + 1}'),
                f' ({items[i].status})',
                f': {items[i].error}' if items[i].error else '',
                f'; {items[i].restart}' if items[i].restart and items[i].error else '',
                f': {items[i].restart}' if items[i].restart and not items[i].error else '',
                data_host=items[i].host,
                data_status=items[i].status,
            )
            for i in problems
        ]
        attention = _h('section', _h('h2', 'Needs attention'), _h('ul', lines), id='attention')
    subtitle = f'{kind} playbook{", check mode: nothing was changed" if check_mode else ""}'
    if generated_at:
        subtitle += f' · generated {generated_at}'
    header = _h(
        'header', _h('div', _h('h1', title), _h('div', subtitle, class_='muted'), _h('div', fleet, class_='fleet'))
    )
    main = _h('main', attention, _legend(), [items[i].section(i + 1) for i in order])
    footer = _h(
        'footer',
        'tritonops.shm · self-contained report: no script, no external resource. '
        'Holders are the processes besides the server that map or hold a file. '
        'Region states: healthy (a client holds it), stale (only the server holds it: its client is gone), '
        'reserved (registered by this collection, no client yet), dangling (its file is missing), '
        'unknown (holders or server not fully determined). '
        'Python backend pools: live (a process holds it), leftover (no process holds it: a server and its '
        'stubs died together), unknown (holders not fully determined, or younger than min_age).',
    )
    head = (
        f'<head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="tritonops.shm"><title>{html.escape(title)}</title><style>{CSS}</style></head>'
    )
    return f'<!DOCTYPE html>\n<html lang="en">{head}<body data-kind="{kind}">{header}{main}{footer}</body></html>\n'


def _list(value: Any, name: str) -> list:
    if value is None:
        return []
    if isinstance(value, Mapping) or isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise AnsibleFilterError(f'shm_html_report: {name} must be a list, got {type(value).__name__}')
    return list(value)


def shm_html_report(
    data: Any,
    kind: str,
    hosts: Any = None,
    details: Any = None,
    check_mode: bool = False,
    generated_at: str = '',
    title: str | None = None,
) -> str:
    """The HTML page of the report (rows of tritonops_shm_report) or the cleanup (shm_cleanup_result per host of hosts)."""
    rows = _list(data, 'the input')
    extra = _list(details, 'details')
    if extra and len(extra) != len(rows):
        raise AnsibleFilterError('shm_html_report: details needs one entry (or null) per row')
    extra += [None] * (len(rows) - len(extra))
    try:
        if kind == 'report':
            items = [_report_host(r or {}, d) for r, d in zip(rows, extra)]
            return _page(items, kind, generated_at, bool(check_mode), title or 'Triton shared memory report')
        if kind == 'cleanup':
            names = [str(h) for h in _list(hosts, 'hosts')]
            if len(names) != len(rows):
                raise AnsibleFilterError('shm_html_report: cleanup needs one result (or null) per host in hosts')
            items = [_cleanup_host(h, r, d, bool(check_mode)) for h, r, d in zip(names, rows, extra)]
            return _page(items, kind, generated_at, bool(check_mode), title or 'Triton shared memory cleanup')
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f'shm_html_report: unexpected {kind} data: {exc}', orig_exc=exc) from exc
    raise AnsibleFilterError(f"shm_html_report: kind must be 'report' or 'cleanup', got {kind!r}")
