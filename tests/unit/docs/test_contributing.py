"""CONTRIBUTING.md stays a ten-minute read, and its layout table stays current."""

from __future__ import annotations

import os
import re

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..')
GUIDE = os.path.join(ROOT, 'CONTRIBUTING.md')


def _layout_paths() -> list[str]:
    """Every path the Layout table names: `…/x.py` is under the previous row's directory, a bare name under the
    first path of its cell."""
    with open(GUIDE, encoding='utf-8') as f:
        section = f.read().split('## Layout', 1)[1].split('\n## ', 1)[0]
    paths = []
    for row in re.findall(r'^\| (.+?) \| .+ \|$', section, re.M)[2:]:
        base = None
        for name in re.findall(r'`([^`]+)`', row):
            if name.startswith('…/'):
                name = 'plugins/module_utils/' + name[2:]
            elif '/' not in name and base is not None:
                name = os.path.join(os.path.dirname(base), name)
            base = name
            paths.append(name.split(' ')[0])
    return paths


def test_the_guide_is_at_most_7_5_kb():
    # 6 KB until issue 35 added its recipes (what each kind of change touches), 7 KB until issue 43 added how to run the
    # GPU suite on a machine with no network
    assert os.path.getsize(GUIDE) <= 7.5 * 1024


def test_every_path_of_the_layout_table_exists():
    paths = _layout_paths()
    assert len(paths) > 30
    missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p.replace('(EN + `.zh.md`)', '').strip()))]
    assert missing == []


def test_every_module_utils_file_is_in_the_layout_table():
    listed = set(_layout_paths())
    files = {
        f'plugins/module_utils/{f}'
        for f in os.listdir(os.path.join(ROOT, 'plugins', 'module_utils'))
        if f.endswith('.py') and f != '__init__.py'
    }
    assert files - listed == set()
