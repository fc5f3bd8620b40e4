# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the run protocol, the one way a module call runs (read -> plan -> execute -> result).

The plan is pure, check mode is one branch (``preview`` instead of ``execute``), and the result is formatted from an
explicit outcome object, also after a failure part-way (the work already done). base.run_operation() runs an
Operation as a module's call; run_steps() runs it anywhere (tests, benches).

It imports no transport, no metrics and no shm directory code: an executor (region_ops.py, backend_pool.py, sweep.py,
servers.py) takes its client from its caller. test_operation.py holds it.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Mapping
from typing import Any, Callable


class Operation(abc.ABC):
    """One module call in four steps; run_operation() (and run_steps(), for tests and benches) runs them in order:

        check()                          the parameters the argument spec cannot check (ParameterError)
        with hold(read()) as reading:    everything the call decides from (all the I/O before a change); hold()
                                         keeps what read() took (the per-server lock) until the result is written
            plan(reading)                what to do: pure, from the reading and the parameters
            preview(plan) | execute(plan)  check mode: the plan as an outcome, nothing touched; else carry it out
            result(outcome)              the module's result, formatted from the outcome (no I/O)

    ``outcome`` is the outcome recorded so far: after a failure part-way, result(outcome, finished=False) reports the
    work already done. An operation that changes nothing (an info module) keeps the defaults: its plan is its
    reading, and preview and execute return the plan.
    """

    outcome: Any = None

    def check(self) -> None:
        """ParameterError for what the argument spec cannot say; nothing is sent before it."""

    @abc.abstractmethod
    def read(self) -> Any:
        """Everything the call decides from."""

    def hold(self, reading: Any) -> contextlib.AbstractContextManager:
        """What read() took, held until the block ends (default: nothing); yields reading."""
        return contextlib.nullcontext(reading)

    def plan(self, reading: Any) -> Any:
        """What to do, from the reading and the parameters; pure."""
        return reading

    def preview(self, plan: Any) -> Any:
        """Check mode: the plan as the call's outcome, touching nothing."""
        self.outcome = plan
        return plan

    def execute(self, plan: Any) -> Any:
        """Carry the plan out, recording each step in ``outcome`` as it is done; the outcome."""
        self.outcome = plan
        return plan

    @abc.abstractmethod
    def result(self, outcome: Any, finished: bool = True) -> dict:
        """The module's result from outcome; finished=False after a failure (what was done so far)."""


def run_steps(op: Operation, check_mode: bool, finish: Callable[[dict], Mapping] | None = None) -> dict:
    """check, read, plan, preview or execute, result: the one order of every module; finish(result) adds keys while
    what read() took is still held (the metrics textfiles)."""
    op.check()
    with op.hold(op.read()) as reading:
        plan = op.plan(reading)
        outcome = op.preview(plan) if check_mode else op.execute(plan)
        result = op.result(outcome)
        if finish is not None:
            result.update(finish(result))
        return result
