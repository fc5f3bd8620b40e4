# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""URLs as text: whether one carries credentials, and how it is shown without them.

Private to the tritonops.shm collection: no stability promise to other code. Standard library only and no import of
the collection: the event source (extensions/eda) loads it by its path, so that the modules, the filters, the
metrics and the event source show a URL the same way. client.py re-exports these names.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote


def has_userinfo(url: str | None) -> bool:
    """True when the URL carries a ``user[:password]@`` part before its host."""
    text = str(url or '')
    if '://' not in text:
        return False
    netloc = text.split('://', 1)[1].split('/', 1)[0].split('?', 1)[0].split('#', 1)[0]
    return '@' in netloc


def redact_url(url: Any) -> Any:
    """The URL with any ``user[:password]@`` part shown as ``***@``; anything else (None, a number) as it is.

    For every place a URL is shown (messages, reports, metrics labels): credentials in a URL are refused
    (check_url), and an output never carries them even when a URL did not pass through a module.
    """
    if not isinstance(url, str) or not has_userinfo(url):
        return url
    scheme, rest = url.split('://', 1)
    end = min((i for i in (rest.find('/'), rest.find('?'), rest.find('#')) if i >= 0), default=len(rest))
    return f'{scheme}://***@{rest[:end].rpartition("@")[2]}{rest[end:]}'


def url_secrets(url: str | None) -> list[str]:
    """The ``user:password`` part of a URL and its password (as written and decoded): strings to mask in outputs."""
    if not has_userinfo(url):
        return []
    userinfo = str(url).split('://', 1)[1].split('/', 1)[0].rpartition('@')[0]
    password = userinfo.partition(':')[2]
    return sorted({s for s in (userinfo, password, unquote(password)) if len(s) >= 3})
