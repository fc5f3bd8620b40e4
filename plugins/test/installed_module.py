# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether Ansible on the controller resolves a module name, the way a task naming it would.

Documentation: plugins/test/installed_module.yml (``ansible-doc -t test tritonops.shm.installed_module``).
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError, AnsiblePluginRemovedError
from ansible.plugins.loader import action_loader, module_loader


def installed_module(name: object) -> bool:
    """True when the module (or an action plugin of that name) resolves, following redirects; False when it does not."""
    if not isinstance(name, str) or not name.strip():
        raise AnsibleFilterError(
            'installed_module: expected a module name such as containers.podman.podman_container, '
            f'got {type(name).__name__} {name!r}'
        )
    name = name.strip()
    try:
        # the order of ansible's own task parser (parsing/mod_args.py): the module, else an action plugin
        return (
            module_loader.find_plugin_with_context(name, ignore_deprecated=True).resolved
            or action_loader.find_plugin_with_context(name, ignore_deprecated=True).resolved
        )
    except AnsiblePluginRemovedError:
        return False


class TestModule:
    def tests(self) -> dict:
        return dict(installed_module=installed_module)
