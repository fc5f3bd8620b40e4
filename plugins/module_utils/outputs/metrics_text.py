# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The text of the collection's metrics files, both ways: how a sample is written and how one is read back.

Private to the tritonops.shm collection: no stability promise to other code. Standard library only and no import of
the collection: the event source (extensions/eda) reads what metrics.py wrote with it.

- ``label_value()``, ``number()``, ``sample()``: a sample line of the Prometheus text format (metrics.py writes every
  line of its textfiles through them);
- ``samples()``: the samples of such a text, labels unescaped (metrics.py reads its previous counters, the event
  source the holders series of a node_exporter page);
- ``holders_complete()``: what a page says of one server's holder scan (``HOLDERS_COMPLETE``), for the event source's
  ``metrics_url``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import Any, Callable, NamedTuple

HOLDERS_COMPLETE = 'tritonops_shm_holders_complete'

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def label_value(value: Any) -> str:
    """value as the inside of a label's quotes: backslash, double quote and line break escaped; None as ''."""
    text = str('' if value is None else value).encode('utf-8', 'backslashreplace').decode('utf-8')
    return text.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def number(value: Any) -> str:
    """value as a sample value: 1/0 for a bool, an integer without a point, NaN and +Inf/-Inf as Prometheus spells them."""
    if isinstance(value, bool):
        return '1' if value else '0'
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return 'NaN'
    if math.isinf(value):
        return '+Inf' if value > 0 else '-Inf'
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def sample(name: str, labels: Iterable[tuple[str, Any]], value: Any) -> str:
    """One sample line: name{k="v",...} value."""
    inside = ','.join(f'{k}="{label_value(v)}"' for k, v in labels)
    return f'{name}{{{inside}}} {number(value)}'


def _unescape(value: str) -> str:
    return re.sub(r'\\(.)', lambda m: '\n' if m.group(1) == 'n' else m.group(1), value)


def samples(text: str, name: str | None = None) -> Iterator[tuple[str, dict, float]]:
    """(name, labels, value) of each sample line of text (of metric name only, when given); comments, blank lines
    and lines that are not a sample are skipped."""
    for line in (text or '').splitlines():
        if not line or line.startswith('#') or (name is not None and not line.startswith(name)):
            continue
        match = _SAMPLE.match(line)
        if match is None or (name is not None and match.group(1) != name):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = {m.group(1): _unescape(m.group(2)) for m in _LABEL.finditer(match.group(2) or '')}
        yield match.group(1), labels, value


class Holders(NamedTuple):
    """What a metrics page says of one server's holder scan: complete True, False or None (unknown), and why."""

    complete: bool | None
    reason: str | None = None  # the reason label when not complete
    error: str | None = None  # why it is unknown


def holders_complete(text: str, host: str, url: str, url_key: Callable[[str], Any]) -> Holders:
    """The HOLDERS_COMPLETE series of (host, url) in a Prometheus text page.

    A series matches when its host label is host and url_key of its triton_url label is url_key(url) (the caller's
    rule of what makes two URLs the same). Any matching series at 0: not complete, with its reason label; every
    matching series at 1: complete; none: unknown.
    """
    key = url_key(url)
    found = False
    for _name, labels, value in samples(text, HOLDERS_COMPLETE):
        if labels.get('host') != host or url_key(labels.get('triton_url', '')) != key:
            continue
        if value != 1:
            return Holders(False, reason=labels.get('reason') or 'unknown')
        found = True
    if found:
        return Holders(True)
    return Holders(
        None,
        error=f'no {HOLDERS_COMPLETE} series for host {host} and this triton_url (has a report or '
        'cleanup with metrics_dir run on that host?)',
    )
