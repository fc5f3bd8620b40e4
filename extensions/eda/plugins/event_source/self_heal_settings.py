# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""ansible-rulebook event source that only checks the self-healing rulebooks' variables, at start."""

from __future__ import annotations

DOCUMENTATION = r"""
---
short_description: Check the variables of a self-healing rulebook when it starts
description:
  - An ansible-rulebook event source that puts no event. It checks the rulebook's variables when the
    rulebook starts and fails with a clear message when one is missing or wrong, so that the rulebook
    ends (exit status 1, C(Source error ... ConfigError ...)) instead of running and matching nothing.
  - ansible-rulebook renders an undefined variable in a source argument as an undefined value without a
    word, and a string where a list is expected makes every C(in) test false; without this check, a
    missing webhook token or C(self_heal_hosts=h1) start a rulebook that silently refuses or ignores
    every alert.
  - Once the variables are good it waits, doing nothing, until the rulebook stops.
  - Secret values are never shown; the messages name the variable.
options:
  hosts:
    description:
      - The inventory hosts that may be cleaned (C(self_heal_hosts)). Must be a non-empty list of inventory
        host names; not a string, not C(all), not a pattern.
    type: list
    elements: str
    required: true
  token:
    description:
      - The bearer token the webhook requires (C(self_heal_webhook_token)); checked when O(token_required).
        At least 16 characters.
    type: str
  token_required:
    description: Whether O(token) must be set (the Alertmanager rulebook's webhook).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Heal Triton shared memory on Alertmanager alerts
  hosts: all
  sources:
    - name: settings
      tritonops.shm.self_heal_settings:
        hosts: "{{ self_heal_hosts | default(none) }}"
        token: "{{ self_heal_webhook_token | default(none) }}"
        token_required: true
"""

import asyncio
import re

HOST_RE = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.\-]*$')
MIN_TOKEN = 16


class ConfigError(ValueError):
    """A rulebook variable is missing or wrong: the rulebook must not run."""


def check(args: dict) -> None:
    """ConfigError naming the first variable that is missing or wrong (never showing a secret's value)."""
    hosts = args.get('hosts')
    if hosts is None:
        raise ConfigError('self_heal_hosts is not set: give the list of inventory hosts that may be cleaned')
    if isinstance(hosts, str):
        raise ConfigError(
            f'self_heal_hosts must be a list of inventory host names, got the string {hosts!r}: write '
            f'[{hosts}] (a string would match no alert at all)'
        )
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError(f'self_heal_hosts must be a non-empty list of inventory host names, got {hosts!r}')
    for host in hosts:
        if not isinstance(host, str) or not HOST_RE.match(host) or host == 'all':
            raise ConfigError(
                f'self_heal_hosts: each item must be one inventory host name (not all, not a pattern or '
                f'a group), got {host!r}'
            )
    if args.get('token_required'):
        token = args.get('token')
        if token is None or token == '':
            raise ConfigError(
                'self_heal_webhook_token is not set: the webhook would refuse every alert; give the bearer '
                'token Alertmanager sends (http_config.authorization.credentials)'
            )
        if not isinstance(token, str) or len(token) < MIN_TOKEN or token != token.strip():
            raise ConfigError(
                f'self_heal_webhook_token must be a string of at least {MIN_TOKEN} characters without '
                f'surrounding blanks (its value is not shown)'
            )


async def main(queue: asyncio.Queue, args: dict) -> None:
    """Check the variables, then wait until the rulebook stops (this source puts no event)."""
    check(args)
    await asyncio.Event().wait()


if __name__ == '__main__':
    # python self_heal_settings.py HOST...: check a host list (no token)
    import sys

    try:
        check({'hosts': sys.argv[1:]})
    except ConfigError as exc:
        sys.exit(str(exc))
    print('ok')
