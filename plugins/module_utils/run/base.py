# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Module glue shared by every module of the collection.

Private to the tritonops.shm collection: no stability promise to other code.

- connection_argument_spec(): the connection options of connection.OPTIONS, their one definition (documented
  once, in the doc fragment tritonops.shm.triton; the other copies are checked against it);
  shm_dir_argument_spec() and backend_argument_spec() add the options that locate the server's
  shm directory and tell the python backend's files.
- make_client(): the client.Client for those options. The URL's scheme picks the transport:
  triton_http.TritonClient for http(s), triton_grpc.TritonGrpcClient for grpc(s); the transport's
  library is checked once, and the options neither transport checks (timeout, TLS files) here.
- run_operation(): runs an operation.Operation (the run protocol, operation.py: read -> plan -> execute -> result)
  as the module's call: exit_json with its result, or fail_json with the message and the work already done.
- time_limit_argument_spec(): the call's own deadline (doc fragment tritonops.shm.triton.time_limit), started by
  make_client() (time_limit.py): its requests are bounded by the time left, and the call stops by itself at it.
- run_module_main(): the one place where a TritonOpsError becomes fail_json: ``msg`` always, the
  ``failure`` of a TritonError (url, status, server_error, transport), and the work already done.
- metrics_argument_spec() and write_metrics(): the node_exporter textfile options (doc fragment
  tritonops.shm.triton.metrics), written by the module call that read the server (metrics.py).

Modules pass only their own options; they never talk HTTP or gRPC themselves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Callable

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

from ansible_collections.tritonops.shm.plugins.module_utils.errors import ParameterError, TritonError, TritonOpsError
from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics, outputs
from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import BACKEND_PATTERNS, WEDGED_AFTER
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import Operation, run_steps
from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection, time_limit
from ansible_collections.tritonops.shm.plugins.module_utils.wire.client import (
    Client,
    check_headers,
    check_url,
    is_grpc_url,
)
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_grpc import TritonGrpcClient
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient


def connection_argument_spec() -> dict:
    """Connection options shared by every module of the collection: connection.OPTIONS, with its environment fallbacks
    (documented in the doc fragment tritonops.shm.triton)."""
    spec = connection.argument_spec()
    for name, option in connection.OPTIONS.items():
        if option.env:
            spec[name]['fallback'] = (env_fallback, [option.env])
    return spec


def shm_dir_argument_spec() -> dict:
    """Connection options plus the options that locate the server's shm directory on this host, and the operator's
    statement that every client runs in the module's PID namespace (holders.visibility())."""
    spec = connection_argument_spec()
    spec.update(
        server_pid=dict(type='int'),
        shm_dir=dict(type='path'),
        clients_share_pid_namespace=dict(type='bool', default=False),
    )
    return spec


def backend_argument_spec() -> dict:
    """The options that tell whose files the shm directory holds (doc fragment tritonops.shm.triton.backend).

    backend_patterns: Triton's python backend files; client_users: the owners, besides the server's user, whose
    files a cleanup may remove (authority.py, the owner rule).
    """
    return dict(
        backend_patterns=dict(type='list', elements='str', default=list(BACKEND_PATTERNS)),
        client_users=dict(type='list', elements='str', default=[]),
    )


def wedged_argument_spec() -> dict:
    """When a region Triton will not let go is wedged, and whose files are other software's (doc fragment
    tritonops.shm.triton.wedged; wedged.py, families.py)."""
    return dict(
        wedged_after=dict(type='int', default=WEDGED_AFTER),
        extra_families=dict(type='list', elements='dict', default=[]),
    )


def time_limit_argument_spec() -> dict:
    """The call's own time limit (doc fragment tritonops.shm.triton.time_limit), enforced by time_limit.py."""
    return dict(time_limit=dict(type='float'))


def metrics_argument_spec() -> dict:
    """The node_exporter textfile options (doc fragment tritonops.shm.triton.metrics)."""
    return dict(
        metrics_dir=dict(type='path'),
        metrics_host=dict(type='str'),
        metrics_dir_missing=dict(type='str', choices=list(METRICS_DIR_MISSING), default='warn'),
    )


METRICS_DIR_MISSING = ('warn', 'skip')


METRICS_REQUIRED_BY = {'metrics_dir': 'metrics_host'}


