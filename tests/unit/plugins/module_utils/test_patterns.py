"""Unit tests for module_utils/rules/patterns.py: the one pattern test of the modules and the role's filters."""

from __future__ import annotations

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.rules.patterns import literal, matches


@pytest.mark.parametrize(
    'name, patterns, expected',
    [
        ('warm_1', ['warm_*'], True),
        ('Warm_1', ['warm_*'], False),  # case-sensitive, as Triton names are
        ('a', [], False),
        ('a', None, False),
        ('b', ['a', 'b'], True),
        ('x?', ['x[?]'], True),
    ],
)
def test_matches(name, patterns, expected):
    assert matches(name, patterns) is expected


@pytest.mark.parametrize('name', ['plain', 'a*b', 'q?', 'br[0]', '[*?]'])
def test_literal_matches_exactly_the_name(name):
    assert matches(name, [literal(name)])
    assert not matches(name + 'x', [literal(name)])
    assert not matches('z' + name[1:], [literal(name)]) or name[0] == 'z'
