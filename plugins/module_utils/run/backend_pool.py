# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What triton_backend_pool does: reload a model whose python backend pool grew past a threshold.

Private to the tritonops.shm collection: no stability promise to other code.

A python-based model instance's pool (triton_<backend>_backend_shm_region_<uuid>) grows and never
shrinks; reloading the model gives its new instances new pools of shm-default-byte-size and the old
ones go with the old instances. Two halves, as everywhere: ``plan()`` is pure (the pools of
inventory.pool_records, the shm filesystem's size, the thresholds) and decides which models to
reload; ``reload_model()`` and ``wait_gone()`` do it. ``PoolReload`` is the module's base.Operation: read
(pools, index, mode, the configurations of the models over the limit), plan, preview or execute, result.

Triton 2.51 treats a load of a model whose files and configuration did not change as done (it answers
at once and keeps the instances). So a reload sends the model's own configuration (as the server
completed it) with one parameter, RELOAD_PARAMETER, set to a new value: a configuration change that
is not only in instance_group makes Triton load new instances beside the old ones and switch over
without refusing requests (docs/backend-pools.md, docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ModelControlRefused,
    ParameterError,
    TritonError,
)
from ansible_collections.tritonops.shm.plugins.module_utils.host import snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import read_bytes
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import Operation

RELOAD_PARAMETER = 'tritonops_shm_reload'
EXPLICIT = 'explicit'
# what --model-control-mode is when the command line does not say (tritonserver's default)
DEFAULT_MODEL_CONTROL = 'none'

RELOAD = 'reload'
KEEP = 'keep'
SKIP = 'skip'


class Threshold(NamedTuple):
    """When one model's pools (all its instances together) are too big: bytes, and/or a percent of the shm filesystem."""

    max_bytes: int | None = None
    max_percent: float | None = None

    def limit(self, fs_total: int | None) -> int | None:
        """The smallest of the limits that apply, in bytes (None when none does: percent without a filesystem size)."""
        limits = []
        if self.max_bytes is not None:
            limits.append(int(self.max_bytes))
        if self.max_percent is not None and fs_total:
            limits.append(int(fs_total * self.max_percent / 100))
        return min(limits) if limits else None


class ModelPlan(NamedTuple):
    """What to do with one model: action reload, keep or skip, with its pools (names), bytes, limit and why."""

    model: str
    action: str
    bytes: int
    limit: int | None
    instances: list
    pools: list
    reason: str

    def as_dict(self) -> dict:
        return self._asdict()


def plan(
    pools: Iterable[dict],
    fs_total: int | None,
    threshold: Threshold,
    models: Sequence[str] = (),
    index: Sequence[dict] | None = None,
    refusals: Mapping[str, str] | None = None,
) -> list[ModelPlan]:
    """One ModelPlan per model that has live pools (by model name), pure.

    pools: inventory.pool_records() (backend_pools). Only live pools with a model count: a leftover has no
    model to reload (the cleanup removes it), a pool of unknown model (an unattributed one) cannot be reloaded.
    models: only these (empty: every model). index: the repository index; a model that is not READY there is skipped.
    refusals: {model: why a reload would cost its clients (stateful_refusal)}: such a model over the limit is skipped.
    """
    by_model: dict[str, list[dict]] = {}
    for p in pools:
        if p.get('state') == 'live' and p.get('model'):
            by_model.setdefault(p['model'], []).append(p)
    ready = None if index is None else {m['name'] for m in index if m.get('state') == 'READY'}
    limit = threshold.limit(fs_total)
    out = []
    for model in sorted(by_model):
        if models and model not in models:
            continue
        mine = by_model[model]
        total = sum(int(p.get('bytes') or 0) for p in mine)
        instances = sorted({p['instance'] for p in mine if p.get('instance')})
        names = sorted(p['name'] for p in mine)
        if limit is None:
            action, reason = SKIP, 'no limit applies (max_percent without the shm filesystem size)'
        elif total <= limit:
            action, reason = KEEP, f'{total} bytes in {len(mine)} pool(s), not over the limit of {limit} bytes'
        elif ready is not None and model not in ready:
            action, reason = (
                SKIP,
                f'{total} bytes, over the limit of {limit} bytes, but the model is not READY in the repository index',
            )
        elif refusals and model in refusals:
            action, reason = SKIP, f'{total} bytes, over the limit of {limit} bytes, not reloaded: {refusals[model]}'

        else:
            action, reason = RELOAD, f'{total} bytes in {len(mine)} pool(s), over the limit of {limit} bytes'
        out.append(ModelPlan(model, action, total, limit, instances, names, reason))
    return out


