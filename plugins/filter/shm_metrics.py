# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node_exporter textfile metrics the modules' metrics_dir option writes, as filters, from module_utils/outputs/metrics.py.

Each filter imports its code when called (plugin_utils/lazy.py says why).

Documentation: plugins/filter/shm_metrics.yml and shm_metrics_file.yml (``ansible-doc -t filter tritonops.shm.NAME``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


def shm_metrics(value: Mapping | None, kind: str, host: str, url: str | None, previous: str | None = None) -> str:
    """The textfile text: kind report (a triton_shm_info result) or cleanup (the role's shm_cleanup_result)."""
    from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics

    if kind == metrics.REPORT:
        return metrics.report_text(value, host, url)
    if kind == metrics.CLEANUP:
        if not isinstance(value, Mapping):
            raise AnsibleFilterError(
                f'shm_metrics: cleanup needs the shm_cleanup_result dict, got {type(value).__name__}'
            )
        return metrics.cleanup_text(value, host, url, previous=previous or None)
    raise AnsibleFilterError(f"shm_metrics: kind must be 'report' or 'cleanup', got {kind!r}")


def shm_metrics_file(kind: str, host: str, url: Any) -> str:
    """The file name of one (inventory host, URL) for kind (report or cleanup)."""
    from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics

    try:
        return metrics.file_name(kind, host, url)
    except ValueError as exc:
        raise AnsibleFilterError(f'shm_metrics_file: {exc}', orig_exc=exc) from exc


def shm_dir_refusal(directory: Any) -> str:
    """Why the playbooks refuse to write their report files into directory ('' when they may): outputs.report_dir_refusal."""
    from ansible_collections.tritonops.shm.plugins.module_utils.outputs import outputs

    if not isinstance(directory, str) or not directory:
        raise AnsibleFilterError(f'shm_dir_refusal: the directory must be a non-empty string, got {directory!r}')
    return outputs.report_dir_refusal(directory) or ''


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {'shm_metrics': shm_metrics, 'shm_metrics_file': shm_metrics_file, 'shm_dir_refusal': shm_dir_refusal}
