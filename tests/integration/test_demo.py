"""`make demo` (the README's first command) tells its story to the end: the demo itself fails on any step that does not
hold (a live client losing its region, a new client still failing after the cleanup, the bytes not adding up). Run
here with the test venv; `make demo` runs the same script with its own small venv (tests/requirements-demo.txt)."""

from __future__ import annotations

import os
import subprocess
import sys

from ansible_helpers import COLLECTIONS_PATH, ansible_env

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_demo_runs_to_the_end_and_explains_every_byte():
    proc = subprocess.run(
        [sys.executable, os.path.join(COLLECTION, 'tests', 'rig', 'demo.py')],
        capture_output=True,
        text=True,
        env=ansible_env({'ANSIBLE_COLLECTIONS_PATH': COLLECTIONS_PATH}),
        cwd=COLLECTION,
        timeout=600,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    for said in (
        'PLAY RECAP',  # ansible-playbook's own output, as a user sees it
        "freed: 50.0 MiB (44.0 MiB of files, 6.0 MiB of the dangling region's memory",
        'live client prep_live',
        'in all, what /dev/shm says is used',
        'Done in',
    ):
        assert said in out, (said, out[-4000:])
    assert 'Traceback' not in out + proc.stderr
