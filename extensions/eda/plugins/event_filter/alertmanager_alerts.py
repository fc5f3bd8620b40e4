# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""ansible-rulebook event filter: keep only firing, unexpired Alertmanager alerts, and only what a rule may trust."""

from __future__ import annotations

DOCUMENTATION = r"""
---
short_description: Keep only firing, unexpired Alertmanager alerts, reduced to what a rule may trust
description:
  - For one alert of an Alertmanager webhook payload (after C(eda.builtin.event_splitter) on
    C(payload.alerts)).
  - Drops the alert unless its C(status) is C(firing), and drops it when its C(endsAt) is a time more than
    O(grace) seconds in the past (an expired alert, or one replayed long after). The zero time
    C(0001-01-01T00:00:00Z) means no end. An C(endsAt) that cannot be read drops the alert.
  - Keeps only C(status), C(startsAt), C(endsAt), C(fingerprint), C(labels.alertname), C(labels.host) and the
    event's C(meta). Everything else the sender wrote (annotations, other labels, URLs) is dropped, so it
    never reaches a playbook as C(ansible_eda.event). A label that is not a string is dropped.
options:
  grace:
    description: Seconds an C(endsAt) may lie in the past (clock skew between Alertmanager and this host).
    type: int
    default: 60
"""

EXAMPLES = r"""
- eda.builtin.webhook:
    port: 5000
    token: "{{ self_heal_webhook_token }}"
  filters:
    - eda.builtin.event_splitter:
        splitter_key: payload.alerts
    - tritonops.shm.alertmanager_alerts:
    - eda.builtin.insert_hosts_to_meta:
        host_path: labels.host
"""

import datetime
import logging
import re
from typing import Any

LOGGER = logging.getLogger(__name__)
TRUSTED_LABELS = ('alertname', 'host')
_TIME = re.compile(r'^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$')


def parse_time(text: Any) -> datetime.datetime | None:
    """An RFC 3339 time (Go writes up to nanoseconds) as an aware datetime; None for the zero time; ValueError otherwise."""
    found = _TIME.match(text) if isinstance(text, str) else None
    if not found:
        raise ValueError(f'not an RFC 3339 time: {str(text)[:40]!r}')
    year, month, day, hour, minute, second, fraction, zone = found.groups()
    if int(year) <= 1:
        return None
    offset = (
        datetime.timedelta(0)
        if zone == 'Z'
        else ((1 if zone[0] == '+' else -1) * datetime.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    )
    micro = int((fraction or '0')[:6].ljust(6, '0'))
    return datetime.datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=datetime.timezone(offset)
    )


def main(event: dict, grace: int = 60, now: datetime.datetime | None = None) -> list:
    """[the reduced alert] when it is firing and not expired, else []."""
    if not isinstance(event, dict) or event.get('status') != 'firing':
        return []
    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        ends = parse_time(event.get('endsAt', '0001-01-01T00:00:00Z'))
    except ValueError as exc:
        LOGGER.warning('alert dropped: its endsAt cannot be read (%s)', exc)
        return []
    labels = event.get('labels') if isinstance(event.get('labels'), dict) else {}
    if ends is not None and (now - ends).total_seconds() > grace:
        LOGGER.info('alert %r dropped: it expired at %s', str(labels.get('alertname'))[:80], ends.isoformat())
        return []
    reduced = {
        key: event[key] for key in ('status', 'startsAt', 'endsAt', 'fingerprint') if isinstance(event.get(key), str)
    }
    reduced['labels'] = {key: labels[key] for key in TRUSTED_LABELS if isinstance(labels.get(key), str)}
    if isinstance(event.get('meta'), dict):
        reduced['meta'] = event['meta']
    return [reduced]
