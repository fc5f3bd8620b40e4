#!/usr/bin/python
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: triton_shm_sweep
short_description: Clean a shm directory no Triton server runs on, before the server starts
version_added: 0.3.0
description:
  - "Removes what a dead Triton server left in a shm directory, with no server and no URL: the pools of Triton's Python-based
    backends that no process holds (C(leftover) files, as M(tritonops.shm.triton_shm_info) calls them), and, only when asked
    (O(families)), the unheld files of families of other software such as NCCL or vLLM. Everything else stays: every file a
    process holds, every file of another owner, every other name."
  - "For the moment before a server starts on a C(/dev/shm) that outlives it (C(--ipc=host), a pod's C(emptyDir) of
    C(medium: Memory), a host whose Triton container restarts): as a systemd C(ExecStartPre), a Kubernetes initContainer, or the
    C(tritonops.shm.triton_server) role's step before the container starts (docs/prevention.md)."
  - "Refused while a server runs: when a running C(tritonserver) process (by its C(comm) or its program) has this directory's
    filesystem as its C(/dev/shm), seen through C(/proc/PID/root) in any mount namespace (the same device), the module fails
    with its pid and changes nothing, in check mode too; so does a C(tritonserver) whose root cannot be read (it cannot be
    shown not to use it). A running server's directory is cleaned by M(tritonops.shm.triton_shm_region) with its URL."
  - "A pool is a file named C(triton_<backend>_backend_shm_region_*) (every Python-based backend: python, vLLM, ...) or one
    matching O(backend_patterns): with no server running, no command line tells a custom prefix
    (C(--backend-config=python,shm-region-prefix-name=P)), so give V(P*) there."
  - "Where the module cannot see every process, it decides nothing: when the holder scan is incomplete (a process that cannot
    be read, C(/proc) mounted with C(hidepid), or a run outside the host's initial PID namespace without
    O(clients_share_pid_namespace)), no file is removed, and a warning and RV(scan) say why."
  - "The safety rules of the cleanup apply (docs/concepts.md): only regular files directly in O(shm_dir), never through a symlink,
    never one with another name (a hard link); only files no process maps or holds, older than O(min_age); only files of the
    directory's owner or of O(client_users) (no borrowed authority: root removes no other user's file); each file is first renamed
    to a quarantine name in the directory, its holders are scanned again, and it is unlinked by device and inode, or renamed back
    when a process took it meanwhile; one run at a time per directory (the run lock, O(lock_dir)). A run killed part-way leaves
    files under the quarantine name, which the next run removes."
author:
  - tritonops.shm developers (@tritonops)
attributes:
  check_mode:
    support: full
    description: Reports what it would remove (RV(removed_files), RV(freed_bytes)) and removes nothing; a running server is
      refused in check mode too.
  diff_mode:
    support: none
    description: No diff.
  idempotent:
    support: full
    description: A second run finds nothing left to remove (C(changed=false)).
