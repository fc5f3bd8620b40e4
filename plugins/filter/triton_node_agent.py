# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filters of triton_node_agent: a thin adapter over plugin_utils/deploy/node_agent.py, where the code and its docs are.

Each filter's documentation is its sidecar file in this directory (FILTER.yml).
"""

from __future__ import annotations

from ansible_collections.tritonops.shm.plugins.plugin_utils.lazy import lazy

_CODE = 'plugin_utils.deploy.node_agent'


class FilterModule:
    """tritonops.shm filters."""

    def filters(self) -> dict:
        return {
            'triton_node_agent': lazy(_CODE, 'triton_node_agent'),
            '_node_agent_deadline': lazy(_CODE, 'node_agent_deadline'),
            '_node_agent_time_left': lazy(_CODE, 'node_agent_time_left'),
            '_node_agent_queue': lazy(_CODE, 'node_agent_queue'),
            '_node_agent_state': lazy(_CODE, 'node_agent_state'),
        }
