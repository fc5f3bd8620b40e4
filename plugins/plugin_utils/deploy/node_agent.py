# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Kubernetes node agent of tritonops.shm (a DaemonSet and/or CronJobs), as a pure function.

Private to the tritonops.shm collection: no stability promise to other code. Controller code (plugin_utils) that
the filter of the same job adapts (plugins/filter/); it imports what a filter may import (CONTRIBUTING.md, "Imports").

Documentation: plugins/filter/triton_node_agent.yml (``ansible-doc -t filter tritonops.shm.triton_node_agent``).

The round of the playbook tritonops.shm.node_agent (private filters, plugins/filter/_node_agent_*.yml): its clock
(node_agent_deadline, node_agent_time_left: the round's deadline and each server's, within it) and its queue
(node_agent_queue, node_agent_state: the servers that failed or were cut off last round go last, the oldest attempt
first among them, so that no server takes the front of the queue every round and none is left out for ever).
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any, NoReturn

from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.plugin_utils.deploy.kubernetes import PULL_POLICY, whole_number

MANAGED_BY = 'tritonops.shm.triton_node_agent'
CONTAINER = 'agent'
PLAYBOOK = 'tritonops.shm.node_agent'
KINDS = ('DaemonSet', 'CronJob')
# The capabilities the agent needs, each for one thing (docs/kubernetes.md, "The node agent's privileges"); measured by
# tests/integration/test_node_agent.py, which runs the agent with exactly these and with each one removed.
CAPABILITIES = {
    'SYS_PTRACE': "read other processes' /proc/PID/maps, /proc/PID/fd and /proc/PID/root (the holder scan and the "
    "server's /dev/shm): the kernel's ptrace read check, as root, on processes with capabilities the agent "
    'does not have',
    'DAC_READ_SEARCH': "list the fds of processes of other users (/proc/PID/fd is 0500, owned by the process's user)",
}
TEXTFILE_DIR = '/var/lib/node_exporter/textfile_collector'
# the round's memory (playbooks/node_agent.yml, node_agent_state_file): a hostPath, so that it outlives a CronJob's pod
STATE_DIR = '/var/lib/tritonops-shm'
# a CronJob's Job is killed after this; the round's own deadline (node_agent_round_timeout) ends it well before
JOB_DEADLINE = 900
ROUND_TIMEOUT = 240
_DNS_LABEL = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')
_DNS_SUBDOMAIN = re.compile(r'^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')


def _fail(msg: str, exc: BaseException | None = None) -> NoReturn:
    raise AnsibleFilterError(f'triton_node_agent: {msg}', orig_exc=exc)


def _int(value: Any, what: str, minimum: int) -> int:
    return whole_number(value, what, _fail, minimum)


def _round_timeout(value: Any, interval: Any) -> int:
    """The round's own deadline: below the CronJob's activeDeadlineSeconds and at most the DaemonSet's interval."""
    limit = JOB_DEADLINE - 60  # the pod's start and the playbook's own, before the round's clock
    if interval is not None:
        limit = min(limit, _int(interval, 'interval', 10))
    if value is None:
        return min(ROUND_TIMEOUT, limit)
    seconds = _int(value, 'round_timeout', 10)
    if seconds > limit:
        _fail(
            f'round_timeout must be at most {limit} s (below the Job deadline of {JOB_DEADLINE} s and the '
            f'DaemonSet interval), got {seconds}'
        )
    return seconds


RUN = f'ansible-playbook -i "$NODE_NAME," -e target="$NODE_NAME" -e "$AGENT_VARS" {PLAYBOOK}'


def _command(interval: int | None) -> list[str]:
    """The agent's shell command: the playbook once (a CronJob), or in a loop every interval seconds (a DaemonSet)."""
    run = RUN
    if interval is None:
        return ['/bin/sh', '-c', f'exec {run}']
    # a failed round (a server down, an incomplete scan) is reported and the loop goes on
    return ['/bin/sh', '-c', f'while true; do {run} || echo "node agent: round failed ($?)"; sleep {interval}; done']


