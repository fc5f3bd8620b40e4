"""Fixtures for integration tests: real tritonserver processes with private /dev/shm."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'rig'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tritonrig  # noqa: E402  pylint: disable=wrong-import-position


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason='integration tests need root: mount namespaces for private /dev/shm')
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def triton(tmp_path):
    """A started server (64 MiB private /dev/shm, echo python model); stopped after the test."""
    server = tritonrig.TritonServer(workdir=str(tmp_path), shm_size='64m')
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_triton(tmp_path):
    """Factory for extra servers: make_triton(shm_size='16m', models=(), host=...)."""
    servers = []

    def factory(**kwargs):
        kwargs.setdefault('workdir', str(tmp_path))
        kwargs.setdefault('name', 'triton%d' % (len(servers) + 1))
        server = tritonrig.TritonServer(**kwargs)
        servers.append(server)
        return server.start()
    try:
        yield factory
    finally:
        for server in servers:
            server.stop()
