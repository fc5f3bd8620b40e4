"""Unit tests for module_utils/outputs/metrics.py: the metric set (checked by promtool), one file per server, the writer."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics, outputs

MIB = 1 << 20
URL = 'http://127.0.0.1:8000'


def region(name, state, byte_size=MIB):
    return dict(name=name, key='/' + name, offset=0, byte_size=byte_size, state=state)


def shm_file(name, category, allocated=MIB):
    return dict(name=name, path='/dev/shm/' + name, allocated_bytes=allocated, category=category)


def pool(model, allocated, state='live'):
    return dict(
        name=f'triton_python_backend_shm_region_{model}', backend='python', model=model, bytes=allocated, state=state
    )


def info(pid=4242, **over):
    """A triton_shm_info result: 2 healthy, 1 stale, 1 dangling, 1 reserved region; files of every category but foreign."""
    result = dict(
        changed=False,
        server=dict(url=URL, version='2.51.0', pid=pid, shm_dir='/proc/4242/root/dev/shm'),
        shm_fs=dict(
            path='/proc/4242/root/dev/shm',
            total_bytes=64 * MIB,
            used_bytes=9 * MIB,
            free_bytes=55 * MIB,
            used_percent=14.1,
        ),
        system_regions=[
            region('a', 'healthy'),
            region('b', 'healthy', 2 * MIB),
            region('dead', 'stale', 4 * MIB),
            region('gone', 'dangling'),
            region('kept', 'reserved'),
        ],
        cuda_regions=[dict(name='gpu0', device_id=0, byte_size=MIB, state='unknown')],
        gpus=[dict(index=0, uuid='GPU-0', mig=False, server_bytes=583 * MIB)],
        files=[
            shm_file('a', 'registered'),
            shm_file('b', 'registered', 2 * MIB),
            shm_file('dead', 'registered', 4 * MIB),
            shm_file('kept', 'registered'),
            shm_file('triton_python_backend_shm_region_1', 'backend'),
            shm_file('client_x', 'orphan'),
            shm_file('busy', 'in_use'),
        ],
        summary=dict(stale_bytes=4 * MIB, orphan_bytes=MIB),
        backend_pools=[pool('echo', MIB)],
        families=[dict(name='other', files=1, bytes=MIB, held_files=1, held_bytes=MIB, unheld_files=0, unheld_bytes=0)],
        scanned_at=1764760000.25,
    )
    result.update(over)
    return result


def samples(text):
    """{(name, frozenset of labels other than host and triton_url): value}, after checking host/triton_url on each."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            out.setdefault('_hosts', set()).add((labels.pop('host'), labels.pop('triton_url')))
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


@pytest.fixture(scope='module')
def promtool():
    path = os.environ.get('PROMTOOL') or shutil.which('promtool')
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f'promtool not found (PROMTOOL={os.environ.get("PROMTOOL")!r}): run `make promtool`')
    return path


