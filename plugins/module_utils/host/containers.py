# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which container or Kubernetes pod a process belongs to, from /proc/PID/cgroup alone.

Private to the tritonops.shm collection. Standard library only.

The container engines name a container's cgroup after its id, and the kubelet a pod's after its UID and QoS class:

    docker        /system.slice/docker-ID.scope            /docker/ID (cgroupfs)
    podman        /machine.slice/libpod-ID.scope           /libpod_parent/libpod-ID, /libpod_parent/POD_ID/libpod-ID
                  /machine.slice/machine-libpod_pod_POD_ID.slice/libpod-ID.scope
    containerd    .../cri-containerd-ID.scope              cri-o: .../crio-ID.scope
    kubelet       /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podUID_WITH_UNDERSCORES.slice/...
                  /kubepods/besteffort/podUID/ID (cgroupfs); Guaranteed pods sit directly under kubepods

The path is searched anywhere in the line: read from a container with its own cgroup namespace (an agent pod), other
processes' paths start with ``/..``. The pod's name and namespace are not in the cgroup: they are read, for the few
processes asked about, from the container's own files as the kubelet writes them (``/etc/hostname`` is the pod's
name; the service account's ``namespace`` file when it is mounted), resolved inside the container's root: a pod that
makes its ``/etc/hostname`` a symlink to ``/etc/shadow`` reads its own, not the node's (rootfs.py). No engine API and no
Kubernetes API is asked.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.host import rootfs
from ansible_collections.tritonops.shm.plugins.module_utils.host.procfs import read_bytes

_ID = r'[0-9a-f]{64}'
_CONTAINER = re.compile(rf'(?:^|[/.-])(docker|libpod|cri-containerd|crio|containerd)-({_ID})(?:\.scope)?(?:/|$)')
_CGROUPFS_DOCKER = re.compile(rf'/docker/({_ID})(?:/|$)')
_BARE_ID = re.compile(rf'(?:^|/)({_ID})(?:/|$)')
_PODMAN_POD = re.compile(rf'(?:/libpod_parent/|machine-libpod_pod_)({_ID})(?:\.slice)?/')
_KUBEPODS = re.compile(r'kubepods(?:[-/.]|$)')
_QOS = re.compile(r'kubepods[-/.](burstable|besteffort)[-/.]')
_POD_UID = re.compile(
    r'pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)'
)
RUNTIMES = {
    'docker': 'docker',
    'libpod': 'podman',
    'cri-containerd': 'containerd',
    'containerd': 'containerd',
    'crio': 'cri-o',
}
SA_NAMESPACE = '/run/secrets/kubernetes.io/serviceaccount/namespace'
_SA_NAMESPACE_OLD = '/var/run/secrets/kubernetes.io/serviceaccount/namespace'
SHORT_ID = 12


class Identity(NamedTuple):
    """Where a process runs, as far as the host shows it. Every field is None when it does not apply or is not shown.

    runtime: docker, podman, containerd, cri-o, or kubernetes (a pod's container of unknown runtime);
    container_id: the full id; pod_uid: the Kubernetes pod's UID (dashes); qos: guaranteed, burstable, besteffort;
    podman_pod: a podman pod's id; pod_name / pod_namespace: read from the container's files (see the module doc).
    """

    runtime: str | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    qos: str | None = None
    podman_pod: str | None = None
    pod_name: str | None = None
    pod_namespace: str | None = None

    @property
    def found(self) -> bool:
        return self.container_id is not None or self.pod_uid is not None

    @property
    def label(self) -> str:
        """One short, bounded name for people and metric labels: 'pod NS/NAME', 'pod UID', 'podman c0ffee12ab34'."""
        if self.pod_uid is not None:
            if self.pod_name:
                return f'pod {self.pod_namespace}/{self.pod_name}' if self.pod_namespace else f'pod {self.pod_name}'
            return f'pod {self.pod_uid}'
        if self.podman_pod is not None:
            return f'podman pod {self.podman_pod[:SHORT_ID]} container {(self.container_id or "?")[:SHORT_ID]}'
        if self.container_id is not None:
            return f'{self.runtime or "container"} {self.container_id[:SHORT_ID]}'
        return 'host'

    def as_dict(self) -> dict[str, object]:
        """The result form: the fields that are known, plus the label."""
        fields = {
            'runtime': self.runtime,
            'container_id': self.container_id,
            'pod_uid': self.pod_uid,
            'qos': self.qos,
            'podman_pod': self.podman_pod,
            'pod_name': self.pod_name,
            'pod_namespace': self.pod_namespace,
        }
        out: dict[str, object] = {k: v for k, v in fields.items() if v is not None}
        out['name'] = self.label
        return out


def parse_cgroup(text: str) -> Identity:
    """The identity in the text of a /proc/PID/cgroup (v1 or v2; the unified line '0::' first)."""
    lines = text.splitlines()
    paths = [line.split(':', 2)[2] for line in lines if line.startswith('0::') and line.count(':') >= 2]
    paths += [line.split(':', 2)[2] for line in lines if not line.startswith('0::') and line.count(':') >= 2]
    for path in paths:
        found = _parse_path(path)
        if found.found:
            return found
    return Identity()


def _parse_path(path: str) -> Identity:
    runtime = container_id = pod_uid = qos = podman_pod = None
    match = _CONTAINER.search(path)
    if match:
        runtime, container_id = RUNTIMES[match.group(1)], match.group(2)
    else:
        match = _CGROUPFS_DOCKER.search(path)
        if match:
            runtime, container_id = 'docker', match.group(1)
    pod = _PODMAN_POD.search(path)
    if pod and runtime == 'podman':
        podman_pod = pod.group(1)
    if _KUBEPODS.search(path):
        uid = _POD_UID.search(path)
        if uid:
            pod_uid = uid.group(1).replace('_', '-')
            qos_match = _QOS.search(path)
            qos = qos_match.group(1) if qos_match else 'guaranteed'
            if container_id is None:
                bare = _BARE_ID.search(path[uid.end() :])
                if bare:
                    runtime, container_id = 'kubernetes', bare.group(1)
    return Identity(runtime, container_id, pod_uid, qos, podman_pod)


def _first_line(root: str, path: str) -> str | None:
    """The first line of a small file of another process's root, read as that process sees it (rootfs.read_small: its
    symlinks resolved inside that root, never outside it, a FIFO never waited on), or None."""
    data = rootfs.read_small(root, path, limit=256)
    text = (data or '').strip().splitlines()
    return text[0].strip() if text and text[0].strip() else None


def identity(pid: int, proc: str = '/proc') -> Identity:
    """The identity of one process: its cgroup, and for a pod its name and namespace (two small reads)."""
    try:
        text = read_bytes(f'{proc}/{pid}/cgroup').decode('utf-8', 'replace')
    except OSError:
        return Identity()
    found = parse_cgroup(text)
    if found.pod_uid is not None:
        root = f'{proc}/{pid}/root'
        namespace = _first_line(root, SA_NAMESPACE) or _first_line(root, _SA_NAMESPACE_OLD)
        found = found._replace(pod_name=_first_line(root, '/etc/hostname'), pod_namespace=namespace)
    return found
