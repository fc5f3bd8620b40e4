"""The Prometheus alert rules: `promtool check rules` and `promtool test rules`, and their ties
to the metrics the collection writes and to the Alertmanager rulebook.

promtool is never optional here: `make units` puts it in build/bin (.ci/get-promtool);
elsewhere set PROMTOOL=/path/to/promtool.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
RULES = os.path.join(COLLECTION, 'extensions', 'prometheus', 'tritonops_shm.rules.yml')
RULES_TEST = os.path.join(HERE, 'tritonops_shm.rules_test.yml')
TEMPLATES = [os.path.join(COLLECTION, 'playbooks', 'templates', 'tritonops_shm.prom.j2'),
             os.path.join(COLLECTION, 'roles', 'shm_cleanup', 'templates', 'cleanup.prom.j2')]
ALERTMANAGER_RULEBOOK = os.path.join(COLLECTION, 'extensions', 'eda', 'rulebooks', 'self_heal_alertmanager.yml')


@pytest.fixture(scope='module')
def promtool():
    path = os.environ.get('PROMTOOL') or shutil.which('promtool')
    if not path or not os.access(path, os.X_OK):
        pytest.fail('promtool not found (PROMTOOL=%r): run `make promtool` (.ci/get-promtool extracts it from '
                    "Debian's prometheus package into build/bin) or set PROMTOOL=/path/to/promtool"
                    % os.environ.get('PROMTOOL'))
    return path


def run(promtool, *args):
    proc = subprocess.run([promtool] + list(args), capture_output=True, text=True, timeout=120, cwd=HERE, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_rules_are_valid(promtool):
    assert 'SUCCESS: 6 rules found' in run(promtool, 'check', 'rules', RULES)


def test_rules_fire_as_documented(promtool):
    assert 'SUCCESS' in run(promtool, 'test', 'rules', RULES_TEST)


def alerts():
    with open(RULES) as f:
        return dict((r['alert'], r) for g in yaml.safe_load(f)['groups'] for r in g['rules'])


def test_rules_use_only_metrics_the_collection_writes():
    written = set()
    for path in TEMPLATES:
        with open(path) as f:
            written |= set(re.findall(r'\b(tritonops_shm_[a-z_]+)\b', f.read()))
    for name, rule in alerts().items():
        used = set(re.findall(r'\b(tritonops_shm_[a-z_]+)\b', rule['expr']))
        assert used and used <= written, (name, used - written)
        assert '"host"' in rule['expr'], name   # every alert names the inventory host


def test_the_alertmanager_rulebook_cleans_for_existing_alerts_only():
    with open(ALERTMANAGER_RULEBOOK) as f:
        condition = yaml.safe_load(f)[0]['rules'][0]['condition']
    names = set(yaml.safe_load(re.search(r'alertname in (\[[^]]*\])', condition).group(1)))
    assert names == {'TritonShmNearlyFull', 'TritonShmStaleRegions'} and names <= set(alerts())
