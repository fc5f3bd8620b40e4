"""The code of docs/prevention.md and docs/prevention.zh.md, run as shown against a real tritonserver.

The page's python blocks, joined in order, run as one client process inside the server's
mount namespace (its /dev/shm), followed by a test-only epilogue that fails inside the
context manager. Afterwards the server has no region and /dev/shm no file of theirs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EPILOGUE = """
seen = []
try:
    with triton_region(client, 64, "crash") as (name, handle):
        seen.append(name)
        assert name in [r["name"] for r in client.get_system_shared_memory_status()]
        raise RuntimeError("the model failed")
except RuntimeError:
    pass
print("crash region:", seen[0])
"""


def python_blocks(name):
    with open(os.path.join(REPO, 'docs', name), encoding='utf-8') as f:
        return re.findall(r'^```python\n(.*?)^```', f.read(), re.S | re.M)


def without_comments(block):
    return re.sub(r'\s*#.*', '', block)  # comments are translated


def test_both_languages_show_the_same_code():
    english, chinese = python_blocks('prevention.md'), python_blocks('prevention.zh.md')
    assert len(english) == 2
    assert [without_comments(b) for b in english] == [without_comments(b) for b in chinese]


@pytest.mark.parametrize('page', ['prevention.md', 'prevention.zh.md'])
def test_the_client_pattern_leaves_nothing_behind(triton, tmp_path, page):
    script = tmp_path / 'client.py'
    script.write_text('\n'.join(python_blocks(page)) + EPILOGUE, encoding='utf-8')
    before = set(triton.shm_files())
    proc = subprocess.run(
        ['nsenter', '--mount', '--target', str(triton.pid), sys.executable, str(script)],
        env=dict(os.environ, TRITON_URL=triton.url.split('://', 1)[1]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'echo: %s' % list(range(16)) in proc.stdout
    crash = re.search(r'crash region: (crash_(\d+)_[0-9a-f]{12})$', proc.stdout, re.M)
    assert crash and int(crash.group(2)) > 0, proc.stdout  # the name carries the client's pid
    # nothing left: no registration, no file (the python backend's own files aside)
    assert triton.system_regions() == {}
    assert set(triton.shm_files()) - before - set(triton.backend_files()) == set()
