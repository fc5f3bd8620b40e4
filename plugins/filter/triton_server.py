# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filters of triton_server: a thin adapter over plugin_utils/deploy/deploy.py, where the code and its docs are.

Each filter's documentation is its sidecar file in this directory (FILTER.yml).
"""

from __future__ import annotations

from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.deploy import (
    triton_args,
    triton_container,
    triton_deployed,
    triton_endpoints,
    triton_gpus,
    triton_log_report,
    triton_retries,
    triton_shm,
    triton_shm_change,
    triton_version,
)


class FilterModule:
    def filters(self) -> dict:
        return dict(
            triton_version=triton_version,
            triton_gpus=triton_gpus,
            triton_endpoints=triton_endpoints,
            _triton_args=triton_args,
            _triton_container=triton_container,
            _triton_shm=triton_shm,
            _triton_shm_change=triton_shm_change,
            _triton_retries=triton_retries,
            _triton_log_report=triton_log_report,
            _triton_deployed=triton_deployed,
        )