def check_metrics(promtool, text):
    proc = subprocess.run(
        [promtool, 'check', 'metrics'], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr


def test_report_of_a_located_server(promtool):
    text = metrics.report_text(info(), 'gpu1', URL)
    check_metrics(promtool, text)
    s = samples(text)
    assert s.pop('_hosts') == {('gpu1', URL)}
    g = {k[0]: v for k, v in s.items() if not k[1]}
    assert g == {
        'tritonops_shm_up': 1,
        'tritonops_shm_server_located': 1,
        'tritonops_shm_report_timestamp_seconds': 1764760000.25,
        'tritonops_shm_fs_size_bytes': 64 * MIB,
        'tritonops_shm_fs_used_bytes': 9 * MIB,
        'tritonops_shm_registered_bytes': 9 * MIB,
        'tritonops_shm_cuda_regions': 1,
        'tritonops_shm_stale_bytes': 4 * MIB,
        'tritonops_shm_orphan_bytes': MIB,
        'tritonops_shm_leftover_bytes': 0,
    }
    by_state = {dict(k[1])['state']: v for k, v in s.items() if k[0] == 'tritonops_shm_regions'}
    assert by_state == {'healthy': 2, 'stale': 1, 'reserved': 1, 'dangling': 1, 'unknown': 0, 'suspect': 0, 'wedged': 0}
    by_category = {dict(k[1])['category']: v for k, v in s.items() if k[0] == 'tritonops_shm_files'}
    assert by_category == {'registered': 4, 'backend': 1, 'leftover': 0, 'in_use': 1, 'orphan': 1, 'foreign': 0}
    assert s[('tritonops_shm_server_info', frozenset({('version', '2.51.0')}))] == 1


def in_pods():
    """info() of a server in a pod whose healthy regions are held from a pod and from the host."""
    result = info()
    result['server']['container'] = dict(runtime='containerd', pod_uid='5c1e', name='pod ml/triton-0')
    result['system_regions'][0]['holders'] = [dict(pid=7, comm='python', container=dict(name='pod ml/client-0'))]
    result['system_regions'][1]['holders'] = [
        dict(pid=8, comm='python'),
        dict(pid=9, comm='python', container=dict(name='pod ml/client-0')),
    ]
    return result


def test_every_metric_has_one_help_and_type_line_and_the_prefix():
    text = metrics.report_text(in_pods(), 'h', URL) + metrics.cleanup_text(
        dict(status='ok', finished_epoch=5, done={}), 'h', URL
    )
    for name, metric in metrics.METRICS.items():
        assert name.startswith('tritonops_shm_') and not name.startswith('tritonops_shm_tritonops')
        assert text.count(f'# HELP {name} ') == 1 and text.count(f'# TYPE {name} {metric.type}\n') == 1, name
        # Prometheus naming: _total only for counters, units as the last word
        assert name.endswith('_total') == (metric.type == 'counter'), name
        assert not name.endswith('_seconds') or 'timestamp' in name


@pytest.mark.parametrize('result', [None, dict(failed=True, msg='cannot connect to http://127.0.0.1:8000')])
def test_a_down_server_is_up_0_and_nothing_else(promtool, result):
    text = metrics.report_text(result, 'gpu1', URL, now=1000.0)
    check_metrics(promtool, text)
    s = samples(text)
    del s['_hosts']
    expected = {
        'tritonops_shm_up': 0,
        'tritonops_shm_server_located': 0,
        'tritonops_shm_report_timestamp_seconds': 1000,
    }
    assert {k[0]: v for k, v in s.items()} == expected


def test_an_unlocated_server_gives_no_state_or_bytes(promtool):
    server = dict(url=URL, version='2.51.0', pid=None, shm_dir=None, not_found_reason='not found')
    text = metrics.report_text(info(server=server, shm_fs=None, files=[]), 'gpu1', URL)
    check_metrics(promtool, text)
    names = {k[0] for k in samples(text) if k != '_hosts'}
    assert names == {
        'tritonops_shm_up',
        'tritonops_shm_server_located',
        'tritonops_shm_report_timestamp_seconds',
        'tritonops_shm_server_info',
    }
    assert 'tritonops_shm_server_located{host="gpu1",triton_url="http://127.0.0.1:8000"} 0\n' in text


def test_the_region_modules_after_state_is_reported():
    result = dict(
        changed=True, unregistered=['dead'], before=info(), after=info(system_regions=[region('a', 'healthy')])
    )
    s = samples(metrics.report_text(result, 'gpu1', URL))
    assert s[('tritonops_shm_regions', frozenset({('state', 'stale')}))] == 0
    assert s[('tritonops_shm_registered_bytes', frozenset())] == MIB


@pytest.mark.parametrize(
    'host, url',
    [
        ('gpu"1', 'http://h:1/"x"'),
        ('a\\b', 'http://h:1/\\'),
        ('line\nbreak', 'http://h:1/\n'),
        ('中文主机', 'http://[::1]:8000'),
        ('bad\udcffbyte', URL),
    ],
)
def test_label_values_are_escaped(promtool, host, url):
    text = metrics.report_text(info(), host, url)
    check_metrics(promtool, text)
    expected = host.encode('utf-8', 'backslashreplace').decode('utf-8')
    assert samples(text)['_hosts'] == {(expected, url)}
    assert (
        len([line for line in text.splitlines() if not line.startswith('#')]) == 31
    )  # 7 region states; a family held and not; the CUDA series: 2 states of device 0 and the server's GPU charge


def test_cleanup_outcome_and_counters_that_go_on(promtool):
    first = metrics.cleanup_text(
        dict(
            status='ok',
            finished_epoch=100,
            done=dict(
                unregistered=['d1', 'd2'],
                removed_files=['/dev/shm/d1', '/dev/shm/d2', '/dev/shm/o'],
                freed_bytes=3 * MIB,
            ),
        ),
        'gpu1',
        URL,
    )
    check_metrics(promtool, first)
    s = {k[0]: v for k, v in samples(first).items() if k != '_hosts'}
    assert s == {
        'tritonops_shm_cleanup_last_run_timestamp_seconds': 100,
        'tritonops_shm_cleanup_last_success': 1,
        'tritonops_shm_cleanup_last_success_timestamp_seconds': 100,
        'tritonops_shm_cleanup_last_unregistered_regions': 2,
        'tritonops_shm_cleanup_last_removed_files': 3,
        'tritonops_shm_cleanup_last_freed_bytes': 3 * MIB,
        'tritonops_shm_cleanup_freed_bytes_total': 3 * MIB,
    }
    # a failure part-way that still freed 1 MiB: counted, and the last success time is kept
    failed = dict(
        status='failed',
        finished_epoch=200,
        error=dict(step='x', msg='y'),
        done=dict(unregistered=['d3'], removed_files=['/dev/shm/d3'], freed_bytes=MIB),
    )
    second = metrics.cleanup_text(failed, 'gpu1', URL, previous=first)
    check_metrics(promtool, second)
    s = {k[0]: v for k, v in samples(second).items() if k != '_hosts'}
    assert s['tritonops_shm_cleanup_last_success'] == 0 and s['tritonops_shm_cleanup_last_run_timestamp_seconds'] == 200
    assert s['tritonops_shm_cleanup_last_success_timestamp_seconds'] == 100
    assert (
        s['tritonops_shm_cleanup_freed_bytes_total'] == 4 * MIB and s['tritonops_shm_cleanup_last_freed_bytes'] == MIB
    )
    # an unreadable previous file starts the counter again (Prometheus reads a reset)
    third = metrics.cleanup_text(dict(status='ok', finished_epoch=300, done={}), 'gpu1', URL, previous='garbage {')
    assert 'tritonops_shm_cleanup_freed_bytes_total{host="gpu1",triton_url="http://127.0.0.1:8000"} 0\n' in third


def test_one_file_per_host_and_url():
    names = {
        metrics.file_name(kind, host, url)
        for kind in ('report', 'cleanup')
        for host in ('t1', 't2', 't/1', 't 1')
        for url in (URL, 'http://127.0.0.1:8001', None)
    }
    assert len(names) == 24
    assert all('/' not in n and ' ' not in n and n.endswith('.prom') for n in names)
    assert metrics.file_name('report', 't1', URL) == metrics.file_name('report', 't1', URL)
    assert metrics.file_name('report', 'gpu-1.example.com', URL).startswith('tritonops_shm.gpu-1_example_com.')
    assert metrics.file_name('cleanup', '../../etc', URL).startswith('tritonops_shm_cleanup.______etc.')
    with pytest.raises(ValueError, match='kind'):
        metrics.file_name('other', 't1', URL)


def test_write_is_atomic_and_0644_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        res = metrics.write_textfile(str(tmp_path), 'x.prom', 'a 1\n')
    finally:
        os.umask(old)
    assert res == outputs.WriteResult(str(tmp_path / 'x.prom'), True, None)
    assert stat.S_IMODE(os.stat(res.path).st_mode) == 0o644 and (tmp_path / 'x.prom').read_text() == 'a 1\n'
    inode = os.stat(res.path).st_ino
    assert metrics.write_textfile(str(tmp_path), 'x.prom', 'a 2\n').written
    assert os.stat(res.path).st_ino != inode  # replaced by rename, never rewritten in place
    assert os.listdir(tmp_path) == ['x.prom']  # no temporary file left
    assert metrics.read_textfile(str(tmp_path), 'x.prom') == 'a 2\n'
    assert metrics.read_textfile(str(tmp_path), 'missing.prom') is None


def test_a_missing_directory_is_a_warning(tmp_path):
    res = metrics.write_textfile(str(tmp_path / 'nope'), 'x.prom', 'a 1\n')
    assert (
        not res.written and res.warning == f'{tmp_path}/nope does not exist on this host: no metrics written (x.prom)'
    )
    assert not (tmp_path / 'nope').exists()


def test_a_symlinked_directory_is_never_followed(tmp_path):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (tmp_path / 'link').symlink_to(elsewhere)
    res = metrics.write_textfile(str(tmp_path / 'link'), 'x.prom', 'a 1\n')
    assert not res.written and f'is a symlink to {elsewhere}' in res.warning and 'no metrics written' in res.warning
    # a symlink further up the path leads elsewhere too
    (elsewhere / 'sub').mkdir()
    res = metrics.write_textfile(str(tmp_path / 'link' / 'sub'), 'x.prom', 'a 1\n')
    assert not res.written and f'leads to {elsewhere}/sub through a symlink' in res.warning
    assert not list(elsewhere.rglob('*.prom')) and metrics.read_textfile(str(tmp_path / 'link'), 'x.prom') is None


def test_a_file_in_place_of_the_directory(tmp_path):
    (tmp_path / 'f').write_text('')
    res = metrics.write_textfile(str(tmp_path / 'f'), 'x.prom', 'a 1\n')
    assert not res.written and 'is not a directory' in res.warning


def test_a_directory_in_place_of_the_file(tmp_path):
    (tmp_path / 'x.prom').mkdir()
    res = metrics.write_textfile(str(tmp_path), 'x.prom', 'a 1\n')
    assert not res.written and 'cannot be written' in res.warning
    assert sorted(os.listdir(tmp_path)) == ['x.prom']


def test_a_directory_that_cannot_be_written(as_nobody):
    # pytest's tmp_path is under a 0700 directory: nobody could not even reach it
    directory = tempfile.mkdtemp(prefix='tritonops-metrics-')
    try:
        os.chmod(directory, 0o755)
        res = as_nobody(metrics.write_textfile, directory, 'x.prom', 'a 1\n')
        assert (
            res[1] is False
            and res[2] == f'{directory} is not writable (Permission denied): no metrics written (x.prom)'
        )
        assert os.listdir(directory) == []
    finally:
        shutil.rmtree(directory)


@pytest.mark.parametrize('name', ['../x.prom', 'x.txt', '.x.prom', 'a/b.prom'])
def test_only_plain_prom_names(tmp_path, name):
    with pytest.raises(ValueError, match='plain NAME.prom'):
        metrics.write_textfile(str(tmp_path), name, '')


@pytest.mark.parametrize('page', ['metrics.md', 'metrics.zh.md'])
def test_the_docs_list_the_metric_set(page):
    docs = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'docs', page)
    with open(docs, encoding='utf-8') as f:
        text = f.read()
    tables = set(re.findall(r'^\| `(tritonops_shm_[a-z_]+)` \|', text, re.M))
    assert tables == set(metrics.METRICS)
    for label in metrics.REGION_STATES + metrics.FILE_CATEGORIES:
        assert f'`{label}`' in text


