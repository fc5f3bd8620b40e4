#!/usr/bin/python
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: triton_shm_info
short_description: Report a Triton server's shared-memory regions, /dev/shm files and who holds them
version_added: 0.1.0
description:
  - Reads, and never changes, everything an operator needs to repair leaked Triton shared memory in one call.
  - The server's metadata and health (C(GET /v2), C(/v2/health/live), C(/v2/health/ready)).
  - Every registered system region (C(GET /v2/systemsharedmemory/status)) joined with its backing file in the server's
    C(/dev/shm) and the processes that map or hold that file, classified C(healthy), C(stale), C(reserved), C(dangling),
    C(unknown), C(suspect) or C(wedged).
  - Every registered CUDA region (C(GET /v2/cudasharedmemory/status)).
  - Every entry of the server's shm directory, classified C(registered), C(backend), C(leftover), C(in_use), C(orphan) or
    C(foreign).
  - The pools of Triton's Python-based backends (RV(backend_pools)), each named for the model and instance whose python stub
    maps it (read from the stub's command line), and the C(leftover) pools of dead servers that no process holds.
  - Usage of the server's shm filesystem (its size is the container's C(--shm-size)).
  - Holders are found in one pass over C(/proc/*/maps) and C(/proc/*/fd), matched on device and inode, so clients in other
    mount namespaces (containers) are seen.
  - "Run as root (C(become: true)) so every process can be inspected; when some cannot, no region is reported C(stale)
    (fail-safe) and a warning says why."
  - With O(metrics_dir), the same call writes the server's report textfile for node_exporter, also when the server cannot be
    queried (C(tritonops_shm_up 0)).
author:
  - tritonops.shm developers (@tritonops)
extends_documentation_fragment:
  - tritonops.shm.triton
  - tritonops.shm.triton.shm_dir
  - tritonops.shm.triton.time_limit
  - tritonops.shm.triton.backend
  - tritonops.shm.triton.wedged
  - tritonops.shm.triton.metrics
attributes:
  check_mode:
    support: full
    description: The module never changes anything; it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Reading twice gives the same result when nothing else changed.
options:
  orphan_patterns:
    description:
      - Shell-style patterns (fnmatch, case-sensitive) of file names that count as V(orphan) when unregistered, unheld
        and at least O(min_age) seconds old. Files matching none are V(foreign) and never touched.
      - Empty by default, so no file is ever called orphan unless asked.
    type: list
    elements: str
    default: []
  min_age:
    description:
      - Minimum age in seconds for a pattern-matching file to be orphan, and for an unheld backend file to be C(leftover).
      - "A file's age is the time since the newest of its atime, mtime and ctime (as systemd-tmpfiles ages files): a file
        read, written, renamed or chmod'ed since is young again, and a backdated mtime does not make it old."
      - A younger file may belong to a client that is about to register it, or to a server that is starting its model.
    type: float
    default: 300
  file_records:
    description:
      - Which files RV(files) lists one by one. The summary, RV(families) and RV(backend_pools) count every file either way.
      - V(limited) lists every file of Triton's (categories C(registered), C(backend), C(leftover), C(orphan)) and the 1,000
        largest of the others (C(in_use), C(foreign)); RV(files_omitted) counts the rest. A directory that other software
        fills with 100,000 files then gives an answer of a few hundred kilobytes instead of about 40 MB, and the call takes
        a third of the time.
      - V(all) lists every file.
    type: str
    choices: [limited, all]
    default: limited
    version_added: 0.3.0
  query:
    description:
      - A JMESPath expression applied to the whole result; its value is returned as RV(query_result).
      - Needs the Python library C(jmespath).
    type: str
