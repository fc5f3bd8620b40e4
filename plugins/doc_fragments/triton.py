# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    # Connection options shared by every module (argument spec: module_utils/run/base.py, connection_argument_spec)
    DOCUMENTATION = r"""
options:
  url:
    description:
      - URL of the Triton Inference Server, for example V(http://127.0.0.1:8000).
      - The scheme picks the transport. V(http://HOST:PORT) or V(https://HOST:PORT) for Triton's HTTP endpoint
        (C(--http-port), 8000 by default); a URL without scheme is taken as C(http://).
      - V(grpc://HOST:PORT), or V(grpcs://HOST:PORT) for TLS, for Triton's gRPC endpoint (C(--grpc-port), 8001 by default,
        also when the port is left out), for example when Triton runs with C(--allow-http=false).
        Results, states and errors are the same; C(failure.status) is then the gRPC status code name (see the notes).
      - Region names an HTTP path cannot carry (space, C(#), C(?), C(/), non-ASCII) can only be unregistered over gRPC;
        over HTTP they are skipped with that reason.
      - A C(user:password@) part is refused (the modules never send it, and it would show in outputs, reports and
        metrics labels); give credentials in O(headers), for example C(Authorization). The message shows the URL as
        C(http://***@HOST:PORT).
      - If not set, the environment variable E(TRITON_URL) is used.
      - The port also identifies the server process on the host (see O(server_pid)).
    type: str
    required: true
  timeout:
    description:
      - Seconds each HTTP request or gRPC call may take as a whole, from connecting to the last byte of the answer
        (a gRPC deadline). A server that trickles its answer is cut at this deadline, even when every byte comes in time.
      - Answers larger than 64 MiB (a status of 100,000 regions is about 15 MiB) fail with a message naming the URL.
    type: float
    default: 10.0
  validate_certs:
    description:
      - Verify the server's TLS certificate for C(https) and C(grpcs) URLs.
      - Set to V(false) only for testing; the module then warns.
      - V(false) is refused for C(grpcs) URLs (grpcio always verifies); set O(ca_path) instead.
    type: bool
    default: true
  ca_path:
    description:
      - PEM file of CA certificates to verify the server with, instead of the system store
        (for C(grpcs) URLs, instead of grpcio's bundled root certificates). May be a directory of PEM files.
    type: path
  headers:
    description:
      - Extra HTTP headers sent with every request, for example an C(Authorization) header for a proxy in front of Triton.
      - A server started with C(--http-restricted-api=shared-memory:KEY=VALUE) needs the header C(KEY) with that value
        here; over gRPC (C(--grpc-restricted-protocol=shared-memory:KEY=VALUE)) its name is C(triton-grpc-protocol-KEY).
        Without it the module fails naming this option and the header the server expects.
      - Over gRPC they are sent as metadata with lower-case names; names must be letters, digits and C(-_.),
        values printable ASCII.
      - Never logged or returned. A name that is not an HTTP token, or a value with a control character (a line break, which
        a YAML block scalar C(|) ends in; CR, NUL, ESC) or surrounding blanks, is refused before anything is sent,
        naming the header and never showing the value.
    type: dict
    default: {}
  client_cert:
    description:
      - PEM client certificate for mutual TLS. May contain the key too.
    type: path
  client_key:
    description:
      - PEM private key for O(client_cert), when the certificate file does not contain it. Requires O(client_cert); a key
        alone is refused before anything is sent, and so is an encrypted key (no passphrase is asked for).
    type: path
attributes:
  action_group:
    description: Use C(group/tritonops.shm.triton) in C(module_defaults) to set the connection options.
    support: full
    membership:
      - tritonops.shm.triton
notes:
  - C(http) and C(https) URLs need nothing beyond Python's standard library on the host that runs the module (the Triton host);
    C(grpc) and C(grpcs) URLs need C(tritonclient[grpc]) there (which brings C(grpcio) and Triton's protobuf messages).
  - Over C(http) and C(https), one connection is kept alive for the module's requests; redirects are not followed. An HTTP
    proxy named by the environment (C(http_proxy), C(https_proxy), C(all_proxy), except the hosts in C(no_proxy)) is used,
    C(https) through a C(CONNECT) tunnel. Without O(ca_path), certificates are verified against the system's CA store.
  - Member of the action group C(tritonops.shm.triton), so C(module_defaults) can set the connection options once per play.
  - When a request to Triton fails or its answer is refused, the result has C(failure) with C(url) (of the request),
    C(status), C(server_error) (Triton's own message, or V(null)) and, when the transport raised it, C(transport)
    (V(http) or V(grpc)). C(status) is the transport's own code, V(null) when no answer came (refused, unreachable, timeout,
    TLS), else the HTTP status as an integer (for example V(400)) over C(http) and C(https) URLs, the gRPC status code name as a
    string (for example V(INTERNAL)) over C(grpc) and C(grpcs) URLs; C(transport) says which. Conditions such as "in use" are
    recognised from Triton's answer the same way over both. A failure before any request (a refused option) has no C(failure).
"""

    # Options that say where the server's shared memory lives on this host
    SHM_DIR = r"""
options:
  server_pid:
    description:
      - PID of the C(tritonserver) process on this host, as seen from the host's PID namespace.
      - By default the module finds it itself from the O(url), as the process listening on its port, or else the
        C(tritonserver) at the other end of a TCP connection to it, followed through network namespaces (a container or pod IP),
        C(docker-proxy), NAT (podman, C(--userland-proxy=false)) or any forwarder.
      - The server process maps every registered file but never counts as a client holder.
    type: int
  shm_dir:
    description:
      - The directory that is the server's C(/dev/shm), as seen from this host.
      - By default C(/proc/PID/root/dev/shm) of the server process, which is the container's private C(/dev/shm)
        when Triton runs in a container (its size is the container's C(--shm-size)), or the host's C(/dev/shm) with C(--ipc=host).
    type: path
  clients_share_pid_namespace:
    description:
      - "Where the module can see every client. A holder scan sees every process of the machine only from the host's initial
        PID namespace: the host, a container run with C(--pid host), a pod with C(hostPID), the node agent of
        docs/kubernetes.md. Run anywhere else (inside the Triton container with C(docker exec), C(podman exec) or a container
        connection plugin, a sidecar of a pod without C(hostPID)), the clients in other containers are invisible, so the
        holders are incomplete (RV(holders_complete=false), the reason in RV(holders_incomplete_reason) and a warning): no
        region is stale, no file an orphan, no dangling region reclaimable, and nothing is removed."
      - V(true) states that every client of the server runs in the module's own PID namespace, so the scan is complete there,
        for example an all-in-one container that runs the clients too, a pod with C(shareProcessNamespace), or a system
        container (LXD, a kind node). The module cannot check this statement.
      - A wrong V(true) loses live data. A client in another PID namespace then looks gone, its region stale, and a cleanup
        unregisters the region and unlinks the file it still uses; its next inference fails.
      - In the host's initial PID namespace it changes nothing (RV(pid_namespace=initial)).
    type: bool
    default: false
    version_added: 0.2.0
"""

    # Which files of the shm directory belong to Triton's python backend
    BACKEND = r"""
options:
  backend_patterns:
    description:
      - Shell-style patterns (case-sensitive) of the files Triton's Python-based backends keep in the shm directory. Such files
        are category V(backend), never an orphan (whatever O(orphan_patterns) says, V(*) included), never foreign, never
        removed while any process holds them, and never accepted as the key of a client region.
      - Such a file that no process maps or holds (a complete holder scan), older than O(min_age), is V(leftover), the pool of a
        server and its python stubs that died together. Only M(tritonops.shm.triton_shm_region) with
        O(tritonops.shm.triton_shm_region#module:backend_leftovers=true) removes it.
      - "Every Python-based backend (python, vllm, ...) names its files C(triton_<backend>_backend_shm_region_<uuid>) (a counter
        instead of the UUID before Triton 24.04). That form is always a backend file, whatever this list says: the patterns
        given here add to it and never replace it. The file record's C(backend) says whose file it is."
      - "A prefix that a server sets on its own command line (C(--backend-config=python,shm-region-prefix-name=PREFIX)) is read
        from it, also for the other servers (ranks) sharing its C(/dev/shm): add a pattern only for a server whose command
        line cannot be read."
    type: list
    elements: str
    default: ["triton_*_backend_shm_region_*"]
    version_added: 0.2.0
  client_users:
    description:
      - "User names or numeric uids (as seen from this host) whose files a cleanup may remove, besides the server process's
        own user (its filesystem uid as the host sees it: V(0) for Triton run by root or in a rootful container, the user
        who runs a rootless container)."
      - "The owner rule: a file owned by anyone else is never removed, neither as the backing file of a region a client
        registered (the region is still unregistered; its file is kept, with the reason in C(skipped_items) of
        M(tritonops.shm.triton_shm_region)) nor as an orphan (it is V(foreign), with the reason)."
      - "Whatever this list says, a file the server's own user could not remove itself (the kernel's permission rules of
        its shm directory, for a server that is not root on this host) is never removed: running as root, the modules
        never lend the server more authority than it has (docs/concepts.md)."
      - Add the users your clients run as when they are not the server's user, for example V(1000).
    type: list
    elements: str
    default: []
    version_added: 0.2.0
"""

    # The call's own time limit (argument spec: module_utils/run/base.py, time_limit_argument_spec; wire/time_limit.py)
    TIME_LIMIT = r"""
options:
  time_limit:
    description:
      - Seconds this call may take as a whole. The module keeps this deadline itself. Each request to Triton is bounded
        by the time left (its O(timeout), or less), no request is sent once it has passed, and at the deadline the call
        stops where it is and fails with what it did so far. A call still running 2 seconds later exits at once.
      - "Ansible's task keyword C(timeout) only stops waiting for a module, which then goes on by itself: give
        O(time_limit) a little below the task's C(timeout) (the role tritonops.shm.shm_cleanup does, from
        C(shm_cleanup_task_timeout))."
      - Stopping part-way is safe. A cleanup marks its files before it unregisters their regions, so the next run
        converges, as after a kill (docs/concepts.md).
      - Not set (the default), no limit but O(timeout) per request.
    type: float
    version_added: 0.3.0
"""

    # When a region Triton will not let go is wedged (argument spec: module_utils/run/base.py, wedged_argument_spec)
    WEDGED = r"""
options:
  wedged_after:
    description:
      - "A region that no process but the server holds is V(wedged), not V(stale), once Triton has refused its unregister as
        in use, or left it pending, on this many consecutive cleanup runs of the same server process (Triton 2.53 and later:
        a reference leaked inside the server, server issue 7688). Only a restart of the server frees it."
      - "M(tritonops.shm.triton_shm_region) counts the runs in a small record beside its run lock (its
        O(tritonops.shm.triton_shm_region#module:lock_dir)) and tries a wedged region once a run, never waiting its refusal out."
    type: int
    default: 3
    version_added: 0.3.0
  extra_families:
    description:
      - "Families of other software's files of your own, added before the built-in table (NCCL, vLLM, SGLang, Python's
        shared_memory, PyTorch, PSM, MPI/UCX, CUDA IPC, POSIX semaphores and others; docs/shm-families.md). Each is a dict
        with C(name), C(patterns) (shell-style) and an optional C(description). A file of a family is never an orphan,
        and M(tritonops.shm.triton_shm_info) counts the files that are not Triton's by family (its C(families))."
    type: list
    elements: dict
    default: []
    version_added: 0.3.0
"""

    # The node_exporter textfile the module call writes (argument spec: module_utils/run/base.py, metrics_argument_spec)
    METRICS = r"""
options:
  metrics_dir:
    description:
      - Directory of a node_exporter textfile collector on this host, for example V(/var/lib/node_exporter/textfile_collector).
        The call that reads the server also writes its metrics there (docs/metrics.md), so no task is needed for them.
      - One file per O(metrics_host) and O(url), so several servers on one machine (several inventory hosts or several URLs)
        keep their own files and series; every series has the labels C(host) (O(metrics_host)) and C(triton_url) (O(url)).
      - Written atomically (a temporary file in the same directory, then a rename), mode C(0644). Never a change, never in
        check mode.
      - A directory that is missing, a symlink, reached through a symlink, or not writable gets one warning and nothing written;
        the task does not fail for it.
      - Not set (the default), nothing is written.
    type: path
    version_added: 0.2.0
  metrics_dir_missing:
    description:
      - What a O(metrics_dir) that does not exist on this host gives. V(warn) (the default) a warning. V(skip) no warning and
        nothing written; the result's C(metrics_skipped) says why, so that a playbook run over a fleet where only some hosts
        run node_exporter says it once (the report and cleanup playbooks do, when C(prometheus_textfile_dir) is not set).
      - A directory that is a symlink, reached through one, or not writable always warns.
    type: str
    choices: [warn, skip]
    default: warn
    version_added: 0.3.0
  metrics_host:
    description:
      - The inventory host the metrics belong to, normally the play's C(inventory_hostname). It is the
        C(host) label of every series
        and part of the file name. Required with O(metrics_dir).
    type: str
    version_added: 0.2.0
"""
