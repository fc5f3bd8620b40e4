# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Kubernetes Deployment and Service of the triton_server role, as a pure function.

Private to the tritonops.shm collection: no stability promise to other code. Controller code (plugin_utils) that
the filter of the same job adapts (plugins/filter/); it imports what a filter may import (CONTRIBUTING.md, "Imports").

Documentation: plugins/filter/triton_kubernetes.yml (``ansible-doc -t filter tritonops.shm.triton_kubernetes``).
The manifest text quotes every string: kubectl reads YAML 1.1-ish (``y``, ``n``, ``on`` are booleans, ``1e3`` a
number), so an unquoted env value or label ``y`` would change meaning or be refused. PyYAML ships with Ansible.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, NoReturn

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.sizing import pod_shm, size_bytes

MANAGED_BY = 'tritonops.shm.triton_server'
CONTAINER = 'tritonserver'
MODELS_VOLUME = 'models'
# DNS-1123 label: the names of Deployments, Services and ports' owners.
_DNS_LABEL = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')
_QUANTITY = re.compile(r'^([0-9]+(?:[.][0-9]*)?|[.][0-9]+)(?:([eE][-+]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m))?$')
_SUFFIX = {
    None: 1,
    'm': Decimal('0.001'),
    'k': 10**3,
    'M': 10**6,
    'G': 10**9,
    'T': 10**12,
    'P': 10**15,
    'E': 10**18,
    'Ki': 1 << 10,
    'Mi': 1 << 20,
    'Gi': 1 << 30,
    'Ti': 1 << 40,
    'Pi': 1 << 50,
    'Ei': 1 << 60,
}
PULL_POLICY = {'missing': 'IfNotPresent', 'always': 'Always', 'never': 'Never'}
IPC_MODES = ('private', 'shareable', 'host')
SERVICE_TYPES = ('ClusterIP', 'NodePort', 'LoadBalancer', '')
READY_PATH = '/v2/health/ready'
LIVE_PATH = '/v2/health/live'


def _fail(msg: str, exc: BaseException | None = None) -> NoReturn:
    raise AnsibleFilterError(f'triton_kubernetes: {msg}', orig_exc=exc)


def quantity_bytes(value: Any, what: str = 'quantity') -> int:
    """The bytes of a Kubernetes quantity (``2Gi``, ``1500M``, ``1e9``, ``1073741824``), rounded up to a whole byte."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        _fail(f'{what} must be a Kubernetes quantity such as "4Gi", got {value!r}')
    found = _QUANTITY.match(str(value).strip())
    if not found:
        _fail(f'{what}: cannot read {value!r} as a Kubernetes quantity (for example "4Gi", "4096Mi", "4G")')
    number, exponent, suffix = found.groups()
    try:
        amount = Decimal(number) * (Decimal(10) ** int(exponent[1:]) if exponent else _SUFFIX[suffix])
    except InvalidOperation as exc:
        _fail(f'{what}: cannot read {value!r} as a Kubernetes quantity', exc)
    return int(math.ceil(amount))


def whole_number(
    value: Any, what: str, fail: Callable[..., NoReturn], minimum: int = 0, maximum: int | None = None
) -> int:
    """value as an int within [minimum, maximum]; fail(msg, exc=None) says why not (each filter names itself there)."""
    if isinstance(value, bool):
        fail(f'{what} must be a whole number, got {value!r}')
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        fail(f'{what} must be a whole number, got {value!r}', exc)
    if number < minimum or (maximum is not None and number > maximum):
        bound = f'between {minimum} and {maximum}' if maximum is not None else f'>= {minimum}'
        fail(f'{what} must be {bound}, got {value!r}')
    return number


def _int(value: Any, what: str, minimum: int = 0, maximum: int | None = None) -> int:
    return whole_number(value, what, _fail, minimum, maximum)


# an env value given as a dict is the variable's valueFrom: exactly one of these sources
ENV_SOURCES = ('secretKeyRef', 'configMapKeyRef', 'fieldRef', 'resourceFieldRef')


def _env(value: Any) -> list:
    """The container's env: a string value is ``value`` (always a string), a dict one source (``valueFrom``)."""
    if value is None:
        return []
    if not isinstance(value, dict):
        _fail(f'env must be a dict, got {type(value).__name__}')
    out = []
    for name, source in sorted((str(k), v) for k, v in value.items()):
        if isinstance(source, dict):
            if (
                len(source) != 1
                or next(iter(source)) not in ENV_SOURCES
                or not isinstance(next(iter(source.values())), dict)
            ):
                _fail(
                    f"env {name}: a dict value is the variable's valueFrom: one of {', '.join(ENV_SOURCES)} with its "
                    f'fields, e.g. {{secretKeyRef: {{name: triton-secrets, key: token}}}}; got the keys {sorted(map(str, source))}'  # noqa: E501
                )
            out.append({'name': name, 'valueFrom': _plain(source)})
        elif isinstance(source, (list, tuple)):
            _fail(f'env {name}: a value is a string or a valueFrom dict, got a list')
        else:
            out.append({'name': name, 'value': str(source)})
    return out


