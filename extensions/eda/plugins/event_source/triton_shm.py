# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""ansible-rulebook event source: Triton shared-memory registrations, polled."""

from __future__ import annotations

DOCUMENTATION = r"""
---
short_description: Poll Triton servers for their registered system shared memory
description:
  - An ansible-rulebook event source that asks each Triton Inference Server in O(servers)
    for its registered system shared-memory regions every O(interval) seconds, and puts one
    event per server on the queue.
  - "Each event is C({triton_shm: {host, url, status, regions, registered_bytes,
    registered_percent, shm_bytes, threshold_percent, error}, meta: {hosts: host}}).
    C(status) is C(up) when the server answered with its region list, C(down) otherwise
    (refused, timed out, an HTTP error, or an answer that is not Triton's: the modules' own check of a
    status, plugins/module_utils/records.py, loaded by its path, so that an answer the modules refuse is never
    C(up) here), and
    C(implausible) when the list's figures cannot be true (a region or the total larger
    than C(shm_bytes), or than 2**63 bytes); a C(down) or C(implausible) event carries
    C(error) (server text with every control character escaped) and no region figures,
    so it never meets a rule on C(registered_percent). C(registered_percent) and C(shm_bytes)
    are present only when the server's O(servers[].shm_bytes) is known;
    C(threshold_percent) only when O(threshold_percent) is set."
  - C(meta.hosts) is the server's inventory host, so that a C(run_playbook) action is
    limited to that host.
  - Read-only; it sends C(GET /v2/systemsharedmemory/status) (over C(grpc://) and C(grpcs://),
    C(SystemSharedMemoryStatus)) and nothing else.
    The HTTP calls never block the event loop and need nothing beyond Python's standard
    library, with one HTTP/1.1 connection per server, kept open between polls. A C(grpc://) or
    C(grpcs://) URL (Triton's gRPC port, as in the modules) is polled over one C(grpc.aio) channel
    per server, kept open between polls; it needs C(tritonclient[grpc]) where ansible-rulebook runs.
  - "Polls start one after another, at most 0.01 seconds apart (min(O(interval) / number of servers,
    0.01)): 100 servers are all polled within the first second of each interval, not spread over it;
    each server keeps its place, so every server is polled every O(interval) whatever the others
    answer. A slow or dead server delays only its own event; it is never polled twice at once (with
    a O(timeout) longer than the O(interval), its next poll starts when the current one ends)."
  - "A server started with C(--http-restricted-api=shared-memory:KEY=VALUE) (or
    C(--grpc-restricted-protocol=shared-memory:KEY=VALUE)) answers only with that header: give it in
    O(headers) (over gRPC the key is C(triton-grpc-protocol-KEY)). Without it the event is C(down) and its
    C(error) names O(headers) and the key Triton expects."
  - "Answers are read by the collection's strict HTTP/1.1 reader (plugins/module_utils/http_reader.py,
    loaded by its path): lines end in CRLF; the status line and headers (and a chunked body's
    trailers) are at most 64 KiB, a chunk-size line 1 KiB, the body 32 MiB, chunked or not.
    Each poll ends within O(timeout); every answer gives an event."
  - "Every event carries C(holders_complete): whether the cleanup on the server's host can see every process
    that may hold its shared memory, as that host's last report or cleanup wrote it in the metric
    C(tritonops_shm_holders_complete) (docs/metrics.md). C(true) or C(false) when O(servers[].metrics_url) is set
    and serves that server's series; C(null) (unknown, as without O(servers[].metrics_url)) otherwise, with
    C(metrics_error) saying why when O(servers[].metrics_url) is set. With C(false) the event also carries
    C(holders_incomplete_reason), the metric's C(reason) label (C(pid_namespace), C(shm_dir),
    C(unreadable_processes), C(hidepid), C(unknown)): a cleanup there would remove nothing, so the
    self-heal rulebook shows the event instead of starting one."
  - With more servers than the soft limit on open files allows, the source raises that limit
    towards the hard limit; servers beyond what the hard limit allows get a new connection
    for every poll.
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
    description: PEM private key of O(client_cert) when it is not in the same file.
    type: path
  metrics_url:
    description:
      - The Prometheus-format page (the node_exporter C(/metrics) of the host that runs the cleanup, with its textfile
        collector reading the cleanup's C(metrics_dir), or a Prometheus federation endpoint) where the server's
        C(tritonops_shm_holders_complete) series is; C(/metrics) when the URL has no path.
        Usually set per server (O(servers[].metrics_url)); set here, it is every server's default.
      - Read on every poll of the server, beside its status request and within the same O(timeout), by the same strict
        reader with the same caps, on a new connection each time. Sent with the server's O(validate_certs) and
        O(ca_path); never with its O(headers) nor its client certificate (a user:password in this URL is sent as
        Basic authentication, and redacted in events and logs).
      - "The series used are those whose C(host) label is the server's C(host) and whose C(triton_url) label is the
        server's C(url), spelled either way (a user:password part, a final C(/) and a missing C(http://) do not
        count), so the C(url) must be the host's C(triton_url). Any of them at 0 makes C(holders_complete) C(false)."
      - Unset, unreachable, or without a matching series, C(holders_complete) is C(null) and self-healing behaves
        as without it.
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
import base64
import importlib.util
import itertools
import json
import logging
import math
import os
import re
import ssl
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

try:
    import resource
except ImportError:  # not a Unix system: the open-file limit is left as it is
    resource = None

LOGGER = logging.getLogger(__name__)


def load_by_path(name: str) -> Any:
    """The collection's module_utils/NAME.py, loaded by its path (standard library only).

    ansible-rulebook runs an event source with runpy.run_path: the collection is not importable as a
    package there, so the source finds its collection from its own path
    (extensions/eda/plugins/event_source/ -> plugins/module_utils/).
    """
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    )
    path = os.path.join(root, 'plugins', 'module_utils', name + '.py')
    spec = importlib.util.spec_from_file_location('_tritonops_shm_' + name, path)
    if spec is None or not os.path.isfile(path):
        raise ImportError(f'tritonops.shm.triton_shm needs {path}: install the whole tritonops.shm collection')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


http_reader = load_by_path('http_reader')
tls = load_by_path('tls')
errors = load_by_path('errors')
records = load_by_path('records')  # what a region of a status is: the modules' check (client.check_regions)
urls = load_by_path('urls')
redact_url = urls.redact_url  # a URL as every output of the collection shows it

STATUS_PATH = '/v2/systemsharedmemory/status'
GRPC_METHOD = 'SystemSharedMemoryStatus'  # what a grpc:// server is asked (Triton's GRPCInferenceService)
GRPC_SCHEMES = ('grpc', 'grpcs')
DEFAULT_PORTS = {'http': 80, 'https': 443, 'grpc': 8001, 'grpcs': 8001}
GRPC_KEY_RE = re.compile(r'^[0-9a-z_.\-]+$')
MAX_ANSWER_BYTES = 32 << 20  # body: a status list of 100,000 regions is about 15 MiB; chunked or not
MAX_HEAD_BYTES = 64 << 10  # status line and headers (and the trailers of a chunked body)
MAX_ERROR_CHARS = 1000  # an event's error, escaped
# Sizes that cannot be true whatever the server: Triton 2.58+ refuses byte_size + offset past 2**63 - 1
ABSURD_BYTES = 1 << 63
HOST_RE = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.\-]*$')
PER_SERVER = (
    'threshold_percent',
    'timeout',
    'validate_certs',
    'ca_path',
    'headers',
    'client_cert',
    'client_key',
    'metrics_url',
)
HOLDERS_METRIC = 'tritonops_shm_holders_complete'  # written by plugins/module_utils/metrics.py
SAMPLE_RE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$')
LABEL_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
MAX_SPACING = 0.01  # seconds between two poll starts, at most (fewer servers than interval / 0.01)
BATCH = 0.1  # polls due within this many seconds (at most interval / 20) start together: fewer wake-ups
FD_RESERVE = 256  # open files left for everything else in the process


class ConfigError(ValueError):
    """The source's arguments are not usable; raised before anything is polled."""


