# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every Triton server of this host, found from /proc alone (no inventory): the node agent's listing.

Private to the tritonops.shm collection. Standard library only, plus the collection's own module_utils.
ServerList is triton_server_info's operation.Operation.

Per tritonserver process (by name, as discovery.py finds servers): its listening TCP sockets (the sockets of its
network namespace whose inode is one of its own fds, through discovery.listening_sockets: sock_diag in this
namespace, the namespace's tables elsewhere), which of them is HTTP, gRPC or metrics (from its command line, Triton's
defaults 8000/8001/8002 otherwise), a URL that reaches each from here (the listening address; for a wildcard, the
loopback in this namespace, else the namespace's own address from its fib_trie), its shm directory
(/proc/PID/root/dev/shm) and the container or pod it runs in (containers.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonOpsError
from ansible_collections.tritonops.shm.plugins.module_utils.host import holders
from ansible_collections.tritonops.shm.plugins.module_utils.host.containers import identity
from ansible_collections.tritonops.shm.plugins.module_utils.host.discovery import SERVER_COMMS, listening_sockets
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import (
    list_pids,
    netns_inode,
    read_bytes,
    read_comm,
    socket_inodes,
)
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import Operation
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient

DEFAULT_PORTS = {'http': 8000, 'grpc': 8001, 'metrics': 8002}
SCHEMES = {'http': 'http', 'grpc': 'grpc'}
_WILDCARD = ('0.0.0.0', '::')


class Listener(NamedTuple):
    address: str
    port: int
    protocol: str | None  # http, grpc, metrics, or None (a port Triton's flags do not name)


def parse_args(argv: list[str]) -> dict[str, object]:
    """{'http': port or None, 'grpc': ..., 'metrics': ...} from tritonserver's command line (None: that endpoint is off)."""
    flags: dict[str, str] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg.startswith('--') and '=' in arg:
            name, value = arg[2:].split('=', 1)
            flags[name] = value
        elif arg.startswith('--') and index + 1 < len(argv) and not argv[index + 1].startswith('--'):
            flags[arg[2:]] = argv[index + 1]
            index += 1
        index += 1
    ports: dict[str, object] = {}
    for protocol, default in DEFAULT_PORTS.items():
        allowed = flags.get(f'allow-{protocol}', 'true').lower() not in ('false', '0', 'no', 'off')
        try:
            port = int(flags.get(f'{protocol}-port', default))
        except ValueError:
            port = default
        ports[protocol] = port if allowed else None
    return ports


def local_addresses(net_dir: str) -> list[str]:
    """The IPv4 addresses local to a network namespace (its fib_trie's /32 host LOCAL entries), loopback excluded."""
    try:
        text = read_bytes(os.path.join(net_dir, 'fib_trie')).decode('ascii', 'replace')
    except OSError:
        return []
    out: list[str] = []
    last = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith('|--') or stripped.startswith('+--'):
            last = stripped[3:].split()[0]
        elif '/32 host LOCAL' in stripped and last and not last.startswith('127.') and last not in out:
            out.append(last)
    return out


def _host(address: str, own_ns: bool, net_dir: str) -> str | None:
    if address not in _WILDCARD:
        return address
    if own_ns:
        return '127.0.0.1' if address == '0.0.0.0' else '::1'
    found = local_addresses(net_dir)
    return found[0] if found else None


def _url(scheme: str, host: str | None, port: int) -> str | None:
    if host is None:
        return None
    return f'{scheme}://[{host}]:{port}' if ':' in host else f'{scheme}://{host}:{port}'


def _fds_denied(pid: int, proc: str) -> str | None:
    """Why a process's descriptors cannot be read (the listing: DAC; each link: the ptrace read check), else None."""
    base = f'{proc}/{pid}/fd'
    try:
        names = os.listdir(base)
        if names:
            os.readlink(f'{base}/{names[0]}')
    except PermissionError as exc:
        return exc.strerror or 'permission denied'
    except OSError:
        return None  # gone, or that descriptor closed meanwhile
    return None


def server(pid: int, proc: str = '/proc') -> dict[str, object] | None:
    """One tritonserver's entry (see the module's RETURN), or None when it is gone."""
    try:
        argv = [a.decode('utf-8', 'replace') for a in read_bytes(f'{proc}/{pid}/cmdline').split(b'\0') if a]
        uid = os.stat(f'{proc}/{pid}').st_uid
    except OSError:
        return None
    ports = parse_args(argv[1:])
    netns = netns_inode(pid, proc)
    own = netns is not None and netns == netns_inode('self', proc)
    net_dir = f'{proc}/self/net' if own and proc == '/proc' else f'{proc}/{pid}/net'
    warnings = []
    denied = _fds_denied(pid, proc)
    if denied:
        warnings.append(
            f'the sockets of tritonserver (pid {pid}) cannot be read ({denied}): run as root (become: true); '
            'in a container, with the capabilities SYS_PTRACE and DAC_READ_SEARCH (the node agent has them)'
        )
    inodes = socket_inodes(pid, proc)
    listeners = []
    by_port = {port: protocol for protocol, port in ports.items() if port is not None}
    for address, port, inode in sorted(listening_sockets(net_dir), key=lambda s: (s[1], s[0])):
        if inode in inodes:
            listeners.append(Listener(address, port, by_port.get(port)))
    urls: dict[str, str | None] = {}
    for protocol, scheme in SCHEMES.items():
        chosen = next((lsn for lsn in listeners if lsn.protocol == protocol), None)
        urls[protocol] = _url(scheme, _host(chosen.address, own, net_dir), chosen.port) if chosen else None
    found = identity(pid, proc)
    entry: dict[str, object] = {
        'pid': pid,
        'comm': read_comm(pid, proc),
        'uid': uid,
        'listeners': [{'address': lsn.address, 'port': lsn.port, 'protocol': lsn.protocol} for lsn in listeners],
        'http_port': next((lsn.port for lsn in listeners if lsn.protocol == 'http'), None),
        'grpc_port': next((lsn.port for lsn in listeners if lsn.protocol == 'grpc'), None),
        'metrics_port': next((lsn.port for lsn in listeners if lsn.protocol == 'metrics'), None),
        'http_url': urls['http'],
        'grpc_url': urls['grpc'],
        'url': urls['http'] or urls['grpc'],
        'shm_dir': f'{proc}/{pid}/root/dev/shm',
        'host_network': own,
        'container': found.as_dict() if found.found else None,
        'name': found.label if found.found else f'tritonserver (pid {pid})',
        'warnings': warnings,
    }
    if entry['url'] is None:
        entry['warnings'].append(f'tritonserver (pid {pid}) has no HTTP or gRPC listener reachable from here')
    return entry


def list_servers(proc: str = '/proc', names: tuple[str, ...] = SERVER_COMMS) -> list[dict[str, object]]:
    """Every process named like a Triton server on this host, in pid order."""
    out = []
    for pid in sorted(list_pids(proc)):
        if read_comm(pid, proc) in names:
            found = server(pid, proc)
            if found is not None:
                out.append(found)
    return out


def _answer_time(url: str, timeout: float) -> float | None:
    """Seconds the server at url took to answer its readiness check (any answer), None when none came within timeout."""
    start = time.monotonic()
    client = TritonClient(url, timeout=timeout)
    try:
        client.health('ready')
    except (TritonOpsError, OSError, ValueError):
        return None
    finally:
        client.close()
    took = time.monotonic() - start
    return round(took, 3) if took <= timeout else None


def probe(found: list, timeout: float) -> None:
    """Set each server's ``answered_s``: how long its HTTP readiness check took, all servers at once, each bounded by
    timeout (None: no answer in time, no HTTP endpoint, or not probed when timeout is 0). The node agent cleans the
    servers that answer first: a process that answers slowly, or not at all, cannot hold the others' round."""
    for entry in found:
        entry['answered_s'] = None
    targets = [e for e in found if timeout > 0 and e.get('http_url')]
    if not targets:
        return
    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        answers = list(pool.map(lambda e: _answer_time(str(e['http_url']), timeout), targets))
    for entry, answered in zip(targets, answers):
        entry['answered_s'] = answered


class ServerList(Operation):
    """triton_server_info as a operation.Operation: it reads (the servers, and whether every one can be seen) and changes
    nothing, so its plan is its reading and check mode is the same call."""

    def __init__(self, params: dict, warn: Callable[[str], object], proc: str = '/proc') -> None:
        self.params, self.warn, self.proc = params, warn, proc

    def read(self) -> tuple:
        visible = holders.visibility(self.proc, self.params['clients_share_pid_namespace'])
        found = list_servers(self.proc, tuple(self.params['process_names']))
        probe(found, float(self.params.get('probe_timeout') or 0))
        for entry in found:
            for warning in entry['warnings']:
                self.warn(warning)
        if not visible.complete:
            self.warn(f'only the Triton servers of this PID namespace are listed: {visible.reason}')
        return found, visible

    def result(self, outcome: tuple, finished: bool = True) -> dict:
        found, visible = outcome
        return {'changed': False, 'servers': found, 'complete': visible.complete, 'reason': visible.reason}
