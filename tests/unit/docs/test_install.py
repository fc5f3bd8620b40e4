"""One install story (issue 44, goal 2): every ``collections/requirements.yml`` the docs show (README, docs/awx, each in
English and 中文) is the same valid file, names this collection by its repository, and ``ansible-galaxy collection
install -r`` installs the collection from it: here with the repository's URL replaced by a git repository of this
checkout (no network), the rest of the entry (type, version) as shown."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml
from doc_sources import COLLECTION, fenced_blocks
from test_execution_environment import galaxy_install, run

PAGES = ('README.md', 'README.zh.md', 'docs/awx.md', 'docs/awx.zh.md')
MARK = '# collections/requirements.yml'

with open(os.path.join(COLLECTION, 'galaxy.yml')) as _f:
    GALAXY = yaml.safe_load(_f)


def _shown() -> dict[str, str]:
    """The requirements file each page shows (the ```yaml block that starts with MARK), by page."""
    found = {}
    for page in PAGES:
        blocks = [b for b in fenced_blocks(os.path.join(COLLECTION, page)) if b.text.startswith(MARK)]
        assert len(blocks) == 1, f'{page}: {len(blocks)} blocks start with {MARK!r}'
        assert blocks[0].lang == 'yaml', blocks[0].where
        found[page] = blocks[0].text
    return found


def test_every_page_shows_the_same_requirements_file_naming_this_collection():
    shown = _shown()
    # the same file; its comments may be translated
    assert len({json.dumps(yaml.safe_load(text)) for text in shown.values()}) == 1, shown
    (entry,) = yaml.safe_load(shown['README.md'])['collections']
    assert entry == {'name': GALAXY['repository'] + '.git', 'type': 'git', 'version': 'main'}


@pytest.fixture
def checkout(tmp_path) -> str:
    """A git repository of this collection with a main branch, as the shown URL serves it."""
    repo = tmp_path / 'shm'
    shutil.copytree(COLLECTION, repo, ignore=shutil.ignore_patterns('.git', '__pycache__', '.pytest_cache', 'output'))
    git = ['git', '-c', 'user.name=test', '-c', 'user.email=test@example.invalid', '-c', 'init.defaultBranch=main']
    for args in (['init', '-q'], ['add', '-A'], ['commit', '-q', '-m', 'the collection']):
        run([*git, *args], cwd=str(repo))
    return str(repo)


@pytest.mark.skipif(not shutil.which('git'), reason='ansible-galaxy installs git sources with git')
def test_ansible_galaxy_installs_the_collection_from_the_shown_file(checkout, tmp_path):
    requirements = yaml.safe_load(_shown()['README.md'])
    requirements['collections'][0]['name'] = f'git+file://{checkout}'
    path = tmp_path / 'requirements.yml'
    path.write_text(yaml.safe_dump(requirements))
    installed = galaxy_install(str(path), tmp_path / 'collections')
    with open(os.path.join(installed, 'MANIFEST.json')) as f:
        assert json.load(f)['collection_info']['version'] == GALAXY['version']
    assert os.path.exists(os.path.join(installed, 'plugins', 'modules', 'triton_shm_info.py'))
