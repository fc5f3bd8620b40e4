# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Shell-style name patterns, the one test used by the modules and the role's filters.

Private to the tritonops.shm collection: no stability promise to other code.
Standard library only: the filters import it in every Ansible worker process.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable


def matches(name: str, patterns: Iterable[str] | None) -> bool:
    """True when the name matches one of the shell-style patterns (case-sensitive, as Triton names are)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns or ())


def literal(name: str) -> str:
    """A pattern matching exactly this name (its glob characters bracketed)."""
    return re.sub(r'([*?\[])', r'[\1]', name)
