# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: a run's region calls, as Triton answers them (triton_shm_region's executor, region_ops.py).

It owns what Triton does with an unregister or a register and how a run copes: unregisters sent as one batch
(client.UnregisterBatch), a region refused as in use retried with backoff up to in_use_timeout (a wedged one tried once),
a name the client cannot address or the server no longer knows set aside, an unregister Triton 2.53+ accepts but defers
(the region stays listed while requests are in flight) waited out and then reported pending, and a re-registration
whose new spec is refused given its old spec back. Each answer is recorded in the run's outcome as it comes. It
touches no file: the shm directory's side is file_ops.py.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import Backoff
from ansible_collections.tritonops.shm.plugins.module_utils.rules import vocabulary
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.rules.region_plan import same
from ansible_collections.tritonops.shm.plugins.module_utils.rules.versions import version_tuple
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import unregister_batch


class Unregister(enum.Enum):
    """What _unregister did with one region."""

    UNREGISTERED = 'unregistered'
    GONE = 'gone'  # no longer registered: not this run's work
    KEPT = 'kept'  # still registered (in use past in_use_timeout, or a name the client cannot address)


# Triton 2.53 (NGC 24.12) and later accept an unregister while requests are in flight and keep the
# region listed until they finish; before, an answered unregister removed it at once.
DEFERRED_UNREGISTER_VERSION = (2, 53)


def may_defer(snap: Snapshot) -> bool:
    """Whether this server may keep an unregistered region listed (24.12+, or a version we cannot read)."""
    version = version_tuple(snap.metadata.get('version'))
    return version is None or version >= DEFERRED_UNREGISTER_VERSION


