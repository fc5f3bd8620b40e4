"""Unit tests for module_utils/errors.py: one family, each condition a class, and the failure a module returns."""

from __future__ import annotations

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ClientShmDisabled,
    DiscoveryError,
    LockError,
    ParameterError,
    RegionInUse,
    RegionNotFound,
    RegisterOverflow,
    ReservedKey,
    ServerNotFound,
    ShmFsError,
    ShmUnsupported,
    TritonError,
    TritonOpsError,
    UnaddressableName,
    classify,
)


@pytest.mark.parametrize(
    'cls,parent',
    [
        (ParameterError, TritonOpsError),
        (ShmFsError, TritonOpsError),
        (LockError, ShmFsError),
        (DiscoveryError, TritonOpsError),
        (ServerNotFound, DiscoveryError),
        (TritonError, TritonOpsError),
        (UnaddressableName, TritonError),
        (RegionInUse, TritonError),
        (RegionNotFound, TritonError),
        (RegisterOverflow, TritonError),
        (ReservedKey, TritonError),
        (ClientShmDisabled, TritonError),
        (ShmUnsupported, TritonError),
    ],
)
def test_one_family(cls, parent):
    assert cls.__bases__ == (parent,)
    err = cls('what at where: why')
    assert isinstance(err, TritonOpsError) and isinstance(err, Exception)
    assert err.msg == str(err) == 'what at where: why'


@pytest.mark.parametrize(
    'text,cls',
    [
        ("Cannot unregister shared memory region 'r', it is currently in use.", RegionInUse),  # Triton >= 2.50
        ("Unable to find system shared memory region: 'r'", RegionNotFound),
        ("Unable to find cuda shared memory region: 'g'", RegionNotFound),
        ("shared memory region 'r' already in manager", TritonError),
        ('failed to register shared memory region: invalid args', TritonError),
        (
            'Integer overflow detected: byte_size (18446744073709551615) + offset (1) exceeds maximum value '  # >= 2.58
            "(18446744073709551615) for region 'r'",
            RegisterOverflow,
        ),
        (
            "cannot register shared memory region 'r' with key 'triton_python_backend_shm_region_x' as the key contains the "
            "reserved prefix 'triton_python_backend_shm_region_'",
            ReservedKey,
        ),  # >= 2.60
        ("cannot register shared memory region 'r' - invalid shm key '///'", ReservedKey),  # >= 2.61
        (
            "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.",
            ClientShmDisabled,
        ),
        ('Shared memory is not supported in this server configuration.', ShmUnsupported),  # 2.73 frontend
        ('', TritonError),
        (None, TritonError),
    ],
)
def test_classify_reads_the_servers_text_once(text, cls):
    assert classify(text) is cls


@pytest.mark.parametrize(
    'cls,in_use,not_found,unaddressable',
    [
        (TritonError, False, False, False),
        (RegionInUse, True, False, False),
        (RegionNotFound, False, True, False),
        (UnaddressableName, False, False, True),
    ],
)
def test_the_condition_is_the_class(cls, in_use, not_found, unaddressable):
    err = cls('m')
    assert (err.in_use, err.not_found, err.unaddressable) == (in_use, not_found, unaddressable)


def test_the_failure_a_module_returns_keeps_the_transports_own_code_and_says_which():
    http = RegionInUse('m', url='http://h:8000/v2/x', status=400, server_error='busy', transport='http')
    grpc = RegionInUse('m', url='grpc://h:8001', status='INTERNAL', server_error='busy', transport='grpc')
    assert http.as_dict() == dict(url='http://h:8000/v2/x', status=400, server_error='busy')
    assert http.failure() == dict(url='http://h:8000/v2/x', status=400, server_error='busy', transport='http')
    assert grpc.failure() == dict(url='grpc://h:8001', status='INTERNAL', server_error='busy', transport='grpc')
    assert TritonError('m', url='u').failure() == dict(url='u', status=None, server_error=None), (
        'not raised by a client'
    )
