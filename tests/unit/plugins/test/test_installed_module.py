"""Unit tests for the tritonops.shm.installed_module test: Ansible's own plugin loader, real collections."""

from __future__ import annotations

import os

import pytest
from ansible.errors import AnsibleFilterError
from ansible.plugins.loader import init_plugin_loader

from ansible_collections.tritonops.shm.plugins.test import installed_module as plugin

installed_module = plugin.installed_module

# build/ when the tests run from build/ansible_collections/tritonops/shm (make units)
COLLECTIONS_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *['..'] * 7))


@pytest.fixture(scope='module', autouse=True)
def plugin_loader():
    """The collection loader as ansible-playbook sets it up (the `ansible` package's collections on the Python path)."""
    init_plugin_loader([COLLECTIONS_ROOT])


@pytest.mark.parametrize(
    'name, expected',
    [
        ('ansible.builtin.ping', True),
        ('ping', True),  # a short name resolves as ansible.legacy
        ('ansible.builtin.debug', True),  # a module with its action plugin
        (' ansible.builtin.ping ', True),
        ('community.docker.docker_container', True),  # from the `ansible` package, as the role needs it
        ('containers.podman.podman_container', True),
        ('community.general.docker_container', True),  # a redirect in community.general's meta/runtime.yml
        ('community.general.ali_instance_facts', False),  # removed (a tombstone): a task would fail
        ('no_such_namespace.no_such_collection.module', False),
        ('ansible.builtin.no_such_module', False),
    ],
)
def test_resolves(name, expected):
    assert installed_module(name) is expected


@pytest.mark.parametrize(
    'value, shown',
    [
        ('', "str ''"),
        ('  ', "str '  '"),
        (None, 'NoneType None'),
        (['ansible.builtin.ping'], "list ['ansible.builtin.ping']"),
        (42, 'int 42'),
    ],
)
def test_refuses_what_is_not_a_name(value, shown):
    with pytest.raises(AnsibleFilterError) as err:
        installed_module(value)
    assert str(err.value) == (
        'installed_module: expected a module name such as containers.podman.podman_container, got ' + shown
    )


def test_registered():
    assert plugin.TestModule().tests() == dict(installed_module=installed_module)
