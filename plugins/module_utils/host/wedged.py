# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to tritonops.shm: the record of the unregisters Triton would not carry out, run after run (wedged regions).

On Triton 2.53 and later a leaked reference inside the server can keep a region "in use" or pending for good (server
issue 7688): no client holds it, Triton refuses or defers its unregister, and only a restart frees it. A stale cleanup
that tried a region and left it registered counts one more run for it here; one that unregistered it, or found it gone,
forgets it. classification.region_state calls a region that no process but the server holds ``wedged`` once its count
reaches the setting ``wedged_after`` (WEDGED_AFTER runs by default).

The record is one small JSON file per shm directory beside its run lock (runlock.py: a directory only the module's
user can write, ``shm-MAJOR-MINOR-INODE.wedged.json``), written under that lock by triton_shm_region through the
one atomic write (outputs.write_at), and read by every module. It names the server process (pid:start time) it
counts for: another server starts from 0.
Standard library only. What it records (Attempts, WEDGED_AFTER) is plain data in facts.py, which the rules read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

from ansible_collections.tritonops.shm.plugins.module_utils.rules.facts import Attempts, spec_of


def record_name(dev: int, ino: int) -> str:
    return f'shm-{os.major(dev)}-{os.minor(dev)}-{ino}.wedged.json'


def read(directory: str | None, dev: int, ino: int, server: str | None) -> dict:
    """{region name: Attempts} of the server process server in the record of directory; {} when none or unreadable."""
    if not directory or not server:
        return {}
    try:
        fd = os.open(os.path.join(directory, record_name(dev, ino)), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return {}  # not this user's own private record: nobody else's word counts
        data = json.loads(os.read(fd, 1 << 20).decode('utf-8'))
        if data.get('server') != server:
            return {}
        return {
            str(name): Attempts(int(a['runs']), float(a['since']), tuple(a['spec']))
            for name, a in data.get('regions', {}).items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    finally:
        os.close(fd)


def updated(
    before: Mapping[str, Attempts],
    tried: Iterable[Mapping],
    kept: Iterable[str],
    listed: Iterable[Mapping],
    now: float,
) -> dict:
    """The record after a run: each tried region it left registered (kept) counts one more run (from 1 when its spec
    changed); one it unregistered, and any region no longer listed, is forgotten."""
    kept = set(kept)
    specs = {r.get('name'): spec_of(r) for r in listed}
    out = {name: a for name, a in before.items() if specs.get(name) == a.spec}
    for region in tried:
        name = region.get('name')
        if name in kept and specs.get(name) == spec_of(region):
            old = out.get(name)
            out[name] = Attempts(old.runs + 1, old.since, old.spec) if old else Attempts(1, now, spec_of(region))
        else:
            out.pop(name, None)
    return out


def encoded(server: str, attempts: Mapping[str, Attempts]) -> bytes:
    """The record of attempts for the server process server, as the run writes it (outputs.write_at, 0600, in the
    pinned lock directory) and read() reads it back."""
    regions = {n: {'runs': a.runs, 'since': a.since, 'spec': list(a.spec)} for n, a in attempts.items()}
    return json.dumps({'server': server, 'regions': regions}, sort_keys=True).encode('utf-8')


def forget(dir_fd: int, name: str) -> None:
    """Remove the record name from the directory dir_fd (no region is counted any more). Raises OSError, but not for a
    record already gone."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
