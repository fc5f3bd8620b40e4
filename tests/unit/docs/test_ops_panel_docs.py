"""docs/ops-panel.md and .zh.md: the screenshots exist and are the tests' size, every YAML block parses, the
two languages show the same images and link the same pages, and the docs index links both."""

from __future__ import annotations

import os
import re
import struct

import pytest
import yaml

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = os.path.join(COLLECTION, 'docs')
PAGES = ['ops-panel.md', 'ops-panel.zh.md']


def page(name: str) -> str:
    with open(os.path.join(DOCS, name), encoding='utf-8') as f:
        return f.read()


def images(text: str) -> list:
    return re.findall(r'!\[[^\]]+\]\(([^)]+)\)', text)


def links(text: str) -> set:
    return {
        target.split('#')[0]
        for target in re.findall(r'(?<!!)\[[^\]]*\]\(([^)]+)\)', text)
        if '://' not in target and not target.startswith('#')
    }


@pytest.mark.parametrize('name', PAGES)
def test_screenshots_are_the_tests_pngs(name):
    shown = images(page(name))
    assert shown == ['images/ops-panel-report.png', 'images/ops-panel-cleanup.png']
    for path in shown:
        with open(os.path.join(DOCS, path), 'rb') as f:
            head = f.read(24)
        assert head[:8] == b'\x89PNG\r\n\x1a\n'
        assert struct.unpack('>II', head[16:24]) == (1280, 1600)  # --window-size=1280,1600


@pytest.mark.parametrize('name', PAGES)
def test_yaml_blocks_parse_and_links_resolve(name):
    text = page(name)
    blocks = re.findall(r'```yaml\n(.*?)```', text, re.S)
    assert len(blocks) == 3
    for block in blocks:
        indent = min(len(line) - len(line.lstrip()) for line in block.splitlines() if line.strip())
        assert yaml.safe_load('\n'.join(line[indent:] for line in block.splitlines())) is not None
    for target in links(text):
        assert os.path.exists(os.path.join(DOCS, target)), target


def test_both_languages_say_the_same_and_are_indexed():
    en, zh = page('ops-panel.md'), page('ops-panel.zh.md')
    assert images(en) == images(zh)
    assert {t.replace('.zh.md', '.md') for t in links(zh)} == {t.replace('.zh.md', '.md') for t in links(en)}
    assert re.findall(r'`[a-z_]+\.[a-z_.]+`', en) == re.findall(r'`[a-z_]+\.[a-z_.]+`', zh)  # FQCNs and file names
    assert '[ops-panel.md](ops-panel.md)' in page('README.md') and '[ops-panel.zh.md](ops-panel.zh.md)' in page(
        'README.md'
    )
    assert '[ops-panel.zh.md](ops-panel.zh.md)' in page('README.zh.md')