requirements:
  - tritonclient[grpc] (only for grpc:// and grpcs:// URLs)
  - jmespath (only for O(query))
seealso:
  - module: tritonops.shm.triton_shm_region
  - ref: tritonops.shm.shm_cleanup role <ansible_collections.tritonops.shm.shm_cleanup_role>
    description: Fleet-wide cleanup built on this module.
"""

EXAMPLES = r"""
- name: Report shared memory of the local Triton
  tritonops.shm.triton_shm_info:
    url: http://127.0.0.1:8000
  become: true
  register: shm

- name: Show stale regions
  ansible.builtin.debug:
    msg: "{{ shm.system_regions | selectattr('state', 'eq', 'stale') | map(attribute='name') | list }}"

- name: Count leaked client files older than 10 minutes, with a JMESPath query
  tritonops.shm.triton_shm_info:
    url: "{{ triton_url }}"
    orphan_patterns: ["client_*", "input_*"]
    min_age: 600
    query: "length(files[?category=='orphan'])"
  register: orphans

- name: Show the count (query_result is a number here)
  ansible.builtin.debug:
    msg: "{{ orphans.query_result }} orphan file(s)"

- name: Query and write the node_exporter textfile in the same call
  tritonops.shm.triton_shm_info:
    url: "{{ triton_url }}"
    metrics_dir: /var/lib/node_exporter/textfile_collector
    metrics_host: "{{ inventory_hostname }}"
  become: true

- name: Set the connection once for a play
  module_defaults:
    group/tritonops.shm.triton:
      url: https://triton.example.com:8443
      ca_path: /etc/pki/triton-ca.pem
      headers:
        Authorization: "Bearer {{ triton_token }}"
  block:
    - name: Read through an authenticating proxy
      tritonops.shm.triton_shm_info:
        shm_dir: /dev/shm
"""

RETURN = r"""
server:
  description: The server, as found.
  returned: always
  type: dict
  contains:
    url: {description: Base URL used., type: str, sample: "http://127.0.0.1:8000"}
    live: {description: C(/v2/health/live) answered 200., type: bool}
    ready: {description: C(/v2/health/ready) answered 200., type: bool}
    name: {description: Server name from C(GET /v2)., type: str, sample: triton}
    version: {description: Triton version., type: str, sample: "2.51.0"}
    extensions: {description: Protocol extensions., type: list, elements: str, sample: [system_shared_memory, cuda_shared_memory]}
    pid: {description: "PID of the tritonserver process on this host, or null when not found.", type: int, sample: 4242}
    shm_dir: {description: "Directory used as the server's /dev/shm, or null.", type: str, sample: /proc/4242/root/dev/shm}
    located_by:
      description:
        - How the pid and directory were found, hop by hop, or null when the server was not found.
        - C(listener) when tritonserver owns the listening socket in this network namespace (a host process,
          host networking); C(connection ...) when the module followed a TCP connection to the URL through
          forwarders such as C(docker-proxy) or C(socat) and NAT (published container ports) or into another
          network namespace (a container or pod IP). See docs/concepts.md, "Finding the server".
      type: str
      sample: "connection via docker-proxy (pid 2311) to tritonserver (pid 4242) at 172.18.0.2:8000 in another network namespace;
        shm_dir from /proc/4242/root"
    not_found_reason:
      description:
        - Why the tritonserver process could not be found from the URL, with how to fix it; null when it was found
          (or C(server_pid) was given).
        - When set, no region can be called stale, and M(tritonops.shm.triton_shm_region) refuses stale and orphan
          cleanup on this host.
      type: str
      sample: "the tritonserver process behind 10.0.0.7:8000 was not found: no process on this host owns the other end of the
        connection ...; set server_pid or shm_dir, or run the task on the host that runs Triton, as root (become: true)"
      version_added: 0.2.0
    shm_unsupported:
      description:
        - Why this server offers no shared memory at all, or null. Triton 2.73 and later started through the in-process
          C(tritonfrontend) Python bindings answer every shared-memory call with HTTP 503 C(Shared memory is not supported in
          this server configuration...).
        - "The module then reports the server, its files and a warning instead of failing: RV(system_regions) and
          RV(cuda_regions) are empty, and no file is called V(orphan) (nothing says which are registered). This is not a leak.
          M(tritonops.shm.triton_shm_region) fails on such a server with this reason, and the C(shm_cleanup) role fails the host."
      type: str
      version_added: 0.2.0
    container:
      description:
        - The container or Kubernetes pod the server runs in, from C(/proc/PID/cgroup), or null on the host (or when the
          process was not found). The same form as the C(container) of each server M(tritonops.shm.triton_server_info) returns.
        - Keys when known, C(runtime) (docker, podman, containerd, cri-o, kubernetes), C(container_id), C(pod_uid), C(qos),
          C(podman_pod), C(pod_name), C(pod_namespace); always C(name), for example C(pod inference/triton-0).
      type: dict
      sample: {runtime: containerd, container_id: 3f2a..., pod_uid: 5c1e2d4a-..., qos: burstable, name: pod inference/triton-0}
      version_added: 0.2.0
shm_fs:
  description: Usage of the server's shm filesystem (statvfs), or null when the directory is not known.
  returned: always
  type: dict
  contains:
    path: {description: The directory., type: str}
    total_bytes: {description: Size of the filesystem (the container's C(--shm-size))., type: int, sample: 67108864}
    used_bytes: {description: Bytes in use., type: int}
    free_bytes: {description: Bytes available., type: int}
    used_percent: {description: Percent used., type: float, sample: 37.5}
system_regions:
  description:
    - Every registered system shared-memory region.
    - Fields the server returns beyond those below (for example C(ref_count) on newer Triton versions) are kept as they are.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Region name., type: str}
    key: {description: Shared memory key (C(shm_open) name)., type: str, sample: /input0}
    offset: {description: Offset into the backing file., type: int}
    byte_size: {description: Registered size., type: int}
    file:
      description:
        - The backing file (C(shm_dir) + key), or null when it cannot be located.
        - Only C(path) and C(exists) when the file is missing (a C(dangling) region).
      type: dict
      contains:
        path: {description: Path on this host., type: str}
        exists: {description: Whether the file exists., type: bool}
        type: {description: "C(file), C(symlink), C(directory), C(fifo), C(socket) or C(other).", type: str}
        size: {description: Apparent size in bytes., type: int}
        allocated_bytes: {description: Bytes of shm the file occupies., type: int}
        inode: {description: Inode number., type: int}
        uid: {description: Owner uid., type: int}
        mode: {description: Permission bits (octal string)., type: str, sample: "0600"}
        mtime: {description: Modification time (epoch seconds)., type: float}
        age_s:
          description: "Seconds since the newest of the file's atime, mtime and ctime (what O(min_age) is compared with)."
          type: float
        age_from: {description: "Which time C(age_s) counts from: C(atime), C(mtime) or C(ctime).", type: str, sample: mtime}
    holders:
      description: Processes other than the server that map or hold the backing file.
      type: list
      elements: dict
      contains:
        pid: {description: Process id., type: int}
        comm: {description: Process name., type: str}
        container:
          description:
            - The container or Kubernetes pod the process runs in, from its C(/proc/PID/cgroup), in the form of
              RV(server.container); absent when it runs on the host.
          type: dict
          returned: when the process runs in a container
          sample: {runtime: containerd, container_id: 3f2a..., pod_uid: 5c1e2d4a-..., qos: burstable, name: pod ml/client-0}
          version_added: 0.2.0
    state:
      description:
        - C(healthy) some process besides the server holds the file.
        - C(stale) registered, file present, no holder but the server (the client is gone).
        - "C(reserved) registered by this collection (M(tritonops.shm.triton_shm_region)
          O(tritonops.shm.triton_shm_region#module:state=present),
          the re-register step of the C(shm_cleanup) role): its file carries the mark C(trusted.tritonops_shm.reserved) naming
          this region, and no holder but the server. Desired state, never stale; C(healthy) once a client maps it."
        - C(dangling) registered, backing file missing.
        - C(unknown) holders or file could not be determined.
        - "C(suspect) its key is one of Triton's own backend files (a python backend pool): an attack (Triton 25.07 and later
          refuse such a registration). Never healthy, never stale; the file stays C(backend)."
        - "C(wedged) no process but the server holds it, and Triton refused or deferred its unregister on O(wedged_after)
          consecutive cleanup runs: only a restart of the server frees it (Triton 2.53 and later, server issue 7688)."
      type: str
      sample: stale
    state_reason: {description: Why the state was chosen., type: str}
    reserved:
      description:
        - Whether the backing file carries this collection's mark naming this region (see C(reserved) above), whatever the state.
        - Read as root only; false when the mark cannot be read.
      type: bool
      version_added: 0.2.0
    reclaimable:
      description:
        - Whether M(tritonops.shm.triton_shm_region) with O(tritonops.shm.triton_shm_region#module:stale=true) unregisters it.
        - True for C(stale) regions, and for C(dangling) ones whose unlinked file no client maps any more (their memory stays
          allocated until they are unregistered), when the holders and the server process are fully known.
      type: bool
cuda_regions:
  description:
    - Every registered CUDA region (C(name), C(device_id), C(byte_size), and what else the server returns), with its
      possible owners and its state by the CUDA rule (docs/cuda.md).
    - V(stale) only when no process but the server and its own descendants has a CUDA context on the region's GPU, by
      NVML's compute processes and by the /proc scan (a process that maps C(/dev/nvidia-uvm)), no zombie candidate is
      there, and both signals see the server's own context on that GPU (the positive control); V(unknown) otherwise,
      also whenever NVML cannot be read, MIG or MPS is on, or the module runs outside the host's PID namespace.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: The region name., type: str}
    device_id: {description: "The CUDA device ordinal, as the server's process numbers its GPUs.", type: int}
    byte_size: {description: Registered size in bytes., type: int}
    holders:
      description:
        - The processes that may own the region (C(pid), C(comm), C(why), and C(container) for one in a container).
        - A C(why) that starts with C(zombie:) is a pid NVML lists that /proc no longer has. A descendant of that dead
          client keeps its context and memory alive. Stop it, and the region becomes stale.
        - A C(why) that starts with C(zombie candidate) is a process that maps C(/dev/nvidiactl) without
          C(/dev/nvidia-uvm) and that NVML does not list, as that descendant does (or a process that only counted the
          GPUs). It keeps the region V(unknown).
      type: list
      elements: dict
      version_added: 0.3.0
    state: {description: "V(stale) or V(unknown), by the CUDA rule.", type: str}
    state_reason: {description: Why the region has its state., type: str}
    gpu_uuid:
      description:
        - The UUID of the NVML GPU that C(device_id) is proven to name (docs/cuda.md) - the server reaches that one GPU,
          or its C(CUDA_VISIBLE_DEVICES) gives the ordinal's GPU by UUID. Null when that is not proven.
      type: str
      version_added: 0.3.0
    reclaimable:
      description: >-
        Whether M(tritonops.shm.triton_shm_region) with O(tritonops.shm.triton_shm_region#module:kind=cuda) and
        O(tritonops.shm.triton_shm_region#module:stale=true) unregisters it.
      type: bool
      version_added: 0.3.0
files:
  description:
    - The entries of the shm directory (lstat, never followed), in name order. With O(file_records=limited) (the default),
      every file of Triton's and the 1,000 largest of the others; RV(files_omitted) counts those left out.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: File name., type: str}
    path: {description: Path on this host., type: str}
    type: {description: Entry type., type: str}
    size: {description: Apparent size., type: int}
    allocated_bytes: {description: Bytes of shm occupied., type: int}
    uid: {description: Owner uid., type: int}
    mode: {description: Permission bits., type: str}
    mtime: {description: Modification time., type: float}
    age_s:
      description: "Seconds since the newest of its atime, mtime and ctime (what O(min_age) is compared with)."
      type: float
    age_from: {description: "Which time C(age_s) counts from: C(atime), C(mtime) or C(ctime).", type: str, sample: mtime}
    inode: {description: Inode number., type: int}
    holders:
      description: Processes other than the server that map or hold it.
      type: list
      elements: dict
      contains:
        pid: {description: Process id., type: int}
        comm: {description: Process name., type: str}
        container:
          description:
            - The container or Kubernetes pod the process runs in, from its C(/proc/PID/cgroup), in the form of
              RV(server.container); absent when it runs on the host.
          type: dict
          returned: when the process runs in a container
          sample: {runtime: containerd, container_id: 3f2a..., pod_uid: 5c1e2d4a-..., qos: burstable, name: pod ml/client-0}
          version_added: 0.2.0
    regions: {description: Names of regions it backs., type: list, elements: str}
    category:
      description:
        - C(registered) backs a region; C(backend) a file of one of Triton's Python-based backends (see O(backend_patterns))
          that a process holds, or may hold; C(leftover) such a file that no process holds, with a complete holder scan, older
          than O(min_age) (the pool of a server and stubs that died together); C(in_use) held, not registered; C(orphan)
          unregistered, unheld, matches O(orphan_patterns), older than O(min_age); C(foreign) anything else.
      type: str
    category_reason: {description: Why the category was chosen., type: str}
    backend:
      description:
        - For a C(backend) or C(leftover) file, the backend whose file it is, from its name
          C(triton_<backend>_backend_shm_region_*)
          (for example V(python) or V(vllm)); V(python) for a file only O(backend_patterns) matches (a prefix set with
          C(--backend-config=python,shm-region-prefix-name=...), an option of the python backend, which runs every
          Python-based backend). Null for every other category.
      type: str
      sample: vllm
      version_added: 0.2.0
files_omitted:
  description: What RV(files) leaves out with O(file_records=limited) (zeros when it lists every file).
  returned: always
  type: dict
  version_added: 0.3.0
  contains:
    files: {description: Files not listed., type: int}
    bytes: {description: Shm bytes they occupy., type: int}
    by_category: {description: "Their count by category (C(in_use), C(foreign)).", type: dict}
families:
  description:
    - "The files that are not Triton's (categories C(foreign) and C(in_use)) by family of other software: NCCL, vLLM, SGLang,
      Python's shared_memory, PyTorch, PSM, MPI/UCX, CUDA IPC, POSIX semaphores and others (docs/shm-families.md), yours
      first (O(extra_families)), and C(other) for the files of no known family. Families with no file are left out."
  returned: always
  type: list
  elements: dict
  version_added: 0.3.0
  contains:
    name: {description: "The family (C(nccl), C(vllm), ..., C(other)).", type: str}
    description: {description: Whose files they are., type: str}
    files: {description: Files of the family., type: int}
    bytes: {description: Shm bytes they occupy., type: int}
    held_files: {description: Those a process maps or holds., type: int}
    held_bytes: {description: Their bytes., type: int}
    unheld_files: {description: "Those no process holds (a dead process's, as far as seen).", type: int}
    unheld_bytes: {description: Their bytes., type: int}
    containers:
      description: The containers or pods of their holders.
      type: list
      elements: str
backend_pools:
  description:
    - The shared-memory pools of Triton's Python-based backends (every C(backend) and C(leftover) file), one per model instance,
      ordered by model, instance and name.
    - A pool starts at the python backend's C(shm-default-byte-size) and grows by C(shm-growth-byte-size); it never shrinks.
  returned: always
  type: list
  elements: dict
  version_added: 0.2.0
  contains:
    path: {description: Path on this host., type: str}
    name: {description: File name., type: str, sample: triton_python_backend_shm_region_754e0611-a505-4b06-b80d-1eb279535afa}
    backend: {description: "The backend whose pool it is (as the file record's C(backend)).", type: str, sample: python}
    model:
      description:
        - The model whose python stub maps the pool, from the stub's command line (the directory above C(VERSION/model.py) in
          the model repository, else the instance name without its C(_GROUP_INDEX) suffix).
        - Only the server's own stub is believed, by evidence the holder cannot fake - a child of the server process started
          after it, running as the server's user in its mount namespace, running the server's
          C(BACKEND_DIR/python/triton_python_backend_stub) (or a custom stub in the model's own directory of the server's model
          repository); a command line alone names no model (any user may write one).
        - "Null when no stub of the server maps it (a C(leftover), a pool only the server holds, or a holder whose claim is not
          believed, see RV(backend_pools[].unattributed_reason))."
      type: str
      sample: echo
    instance: {description: "The model instance (for example V(echo_0_0)); null as RV(backend_pools[].model).", type: str}
    bytes: {description: Bytes of shm the pool occupies (allocated)., type: int}
    size: {description: Apparent size of the file (the pool's size)., type: int}
    holders:
      description: Every process that maps or holds it, the server included.
      type: list
      elements: dict
      contains:
        pid: {description: Process id., type: int}
        comm: {description: Process name., type: str}
    state:
      description:
        - V(live) held by a process; V(leftover) the file is C(leftover) (no holder, complete scan, older than O(min_age));
          V(unknown) not held as far as seen, but the holder scan is incomplete or the file is younger than O(min_age).
      type: str
    reason: {description: "Why (the file's C(category_reason)).", type: str}
    unattributed_reason:
      description:
        - Why no model is named for a pool that is not a C(leftover) (no stub of the server maps it, or a holder that names a
          model on its command line is not the server's own stub, with what failed); null when RV(backend_pools[].model) is
          named, and for leftovers.
        - Such a pool is never reloaded by M(tritonops.shm.triton_backend_pool).
      type: str
      version_added: 0.3.0
gpus:
  description:
    - Per GPU NVML sees, what the CUDA rule read (docs/cuda.md). Null when the GPUs were not read - no CUDA region is
      registered, the server process was not found, or the module runs outside the host's initial PID namespace.
  returned: always
  type: list
  elements: dict
  version_added: 0.3.0
  contains:
    index: {description: NVML index of the GPU., type: int}
    uuid: {description: GPU UUID., type: str}
    mig: {description: Whether MIG mode is on (then no CUDA region is stale)., type: bool}
    server_bytes:
      description: GPU memory NVML charges to the server process on this GPU; a killed client's CUDA region is charged to
        the server that imported it. Null when NVML does not say.
      type: int
    cuda_region_bytes:
      description: >-
        Bytes of the CUDA regions on this GPU (their RV(cuda_regions[].gpu_uuid) is its UUID), by state: C(stale) and
        C(unknown). A region whose GPU is not proven counts on no GPU (the summary counts every region).
      type: dict
    context_holders:
      description: The processes besides the server (and its descendants) that may have a CUDA context on this GPU
        (zombie candidates among them), as RV(cuda_regions[].holders) names them.
      type: list
      elements: dict
    zombies:
      description: Pids NVML lists on this GPU that /proc no longer has - a descendant of a dead client keeps its context
        and memory alive (stop it).
      type: list
      elements: int
gpu_error:
  description: Why NVML could not be read (then no CUDA region is stale); null when it was, or was not needed.
  returned: always
  type: str
  version_added: 0.3.0
summary:
  description: Counts and bytes.
  returned: always
  type: dict
  contains:
    system_regions: {description: Registered system regions., type: int}
    cuda_regions: {description: Registered CUDA regions., type: int}
    cuda_stale_regions: {description: "CUDA regions in state C(stale) (docs/cuda.md).", type: int, version_added: 0.3.0}
    cuda_unknown_regions: {description: CUDA regions in state C(unknown)., type: int, version_added: 0.3.0}
    cuda_stale_bytes: {description: GPU bytes of the stale CUDA regions (their C(byte_size))., type: int, version_added: 0.3.0}
    cuda_unknown_bytes: {description: GPU bytes of the CUDA regions in state C(unknown)., type: int, version_added: 0.3.0}
    healthy_regions: {description: Healthy regions., type: int}
    stale_regions: {description: Stale regions., type: int}
    reserved_regions: {description: "Regions in state C(reserved) (registered by this collection, no client
      yet).", type: int, version_added: 0.2.0}
    stale_bytes: {description: "Shm bytes occupied by stale regions' files, each file counted once.", type: int}
    dangling_regions: {description: Dangling regions., type: int}
    unknown_regions: {description: Regions in state unknown., type: int}
    suspect_regions: {description: "Regions in state C(suspect): registered on one of Triton's own backend files.", type: int,
      version_added: 0.3.0}
    wedged_regions: {description: "Regions in state C(wedged): only a restart of the server frees them.", type: int,
      version_added: 0.3.0}
    wedged_bytes: {description: "Shm bytes of the wedged regions' files: what a restart of the server frees.", type: int,
      version_added: 0.3.0}
    registered_files: {description: Files backing regions., type: int}
    backend_files: {description: "Python-based backends' files that are held (or may be): category C(backend).", type: int}
    backend_bytes: {description: Shm bytes occupied by C(backend) files., type: int, version_added: 0.2.0}
    leftover_files: {description: "Backend files no process holds: category C(leftover).", type: int, version_added: 0.2.0}
    leftover_bytes: {description: Shm bytes occupied by C(leftover) files., type: int, version_added: 0.2.0}
    in_use_files: {description: Held unregistered files., type: int}
    orphan_files: {description: Orphan files., type: int}
    orphan_bytes: {description: Shm bytes occupied by orphan files., type: int}
    foreign_files: {description: Files never touched., type: int}
    used_bytes: {description: Used bytes of the shm filesystem., type: int}
    total_bytes: {description: Size of the shm filesystem., type: int}
    used_percent: {description: Percent used., type: float}
    healthy_bytes: {description: "Shm bytes of the healthy regions' files, each file once.", type: int, version_added: 0.3.0}
    reserved_bytes: {description: "Shm bytes of the reserved regions' files, each file once.", type: int, version_added: 0.3.0}
    dangling_bytes:
      description: "Shm bytes the server still maps for dangling regions: its unlinked files (their memory stays used
        until the region is unregistered). 0 without dangling regions."
      type: int
      version_added: 0.3.0
    unknown_bytes: {description: "Shm bytes of the files of regions in state C(unknown).", type: int, version_added: 0.3.0}
    suspect_bytes: {description: "Shm bytes of the files of C(suspect) regions (Triton's own pools).", type: int,
      version_added: 0.3.0}
    registered_bytes: {description: Shm bytes occupied by files that back regions., type: int, version_added: 0.3.0}
    in_use_bytes: {description: Shm bytes occupied by held unregistered files., type: int, version_added: 0.3.0}
    foreign_bytes: {description: "Shm bytes occupied by C(foreign) files (other software's, never touched).", type: int,
      version_added: 0.3.0}
    files_bytes:
      description: Shm bytes occupied by every listed file (the sum of the categories' bytes).
      type: int
      version_added: 0.3.0
    unlinked_mapped_bytes:
      description:
        - Shm bytes of files the server maps although they were unlinked (dangling regions' memory), measured through
          C(/proc/PID/map_files). None when the server's mappings were not read.
      type: int
      version_added: 0.3.0
    other_bytes:
      description:
        - "What the filesystem says is used beyond the listed files and the server's unlinked mappings (another process's
          unlinked files, the filesystem's own blocks), so that C(files_bytes + unlinked_mapped_bytes + other_bytes = used_bytes).
          None when either is not known."
      type: int
      version_added: 0.3.0
unreadable_processes:
  description:
    - Processes that could hold a file but whose /proc entries could not be read (the module does not run as root).
    - When above 0, no region is reported C(stale) and no file C(orphan), and a warning says why.
  returned: always
  type: int
  sample: 0
holders_complete:
  description:
    - Whether every holder could be determined. When false, no region is C(stale), no file C(orphan), no dangling region
      C(reclaimable); RV(holders_incomplete_reason) and a warning say why.
    - False outside the host's initial PID namespace (inside a container or a pod without C(hostPID)), unless
      O(clients_share_pid_namespace) states that every client runs in the module's PID namespace.
  returned: always
  type: bool
holders_incomplete_reason:
  description:
    - Why RV(holders_complete) is false, and what to do (for example run on the host, through the node agent of
      docs/kubernetes.md, or set O(clients_share_pid_namespace)); V(null) when it is true.
  returned: always
  type: str
  sample: "the module runs outside the host's initial PID namespace (...): ... Run it on the host, ..."
  version_added: 0.2.0
pid_namespace:
  description:
    - V(initial) when the module runs in the host's initial PID namespace and reads its C(/proc) (every process is visible),
      V(other) otherwise (a container, a pod without C(hostPID), anything nested).
  returned: always
  type: str
  choices: [initial, other]
  sample: initial
  version_added: 0.2.0
scanned_at:
  description: Epoch time of the scan.
  returned: always
  type: float
query_result:
  description: Value of O(query) applied to the result.
  returned: when O(query) is set
  type: raw
metrics_skipped:
  description: Why no textfile was written, with O(metrics_dir_missing=skip) and a O(metrics_dir) that does not exist.
  returned: when O(metrics_dir_missing=skip) skipped the textfiles
  type: str
  sample: /var/lib/node_exporter/textfile_collector does not exist on this host
  version_added: 0.3.0
metrics_files:
  description:
    - The node_exporter textfiles this call wrote (the report file C(tritonops_shm.HOST.DIGEST.prom)); empty in check mode and
      when the directory could not take them (a warning says why).
  returned: when O(metrics_dir) is set
  type: list
  elements: str
  sample: [/var/lib/node_exporter/textfile_collector/tritonops_shm.gpu1.3f2a9c0d1e4b.prom]
  version_added: 0.2.0
"""

import traceback
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.tritonops.shm.plugins.module_utils.host import authority, snapshot
from ansible_collections.tritonops.shm.plugins.module_utils.rules import classification, results
from ansible_collections.tritonops.shm.plugins.module_utils.run.base import (
    METRICS_REQUIRED_BY,
    backend_argument_spec,
    make_client,
    metrics_argument_spec,
    run_operation,
    shm_dir_argument_spec,
    time_limit_argument_spec,
    wedged_argument_spec,
    write_metrics,
)
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import Operation

JMESPATH_IMPORT_ERROR = None
try:
    import jmespath

    HAS_JMESPATH = True
except ImportError:
    HAS_JMESPATH = False
    JMESPATH_IMPORT_ERROR = traceback.format_exc()


class ShmInfo(Operation):
    """triton_shm_info as a operation.Operation: it reads the server (health, status, files, holders) and changes nothing,
    so its plan is its reading; the result is what results.info_result builds, with the query applied."""

    def __init__(self, module: AnsibleModule, client: Any) -> None:
        self.module, self.client, self.params = module, client, module.params
        self.compiled = None

    def check(self) -> None:
        query = self.params['query']
        if query and not HAS_JMESPATH:
            self.module.fail_json(msg=missing_required_lib('jmespath'), exception=JMESPATH_IMPORT_ERROR)
        if query:
            try:
                self.compiled = jmespath.compile(query)
            except jmespath.exceptions.JMESPathError as exc:
                self.module.fail_json(msg=f'query {query!r} is not a valid JMESPath expression: {exc}')

    def read(self) -> dict:
        params, client = self.params, self.client
        client.use_keep_alive()  # one connection for the five calls (every transport keeps its connection)
        live = client.health('live')
        ready = client.health('ready')
        criteria = classification.Criteria.of(
            params['orphan_patterns'],
            params['min_age'],
            params['backend_patterns'],
            authority.client_uids(params['client_users']),  # resolved here: the rules look nobody up
            params['wedged_after'],
            params['extra_families'],
        )
        snap = snapshot.read_server(
            client,
            server_pid=params['server_pid'],
            shm_dir=params['shm_dir'],
            require_readable_dir=params['shm_dir'] is not None,
            report_unsupported=True,
            backend_patterns=criteria.backend_patterns,
            clients_share_pid_namespace=params['clients_share_pid_namespace'],
        )
        for warning in snap.warnings:
            self.module.warn(warning)
        for warning in classification.broad_pattern_warnings(params['orphan_patterns']):
            self.module.warn(warning)
        return results.info_result(
            snap,
            classification.classify(snap, criteria),
            live=live,
            ready=ready,
            families=criteria.families,
            file_records=params['file_records'],
        )

    def result(self, outcome: dict, finished: bool = True) -> dict:
        result = dict(outcome, changed=False)
        if self.compiled is not None:
            try:
                result['query_result'] = self.compiled.search(outcome)
            except jmespath.exceptions.JMESPathError as exc:
                self.module.fail_json(msg=f'query {self.params["query"]!r} failed: {exc}')
        return result


def main() -> None:
    argument_spec = shm_dir_argument_spec()
    argument_spec.update(time_limit_argument_spec())
    argument_spec.update(backend_argument_spec())
    argument_spec.update(wedged_argument_spec())
    argument_spec.update(metrics_argument_spec())
    argument_spec.update(
        orphan_patterns=dict(type='list', elements='str', default=[]),
        min_age=dict(type='float', default=classification.DEFAULT_MIN_AGE),
        file_records=dict(type='str', choices=list(results.FILE_RECORDS), default=results.LIMITED),
        query=dict(type='str'),
    )
    module = AnsibleModule(argument_spec=argument_spec, required_by=METRICS_REQUIRED_BY, supports_check_mode=True)
    # a server that cannot be queried is written too: tritonops_shm_up 0
    run_operation(
        module,
        ShmInfo(module, make_client(module)),
        finish=lambda result: write_metrics(module, report=result, with_report=True),
        on_failure=lambda _failure: write_metrics(module, report=None, with_report=True),
    )


if __name__ == '__main__':
    main()
