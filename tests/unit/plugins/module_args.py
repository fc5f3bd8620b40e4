"""patch_module_args for every supported ansible-core: its own (2.19 and later) or, on 2.16 to 2.18, the same by hand.

A module's main() reads its arguments once per process from ``ansible.module_utils.basic._ANSIBLE_ARGS`` on 2.16-2.18
(as JSON bytes), and through ``ansible.module_utils.testing.patch_module_args`` on 2.19 and later.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from ansible.module_utils import basic

try:
    from ansible.module_utils.testing import patch_module_args as core_patch_module_args  # ansible-core 2.19 and later
except ImportError:  # ansible-core 2.16 to 2.18
    core_patch_module_args = None


@contextlib.contextmanager
def legacy_patch_module_args(args: dict | None = None) -> Iterator[None]:
    """What ansible-core 2.16-2.18 read a module's arguments from, set for the block."""
    saved = basic._ANSIBLE_ARGS
    basic._ANSIBLE_ARGS = json.dumps({'ANSIBLE_MODULE_ARGS': args or {}}).encode('utf-8')
    try:
        yield
    finally:
        basic._ANSIBLE_ARGS = saved


patch_module_args = core_patch_module_args or legacy_patch_module_args
