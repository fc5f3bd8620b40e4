"""The indexes list every page: docs/README.md and README.md link every docs/*.md page, and docs/README.zh.md and
README.zh.md every one in both languages; every English page has its 中文 page."""

from __future__ import annotations

import glob
import os
import re

import pytest
from doc_sources import COLLECTION, read

DOCS = os.path.join(COLLECTION, 'docs')
PAGES = sorted(
    os.path.basename(p)
    for p in glob.glob(os.path.join(DOCS, '*.md'))
    if not p.endswith('.zh.md') and os.path.basename(p) != 'README.md'
)


def links(path: str) -> set[str]:
    return {t.split('#')[0] for t in re.findall(r'\]\(([^)]+)\)', read(path)) if '://' not in t}


@pytest.mark.parametrize('page', PAGES)
def test_every_page_has_its_chinese_page(page):
    assert os.path.isfile(os.path.join(DOCS, page[:-3] + '.zh.md')), page


@pytest.mark.parametrize(
    'index, prefix',
    [('docs/README.md', ''), ('docs/README.zh.md', ''), ('README.md', 'docs/'), ('README.zh.md', 'docs/')],
)
def test_indexes_list_every_page_in_both_languages(index, prefix):
    found = links(os.path.join(COLLECTION, index))
    wanted = {prefix + p for p in PAGES} | {prefix + p[:-3] + '.zh.md' for p in PAGES}
    assert wanted - found == set(), f'{index} does not link {sorted(wanted - found)}'
    for target in found:
        if not target.startswith('#'):
            assert os.path.exists(os.path.join(os.path.dirname(os.path.join(COLLECTION, index)), target)), target