def test_dir_refusal_is_the_one_check_of_metrics_dir_and_report_dir(tmp_path):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (tmp_path / 'link').symlink_to(elsewhere)
    assert f'is a symlink to {elsewhere}' in outputs.dir_refusal(str(tmp_path / 'link'), missing_ok=True)
    # a directory still to be made, under a symlink: refused; under a real path: fine
    assert 'through a symlink' in outputs.dir_refusal(str(tmp_path / 'link' / 'new'), missing_ok=True)
    assert outputs.dir_refusal(str(tmp_path / 'new'), missing_ok=True) is None
    assert 'does not exist' in outputs.dir_refusal(str(tmp_path / 'new'))
    assert outputs.dir_refusal(str(elsewhere)) is None


def test_a_url_with_credentials_never_reaches_the_label(tmp_path):
    text = metrics.report_text(None, 'h1', 'http://user:s3cret@gpu1:8000')
    assert 's3cret' not in text and 'user' not in text and 'triton_url="http://***@gpu1:8000"' in text


def test_pool_bytes_per_model_and_leftover_bytes(promtool):
    pools = [
        pool('echo', MIB),
        pool('echo', 2 * MIB),
        pool('mirror', 3 * MIB),
        pool(None, 4 * MIB),
        pool(None, 5 * MIB, state='leftover'),
        pool('dead', 6 * MIB, state='leftover'),
    ]
    files = [shm_file('l1', 'leftover', 5 * MIB), shm_file('l2', 'leftover', 6 * MIB), shm_file('b', 'backend')]
    text = metrics.report_text(
        info(backend_pools=pools, files=files, summary=dict(leftover_bytes=11 * MIB)), 'gpu1', URL
    )
    check_metrics(promtool, text)
    s = samples(text)
    by_model = {dict(k[1])['model']: v for k, v in s.items() if k[0] == 'tritonops_shm_backend_pool_bytes'}
    # leftovers are not any model's pool: they are in tritonops_shm_leftover_bytes
    assert by_model == {'echo': 3 * MIB, 'mirror': 3 * MIB, '_unattributed': 4 * MIB}
    assert s[('tritonops_shm_leftover_bytes', frozenset())] == 11 * MIB
    assert s[('tritonops_shm_files', frozenset({('category', 'leftover')}))] == 2