# What a reload cost on Triton 2.51, measured by tests/bench/bench_reload_shapes.py (docs/backend-pools.md): a plain
# python model, an ensemble's python step, a BLS caller and the model a BLS call reaches lost no request; a stateful
# model lost every sequence in flight.
SEQUENCE_COST = (
    'a reload drops every sequence in flight: the new instances do not have its state, and Triton refuses its next '
    'request ("must specify the START flag on the first request of the sequence"; measured on Triton 2.51: one failed '
    'request per sequence in flight, docs/backend-pools.md)'
)
DECOUPLED_COST = (
    'a reload of a decoupled model ends on the old instances the response streams in flight, and a client of a '
    'decoupled model often keeps per-stream state (docs/backend-pools.md)'
)


def stateful_refusal(config: Mapping[str, Any]) -> str | None:
    """Why reloading a model of this configuration costs its clients (None when it measured at no cost), from the
    configuration as the server completed it (GET /v2/models/MODEL/config)."""
    if config.get('sequence_batching'):
        return f'the model is stateful (sequence_batching): {SEQUENCE_COST}; allow_stateful: true reloads it anyway'
    if (config.get('model_transaction_policy') or {}).get('decoupled'):
        return f'the model is decoupled: {DECOUPLED_COST}; allow_stateful: true reloads it anyway'
    return None


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def server_argv(pid: int | None, proc: str = '/proc') -> list[str] | None:
    """The server process's command line, or None when it is not known or cannot be read."""
    if pid is None:
        return None
    try:
        data = read_bytes(f'{proc}/{pid}/cmdline')
    except OSError:
        return None
    return [a.decode('utf-8', 'replace') for a in data.rstrip(b'\0').split(b'\0')] if data else None


def model_control(argv: Sequence[str] | None) -> str | None:
    """The server's --model-control-mode from its command line (the last one given wins), None when argv is None."""
    if argv is None:
        return None
    mode = DEFAULT_MODEL_CONTROL
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith('--model-control-mode='):
            mode = arg.split('=', 1)[1]
        elif arg == '--model-control-mode' and i + 1 < len(args):
            mode = args[i + 1]
    return mode.strip().lower()


def refusal(mode: str | None) -> str | None:
    """Why a reload cannot be asked of a server in this model control mode; None when it can (or cannot be told)."""
    if mode is None or mode == EXPLICIT:
        return None
    return (
        f"the server runs with --model-control-mode={mode}: Triton refuses the repository API's load there "
        '("explicit model load / unload is not allowed"), so no model can be reloaded online; start it with '
        '--model-control-mode=explicit (and --load-model for each model), or restart it to reclaim its pools'
    )


def reload_config(config: dict, stamp: str) -> dict:
    """The model's own configuration with RELOAD_PARAMETER set to stamp: a change Triton reloads for."""
    out = dict(config)
    params = dict(out.get('parameters') or {})
    params[RELOAD_PARAMETER] = {'string_value': stamp}
    out['parameters'] = params
    return out


def reload_model(client: Any, model: str, timeout: float, stamp: str | None = None) -> None:
    """Reload model through the repository API: its own configuration with a new RELOAD_PARAMETER (see the module doc)."""
    config = client.model_config(model)
    client.load_model(model, config=reload_config(config, stamp or repr(time.time())), timeout=timeout)


def wait_gone(shm: Any, names: Iterable[str], wait: float, poll: float = 0.05) -> list[str]:
    """Wait up to wait seconds until no file of names is left in the shm directory shm (a shm_fs.PinnedDir: looked up
    by its descriptor, never by a path through the server's root); the names still there."""
    left = list(names)
    deadline = time.monotonic() + wait
    while True:
        left = [n for n in left if _exists(shm.fd, n)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll)


# -- the module's run (base.Operation): read -> plan -> preview or execute -> result ----------------------------------


class Reading(NamedTuple):
    """What triton_backend_pool decides from: one read of the server, its repository index, its model control mode, and
    why reloading a model over the limit would cost its clients (the configurations of those models only)."""

    snap: Any
    pools: list
    index: list
    mode: str | None
    refusals: dict


@dataclasses.dataclass
class Outcome:
    """What one triton_backend_pool call decided and did: the models' plans, then each reload as it is done."""

    check_mode: bool
    plans: list
    mode: str | None
    fs: dict | None
    scan: dict
    reloaded: list = dataclasses.field(default_factory=list)

    def result(self, finished: bool = True) -> dict:
        """The module's result; after a failure part-way, the reloads done so far (and whether any changed a thing)."""
        if not finished:
            return {'reloaded': self.reloaded, 'changed': any(d['after_bytes'] is not None for d in self.reloaded)}
        return {
            'changed': any(p.action == RELOAD for p in self.plans),
            'models': [p.as_dict() for p in self.plans],
            'reloaded': self.reloaded,
            'model_control': self.mode,
            'shm_fs': self.fs,
            **self.scan,
        }


