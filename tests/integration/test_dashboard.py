"""The Grafana dashboard's every query, against a real Prometheus scraping a real node_exporter.

The textfile directory is written by the collection's own playbooks for a fleet with leaks: two real
tritonservers (a live client and a killed one on the first, killed clients on the second), a down server,
and a fourth inventory host whose server answers but cannot be located (Ansible run where the server's
processes are invisible, as from an execution environment). Grafana itself is not installable here: the
test reads the dashboard JSON and evaluates each panel query with Grafana's variables substituted.
"""

from __future__ import annotations

import json
import time

import pytest
import tritonrig
from ansible_helpers import PYTHON, ansible_playbook
from observability import (  # pylint: disable=unused-import
    DASHBOARD,
    NodeExporter,
    Prometheus,
    dashboard_queries,
    services,  # noqa: F401  the fixture
    wait_for,
)

MiB = 1 << 20
BLIND = ('unshare', '--pid', '--fork', '--mount-proc')
# what Grafana puts in place of its variables: every host, and windows that cover the whole test
SUBSTITUTIONS = {'host': '.+', '__rate_interval': '10m', '__range': '10m', '__interval': '1m'}


@pytest.fixture
def fleet(tmp_path):
    # two python models per server: the python backend pool of each model (issue 27)
    f = tritonrig.Fleet(2, workdir=str(tmp_path), shm_size='32m', models=('echo', 'mirror'))
    try:
        yield f.start()
    finally:
        f.stop()