def test_the_model_label_is_bounded():
    pools = [pool(f'm{i:03d}', (i + 1) * MIB) for i in range(100)] + [pool(None, MIB)]
    labels = metrics.pool_bytes_by_model(pools)
    assert len(labels) == metrics.MODEL_LABEL_CAP + 2
    kept = dict(labels)
    # the cap models with the most bytes keep their names; the rest are summed
    assert set(kept) - {'_other', '_unattributed'} == {f'm{i:03d}' for i in range(80, 100)}
    assert kept['_other'] == sum((i + 1) * MIB for i in range(80))
    assert kept['_unattributed'] == MIB
    assert sum(kept.values()) == sum(p['bytes'] for p in pools)
    assert metrics.pool_bytes_by_model(pools[:3]) == [('m000', MIB), ('m001', 2 * MIB), ('m002', 3 * MIB)]


@pytest.mark.parametrize(
    'over,value,labels',
    [
        (
            dict(holders_complete=True, pid_namespace='initial', holders_incomplete_reason=None),
            1,
            {'pid_namespace': 'initial', 'reason': ''},
        ),
        (
            dict(
                holders_complete=False,
                pid_namespace='other',
                holders_incomplete_reason="the module runs outside the host's initial PID namespace (...)",
            ),
            0,
            {'pid_namespace': 'other', 'reason': 'pid_namespace'},
        ),
        (
            dict(
                holders_complete=False,
                pid_namespace='initial',
                unreadable_processes=3,
                holders_incomplete_reason='3 process(es)',
            ),
            0,
            {'pid_namespace': 'initial', 'reason': 'unreadable_processes'},
        ),
        (
            dict(
                holders_complete=False,
                pid_namespace='initial',
                holders_incomplete_reason='shm_dir x is not readable',
                server=dict(url=URL, version='2.51.0', pid=4242, shm_dir=None),
            ),
            0,
            {'pid_namespace': 'initial', 'reason': 'shm_dir'},
        ),
        (dict(), 0, {'pid_namespace': '', 'reason': 'unknown'}),
    ],
)
def test_holders_complete_is_a_gauge_with_a_coarse_reason(promtool, over, value, labels):
    """Issue 25 / issue 26 finding 7: an incomplete scan is visible in the metrics, with why (few series: no pids)."""
    text = metrics.report_text(info(**over), 'gpu1', URL)
    check_metrics(promtool, text)
    got = {
        dict(k[1])['reason']: (v, dict(k[1]))
        for k, v in samples(text).items()
        if k != '_hosts' and k[0] == 'tritonops_shm_holders_complete'
    }
    assert got == {labels['reason']: (value, labels)}