class PollError(Exception):
    """This poll of this server has no region list; the message says why."""


class _Reconnect(PollError):
    """A kept-alive connection was closed by the server before it answered: send again on a new one."""


def _number(value: Any, what: str, positive: bool = True) -> float:
    if isinstance(value, bool):
        raise ConfigError(f'{what} must be a number, got {value!r}')
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f'{what} must be a number, got {value!r}') from None
    if not math.isfinite(number):
        raise ConfigError(f'{what} must be a finite number, got {value!r}')
    if positive and number <= 0:
        raise ConfigError(f'{what} must be greater than 0, got {value!r}')
    return number


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ('true', 'yes', 'on', '1', 'false', 'no', 'off', '0'):
        return value.lower() in ('true', 'yes', 'on', '1')
    raise ConfigError(f'{what} must be a boolean, got {value!r}')


def _headers(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f'{what} must be a dict of header names to values')
    out = {}
    for name, val in value.items():
        name, val = str(name), str(val)
        if not name or any(c in name for c in '\r\n: \t') or '\r' in val or '\n' in val:
            # never echo the value: it may be a secret
            raise ConfigError(f'{what}: header {name!r} has an invalid name or a line break in its value')
        out[name] = val
    return out


def _ssl_context(server: dict, what: str) -> ssl.SSLContext | None:
    """The TLS settings of the modules (module_utils/tls.py): CA file or directory, no verification, client certificate."""
    if urlsplit(server['url']).scheme != 'https':
        return None
    try:
        return tls.tls_context(
            server['validate_certs'], server.get('ca_path'), server.get('client_cert'), server.get('client_key')
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f'{what}: cannot load the TLS files: {exc}') from None


