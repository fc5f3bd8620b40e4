"""`make demo`: the job this collection exists for, on a real local Triton.

One tritonserver with a private 64 MiB /dev/shm (what `docker run --shm-size 64m`
gives a container) and the `echo` python-backend model. Real tritonclient
processes register shared-memory regions; some stay alive, some are SIGKILLed
and leak. /dev/shm fills up until a new client's inferences fail with Triton's
own error. Then the collection's playbooks run against it:

    ansible-playbook tritonops.shm.report    (read-only table)
    ansible-playbook tritonops.shm.cleanup   (the shm_cleanup role)

and the new client works again, without restarting Triton, while the live
clients keep their regions. Everything started here is stopped again, also on
Ctrl-C or failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import tritonrig  # noqa: E402  pylint: disable=wrong-import-position

MiB = 1 << 20
BIN = os.path.dirname(os.path.abspath(sys.executable))
START = time.monotonic()
MIN_AGE = 2  # seconds: the orphans' grace age in this story (a file ages from its newest of atime, mtime, ctime)
PAUSE = 0.05  # seconds between a busy client's inferences: busy, but leaving the 2 cores to Triton and Ansible


def step(title: str) -> None:
    print('\n== [%5.1fs] %s ==' % (time.monotonic() - START, title), flush=True)


def say(text: str = '') -> None:
    print('   ' + text if text else '', flush=True)


def mib(n: float) -> str:
    return '%.1f MiB' % (n / MiB)


def usage(server: tritonrig.TritonServer) -> str:
    u = server.shm_usage()
    return '/dev/shm %s of %s used (%.0f%%)' % (
        mib(u['used_bytes']),
        mib(u['total_bytes']),
        100.0 * u['used_bytes'] / u['total_bytes'],
    )


def playbook(name: str, inventory: str, extra: dict[str, Any]) -> int:
    """Run a collection playbook as a user would, showing ansible-playbook's own output as it comes; its rc."""
    cmd = [os.path.join(BIN, 'ansible-playbook'), '-i', inventory, 'tritonops.shm.' + name]
    cmd += ['-e', json.dumps(extra)]
    say("$ ansible-playbook -i inventory.yml tritonops.shm.%s -e '%s'" % (name, cmd[-1]))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION))),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCALHOST_WARNING='False',
        ANSIBLE_INVENTORY_UNPARSED_WARNING='False',
        ANSIBLE_STDOUT_CALLBACK='default',  # ansible-playbook's own output, whatever the caller's configuration says
        ANSIBLE_DISPLAY_SKIPPED_HOSTS='False',  # the steps a run does not take stay out of the way
        ANSIBLE_NOCOLOR='1',
        # ansible-core's ssh-agent support imports DSA, which cryptography 51 deprecates: nothing of this demo's
        PYTHONWARNINGS='ignore:DSA is deprecated',
        PATH=BIN + os.pathsep + os.environ.get('PATH', ''),
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            print('     ' + line.rstrip(), flush=True)
    rc = proc.wait()
    say('  (rc %d in %.1fs)' % (rc, time.monotonic() - t0))
    return rc


def wait_for(client: tritonrig.Client, predicate: Callable[[list[str]], Any], timeout: float) -> list[str]:
    """Wait until predicate(new lines) holds; return the lines seen."""
    start = len(client.lines)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = client.lines[start:]
        if predicate(new):
            return new
        time.sleep(0.2)
    return client.lines[start:]


def stats(lines: list[str]) -> dict[str, str] | None:
    last = [line for line in lines if line.startswith('STATS')]
    if not last:
        return None
    return dict(kv.split('=') for kv in last[-1].split()[1:])


def demo(workdir: str) -> int:
    step('1. Start Triton with a private 64 MiB /dev/shm and the python-backend "echo" model')
    server = tritonrig.TritonServer(workdir=workdir, shm_size='64m', models=('echo',))
    server.start()
    say('tritonserver pid %s at %s; %s' % (server.pid, server.url, usage(server)))
    say('python backend file: %s' % ', '.join(server.backend_files()))
    try:
        return story(server, workdir)
    finally:
        step('Stop everything this demo started')
        server.stop()
        say('stopped tritonserver %d and its clients' % server.pid)


