"""The node-problem-detector custom plugin of the Kubernetes examples (docs/npd/, docs/kubernetes.md, "A Node condition
for shared-memory pressure"): its configuration has what node-problem-detector's custom plugin monitor requires and
validates at start, and its script, run by ``sh``, reports below the threshold (exit 0), at or above it (1) and what it
cannot read (2), on a real tmpfs standing for /dev/shm and on textfile metrics written by the collection's own writer."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NPD = os.path.join(ROOT, 'docs', 'npd')
CONFIG = os.path.join(NPD, 'triton-shm-monitor.json')
SCRIPT = os.path.join(NPD, 'triton-shm-pressure.sh')
KIB = 1024


def _seconds(duration: str) -> float:
    """A Go duration as node-problem-detector parses it (the forms the config uses: 500ms, 10s, 1m30s)."""
    parts = re.findall(r'(\d+(?:\.\d+)?)(ms|s|m|h)', duration)
    assert parts and ''.join(n + u for n, u in parts) == duration, f'not a Go duration: {duration!r}'
    return sum(float(n) * {'ms': 0.001, 's': 1, 'm': 60, 'h': 3600}[u] for n, u in parts)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(['sh', SCRIPT, *args], capture_output=True, text=True, timeout=30, check=False)


def test_the_config_is_a_custom_plugin_monitor_that_node_problem_detector_accepts():
    with open(CONFIG) as f:
        config = json.load(f)
    # the checks of node-problem-detector's CustomPluginConfig.Validate and ApplyConfiguration
    assert config['plugin'] == 'custom'
    assert config['source']
    plugin = config['pluginConfig']
    timeout = _seconds(plugin['timeout'])
    assert _seconds(plugin['invoke_interval']) > 0 and timeout > 0
    assert plugin['max_output_length'] >= 60 and plugin['concurrency'] >= 1
    defaults = {c['type']: c for c in config['conditions']}
    assert 'TritonShmPressure' in defaults
    for condition in defaults.values():
        assert condition['reason'] and condition['message']
    assert config['rules']
    for rule in config['rules']:
        assert rule['type'] in ('temporary', 'permanent'), rule
        assert rule['reason'], rule
        if rule['type'] == 'permanent':
            # a permanent problem needs its condition's default in conditions
            assert rule['condition'] in defaults, rule
        assert _seconds(rule['timeout']) <= timeout, rule
        assert all(isinstance(a, str) for a in rule['args']), rule
        # the script sits in node-problem-detector's config directory, as the ConfigMap in docs/kubernetes.md puts it
        assert rule['path'] == '/config/plugin/' + os.path.basename(SCRIPT), rule
        assert rule['args'][0] in ('dir', 'metrics'), rule
        assert re.fullmatch(r'\d+', rule['args'][2]) and 0 < int(rule['args'][2]) <= 100, rule
    assert os.access(SCRIPT, os.X_OK)


def test_the_script_is_posix_sh():
    with open(SCRIPT) as f:
        assert f.readline() == '#!/bin/sh\n'
    if shutil.which('dash'):  # a shell with no bash extensions parses it
        assert subprocess.run(['dash', '-n', SCRIPT], check=False).returncode == 0
    if shutil.which('shellcheck'):
        proc = subprocess.run(['shellcheck', '-s', 'sh', SCRIPT], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout


def _in_tmpfs(tmp_path, fill: int, *args: str) -> subprocess.CompletedProcess:
    """The script in a mount namespace of its own, with a 1 MiB tmpfs on tmp_path/shm holding ``fill`` bytes."""
    shm = tmp_path / 'shm'
    shm.mkdir(exist_ok=True)
    unshare = ['unshare', '--mount', '--propagation', 'private']
    if os.geteuid() != 0:
        unshare.insert(1, '--map-root-user')
    body = 'mount -t tmpfs -o size=1m tmpfs "$1" && head -c "$2" /dev/zero > "$1/region" && shift 2 && exec sh "$@"'
    return subprocess.run(
        [*unshare, 'sh', '-c', body, 'sh', str(shm), str(fill), SCRIPT, 'dir', str(shm), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def tmpfs_works(tmp_path):
    probe = _in_tmpfs(tmp_path, 0, '90')
    if probe.returncode != 0 and not probe.stdout:  # unshare or mount failed: the script never ran
        pytest.skip(f'no mount namespace with a tmpfs here: {probe.stderr.strip()}')
    assert probe.returncode == 0, probe


def test_a_shm_directory_below_the_threshold_is_ok(tmp_path, tmpfs_works):
    proc = _in_tmpfs(tmp_path, 256 * KIB, '50')
    assert proc.returncode == 0, proc
    assert proc.stdout.strip() == f'{tmp_path / "shm"} is 25% used (below 50%)'


def test_a_shm_directory_at_or_above_the_threshold_is_a_problem(tmp_path, tmpfs_works):
    proc = _in_tmpfs(tmp_path, 768 * KIB, '50')
    assert proc.returncode == 1, proc
    assert proc.stdout.strip() == f'{tmp_path / "shm"} is 75% used (threshold 50%)'


@pytest.mark.parametrize(
    'args',
    [
        ('dir', '{missing}'),
        ('dir', '{file}'),
        ('dir', '{tmp}', 'ninety'),
        ('dir', '{tmp}', '101'),
        ('dir',),
        ('metrics', '{tmp}'),
        ('df', '{tmp}'),
    ],
    ids=[
        'no-such-directory',
        'a-file',
        'threshold-not-a-number',
        'threshold-above-100',
        'no-directory',
        'no-metrics',
        'bad-mode',
    ],
)
def test_what_the_script_cannot_read_is_unknown(tmp_path, args):
    (tmp_path / 'file').write_text('not a directory\n')
    (tmp_path / 'tritonops_shm.other.prom').write_text('node_memory_MemTotal_bytes 1\n')
    given = [a.format(missing=tmp_path / 'missing', file=tmp_path / 'file', tmp=tmp_path) for a in args]
    proc = _run(*given)
    assert proc.returncode == 2, proc
    assert proc.stdout.strip() and '\n' not in proc.stdout.strip(), proc.stdout


def _textfile(directory, host: str, url: str, size: int, used: int) -> None:
    inventory = {
        'reachable': True,
        'server': {'pid': 4242, 'version': '2.51.0'},
        'shm_fs': {'total_bytes': size, 'used_bytes': used},
        'system_regions': [],
        'summary': {},
    }
    (directory / metrics.file_name('report', host, url)).write_text(metrics.report_text(inventory, host, url, now=1.0))


def test_the_fullest_server_of_the_textfile_metrics_decides(tmp_path):
    _textfile(tmp_path, 'node-1', 'http://10.42.3.17:8000', 1 << 30, 100 << 20)
    _textfile(tmp_path, 'node-1', 'http://10.42.3.18:8000', 64 << 20, 60 << 20)
    # a server that is down has no /dev/shm figures: it neither helps nor hides the others
    (tmp_path / metrics.file_name('report', 'node-1', 'http://10.42.3.19:8000')).write_text(
        metrics.report_text(None, 'node-1', 'http://10.42.3.19:8000', now=1.0)
    )
    proc = _run('metrics', str(tmp_path), '90')
    assert proc.returncode == 1, proc
    assert proc.stdout.strip() == 'Triton http://10.42.3.18:8000 /dev/shm is 93% used (threshold 90%)'
    assert len(proc.stdout.strip()) <= 80

    proc = _run('metrics', str(tmp_path), '95')
    assert proc.returncode == 0, proc
    assert proc.stdout.strip() == 'Triton http://10.42.3.18:8000 /dev/shm is 93% used (below 95%)'


def test_textfile_metrics_of_down_servers_only_are_unknown(tmp_path):
    (tmp_path / metrics.file_name('report', 'node-1', 'http://10.42.3.19:8000')).write_text(
        metrics.report_text(None, 'node-1', 'http://10.42.3.19:8000', now=1.0)
    )
    proc = _run('metrics', str(tmp_path))
    assert proc.returncode == 2, proc