class PoolReload(Operation):
    """triton_backend_pool: read the pools, plan which models to reload (plan()), reload them one by one."""

    def __init__(self, client: Any, params: dict, warn: Callable[[str], object], check_mode: bool = False) -> None:
        self.client, self.params, self.warn, self.check_mode = client, params, warn, check_mode
        self.threshold = Threshold(params['max_bytes'], params['max_percent'])
        self.outcome: Outcome | None = None
        self.snap: Any = None
        self.shm: Any = None  # the shm directory (shm_fs.PinnedDir) the first read pinned: wait_gone looks in it

    def check(self) -> None:
        for opt in ('max_bytes', 'max_percent'):
            if self.params[opt] is not None and self.params[opt] < 0:
                raise ParameterError(f'{opt} must not be negative, got {self.params[opt]}')

    def _located(self, shm: Any) -> None:
        """read_server's on_located: keep the shm directory the first read pinned (the snapshot holds no descriptor)."""
        if self.shm is None:
            self.shm = shm

    def _pools(self) -> tuple:
        """(snapshot, backend_pools) of one read of the server."""
        p = self.params
        criteria = classification.Criteria.of((), classification.DEFAULT_MIN_AGE, p['backend_patterns'])
        snap = snapshot.read_server(
            self.client,
            server_pid=p['server_pid'],
            shm_dir=p['shm_dir'],
            require_readable_dir=True,
            kinds=('system',),
            backend_patterns=criteria.backend_patterns,
            clients_share_pid_namespace=p['clients_share_pid_namespace'],
            on_located=self._located,
        )
        return snap, classification.pool_records(snap, classification.classify(snap, criteria).files)

    def read(self) -> Reading:
        snap, pools = self._pools()
        for warning in snap.warnings:
            self.warn(warning)
        index = self.client.repository_index()
        refusals = {}
        if not self.params['allow_stateful']:  # the configurations of the models a reload is planned for
            total = (snap.fs or {}).get('total_bytes')
            for p in plan(pools, total, self.threshold, self.params['models'], index):
                if p.action == RELOAD:
                    why = stateful_refusal(self.client.model_config(p.model))
                    if why is not None:
                        refusals[p.model] = why
        return Reading(snap, pools, index, model_control(server_argv(snap.pid)), refusals)

    def plan(self, reading: Reading) -> Outcome:
        snap = reading.snap
        fs = dict(snap.fs) if snap.fs else None
        plans = plan(
            reading.pools, (fs or {}).get('total_bytes'), self.threshold, self.params['models'], reading.index,
            reading.refusals,
        )  # fmt: skip
        for model, why in sorted(reading.refusals.items()):
            self.warn(f"model '{model}' is over the limit and is not reloaded: {why}")
        scan = {
            'holders_complete': snap.holders_complete,
            'holders_incomplete_reason': snap.holders_incomplete_reason,
            'pid_namespace': snap.pid_namespace,
        }
        self.snap = snap
        self.outcome = Outcome(self.check_mode, plans, reading.mode, fs, scan)
        todo = [p for p in plans if p.action == RELOAD]
        why_not = refusal(reading.mode) if todo else None
        if why_not:
            raise ModelControlRefused(
                f'{", ".join(p.model for p in todo)} over the limit, not reloaded: {why_not}', url=self.client.base
            )
        if todo and reading.mode is None:
            self.warn(
                'the model control mode of the server could not be read from its command line: the load answers for it'
            )
        return self.outcome

    @staticmethod
    def _entry(p: ModelPlan) -> dict:
        return {'model': p.model, 'before_bytes': p.bytes, 'after_bytes': None, 'old_pools': p.pools, 'new_pools': [],
                'old_gone': None, 'seconds': None}  # fmt: skip

    def preview(self, plan: Outcome) -> Outcome:
        plan.reloaded.extend(self._entry(p) for p in plan.plans if p.action == RELOAD)
        return plan

    def execute(self, plan: Outcome) -> Outcome:
        wait = self.params['wait']
        for p in plan.plans:
            if p.action != RELOAD:
                continue
            entry = self._entry(p)
            start = time.monotonic()
            reload_model(self.client, p.model, self.params['load_timeout'])
            left = wait_gone(self.shm, p.pools, wait)
            entry.update(seconds=round(time.monotonic() - start, 3), old_gone=not left)
            _snap, after = self._pools()
            mine = [q for q in after if q.get('model') == p.model and q['name'] not in p.pools]
            entry['new_pools'] = sorted(q['name'] for q in mine)
            entry['after_bytes'] = sum(int(q.get('bytes') or 0) for q in mine)
            plan.reloaded.append(entry)
            if left:
                raise TritonError(
                    f"model '{p.model}' was reloaded, but its old pool file(s) {', '.join(left)} are still there "
                    f'after {wait}s (a long request on an old instance keeps it): rerun later',
                    url=self.client.base,
                )
        return plan

    def result(self, outcome: Outcome, finished: bool = True) -> dict:
        return outcome.result(finished)
