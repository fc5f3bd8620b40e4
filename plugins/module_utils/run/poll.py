# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: one poll of one Triton server as the event source sees it, and the source's arguments.

The event source (extensions/eda/plugins/event_source/triton_shm.py) is the rulebook's side: its documentation, the
schedule (every server once per interval, at its own place in it), the open-file budget and the queue. This file is
what it calls, as the modules call module_utils: parse_args() turns its arguments into servers (each connection
option converted and turned into what goes on the wire by connection.wire_config, as for the modules), and
Target.poll() gives one server's event: its registered system shared memory (records.registered, the modules'
check), why it is down, or why its answer cannot be true, with the holders evidence of its metrics_url. The wire is
triton_aio (the asyncio twin of the modules' transports); secrets never reach an event (connection.secrets).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics_text
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection, http_reader, triton_aio
from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import redact_url

ConfigError = connection.OptionError  # the source's arguments are not usable; raised before anything is polled
PollError = triton_aio.StatusError  # this poll of this server has no region list; the message says why
Holders = metrics_text.Holders
Implausible = records.Implausible

# a body: a status list of 100,000 regions is about 15 MiB; chunked or not (triton_aio.MAX_REGIONS)
MAX_ANSWER_BYTES = 32 << 20
MAX_ERROR_CHARS = 1000  # an event's error, escaped
HOST_RE = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.\-]*$')
# per server, or as every server's default: the connection options but url (connection.OPTIONS), and these
OWN = {'threshold_percent': None, 'metrics_url': None}
PER_SERVER = tuple(n for n in connection.OPTIONS if n != 'url') + tuple(OWN)


def parse_args(args: dict) -> tuple[list[dict], float]:
    """Validated servers (each with every per-server option resolved) and the interval."""
    servers = args.get('servers')
    if not isinstance(servers, list) or not servers:
        raise ConfigError('servers must be a non-empty list of {host, url} items')
    interval = connection.number(args.get('interval', 30), 'interval')
    defaults = {n: args.get(n, o.default) for n, o in connection.OPTIONS.items() if n != 'url'}
    defaults.update((n, args.get(n, d)) for n, d in OWN.items())
    out, seen = [], set()
    for index, item in enumerate(servers):
        what = f'servers[{index}]'
        if not isinstance(item, dict):
            raise ConfigError(f'{what} must be a dict with host and url')
        unknown = sorted(set(item) - {'host', 'url', 'shm_bytes', *PER_SERVER})
        if unknown:
            raise ConfigError(f'{what}: unknown keys {", ".join(unknown)}')
        host = item.get('host')
        if not isinstance(host, str) or not HOST_RE.match(host) or host == 'all':
            raise ConfigError(f"{what}: host must be one inventory host name (not 'all', not a pattern), got {host!r}")
        if host in seen:
            raise ConfigError(f'{what}: host {host} is listed twice')
        seen.add(host)
        what = f'{what} ({host})'
        url = connection.checked_url(item.get('url'), f'{what}: url', 'a Triton server', grpc=True)
        server = {**defaults, **{k: item[k] for k in PER_SERVER if k in item}}
        for name in connection.OPTIONS:
            if name != 'url':
                server[name] = connection.convert(name, server[name], f'{what}: {name}')
        server.update(host=host, url=url, shown_url=redact_url(url), shm_bytes=item.get('shm_bytes'))
        if server['shm_bytes'] is not None:
            server['shm_bytes'] = int(connection.number(server['shm_bytes'], f'{what}: shm_bytes'))
        if server['threshold_percent'] is not None:
            server['threshold_percent'] = connection.number(
                server['threshold_percent'], f'{what}: threshold_percent', positive=False
            )
        try:
            wire = server['wire'] = connection.wire_config(server)  # what goes on the wire, from the options alone
        except ConfigError as exc:
            raise ConfigError(f'{what}: {exc}') from None
        server['secrets'] = connection.secrets(wire)
        server['grpc'] = triton_aio.grpc_settings(wire, MAX_ANSWER_BYTES, what) if connection.is_grpc(url) else None
        server['ssl'] = None if server['grpc'] else triton_aio.tls_context(wire, what)  # read once, before any poll
        server['metrics'] = metrics_server(server, what)
        out.append(server)
    return out, interval


def metrics_server(server: dict, what: str) -> dict | None:
    """The metrics endpoint of server as a server of its own: its URL, TLS settings of the server, no headers."""
    if server.get('metrics_url') is None:
        return None
    of = 'a node_exporter or Prometheus-format endpoint'
    if not isinstance(server['metrics_url'], str) or not server['metrics_url'].strip():
        raise ConfigError(f'{what}: metrics_url must be the http(s) URL of {of}')
    url = connection.checked_url(server['metrics_url'], f'{what}: metrics_url', of)
    url += '' if urlsplit(url).path else '/metrics'
    # the server's headers (a Bearer token for Triton) and client certificate are never sent to another endpoint
    wire = server['wire']._replace(url=url, headers={}, tls=server['wire'].tls._replace(cert=None, key=None))
    shown, ssl_context = redact_url(url), triton_aio.tls_context(wire, f'{what}: metrics_url')
    return {'url': url, 'shown_url': shown, 'wire': wire, 'secrets': connection.secrets(wire), 'ssl': ssl_context}


