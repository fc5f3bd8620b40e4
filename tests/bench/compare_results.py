"""Compare the module results of two builds of the collection on one real scene (issue 19).

A refactor must not change what a user gets back. This builds one scene on a real
tritonserver (private /dev/shm) with every region state (healthy, stale, reserved,
dangling, unknown) and every file category (registered, backend, in_use, orphan,
foreign), then runs, alternately with each build:

  info    tritonops.shm.triton_shm_info with orphan_patterns
  region  tritonops.shm.triton_shm_region in check mode with --diff: state=absent,
          stale=true, orphan_files=true, inventory=true (nothing is changed)

and compares the JSON results with what legitimately differs between two reads removed
(scanned_at, file ages, the age quoted by a "younger than min_age" reason). Each build is
also compared with its own second run, so a difference that is only noise shows as such.

    python tests/bench/compare_results.py --baseline /tmp/core-base/build

--baseline and --candidate are collection roots (the directory holding ansible_collections/);
the candidate defaults to the tree this script runs from. Exit status 1 when the results differ.
Needs root (a private /dev/shm for the server).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import sys
import tempfile

# benchenv puts the rig, the integration helpers and the collection on sys.path
import benchenv  # noqa: F401  pylint: disable=unused-import
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position
from ansible_helpers import COLLECTIONS_PATH, run_module  # noqa: E402  pylint: disable=wrong-import-position

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MARK = 'trusted.tritonops_shm.reserved'
PATTERNS = ['client_*']
MIB = 1 << 20
AGED = 2.0  # seconds: the runs' min_age; the scene's old files are waited for, its young one is dated ahead


def build_scene(server: tritonrig.TritonServer) -> dict:
    """Every region state and file category on one server; returns the live processes to keep."""
    old = [
        server.write_file('client_old', 64 * 1024),  # orphan (first: it ages while the clients start)
        server.write_file('PostgreSQL.1234', 8192),  # foreign: no pattern
        server.write_file('triton_python_backend_shm_region_test', 4096),  # backend
    ]
    keep = {'live': server.client('live_region', byte_size=MIB)}  # healthy
    server.leak('stale_region', byte_size=2 * MIB)  # stale
    server.leak('leaked_unlinked', keep_file=False)  # dangling
    keep['unlinked_live'] = server.client('unlinked_live')  # dangling, still mapped
    os.unlink(server.shm_path('unlinked_live'))
    server.write_file('warm', MIB)  # reserved
    server.api('/v2/systemsharedmemory/region/warm/register', 'POST', {'key': '/warm', 'offset': 0, 'byte_size': MIB})
    os.setxattr(server.shm_path('warm'), MARK, b'warm')
    server.write_file('replaced', 4096)  # unknown: a directory now
    server.api(
        '/v2/systemsharedmemory/region/replaced/register', 'POST', {'key': '/replaced', 'offset': 0, 'byte_size': 4096}
    )
    os.unlink(server.shm_path('replaced'))
    os.mkdir(server.shm_path('replaced'))
    keep['held'] = server.client('client_held', register=False)  # in_use
    tritonrig.keep_young(server.write_file('client_young', 4096))  # foreign: too young, through every run
    os.mkfifo(server.shm_path('client_fifo'))  # foreign: not a file
    os.symlink('client_old', server.shm_path('client_link'))
    tritonrig.wait_older(old, AGED)
    return keep


def normalized(result: dict) -> dict:
    """The result without what differs between two reads of an unchanged scene."""
    out = copy.deepcopy(result)
    for info in (out, out.get('before') or {}, out.get('after') or {}):
        info.pop('scanned_at', None)
        for rec in info.get('files', []):
            rec.pop('age_s', None)
            rec.pop('age_from', None)
            if 'younger than min_age' in rec.get('category_reason', ''):
                rec['category_reason'] = rec['category_reason'].split(' (')[0]
        for rec in info.get('system_regions', []):
            if rec.get('file'):
                rec['file'].pop('age_s', None)
                rec['file'].pop('age_from', None)
    return out


def run(collections: str, name: str, url: str) -> dict:
    env = {'ANSIBLE_COLLECTIONS_PATH': collections}
    if name == 'info':
        return run_module(INFO, {'url': url, 'orphan_patterns': PATTERNS, 'min_age': AGED}, env=env)
    return run_module(
        REGION,
        {
            'url': url,
            'state': 'absent',
            'stale': True,
            'orphan_files': True,
            'orphan_patterns': PATTERNS,
            'min_age': AGED,
            'inventory': True,
        },
        check=True,
        diff=True,
        env=env,
    )


def text(result: dict) -> list[str]:
    return json.dumps(normalized(result), indent=1, sort_keys=True).splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--baseline', required=True, help='collection root of the build to compare with')
    parser.add_argument('--candidate', default=COLLECTIONS_PATH, help='collection root of the build under test')
    parser.add_argument('--out', help='write both results (normalized) to this JSON file')
    args = parser.parse_args(argv)
    for root in (args.baseline, args.candidate):
        if not os.path.isdir(os.path.join(root, 'ansible_collections', 'tritonops', 'shm')):
            parser.error(f'{root} holds no ansible_collections/tritonops/shm')

    server = tritonrig.TritonServer(workdir=tempfile.mkdtemp(prefix='compare-results-'), shm_size='64m')
    server.start()
    failed = False
    saved = {}
    try:
        build_scene(server)
        for name in ('info', 'region'):
            base, cand, base2, cand2 = (
                run(root, name, server.url) for root in (args.baseline, args.candidate, args.baseline, args.candidate)
            )
            states = sorted({r['state'] for r in (base.get('system_regions') or base['before']['system_regions'])})
            cats = sorted({f['category'] for f in (base.get('files') or base['before']['files'])})
            print(f'{name}: states {states}, categories {cats}')
            for label, one, other in (
                ('baseline run 1 vs 2', base, base2),
                ('candidate run 1 vs 2', cand, cand2),
                ('baseline vs candidate', base, cand),
                ('baseline vs candidate (2nd)', base2, cand2),
            ):
                diff = list(difflib.unified_diff(text(one), text(other), 'a', 'b', lineterm='', n=2))
                print(f'  {label}: {"identical" if not diff else f"{len(diff)} diff lines"}')
                if diff:
                    failed = failed or label.startswith('baseline vs candidate')
                    print('\n'.join('    ' + line for line in diff[:200]))
            saved[name] = {'baseline': normalized(base), 'candidate': normalized(cand)}
    finally:
        server.cleanup()
    if args.out:
        with open(args.out, 'w', encoding='utf-8') as f:
            json.dump(saved, f, indent=1, sort_keys=True)
    print('DIFFERENT' if failed else 'IDENTICAL (volatile fields removed)')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
