# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A filter's code, imported when the filter is first called.

ansible-core finds a collection's filter by loading every filter file of the collection, in every worker process,
for every task that names one of them (its Jinja2Loader). A filter file that imported its code at the top made each
such task pay for all of the collection's filter code: about 150 ms of CPU per task and host, measured on the
cleanup role (issue 41, goal 7). The filter files map each name to ``lazy(module, name)``, so a task pays for the
code of the filters it calls and nothing more. ``test_filter_imports`` follows these names as imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

PREFIX = 'ansible_collections.tritonops.shm.plugins.'


def lazy(module: str, name: str) -> Callable[..., Any]:
    """The function ``name`` of the collection's ``module`` (say ``plugin_utils.report.fleet_table``), imported on
    its first call; ``.target()`` returns the function itself."""

    def target() -> Callable[..., Any]:
        return getattr(importlib.import_module(PREFIX + module), name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return target()(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f'{name} of {module}, imported when first called.'
    call.target = target  # type: ignore[attr-defined]
    return call