def holders_from_metrics(text: str, host: str, url: str) -> Holders:
    """The holders series of (host, url) in a Prometheus text page (metrics_text.holders_complete; connection.url_key:
    a user:password part, a final / or a missing http:// do not count)."""
    return metrics_text.holders_complete(text, host, url, connection.url_key)


def summarize(regions: Any, shm_bytes: int | None = None) -> tuple[int, int]:
    """(count, registered bytes) of a system shared-memory status: records.registered (the modules' check)."""
    return records.registered(records.SYSTEM, regions, shm_bytes, http_reader.escape)


def shown_error(server: dict, text: str) -> str:
    """An event's error: secrets redacted, every control character escaped, at most MAX_ERROR_CHARS."""
    hidden = connection.redact(text, server['url'], server['shown_url'], server['secrets'])
    return http_reader.escape(hidden, MAX_ERROR_CHARS)


class Target:
    """One server as the poller keeps it: its options, its endpoints (triton_aio), its poll in flight."""

    __slots__ = ('server', 'status', 'metrics', 'busy', 'again')

    def __init__(self, server: dict, keep_alive: bool) -> None:
        self.server, self.busy, self.again = server, False, False  # again: its next poll came due while it ran
        if server['grpc'] is not None:
            self.status: Any = triton_aio.GrpcEndpoint(server['wire'], server['grpc'], keep_alive)
        else:
            accept, ssl_context = 'application/json', server['ssl']
            self.status = triton_aio.HttpEndpoint(
                server['wire'], triton_aio.STATUS_PATH, accept, keep_alive, MAX_ANSWER_BYTES, ssl_context
            )
        metrics = server['metrics']  # polled beside the status, on a new connection each time (no open file kept)
        self.metrics = metrics and triton_aio.HttpEndpoint(
            metrics['wire'],
            '',
            'text/plain;version=0.0.4',
            False,
            MAX_ANSWER_BYTES,
            metrics['ssl'],
            'the metrics endpoint',
        )

    async def poll(self, loop: asyncio.AbstractEventLoop) -> dict:
        """One event for this server: its registered system shared memory, why it is down, or why its answer cannot be true.

        Every answer gives an event, whatever the server sent: a failure of this source's own reading is a
        down event too, never a task exception. Server text in an error is escaped (no control characters).
        """
        server = self.server
        data = {'host': server['host'], 'url': server['shown_url']}
        holders = loop.create_task(self._holders(loop)) if self.metrics else None
        try:
            data.update(await self._status(loop), holders_complete=None)
            if holders is not None:
                seen = await holders
                data['holders_complete'] = seen.complete
                if seen.reason is not None:
                    data['holders_incomplete_reason'] = seen.reason
                if seen.error is not None:
                    data['metrics_error'] = seen.error
        finally:
            if holders is not None and not holders.done():
                holders.cancel()  # a cancelled poll leaves no metrics request behind
        return {'triton_shm': data, 'meta': {'hosts': server['host']}}

    async def _status(self, loop: asyncio.AbstractEventLoop) -> dict:
        """The status fields of the event: up with the figures, down or implausible with the error."""
        server, where = self.server, self.status.where()
        try:
            count, registered = summarize(await self.status.status(loop), server['shm_bytes'])
        except Implausible as exc:
            return {
                'status': 'implausible',
                'error': shown_error(server, f'{where}: the answer cannot be true: {exc}'),
            }
        except Exception as exc:  # pylint: disable=broad-except  # every answer yields an event
            if isinstance(exc, PollError):
                text = str(exc)
            elif isinstance(exc, ValueError):
                text = f'{where}: {exc}'
            else:
                text = f'{where}: the answer could not be read: {type(exc).__name__}: {exc}'
            return {'status': 'down', 'error': shown_error(server, text)}
        shm_bytes, data = server['shm_bytes'], {'status': 'up', 'regions': count, 'registered_bytes': registered}
        if shm_bytes:
            data.update(shm_bytes=shm_bytes, registered_percent=round(100.0 * registered / shm_bytes, 2))
            if server['threshold_percent'] is not None:
                data['threshold_percent'] = server['threshold_percent']
        return data

    async def _holders(self, loop: asyncio.AbstractEventLoop) -> Holders:
        """Whether the cleanup on the server's host can see every holder, from its metrics endpoint; never raises."""
        metrics = self.server['metrics']
        try:
            text = (await self.metrics.page(loop)).decode('utf-8', 'replace')
            seen = holders_from_metrics(text, self.server['host'], self.server['url'])
        except Exception as exc:  # pylint: disable=broad-except  # unknown, as without metrics_url: never the source
            seen = Holders(None, error=str(exc) if isinstance(exc, PollError) else f'{type(exc).__name__}: {exc}')
        if seen.error is not None:
            seen = seen._replace(error=shown_error(metrics, f'{metrics["url"]}: {seen.error}'))
        return seen

    def close(self) -> Any:
        """Close the connections; an awaitable when closing takes one (a gRPC channel), else None."""
        if self.metrics:
            self.metrics.close()
        return self.status.close()