def _plain(value: Any) -> Any:
    """value as plain Python types (Ansible hands tagged str, dict and list subclasses to filters)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


class _QuotedDumper(yaml.SafeDumper):
    """Every string double-quoted: what kubectl reads back is always the same string."""


_QuotedDumper.add_representer(
    str, lambda dumper, data: dumper.represent_scalar('tag:yaml.org,2002:str', data, style='"')
)


def manifest_text(documents: list) -> str:
    """The documents as one YAML stream (``---`` between them), keys in order, every string quoted."""
    return yaml.dump_all(
        [_plain(d) for d in documents],
        Dumper=_QuotedDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        explicit_start=True,
        indent=2,
        width=1 << 16,
    )


def _strings(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(f'{what} must be a dict, got {type(value).__name__}')
    return {str(k): str(v) for k, v in value.items()}


def _memory_limit(resources: dict, shm: dict | None, server_memory_bytes: int | None) -> tuple:
    """(resources with the memory limit decided, warnings)."""
    resources = {k: dict(v) if isinstance(v, dict) else v for k, v in resources.items()}
    limits = resources.setdefault('limits', {})
    if not isinstance(limits, dict):
        _fail(f'resources.limits must be a dict, got {limits!r}')
    if shm is None:
        return resources, []
    shm_bytes = quantity_bytes(shm['size_limit'], 'the /dev/shm sizeLimit')
    if 'memory' in limits:
        given = quantity_bytes(limits['memory'], 'resources.limits.memory')
        if given <= shm_bytes:
            _fail(
                f'resources.limits.memory {limits["memory"]} is not more than the /dev/shm sizeLimit {shm["size_limit"]}: '
                'a memory-backed emptyDir counts against the memory limit, so the server would be OOM-killed (or its '
                f'/dev/shm made smaller) when /dev/shm fills. {shm["notes"][1]}'
            )
        return resources, []
    if server_memory_bytes is None:
        return resources, [f'No memory limit is set. {shm["notes"][1]}']
    limits['memory'] = shm['memory_limit']
    requests = resources.setdefault('requests', {})
    if isinstance(requests, dict):
        requests.setdefault('memory', shm['memory_limit'])
    return resources, []


SWEEP_CONTAINER = 'shm-sweep'
SWEEP_TMP = 'shm-sweep-tmp'


def _sweep_container(image: str, image_pull: str, shm: dict, families: list) -> dict:
    """The initContainer that runs tritonops.shm.triton_shm_sweep on the pod's /dev/shm emptyDir before tritonserver
    starts (an image with ansible-core and the collection: the node agent's, docs/ee). It runs before every other
    container of the pod, so every process that may hold a file there is its own: clients_share_pid_namespace."""
    args = {'shm_dir': '/dev/shm', 'clients_share_pid_namespace': True, 'families': [str(f) for f in families]}
    return {
        'name': SWEEP_CONTAINER,
        'image': image,
        'imagePullPolicy': PULL_POLICY[image_pull],
        'command': [
            'ansible',
            'localhost',
            '--connection',
            'local',
            '--module-name',
            'tritonops.shm.triton_shm_sweep',
            '--args',
            json.dumps(args, sort_keys=True),
        ],
        'env': [
            {'name': 'HOME', 'value': '/tmp'},
            {'name': 'ANSIBLE_LOCAL_TEMP', 'value': '/tmp/ansible'},
            {'name': 'ANSIBLE_PYTHON_INTERPRETER', 'value': 'auto_silent'},
        ],
        'securityContext': {
            'runAsUser': 0,
            'runAsNonRoot': False,
            'allowPrivilegeEscalation': False,
            'capabilities': {'drop': ['ALL']},
        },
        'volumeMounts': [dict(shm['volume_mount']), {'name': SWEEP_TMP, 'mountPath': '/tmp'}],
    }


def _named(name: str, source: dict) -> dict:
    """A volume: its name first (and always ours: the mount refers to it), then its source."""
    return dict({'name': name}, **{k: v for k, v in source.items() if k != 'name'})


def triton_kubernetes(
    name: str,
    image: str,
    args: list | None = None,
    shm_bytes: Any = None,
    server_memory_bytes: Any = None,
    ipc_mode: str = 'private',
    namespace: str = 'default',
    replicas: Any = 1,
    image_pull: str = 'missing',
    http_port: Any = 8000,
    grpc_port: Any = 8001,
    metrics_port: Any = 8002,
    env: dict | None = None,
    labels: dict | None = None,
    gpus: Any = 0,
    resources: dict | None = None,
    model_volume: dict | None = None,
    model_repository: str = '',
    model_path: str = '/models',
    service_type: str = 'ClusterIP',
    share_process_namespace: bool = False,
    ready_timeout: Any = 180,
    sweep_image: str = '',
    sweep_families: list | None = None,
) -> dict:
    """A Deployment and a Service for one Triton server, with its /dev/shm as a memory-backed emptyDir (swept by an
    initContainer before tritonserver starts when sweep_image is given)."""
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
        _fail(f'the name must be a DNS-1123 label (lower case letters, digits and "-", at most 63), got {name!r}')
    if not isinstance(namespace, str) or not _DNS_LABEL.match(namespace):
        _fail(f'namespace must be a DNS-1123 label, got {namespace!r}')
    if not isinstance(image, str) or not image.strip():
        _fail(f'image must be an image reference, got {image!r}')
    if ipc_mode not in IPC_MODES:
        _fail(
            f"ipc_mode must be one of {', '.join(IPC_MODES)} with Kubernetes (a pod cannot join another container's "
            f'IPC namespace), got {ipc_mode!r}'
        )
    if image_pull not in PULL_POLICY:
        _fail(f'image_pull must be one of {", ".join(PULL_POLICY)}, got {image_pull!r}')
    if not isinstance(sweep_image, str):
        _fail(f'sweep_image must be an image reference or "", got {sweep_image!r}')
    if not isinstance(sweep_families, (list, type(None))) or any(not isinstance(f, str) for f in sweep_families or ()):
        _fail(f'sweep_families must be a list of family names, got {sweep_families!r}')
    if service_type not in SERVICE_TYPES:
        _fail(f'service_type must be one of ClusterIP, NodePort, LoadBalancer or "" (no Service), got {service_type!r}')
    if args is None:
        args = []
    if not isinstance(args, list):
        _fail(f'args must be a list of strings, got {type(args).__name__}')
    if resources is None:
        resources = {}
    if not isinstance(resources, dict):
        _fail(f'resources must be a dict (requests, limits), got {type(resources).__name__}')
    if model_volume is not None and not isinstance(model_volume, dict):
        _fail(
            f'model_volume must be a dict (a volume source such as {{persistentVolumeClaim: {{claimName: models}}}}), '
            f'got {type(model_volume).__name__}'
        )
    gpu_count = _int(gpus, 'gpus')
    ports = [
        (port_name, _int(port, f'{port_name}_port', 0, 65535))
        for port_name, port in (('http', http_port), ('grpc', grpc_port), ('metrics', metrics_port))
    ]
    http = ports[0][1]
    if http == 0:
        _fail('http_port must not be 0: the probes and the cleanup use the HTTP endpoint')
    ports = [(port_name, port) for port_name, port in ports if port > 0]

    shm = None
    if ipc_mode != 'host':
        memory = None if server_memory_bytes is None else size_bytes(server_memory_bytes, 'server_memory_bytes')
        shm = pod_shm(max(1, size_bytes(shm_bytes, 'shm_bytes')), memory)
    else:
        memory = None
    resources, warnings = _memory_limit(resources, shm, memory)
    if gpu_count:
        resources['limits']['nvidia.com/gpu'] = gpu_count
    if not resources['limits']:
        del resources['limits']

    selector = {'app.kubernetes.io/name': 'tritonserver', 'app.kubernetes.io/instance': name}
    all_labels = dict(_strings(labels, 'labels'), **selector)
    all_labels['app.kubernetes.io/managed-by'] = MANAGED_BY
    period = 5
    container = {
        'name': CONTAINER,
        'image': image.strip(),
        'imagePullPolicy': PULL_POLICY[image_pull],
        'args': [str(a) for a in args],
        'ports': [{'name': port_name, 'containerPort': port, 'protocol': 'TCP'} for port_name, port in ports],
        'env': _env(env),
        'resources': resources,
        'volumeMounts': [{'name': MODELS_VOLUME, 'mountPath': model_path, 'readOnly': True}],
        'startupProbe': {
            'httpGet': {'path': READY_PATH, 'port': 'http'},
            'periodSeconds': period,
            'failureThreshold': max(1, math.ceil(_int(ready_timeout, 'ready_timeout', 1) / period)),
        },
        'readinessProbe': {'httpGet': {'path': READY_PATH, 'port': 'http'}, 'periodSeconds': period},
        'livenessProbe': {'httpGet': {'path': LIVE_PATH, 'port': 'http'}, 'periodSeconds': 10, 'failureThreshold': 3},
    }
    if shm is not None:
        container['volumeMounts'].insert(0, shm['volume_mount'])
    if not model_volume:
        if not model_repository:
            _fail('give model_volume (a volume source) or model_repository (a hostPath on the node)')
        model_volume = {'hostPath': {'path': model_repository, 'type': 'Directory'}}
    pod_spec = {
        'containers': [container],
        'volumes': ([shm['volume']] if shm is not None else []) + [_named(MODELS_VOLUME, model_volume)],
    }
    if not container['env']:
        del container['env']
    if sweep_image.strip():
        if shm is None:
            warnings.append(
                "sweep_image: no initContainer with ipc_mode host: the node's /dev/shm is every pod's, and a pod without "
                'hostPID cannot see who holds its files (sweep it on the node: docs/prevention.md)'
            )
        else:
            pod_spec['initContainers'] = [_sweep_container(sweep_image.strip(), image_pull, shm, sweep_families or [])]
            pod_spec['volumes'].append({'name': SWEEP_TMP, 'emptyDir': {}})
    if ipc_mode == 'host':
        pod_spec['hostIPC'] = True
    if share_process_namespace:
        pod_spec['shareProcessNamespace'] = True
    metadata = {'name': name, 'namespace': namespace, 'labels': all_labels}
    deployment = {
        'apiVersion': 'apps/v1',
        'kind': 'Deployment',
        'metadata': metadata,
        'spec': {
            'replicas': _int(replicas, 'replicas'),
            'selector': {'matchLabels': selector},
            'template': {'metadata': {'labels': all_labels}, 'spec': pod_spec},
        },
    }
    documents = [deployment]
    service = None
    if service_type:
        service = {
            'apiVersion': 'v1',
            'kind': 'Service',
            'metadata': dict(metadata),
            'spec': {
                'type': service_type,
                'selector': selector,
                'ports': [
                    {'name': port_name, 'port': port, 'targetPort': port_name, 'protocol': 'TCP'}
                    for port_name, port in ports
                ],
            },
        }
        documents.append(service)
    return {
        'deployment': deployment,
        'service': service,
        'documents': documents,
        'manifest': manifest_text(documents),
        'url': f'http://{name}.{namespace}.svc:{http}' if service else None,
        'shm': shm,
        'memory_limit': resources.get('limits', {}).get('memory'),
        'warnings': warnings,
    }
