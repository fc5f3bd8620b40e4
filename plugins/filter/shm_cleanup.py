# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filters of shm_cleanup: a thin adapter over plugin_utils/report/cleanup_record.py, where the code and its docs are.

Each filter's documentation is its sidecar file in this directory (FILTER.yml).
"""

from __future__ import annotations

from ansible_collections.tritonops.shm.plugins.plugin_utils.lazy import lazy

_CODE = 'plugin_utils.report.cleanup_record'


class FilterModule:
    def filters(self) -> dict:
        return dict(
            shm_list=lazy(_CODE, 'shm_list'),
            _shm_cleanup=lazy(_CODE, 'shm_cleanup'),
            _shm_cleanup_exclude=lazy(_CODE, 'shm_cleanup_exclude'),
            _node_agent_failed=lazy(_CODE, 'node_agent_failed'),
        )
