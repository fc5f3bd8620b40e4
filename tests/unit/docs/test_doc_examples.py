"""Every piece of YAML a user may copy parses: each plugin's EXAMPLES (modules, filters and tests with their
sidecar docs, event sources) and each ```yaml block of README.md, README.zh.md, docs/**/*.md and the roles'
READMEs. Jinja inside is fine as long as it is valid YAML (quoted where YAML needs it)."""
from __future__ import annotations

import pytest
import yaml

from doc_sources import Block, examples, markdown_pages, plugin_files, yaml_blocks

BLOCKS = yaml_blocks()


def test_every_source_is_read():
    # a page or plugin the globs stop finding would pass silently
    pages = [p.rsplit('/', 1)[-1] for p in markdown_pages()]
    assert {'README.md', 'README.zh.md', 'runbook.md', 'awx.md'} <= set(pages)
    assert len([p for p in plugin_files() if '/modules/' in p]) >= 4
    assert {b.where for b in examples()} >= {'plugins/filter/shm_size.yml', 'plugins/modules/triton_shm_region.py',
                                            'extensions/eda/plugins/event_source/triton_shm.py'}
    assert len(BLOCKS) > 100


@pytest.mark.parametrize('block', BLOCKS, ids=[b.where for b in BLOCKS])
def test_yaml_parses(block: Block):
    try:
        loaded = yaml.safe_load(block.text)
    except yaml.YAMLError as exc:
        pytest.fail(f'{block.where}: not valid YAML: {exc}')
    assert loaded is not None, f'{block.where}: empty'
