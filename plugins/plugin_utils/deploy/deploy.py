# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the triton_server role derives from its variables and results, as pure functions.

Private to the tritonops.shm collection: no stability promise to other code. Controller code (plugin_utils) that
the filter of the same job adapts (plugins/filter/); it imports what a filter may import (CONTRIBUTING.md, "Imports").

Documentation: plugins/filter/NAME.yml for the public triton_version, triton_gpus and triton_endpoints, and for the
role's private _triton_args, _triton_container, _triton_shm, _triton_shm_change, _triton_retries, _triton_log_report and
_triton_deployed (``ansible-doc -t filter tritonops.shm.NAME``; CONTRIBUTING.md, "Public surface").
"""

from __future__ import annotations

import math
import re
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.formatters import human_to_bytes

from ansible_collections.tritonops.shm.plugins.module_utils.rules.versions import version_tuple
from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.sizing import docker_size

# First versions whose client shared memory is off unless --allow-client-shm=true
# (triton-inference-server/server PR 8721, NGC release 26.04 = server 2.68.0), as major * 1000 + minor.
CLIENT_SHM_OFF_SINCE = {'server': 2068, 'ngc': 26004}
_ALLOW_TRUE = ('true', 'yes', '1')
_ALLOW_FALSE = ('false', 'no', '0')
READY_PATH = '/v2/health/ready'
_ANY_ADDRESS = ('0.0.0.0', '', '::')
# addresses after which tritonserver is not given --*-address flags (it listens on every address by default)
_DEFAULT_LISTEN = ('0.0.0.0', '')
MANAGED_BY = {'io.github.tritonops.shm.managed-by': 'tritonops.shm.triton_server'}
# docker's --ulimit syntax: name=soft[:hard]
_ULIMIT = re.compile(r'^[a-z]+=-?[0-9]+(:-?[0-9]+)?$')
LOGS_TAIL = '2000'
# glog error lines (E1202 ...) and unindented lines with an error word (not the --help text)
_LOG_ERROR = re.compile(r'^(E[0-9]{4} |[^ \t-].*(?i:error|unrecognized|invalid|failed|fatal|denied))')
LOG_ERRORS_SHOWN = 10


def _text(value: Any, what: str, name: str) -> str:
    """A str from a str, or an int or float (YAML reads 26.05 as a number); None is ''."""
    if value is None:
        return ''
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError(f'{name}: {what} must be a string, got {type(value).__name__} {value!r}')
    return str(value).strip()


def image_tag(image: str) -> str:
    """The tag of an image reference: '24.10-py3' from nvcr.io/nvidia/tritonserver:24.10-py3; '' untagged or by digest only."""
    last = image.split('@')[0].split('/')[-1]
    return last.split(':')[1] if ':' in last else ''


def triton_version(image: Any, version: Any = '', allow_client_shm: Any = 'auto') -> dict:
    """The Triton version of an image (or of an explicit version text), and whether --allow-client-shm=true is added."""
    image = _text(image, 'the image', 'triton_version')
    text = _text(version, 'version', 'triton_version') or image_tag(image)
    numbers = version_tuple(text) or ()
    major, minor = numbers[:2] if len(numbers) >= 2 else (None, None)
    if major == 2:
        kind = 'server'
    elif major is not None and major >= 19:
        kind = 'ngc'
    else:
        kind = 'unknown'
    number = major * 1000 + minor if kind != 'unknown' else 0
    off = kind != 'unknown' and number >= CLIENT_SHM_OFF_SINCE[kind]
    if isinstance(allow_client_shm, bool):
        mode = 'true' if allow_client_shm else 'false'
    else:
        mode = _text(allow_client_shm, 'allow_client_shm', 'triton_version').lower()
        if mode not in ('auto',) + _ALLOW_TRUE + _ALLOW_FALSE:
            raise AnsibleFilterError(
                f'triton_version: allow_client_shm must be auto, true or false, got {allow_client_shm!r}'
            )
    flag = mode in _ALLOW_TRUE or (mode == 'auto' and off)
    return dict(text=text, kind=kind, number=number, client_shm_off_by_default=off, allow_client_shm=flag)


def triton_gpus(value: Any) -> dict:
    """The GPUs of the container: the ids, Docker's device requests and Podman's CDI devices."""
    if value is None or value == '':
        ids = []
    elif isinstance(value, bool) or not isinstance(value, (str, int, list, tuple)):
        raise AnsibleFilterError(
            "triton_gpus: expected '', 'all', a GPU index or UUID, or a list of them, "
            f'got {type(value).__name__} {value!r}'
        )
    else:
        items = value if isinstance(value, (list, tuple)) else [value]
        ids = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (str, int)) or not str(item).strip():
                raise AnsibleFilterError(
                    f'triton_gpus: each GPU must be a non-empty index or UUID, got {item!r} in {value!r}'
                )
            ids.append(str(item).strip())
        if 'all' in ids and ids != ['all']:
            raise AnsibleFilterError(f"triton_gpus: 'all' cannot be combined with other GPUs, got {value!r}")
    if not ids:
        docker = []
    elif ids == ['all']:
        docker = [dict(driver='nvidia', count=-1, capabilities=[['gpu']])]
    else:
        docker = [dict(driver='nvidia', device_ids=ids, capabilities=[['gpu']])]
    return dict(ids=ids, docker_device_requests=docker, podman_devices=['nvidia.com/gpu=' + i for i in ids])


def _port(value: Any, what: str, name: str = 'triton_endpoints') -> int:
    if isinstance(value, bool):
        value = None
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f'{name}: {what} must be a port number (0 disables it), got {value!r}') from None
    if port > 65535:
        raise AnsibleFilterError(f'{name}: {what} must be at most 65535, got {value!r}')
    return port


def triton_endpoints(
    listen_address: Any,
    http_port: Any = 8000,
    grpc_port: Any = 8001,
    metrics_port: Any = 8002,
    network_mode: Any = 'bridge',
    ready_url: Any = '',
) -> dict:
    """The ports the container publishes and the URLs the role uses, from the listen address and the ports."""
    address = _text(listen_address, 'listen_address', 'triton_endpoints')
    http = _port(http_port, 'http_port')
    ports = [p for p in (http, _port(grpc_port, 'grpc_port'), _port(metrics_port, 'metrics_port')) if p > 0]
    host_network = _text(network_mode, 'network_mode', 'triton_endpoints') == 'host'
    ready = _text(ready_url, 'ready_url', 'triton_endpoints')
    if not ready:
        ready = f'http://{"127.0.0.1" if address in _ANY_ADDRESS else address}:{http}{READY_PATH}'
    return dict(
        ports=ports,
        published_ports=[] if host_network else [f'{address}:{p}:{p}' for p in ports],
        ready_url=ready,
        url=ready[: -len(READY_PATH)] if ready.endswith(READY_PATH) else ready,
    )


def _strings(value: Any, what: str, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise AnsibleFilterError(f'{name}: {what} must be a list, got {type(value).__name__} {value!r}')
    return [str(v) for v in value]


def triton_args(
    command: Any,
    model_repository: str = '/models',
    model_control_mode: str = 'explicit',
    load_models: Any = None,
    http_port: Any = 8000,
    grpc_port: Any = 8001,
    metrics_port: Any = 8002,
    listen_address: Any = '0.0.0.0',
    network_mode: Any = 'bridge',
    allow_client_shm: bool = False,
    extra_args: Any = None,
) -> list[str]:
    """The tritonserver command line: the command, then the role's flags, then the extra ones."""
    name = 'triton_args'
    http, grpc, metrics = (
        _port(http_port, 'http_port', name),
        _port(grpc_port, 'grpc_port', name),
        _port(metrics_port, 'metrics_port', name),
    )
    address = _text(listen_address, 'listen_address', name)
    args = _strings(command, 'the command', name)
    args += [f'--model-repository={model_repository}', f'--model-control-mode={model_control_mode}']
    args += [f'--load-model={m}' for m in _strings(load_models, 'load_models', name)]
    args.append(f'--http-port={http}')
    args.append(f'--grpc-port={grpc}' if grpc > 0 else '--allow-grpc=false')
    args.append(f'--metrics-port={metrics}' if metrics > 0 else '--allow-metrics=false')
    if _text(network_mode, 'network_mode', name) == 'host' and address not in _DEFAULT_LISTEN:
        # on the host's network tritonserver itself listens on the address; in a bridge the engine publishes it
        args.append(f'--http-address={address}')
        args += [f'--grpc-address={address}'] if grpc > 0 else []
        args += [f'--metrics-address={address}'] if metrics > 0 else []
    if allow_client_shm:
        args.append('--allow-client-shm=true')
    return args + _strings(extra_args, 'extra_args', name)