def test_the_server_and_the_holders_are_named_by_pod_or_container(promtool):
    text = metrics.report_text(in_pods(), 'gpu1', URL)
    check_metrics(promtool, text)
    s = samples(text)
    key = (
        'tritonops_shm_server_container_info',
        frozenset({('container', 'pod ml/triton-0'), ('runtime', 'containerd')}),
    )
    assert s[key] == 1
    # region a (1 MiB) and b (2 MiB) from the client pod, b also from a host process
    assert s[('tritonops_shm_held_bytes', frozenset({('holder', 'pod ml/client-0')}))] == 3 * MIB
    assert s[('tritonops_shm_held_bytes', frozenset({('holder', 'host')}))] == 2 * MIB
    # a server on the host: no container series, and no holder series without holders
    names = {k[0] for k in samples(metrics.report_text(info(), 'gpu1', URL)) if k != '_hosts'}
    assert 'tritonops_shm_server_container_info' not in names and 'tritonops_shm_held_bytes' not in names


def test_held_by_is_bounded():
    regions = [
        dict(byte_size=i + 1, holders=[dict(pid=i, container=dict(name=f'pod ns/c-{i:02d}'))]) for i in range(30)
    ]
    held = metrics.held_by(regions)
    assert len(held) == metrics.HELD_BY_MAX
    assert held[0] == ('pod ns/c-29', 30) and held[-1] == ('other', sum(range(1, 22)))