def story(server: tritonrig.TritonServer, workdir: str) -> int:
    step('2. Live clients register regions (they keep running)')
    live = [server.client('prep_live', byte_size=4 * MiB), server.client('feature_live', byte_size=2 * MiB)]
    for c in live:
        say('client pid %d holds region %-13s (%s)' % (c.pid, c.name, mib(c.byte_size)))

    step('3. Clients crash (SIGKILL) without unregistering: their regions leak')
    for i in range(4):
        c = server.leak('batch_%d' % i, byte_size=10 * MiB)
        say(
            'killed client %d: region batch_%d (%s) stays registered, file stays in /dev/shm'
            % (c.pid, i, mib(c.byte_size))
        )
    c = server.leak('crashed', byte_size=6 * MiB, keep_file=False)
    say('killed client %d: region crashed (6.0 MiB) - file unlinked, Triton still maps the memory (dangling)' % c.pid)
    orphans = []
    for i in range(2):
        orphans.append(server.shm_path('/client_tmp_%d' % i))
        with open(orphans[-1], 'wb') as f:
            f.write(b'\0' * (2 * MiB))
    say('two client_tmp_* files nobody registered or holds (orphans once older than min_age), 2.0 MiB each')
    with open(server.shm_path('/other_app.lock'), 'w') as f:
        f.write('not ours\n')
    say('one foreign file other_app.lock (never touched)')
    say(usage(server))

    step('4. A new client cannot infer: /dev/shm is full')
    new = server.client('new_client', byte_size=4 * MiB, mode='infer', pause=PAUSE)
    lines = wait_for(new, lambda ls: any(line.startswith('ERROR') for line in ls), 15)
    errors = [line for line in lines if line.startswith('ERROR')]
    if not errors:
        raise SystemExit('expected the new client to fail with /dev/shm full, but it did not: %s' % lines[-3:])
    say("new client pid %d registered new_client (4.0 MiB), every inference fails with Triton's own error:" % new.pid)
    say('  ' + errors[0][len('ERROR ') :])
    say(usage(server))

    inventory = os.path.join(workdir, 'inventory.yml')
    with open(inventory, 'w') as f:
        f.write(
            'triton:\n  hosts:\n    local-triton:\n      ansible_connection: local\n'
            '      ansible_python_interpreter: %s\n      triton_url: %s\n' % (sys.executable, server.url)
        )
    # a file's age counts from its newest of atime, mtime and ctime: the orphans age for real, min_age is short
    extra = {
        'shm_cleanup_orphan_patterns': 'client_tmp_*',
        'shm_cleanup_min_age': MIN_AGE,
        'prometheus_textfile_dir': '',
    }
    tritonrig.wait_older(orphans, MIN_AGE)

    step('5. Report (read-only)')
    rc = playbook('report', inventory, dict(extra, report_dir=os.path.join(workdir, 'report')))
    if rc != 0:
        raise SystemExit('report failed')

    step('6. Clean up: unregister stale and dangling regions, remove their files and orphans, re-register "warmup"')
    reg = [{'name': 'warmup', 'key': '/warmup', 'byte_size': MiB}]
    rc = playbook(
        'cleanup',
        inventory,
        dict(extra, shm_cleanup_reregister=reg, shm_cleanup_report_dir=os.path.join(workdir, 'cleanup')),
    )
    if rc != 0:
        raise SystemExit('cleanup failed')
    with open(os.path.join(workdir, 'cleanup', 'local-triton.json')) as f:  # the host's record (shm_cleanup_result)
        result = json.load(f)
    if result:
        say('unregistered: %s' % ', '.join(result['done']['unregistered']))
        say('removed files: %s' % ', '.join(os.path.basename(p) for p in result['done']['removed_files']))
        done = result['done']
        files, unlinked = done['freed_bytes'], done.get('freed_unlinked_bytes') or 0
        say(
            "freed: %s (%s of files, %s of the dangling region's memory, which Triton kept mapped until the "
            'unregister)' % (mib(files + unlinked), mib(files), mib(unlinked))
        )
        before, after = (result.get('before') or {}).get('used_bytes'), (result.get('after') or {}).get('used_bytes')
        if before is not None and after is not None:
            say(
                '/dev/shm used fell by %s meanwhile: new_client, waiting for room, registered and ran again at once'
                % mib(before - after)
            )
    say(usage(server))

    step('7. The same new client works again, Triton was never restarted')
    lines = wait_for(
        new,
        lambda ls: (
            len([line for line in ls if line.startswith('STATS')]) >= 2
            and stats([line for line in ls if line.startswith('STATS')][-1:])['ok']
            != stats([line for line in ls if line.startswith('STATS')][:1])['ok']
        ),
        20,
    )
    first = stats([line for line in lines if line.startswith('STATS')][:1]) or {}
    last = stats(lines) or {}
    ok = int(last.get('ok', 0)) - int(first.get('ok', 0))
    if ok <= 0:
        raise SystemExit('the new client still fails after cleanup: %s' % lines[-3:])
    say('new_client: %d more inferences succeeded through its shared-memory regions' % ok)
    fresh = server.client('fresh_client', byte_size=8 * MiB, mode='infer', pause=PAUSE)
    flines = wait_for(fresh, lambda ls: (stats(ls) or {}).get('ok', '0') != '0', 15)
    if (stats(flines) or {}).get('ok', '0') == '0':
        raise SystemExit('a fresh client could not infer after cleanup: %s' % flines[-3:])
    say('fresh_client (started now, 8.0 MiB): %s inferences ok' % stats(flines)['ok'])
    regions = server.system_regions()
    files = server.shm_files()
    for c in live:
        kept = c.alive and c.name in regions and c.name in files
        region = 'kept' if c.name in regions else 'GONE'
        backing = 'kept' if c.name in files else 'GONE'
        say('live client %-13s pid %d: region %s, file %s' % (c.name, c.pid, region, backing))
        if not kept:
            raise SystemExit('live client %s lost its region' % c.name)
    say(
        'python backend file kept: %s; foreign file kept: %s'
        % (bool(server.backend_files()), 'other_app.lock' in files)
    )
    say('registered now: %s' % ', '.join(sorted(regions)))
    say(usage(server))

    step('8. Where /dev/shm is now: every byte explained (report.json, bytes_by_category)')
    rc = playbook('report', inventory, dict(extra, report_dir=os.path.join(workdir, 'report-after')))
    if rc != 0:
        raise SystemExit('report failed')
    with open(os.path.join(workdir, 'report-after', 'report.json')) as f:
        row = json.load(f)['hosts'][0]
    parts = row['bytes_by_category']
    for key, what in (
        ('registered_bytes', 'registered regions: the live clients, new_client, fresh_client and warmup'),
        ('backend_bytes', "the python backend's pool (it grew to carry the clients' requests and never shrinks)"),
        ('leftover_bytes', 'leftover pools'),
        ('in_use_bytes', 'held, unregistered files'),
        ('orphan_bytes', 'orphans'),
        ('foreign_bytes', "other software's files (other_app.lock)"),
        ('unlinked_mapped_bytes', "the server's unlinked mappings"),
        ('other_bytes', "the filesystem's own blocks and other processes' unlinked files"),
    ):
        if parts.get(key):
            say('%9s  %s' % (mib(parts[key]), what))
    total = sum(v or 0 for v in parts.values())
    say('%9s  in all, what /dev/shm says is used (%s)' % (mib(total), mib(row['shm_used_bytes'])))
    if total != row['shm_used_bytes']:
        raise SystemExit('the parts do not add up to what /dev/shm says is used: %s' % parts)
    written = [
        os.path.join(d, f)
        for d in ('report', 'cleanup', 'report-after')
        for f in sorted(os.listdir(os.path.join(workdir, d)))
    ]
    say('reports kept in %s: %s' % (workdir, ', '.join(written)))
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt()


def main() -> int:
    # SIGTERM ends the demo like Ctrl-C does: through the finally blocks that stop everything
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = tempfile.mkdtemp(prefix='tritonops-demo-')
    try:
        rc = demo(workdir)
        step('Done in %.0fs' % (time.monotonic() - START))
        return rc
    except KeyboardInterrupt:
        print('\ninterrupted: everything started was stopped', file=sys.stderr)
        return 130
    except tritonrig.RigError as exc:
        print('\nthe rig failed: %s' % exc, file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
