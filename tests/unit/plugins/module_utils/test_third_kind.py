"""A kind is a key (issue 41, goal 1): a third region kind is its definition and its holder evidence, nothing more.

In a fresh interpreter, before any module that reads the kinds is imported (as a records.py and a kinds.py that list
it would be), the script below declares a kind ``test``: one records.Kind (its fields, its API name, its register
values) and one kinds.RegionKind with a trivial holder evidence (no holder is ever seen: every region is stale). A fake
Triton answers over real HTTP at the kind's own paths. Then, unchanged, the collection's code reads it, classifies it,
returns it (triton_shm_info), plans a check-mode triton_shm_region on it (register, and state=absent stale=true),
writes its metrics (metrics.report_text) and shows it in the report (fleet_table's row and text, html_report's page).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

THIRD_KIND = r"""
import http.server, json, sys, threading, types
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records

TEST = records.Kind(
    'test',
    (records.Field('name', records.TEXT), records.Field('byte_size', records.UINT64)),
    registration=('byte_size',),
    api='TestSharedMemory',
    register=(('byte_size', records.UINT64),),
    states=('stale', 'unknown'),
)
records.KINDS['test'] = TEST
from ansible_collections.tritonops.shm.plugins.module_utils.rules import kinds, vocabulary


def no_holder(snap, region, criteria=None):
    return dict(region, holders=[], state=vocabulary.STALE, state_reason='no holder evidence (a test kind)',
                reclaimable=True)


kinds.KINDS['test'] = kinds.RegionKind(record=TEST, holders='none: a test kind', state=no_holder)

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import metrics
from ansible_collections.tritonops.shm.plugins.module_utils.host import runlock
from ansible_collections.tritonops.shm.plugins.module_utils.run.operation import run_steps
from ansible_collections.tritonops.shm.plugins.module_utils.run.region_ops import RegionOps
from ansible_collections.tritonops.shm.plugins.module_utils.wire.triton_http import TritonClient
from ansible_collections.tritonops.shm.plugins.modules import triton_shm_info
from ansible_collections.tritonops.shm.plugins.plugin_utils.report import fleet_table
from ansible_collections.tritonops.shm.plugins.plugin_utils.report.html_report import shm_html_report

shm_dir, lock_dir = sys.argv[1], sys.argv[2]
runlock.LOCK_DIR = lock_dir
runlock.lock_dir = lambda euid=None: lock_dir
ANSWERS = {
    '/v2': dict(name='triton', version='2.51.0', extensions=['system_shared_memory', 'test_shared_memory']),
    '/v2/systemsharedmemory/status': [],
    '/v2/testsharedmemory/status': [dict(name='t0', byte_size=4096)],
    '/v2/health/live': {}, '/v2/health/ready': {},
}
asked = []


class Fake(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        asked.append(('GET', self.path))
        body = json.dumps(ANSWERS[self.path]).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Fake)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f'http://127.0.0.1:{server.server_address[1]}'
warnings = []


def client():
    return TritonClient(url)


params = dict(orphan_patterns=[], min_age=300, backend_patterns=[], client_users=[], wedged_after=None,
              extra_families=[], server_pid=None, shm_dir=shm_dir, clients_share_pid_namespace=False,
              file_records='limited', query=None)
module = types.SimpleNamespace(params=params, warn=warnings.append)
info = triton_shm_info.ShmInfo(module, client()).read()


def region_params(**kw):
    p = dict(state='absent', kind='test', name=[], key=None, offset=0, byte_size=None, create_file=False,
             raw_handle=None, device_id=None, stale=False, all=False, orphan_files=False, orphan_patterns=[],
             min_age=300, exclude=[], remove_file=True, in_use_timeout=10, server_pid=None, shm_dir=shm_dir,
             reserved=False, backend_patterns=[], inventory=False)
    p.update(kw)
    return p


def region(**kw):
    return run_steps(RegionOps(client(), region_params(**kw), check_mode=True, warn=warnings.append), True)


present = region(state='present', name=['t1'], byte_size=1024)
absent = region(stale=True)
# the metrics and the report show a located server's numbers (this fake has no process): the same result with a pid
located = dict(info, server=dict(info['server'], pid=42), holders_complete=True)
row = fleet_table.shm_report_row(located, 't1', url)
print(json.dumps(dict(
    info=info, present=present, absent=absent, asked=asked, row=row,
    table=fleet_table.shm_fleet_table([row], 'report'),
    text=metrics.report_text(located, 't1', url),
    page=shm_html_report([row], 'report', details=[located]),
), default=str))
"""


def _run(shm_dir: str, lock_dir: str) -> dict:
    out = subprocess.run(
        [sys.executable, '-c', THIRD_KIND, shm_dir, lock_dir],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_third_kind_is_read_planned_counted_and_shown_from_its_definition_and_its_evidence_alone(shm, tmp_path):
    seen = _run(shm, str(tmp_path / 'locks'))
    info = seen['info']
    # triton_shm_info: read at the kind's own HTTP path, classified by its own rule, returned under test_regions
    assert ['GET', '/v2/testsharedmemory/status'] in seen['asked']
    t0 = dict(name='t0', byte_size=4096, holders=[], state='stale', reclaimable=True)
    assert [{k: r[k] for k in t0} for r in info['test_regions']] == [t0]
    assert info['system_regions'] == [] and info['cuda_regions'] == []
    summary = info['summary']
    assert summary['test_regions'] == 1 and summary['test_stale_regions'] == 1 and summary['test_stale_bytes'] == 4096
    assert summary['test_unknown_regions'] == 0 and summary['cuda_regions'] == 0
    # a check-mode triton_shm_region: register one of the kind, and select its stale regions; nothing is sent
    present = seen['present']
    assert present['changed'] is True and present['registered'] == ['t1'], present
    assert [r['name'] for r in present['regions']] == ['t0', 't1']
    absent = seen['absent']
    assert absent['changed'] is True and absent['unregistered'] == ['t0'], absent
    assert not [a for a in seen['asked'] if a[0] != 'GET'], 'check mode sends no register or unregister'
    # the metrics: its count and (no GPU memory) no bytes by device
    assert 'tritonops_shm_test_regions{host="t1",triton_url="' in seen['text']
    assert '# TYPE tritonops_shm_test_regions gauge' in seen['text']
    assert 'tritonops_shm_test_region_bytes' not in seen['text']
    # the report: the fleet row's counts, the fleet table's line under the host, the HTML counts
    row = seen['row']
    assert row['test_regions'] == 1 and row['test_stale_regions'] == 1 and row['test_stale_bytes'] == 4096
    assert any(line.strip().startswith('TEST: 1 region(s), stale 1 (4.0 KiB), unknown 0') for line in seen['table'])
    page = seen['page']
    assert 'data-state="test"' in page and 'data-state="test_stale"' in page and '<dt>TEST stale (4.0 KiB)</dt>' in page
