# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Module glue shared by every module of the collection.

Private to the tritonops.shm collection: no stability promise to other code.
The connection options (documented once, in the doc fragment tritonops.shm.triton),
the client built from them, and the one way failures become fail_json results.
Modules pass only their own options; the transport lives in triton_api.
"""
from __future__ import annotations

import os

from ansible.module_utils.basic import env_fallback, missing_required_lib

from ansible_collections.tritonops.shm.plugins.module_utils import triton_grpc
from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError, TritonOpsError
from ansible_collections.tritonops.shm.plugins.module_utils.shm_fs import BACKEND_PATTERNS
from ansible_collections.tritonops.shm.plugins.module_utils.triton_api import (
    HAS_REQUESTS, REQUESTS_IMPORT_ERROR, TritonClient,
)


def connection_argument_spec():
    """Connection options shared by every module of the collection (see doc fragment tritonops.shm.triton)."""
    return dict(
        url=dict(type='str', required=True, fallback=(env_fallback, ['TRITON_URL'])),
        timeout=dict(type='float', default=10.0),
        validate_certs=dict(type='bool', default=True),
        ca_path=dict(type='path'),
        headers=dict(type='dict', default={}, no_log=True),
        client_cert=dict(type='path'),
        client_key=dict(type='path', no_log=False),
    )


def shm_dir_argument_spec():
    """Connection options plus the options that locate the server's shm directory on this host."""
    spec = connection_argument_spec()
    spec.update(
        server_pid=dict(type='int'),
        shm_dir=dict(type='path'),
    )
    return spec


def backend_argument_spec():
    """The option that tells Triton's python backend files (doc fragment tritonops.shm.triton.backend)."""
    return dict(backend_patterns=dict(type='list', elements='str', default=list(BACKEND_PATTERNS)))


def make_client(module):
    """A client from the module's connection options; fail_json on a missing library or a bad URL.

    The URL's scheme picks the transport: grpc:// and grpcs:// the gRPC client (triton_grpc), anything
    else the HTTP one. Both offer the same calls with the same results and errors.
    """
    params = module.params
    grpc = triton_grpc.is_grpc_url(params['url'])
    if grpc and triton_grpc.load_grpc() is not None:
        module.fail_json(msg=missing_required_lib(triton_grpc.GRPC_REQUIREMENT, reason='for grpc:// and grpcs:// URLs'),
                         exception=triton_grpc.load_grpc())
    if not grpc and not HAS_REQUESTS:
        module.fail_json(msg=missing_required_lib('requests'), exception=REQUESTS_IMPORT_ERROR)
    if params['timeout'] is not None and params['timeout'] <= 0:
        module.fail_json(msg='timeout must be a positive number of seconds, got %s' % params['timeout'])
    for opt in ('ca_path', 'client_cert', 'client_key'):
        path = params.get(opt)
        if path and not (os.path.isfile(path) or (opt == 'ca_path' and os.path.isdir(path))):
            module.fail_json(msg='%s %s does not exist or is not a file' % (opt, path))
    try:
        client = (triton_grpc.TritonGrpcClient if grpc else TritonClient).from_params(params)
    except TritonError as exc:
        module.fail_json(msg=exc.msg)
    if client.scheme == 'https' and not params['validate_certs']:
        module.warn('validate_certs is false: the TLS certificate of %s is not verified' % client.base)
    return client


def run_module_main(module, body, partial=None):
    """Run body(); turn TritonError and filesystem refusals into fail_json with a clear msg.

    partial: a callable returning the result keys of work already done, reported on failure.
    """
    try:
        body()
    except TritonError as exc:
        extra = partial() if partial else {}
        module.fail_json(msg=exc.msg, failure=exc.as_dict(), **extra)
    except TritonOpsError as exc:
        extra = partial() if partial else {}
        module.fail_json(msg=exc.msg, **extra)