def _str_dict(value: Any, what: str, value_from: bool = False) -> dict[str, Any]:
    """value's items as strings; with value_from (Kubernetes env) a dict value is kept: the variable's valueFrom."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AnsibleFilterError(f'triton_container: {what} must be a dict, got {type(value).__name__}')
    for k, v in value.items():
        if isinstance(v, (dict, list)) and not (value_from and isinstance(v, dict)):
            # never echo the value: env values are often secrets
            raise AnsibleFilterError(
                f'triton_container: {what} {k}: a dict or list value (a Kubernetes valueFrom such as '
                f'secretKeyRef) works only with triton_server_engine: kubernetes; give a string'
            )
    return {str(k): v if isinstance(v, dict) else str(v) for k, v in value.items()}


def triton_container(
    name: Any, engine: str = 'docker', docker_host: Any = '', env: Any = None, labels: Any = None, ulimits: Any = None
) -> dict:
    """What the container is given besides the image and the flags: env, labels, ulimits, and how to read its log."""
    name = _text(name, 'name', 'triton_container')
    ulimits = _strings(ulimits, 'ulimits', 'triton_container')
    host = '' if docker_host is None else str(docker_host)
    argv = [engine] + (['--host', host] if engine == 'docker' and host else []) + ['logs', '--tail', LOGS_TAIL, name]
    return dict(
        env=_str_dict(env, 'env', value_from=engine == 'kubernetes'),
        labels={**MANAGED_BY, **_str_dict(labels, 'labels')},
        invalid_ulimits=[u for u in ulimits if not _ULIMIT.match(u)],
        # docker_container spells a ulimit name:soft[:hard]
        docker_ulimits=[re.sub(r'^([^=]+)=', r'\1:', u) for u in ulimits],
        logs_argv=argv,
    )


def triton_shm(size: Any, plan: dict | None = None) -> dict:
    """The container's /dev/shm size: an explicit size when set, else the plan's; with its --shm-size spelling."""
    explicit = len(str(size)) > 0
    if explicit:
        try:
            num_bytes = int(human_to_bytes(size))
        except ValueError as exc:
            raise AnsibleFilterError(
                f'triton_shm: the size must be bytes or a size such as 2g or 512m, got {size!r}', orig_exc=exc
            ) from None
    elif plan:
        num_bytes = int(plan['bytes'])
    else:
        raise AnsibleFilterError("triton_shm: either a size or a plan (the shm_size filter's result) is needed")
    return dict(bytes=num_bytes, docker=docker_size(num_bytes), source='explicit' if explicit else 'plan', plan=plan)


def triton_shm_change(current: Any, wanted_bytes: Any = None) -> dict:
    """Whether the existing container's /dev/shm size differs from the wanted one (a docker or podman info result)."""
    current = current or {}
    if 'containers' in current:  # containers.podman.podman_container_info
        found = (current['containers'] or [None])[0]
    else:  # community.docker.docker_container_info
        found = current.get('container') if current.get('exists') else None
    current_bytes = int(found['HostConfig']['ShmSize']) if found else None
    changes = wanted_bytes is not None and current_bytes is not None and current_bytes != int(wanted_bytes)
    return dict(changes=changes, current_bytes=current_bytes)