def _request(server: dict, path: str = STATUS_PATH, accept: str = 'application/json') -> bytes:
    """The one request this source sends to server: GET of path under its URL, with its headers and credentials."""
    parts = urlsplit(server['url'])
    headers = {
        'Host': parts.netloc.rpartition('@')[2],
        'Accept': accept,
        'Accept-Encoding': 'identity',
        'User-Agent': 'tritonops.shm-triton_shm',
    }
    if parts.username is not None or parts.password is not None:
        credentials = f'{unquote(parts.username or "")}:{unquote(parts.password or "")}'
        headers['Authorization'] = 'Basic ' + base64.b64encode(credentials.encode('utf-8')).decode('ascii')
    for name, value in server['headers'].items():  # the configured headers win, whatever their case
        for same in [h for h in headers if h.lower() == name.lower()]:
            del headers[same]
        headers[name] = value
    target = f'{parts.path}{path}' + (f'?{parts.query}' if parts.query else '')
    lines = [f'GET {target} HTTP/1.1'] + [f'{k}: {v}' for k, v in headers.items()]
    return ('\r\n'.join(lines) + '\r\n\r\n').encode('utf-8')


def parse_args(args: dict) -> tuple[list[dict], float]:
    """Validated servers (each with every per-server option resolved) and the interval."""
    servers = args.get('servers')
    if not isinstance(servers, list) or not servers:
        raise ConfigError('servers must be a non-empty list of {host, url} items')
    interval = _number(args.get('interval', 30), 'interval')
    defaults = {
        'threshold_percent': args.get('threshold_percent'),
        'timeout': args.get('timeout', 10),
        'validate_certs': args.get('validate_certs', True),
        'ca_path': args.get('ca_path'),
        'headers': args.get('headers'),
        'client_cert': args.get('client_cert'),
        'client_key': args.get('client_key'),
        'metrics_url': args.get('metrics_url'),
    }
    out = []
    seen = set()
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
        url = item.get('url')
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f'{what}: url is required')
        url = _http_url(url, f'{what}: url', 'a Triton server', grpc=True)
        server = dict(defaults)
        server.update((k, item[k]) for k in PER_SERVER if k in item)
        server.update(host=host, url=url, shown_url=redact_url(url))
        server['shm_bytes'] = (
            None if item.get('shm_bytes') is None else int(_number(item['shm_bytes'], f'{what}: shm_bytes'))
        )
        if server['threshold_percent'] is not None:
            server['threshold_percent'] = _number(
                server['threshold_percent'], f'{what}: threshold_percent', positive=False
            )
        server['timeout'] = _number(server['timeout'], f'{what}: timeout')
        server['validate_certs'] = _bool(server['validate_certs'], f'{what}: validate_certs')
        server['headers'] = _headers(server['headers'], f'{what}: headers')
        server['grpc'] = _grpc_settings(server, what) if urlsplit(url).scheme.lower() in GRPC_SCHEMES else None
        server['ssl'] = _ssl_context(server, what) if server['grpc'] is None else None
        server['request'] = _request(server)
        server['secrets'] = _secrets(server)
        server['metrics'] = _metrics_server(server, what)
        out.append(server)
    return out, interval


