#!/usr/bin/python
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: triton_backend_pool
short_description: Reclaim a grown python backend pool online by reloading its model
version_added: 0.2.0
description:
  - Every instance of a Python-based model (python, vLLM, ...) has a shared-memory pool in the server's C(/dev/shm),
    C(triton_<backend>_backend_shm_region_<uuid>). It starts at the python backend's C(shm-default-byte-size) and grows by
    C(shm-growth-byte-size) when a request needs more. It never shrinks.
  - This module reads the pools per model (as RV(tritonops.shm.triton_shm_info#module:backend_pools)), and reloads each model
    whose pools together are over O(max_bytes) or O(max_percent) of the shm filesystem, through Triton's repository API
    (C(POST /v2/repository/models/<model>/load), gRPC C(RepositoryModelLoad) for C(grpc://) URLs).
  - Triton loads the new instances beside the old ones and switches over; the new instances get new pools of
    C(shm-default-byte-size), and the old pools go with the old instances. The module then waits until the old pool files are
    gone and reports the bytes before and after.
  - Triton 2.51 does nothing for a load of a model whose files and configuration did not change. So the reload sends the
    model's own configuration (as the server completed it, C(GET /v2/models/<model>/config)) with one parameter,
    C(tritonops_shm_reload), set to a new value. The model then runs on that configuration (the repository's plus that
    parameter) until the server restarts or the model is loaded again.
  - Only a server started with C(--model-control-mode=explicit) accepts loads. The mode is read from the server process's
    command line; a server in another mode is refused with the reason (also in check mode), and so is a load Triton
    refuses.
  - A reload costs a few seconds of a second set of instances (their memory, a new python stub each, a second pool of
    C(shm-default-byte-size) per instance until the old one goes). Measured on Triton 2.51, no request to a plain python model,
    an ensemble with a python step or a BLS model failed during the reload; a stateful model (C(sequence_batching)) lost every
    sequence in flight, so stateful and decoupled models are skipped unless O(allow_stateful) (docs/backend-pools.md). Opt-in
    only.
  - A pool is reloaded only when its model is proven by its stub (a child of the server, its user, its stub program), never on
    a command line's word (RV(tritonops.shm.triton_shm_info#module:backend_pools[].unattributed_reason)).
author:
  - tritonops.shm developers (@tritonops)
extends_documentation_fragment:
  - tritonops.shm.triton
  - tritonops.shm.triton.shm_dir
  - tritonops.shm.triton.time_limit
attributes:
  check_mode:
    support: full
    description: Reports the models it would reload (RV(reloaded), with C(before_bytes) only) and loads nothing.
  diff_mode:
    support: none
    description: No diff.
  idempotent:
    support: full
    description: After a reload the pools are small again, so a second run with the same limits reloads
      nothing (C(changed=false)).
options:
  backend_patterns:
    description:
      - Shell-style patterns (case-sensitive) of the files Triton's Python-based backends keep in the shm directory, as for
        M(tritonops.shm.triton_shm_info). C(triton_<backend>_backend_shm_region_<uuid>) is always one, whatever this list says.
      - Add a pattern when the server runs with C(--backend-config=python,shm-region-prefix-name=PREFIX), for example V(PREFIX*).
    type: list
    elements: str
    default: ["triton_*_backend_shm_region_*"]
  max_bytes:
    description:
      - Reload a model when its pools (all its instances together) occupy more than this many bytes of the shm filesystem.
      - With O(max_percent) too, the smaller limit applies. At least one of the two is required.
    type: int
  max_percent:
    description:
      - Reload a model when its pools occupy more than this percentage of the size of the server's shm filesystem
        (the container's C(--shm-size)).
    type: float
  models:
    description:
      - Only these models are considered. Empty (the default) considers every model that has a pool.
    type: list
    elements: str
    default: []
  allow_stateful:
    description:
      - Reload a model over the limit even when its configuration has C(sequence_batching) (a stateful model) or is decoupled
        (C(model_transaction_policy.decoupled)).
      - By default such a model is skipped (RV(models[].action) V(skip)) with the reason, and a warning. Measured on Triton 2.51,
        a reload drops every sequence in flight (its next request is refused), while a plain python model, an ensemble's python
        step, a BLS caller and a model a BLS call reaches lost no request (docs/backend-pools.md).
    type: bool
    default: false
    version_added: 0.3.0
  load_timeout:
    description: Seconds to wait for the server's answer to one load (loading a large model takes long).
    type: float
    default: 300
  wait:
    description:
      - Seconds to wait, after the load's answer, for the old pool files to go. Triton unloads the old instances after it
        switched over (about 1 s on Triton 2.51). The module fails when one is still there, with what it did so far.
    type: float
    default: 60
requirements:
  - tritonclient[grpc] (only for grpc:// and grpcs:// URLs)
notes:
  - "Run as root (C(become)), as for M(tritonops.shm.triton_shm_info): the pools are attributed to their models from the python
    stubs' command lines, which must be readable, and the server's command line tells its model control mode."
  - A pool of unknown model (no stub maps it) and a C(leftover) pool (a dead server's) are never reloaded; the cleanup
    (M(tritonops.shm.triton_shm_region) O(tritonops.shm.triton_shm_region#module:backend_leftovers)) removes leftovers.
seealso:
  - module: tritonops.shm.triton_shm_info
  - ref: tritonops.shm.shm_cleanup role <ansible_collections.tritonops.shm.shm_cleanup_role>
    description: Its C(shm_cleanup_reload_pools_over_bytes) and C(shm_cleanup_reload_pools_over_percent) run this module.
"""

EXAMPLES = r"""
- name: Reload every model whose python backend pools passed 1 GiB or 25 % of /dev/shm
  tritonops.shm.triton_backend_pool:
    url: http://127.0.0.1:8000
    max_bytes: 1073741824
    max_percent: 25
  become: true
  register: pools

- name: Say what was reclaimed
  ansible.builtin.debug:
    msg: "{{ item.model }}: {{ item.before_bytes }} -> {{ item.after_bytes }} bytes"
  loop: "{{ pools.reloaded }}"

- name: What would be reloaded (nothing is)
  tritonops.shm.triton_backend_pool:
    url: grpc://127.0.0.1:8001
    max_percent: 20
    models: [preprocess]
  check_mode: true
  become: true
"""

RETURN = r"""
models:
  description: Every model with a live pool (after O(models) filtering), with what was decided for it.
  returned: always
  type: list
  elements: dict
  contains:
    model: {description: Model name., type: str, sample: preprocess}
    action:
      description: V(reload) over the limit (reloaded, or would be in check mode); V(keep) not over; V(skip)
        over, but not reloadable.
      type: str
    bytes: {description: Bytes of shm its pools occupy before any reload., type: int}
    limit: {description: The limit in bytes that applied (the smaller of O(max_bytes) and O(max_percent))., type: int}
    instances: {description: Its instances that map a pool (for example V(preprocess_0_0))., type: list, elements: str}
    pools: {description: Its pool file names., type: list, elements: str}
    reason: {description: Why., type: str}
reloaded:
  description: The models reloaded (in check mode, that would be), in order.
  returned: always
  type: list
  elements: dict
  contains:
    model: {description: Model name., type: str}
    before_bytes: {description: Bytes of its pools before the reload., type: int}
    after_bytes: {description: Bytes of its pools after it (null in check mode)., type: int}
    old_pools: {description: The pool files of the old instances., type: list, elements: str}
    new_pools: {description: The pool files of the new instances (empty in check mode)., type: list, elements: str}
    old_gone: {description: Whether every old pool file is gone (null in check mode)., type: bool}
    seconds: {description: Time from the load to the old pools' removal (null in check mode)., type: float}
model_control:
  description: The server's C(--model-control-mode) read from its command line; null when it could not be read.
  returned: always
  type: str
  sample: explicit
shm_fs:
  description: The server's shm filesystem before any reload (as RV(tritonops.shm.triton_shm_info#module:shm_fs)).
  returned: always
  type: dict
holders_complete:
  description:
    - Whether every process that may map the server's files could be seen. A pool that no process is seen to hold is never
      reloaded (it is not C(live)); see O(clients_share_pid_namespace).
  returned: always
  type: bool
  version_added: 0.2.0
holders_incomplete_reason:
  description: Why RV(holders_complete) is false; null when it is true.
  returned: always
  type: str
  version_added: 0.2.0
pid_namespace:
  description: V(initial) when the module ran in the host's initial PID namespace, else V(other).
  returned: always
  type: str
  sample: initial
  version_added: 0.2.0
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.tritonops.shm.plugins.module_utils.run.backend_pool import PoolReload
from ansible_collections.tritonops.shm.plugins.module_utils.run.base import (
    backend_argument_spec,
    make_client,
    run_operation,
    shm_dir_argument_spec,
    time_limit_argument_spec,
)


def main() -> None:
    argument_spec = shm_dir_argument_spec()
    argument_spec.update(time_limit_argument_spec())
    # client_users decides whose files a cleanup removes: this module removes none (the reload's server does)
    argument_spec.update({k: v for k, v in backend_argument_spec().items() if k != 'client_users'})
    argument_spec.update(
        max_bytes=dict(type='int'),
        max_percent=dict(type='float'),
        models=dict(type='list', elements='str', default=[]),
        allow_stateful=dict(type='bool', default=False),
        load_timeout=dict(type='float', default=300.0),
        wait=dict(type='float', default=60.0),
    )
    module = AnsibleModule(
        argument_spec=argument_spec, required_one_of=[('max_bytes', 'max_percent')], supports_check_mode=True
    )
    run_operation(module, PoolReload(make_client(module), module.params, module.warn, module.check_mode))


if __name__ == '__main__':
    main()
