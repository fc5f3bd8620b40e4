"""Run code in a fresh interpreter with this test run's import path: what a module's own imports load, not what earlier
tests already imported."""

from __future__ import annotations

import os
import subprocess
import sys


def fresh_python(code: str) -> str:
    """The standard output of ``python -c code``, the interpreter and sys.path of this run; fails on a non-zero exit."""
    return subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    ).stdout
