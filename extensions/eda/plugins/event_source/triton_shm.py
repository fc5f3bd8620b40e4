# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""ansible-rulebook event source: Triton shared-memory registrations, polled.

This file is the rulebook's side: its documentation, the schedule (every server once per interval, at its own place in
it), the open-file budget and the queue. What it calls is the collection's, as a module calls module_utils (issue 41):
module_utils/run/poll.py parses the arguments into servers and turns one server's answer into its event, over
module_utils/wire/triton_aio.py, the asyncio twin of the modules' transports (their request, strict reader, TLS,
error classification and region check). ansible-rulebook runs this file by its path: collection_package() imports
the collection it is in.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
short_description: Poll Triton servers for their registered system shared memory
description:
  - "An ansible-rulebook event source that asks each Triton Inference Server in O(servers)
    for its registered system shared-memory regions every O(interval) seconds, and puts one
    event per server on the queue. docs/self-healing.md tells the whole story: the schedule, restricted
    APIs, the strict reader's limits, the holders evidence, and the rulebook that acts on the events."
  - "Each event is C({triton_shm: {host, url, status, regions, registered_bytes,
    registered_percent, shm_bytes, threshold_percent, holders_complete, error}, meta: {hosts: host}}).
    C(status) is C(up) when the server answered with its region list, C(down) otherwise (refused, timed
    out, an HTTP error, or an answer the modules' own check of a status refuses), and C(implausible) when
    the list's figures cannot be true (a region or the total larger than C(shm_bytes), or than 2**63 bytes).
    A C(down) or C(implausible) event carries C(error) (the server's text, control characters escaped) and no
    region figures, so it never meets a rule on C(registered_percent). C(registered_percent) and C(shm_bytes)
    are there only when O(servers[].shm_bytes) is known, C(threshold_percent) only when O(threshold_percent)
    is set. C(meta.hosts) limits a C(run_playbook) action to the server's inventory host."
  - Read-only; it sends C(GET /v2/systemsharedmemory/status) (over C(grpc://) and C(grpcs://),
    C(SystemSharedMemoryStatus)), and with O(servers[].metrics_url) a C(GET) of that page, nothing else.
    One kept-alive HTTP/1.1 connection per server, Python's standard library only, never blocking the
    event loop; a C(grpc://) or C(grpcs://) URL is polled over one C(grpc.aio) channel per server and needs
    C(tritonclient[grpc]) where ansible-rulebook runs.
  - Every server is polled every O(interval), whatever the others answer; a slow or dead server delays only its
    own event, and each poll ends within O(timeout).
  - An answer is read up to 32 MiB, and a status of at most 200,000 regions (counted as its JSON objects before it is
    parsed; over gRPC its regions); a larger one is C(down), naming the limit.
  - C(holders_complete) is whether the cleanup on the server's host can see every process that may hold its
    shared memory (the metric C(tritonops_shm_holders_complete) read from O(servers[].metrics_url); C(null) when
    unknown). With C(false) a cleanup there would remove nothing; the event says why
    (C(holders_incomplete_reason)).
  - The C(url) in events and logs has any user:password part replaced by C(***).
    Header values never appear in events or logs.
options:
  servers:
    description:
      - The servers to poll. Each item is a dict with C(host) (the Ansible inventory host of
        the server; required), C(url) (Triton's HTTP endpoint, or C(grpc://HOST:PORT) / C(grpcs://HOST:PORT) for its
        gRPC endpoint; required; a URL that the machine running ansible-rulebook can reach) and optionally
        C(shm_bytes) (the size of the server's C(/dev/shm), the container's C(--shm-size))
        and C(threshold_percent), C(timeout), C(validate_certs), C(ca_path), C(headers),
        C(client_cert), C(client_key), C(metrics_url), which override the options of the same name for
        that server.
      - C(host) is a single host name (letters, digits, C(_), C(.), C(-)); C(all) and
        host patterns are refused.
    type: list
    elements: dict
    required: true
  interval:
    description: Seconds between two polls of every server.
    type: float
    default: 30
  threshold_percent:
    description:
      - Copied into every event that has C(registered_percent), so that a rule can compare
        the two (a rulebook condition cannot give a missing variable a default).
    type: float
  timeout:
    description: Seconds each poll of a server may take as a whole, from connecting to the answer's last byte.
    type: float
    default: 10
  validate_certs:
    description: Verify the server's TLS certificate (https URLs).
    type: bool
    default: true
  ca_path:
    description: PEM file or directory of CA certificates for https URLs (default the system store).
    type: path
  headers:
    description:
      - Extra HTTP headers for every request, for example an C(Authorization) header.
        Never logged.
    type: dict
  client_cert:
    description: PEM client certificate for mutual TLS.
    type: path
  client_key:
    description: PEM private key of O(client_cert) when it is not in the same file; unencrypted (no passphrase is asked).
    type: path
  metrics_url:
    description:
      - The Prometheus-format page (the node_exporter C(/metrics) of the host that runs the cleanup) where the server's
        C(tritonops_shm_holders_complete) series is, matched by its C(host) and C(triton_url) labels; C(/metrics) when
        the URL has no path. Usually set per server (O(servers[].metrics_url)); set here, it is every server's default.
      - Read on every poll within the same O(timeout), with the server's O(validate_certs) and O(ca_path), never its
        O(headers) nor its client certificate. docs/self-healing.md, "metrics_url", has the rest.
    type: str
"""

EXAMPLES = r"""
- name: Heal Triton shared memory
  hosts: all
  sources:
    - tritonops.shm.triton_shm:
        interval: 30
        threshold_percent: 80
        servers:
          - host: gpu1
            url: http://gpu1.example.com:8000
            shm_bytes: 1073741824
          - host: gpu2
            url: https://gpu2.example.com:8443
            shm_bytes: 2147483648
            ca_path: /etc/pki/triton-ca.pem
            headers:
              Authorization: "Bearer {{ triton_token }}"
  rules:
    - name: Show what the poller sees
      condition: event.triton_shm.status == "down"
      action:
        debug:
"""

import asyncio
import importlib
import itertools
import logging
import math
import os
import sys
import types
from typing import Any

try:
    import resource
except ImportError:  # not a Unix system: the open-file limit is left as it is
    resource = None

LOGGER = logging.getLogger(__name__)
PACKAGE = 'ansible_collections.tritonops.shm'


def _paths(module: Any) -> list[str]:
    """The real directories a package was imported from (its __path__, once each), [] for a module without one."""
    return sorted({os.path.realpath(p) for p in list(getattr(module, '__path__', None) or [])})


def collection_package() -> str:
    """The import name of the collection's module_utils, bound to the collection this file is in, never another copy.

    ansible-rulebook runs an event source with runpy.run_path, by its path: the collection is not importable as a
    package there. Then this binds ansible_collections.tritonops.shm to the collection this file is in
    (extensions/eda/plugins/event_source/ -> the collection root), and the module_utils import each other as in the
    modules. Another copy of the collection on sys.path never wins over it; when ansible_collections.tritonops.shm is
    already imported from another place (another copy's source ran first in this process), ImportError names both:
    this file never runs another copy's code. Imported as a package, the package is its own root.
    """
    root = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), *['..'] * 4))
    where = os.path.join(root, 'plugins', 'module_utils')
    if not os.path.isfile(os.path.join(where, 'run', 'poll.py')):
        raise ImportError(f'tritonops.shm.triton_shm needs {where}: install the whole tritonops.shm collection')
    for name, want in ((PACKAGE, root), (f'{PACKAGE}.plugins.module_utils', where)):
        bound = sys.modules.get(name)
        if bound is not None and _paths(bound) != [want]:
            raise ImportError(
                f'tritonops.shm.triton_shm at {root} cannot use its collection: {name} is already imported from '
                f'{", ".join(_paths(bound)) or getattr(bound, "__file__", None) or "elsewhere"}, another copy of '
                'tritonops.shm; run one copy of the collection per process'
            )
    if PACKAGE in sys.modules:
        return f'{PACKAGE}.plugins.module_utils'
    parent = None
    for name, path in (
        ('ansible_collections', os.path.dirname(os.path.dirname(root))),
        ('ansible_collections.tritonops', os.path.dirname(root)),
        (PACKAGE, root),
    ):
        try:  # the namespaces above the collection as Python finds them (no code runs), never the collection itself
            module = None if name == PACKAGE else importlib.import_module(name)
        except ImportError:
            module = None
        if module is None:  # a copy of tritonops.shm on sys.path must not win over this file's collection
            module = sys.modules[name] = types.ModuleType(name)
            module.__path__ = [path]  # type: ignore[attr-defined]
            if parent is not None:
                setattr(parent, name.rsplit('.', 1)[1], module)
        parent = module
    return f'{PACKAGE}.plugins.module_utils'


# what the source calls (module_utils/run/poll.py): its arguments as servers (parse_args, refused by ConfigError), one
# server's poll as its event, over the wire the modules share (poll.connection, poll.records, poll.triton_aio)
MODULE_UTILS = collection_package()
poll = importlib.import_module(f'{MODULE_UTILS}.run.poll')
parse_args, ConfigError = poll.parse_args, poll.ConfigError

MAX_SPACING = 0.01  # seconds between two poll starts, at most (fewer servers than interval / 0.01)
BATCH = 0.1  # polls due within this many seconds (at most interval / 20) start together: fewer wake-ups
FD_RESERVE = 256  # open files left for everything else in the process
STATUS_LOG = {'down': '%s: Triton is down: %s', 'implausible': "%s: Triton's answer cannot be true, no cleanup: %s"}


def _keep_alive_budget(servers: int, in_flight: int) -> int:
    """How many servers can keep their connection open between polls; raises the soft open-file limit if needed."""
    if resource is None:
        return servers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = servers + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(hard, want)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            LOGGER.info('raised the open-file limit from %d to %d for %d servers', soft, raised, servers)
            soft = raised
        except (ValueError, OSError) as exc:
            LOGGER.warning('cannot raise the open-file limit from %d: %s', soft, exc)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return servers
    budget = max(0, soft - FD_RESERVE - in_flight)
    LOGGER.warning(
        'the open-file limit (%d) keeps connections open to %d of %d servers; the others get a new '
        'connection for every poll',
        soft,
        budget,
        servers,
    )
    return budget


class _Poller:
    """Every server polled once per interval at its own place in it; events to the queue as they come."""

    def __init__(self, queue: asyncio.Queue, servers: list[dict], interval: float) -> None:
        self.queue = queue
        self.interval = interval
        self.spacing = min(interval / len(servers), MAX_SPACING)
        self.batch = min(BATCH, interval / 20)
        # polls running at once, at most: those started within the longest timeout (each server one at a time)
        longest = max(s['timeout'] for s in servers)
        in_flight = min(len(servers), math.ceil(min(longest, interval) / self.spacing) + 1)
        in_flight *= 2 if any(s.get('metrics') for s in servers) else 1  # a metrics request beside each poll
        budget = _keep_alive_budget(len(servers), in_flight)
        self.targets = [poll.Target(s, index < budget) for index, s in enumerate(servers)]
        self.last_status: dict[str, str] = {}
        self.last_holders: dict[str, Any] = {}
        self.with_metrics = {s['host'] for s in servers if s.get('metrics')}
        self.tasks: set[asyncio.Task] = set()
        # events not yet taken by the queue, oldest first, at most one per server: ansible-rulebook's queue holds one
        # event, and when the rules fall behind, a server's newer event replaces its older one (never a growing backlog)
        self.pending: dict[str, dict] = {}
        self.wake: asyncio.Future | None = None

    def _start(self, loop: asyncio.AbstractEventLoop, target: poll.Target) -> None:
        if target.busy:
            target.again = True
            return
        target.busy = True
        task = loop.create_task(self._poll(loop, target))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _poll(self, loop: asyncio.AbstractEventLoop, target: poll.Target) -> None:
        try:
            event = await target.poll(loop)
        finally:
            target.busy = False
        data = event['triton_shm']
        host, status = data['host'], data['status']
        if self.last_status.get(host) != status:
            if status == 'up':
                LOGGER.info('%s: Triton at %s is up', host, data['url'])
            else:
                LOGGER.warning(STATUS_LOG[status], host, data['error'])
            self.last_status[host] = status
        holders = (data['holders_complete'], data.get('holders_incomplete_reason'))
        if status == 'up' and host in self.with_metrics and self.last_holders.get(host) != holders:
            if holders[0] is False:
                LOGGER.warning('%s: the cleanup there cannot see every holder (%s), no self-heal', host, holders[1])
            elif holders[0] is None:
                LOGGER.warning('%s: holder completeness unknown: %s', host, data.get('metrics_error'))
            self.last_holders[host] = holders
        self.pending[data['host']] = event
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)
        if target.again:
            target.again = False
            self._start(loop, target)

    async def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the pending events to the queue, oldest first, as fast as the queue takes them."""
        while True:
            if not self.pending:
                self.wake = loop.create_future()
                await self.wake
                continue
            host = next(iter(self.pending))
            await self.queue.put(self.pending.pop(host))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        sender = loop.create_task(self._send(loop))
        try:
            for rnd in itertools.count():
                base = started + rnd * self.interval
                for index, target in enumerate(self.targets):
                    delay = base + index * self.spacing - loop.time()
                    if delay > self.batch:
                        await asyncio.sleep(delay)
                    self._start(loop, target)
                await asyncio.sleep(max(0.0, base + self.interval - loop.time()))
        finally:
            sender.cancel()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(sender, *self.tasks, return_exceptions=True)
            closing = [target.close() for target in self.targets]
            await asyncio.gather(*[c for c in closing if c is not None], return_exceptions=True)


async def main(queue: asyncio.Queue, args: dict) -> None:
    """Poll every server every interval seconds, one event per server per poll, until cancelled."""
    servers, interval = parse_args(args)
    await _Poller(queue, servers, interval).run()


if __name__ == '__main__':
    # python triton_shm.py [URL [SHM_BYTES]]: print the events of one server until Ctrl-C.
    import sys

    class MockQueue(asyncio.Queue):
        """Prints what the source puts, instead of feeding a rulebook."""

        async def put(self, item: Any) -> None:
            print(item, flush=True)

    ARGV = sys.argv[1:]
    SERVER = {'host': 'localhost', 'url': ARGV[0] if ARGV else 'http://127.0.0.1:8000'}
    if len(ARGV) > 1:
        SERVER['shm_bytes'] = int(ARGV[1])
    try:
        asyncio.run(main(MockQueue(), {'servers': [SERVER], 'interval': 5}))
    except KeyboardInterrupt:
        pass