def _http_url(url: str, what: str, of: str, grpc: bool = False) -> str:
    """url without spaces around and a trailing /, http:// when it names no scheme; ConfigError when it is not http(s)
    (with grpc: or grpc(s)://HOST:PORT, nothing more)."""
    url = url.strip().rstrip('/')
    if '://' not in url:
        url = 'http://' + url
    parts = urlsplit(url)
    try:
        parts.port  # pylint: disable=pointless-statement
    except ValueError:
        raise ConfigError(f'{what} {redact_url(url)} has an invalid port') from None
    schemes = ('http', 'https') + (GRPC_SCHEMES if grpc else ())
    if parts.scheme.lower() not in schemes or not parts.hostname or any(c in url for c in ' \r\n\t'):
        kind = ' (nor a grpc:// or grpcs:// one)' if grpc else ''
        raise ConfigError(f'{what} {redact_url(url)} is not an http(s) URL{kind} of {of}')
    if parts.scheme.lower() in GRPC_SCHEMES and (parts.path or parts.query or parts.fragment or '@' in parts.netloc):
        raise ConfigError(
            f'{what} {redact_url(url)}: a gRPC URL is grpc://HOST:PORT or grpcs://HOST:PORT, with no path, '
            'query or user'
        )
    return url


def url_key(url: str) -> tuple:
    """What identifies a server's URL whatever its spelling: scheme, host, port, path; no user:password, no final /."""
    url = url.strip().rstrip('/')
    if '://' not in url:
        url = 'http://' + url
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    scheme = parts.scheme.lower()
    return scheme, parts.hostname or '', port or DEFAULT_PORTS.get(scheme, 80), parts.path.rstrip('/')


class _Grpc:
    """grpcio and Triton's messages (tritonclient[grpc]), imported at the first grpc:// server only."""

    grpc: Any = None
    pb: Any = None
    pb_grpc: Any = None


def _grpc_settings(server: dict, what: str) -> dict:
    """How a grpc(s):// server is reached: its target, metadata (the headers, keys in lower case), credentials."""
    if _Grpc.grpc is None:
        try:
            import grpc  # pylint: disable=import-outside-toplevel
            import grpc.aio  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
            from tritonclient.grpc import service_pb2, service_pb2_grpc  # pylint: disable=import-outside-toplevel
        except ImportError as exc:
            raise ConfigError(
                f"{what}: a grpc:// URL needs tritonclient[grpc] (grpcio and Triton's messages) where "
                f"ansible-rulebook runs: pip install 'tritonclient[grpc]' ({exc})"
            ) from None
        _Grpc.grpc, _Grpc.pb, _Grpc.pb_grpc = grpc, service_pb2, service_pb2_grpc
    parts = urlsplit(server['url'])
    metadata = []
    for name, value in server['headers'].items():
        key = name.lower()
        if not GRPC_KEY_RE.match(key) or key.endswith('-bin') or not value.isascii() or not value.isprintable():
            raise ConfigError(
                f'{what}: header {name!r} cannot be sent as gRPC metadata (names of letters, digits, '
                '-_. and not -bin; printable ASCII values)'
            )
        metadata.append((key, value))
    settings = {
        'target': f'{parts.hostname}:{parts.port or 8001}'
        if ':' not in parts.hostname
        else f'[{parts.hostname}]:{parts.port or 8001}',
        'metadata': tuple(metadata),
        'credentials': None,
    }
    if parts.scheme.lower() == 'grpcs':
        if not server['validate_certs']:
            raise ConfigError(
                f'{what}: validate_certs false is not possible with grpcs://: grpcio always verifies the '
                'server certificate; set ca_path to the CA that issued it'
            )
        try:
            pems = tls.grpc_pems(server.get('ca_path'), server.get('client_cert'), server.get('client_key'))
        except tls.TlsFileError as exc:
            raise ConfigError(f'{what}: cannot load the TLS files: {exc}') from None
        settings['credentials'] = _Grpc.grpc.ssl_channel_credentials(*pems)
    return settings


def _refusal(text: str, grpc: bool) -> str:
    """The server's error text, with the way out when it is a restricted API's refusal (module_utils/errors.py)."""
    header = errors.restricted_header(text)
    if header is None:
        return text
    return f'{text}; {errors.restricted_hint(header, grpc)}'


def _metrics_server(server: dict, what: str) -> dict | None:
    """The metrics endpoint of server as a server of its own: its URL, TLS settings of the server, no headers."""
    value = server.get('metrics_url')
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f'{what}: metrics_url must be the http(s) URL of a node_exporter or Prometheus-format endpoint'
        )
    url = _http_url(value, f'{what}: metrics_url', 'a node_exporter or Prometheus-format endpoint')
    if not urlsplit(url).path:
        url += '/metrics'
    # the server's headers (a Bearer token for Triton) and client certificate are never sent to another endpoint
    metrics = {
        'url': url,
        'shown_url': redact_url(url),
        'timeout': server['timeout'],
        'headers': {},
        'validate_certs': server['validate_certs'],
        'ca_path': server.get('ca_path'),
    }
    metrics['ssl'] = _ssl_context(metrics, f'{what}: metrics_url')
    metrics['request'] = _request(metrics, '', 'text/plain;version=0.0.4')
    metrics['secrets'] = _secrets(metrics)
    return metrics