def test_cuda_series_are_bounded_by_device_and_state(promtool):
    """Issue 34, goal 3: GPU bytes of CUDA regions by (device, state), every state of a device with a region, and the
    server's NVML charge per GPU; no series per region. Issue 43, goal 2: both carry the GPU's UUID (empty where a
    device is not proven to name one), to join DCGM's series."""
    result = info()
    result['cuda_regions'] = [
        dict(
            name=f'r{i}',
            device_id=i % 2,
            byte_size=MIB,
            state='stale' if i < 3 else 'unknown',
            gpu_uuid='GPU-0' if i % 2 == 0 else None,
        )
        for i in range(50)
    ]
    result['gpus'].append(dict(index=1, uuid='GPU-1', mig=False, server_bytes=None))
    text = metrics.report_text(result, 'gpu1', URL)
    check_metrics(promtool, text)
    found = samples(text)
    by = {
        '/'.join(dict(k[1]).get(label, '') for label in ('device', 'uuid', 'state')): v
        for k, v in found.items()
        if k[0] == 'tritonops_shm_cuda_region_bytes'
    }
    assert by == {'0/GPU-0/stale': 2 * MIB, '0/GPU-0/unknown': 23 * MIB, '1//stale': MIB, '1//unknown': 24 * MIB}
    charged = {
        (dict(k[1])['device'], dict(k[1])['uuid']): v
        for k, v in found.items()
        if k[0] == 'tritonops_shm_gpu_server_bytes'
    }
    assert charged == {('0', 'GPU-0'): 583 * MIB}  # GPU 1: NVML did not say, no series


def test_the_files_that_are_not_tritons_are_exported_by_family_held_and_not(promtool):
    """Issue 42, goal 1: bounded labels, one series per family and held."""
    fams = [
        dict(
            name='nccl',
            files=3,
            bytes=30 * MIB,
            held_files=2,
            held_bytes=20 * MIB,
            unheld_files=1,
            unheld_bytes=10 * MIB,
        ),
        dict(name='other', files=1, bytes=MIB, held_files=0, held_bytes=0, unheld_files=1, unheld_bytes=MIB),
    ]
    text = metrics.report_text(info(families=fams), 'gpu1', URL)
    check_metrics(promtool, text)
    s = samples(text)
    got = {
        dict(k[1])['family'] + '/' + dict(k[1])['held']: v for k, v in s.items() if k[0] == 'tritonops_shm_family_bytes'
    }
    assert got == {'nccl/true': 20 * MIB, 'nccl/false': 10 * MIB, 'other/true': 0, 'other/false': MIB}