def triton_retries(timeout: Any, delay: Any = 2) -> int:
    """How many retries of a poll every ``delay`` seconds fit in ``timeout`` seconds (at least 1)."""
    try:
        timeout, delay = int(timeout), int(delay)
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            f'triton_retries: timeout and delay must be whole seconds, got {timeout!r} and {delay!r}'
        ) from None
    return max(int(math.ceil(timeout / max(delay, 1))) - 1, 1)


def triton_log_report(logs: dict, header: str = '', command: Any = None, lines: Any = 50) -> str:
    """The message of a server that is not ready: the header, the error lines of its log, and its last lines."""
    logs = logs or {}
    shown = ' '.join(_strings(command, 'command', 'triton_log_report'))
    out = [header]
    if logs.get('rc', 1) != 0:
        out.append(f"Could not read the container's log ({shown}): {logs.get('msg', '')} {logs.get('stderr', '')}")
    else:
        all_lines = list(logs.get('stdout_lines') or []) + list(logs.get('stderr_lines') or [])
        errors = list(dict.fromkeys(line for line in all_lines if _LOG_ERROR.search(line)))
        tail = all_lines[-max(int(lines), 1) :]
        out += ['Errors in the log:'] + errors[-LOG_ERRORS_SHOWN:]
        out += [f'Last {lines} log lines ({shown}):'] + tail
    return '\n'.join(out) + '\n'


def triton_deployed(result: dict) -> str:
    """One line of what the role deployed: 'NAME: present at URL, /dev/shm 100m (plan)', or 'NAME: absent'."""
    line = f'{result["name"]}: {result["state"]}'
    if result['state'] != 'present':
        return line
    if result.get('shm_size_bytes') is not None:
        shm = f'{result["shm_size"]["docker"]} ({result["shm_size"]["source"]})'
    else:
        shm = 'shared (ipc mode)'
    return f'{line} at {result["url"]}, /dev/shm {shm}'
