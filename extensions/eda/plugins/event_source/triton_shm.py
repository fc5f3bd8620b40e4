# -*- coding: utf-8 -*-
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
    (refused, timed out, an HTTP error, or an answer that is not Triton's); a C(down)
    event carries C(error) and no region figures. C(registered_percent) and C(shm_bytes)
    are present only when the server's O(servers[].shm_bytes) is known;
    C(threshold_percent) only when O(threshold_percent) is set."
  - C(meta.hosts) is the server's inventory host, so that a C(run_playbook) action is
    limited to that host.
  - Read-only; it sends C(GET /v2/systemsharedmemory/status) and nothing else.
    The HTTP calls use aiohttp (installed with ansible-rulebook) and never block the
    event loop; servers are polled concurrently.
  - The C(url) in events and logs has any user:password part replaced by C(***).
    Header values never appear in events or logs.
options:
  servers:
    description:
      - The servers to poll. Each item is a dict with C(host) (the Ansible inventory host of
        the server; required), C(url) (Triton's HTTP endpoint; required) and optionally
        C(shm_bytes) (the size of the server's C(/dev/shm), the container's C(--shm-size))
        and C(threshold_percent), C(timeout), C(validate_certs), C(ca_path), C(headers),
        C(client_cert), C(client_key), which override the options of the same name for
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
    description: Seconds to wait for each server's answer.
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
import json
import logging
import math
import os
import re
import ssl
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

LOGGER = logging.getLogger(__name__)

STATUS_PATH = "/v2/systemsharedmemory/status"
MAX_ANSWER_BYTES = 32 << 20  # a status list of 100,000 regions is about 15 MiB
HOST_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
PER_SERVER = ("threshold_percent", "timeout", "validate_certs", "ca_path", "headers",
              "client_cert", "client_key")


class ConfigError(ValueError):
    """The source's arguments are not usable; raised before anything is polled."""


def redact_url(url: str) -> str:
    """The URL without the password (and user) of a user:password@ part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _number(value: Any, what: str, positive: bool = True) -> float:
    if isinstance(value, bool):
        raise ConfigError("%s must be a number, got %r" % (what, value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError("%s must be a number, got %r" % (what, value)) from None
    if not math.isfinite(number):
        raise ConfigError("%s must be a finite number, got %r" % (what, value))
    if positive and number <= 0:
        raise ConfigError("%s must be greater than 0, got %r" % (what, value))
    return number


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    raise ConfigError("%s must be a boolean, got %r" % (what, value))


def _headers(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError("%s must be a dict of header names to values" % what)
    out = {}
    for name, val in value.items():
        name, val = str(name), str(val)
        if not name or any(c in name for c in "\r\n:") or "\r" in val or "\n" in val:
            # never echo the value: it may be a secret
            raise ConfigError("%s: header %r has an invalid name or a line break in its value" % (what, name))
        out[name] = val
    return out


def _ssl_context(server: dict, what: str) -> ssl.SSLContext | None:
    """The TLS settings of the modules: CA file or directory, no verification, client certificate."""
    if urlsplit(server["url"]).scheme != "https":
        return None
    ca_path = server.get("ca_path")
    try:
        if server["validate_certs"]:
            if ca_path and os.path.isdir(ca_path):
                context = ssl.create_default_context(capath=ca_path)
            else:
                context = ssl.create_default_context(cafile=ca_path or None)
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if server.get("client_cert"):
            context.load_cert_chain(server["client_cert"], server.get("client_key") or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("%s: cannot load the TLS files: %s" % (what, exc)) from None
    return context


def parse_args(args: dict) -> tuple[list[dict], float]:
    """Validated servers (each with every per-server option resolved) and the interval."""
    servers = args.get("servers")
    if not isinstance(servers, list) or not servers:
        raise ConfigError("servers must be a non-empty list of {host, url} items")
    interval = _number(args.get("interval", 30), "interval")
    defaults = {
        "threshold_percent": args.get("threshold_percent"),
        "timeout": args.get("timeout", 10),
        "validate_certs": args.get("validate_certs", True),
        "ca_path": args.get("ca_path"),
        "headers": args.get("headers"),
        "client_cert": args.get("client_cert"),
        "client_key": args.get("client_key"),
    }
    out = []
    seen = set()
    for index, item in enumerate(servers):
        what = "servers[%d]" % index
        if not isinstance(item, dict):
            raise ConfigError("%s must be a dict with host and url" % what)
        unknown = sorted(set(item) - set(("host", "url", "shm_bytes") + PER_SERVER))
        if unknown:
            raise ConfigError("%s: unknown keys %s" % (what, ", ".join(unknown)))
        host = item.get("host")
        if not isinstance(host, str) or not HOST_RE.match(host) or host == "all":
            raise ConfigError("%s: host must be one inventory host name (not 'all', not a pattern), got %r"
                              % (what, host))
        if host in seen:
            raise ConfigError("%s: host %s is listed twice" % (what, host))
        seen.add(host)
        url = item.get("url")
        if not isinstance(url, str) or not url.strip():
            raise ConfigError("%s (%s): url is required" % (what, host))
        url = url.strip().rstrip("/")
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        try:
            parts.port  # pylint: disable=pointless-statement
        except ValueError:
            raise ConfigError("%s (%s): url %s has an invalid port" % (what, host, redact_url(url))) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("%s (%s): url %s is not an http(s) URL of a Triton server"
                              % (what, host, redact_url(url)))
        server = dict(defaults)
        server.update((k, item[k]) for k in PER_SERVER if k in item)
        server.update(host=host, url=url, shown_url=redact_url(url))
        server["shm_bytes"] = None if item.get("shm_bytes") is None else int(
            _number(item["shm_bytes"], "%s (%s): shm_bytes" % (what, host)))
        if server["threshold_percent"] is not None:
            server["threshold_percent"] = _number(server["threshold_percent"], "%s (%s): threshold_percent" % (what, host),
                                                  positive=False)
        server["timeout"] = _number(server["timeout"], "%s (%s): timeout" % (what, host))
        server["validate_certs"] = _bool(server["validate_certs"], "%s (%s): validate_certs" % (what, host))
        server["headers"] = _headers(server["headers"], "%s (%s): headers" % (what, host))
        server["ssl"] = _ssl_context(server, "%s (%s)" % (what, host))
        out.append(server)
    return out, interval


def summarize(regions: Any) -> tuple[int, int]:
    """(count, registered bytes) of Triton's system shared-memory status; ValueError when it is not one."""
    if not isinstance(regions, list):
        raise ValueError("expected a JSON list of regions")
    total = 0
    for region in regions:
        size = region.get("byte_size") if isinstance(region, dict) else None
        if isinstance(size, str) and size.isdigit():
            size = int(size)  # Triton's JSON writes uint64 as numbers; accept digit strings too
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(region.get("name"), str):
            raise ValueError("expected regions with a name and a byte_size")
        total += size
    return len(regions), total


def _secrets(server: dict) -> list[str]:
    found = [v for v in server["headers"].values() if v]
    password = urlsplit(server["url"]).password
    if password:
        found.append(password)
    return found


def _redact(text: str, server: dict) -> str:
    text = text.replace(server["url"], server["shown_url"])
    for secret in _secrets(server):
        text = text.replace(secret, "********")
    return text


def _snippet(raw: bytes, limit: int = 120) -> str:
    text = raw.decode("utf-8", "replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


async def _read_body(resp: aiohttp.ClientResponse) -> bytes:
    """The whole body, chunk by chunk (one read() returns what has arrived so far), up to the limit."""
    chunks = []
    size = 0
    while True:
        chunk = await resp.content.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise ValueError("the answer is larger than %d bytes" % MAX_ANSWER_BYTES)
        chunks.append(chunk)


async def _query(session: aiohttp.ClientSession, server: dict) -> list:
    """The server's region list; raise ValueError with the reason when it cannot be had."""
    headers = {"Accept": "application/json"}
    headers.update(server["headers"])
    url = server["url"] + STATUS_PATH
    timeout = aiohttp.ClientTimeout(total=server["timeout"])
    try:
        async with session.get(url, headers=headers, ssl=server["ssl"] if server["ssl"] is not None else True,
                               timeout=timeout, allow_redirects=False) as resp:
            raw = await _read_body(resp)
            if resp.status != 200:
                raise ValueError("HTTP %d: %s" % (resp.status, _snippet(raw) or resp.reason))
    except asyncio.TimeoutError:
        raise ValueError("no answer within %ss (timeout)" % server["timeout"]) from None
    except aiohttp.ClientSSLError as exc:
        raise ValueError("TLS verification failed: %s" % exc) from None
    except aiohttp.ClientConnectorError as exc:
        raise ValueError("cannot connect to Triton (refused or unreachable): %s" % exc) from None
    except aiohttp.ClientPayloadError as exc:
        raise ValueError("the answer was cut short: %s" % exc) from None
    except aiohttp.ClientError as exc:
        raise ValueError("the answer is not HTTP (is another service on this port?): %s"
                         % (str(exc) or type(exc).__name__)) from None
    except (OSError, RuntimeError) as exc:
        # anything else the transport raises makes this server down for this poll, never the source
        raise ValueError("request failed: %s: %s" % (type(exc).__name__, exc)) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise ValueError("the answer is not Triton JSON (is another web server on this port?): %s"
                         % _snippet(raw)) from None


async def poll(session: aiohttp.ClientSession, server: dict) -> dict:
    """One event for one server: its registered system shared memory, or why it is down."""
    data = {"host": server["host"], "url": server["shown_url"]}
    try:
        count, registered = summarize(await _query(session, server))
    except ValueError as exc:
        data.update(status="down", error=_redact("%s%s: %s" % (server["url"], STATUS_PATH, exc), server))
    else:
        data.update(status="up", regions=count, registered_bytes=registered)
        if server["shm_bytes"]:
            data.update(shm_bytes=server["shm_bytes"],
                        registered_percent=round(100.0 * registered / server["shm_bytes"], 2))
            if server["threshold_percent"] is not None:
                data["threshold_percent"] = server["threshold_percent"]
    return {"triton_shm": data, "meta": {"hosts": server["host"]}}


async def main(queue: asyncio.Queue, args: dict) -> None:
    """Poll every server every interval seconds, one event per server per poll, until cancelled."""
    servers, interval = parse_args(args)
    loop = asyncio.get_running_loop()
    last_status = {}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        while True:
            started = loop.time()
            events = await asyncio.gather(*(poll(session, s) for s in servers))
            for event in events:
                data = event["triton_shm"]
                if last_status.get(data["host"]) != data["status"]:
                    if data["status"] == "down":
                        LOGGER.warning("%s: Triton is down: %s", data["host"], data["error"])
                    else:
                        LOGGER.info("%s: Triton at %s is up", data["host"], data["url"])
                    last_status[data["host"]] = data["status"]
                await queue.put(event)
            await asyncio.sleep(max(0.0, interval - (loop.time() - started)))


if __name__ == "__main__":
    # python triton_shm.py [URL [SHM_BYTES]]: print the events of one server until Ctrl-C.
    import sys

    class MockQueue(asyncio.Queue):
        """Prints what the source puts, instead of feeding a rulebook."""

        async def put(self, item):
            print(item, flush=True)

    ARGV = sys.argv[1:]
    SERVER = {"host": "localhost", "url": ARGV[0] if ARGV else "http://127.0.0.1:8000"}
    if len(ARGV) > 1:
        SERVER["shm_bytes"] = int(ARGV[1])
    try:
        asyncio.run(main(MockQueue(), {"servers": [SERVER], "interval": 5}))
    except KeyboardInterrupt:
        pass
