# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Text from servers and clients made safe to show: in Markdown (report.md, summary.md) and without credentials.

Documentation: plugins/filter/shm_md.yml and shm_redact_url.yml (``ansible-doc -t filter tritonops.shm.NAME``).
Region names, file names, the server's version and its error texts are chosen by whoever registers a region
or runs the server: ``shm_md`` makes them one line of plain Markdown text (no heading, table cell break, link,
emphasis, raw HTML or terminal escape), as report.html escapes them for HTML. Standard library only.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# CommonMark lets a backslash escape any ASCII punctuation; these are the ones that start inline markup (emphasis,
# code, links and images, autolinks and raw HTML, entities, strikethrough, a heading's marks), break a GFM table
# cell, or the escape itself. ``_`` only where it can open or close emphasis (not between two letters or digits),
# so that names such as dead_a stay as they are; ``(``, ``)``, ``!`` and ``:`` need no escape once ``[`` and ``<`` have one.
_MD_SPECIAL = frozenset('\\`*[]<>#|~&')
# bidirectional overrides and isolates reorder what a reader sees (as control characters do in a terminal)
_BIDI = frozenset('\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069')


def _shown(c: str) -> str:
    """A character as the escape a reader can see: \\n, \\x1b, \\u202e."""
    if c in '\n\r\t':
        return {'\n': '\\\\n', '\r': '\\\\r', '\t': '\\\\t'}[c]
    code = ord(c)
    return f'\\\\x{code:02x}' if code < 0x100 else f'\\\\u{code:04x}' if code < 0x10000 else f'\\\\U{code:08x}'


def _md_char(c: str, before: str, after: str) -> str:
    if c in _MD_SPECIAL or c == '_' and not (before.isalnum() and after.isalnum()):
        return '\\' + c
    if c in _BIDI or unicodedata.category(c) in ('Cc', 'Cf', 'Zl', 'Zp', 'Cs'):
        return _shown(c)
    return c


def shm_md(value: Any) -> str:
    """value as one line of Markdown that renders as exactly its text: markup escaped, control characters shown.

    None is ``-``. A backslash-escape is plain text in CommonMark and GFM, so ``a|b`` stays in its table cell,
    ``<img ...>`` is text, ``[x](y)`` is no link, ``# x`` no heading (the value never starts a line: a line
    break is shown as ``\\n``), and ESC (``\\x1b``), CR or a bidi override reaches neither a terminal nor a reader.
    """
    if value is None:
        return '-'
    text = value if isinstance(value, str) else str(value)
    out = ''.join(_md_char(c, text[i - 1] if i else '', text[i + 1 : i + 2]) for i, c in enumerate(text))
    # a leading or trailing space would be trimmed from a table cell: keep what the name really is visible
    return re.sub(r'^ +| +$', lambda m: '\\x20' * len(m.group(0)), out)


def shm_redact_url(value: Any) -> Any:
    """A URL with its ``user:password@`` part shown as ``***@`` (anything else as it is)."""
    from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import redact_url

    return redact_url(value)


class FilterModule:
    def filters(self) -> dict:
        return dict(shm_md=shm_md, shm_redact_url=shm_redact_url)
