# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filters of shm_html_report: a thin adapter over plugin_utils/report/html_report.py, where the code and its docs are.

Each filter's documentation is its sidecar file in this directory (FILTER.yml).
"""

from __future__ import annotations

from ansible_collections.tritonops.shm.plugins.plugin_utils.lazy import lazy

_CODE = 'plugin_utils.report.html_report'


class FilterModule:
    def filters(self) -> dict:
        return {'shm_html_report': lazy(_CODE, 'shm_html_report')}
