"""Unit tests for module_utils/rules/versions.py, the one version parser: a table of texts."""

from __future__ import annotations

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.rules.versions import version_tuple


@pytest.mark.parametrize(
    'text, expected',
    [
        ('2.51.0', (2, 51, 0)),
        ('2.48.0', (2, 48, 0)),
        ('2.68.0-custom', (2, 68, 0)),
        ('2.51.0-0123abcd', (2, 51, 0)),
        ('24.10-py3', (24, 10)),
        ('27.01-py3-min', (27, 1)),
        ('v2.70', (2, 70)),
        ('26', (26,)),
        (' 2.50 ', (2, 50)),
        (26.05, (26, 5)),
        (2, (2,)),
        ('2.', (2,)),
        ('2.51.0rc1', (2, 51, 0)),
        ('latest', None),
        ('V2.51', None),
        ('', None),
        (None, None),
        ('-2.51', None),
    ],
)
def test_version_tuple(text, expected):
    assert version_tuple(text) == expected


def test_versions_compare_as_numbers():
    assert version_tuple('2.9.0') < version_tuple('2.50.0') < version_tuple('2.53') <= version_tuple('2.53.0')
