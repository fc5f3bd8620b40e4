"""Run real ansible / ansible-playbook from integration tests and parse their results.

Every call is a real subprocess of the venv's ansible, with the collection
taken from build/ (ANSIBLE_COLLECTIONS_PATH, set by the Makefile or below) and
results read through the ansible.posix.json callback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS_PATH = os.path.dirname(os.path.dirname(os.path.dirname(REPO)))
PYTHON = os.environ.get('TRITONOPS_VENV_PYTHON', sys.executable)
BIN = os.path.dirname(PYTHON)


def ansible_env(extra=None):
    env = dict(os.environ)
    env.update(
        {
            'ANSIBLE_COLLECTIONS_PATH': COLLECTIONS_PATH,
            'ANSIBLE_STDOUT_CALLBACK': 'ansible.posix.json',
            'ANSIBLE_LOAD_CALLBACK_PLUGINS': '1',
            'ANSIBLE_PYTHON_INTERPRETER': PYTHON,
            'ANSIBLE_HOST_KEY_CHECKING': 'False',
            'ANSIBLE_RETRY_FILES_ENABLED': 'False',
            'ANSIBLE_NOCOLOR': '1',
            'ANSIBLE_DEPRECATION_WARNINGS': 'False',
            'ANSIBLE_LOCALHOST_WARNING': 'False',
            'ANSIBLE_INVENTORY_UNPARSED_WARNING': 'False',
            'PATH': BIN + os.pathsep + env.get('PATH', ''),
        }
    )
    env.pop('TRITON_URL', None)
    if extra:
        env.update(extra)
    return env


class PlaybookResult:
    def __init__(self, proc, data):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.data = data or {}
        self.stats = self.data.get('stats', {})

    def tasks(self, host='localhost'):
        """[(task name, result for host)] in run order."""
        out = []
        for play in self.data.get('plays', []):
            for task in play.get('tasks', []):
                if host in task.get('hosts', {}):
                    out.append((task['task']['name'], task['hosts'][host]))
        return out

    def task(self, name, host='localhost'):
        found = [r for n, r in self.tasks(host) if n == name]
        if not found:
            raise KeyError('no task %r for host %r in %s' % (name, host, [t[0] for t in self.tasks(host)]))
        return found[-1]

    def __repr__(self):
        return 'PlaybookResult(rc=%s, stats=%s, stderr=%s)' % (self.rc, self.stats, self.stderr[-2000:])


def ansible_playbook(
    playbook,
    inventory=None,
    extra_vars=None,
    check=False,
    diff=False,
    env=None,
    args=(),
    timeout=900,
    cwd=None,
    prefix=(),
):
    """Run a playbook (a path, or a list of plays which is written to a temp file); prefix wraps the command."""
    with tempfile.TemporaryDirectory(prefix='tritonops-pb-') as tmp:
        if not isinstance(playbook, str):
            path = os.path.join(tmp, 'playbook.yml')
            with open(path, 'w') as f:
                yaml.safe_dump(playbook, f, sort_keys=False)
            playbook = path
        if inventory is None:
            inventory = 'localhost,'
        elif isinstance(inventory, dict):
            path = os.path.join(tmp, 'inventory.yml')
            with open(path, 'w') as f:
                yaml.safe_dump(inventory, f, sort_keys=False)
            inventory = path
        cmd = list(prefix) + [os.path.join(BIN, 'ansible-playbook'), '-i', inventory, playbook]
        if extra_vars:
            path = os.path.join(tmp, 'extra_vars.json')
            with open(path, 'w') as f:
                json.dump(extra_vars, f)
            cmd += ['-e', '@' + path]
        if check:
            cmd.append('--check')
        if diff:
            cmd.append('--diff')
        cmd += list(args)
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=ansible_env(env), timeout=timeout, cwd=cwd or tmp, check=False
        )
    data = None
    try:
        start = proc.stdout.index('{')
        data = json.loads(proc.stdout[start:])
    except ValueError:
        pass
    return PlaybookResult(proc, data)


def run_module(module, args=None, check=False, diff=False, env=None, host_vars=None, prefix=()):
    """Run one module on localhost (connection local) and return its result dict."""
    play = [
        {
            'name': 'run %s' % module,
            'hosts': 'localhost',
            'connection': 'local',
            'gather_facts': False,
            'vars': dict(host_vars or {}),
            'tasks': [{'name': 'the module', module: args or {}, 'register': 'result', 'ignore_errors': True}],
        }
    ]
    res = ansible_playbook(play, check=check, diff=diff, env=env, inventory='localhost,', prefix=prefix)
    try:
        return res.task('the module')
    except KeyError:
        raise AssertionError('module %s did not run: %r\nstdout: %s' % (module, res, res.stdout[-3000:]))