def datasources(node) -> set:
    """The uids of every panel, target and variable data source in the dashboard."""
    if isinstance(node, list):
        return set().union(*(datasources(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node['datasource']['uid']} if isinstance(node.get('datasource'), dict) else set()
    return found.union(*(datasources(v) for v in node.values()))


def by_host(result: list) -> dict:
    return {s['metric'].get('host'): float(s['value'][1]) for s in result}


def test_every_panel_query_returns_series_for_a_fleet_with_leaks(fleet, services, tmp_path):
    t1, t2 = fleet.servers
    live = t1.client('live', byte_size=2 * MiB)
    t1.leak('dead', byte_size=4 * MiB)
    t2.leak('dead', byte_size=2 * MiB)
    prom_dir = tmp_path / 'textfile'
    prom_dir.mkdir()
    node = services(NodeExporter(tmp_path, prom_dir))
    prometheus = services(Prometheus(tmp_path, [f'127.0.0.1:{node.port}']))
    node.wait_ready()
    prometheus.wait_ready()

    def host(url):
        return dict(
            ansible_connection='local',
            ansible_python_interpreter=PYTHON,
            triton_url=url,
            prometheus_textfile_dir=str(prom_dir),
        )

    hosts = {
        'triton1': host(t1.url),
        'triton2': host(t2.url),
        'tdown': host(f'http://127.0.0.1:{tritonrig.free_port()}'),
        'tblind': host(t1.url),
    }
    inv = {'all': {'children': {'triton': {'hosts': hosts}}}}

    # two cleanups of triton2 (the counter seen by Prometheus before and after the second) and a failed one of tdown
    res = ansible_playbook('tritonops.shm.cleanup', inventory=inv, extra_vars={'target': 'triton2:tdown'})
    assert res.stats['triton2']['failures'] == 0 and res.stats['tdown']['failures'] == 1, res
    wait_for(
        'the first cleanup scraped',
        lambda: prometheus.query('tritonops_shm_cleanup_freed_bytes_total{host="triton2"}'),
        30,
        log=node.output,
    )
    time.sleep(2)
    t2.leak('dead2', byte_size=3 * MiB)
    res = ansible_playbook('tritonops.shm.cleanup', inventory=inv, extra_vars={'target': 'triton2'})
    assert res.stats['triton2']['failures'] == 0, res
    # the report of the fleet, and of tblind where the server's processes are invisible
    res = ansible_playbook('tritonops.shm.report', inventory=inv, extra_vars={'target': 'triton1:triton2:tdown'})
    assert res.stats['triton1']['failures'] == 0 and res.stats['tdown']['failures'] == 1, res
    res = ansible_playbook('tritonops.shm.report', inventory=inv, extra_vars={'target': 'tblind'}, prefix=BLIND)
    assert res.stats['tblind']['failures'] == 1, res  # unlocated: reported, then failed
    assert live.alive and 'dead' in t1.system_regions()

    # one file per inventory host and URL: four reports, and the cleanups of triton2 and tdown
    assert sorted(p.name.split('.')[0] + '.' + p.name.split('.')[1] for p in prom_dir.iterdir()) == [
        'tritonops_shm.tblind',
        'tritonops_shm.tdown',
        'tritonops_shm.triton1',
        'tritonops_shm.triton2',
        'tritonops_shm_cleanup.tdown',
        'tritonops_shm_cleanup.triton2',
    ]
    wait_for(
        'every report and the second cleanup scraped',
        lambda: (
            len(prometheus.query('tritonops_shm_up')) == 4
            and by_host(prometheus.query('tritonops_shm_cleanup_freed_bytes_total')).get('triton2') == 5 * MiB
        ),
        30,
    )
    assert by_host(prometheus.query('node_textfile_scrape_error')) == {None: 0.0}

    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    # importable: a uid, the datasource as a variable that every panel uses, a host variable
    variables = {v['name']: v for v in dashboard['templating']['list']}
    assert variables['datasource']['type'] == 'datasource' and variables['datasource']['query'] == 'prometheus'
    assert variables['host']['includeAll'] and variables['host']['multi']
    label_query = variables['host']['definition']
    assert label_query == 'label_values(tritonops_shm_up, host)'
    assert set(prometheus.api('label/host/values', **{'match[]': 'tritonops_shm_up'})) == set(hosts)
    assert datasources(dashboard) == {'${datasource}'}  # no data source of the author's Grafana
    ids = [p['id'] for p in dashboard['panels']]
    assert len(ids) == len(set(ids)) and dashboard['uid'] == 'tritonops-shm'

    queries = dashboard_queries(dashboard, SUBSTITUTIONS)
    assert len(queries) >= 14
    results = {}
    for title, expr in queries:
        assert '$' not in expr, expr
        assert 'host=~".+"' in expr, (title, expr)  # every query follows the host variable
        result = prometheus.query(expr)  # a query error raises
        if 'tritonops_shm_cuda_region_bytes' in expr:
            # a CPU server registers no CUDA region: the query must parse; its series are test_metrics.py's and
            # make test-gpu's
            continue
        assert result, f'panel {title!r}: no series for {expr}'
        results.setdefault(title, []).append(result)
    # what a user reads on the panels
    assert set(by_host(results['/dev/shm use per host'][0])) == {'triton1', 'triton2'}
    assert by_host(results['Stale regions'][0]) == {'triton1': 1, 'triton2': 0}
    assert by_host(results['Stale bytes'][0])['triton1'] == 4 * MiB
    registered, used, capacity = (by_host(r) for r in results['Registered bytes against capacity'])
    assert registered['triton1'] == 6 * MiB and capacity['triton1'] == 32 * MiB and used['triton1'] >= 6 * MiB
    assert set(by_host(results['Servers not located'][0])) == {'tblind'}
    assert set(by_host(results['Servers down'][0])) == {'tdown'}
    assert set(by_host(results['Last cleanup failed'][0])) == {'tdown'}
    assert by_host(results['Bytes freed'][0])['triton2'] >= 3 * MiB
    assert 0 <= by_host(results['Age of the last report'][0])['triton1'] < 300
    assert set(by_host(results['Age of the last cleanup'][0])) == {'triton2', 'tdown'}
    assert set(by_host(results['Age of the last successful cleanup'][0])) == {'triton2'}
    pools, leftover = results['Python backend pool bytes per model']
    per_model = {(s['metric']['host'], s['metric']['model']): float(s['value'][1]) for s in pools}
    assert set(per_model) == {(h, m) for h in ('triton1', 'triton2') for m in ('echo', 'mirror')}, per_model
    assert all(v >= MiB for v in per_model.values()), per_model  # a pool starts at shm-default-byte-size (1 MiB)
    assert by_host(leftover) == {'triton1': 0, 'triton2': 0}