class Holders(NamedTuple):
    """What a metrics page says of one server's holder scan: complete True, False or None (unknown), and why."""

    complete: bool | None
    reason: str | None = None  # the reason label when not complete
    error: str | None = None  # why it is unknown


def _unescape_label(value: str) -> str:
    return re.sub(r'\\(.)', lambda m: '\n' if m.group(1) == 'n' else m.group(1), value)


def holders_from_metrics(text: str, host: str, url: str) -> Holders:
    """The tritonops_shm_holders_complete series of (host, url) in a Prometheus text page.

    A series matches when its host label is host and its triton_url label is the same URL as url (url_key: a
    user:password part, a final / or a missing http:// do not count). Any matching series at 0: not complete,
    with its reason label; every matching series at 1: complete; none: unknown.
    """
    key = url_key(url)
    found = False
    for line in text.splitlines():
        if not line.startswith(HOLDERS_METRIC):
            continue
        match = SAMPLE_RE.match(line)
        if match is None or match.group(1) != HOLDERS_METRIC:
            continue
        labels = {m.group(1): _unescape_label(m.group(2)) for m in LABEL_RE.finditer(match.group(2) or '')}
        if labels.get('host') != host or url_key(labels.get('triton_url', '')) != key:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if value != 1:
            return Holders(False, reason=labels.get('reason') or 'unknown')
        found = True
    if found:
        return Holders(True)
    return Holders(
        None,
        error=f'no {HOLDERS_METRIC} series for host {host} and this triton_url (has a report or '
        'cleanup with metrics_dir run on that host?)',
    )


class Implausible(ValueError):
    """A well-formed status whose figures cannot be true: the event says so and never meets the self-heal condition."""


def summarize(regions: Any, shm_bytes: int | None = None) -> tuple[int, int]:
    """(count, registered bytes) of Triton's system shared-memory status.

    ValueError when it is not one: not a list, or a region the modules' check refuses (records.check_regions: each
    field of a system region there, with its type; the same answer is never up here and refused by the modules).
    Implausible when its figures cannot be true: a region or the total larger than shm_bytes (the whole shm
    filesystem), or than ABSURD_BYTES.
    """
    if not isinstance(regions, list):
        raise ValueError('expected a JSON list of regions')
    try:
        records.check_regions(records.SYSTEM, regions)
    except records.BadRegion as bad:
        raise ValueError(f'not a Triton system shared memory status: {bad.describe(http_reader.escape)}') from None
    total = 0
    for region in regions:
        size, name = region['byte_size'], region['name']
        limit = min(shm_bytes, ABSURD_BYTES) if shm_bytes else ABSURD_BYTES
        if size > limit:
            raise Implausible(
                f'region {http_reader.escape(name, 80)!r} has a byte_size of {size}, more than '
                + (f'the whole shm filesystem ({shm_bytes} bytes)' if shm_bytes else 'can be')
            )
        total += size
    if shm_bytes and total > shm_bytes:
        raise Implausible(
            f'{len(regions)} regions register {total} bytes, more than the whole shm filesystem ({shm_bytes} bytes)'
        )
    if total > ABSURD_BYTES:
        raise Implausible(f'{len(regions)} regions register {total} bytes, more than can be')
    return len(regions), total


def _secrets(server: dict) -> list[str]:
    """What must never reach an event or a log: header values, the URL's password, the Basic credentials sent."""
    found = [v for v in server['headers'].values() if v]
    parts = urlsplit(server['url'])
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    found += [
        token.decode('ascii') for token in re.findall(rb'^Authorization: Basic (\S+)\r$', server['request'], re.M)
    ]
    return sorted(set(found), key=len, reverse=True)


def _redact(text: str, server: dict) -> str:
    text = text.replace(server['url'], server['shown_url'])
    for secret in server['secrets']:
        text = text.replace(secret, '********')
    return text


