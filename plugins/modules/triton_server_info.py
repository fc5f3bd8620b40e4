#!/usr/bin/python
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: triton_server_info
short_description: List every Triton server of a host, with its ports, shm directory and container or pod
version_added: 0.2.0
description:
  - Finds every C(tritonserver) process of the host by itself, with no inventory and no URL, and never changes anything.
  - Per server, its listening HTTP, gRPC and metrics ports (read from its own sockets, and told apart by its command line's
    C(--http-port), C(--grpc-port), C(--metrics-port) or Triton's defaults 8000, 8001, 8002), a URL that reaches it from where
    the module runs, its shm directory (C(/proc/PID/root/dev/shm)) and the container or Kubernetes pod it runs in (from
    C(/proc/PID/cgroup)).
  - The entries are what M(tritonops.shm.triton_shm_info) and M(tritonops.shm.triton_shm_region) take, RV(servers[].url) as
    O(tritonops.shm.triton_shm_region#module:url) and RV(servers[].pid) as O(tritonops.shm.triton_shm_region#module:server_pid).
    The node agent (playbook C(tritonops.shm.node_agent)) cleans every server of its node this way.
  - "Only processes the module can see are listed. Run it on the host as root (C(become: true)), or in a container or pod
    with the host's PID namespace (C(hostPID: true), C(--pid host)). Elsewhere RV(complete) is false and a warning says
    why: the servers of other containers are invisible there."
author:
  - tritonops.shm developers (@tritonops)
attributes:
  check_mode:
    support: full
    description: The module never changes anything; it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Listing twice gives the same result when nothing else changed.
options:
  process_names:
    description:
      - The process names (C(/proc/PID/comm), at most 15 characters) of Triton servers.
    type: list
    elements: str
    default: [tritonserver]
  clients_share_pid_namespace:
    description:
      - Only for the completeness of the listing outside the host's initial PID namespace. See
        O(tritonops.shm.triton_shm_info#module:clients_share_pid_namespace).
      - V(true) asserts that every Triton server and client of interest runs in the module's own PID namespace.
    type: bool
    default: false
  probe_timeout:
    description:
      - "With a value above 0, each server's HTTP readiness check (C(GET /v2/health/ready)) is made, all servers at once, each
        bounded by this many seconds, and RV(servers[].answered_s) says how long it took (null: no answer in time). The
        node agent cleans the servers that answer first, so that processes that answer slowly cannot hold its round."
      - V(0) (the default) makes no request.
    type: float
    default: 0
    version_added: 0.3.0
notes:
  - The pod's name is its containers' C(/etc/hostname) (what the kubelet writes, unless the pod sets C(hostname) or runs
    with C(hostNetwork)); its namespace is the mounted service account's C(namespace) file, when mounted. The pod UID and
    the container id always come from the cgroup.
seealso:
  - module: tritonops.shm.triton_shm_info
  - module: tritonops.shm.triton_shm_region
"""

EXAMPLES = r"""
- name: List the Triton servers of this host
  tritonops.shm.triton_server_info:
  become: true
  register: triton

- name: Report each server's shared memory
  tritonops.shm.triton_shm_info:
    url: "{{ item.url }}"
    server_pid: "{{ item.pid }}"
  loop: "{{ triton.servers | selectattr('url') | list }}"
  loop_control:
    label: "{{ item.name }} {{ item.url }}"
  become: true
"""

RETURN = r"""
servers:
  description: Every Triton server process seen, in pid order.
  returned: always
  type: list
  elements: dict
  contains:
    pid: {description: The tritonserver process (as this host's /proc numbers it)., type: int, sample: 4711}
    comm: {description: Its process name., type: str, sample: tritonserver}
    uid: {description: The user id that owns the process., type: int, sample: 1000}
    name:
      description: Who it is, for people and metric labels (the container's pod or id, else C(tritonserver (pid N))).
      type: str
      sample: pod inference/triton-7d9f8-abcde
    url:
      description: The HTTP URL (else the gRPC URL) that reaches it from here; null when it has no listener reachable here.
      type: str
      sample: http://10.88.0.7:8000
    http_url: {description: "Its HTTP endpoint, or null.", type: str, sample: 'http://10.88.0.7:8000'}
    answered_s:
      description: "Seconds its readiness check took (O(probe_timeout)); null when it did not answer in time or was not probed."
      type: float
      sample: 0.004
      version_added: 0.3.0
    grpc_url: {description: "Its gRPC endpoint, or null.", type: str, sample: 'grpc://10.88.0.7:8001'}
    http_port: {description: "Its listening HTTP port, or null.", type: int, sample: 8000}
    grpc_port: {description: "Its listening gRPC port, or null.", type: int, sample: 8001}
    metrics_port: {description: "Its listening metrics port, or null.", type: int, sample: 8002}
    listeners:
      description: Every TCP socket it listens on.
      type: list
      elements: dict
      sample: [{address: 0.0.0.0, port: 8000, protocol: http}]
    shm_dir: {description: Its shm directory as seen from here., type: str, sample: /proc/4711/root/dev/shm}
    host_network: {description: Whether it shares the module's network namespace., type: bool}
    container:
      description:
        - The container or pod it runs in, from C(/proc/PID/cgroup); null when it runs on the host.
        - Keys when known, C(runtime) (docker, podman, containerd, cri-o, kubernetes), C(container_id), C(pod_uid), C(qos)
          (guaranteed, burstable, besteffort), C(podman_pod), C(pod_name), C(pod_namespace), and always C(name).
      type: dict
      sample: {runtime: containerd, container_id: 3f2a..., pod_uid: 5c1e2d4a-..., qos: burstable, name: pod inference/triton-0}
    warnings: {description: Why something of this server could not be read., type: list, elements: str}
complete:
  description:
    - Whether every server of the host could be seen. False outside the host's initial PID namespace (unless
      O(clients_share_pid_namespace)); RV(reason) says why.
  returned: always
  type: bool
reason:
  description: Why the listing is not complete; null when it is.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.tritonops.shm.plugins.module_utils.run import servers
from ansible_collections.tritonops.shm.plugins.module_utils.run.base import run_operation


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            process_names=dict(type='list', elements='str', default=list(servers.SERVER_COMMS)),
            clients_share_pid_namespace=dict(type='bool', default=False),
            probe_timeout=dict(type='float', default=0),
        ),
        supports_check_mode=True,
    )
    run_operation(module, servers.ServerList(module.params, module.warn))


if __name__ == '__main__':
    main()