def write_metrics(
    module: AnsibleModule, report: Mapping | None = None, with_report: bool = False, outcome: Mapping | None = None
) -> dict:
    """Write this call's textfiles when metrics_dir is set, outside check mode; the result key ``metrics_files``.

    Never fails the module: a directory that cannot take them is one warning. Not a change.
    """
    p = module.params
    if not p.get('metrics_dir'):
        return {}
    if module.check_mode:
        return {'metrics_files': []}
    if p.get('metrics_dir_missing') == 'skip' and not os.path.lexists(p['metrics_dir']):
        # nobody collects metrics on this host: said once per run by the playbook, not warned per call
        return {'metrics_files': [], 'metrics_skipped': outputs.dir_refusal(p['metrics_dir'])}
    try:
        done = metrics.write_server_metrics(
            p['metrics_dir'], p['metrics_host'], p['url'], report=report, with_report=with_report, outcome=outcome
        )
    except Exception as exc:  # pylint: disable=broad-exception-caught
        # written after the call's changes: whatever goes wrong here must not lose the result (what was done)
        module.warn(f'{p["metrics_dir"]}: no metrics written ({type(exc).__name__}: {exc})')
        return {'metrics_files': []}
    for warning in done.warnings:
        module.warn(warning)
    return {'metrics_files': done.paths}


def check_connection_params(params: dict) -> None:
    """ParameterError for a URL with credentials, a bad header, a timeout or TLS file no transport could use.

    Checked before anything is sent; the messages never show a header's value or a URL's password.
    """
    check_url(params['url'])
    check_headers(params.get('headers'))
    timeout = params['timeout']
    if timeout is not None and timeout <= 0:
        raise ParameterError(f'timeout must be a positive number of seconds, got {timeout}')
    for opt in ('ca_path', 'client_cert', 'client_key'):
        path = params.get(opt)
        if path and not (os.path.isfile(path) or (opt == 'ca_path' and os.path.isdir(path))):
            raise ParameterError(f'{opt} {path} does not exist or is not a file')


def make_client(module: AnsibleModule) -> Client:
    """The client for the module's connection options; fail_json on a missing library or a bad option.

    The URL's scheme picks the transport: grpc:// and grpcs:// the gRPC client (triton_grpc), anything
    else the HTTP one (triton_http). Both implement client.Client: the same calls, results and errors.
    """
    params = module.params
    if params.get('time_limit') is not None and params['time_limit'] <= 0:
        module.fail_json(msg=f'time_limit must be a positive number of seconds, got {params["time_limit"]:g}')
    # the call's own deadline, before anything is sent: it stops by itself, whoever waits for it
    time_limit.start(params.get('time_limit'))
    # a URL with credentials is refused below; its password is masked in whatever the module returns (invocation too)
    module.no_log_values.update(connection.url_secrets(params['url']))
    transport = TritonGrpcClient if is_grpc_url(params['url']) else TritonClient
    library = transport.library()
    if not library.ok:
        module.fail_json(msg=missing_required_lib(library.requirement, reason=library.reason), exception=library.error)
    try:
        check_connection_params(params)
        client = transport.from_params(params)
    except TritonOpsError as exc:
        module.fail_json(msg=exc.msg)
    if client.scheme == 'https' and not params['validate_certs']:
        module.warn(f'validate_certs is false: the TLS certificate of {client.base} is not verified')
    return client


def run_module_main(
    module: AnsibleModule,
    body: Callable[[], None],
    partial: Callable[[], dict] | None = None,
    on_failure: Callable[[dict], dict] | None = None,
) -> None:
    """Run body(); turn every TritonOpsError into fail_json with its msg (a TritonError adds ``failure``).

    partial: a callable returning the result keys of work already done, reported on failure.
    on_failure: called with the failure's result keys before fail_json (the metrics); returns keys to add.
    """
    try:
        body()
    except TritonOpsError as exc:
        result = {
            'msg': exc.msg,
            **({'failure': exc.failure()} if isinstance(exc, TritonError) else {}),
            **(partial() if partial else {}),
        }
        if on_failure is not None:
            result.update(on_failure(result))
        time_limit.stop()  # the result is written: no alarm may interrupt it (a second, broken answer)
        module.fail_json(**result)


def run_operation(
    module: AnsibleModule,
    op: Operation,
    finish: Callable[[dict], Mapping] | None = None,
    on_failure: Callable[[dict], dict] | None = None,
) -> None:
    """Run op as the module's call: exit_json with its result, or fail_json with the message and what was done."""

    def body() -> None:
        result = run_steps(op, module.check_mode, finish)
        time_limit.stop()  # the result is written: no alarm may interrupt it (a second, broken answer)
        module.exit_json(**result)

    def partial() -> dict:
        return {} if op.outcome is None else op.result(op.outcome, finished=False)

    run_module_main(module, body, partial=partial, on_failure=on_failure)
