# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Version texts as numbers: the one parser of the collection.

Private to the tritonops.shm collection: no stability promise to other code.
Standard library only: the filters import it in every Ansible worker process.
"""

from __future__ import annotations

import re

# the leading dotted numbers, after an optional 'v': '2.51.0', 'v2.70', '24.10-py3', '2.68.0-custom'
_LEADING = re.compile(r'v?([0-9]+(?:[.][0-9]+)*)')


def version_tuple(text: object) -> tuple[int, ...] | None:
    """The leading dotted numbers of a version text, as a tuple of ints.

    '2.51.0' -> (2, 51, 0); '24.10-py3' -> (24, 10); 'v2.70' -> (2, 70); '2.68.0-custom' -> (2, 68, 0);
    '26' -> (26,). None, '', and a text that does not start with a number ('latest') -> None.
    Numbers (YAML reads 26.05 as one) are read as their text.
    """
    found = _LEADING.match(str(text).strip()) if text is not None else None
    return tuple(int(part) for part in found.group(1).split('.')) if found else None
