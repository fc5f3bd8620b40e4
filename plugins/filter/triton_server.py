# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filters of triton_server: a thin adapter over plugin_utils/deploy/deploy.py, where the code and its docs are.

Each filter's documentation is its sidecar file in this directory (FILTER.yml).
"""

from __future__ import annotations

from ansible_collections.tritonops.shm.plugins.plugin_utils.lazy import lazy

_CODE = 'plugin_utils.deploy.deploy'


class FilterModule:
    def filters(self) -> dict:
        return dict(
            triton_version=lazy(_CODE, 'triton_version'),
            triton_gpus=lazy(_CODE, 'triton_gpus'),
            triton_endpoints=lazy(_CODE, 'triton_endpoints'),
            _triton_args=lazy(_CODE, 'triton_args'),
            _triton_container=lazy(_CODE, 'triton_container'),
            _triton_shm=lazy(_CODE, 'triton_shm'),
            _triton_shm_change=lazy(_CODE, 'triton_shm_change'),
            _triton_retries=lazy(_CODE, 'triton_retries'),
            _triton_log_report=lazy(_CODE, 'triton_log_report'),
            _triton_deployed=lazy(_CODE, 'triton_deployed'),
        )