def _snippet(raw: bytes, limit: int = 120) -> str:
    """The start of what a server sent, on one line, every control character escaped."""
    return http_reader.escape(raw.strip().replace(b'\n', b' '), limit)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to one server: one request at a time, kept open between polls when it can be.

    Answers are read by the collection's strict reader (module_utils/http_reader.py): every line and the
    body are bounded (MAX_HEAD_BYTES, MAX_ANSWER_BYTES, chunked or not) as the bytes come, so a server that
    declares a huge chunk or never ends a line is refused at once, holding no more than the caps.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.reader = http_reader.ResponseReader(MAX_ANSWER_BYTES, MAX_HEAD_BYTES, memo=False)
        self.open = False
        self.used = False  # a request was answered on it: a close before the next answer may be a stale keep-alive

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def expect(self, waiter: asyncio.Future) -> None:
        self.waiter = waiter
        self.reader = http_reader.ResponseReader(MAX_ANSWER_BYTES, MAX_HEAD_BYTES, memo=False)

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted any more
            return
        try:
            answer = self.reader.feed(data)
        except http_reader.HttpError as exc:
            self._finish(PollError(str(exc)))
            self.close()
            return
        if answer is None:
            return
        self.used = True
        self._finish(answer)
        if self.reader.leftover or not answer.keep_alive:
            self.close()
        self.reader.start()  # a kept connection holds no answer between polls

    def _finish(self, result: Any) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if isinstance(result, Exception):
                waiter.set_exception(result)
            else:
                waiter.set_result(result)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.waiter is None:
            return
        if self.reader.seen:
            if exc is not None:
                self._finish(PollError(f'the answer was cut short: {type(exc).__name__}: {exc}'))
                return
            try:
                self._finish(self.reader.eof())
            except http_reader.HttpError as error:
                self._finish(PollError(str(error)))
        elif self.used:
            self._finish(_Reconnect('the kept-alive connection was closed'))
        elif isinstance(exc, ssl.SSLError):
            self._finish(PollError(f'TLS failed: {exc}'))
        else:
            reason = f'{type(exc).__name__}: {exc}' if exc else 'closed'
            self._finish(PollError(f'the server closed the connection without an answer ({reason})'))

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.open = False
        self.waiter = None
        if self.transport is not None:
            self.transport.abort()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())


