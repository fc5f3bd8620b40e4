# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The module call's own time limit (the option ``time_limit``): the call stops by itself, whoever waits for it.

Private to the tritonops.shm collection: no stability promise to other code. Standard library only, plus errors.py.

Ansible's task ``timeout`` stops waiting for a module; it does not stop the module, which went on talking to a slow
server after its task had failed (issue 40). With ``time_limit`` the call keeps its own deadline:

- ``start(seconds)`` fixes it (base.make_client, before anything is sent);
- ``bound(timeout, what)`` is the time a request may take: its own timeout, or less when less is left; with nothing
  left, TimeLimitReached and the request is not sent (triton_http, triton_grpc);
- at the deadline, SIGALRM raises TimeLimitReached wherever the call is (a scan, a retry's backoff), so the module fails
  with what it did (base.run_module_main: the work already done); GRACE seconds later, a call still running (a handler
  that caught it, a thread it waits for) writes its failure and exits at once.

Stopping at any point is safe: a cleanup marks its files before it unregisters (quarantine and record), so the next
run converges, as after a SIGKILL (docs/concepts.md).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonOpsError

GRACE = 2.0  # seconds between the deadline and the hard exit of a call that did not stop

_deadline: float | None = None
_limit: float | None = None


class TimeLimitReached(TritonOpsError):
    """The call's time_limit passed: it stops, reporting what it did."""


def _message(what: str) -> str:
    return f'the time limit of this call (time_limit={_limit:g}s) is reached: {what}; stopped, reporting what was done'


def _hard_exit(signum: int, frame: Any) -> None:  # noqa: ARG001  pylint: disable=unused-argument
    os.write(1, json.dumps({'failed': True, 'msg': _message(f'still running {GRACE:g}s after it, exited')}).encode())
    os._exit(1)


def _expired(signum: int, frame: Any) -> None:  # noqa: ARG001  pylint: disable=unused-argument
    signal.signal(signal.SIGALRM, _hard_exit)
    signal.setitimer(signal.ITIMER_REAL, GRACE)
    raise TimeLimitReached(_message('interrupted'))


def start(seconds: float | None) -> None:
    """Fix the call's deadline seconds from now (None or 0: no limit) and arm the alarm that enforces it."""
    global _deadline, _limit  # pylint: disable=global-statement
    stop()
    if not seconds or seconds <= 0:
        return
    _limit = float(seconds)
    _deadline = time.monotonic() + _limit
    signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, _limit)


def stop() -> None:
    """No limit any more: the alarm disarmed (the call's result is being written; tests). Nothing when none was set."""
    global _deadline, _limit  # pylint: disable=global-statement
    if _limit is None:
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    _deadline = _limit = None


def left() -> float | None:
    """Seconds left before the deadline (None: no limit)."""
    return None if _deadline is None else _deadline - time.monotonic()


def bound(timeout: float, what: str) -> float:
    """The seconds a request may take: timeout, or what is left of the call's time if less; TimeLimitReached if none."""
    remaining = left()
    if remaining is None:
        return timeout
    if remaining <= 0.05:
        raise TimeLimitReached(_message(f'{what} not sent'))
    return min(timeout, remaining)