def triton_node_agent(
    image: str,
    name: str = 'tritonops-shm-agent',
    namespace: str = 'tritonops-shm',
    kinds: Any = ('DaemonSet',),
    interval: Any = 300,
    schedule: str = '*/10 * * * *',
    nodes: Any = None,
    node_selector: dict | None = None,
    tolerations: list | None = None,
    extra_vars: dict | None = None,
    prometheus_textfile_dir: str = TEXTFILE_DIR,
    capabilities: Any = None,
    apparmor_profile: str | None = None,
    image_pull: str = 'missing',
    resources: dict | None = None,
    labels: dict | None = None,
    nvml: bool = False,
    runtime_class: str = 'nvidia',
    round_timeout: Any = None,
) -> dict:
    """The node agent's manifests: a DaemonSet running the node_agent playbook in a loop and/or one CronJob per node."""
    if not isinstance(image, str) or not image.strip():
        _fail(f'image must be an image reference (the execution environment built from docs/ee), got {image!r}')
    for what, value, pattern, limit in (('name', name, _DNS_LABEL, 52), ('namespace', namespace, _DNS_LABEL, 63)):
        if not isinstance(value, str) or len(value) > limit or not pattern.match(value):
            _fail(f'{what} must be a DNS-1123 label of at most {limit} characters, got {value!r}')
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or ())
    if not kinds or any(k not in KINDS for k in kinds):
        _fail(f'kinds must list DaemonSet and/or CronJob, got {kinds!r}')
    if image_pull not in PULL_POLICY:
        _fail(f'image_pull must be one of {", ".join(PULL_POLICY)}, got {image_pull!r}')
    nodes = [nodes] if isinstance(nodes, str) else list(nodes or ())
    if 'CronJob' in kinds and not nodes:
        _fail('a CronJob runs on one node: give nodes (the node names, one CronJob each), or use the DaemonSet')
    for node in nodes:
        if not isinstance(node, str) or len(node) > 253 or not _DNS_SUBDOMAIN.match(node):
            _fail(f'nodes: {node!r} is not a node name')
    caps = sorted(CAPABILITIES) if capabilities is None else sorted({str(c).upper() for c in capabilities})
    if apparmor_profile not in (None, 'RuntimeDefault', 'Unconfined'):
        _fail(f'apparmor_profile must be RuntimeDefault or Unconfined, got {apparmor_profile!r}')
    if not isinstance(nvml, bool):
        _fail(f'nvml must be true or false, got {nvml!r}')
    if nvml and (
        not isinstance(runtime_class, str) or len(runtime_class) > 253 or not _DNS_SUBDOMAIN.match(runtime_class)
    ):
        _fail(f'runtime_class must be the name of a RuntimeClass, got {runtime_class!r}')
    agent_vars = {
        'prometheus_textfile_dir': TEXTFILE_DIR if prometheus_textfile_dir else '',
        'node_agent_round_timeout': _round_timeout(round_timeout, interval if 'DaemonSet' in kinds else None),
    }
    agent_vars.update(extra_vars or {})

    selector = {'app.kubernetes.io/name': 'tritonops-shm-agent', 'app.kubernetes.io/instance': name}
    all_labels = {str(k): str(v) for k, v in (labels or {}).items()}
    all_labels.update(selector)
    all_labels['app.kubernetes.io/managed-by'] = MANAGED_BY
    security = {
        'runAsUser': 0,
        'runAsNonRoot': False,
        'privileged': False,
        'allowPrivilegeEscalation': False,
        'readOnlyRootFilesystem': True,
        'capabilities': {'drop': ['ALL'], 'add': caps},
        'seccompProfile': {'type': 'RuntimeDefault'},
    }
    if apparmor_profile:
        security['appArmorProfile'] = {'type': apparmor_profile}
    # the run locks need a directory only root can write (runlock.py): the root filesystem is read-only and /tmp is
    # every user's, so an emptyDir at /run/tritonops_shm (the module makes it private, mode 0700)
    mounts = [
        {'name': 'tmp', 'mountPath': '/tmp'},
        {'name': 'locks', 'mountPath': '/run/tritonops_shm'},
        {'name': 'state', 'mountPath': STATE_DIR},
    ]
    volumes: list[dict] = [
        {'name': 'tmp', 'emptyDir': {}},
        {'name': 'locks', 'emptyDir': {}},
        {'name': 'state', 'hostPath': {'path': STATE_DIR, 'type': 'DirectoryOrCreate'}},
    ]
    if prometheus_textfile_dir:
        mounts.append({'name': 'textfile', 'mountPath': TEXTFILE_DIR})
        volumes.append({'name': 'textfile', 'hostPath': {'path': prometheus_textfile_dir, 'type': 'DirectoryOrCreate'}})

    def pod_spec(interval_s: int | None, affinity_node: str | None) -> dict:
        container = {
            'name': CONTAINER,
            'image': image.strip(),
            'imagePullPolicy': PULL_POLICY[image_pull],
            'command': _command(interval_s),
            'env': [
                {'name': 'NODE_NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'spec.nodeName'}}},
                {'name': 'AGENT_VARS', 'value': json.dumps(agent_vars, sort_keys=True)},
                {'name': 'HOME', 'value': '/tmp'},
                {'name': 'ANSIBLE_LOCAL_TEMP', 'value': '/tmp/ansible'},
                {'name': 'ANSIBLE_PYTHON_INTERPRETER', 'value': 'auto_silent'},
            ]
            # the CUDA rule reads NVML: the NVIDIA runtime mounts libnvidia-ml and the device nodes of every GPU, and
            # 'utility' is the capability NVML needs; no nvidia.com/gpu is requested, so no GPU is taken from a workload
            + (
                [
                    {'name': 'NVIDIA_VISIBLE_DEVICES', 'value': 'all'},
                    {'name': 'NVIDIA_DRIVER_CAPABILITIES', 'value': 'utility'},
                ]
                if nvml
                else []
            ),
            'securityContext': security,
            'resources': resources or {'requests': {'cpu': '50m', 'memory': '128Mi'}, 'limits': {'memory': '512Mi'}},
            'volumeMounts': mounts,
        }
        spec: dict[str, Any] = {
            'hostPID': True,  # the holder scan must see every process of the node (issue 25's visibility rule)
            'automountServiceAccountToken': False,  # the agent never talks to the Kubernetes API
            'containers': [container],
            'volumes': volumes,
            'tolerations': list(tolerations) if tolerations is not None else [{'operator': 'Exists'}],
        }
        if nvml:
            spec['runtimeClassName'] = runtime_class
        if node_selector:
            spec['nodeSelector'] = {str(k): str(v) for k, v in node_selector.items()}
        if affinity_node is not None:
            spec['affinity'] = {
                'nodeAffinity': {
                    'requiredDuringSchedulingIgnoredDuringExecution': {
                        'nodeSelectorTerms': [
                            {
                                'matchExpressions': [
                                    {'key': 'kubernetes.io/hostname', 'operator': 'In', 'values': [affinity_node]}
                                ]
                            }
                        ]
                    }
                }
            }
            spec['restartPolicy'] = 'Never'
        return spec

    metadata = {'name': name, 'namespace': namespace, 'labels': all_labels}
    documents = []
    daemonset = None
    cronjobs = []
    if 'DaemonSet' in kinds:
        daemonset = {
            'apiVersion': 'apps/v1',
            'kind': 'DaemonSet',
            'metadata': metadata,
            'spec': {
                'selector': {'matchLabels': selector},
                'updateStrategy': {'type': 'RollingUpdate'},
                'template': {
                    'metadata': {'labels': all_labels},
                    'spec': pod_spec(_int(interval, 'interval', 10), None),
                },
            },
        }
        documents.append(daemonset)
    if 'CronJob' in kinds:
        if not isinstance(schedule, str) or len(schedule.split()) not in (5, 1):
            _fail(f'schedule must be a cron schedule such as "*/10 * * * *", got {schedule!r}')
        for node in nodes:
            job_name = f'{name}-{node}'[:52].rstrip('-.').replace('.', '-')
            job_labels = dict(all_labels, **{'tritonops.shm/node': node[:63]})
            cronjobs.append(
                {
                    'apiVersion': 'batch/v1',
                    'kind': 'CronJob',
                    'metadata': {'name': job_name, 'namespace': namespace, 'labels': job_labels},
                    'spec': {
                        'schedule': schedule,
                        'concurrencyPolicy': 'Forbid',
                        'successfulJobsHistoryLimit': 1,
                        'failedJobsHistoryLimit': 3,
                        'jobTemplate': {
                            'spec': {
                                'backoffLimit': 0,
                                'activeDeadlineSeconds': JOB_DEADLINE,
                                'template': {'metadata': {'labels': job_labels}, 'spec': pod_spec(None, node)},
                            }
                        },
                    },
                }
            )
        documents.extend(cronjobs)
    namespace_doc = {
        'apiVersion': 'v1',
        'kind': 'Namespace',
        'metadata': {
            'name': namespace,
            'labels': {'pod-security.kubernetes.io/enforce': 'privileged', 'app.kubernetes.io/managed-by': MANAGED_BY},
        },
    }
    return {
        'namespace': namespace_doc,
        'daemonset': daemonset,
        'cronjobs': cronjobs,
        'documents': [namespace_doc] + documents,
        'capabilities': {c: CAPABILITIES.get(c, 'given by the caller') for c in caps},
        'command': RUN,
    }


# -- the round (playbooks/node_agent.yml) ---------------------------------------------------------------------------

STATE_VERSION = 1
# a server that failed is remembered this long without being seen again (a pod gone for good), then forgotten
STATE_KEEP = 7 * 24 * 3600
# the statuses a server's row may have; 'not_reached': the round's deadline passed before its turn
NOT_REACHED = 'not_reached'


def node_agent_deadline(seconds: Any, within: Any = None, now: float | None = None) -> float:
    """The epoch time seconds from now, or within (an epoch time) when that comes first."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError) as exc:
        _fail(f'a bound must be a number of seconds, got {seconds!r}', exc)
    if not math.isfinite(seconds) or seconds <= 0:
        _fail(f'a bound must be a positive number of seconds, got {seconds!r}')
    deadline = (time.time() if now is None else now) + seconds
    return deadline if within in (None, '') else min(deadline, float(within))


def node_agent_time_left(deadline: Any, now: float | None = None) -> int:
    """Whole seconds left before deadline (an epoch time), 0 when it has passed."""
    return max(0, int(float(deadline) - (time.time() if now is None else now)))


def _key(server: dict) -> str:
    """What the state remembers a server by: its name (container or pod, or process and pid) and its URL."""
    return f'{server.get("name")} {server.get("url")}'


def _state(state: Any) -> dict:
    """The remembered servers of a state file's text (or its parsed JSON); {} for anything else: no memory is kept
    of a file that is missing, unreadable or not this playbook's."""
    if isinstance(state, (str, bytes)):
        try:
            state = json.loads(state or '{}')
        except ValueError:
            return {}
    if (
        not isinstance(state, dict)
        or state.get('version') != STATE_VERSION
        or not isinstance(state.get('servers'), dict)
    ):
        return {}
    return {
        str(k): v
        for k, v in state['servers'].items()
        if isinstance(v, dict) and isinstance(v.get('attempted'), (int, float))
    }


def node_agent_queue(servers: Any, state: Any = None) -> list:
    """The servers in the order of the round: those the last rounds did not see fail first, those among them that
    answered triton_server_info's probe before those that did not (quickest first, then by pid), then those that
    failed, timed out or were not reached, the oldest attempt first (a server cut off by the round's deadline keeps its
    older attempt, so it comes before the ones tried last round)."""
    remembered = _state(state)

    def order(server: dict) -> tuple:
        seen = remembered.get(_key(server))
        pid = server.get('pid') or 0
        if seen:
            return (2, seen['attempted'], pid)
        # never failed yet: those that answered the probe (triton_server_info probe_timeout) first, the quickest first
        answered = server.get('answered_s')
        return (0, answered, pid) if isinstance(answered, (int, float)) else (1, 0, pid)

    return sorted((s for s in servers or () if isinstance(s, dict)), key=order)


def node_agent_state(rows: Any, state: Any = None, now: float | None = None) -> dict:
    """The state file after a round: each server whose row failed, with the time of this attempt and why; a server that
    was not reached keeps what was known of it; a server cleaned is forgotten, and so is one not seen for STATE_KEEP."""
    now = time.time() if now is None else now
    servers = {k: v for k, v in _state(state).items() if now - v['attempted'] < STATE_KEEP}
    for row in rows or ():
        if not isinstance(row, dict):
            continue
        key = _key(row)
        status = row.get('status')
        if status == NOT_REACHED:
            continue
        if status == 'failed':
            error = row.get('error') or {}
            servers[key] = {
                'attempted': round(now, 3),
                'step': error.get('step') or '',
                'msg': str(error.get('msg') or '')[:500],
            }
        else:
            servers.pop(key, None)
    return {'version': STATE_VERSION, 'servers': servers}
