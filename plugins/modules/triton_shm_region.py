#!/usr/bin/python
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: triton_shm_region
short_description: Register, unregister and clean Triton shared-memory regions safely
version_added: 0.1.0
description:
  - Registers system or CUDA shared-memory regions with a Triton Inference Server, or unregisters them and removes their
    backing files from the server's C(/dev/shm), without restarting Triton.
  - "O(state=absent) selects regions by O(name), by state (O(stale=true): every region whose client is gone;
    O(reserved=true): every region this collection registered that no client maps yet), or all of them
    (O(all=true), explicit only), optionally orphan files by pattern (O(orphan_files=true)) and the C(leftover) pools of
    dead servers' Python-based backends (O(backend_leftovers=true))."
  - "A system region registered by O(state=present) is the operator's: its backing file gets the extended attribute
    C(trusted.tritonops_shm.reserved) (the region's name), which stays with the file across runs. M(tritonops.shm.triton_shm_info)
    then calls it C(reserved) while no client maps it (C(healthy) once one does), and O(stale=true) never
    selects it. Marking needs
    root (C(become: true)); when it fails, a warning says so."
  - "Runs that change a server are serialised per server: an exclusive C(flock) on an empty file of a directory only the module's
    user can write (for root C(/run/tritonops_shm), mode 0700; one file per shm directory, named for its device and inode), taken
    as soon as the server is located and before its regions, files and holders are read, and released when the run ends. So a run
    plans only from what is there after any other run, and reports only what it did itself, and no tenant of the server's
    C(/dev/shm) can hold the lock hostage. The C(flock) on the shm directory itself (what 0.2.0 took) is also tried once, never
    waited for: when another process holds it, a warning names it."
  - "The server's own C(/dev/shm) is reached through C(/proc/PID/root) and resolved as the server sees it, one component at a
    time, never through a symlink: a shm directory that is a symlink, or reached through one (C(dev), C(dev/shm)), is refused with
    the reason, and nothing in it is judged or removed (the host is never reported C(ok))."
  - "After an unregister the module waits, up to O(in_use_timeout), until the region is gone from the status before it removes the
    file or registers the name again (Triton 24.12 and later keep a region with requests in flight listed until they finish)."
  - "Safety rules, always on: a file is unlinked only after its region is unregistered; only when no process but the server
    holds it, re-checked right before the unlink (the file is first renamed to a quarantine name inside the shm directory, every
    process is scanned again, then it is unlinked, or renamed back when someone holds it); only a regular file inside the shm
    directory, never through a symlink, never one with another name (a hard link);
    Triton's python backend files that any process holds, and files matching no O(orphan_patterns), are never removed; when
    holders cannot all be seen (not root), nothing is stale, no backend file is a leftover and no file is removed; a file the
    server process's own user could not remove, or whose owner is neither the server's user nor one of O(client_users), is never
    removed (the region is still unregistered); files of well-known other software (docs/concepts.md) are never orphans; several
    servers on the URL's port need O(server_pid)."
  - "With O(metrics_dir), O(state=absent) writes the node_exporter cleanup textfile in the same call: when it ended, whether it
    failed, what it unregistered, removed and freed, and the freed-bytes counter continued from the previous file. A failed call
    writes its outcome too. O(state=present) writes nothing; the report textfile is M(tritonops.shm.triton_shm_info)'s."
  - One call handles any number of regions over one HTTP connection or gRPC channel. A failure part-way fails
    the task with what was already
    done in the result; a rerun converges. Before unregistering, a cleanup records the backing files it is about to remove in
    extended attributes of the shm directory (C(trusted.tritonops_shm.cleanup.N)); after a run killed part-way, the next
    O(stale=true) run against the same server process removes the recorded files whose regions are gone and that nobody holds.
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
    description: Reports exactly what would be registered, unregistered and removed, and touches nothing.
  diff_mode:
    support: full
    description: C(before) and C(after) lists of regions, and the files to remove.
  idempotent:
    support: partial
    description: A second run with the same arguments reports no change.
    details: Except O(state=present) with O(kind=cuda), which registers the given O(raw_handle) on every run (see there).
options:
  state:
    description:
      - V(present) registers the region(s) in O(name) with the given spec; an existing region with another spec is re-registered.
        A CUDA region is registered again on every run (see O(raw_handle)).
      - V(absent) unregisters the selected regions and removes their unheld backing files.
    type: str
    choices: [present, absent]
    default: present
  kind:
    description:
      - V(system) regions are backed by files in C(/dev/shm); V(cuda) regions by CUDA IPC handles (no files).
      - V(all), with O(state=absent) only, is one call for every kind the server offers (its extensions in C(GET /v2)) - the
        system regions and files as with V(system), then, under the same per-server lock and on the same connection, the
        CUDA regions with the same selectors (O(stale), O(all), O(name), O(exclude)) as with V(cuda). The CUDA part's result
        is C(cuda) in RV(kinds). With none of O(stale), O(all), O(reserved), O(name) (only the files' selectors such as
        O(orphan_files) or O(backend_leftovers)) there is no CUDA part and RV(kinds) is empty. The C(shm_cleanup) role makes
        this one call per server (version 0.3.0 made two).
    type: str
    choices: [system, cuda, all]
    default: system
  name:
    description:
      - Region names. A single string is accepted.
      - With O(state=present), exactly one name (Triton refuses to register a second region on a key already registered).
      - With O(state=absent), any number; a name that is not registered is no change.
    type: list
    elements: str
    default: []
  key:
    description:
      - Shared-memory key of a system region, C(/) followed by one file name (the file C(shm_dir/NAME)).
      - Required with O(state=present) and O(kind=system).
      - Keys of python backend files (the prefix C(triton_python_backend_shm_region_), reserved by Triton 2.60 and later,
        or a name matching O(backend_patterns)) are refused before anything is sent.
    type: str
  offset:
    description:
      - Offset of the region inside the backing file.
    type: int
    default: 0
  byte_size:
    description:
      - Size of the region in bytes. Must be positive; O(offset) + O(byte_size) must fit in the backing file.
      - Required with O(state=present).
    type: int
  create_file:
    description:
      - Create the backing file in the server's shm directory when it does not exist (exclusive create, mode C(0600),
        size O(offset) + O(byte_size)). An existing file is never truncated or grown; a smaller one is an error.
    type: bool
    default: false
  raw_handle:
    description:
      - Base64 of the C(cudaIpcMemHandle_t) of a CUDA region. Required with O(state=present) and O(kind=cuda).
      - Triton's status shows a CUDA region's C(device_id) and C(byte_size), never its handle, so a region already listed
        under O(name) cannot be proven to hold this handle (it may be a dead client's registration of the same name and
        size). The given handle is therefore always registered; a region listed under the name is unregistered first
        (RV(unregistered) names it, like any re-register). The task is C(changed) on every run, check mode included.
      - When Triton refuses the new handle after the old registration was unregistered, the old one cannot be restored
        (its handle is not known), so the task fails and says so, and the region stays unregistered until a valid handle
        is registered.
    type: str
  device_id:
    description:
      - CUDA device of a CUDA region. Required with O(state=present) and O(kind=cuda).
    type: int
  stale:
    description:
      - With O(state=absent), select every stale region (no process but the server holds its file), and every dangling one
        (file gone) that no client still maps. Also removes the unheld files a cleanup of the same server process recorded and
        unregistered but was stopped before removing (M(tritonops.shm.triton_shm_info) shows them as C(orphan) with that reason).
    type: bool
    default: false
  reserved:
    description:
      - With O(state=absent), select every C(reserved) region (registered by this collection, no client maps it). O(stale=true)
        never selects them; O(name) and O(all=true) do.
    type: bool
    default: false
    version_added: 0.2.0
  suspect:
    description:
      - "With O(state=absent), select every C(suspect) region: one whose key is one of Triton's own backend files (a python
        backend pool, C(triton_*_backend_shm_region_*) or a configured backend pattern). Registering Triton's own pool was
        step 2 of the 2025 attack chain; Triton 25.07 and later refuse it, 2.51 accepts it."
      - "O(stale=true) never selects them. The pool file is never removed by this: it stays the backend's (while any process
        holds it), and O(backend_leftovers=true) takes it once nobody does."
    type: bool
    default: false
    version_added: 0.3.0
  families:
    description:
      - "With O(state=absent), also remove the files of these families of other software (opt-in, default none; names from
        docs/shm-families.md, for example V(nccl), V(vllm), or your O(extra_families)) that a dead process left: regular
        files no process maps or holds (a complete holder scan), older than O(min_age), whose owner is the server's user or
        one of O(client_users). The same rules as orphans: quarantine, the holders scanned again, never through a symlink."
      - A held file of such a family, a younger one and every file of another family are kept, with the reason in
        RV(skipped_items).
    type: list
    elements: str
    default: []
    version_added: 0.3.0
  all:
    description:
      - With O(state=absent), select every registered region of O(kind), live clients' too. Never a default.
      - On Triton older than 2.50, unregistering a region with requests in flight could crash the server
        (triton-inference-server/server#3207), so named or O(all=true) unregisters of regions a live client holds warn.
    type: bool
    default: false
  orphan_files:
    description:
      - With O(state=absent), also remove orphan files (unregistered, unheld, matching O(orphan_patterns), older than O(min_age)).
    type: bool
    default: false
  backend_leftovers:
    description:
      - With O(state=absent), also remove the C(leftover) files of Triton's Python-based backends (see O(backend_patterns)),
        pool files that no process maps or holds, older than O(min_age), found by a complete holder scan. They are the pools of a
        server and its python stubs that died together (a container killed, an OOM kill of its cgroup, a pod's container
        restarted on a kept C(/dev/shm)); no server reuses them.
      - A backend file that any process holds is never removed. When the holder scan is incomplete (not root, or processes that
        cannot be seen), no file is a leftover.
      - Removed through the same path as every file, holders re-checked right before the unlink.
    type: bool
    default: false
    version_added: 0.2.0
  orphan_patterns:
    description:
      - Shell-style patterns of file names that may be orphans. Required, non-empty, with O(orphan_files=true).
    type: list
    elements: str
    default: []
  min_age:
    description:
      - Minimum age in seconds of an orphan file, of a C(leftover) backend file, and of a file of O(families).
      - "A file's age is the time since the newest of its atime, mtime and ctime (as systemd-tmpfiles ages files): a file
        read, written, renamed or chmod'ed since is young again, and a backdated mtime does not make it old."
    type: float
    default: 300
  exclude:
    description:
      - Shell-style patterns of region names never unregistered by O(state=absent).
    type: list
    elements: str
    default: []
  remove_file:
    description:
      - After unregistering, remove the backing file when no process but the server holds it. A held file is kept and
        reported in RV(skipped_items).
    type: bool
    default: true
  in_use_timeout:
    description:
      - Seconds to keep retrying, with backoff, an unregister that Triton refuses because requests are in flight
        ("currently in use", Triton 2.50 and later). After that the region is skipped, not failed.
      - Also the longest wait for an unregistered region to leave the status (Triton 24.12 and later defer it while requests are
        in flight); its file is kept until then, and a region still listed then is reported in RV(pending) (not in
        RV(unregistered)), with the reason in RV(skipped_items) and a warning.
    type: float
    default: 10
  lock_dir:
    description:
      - The directory of the per-server run locks. Default C(/run/tritonops_shm) for root (C(/run/user/UID/tritonops_shm) for
        another user); when it cannot be made (a read-only C(/run)), C(TMPDIR/tritonops_shm-UID) only where no other user can
        write C(TMPDIR).
      - "A run never acts without its lock. Where neither place can be used (a read-only C(/run) and C(TMPDIR) C(/tmp), where
        any user could plant the name first), the run fails with the reason and changes nothing: set this to a directory on a
        writable filesystem that only the module's user can write (the node agent's manifests mount an C(emptyDir) at
        C(/run/tritonops_shm)). It is made private (mode 0700) when it is the user's own and nobody else can replace it; one
        that belongs to another user, or sits in a directory other users may write, is refused."
    type: path
    version_added: 0.3.0
  threshold_percent:
    description:
      - With O(state=absent) and O(kind=system), remove orphan files (O(orphan_files=true)) only when the server's shm
        filesystem is at least this many percent used, as this run read it. Below it, each orphan file is kept, with the
        reason in RV(skipped_items).
      - The selected regions and their files, the files a killed cleanup left, and leftover backend pools
        (O(backend_leftovers=true)) are acted on whatever the use. RV(threshold) says whether the gate was open.
      - V(0) (the default) is no gate. Between 0 and 100.
    type: float
    default: 0
    version_added: 0.2.0
  inventory:
    description:
      - With O(state=absent) and O(kind=system), also return RV(before) and RV(after), the server's shared memory as
        M(tritonops.shm.triton_shm_info) would report it when this run read it to select, and right after the change, read
        in this same run (and under its per-server lock). One task can then query, clean and verify, with no second query.
      - RV(after) is not read in check mode (nothing changed).
      - Orphan files are classified with O(orphan_patterns) and O(min_age), also without O(orphan_files).
    type: bool
    default: false
    version_added: 0.2.0