options:
  shm_dir:
    description:
      - The shm directory to clean, an absolute path on this host, for example V(/dev/shm) (what a server started with
        C(--ipc=host) uses), a pod's C(emptyDir) as the init container mounts it, or C(/proc/PID/root/dev/shm) of a process
        that keeps a private C(/dev/shm) alive.
      - A symlink on the way is followed only when root owns it; inside C(/proc/PID/root) none is.
    type: path
    required: true
  families:
    description:
      - Also remove the files of these families of other software (opt-in, default none; names from docs/shm-families.md, for
        example V(nccl), V(vllm), or your O(extra_families)) that a dead process left, as
        O(tritonops.shm.triton_shm_region#module:families) does; regular files no process maps or holds, older than O(min_age),
        whose owner the authority rule accepts. Each other file of those families is kept, with its reason.
    type: list
    elements: str
    default: []
  extra_families:
    description:
      - "Families of other software's files of your own, added before the built-in table (docs/shm-families.md): each a dict with
        C(name), C(patterns) (shell-style) and an optional C(description). Their names may be given in O(families)."
    type: list
    elements: dict
    default: []
  backend_patterns:
    description:
      - Shell-style patterns (case-sensitive) of the pool files of Triton's Python-based backends, as for
        M(tritonops.shm.triton_shm_region). C(triton_<backend>_backend_shm_region_*) is always one, whatever this list says.
      - Add V(PREFIX*) for a server run with C(--backend-config=python,shm-region-prefix-name=PREFIX) (its pools are PREFIX
        followed by a UUID, or by a number before Triton 24.04).
    type: list
    elements: str
    default: ["triton_*_backend_shm_region_*"]
  min_age:
    description:
      - Seconds since a file's last modification before it may be removed (the grace age of leftover pools and family files).
    type: float
    default: 300
  client_users:
    description:
      - Users (names or numeric uids) whose files may be removed besides the owner of O(shm_dir). With no server, the directory's
        owner stands for the server's user; a shared C(/dev/shm) is root's, so name the user the server runs as here when it is
        not root.
    type: list
    elements: str
    default: []
  clients_share_pid_namespace:
    description:
      - State that every process that may map a file of O(shm_dir) runs in the module's own PID namespace. Outside the host's
        initial PID namespace (a container, an init container of a pod without C(hostPID)) the holder scan is otherwise
        incomplete and nothing is removed.
      - Set it in an init container only when the directory is the pod's own (an C(emptyDir)) and no container of the pod runs
        yet (init containers run before the others; not with sidecar containers started before it).
    type: bool
    default: false
  in_use:
    description:
      - What to do when a running C(tritonserver) uses O(shm_dir) (or its root cannot be read).
      - V(fail) (the default) fails the task with the server's pid and changes nothing.
      - V(skip) changes nothing either, but returns C(changed=false) with the reason in RV(in_use) and a warning, for a step that
        runs whether or not a server is up (the C(tritonops.shm.triton_server) role's, a systemd C(ExecStartPre) of one of
        several servers sharing the host's C(/dev/shm)).
    type: str
    choices: [fail, skip]
    default: fail
  lock_dir:
    description:
      - The directory of the run locks, as O(tritonops.shm.triton_shm_region#module:lock_dir) (one run per shm directory,
        shared with that module). Default C(/run/tritonops_shm) for root.
    type: path
notes:
  - Run as root (C(become)) so that every process can be read; otherwise the scan is incomplete and nothing is removed.
  - The refusal compares filesystems, not paths. Two directories of one tmpfs are one filesystem; a server whose C(/dev/shm) is
    another filesystem does not stop a sweep.
  - "The refusal trusts no name either way: any process called C(tritonserver), whoever runs it (a user's fake too), stops a
    sweep of its C(/dev/shm)'s filesystem. That errs on the side of removing nothing; O(in_use=skip) makes it a warning."
  - "O(shm_dir) is not required to be a tmpfs (a server's C(/dev/shm) may be a bind mount of a disk directory). Wherever it
    points (V(/tmp), V(/)), the same rules hold: only single-link regular files of the pool or family names, of the directory's
    owner or O(client_users), no process holds, older than O(min_age)."
seealso:
  - module: tritonops.shm.triton_shm_region
    description: Cleans a running server's shm directory through its URL (C(backend_leftovers), C(families)).
  - module: tritonops.shm.triton_shm_info
"""

EXAMPLES = r"""
- name: Before Triton starts with --ipc=host, clean what the last server left in /dev/shm
  tritonops.shm.triton_shm_sweep:
    shm_dir: /dev/shm
  become: true

- name: Also NCCL's and vLLM's old files, and the pools of a custom prefix
  tritonops.shm.triton_shm_sweep:
    shm_dir: /dev/shm
    families: [nccl, vllm]
    backend_patterns: ["rank0_*"]
    client_users: [triton]
    min_age: 60
  become: true
  register: sweep

- name: What it would remove (nothing is)
  tritonops.shm.triton_shm_sweep:
    shm_dir: /dev/shm
  check_mode: true
  become: true
"""

RETURN = r"""
removed_files:
  description: Paths of the files removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: ["/dev/shm/triton_python_backend_shm_region_4f5c1f8e-9b5d-4a63-8d0e-2d5c2f1a7b21"]
freed_bytes:
  description: Bytes of the shm filesystem the removed files occupied (in check mode, would free).
  returned: always
  type: int
kept:
  description: Every file of the directory that stays, with its category (as
    RV(tritonops.shm.triton_shm_info#module:files[].category)) and why.
  returned: always
  type: list
  elements: dict
  contains:
    path: {description: The file's path., type: str}
    category:
      description: Its category (V(backend), V(in_use), V(foreign), and so on).
      type: str
    reason: {description: Why it stays., type: str}
kept_counts:
  description: The kept files counted by category.
  returned: always
  type: dict
  sample: {foreign: 3, backend: 2}
skipped_items:
  description: Files planned for removal that stayed (taken by a process at the re-check, replaced, already gone), with the
    reason.
  returned: always
  type: list
  elements: dict
shm_dir:
  description: The directory swept, as given.
  returned: always
  type: str
scan:
  description: The holder scan the run decided from.
  returned: always
  type: dict
  contains:
    holders_complete: {description: Whether every process could be seen; when false nothing is removed., type: bool}
    holders_incomplete_reason: {description: Why not; null when complete., type: str}
    pid_namespace:
      description: V(initial) in the host's initial PID namespace, else V(other).
      type: str
in_use:
  description: With O(in_use=skip), why a running server stopped the sweep (nothing was read or changed); null otherwise.
  returned: always
  type: str
used_bytes_before:
  description: The shm filesystem's used bytes when it was read.
  returned: always
  type: int
used_bytes_after:
  description: Its used bytes after the removal (the same as RV(used_bytes_before) in check mode or when nothing was removed).
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.tritonops.shm.plugins.module_utils.rules.classification import DEFAULT_MIN_AGE
from ansible_collections.tritonops.shm.plugins.module_utils.run.base import backend_argument_spec, run_operation
from ansible_collections.tritonops.shm.plugins.module_utils.run.sweep import Sweep


def main() -> None:
    argument_spec = backend_argument_spec()
    argument_spec.update(
        shm_dir=dict(type='path', required=True),
        families=dict(type='list', elements='str', default=[]),
        extra_families=dict(type='list', elements='dict', default=[]),
        min_age=dict(type='float', default=DEFAULT_MIN_AGE),
        clients_share_pid_namespace=dict(type='bool', default=False),
        in_use=dict(type='str', choices=['fail', 'skip'], default='fail'),
        lock_dir=dict(type='path'),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    run_operation(module, Sweep(module.params, module.check_mode, module.warn))


if __name__ == '__main__':
    main()
