"""Every piece of YAML a user may copy parses: each plugin's EXAMPLES (modules, filters and tests with their
sidecar docs, event sources) and each ```yaml block of README.md, README.zh.md, docs/**/*.md and the roles'
READMEs. Jinja inside is fine as long as it is valid YAML (quoted where YAML needs it)."""

from __future__ import annotations

import ast
import os
import re

import pytest
import yaml
from doc_sources import COLLECTION, Block, examples, markdown_pages, plugin_files, read, yaml_blocks

BLOCKS = yaml_blocks()


def test_every_source_is_read():
    # a page or plugin the globs stop finding would pass silently
    pages = [p.rsplit('/', 1)[-1] for p in markdown_pages()]
    assert {'README.md', 'README.zh.md', 'runbook.md', 'awx.md'} <= set(pages)
    assert len([p for p in plugin_files() if '/modules/' in p]) >= 4
    wanted = {
        'plugins/filter/shm_size.yml',
        'plugins/modules/triton_shm_region.py',
        'extensions/eda/plugins/event_source/triton_shm.py',
    }
    assert {b.where for b in examples()} >= wanted
    assert len(BLOCKS) > 100


@pytest.mark.parametrize('block', BLOCKS, ids=[b.where for b in BLOCKS])
def test_yaml_parses(block: Block):
    try:
        loaded = yaml.safe_load(block.text)
    except yaml.YAMLError as exc:
        pytest.fail(f'{block.where}: not valid YAML: {exc}')
    assert loaded is not None, f'{block.where}: empty'


def test_alertmanager_examples_are_the_tested_config():
    """Every Alertmanager route the docs show groups and resolves as the alert chain's tested Alertmanager
    (tests/integration/observability.py): one config across metrics.md and self-healing.md, in both languages."""
    tested = read(os.path.join(COLLECTION, 'tests', 'integration', 'observability.py'))
    group_by = ast.literal_eval(re.search(r"'group_by': (\[[^]]*\])", tested).group(1))
    send_resolved = ast.literal_eval(re.search(r"'send_resolved': (True|False)", tested).group(1))
    shown = []
    for block in BLOCKS:
        if 'receivers:' not in block.text:
            continue
        loaded = yaml.safe_load(block.text)
        if not (isinstance(loaded, dict) and 'receivers' in loaded):
            continue
        for route in loaded['route'].get('routes', [loaded['route']]):
            assert route['group_by'][: len(group_by)] == group_by, block.where
        for receiver in loaded['receivers']:
            for hook in receiver['webhook_configs']:
                assert hook.get('send_resolved', True) is send_resolved, block.where
        shown.append(block.where.split(':')[0])
    assert {'docs/metrics.md', 'docs/metrics.zh.md', 'docs/self-healing.md', 'docs/self-healing.zh.md'} <= set(shown)