class _Target:
    """One server as the poller keeps it: its options, its request, its connection, its poll in flight."""

    __slots__ = ('server', 'address', 'keep_alive', 'request', 'conn', 'busy', 'again', 'name', 'metrics')

    def __init__(self, server: dict, keep_alive: bool, name: str = 'Triton') -> None:
        self.server = server
        self.name = name
        parts = urlsplit(server['url'])
        self.address = (parts.hostname, parts.port or (443 if parts.scheme == 'https' else 80))
        self.keep_alive = keep_alive
        self.request = (
            server['request']
            if keep_alive
            else server['request'].replace(b'\r\n\r\n', b'\r\nConnection: close\r\n\r\n', 1)
        )
        self.conn: _Connection | None = None
        self.busy = False  # a poll of this server is running
        self.again = False  # its next poll was due while it ran: start it as soon as it ends
        # the server's metrics endpoint, polled with it: a new connection each time (no open file kept for it)
        self.metrics = _Target(server['metrics'], False, 'the metrics endpoint') if server.get('metrics') else None

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        host, port = self.address
        ssl_context = self.server['ssl']
        try:
            _transport, conn = await loop.create_connection(
                _Connection, host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
            )
        except ssl.SSLCertVerificationError as exc:
            raise PollError(f'TLS verification failed: {exc}') from None
        except ssl.SSLError as exc:
            raise PollError(f'TLS failed: {exc}') from None
        except OSError as exc:
            raise PollError(f'cannot connect to {self.name} (refused or unreachable): {exc}') from None
        return conn

    async def fetch(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The server's answer to the status request, within its timeout; PollError otherwise."""
        timeout = self.server['timeout']
        deadline = loop.time() + timeout
        for attempt in (1, 2):
            conn = self.conn
            if conn is None or not conn.open:
                self.conn = None
                try:
                    conn = await asyncio.wait_for(self._connect(loop), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    raise PollError(f'no answer within {timeout}s (timeout)') from None
                if self.keep_alive:
                    self.conn = conn
            waiter = loop.create_future()
            conn.expect(waiter)
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                conn.transport.write(self.request)
                return await waiter
            except asyncio.TimeoutError:
                conn.abort()
                raise PollError(f'no answer within {timeout}s (timeout)') from None
            except (OSError, RuntimeError) as exc:  # whatever else the transport raises: down, never the source
                conn.abort()
                raise PollError(f'request failed: {type(exc).__name__}: {exc}') from None
            except _Reconnect:
                conn.abort()
                if attempt == 2:
                    raise PollError('the server closed the connection without an answer') from None
            except BaseException:
                conn.abort()  # an error or a cancel: a late answer must not meet the next request
                raise
            finally:
                timer.cancel()
                if not self.keep_alive or not conn.open:
                    if self.conn is conn:
                        self.conn = None
                    if not self.keep_alive:
                        conn.close()
        raise AssertionError('unreachable')

    async def poll(self, loop: asyncio.AbstractEventLoop) -> dict:
        """One event for this server: its registered system shared memory, why it is down, or why its answer cannot be true.

        Every answer gives an event, whatever the server sent: a failure of this source's own reading is a
        down event too, never a task exception. Server text in an error is escaped (no control characters).
        """
        server = self.server
        data = {'host': server['host'], 'url': server['shown_url']}
        holders = loop.create_task(self._holders(loop)) if self.metrics is not None else None
        try:
            return await self._poll(loop, data, holders)
        finally:
            if holders is not None and not holders.done():
                holders.cancel()  # a cancelled poll leaves no metrics request behind

    async def _poll(self, loop: asyncio.AbstractEventLoop, data: dict, holders: asyncio.Task | None) -> dict:
        server = self.server
        try:
            count, registered = summarize(await self._regions(loop), server['shm_bytes'])
        except Implausible as exc:
            data.update(status='implausible', error=self._error(f'the answer cannot be true: {exc}'))
        except (PollError, ValueError) as exc:
            data.update(status='down', error=self._error(str(exc)))
        except Exception as exc:  # pylint: disable=broad-except  # every answer yields an event
            data.update(status='down', error=self._error(f'the answer could not be read: {type(exc).__name__}: {exc}'))
        else:
            data.update(status='up', regions=count, registered_bytes=registered)
            if server['shm_bytes']:
                data.update(
                    shm_bytes=server['shm_bytes'], registered_percent=round(100.0 * registered / server['shm_bytes'], 2)
                )
                if server['threshold_percent'] is not None:
                    data['threshold_percent'] = server['threshold_percent']
        data['holders_complete'] = None
        if holders is not None:
            seen = await holders
            data['holders_complete'] = seen.complete
            if seen.reason is not None:
                data['holders_incomplete_reason'] = seen.reason
            if seen.error is not None:
                data['metrics_error'] = seen.error
        return {'triton_shm': data, 'meta': {'hosts': server['host']}}

    async def _regions(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The server's registered system regions as its answer lists them; PollError when there is no such answer."""
        answer = await self.fetch(loop)
        if answer.status != 200:
            text = _snippet(answer.body) or http_reader.escape(answer.reason, 120)
            if answer.status == 403:
                try:
                    text = _refusal(json.loads(answer.body)['error'], grpc=False)
                except (ValueError, KeyError, TypeError):
                    pass
            raise PollError(f'HTTP {answer.status}: {text}')
        try:
            return json.loads(answer.body)
        except ValueError:
            raise PollError(
                'the answer is not Triton JSON (is another web server on this port?): ' + _snippet(answer.body)
            ) from None

    async def _holders(self, loop: asyncio.AbstractEventLoop) -> Holders:
        """Whether the cleanup on the server's host can see every holder, from its metrics endpoint; never raises."""
        metrics = self.metrics.server
        try:
            answer = await self.metrics.fetch(loop)
            if answer.status != 200:
                raise PollError(
                    f'HTTP {answer.status}: {_snippet(answer.body) or http_reader.escape(answer.reason, 120)}'
                )
            text = answer.body.decode('utf-8', 'replace')
            seen = holders_from_metrics(text, self.server['host'], self.server['url'])
        except Exception as exc:  # pylint: disable=broad-except  # unknown, as without metrics_url: never the source
            detail = str(exc) if isinstance(exc, PollError) else f'{type(exc).__name__}: {exc}'
            seen = Holders(None, error=detail)
        if seen.error is not None:
            text = http_reader.escape(_redact(f'{metrics["url"]}: {seen.error}', metrics), MAX_ERROR_CHARS)
            seen = seen._replace(error=text)
        return seen

    def _error(self, text: str) -> str:
        """The error of an event: URL and reason, secrets redacted, every control character escaped."""
        server = self.server
        return http_reader.escape(_redact(f'{server["url"]}{STATUS_PATH}: {text}', server), MAX_ERROR_CHARS)

    def close(self) -> Any:
        """Close the connection; an awaitable when closing takes one (a gRPC channel), else None."""
        if self.conn is not None:
            self.conn.abort()
            self.conn = None
        if self.metrics is not None:
            self.metrics.close()
        return None


class _GrpcTarget(_Target):
    """A grpc(s):// server: SystemSharedMemoryStatus over one grpc.aio channel, kept open between polls."""

    __slots__ = ('channel', 'stub')

    def __init__(self, server: dict, keep_alive: bool) -> None:
        super().__init__(server, keep_alive)
        self.channel: Any = None
        self.stub: Any = None

    async def _regions(self, loop: asyncio.AbstractEventLoop) -> Any:
        grpc, settings, timeout = _Grpc.grpc, self.server['grpc'], self.server['timeout']
        if self.stub is None:
            options = [('grpc.max_receive_message_length', MAX_ANSWER_BYTES)]
            if settings['credentials'] is None:
                self.channel = grpc.aio.insecure_channel(settings['target'], options=options)
            else:
                self.channel = grpc.aio.secure_channel(settings['target'], settings['credentials'], options=options)
            self.stub = _Grpc.pb_grpc.GRPCInferenceServiceStub(self.channel)
        try:
            answer = await self.stub.SystemSharedMemoryStatus(
                _Grpc.pb.SystemSharedMemoryStatusRequest(), timeout=timeout, metadata=settings['metadata']
            )
        except grpc.aio.AioRpcError as exc:
            name, details = exc.code().name, exc.details() or ''
            if name == 'DEADLINE_EXCEEDED':
                raise PollError(f'no answer within {timeout}s (timeout)') from None
            if name == 'UNAVAILABLE' and errors.RESTRICTED_TEXT not in details:
                raise PollError(f'cannot connect to Triton over gRPC (refused or unreachable): {details}') from None
            raise PollError(f'gRPC {name}: {_refusal(details, grpc=True)}') from None
        finally:
            if not self.keep_alive:
                await self._close_channel()
        return [records.from_message(records.SYSTEM, r) for r in answer.regions.values()]

    async def _close_channel(self) -> None:
        channel, self.channel, self.stub = self.channel, None, None
        if channel is not None:
            await channel.close()

    def _error(self, text: str) -> str:
        server = self.server
        return http_reader.escape(_redact(f'{server["url"]} ({GRPC_METHOD}): {text}', server), MAX_ERROR_CHARS)

    def close(self) -> Any:
        super().close()
        return self._close_channel()


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
        self.targets = [(_GrpcTarget if s['grpc'] else _Target)(s, index < budget) for index, s in enumerate(servers)]
        self.last_status: dict[str, str] = {}
        self.last_holders: dict[str, Any] = {}
        self.with_metrics = {s['host'] for s in servers if s.get('metrics')}
        self.tasks: set[asyncio.Task] = set()
        # events not yet taken by the queue, oldest first, at most one per server: ansible-rulebook's queue holds one
        # event, and when the rules fall behind, a server's newer event replaces its older one (never a growing backlog)
        self.pending: dict[str, dict] = {}
        self.wake: asyncio.Future | None = None

    def _start(self, loop: asyncio.AbstractEventLoop, target: _Target) -> None:
        if target.busy:
            target.again = True
            return
        target.busy = True
        task = loop.create_task(self._poll(loop, target))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _poll(self, loop: asyncio.AbstractEventLoop, target: _Target) -> None:
        try:
            event = await target.poll(loop)
        finally:
            target.busy = False
        data = event['triton_shm']
        if self.last_status.get(data['host']) != data['status']:
            if data['status'] == 'down':
                LOGGER.warning('%s: Triton is down: %s', data['host'], data['error'])
            elif data['status'] == 'implausible':
                LOGGER.warning("%s: Triton's answer cannot be true, no cleanup: %s", data['host'], data['error'])
            else:
                LOGGER.info('%s: Triton at %s is up', data['host'], data['url'])
            self.last_status[data['host']] = data['status']
        holders = (data['holders_complete'], data.get('holders_incomplete_reason'))
        if (
            data['status'] == 'up'
            and data['host'] in self.with_metrics
            and self.last_holders.get(data['host']) != holders
        ):
            if holders[0] is False:
                LOGGER.warning(
                    '%s: the cleanup there cannot see every holder (%s), no self-heal', data['host'], holders[1]
                )
            elif holders[0] is None:
                LOGGER.warning('%s: holder completeness unknown: %s', data['host'], data.get('metrics_error'))
            self.last_holders[data['host']] = holders
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
