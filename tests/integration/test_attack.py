"""Attacks where the separately built pieces meet (issues 25-27): an unprivileged local user's files named like this
collection's own (a backend pool, a quarantine name) in a root server's /dev/shm.

Real tritonserver (2.51 from the wheel) as root in its own /dev/shm (mode 1777, as every /dev/shm); the user ``nobody``
plants files there from inside the server's mount namespace (``nsenter`` + ``setpriv``), as any local user can in the
host's /dev/shm under ``--ipc=host``.
"""

from __future__ import annotations

import os
import subprocess
import time

import tritonrig
from ansible_helpers import run_module

REGION = 'tritonops.shm.triton_shm_region'
HOUR = 3600

PLANT = (
    'import os, sys, time\n'
    'os.chdir("/dev/shm")\n'
    'with open("triton_python_backend_shm_region_planted", "wb") as f:\n'
    '    f.truncate(1 << 20)\n'
    'with open("bait", "wb") as f:\n'
    '    f.truncate(4096)\n'
    'q = ".tritonops_shm.quarantine.%d.0123456789ab" % os.stat("bait").st_ino\n'
    'os.rename("bait", q)\n'
    'then = time.time() - 3600\n'
    'for n in ("triton_python_backend_shm_region_planted", q):\n'
    '    os.utime(n, (then, then))\n'
    'print(q)\n'
)


def test_files_nobody_plants_under_the_collections_own_names_are_never_removed_on_its_word(tmp_path):
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=()).start()
    try:
        shm = server.shm_dir
        qname = subprocess.run(
            [
                'nsenter',
                '--mount',
                '--target',
                str(server.pid),
                'setpriv',
                '--reuid',
                '65534',
                '--regid',
                '65534',
                '--clear-groups',
                '/usr/bin/python3',
                '-c',
                PLANT,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        planted = ['triton_python_backend_shm_region_planted', qname]
        assert all(os.lstat(os.path.join(shm, n)).st_uid == 65534 for n in planted)
        # root's own file under a quarantine-looking name, never recorded by a run
        lookalike = os.path.join(shm, f'.tritonops_shm.quarantine.{os.getpid()}.feedfacecafe')
        with open(lookalike, 'wb') as f:
            f.truncate(4096)
        then = time.time() - HOUR
        os.utime(lookalike, (then, then))

        # everything the cleanup can be asked for, at min_age 0: the planted files stay, by the owner rule
        res = run_module(
            REGION,
            dict(
                url=server.url,
                state='absent',
                stale=True,
                backend_leftovers=True,
                orphan_files=True,
                orphan_patterns=['triton_*', '.tritonops_shm.quarantine.*.0123456789ab'],
                min_age=0,
                inventory=True,
            ),
        )
        assert not res.get('failed'), res
        assert res['removed_files'] == [] and res['changed'] is False, res
        files = {os.path.basename(f['path']): f for f in res['before']['files']}
        assert (
            files[planted[0]]['category'] == 'backend' and 'owned by uid 65534' in files[planted[0]]['category_reason']
        )
        assert files[qname]['category'] == 'foreign' and 'owned by uid 65534' in files[qname]['category_reason']
        assert files[os.path.basename(lookalike)]['category'] == 'foreign', files[os.path.basename(lookalike)]
        assert all(os.path.exists(os.path.join(shm, n)) for n in planted) and os.path.exists(lookalike)
        assert not [
            n
            for n in os.listdir(shm)
            if n.startswith('.tritonops_shm.quarantine.') and n not in (qname, os.path.basename(lookalike))
        ], 'nothing renamed'

        # a stale cleanup alone never takes a quarantine-looking name the record does not list (root's or nobody's)
        stale = run_module(REGION, dict(url=server.url, state='absent', stale=True, backend_leftovers=True, min_age=0))
        assert stale['removed_files'] == [] and os.path.exists(lookalike), stale

        # the owner rule decides: with client_users naming nobody, nobody's unheld pool is a leftover like any other
        named = run_module(
            REGION, dict(url=server.url, state='absent', backend_leftovers=True, min_age=0, client_users=['nobody'])
        )
        assert [os.path.basename(p) for p in named['removed_files']] == [planted[0]], named
        assert os.path.exists(os.path.join(shm, qname)) and os.path.exists(lookalike)
    finally:
        server.stop()