requirements:
  - tritonclient[grpc] (only for grpc:// and grpcs:// URLs)
seealso:
  - module: tritonops.shm.triton_shm_info
"""

EXAMPLES = r"""
- name: Remove every region whose client is gone, and its file
  tritonops.shm.triton_shm_region:
    url: http://127.0.0.1:8000
    state: absent
    stale: true
  become: true

- name: Also remove old client files nobody registered or holds
  tritonops.shm.triton_shm_region:
    url: http://127.0.0.1:8000
    state: absent
    stale: true
    orphan_files: true
    orphan_patterns: ["client_input_*", "client_output_*"]
    min_age: 600
  become: true

- name: Also remove the python backend pools of servers that died with their stubs (no process holds them)
  tritonops.shm.triton_shm_region:
    url: http://127.0.0.1:8000
    state: absent
    stale: true
    backend_leftovers: true
  become: true

- name: Unregister two named regions
  tritonops.shm.triton_shm_region:
    url: http://127.0.0.1:8000
    state: absent
    name: [input0, output0]
  become: true

- name: Unregister every region, live clients' too, but keep the warm-up ones (warmup_input0, ...) registered
  tritonops.shm.triton_shm_region:
    url: http://127.0.0.1:8000
    state: absent
    all: true
    exclude: ["warmup_*"]
  become: true

- name: Rebuild and register a clean 16 MiB region (the 建 step; creating and marking the file needs root)
  tritonops.shm.triton_shm_region:
    url: http://127.0.0.1:8000
    name: input0
    key: /input0
    byte_size: 16777216
    create_file: true
  become: true

- name: Register a CUDA region from its IPC handle (changed on every run, see raw_handle)
  tritonops.shm.triton_shm_region:
    url: http://127.0.0.1:8000
    kind: cuda
    name: gpu_input0
    raw_handle: "{{ ipc_handle_b64 }}"
    device_id: 0
    byte_size: 4194304
"""

RETURN = r"""
registered:
  description:
    - Names registered (or that would be, in check mode). Also returned when the task fails part-way, with what was done.
  returned: always
  type: list
  elements: str
unregistered:
  description: Names unregistered and gone from the server's status (or that would be, in check mode).
  returned: always
  type: list
  elements: str
pending:
  description:
    - Names whose unregister Triton accepted but deferred (Triton 24.12 / 2.53 and later, while requests are in flight), still
      listed in the status after O(in_use_timeout) seconds of waiting. The server drops them when those requests finish.
    - Their files are never removed while they are listed; a later run removes them (and reports the region then as
      RV(unregistered) or, when it is already gone, not at all).
    - An accepted unregister is a change of the server, so a pending region makes C(changed) true; a run that finds it still
      listed unregisters it again (Triton accepts that) and reports it pending again until it is gone.
    - Always empty in check mode (whether a server defers cannot be known without unregistering).
  returned: always
  type: list
  elements: str
  version_added: 0.2.0
removed_files:
  description: Backing, orphan or leftover files removed (or that would be).
  returned: always
  type: list
  elements: str
created_files:
  description: Backing files created by O(create_file).
  returned: always
  type: list
  elements: str
marked_files:
  description:
    - Backing files given the mark C(trusted.tritonops_shm.reserved) by O(state=present) (or that would be, in check mode),
      including the file of a region already registered as asked that did not carry the mark yet.
  returned: always
  type: list
  elements: str
  version_added: 0.2.0
skipped_items:
  description:
    - What was left alone and why; items have C(name) (a region) or C(path) (a file), and C(reason).
    - Not called C(skipped) because Ansible reserves that result key for skipped tasks.
  returned: always
  type: list
  elements: dict
  sample: [{path: /proc/42/root/dev/shm/input0, reason: "held by 4711 (python)"}]
freed_bytes:
  description: Bytes of shm the removed files occupied.
  returned: always
  type: int
freed_unlinked_bytes:
  description:
    - Bytes of shm the dangling regions unregistered gave back - the unlinked files Triton kept mapped for them (measured
      through C(/proc/PID/map_files)), each file once. With RV(freed_bytes), what the run freed in C(/dev/shm); in check
      mode, what it would free. The node_exporter textfile's freed bytes count both.
  returned: always
  type: int
  version_added: 0.3.0
freed_gpu_bytes:
  description:
    - With O(kind=cuda), the GPU memory the unregistered CUDA regions gave back, measured through NVML - the memory NVML
      charges to the server before the change (a killed client's region is charged to the server that imported it),
      minus after it. The module reads NVML again until the memory of every unregistered region is back, for up to 10 s
      (1 GiB came back within 3 s on an H200, docs/cuda.md); a warning says when it is not.
    - Null when nothing was unregistered, in check mode (nothing is measured), for system regions, and when NVML could not
      be read.
  returned: always
  type: int
  sample: 1073741824
  version_added: 0.3.0
server_gpu_bytes_before:
  description: With O(kind=cuda), the GPU memory NVML charged to the server (all its GPUs) when this run read it.
  returned: when CUDA regions were unregistered and NVML could be read
  type: int
  version_added: 0.3.0
server_gpu_bytes_after:
  description: The same after the unregister, as last measured (null when NVML could not be read again).
  returned: when CUDA regions were unregistered and NVML could be read
  type: int
  version_added: 0.3.0
kinds:
  description:
    - With O(kind=all), the result of each later part by kind (C(cuda) when the server offers CUDA shared memory), with the
      keys this module returns for that O(kind) (RV(unregistered), RV(freed_gpu_bytes), RV(skipped_items) ...). The keys
      at the top are the system part's; C(changed) is true when any part changed something.
  returned: with O(kind=all)
  type: dict
  sample: {cuda: {changed: true, unregistered: [gpu_input0], freed_gpu_bytes: 67108864}}
  version_added: 0.3.0
shm_used_bytes_before:
  description: Used bytes of the server's shm filesystem before the change.
  returned: when the shm directory is known
  type: int
shm_used_bytes_after:
  description: Used bytes after the change (equal to before in check mode).
  returned: when the shm directory is known
  type: int
before:
  description:
    - The server's shared memory when this run read it to select, with the keys M(tritonops.shm.triton_shm_info) returns
      (C(server), C(shm_fs), C(system_regions), C(cuda_regions), C(files), C(summary), C(holders_complete),
      C(unreadable_processes), C(scanned_at)). C(server.live) and C(server.ready) are not measured here (null);
      C(cuda_regions) is empty.
    - C(files) is limited as M(tritonops.shm.triton_shm_info) limits it by default (every file of Triton's and the 1,000
      largest of the others; C(files_omitted) counts the rest).
  returned: when O(inventory=true) and the server could be read (also when the task fails afterwards, for example because the
    server process was not found)
  type: dict
  sample: {summary: {system_regions: 2, stale_regions: 1, used_bytes: 3145728}, system_regions: [{name: input0, state: healthy}]}
  version_added: 0.2.0
after:
  description:
    - The server's shared memory right after the change, read again in this run, with the same keys as RV(before).
  returned: when O(inventory=true), not in check mode
  type: dict
  sample: {summary: {system_regions: 1, stale_regions: 0, used_bytes: 1048576}, system_regions: [{name: input0, state: healthy}]}
  version_added: 0.2.0
regions:
  description: Regions of O(kind) registered after the change (predicted in check mode).
  returned: success
  type: list
  elements: dict
  sample: [{name: input0, key: /input0, offset: 0, byte_size: 16777216}]
failure:
  description: The failed request, when Triton refused or could not be reached.
  returned: failure
  type: dict
  contains:
    url:
      description: The URL of the failed request.
      type: str
    status:
      description:
        - When the server answered, the HTTP status (an integer) for C(http) and C(https) URLs,
          or the gRPC status code name (a string such as C(INTERNAL)) for C(grpc) and C(grpcs) URLs.
      type: raw
    server_error:
      description: Triton's own error message, when it gave one.
      type: str
    transport:
      description: Which transport raised the failure, V(http) or V(grpc); absent when no request was made.
      type: str
      version_added: 0.2.0
threshold:
  description:
    - The threshold gate of this run, from O(threshold_percent) and the shm filesystem's use as this run read it.
    - C(over) is true when the use is at or above C(percent), and always with C(percent) 0; orphan files are removed only
      then. A caller (the shm_cleanup role) can use it to decide further steps, such as registering regions again.
  returned: with O(state=absent) and O(kind=system), when the server could be read
  type: dict
  contains:
    percent:
      description: O(threshold_percent).
      type: float
    used_percent:
      description: Used percent of the server's shm filesystem; V(null) when it is not known.
      type: float
    over:
      description: Whether the use is at or above O(threshold_percent) (the gate is open).
      type: bool
  sample: {percent: 80.0, used_percent: 91.5, over: true}
  version_added: 0.2.0
holders_complete:
  description:
    - Whether the holder scan this run planned from saw every holder. When false, O(stale) selects nothing, no file is an
      orphan and no file is removed; RV(holders_incomplete_reason) and a warning say why.
    - False outside the host's initial PID namespace unless O(clients_share_pid_namespace) is set.
  returned: when the server was read (with O(kind=cuda) too, since 0.3.0)
  type: bool
  version_added: 0.2.0
holders_incomplete_reason:
  description: Why RV(holders_complete) is false and what to do; V(null) when it is true.
  returned: when the server was read (with O(kind=cuda) too, since 0.3.0)
  type: str
  version_added: 0.2.0
pid_namespace:
  description: V(initial) (the host's initial PID namespace, every process visible) or V(other).
  returned: when the server was read (with O(kind=cuda) too, since 0.3.0)
  type: str
  choices: [initial, other]
  version_added: 0.2.0
metrics_skipped:
  description: Why no textfile was written, with O(metrics_dir_missing=skip) and a O(metrics_dir) that does not exist.
  returned: when O(metrics_dir_missing=skip) skipped the textfiles
  type: str
  sample: /var/lib/node_exporter/textfile_collector does not exist on this host
  version_added: 0.3.0
metrics_files:
  description:
    - The node_exporter textfile this call wrote (C(tritonops_shm_cleanup.HOST.DIGEST.prom)); empty in check mode and when the
      directory could not take it (a warning says why).
    - Also returned when the task fails.
  returned: with O(state=absent) when O(metrics_dir) is set
  type: list
  elements: str
  sample: [/var/lib/node_exporter/textfile_collector/tritonops_shm_cleanup.gpu1.3f2a9c0d1e4b.prom]
  version_added: 0.2.0
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import DEFAULT_MIN_AGE
from ansible_collections.tritonops.shm.plugins.module_utils.rules.region_plan import IN_USE_TIMEOUT
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
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import EVERY_KIND, EveryKind, RegionOps


def main() -> None:
    argument_spec = shm_dir_argument_spec()
    argument_spec.update(time_limit_argument_spec())
    argument_spec.update(backend_argument_spec())
    argument_spec.update(wedged_argument_spec())
    argument_spec.update(metrics_argument_spec())
    argument_spec.update(
        state=dict(type='str', choices=['present', 'absent'], default='present'),
        kind=dict(type='str', choices=[*records.KINDS, EVERY_KIND], default=records.SYSTEM.name),
        name=dict(type='list', elements='str', default=[]),
        key=dict(type='str', no_log=False),
        offset=dict(type='int', default=0),
        byte_size=dict(type='int'),
        create_file=dict(type='bool', default=False),
        raw_handle=dict(type='str'),
        device_id=dict(type='int'),
        stale=dict(type='bool', default=False),
        reserved=dict(type='bool', default=False),
        suspect=dict(type='bool', default=False),
        families=dict(type='list', elements='str', default=[]),
        all=dict(type='bool', default=False),
        orphan_files=dict(type='bool', default=False),
        backend_leftovers=dict(type='bool', default=False),
        orphan_patterns=dict(type='list', elements='str', default=[]),
        min_age=dict(type='float', default=DEFAULT_MIN_AGE),
        exclude=dict(type='list', elements='str', default=[]),
        remove_file=dict(type='bool', default=True),
        in_use_timeout=dict(type='float', default=IN_USE_TIMEOUT),
        lock_dir=dict(type='path'),
        inventory=dict(type='bool', default=False),
        threshold_percent=dict(type='float', default=0),
    )
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_by=METRICS_REQUIRED_BY,
        required_if=[('state', 'present', ('byte_size',))],
        supports_check_mode=True,
    )
    every = module.params['kind'] == EVERY_KIND
    if every and module.params['state'] != 'absent':
        module.fail_json(
            msg=f'kind={EVERY_KIND} is for state=absent: a region to register is of one kind ('
            f'{" or ".join(records.KINDS)})'
        )
    client = make_client(module)
    client.use_keep_alive()  # one connection for any number of regions
    ops = (EveryKind if every else RegionOps)(
        client, module.params, check_mode=module.check_mode, warn=module.warn, diff=module._diff
    )
    if module.params['state'] != 'absent':
        run_operation(module, ops)
        return
    # a cleanup writes its outcome to the metrics textfile (its freed-bytes counter continues the previous file's),
    # under the per-server lock on success, and after a failure too
    run_operation(
        module,
        ops,
        finish=lambda result: write_metrics(module, outcome=metrics.call_outcome(result, failed=False)),
        on_failure=lambda result: write_metrics(module, outcome=metrics.call_outcome(result, failed=True)),
    )


if __name__ == '__main__':
    main()
