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
import sys

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
if COLLECTION.split(os.sep)[-3:] == ['ansible_collections', 'tritonops', 'shm']:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION))))

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics

RULES = os.path.join(COLLECTION, 'extensions', 'prometheus', 'tritonops_shm.rules.yml')
RULES_TEST = os.path.join(HERE, 'tritonops_shm.rules_test.yml')
ALERTMANAGER_RULEBOOK = os.path.join(COLLECTION, 'extensions', 'eda', 'rulebooks', 'self_heal_alertmanager.yml')
POOLS_RULEBOOK = os.path.join(COLLECTION, 'extensions', 'eda', 'rulebooks', 'self_heal_pools.yml')


@pytest.fixture(scope='module')
def promtool() -> str:
    path = os.environ.get('PROMTOOL') or shutil.which('promtool')
    if not path or not os.access(path, os.X_OK):
        pytest.fail(
            f'promtool not found (PROMTOOL={os.environ.get("PROMTOOL")!r}): run `make promtool` (.ci/get-promtool '
            "extracts it from Debian's prometheus package into build/bin) or set PROMTOOL=/path/to/promtool"
        )
    return path


def run(promtool: str, *args: str) -> str:
    proc = subprocess.run([promtool] + list(args), capture_output=True, text=True, timeout=120, cwd=HERE, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_rules_are_valid(promtool):
    assert 'SUCCESS: 11 rules found' in run(promtool, 'check', 'rules', RULES)


def test_rules_fire_as_documented(promtool):
    assert 'SUCCESS' in run(promtool, 'test', 'rules', RULES_TEST)


def alerts() -> dict:
    with open(RULES) as f:
        return {r['alert']: r for g in yaml.safe_load(f)['groups'] for r in g['rules']}


def test_rules_use_only_metrics_the_collection_writes():
    # the one metric set (module_utils/outputs/metrics.py) the report playbook and the cleanup role write
    written = set(metrics.METRICS)
    for name, rule in alerts().items():
        used = set(re.findall(r'\b(tritonops_shm_[a-z_]+)\b', rule['expr']))
        assert used and used <= written, (name, used - written)
        # every alert keeps the series' inventory host: no aggregation drops it
        assert not re.search(r'\b(sum|max|min|avg|count) (by|\()', rule['expr']), name


def test_rule_label_values_are_those_the_collection_writes():
    with open(RULES) as f:
        states = set(re.findall(r'state="([a-z_]+)"', f.read()))
    assert states and states <= set(metrics.REGION_STATES)
    assert 'tritonops_shm_cuda_region_bytes' in metrics.METRICS and set(metrics.records.CUDA.states) <= set(
        metrics.REGION_STATES
    )


def test_the_alertmanager_rulebook_cleans_for_existing_alerts_only():
    with open(ALERTMANAGER_RULEBOOK) as f:
        condition = yaml.safe_load(f)[0]['rules'][0]['condition']
    names = set(yaml.safe_load(re.search(r'alertname in (\[[^]]*\])', condition).group(1)))
    assert names == {'TritonShmNearlyFull', 'TritonShmStaleRegions', 'TritonCudaStaleBytes'} and names <= set(alerts())


def test_the_pool_alert_leaves_out_the_model_values_that_are_no_one_model():
    expr = alerts()['TritonShmBackendPoolLarge']['expr']
    assert f'model!~"{metrics.OTHER_MODELS}|{metrics.UNATTRIBUTED}"' in expr
    assert 'tritonops_shm_backend_pool_bytes' in metrics.METRICS


def test_the_pools_rulebook_reloads_the_alerting_model_only_for_the_pool_alert():
    with open(POOLS_RULEBOOK) as f:
        (rule,) = yaml.safe_load(f)[0]['rules']
    name = re.search(r'alertname == "([A-Za-z]+)"', rule['condition']).group(1)
    assert name == 'TritonShmBackendPoolLarge' and name in alerts()
    extra = rule['action']['run_playbook']['extra_vars']
    assert extra['shm_cleanup_mode'] == 'stale'
    assert extra['shm_cleanup_reload_pools_models'] == '{{ event.labels.model }}'
    assert 'event.labels.model' in rule['throttle']['group_by_attributes']