class RegionCalls:
    """The region calls of one run (see the module docstring), made through the run's client for its kind (a
    kinds.RegionKind), each answer recorded in the run's outcome (region_ops.Outcome: unregistered, pending,
    registered, skipped) as it comes. RegionOps holds one per run (read() makes it with the outcome)."""

    def __init__(
        self,
        client: Any,
        kind: Any,
        outcome: Any,
        in_use_timeout: float,
        warn: Callable[[str], object],
        sleep: Callable[[float], object],
        clock: Callable[[], float],
    ) -> None:
        self.client, self.kind, self.outcome, self.in_use_timeout = client, kind, outcome, in_use_timeout
        self.warn, self.sleep, self.clock = warn, sleep, clock

    def unregister(self, kind: str, name: str, refused: TritonError | None = None, once: bool = False) -> Unregister:
        """Unregister one region; KEPT means it stays registered, with the reason recorded in skipped.

        refused: the server's refusal of an unregister already sent (by a batch), handled as the first answer.
        once: a wedged region (wedged.py) is tried once a run, its refusal not waited out.
        """
        backoff = Backoff(timeout=0 if once else self.in_use_timeout, sleep=self.sleep, clock=self.clock)
        while True:
            exc = refused
            refused = None
            if exc is None:
                try:
                    self.client.unregister(kind, name)
                    return Unregister.UNREGISTERED
                except TritonError as answer:
                    exc = answer
            if exc.unaddressable:
                self.outcome.skipped.append({'name': name, 'reason': exc.msg})
                return Unregister.KEPT
            if exc.not_found:
                return Unregister.GONE
            if not exc.in_use:
                raise exc
            if not backoff.wait():
                reason = (
                    f'wedged: still refused as in use, tried once this run (a restart frees it): {exc.server_error}'
                    if once
                    else f'still in use after {self.in_use_timeout}s (requests in flight): {exc.server_error}'
                )
                self.outcome.skipped.append({'name': name, 'reason': reason})
                return Unregister.KEPT

    def wait_gone(self, kind: str, specs: dict, once: bool = False) -> set:
        """Poll the status until no region of specs {name: spec} is listed, within in_use_timeout; return those still listed.

        Triton 24.12 and later accept an unregister while requests are in flight and keep the region
        listed until they finish: its file must not be unlinked, nor the name registered again, before then.
        A name listed with another spec is a new registration (a client registered the name again), not ours.
        """
        if not specs:
            return set()
        backoff = Backoff(timeout=0 if once else self.in_use_timeout, sleep=self.sleep, clock=self.clock)
        while True:
            listed = {
                r.get('name')
                for r in self.client.status(kind)
                if r.get('name') in specs and same(r, specs[r.get('name')])
            }
            if not listed or not backoff.wait():
                return listed

    def register_all(
        self, kind: str, todo: list, register: Callable[[str], object], restore: Callable[[dict], object]
    ) -> None:
        """Register each (name, current) of todo; a different current spec is unregistered first.

        When the server refuses the new spec after the old one was unregistered, the old spec is
        registered again so that a refused change leaves the region as it was.
        """
        for name, cur in todo:
            if cur is not None:
                if self.unregister(kind, name) is Unregister.KEPT:
                    raise TritonError(
                        f"re-register {kind} region '{name}': it stays in use: Triton refused to unregister "
                        f'its current registration for {self.in_use_timeout}s because requests are in '
                        'flight through it, so nothing changed and it keeps its current spec; run again '
                        'when its clients are idle, or give in_use_timeout more seconds'
                    )
                if self.wait_gone(kind, {name: cur}):
                    self.outcome.pending.append(name)
                    raise TritonError(
                        f"re-register {kind} region '{name}': it was unregistered but is still listed after "
                        f'{self.in_use_timeout}s (requests in flight: Triton 24.12 and later remove it when '
                        'they finish); not registered again, run again later'
                    )
            try:
                register(name)
            except TritonError as exc:
                if cur is None:
                    raise
                try:
                    restore(cur)
                    why = 'the previous spec was registered again, the region is unchanged'
                except TritonError as again:
                    self.outcome.unregistered.append(name)
                    why = f'restoring the previous spec failed too, the region is now unregistered: {again.msg}'
                raise type(exc)(
                    f'{exc.msg}; {why}',
                    url=exc.url,
                    status=exc.status,
                    server_error=exc.server_error,
                    transport=exc.transport,
                ) from exc
            if cur is not None:
                self.outcome.unregistered.append(name)
            self.outcome.registered.append(name)

    def unregister_selected(self, kind: str, selected: list, still_registered: set) -> None:
        """Unregister each selected region; add the names that stay registered (skipped with the reason) to still_registered.

        The unregisters go out as one batch (the transport may send several at once: client.UnregisterBatch);
        a region refused as in use is retried with backoff as its answer comes, while the batch goes on. On a
        failure no further unregister is sent, the answers of those already sent are recorded, then it is raised.
        """
        batch = unregister_batch(self.client, kind, [rec['name'] for rec in selected])
        tried_once = {rec['name'] for rec in selected if rec.get('state') == vocabulary.WEDGED}
        first = len(self.outcome.unregistered)
        failure = None
        try:
            for name, refused in batch:
                if failure is not None:
                    if refused is None:  # sent before the failure: done, and reported as done
                        self.outcome.unregistered.append(name)
                    continue
                try:
                    outcome = (
                        self.unregister(kind, name, refused, once=name in tried_once)
                        if refused is not None
                        else Unregister.UNREGISTERED
                    )
                except TritonError as exc:
                    failure = exc
                    batch.stop()
                    continue
                if outcome is Unregister.UNREGISTERED:
                    self.outcome.unregistered.append(name)
                elif outcome is Unregister.KEPT:
                    still_registered.add(name)
        finally:
            # in the order selected, whatever order the answers came in
            order = {rec['name']: i for i, rec in enumerate(selected)}
            self.outcome.unregistered[first:] = sorted(self.outcome.unregistered[first:], key=order.__getitem__)
        if failure is not None:
            raise failure

    def deferred(self, selected: list, still_registered: set) -> None:
        """Regions unregistered but still listed (Triton 24.12+ defers while requests are in flight) keep their files.

        Waits up to in_use_timeout for them to leave the status; those still listed then move from
        unregistered to pending (the server accepted the unregister and drops the region when its
        requests finish), with the reason in skipped and a warning.
        """
        done = set(
            self.outcome.unregistered
        )  # a set: one lookup per region, not a scan of the list (3,000 regions: ~1 s)
        specs = {r['name']: r for r in selected if r['name'] in done and r['name'] not in still_registered}
        # a wedged region's deferral is looked at once, never waited out (wedged.py)
        once = all(r.get('state') == vocabulary.WEDGED for r in specs.values())
        listed = self.wait_gone(self.kind.name, specs, once=once)
        for name in sorted(listed):
            still_registered.add(name)
            self.outcome.pending.append(name)
            self.outcome.skipped.append(
                {
                    'name': name,
                    'reason': f'pending: unregistered, but still listed by the server after '
                    f'{self.in_use_timeout}s (requests in flight: it goes when '
                    'they finish); its file is kept',
                }
            )
            self.warn(
                f"region '{name}' is pending: still listed {self.in_use_timeout}s after its unregister (Triton "
                '24.12 and later drop it when its requests in flight finish); its file is kept: a run while it is '
                'still listed unregisters it again and removes the file once it is gone'
            )
        if listed:
            self.outcome.unregistered[:] = [n for n in self.outcome.unregistered if n not in listed]
