"""Unit tests for the tritonops.shm.shm_html_report filter: the page's structure, escaping and choices, as tables."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.tritonops.shm.plugins.filter.shm_html_report import FilterModule
from ansible_collections.tritonops.shm.plugins.plugin_utils.report.html_report import shm_html_report

MIB = 1 << 20
HOSTILE = '<img src=x onerror=alert(1)>'
ESCAPED = '&lt;img src=x onerror=alert(1)&gt;'
SUMMARY = dict(
    system_regions=3,
    cuda_regions=1,
    healthy_regions=1,
    stale_regions=1,
    reserved_regions=0,
    dangling_regions=1,
    unknown_regions=0,
    stale_bytes=8 * MIB,
    orphan_files=1,
    orphan_bytes=MIB,
    registered_files=2,
    in_use_files=0,
    backend_files=0,
    foreign_files=1,
    used_bytes=16 * MIB,
    total_bytes=64 * MIB,
    used_percent=25.0,
)


def info(**over):
    base = dict(
        server=dict(
            pid=42,
            shm_dir='/proc/42/root/dev/shm',
            located_by='listener',
            not_found_reason=None,
            version='2.51.0',
            ready=True,
        ),
        holders_complete=True,
        unreadable_processes=0,
        summary=dict(SUMMARY),
        system_regions=[
            dict(name='live', key='/live', byte_size=2 * MIB, state='healthy', holders=[dict(pid=7, comm='python')]),
            dict(name='dead', key='/dead', byte_size=8 * MIB, state='stale', holders=[], state_reason='no holder'),
            dict(name='gone', key='/gone', byte_size=MIB, state='dangling', holders=[]),
        ],
        files=[
            dict(name='live', path='/s/live', category='registered', allocated_bytes=2 * MIB),
            dict(name='dead', path='/s/dead', category='registered', allocated_bytes=8 * MIB),
            dict(name='client_x', path='/s/client_x', category='orphan', allocated_bytes=MIB, age_s=3600),
            dict(name='other', path='/s/other', category='foreign', allocated_bytes=MIB),
        ],
    )
    base.update(over)
    return base


def row(host='t1', status='ok', error=None):
    return dict(host=host, url=f'http://{host}:8000', status=status, error=error)


UNLOCATED = info(
    server=dict(pid=None, shm_dir=None, located_by=None, not_found_reason='no process owns 10.0.0.7:8000'),
    holders_complete=False,
    summary=dict(SUMMARY, stale_regions=0, unknown_regions=3, total_bytes=None, used_bytes=None),
    system_regions=[dict(name='a', state='unknown', state_reason='the shm directory of the server is not known')],
    files=[],
)


class Dom(HTMLParser):
    """Start tags with their attributes, and the text, of a page (the structure the tests look at)."""

    def __init__(self, page):
        super().__init__(convert_charrefs=True)
        self.tags, self.texts = [], []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.texts.append(data)

    def find(self, tag=None, **attrs):
        want = {k.rstrip('_').replace('_', '-'): v for k, v in attrs.items()}
        return [a for t, a in self.tags if (tag is None or t == tag) and all(a.get(k) == v for k, v in want.items())]

    def attr_values(self, name):
        return [a[name] for _t, a in self.tags if name in a]


def sections(page):
    """host -> its section's HTML, in page order."""
    return dict(
        re.findall(r'<section class="host[^"]*" id="host-\d+" data-host="([^"]*)"[^>]*>(.*?)</section>', page, re.S)
    )


def test_registered_as_a_filter():
    assert {name: f.target() for name, f in FilterModule().filters().items()} == {'shm_html_report': shm_html_report}


@pytest.mark.parametrize(
    'kind, data, kwargs',
    [
        ('report', [row()], dict(details=[info()])),
        ('report', [row(status='down', error='cannot connect')], {}),
        ('cleanup', [None], dict(hosts=['t1'])),
        ('cleanup', [], dict(hosts=[])),
        ('report', [], {}),
    ],
)
def test_every_page_is_self_contained(kind, data, kwargs):
    page = shm_html_report(data, kind, **kwargs)
    dom = Dom(page)
    assert page.startswith('<!DOCTYPE html>\n') and page.endswith('</html>\n')
    assert {t for t, _a in dom.tags} & {'script', 'link', 'img', 'iframe', 'object', 'embed', 'form', 'base'} == set()
    assert not [a for a in dom.attr_values('href') if not a.startswith('#')]
    assert not dom.attr_values('src')
    assert 'url(' not in page and '@import' not in page and '//' not in page.split('<body')[0]
    csp = dom.find('meta', http_equiv='Content-Security-Policy')[0]['content']
    assert "default-src 'none'" in csp and 'script' not in csp
    assert not [a for _t, attrs in dom.tags for a in attrs if a.startswith('on')]


HOSTILE_PLACES = [
    ('region name', dict(system_regions=[dict(name=HOSTILE, key='/k', byte_size=1, state='stale', holders=[])])),
    (
        'region key and reason',
        dict(
            system_regions=[
                dict(name='r', key='/' + HOSTILE, byte_size=1, state='unknown', state_reason=HOSTILE, holders=[])
            ]
        ),
    ),
    (
        'holder comm',
        dict(system_regions=[dict(name='r', key='/r', state='healthy', holders=[dict(pid=1, comm=HOSTILE)])]),
    ),
    ('orphan file', dict(files=[dict(name=HOSTILE, path='/s/' + HOSTILE, category='orphan', allocated_bytes=1)])),
    ('located_by', dict(server=dict(pid=1, shm_dir='/x', located_by=HOSTILE, version=HOSTILE))),
    ('not_found_reason', dict(server=dict(pid=None, not_found_reason=HOSTILE))),
    ('state', dict(system_regions=[dict(name='r', key='/r', state=HOSTILE, holders=[])])),
]


@pytest.mark.parametrize('where, over', HOSTILE_PLACES, ids=[w for w, _o in HOSTILE_PLACES])
def test_strings_from_the_server_are_text(where, over):
    page = shm_html_report([row()], 'report', details=[info(**over)])
    assert HOSTILE not in page and ESCAPED in page, where
    assert not Dom(page).find('img')


@pytest.mark.parametrize('field', ['host', 'url', 'error'])
def test_row_strings_are_text(field):
    r = dict(row(status='down', error='x'), **{field: HOSTILE})
    page = shm_html_report([r], 'report')
    assert HOSTILE not in page and ESCAPED in page and not Dom(page).find('img')


@pytest.mark.parametrize(
    'field, value',
    [
        ('decision', HOSTILE),
        ('error', dict(step=HOSTILE, msg=HOSTILE)),
        ('skipped', [dict(name=HOSTILE, reason=HOSTILE), dict(path='/s/' + HOSTILE, reason=HOSTILE)]),
        ('url', HOSTILE),
    ],
)
def test_cleanup_strings_are_text(field, value):
    result = dict(status='ok', url='u', decision='d', done=dict(unregistered=[HOSTILE]), before=None, after=None)
    result[field] = value
    page = shm_html_report([result], 'cleanup', hosts=[HOSTILE], title=HOSTILE, generated_at=HOSTILE)
    assert HOSTILE not in page and ESCAPED in page and not Dom(page).find('img')


@pytest.mark.parametrize(
    'rows, details, order, attention',
    [
        (
            [row('a'), row('b', 'down', 'cannot connect'), row('c', 'unlocated', 'why')],
            [info(), None, UNLOCATED],
            ['b', 'c', 'a'],
            ['b', 'c'],
        ),
        ([row('a'), row('b')], [info(), info()], ['a', 'b'], []),
        (
            [row('a', 'not run', 'no result'), row('b', 'unlocated', 'why'), row('c', 'down', 'x')],
            [None, UNLOCATED, None],
            ['c', 'b', 'a'],
            ['c', 'b', 'a'],
        ),
    ],
)
def test_hosts_that_need_attention_come_first(rows, details, order, attention):
    page = shm_html_report(rows, 'report', details=details)
    assert list(sections(page)) == order
    box = re.search(r'<section id="attention">(.*?)</section>', page, re.S)
    assert [a['data-host'] for a in Dom(box.group(1)).find('li')] == attention if box else attention == []


@pytest.mark.parametrize(
    'status, tone', [('ok', 'host'), ('down', 'host bad'), ('unlocated', 'host bad'), ('not run', 'host warn')]
)
def test_status_is_marked(status, tone):
    page = shm_html_report(
        [row(status=status, error=None if status == 'ok' else 'e')],
        'report',
        details=[info() if status == 'ok' else UNLOCATED if status == 'unlocated' else None],
    )
    assert Dom(page).find('section', data_host='t1')[0]['class'] == tone
    assert Dom(page).find('section', data_host='t1')[0]['data-status'] == status


def test_ok_host_bar_counts_regions_and_orphans():
    page = shm_html_report([row()], 'report', details=[info()])
    dom = Dom(page)
    widths = {
        a['class']: float(a['style'][6:-1])
        for a in dom.find('span')
        if a.get('class', '').startswith('seg-') and 'style' in a
    }
    # 64 MiB: stale 8 (12.5 %), registered not stale 2 (3.125 %), orphan 1 (1.5625 %), the rest of the 16 used is other use
    assert widths == {'seg-stale': 12.5, 'seg-live': 3.125, 'seg-orphan': 1.562, 'seg-other': 7.812}
    legend = dom.find('div', class_='legend')[0]
    assert (legend['data-used'], legend['data-total']) == (str(16 * MIB), str(64 * MIB))
    assert '16.0 MiB used of 64.0 MiB (25.0%)' in page and 'registered 10.0 MiB; stale 8.0 MiB; orphan 1.0 MiB' in page
    counts = re.findall(r'<div(?: class="hot")? data-state="(\w+)"><dt>\w+</dt><dd>(\d+)</dd>', page)
    assert dict(counts) == {
        'healthy': '1',
        'stale': '1',
        'reserved': '0',
        'dangling': '1',
        'unknown': '0',
        'suspect': '0',
        'wedged': '0',
        'cuda': '1',
    }
    assert [a['data-state'] for a in dom.find('div', class_='hot')] == ['stale', 'dangling']
    # regions: the ones that need attention first; holders by name and pid
    assert [(a['data-region'], a['data-state']) for a in dom.find('tr') if 'data-region' in a] == [
        ('dead', 'stale'),
        ('gone', 'dangling'),
        ('live', 'healthy'),
    ]
    assert '<td class="holders">python (pid 7)</td>' in page
    assert [a['data-file'] for a in dom.find('tr') if 'data-file' in a] == ['client_x']  # orphans only, not foreign
    assert (
        '<b>Server found: </b>listener' in page
        and 'pid 42 · shm directory /proc/42/root/dev/shm · Triton 2.51.0 (ready)' in page
    )


@pytest.mark.parametrize(
    'summary, files, widths',
    [
        (dict(SUMMARY, used_bytes=64 * MIB), None, {'seg-stale': 12.5, 'seg-orphan': 1.562, 'seg-other': 85.938}),
        (dict(SUMMARY, stale_bytes=80 * MIB, used_bytes=32 * MIB), [], {'seg-stale': 50.0}),  # never past used
        (dict(SUMMARY, stale_bytes=0, orphan_bytes=0, used_bytes=0), [], {}),
    ],
)
def test_bar_parts_never_exceed_used(summary, files, widths):
    page = shm_html_report([row()], 'report', details=[info(summary=summary, files=files)])
    got = {a['class']: float(a['style'][6:-1]) for a in Dom(page).find('span') if 'style' in a}
    assert got == widths


def test_unlocated_host_says_why_once_and_nothing_is_stale():
    page = shm_html_report(
        [row(status='unlocated', error='no process owns 10.0.0.7:8000')], 'report', details=[UNLOCATED]
    )
    host = sections(page)['t1']
    assert host.count('no process owns 10.0.0.7:8000') == 1
    assert 'data-located="false"' in host and 'size unknown' in host
    assert 'data-region="a" data-state="unknown"' in host and 'Holders could not be fully determined' not in host


def test_incomplete_holders_are_said():
    page = shm_html_report([row()], 'report', details=[info(holders_complete=False, unreadable_processes=3)])
    assert '3 unreadable process(es)): no region is called stale here.' in page


def test_row_without_details_shows_its_own_numbers():
    r = dict(
        row(),
        shm_used_bytes=8 * MIB,
        shm_total_bytes=32 * MIB,
        stale_bytes=MIB,
        orphan_bytes=0,
        stale_regions=2,
        healthy_regions=1,
        cuda_regions=0,
    )
    page = shm_html_report([r], 'report')
    assert '8.0 MiB used of 32.0 MiB (25.0%)' in page and '<dt>stale</dt><dd>2</dd>' in page and '<table' not in page


def cleanup_record(**over):
    before = {
        k: SUMMARY[k]
        for k in (
            'system_regions',
            'healthy_regions',
            'stale_regions',
            'stale_bytes',
            'reserved_regions',
            'dangling_regions',
            'unknown_regions',
            'orphan_files',
            'orphan_bytes',
            'used_bytes',
            'total_bytes',
            'used_percent',
        )
    }
    rec = dict(
        host='t1',
        url='http://t1:8000',
        status='ok',
        changed=True,
        check_mode=False,
        decision='threshold 0%: always act',
        before=before,
        after=dict(before, stale_regions=0, stale_bytes=0, used_bytes=7 * MIB, used_percent=10.9),
        done=dict(
            unregistered=['dead', 'gone'],
            removed_files=['/s/dead', '/s/client_x'],
            freed_bytes=9 * MIB,
            registered=[],
            created_files=[],
        ),
        skipped=[dict(name='live', reason='held by 7')],
        error=None,
    )
    rec.update(over)
    return rec


DIRECT = dict(changed=True, before=info(), after=info(summary=dict(SUMMARY, stale_regions=0)))


@pytest.mark.parametrize(
    'region_result, shown',
    [
        (DIRECT, True),  # the region module's call of this run: its before
        (dict(DIRECT, failed=True, msg='boom'), True),  # also when it failed after reading
        (dict(skipped=True), False),
        (dict(failed=True, msg='cannot connect'), False),  # nothing read: counts only
        (None, False),
    ],
)
def test_cleanup_shows_the_inventory_its_record_was_made_from(region_result, shown):
    page = shm_html_report([cleanup_record()], 'cleanup', hosts=['t1'], details=[region_result])
    assert ('<table class="regions">' in page) is shown
    assert '<b>Done: </b>2 region(s) unregistered, 2 file(s) removed, freed 9.0 MiB, 0 region(s) re-registered' in page
    assert 'data-bar="/dev/shm before"' in page and 'data-bar="/dev/shm after"' in page
    if shown:
        outcome = dict(re.findall(r'data-region="(\w+)".*?<td class="outcome">([^<]*)</td>', page))
        assert outcome == {'dead': 'unregistered', 'gone': 'unregistered', 'live': 'skipped: held by 7'}
        assert re.search(r'data-file="client_x">.*?<td class="outcome">removed</td>', page)


def test_cleanup_shows_pending_regions_as_pending():
    """Triton 24.12+: an unregister accepted but still listed (requests in flight) is pending, not unregistered."""
    rec = cleanup_record(
        done=dict(
            unregistered=['gone'], pending=['dead'], removed_files=[], freed_bytes=0, registered=[], created_files=[]
        ),
        skipped=[dict(name='dead', reason='pending: unregistered, but still listed by the server after 10s')],
    )
    page = shm_html_report([rec], 'cleanup', hosts=['t1'], details=[DIRECT])
    assert '<b>Done: </b>1 region(s) unregistered, 1 pending, 0 file(s) removed' in page
    outcome = dict(re.findall(r'data-region="(\w+)".*?<td class="outcome">([^<]*)</td>', page))
    assert outcome['dead'] == 'pending: unregister accepted, still listed (requests in flight), file kept'
    assert outcome['gone'] == 'unregistered'


def test_cleanup_check_mode_says_would():
    rec = cleanup_record(check_mode=True, after=None)
    page = shm_html_report([rec], 'cleanup', hosts=['t1'], details=[DIRECT], check_mode=True)
    assert 'cleanup playbook, check mode: nothing was changed' in page and '(check mode: nothing was changed)' in page
    assert (
        '<td class="outcome">would be unregistered</td>' in page and '<td class="outcome">would be removed</td>' in page
    )
    assert 'would free 9.0 MiB' in page and 'data-bar="/dev/shm after"' not in page


@pytest.mark.parametrize(
    'rec, status, text',
    [
        (None, 'not run', 'no result (unreachable, limited out or stopped early)'),
        (
            cleanup_record(
                status='failed',
                before=None,
                after=None,
                decision='',
                done=dict(unregistered=[], removed_files=[]),
                error=dict(step='Query', msg='cannot connect'),
            ),
            'failed',
            "failed at 'Query': cannot connect",
        ),
    ],
)
def test_cleanup_host_that_did_not_finish(rec, status, text):
    page = shm_html_report([cleanup_record(host='t0'), rec], 'cleanup', hosts=['t0', 't1'], details=[DIRECT, None])
    assert list(sections(page)) == ['t1', 't0']
    host = sections(page)['t1']
    assert f'data-status="{status}"' in page and text in host and text in page.split('<section id="attention">')[1]
    assert '<b>Done: </b>' not in host


def test_cleanup_unlocated_failure_says_the_reason_once_in_its_section():
    reason = 'no process owns 10.0.0.7:8000'
    rec = cleanup_record(
        status='failed',
        decision='',
        after=None,
        done=dict(unregistered=[], removed_files=[]),
        before={k: v for k, v in UNLOCATED['summary'].items() if k != 'registered_files'},
        error=dict(step='Locate the Triton server process', msg=f'nothing on t1 could be checked: {reason}'),
    )
    page = shm_html_report([rec], 'cleanup', hosts=['t1'], details=[dict(failed=True, before=UNLOCATED)])
    host = sections(page)['t1']
    assert host.count(reason) == 1 and 'data-located="false"' in host
    assert "failed at 'Locate the Triton server process'" in page.split('<section id="attention">')[1]


@pytest.mark.parametrize(
    'size, text',
    [
        (0, '0 B'),
        (1023, '1023 B'),
        (1024, '1.0 KiB'),
        (9 * MIB, '9.0 MiB'),
        (3 << 40, '3.0 TiB'),
        (1 << 60, '1024.0 PiB'),
    ],
)
def test_sizes(size, text):
    page = shm_html_report(
        [row()], 'report', details=[info(system_regions=[dict(name='r', byte_size=size, state='stale')])]
    )
    assert f'<td class="num">{text}</td>' in page


@pytest.mark.parametrize(
    'data, kind, kwargs, message',
    [
        ([row()], 'table', {}, "kind must be 'report' or 'cleanup', got 'table'"),
        ([None], 'cleanup', dict(hosts=['a', 'b']), 'cleanup needs one result (or null) per host in hosts'),
        ([row()], 'report', dict(details=[None, None]), 'details needs one entry (or null) per row'),
        ({'host': 't1'}, 'report', {}, 'the input must be a list, got dict'),
        ('rows', 'report', {}, 'the input must be a list, got str'),
        (
            [row()],
            'report',
            dict(details=[dict(summary=dict(SUMMARY), system_regions='nope')]),
            'unexpected report data',
        ),
    ],
)
def test_wrong_input_is_a_clear_error(data, kind, kwargs, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        shm_html_report(data, kind, **kwargs)


POOLS = [
    dict(
        path='/s/p_echo',
        name='p_echo',
        backend='python',
        model='echo',
        instance='echo_0_0',
        bytes=3 * MIB,
        size=3 * MIB,
        holders=[dict(pid=42, comm='tritonserver'), dict(pid=43, comm='triton_python_b')],
        state='live',
        reason='held',
    ),
    dict(
        path='/s/p_mirror',
        name='p_mirror',
        backend='python',
        model='mirror',
        instance='mirror_0_0',
        bytes=MIB,
        size=MIB,
        holders=[dict(pid=42, comm='tritonserver'), dict(pid=44, comm='triton_python_b')],
        state='live',
        reason='held',
    ),
    dict(
        path='/s/p_dead',
        name='p_dead',
        backend='vllm',
        model=None,
        instance=None,
        bytes=2 * MIB,
        size=2 * MIB,
        holders=[],
        state='leftover',
        reason='held by no process ' + HOSTILE,
    ),
]


def test_the_pools_are_shown_per_model_with_the_leftovers_first_and_the_categories_in_order():
    summary = dict(SUMMARY, backend_files=2, leftover_files=1)
    page = shm_html_report([row()], 'report', details=[info(backend_pools=POOLS, summary=summary)])
    assert '<h3>Python backend pools by model</h3>' in page and ESCAPED in page and HOSTILE not in page
    rows = re.findall(r'<tr data-pool="(\w+)" data-model="(\w*)" data-state="(\w+)">', page)
    assert rows == [('p_dead', '', 'leftover'), ('p_echo', 'echo', 'live'), ('p_mirror', 'mirror', 'live')]
    models = re.findall(
        r'<tr data-model-total="(\w+)"><td class="name">[^<]*</td><td class="num">([^<]*)</td><td class="num">(\d+)</td>'
        r'<td class="num">([^<]*)</td><td class="num">([^<]*)</td></tr>',
        page,
    )
    # one row per model, the biggest first; the dead servers' leftovers (no live stub names their model) last
    assert models == [
        ('echo', '1', '1', '3.0 MiB', '3.0 MiB'),
        ('mirror', '1', '1', '1.0 MiB', '1.0 MiB'),
        ('leftover', '-', '1', '2.0 MiB', '2.0 MiB'),
    ], models
    categories = re.findall(r'data-category="(\w+)"', page)
    assert categories == ['registered', 'backend', 'leftover', 'in_use', 'orphan', 'foreign']


def test_a_cleanup_says_which_leftover_pools_it_removed():
    rec = cleanup_record(
        done=dict(unregistered=[], removed_files=['/s/p_dead'], freed_bytes=2 * MIB, registered=[], created_files=[])
    )
    direct = dict(DIRECT, before=info(backend_pools=POOLS))
    page = shm_html_report([rec], 'cleanup', hosts=['t1'], details=[direct])
    outcome = dict(re.findall(r'data-pool="(\w+)".*?<td class="outcome">([^<]*)</td>', page))
    assert outcome == {'p_dead': 'removed', 'p_echo': 'kept', 'p_mirror': 'kept'}


def test_an_incomplete_host_is_not_ok_and_says_why():
    """Issue 25 / issue 26 finding 7: the reason, a warning tone, counted apart from ok."""
    reason = "the module runs outside the host's initial PID namespace (...)"
    page = shm_html_report(
        [row(status='incomplete', error=reason)],
        'report',
        details=[info(holders_complete=False, holders_incomplete_reason=reason, pid_namespace='other')],
    )
    assert 'data-status="incomplete"' in page and 'class="host warn"' in page and 'data-fleet="incomplete"' in page
    assert 'data-incomplete="true"' in page and 'initial PID namespace (...)' in page
    assert '<b>0</b> ok' in page


def test_the_server_and_the_holders_are_named_by_pod_or_container():
    detail = info()
    detail['server']['container'] = dict(name='pod ml/triton-0')
    detail['system_regions'][0]['holders'] = [dict(pid=7, comm='python', container=dict(name='pod ml/client-0'))]
    page = shm_html_report([row()], 'report', details=[detail])
    assert 'pid 42, pod ml/triton-0' in page and 'python (pid 7, pod ml/client-0)' in page
    # a host process: its pid alone, as before
    assert 'python (pid 7)' in shm_html_report([row()], 'report', details=[info()])


def test_stale_cuda_regions_are_counted_with_their_gpu_bytes_and_marked():
    """Issue 34, goal 3: the host's counts show the CUDA regions by state with their GPU bytes; stale ones are hot."""
    cuda = dict(
        cuda_regions=3, cuda_stale_regions=1, cuda_stale_bytes=1 << 30, cuda_unknown_regions=2, cuda_unknown_bytes=0
    )
    page = shm_html_report([row()], 'report', details=[info(summary=dict(SUMMARY, **cuda))])
    found = dict(re.findall(r'<div(?: class="hot")? data-state="(cuda_\w+)"><dt>([^<]+)</dt><dd>\d+</dd>', page))
    assert found == {'cuda_stale': 'CUDA stale (1.0 GiB)', 'cuda_unknown': 'CUDA unknown (0 B)'}
    hot = [a['data-state'] for a in Dom(page).find('div', class_='hot')]
    assert 'cuda_stale' in hot and 'cuda_unknown' in hot


def test_what_fills_the_shm_directory_by_category_and_family():
    summary = dict(SUMMARY, registered_bytes=10 * MIB, foreign_bytes=MIB, orphan_bytes=MIB, other_bytes=3 * MIB)
    summary.update(unlinked_mapped_bytes=MIB, in_use_bytes=0, backend_bytes=0, leftover_bytes=0)
    fams = [
        dict(
            name='nccl',
            description='NCCL',
            files=2,
            bytes=MIB,
            held_files=1,
            held_bytes=MIB,
            unheld_files=1,
            unheld_bytes=0,
            containers=[HOSTILE],
        ),
    ]
    page = shm_html_report([row()], 'report', details=[info(summary=summary, families=fams)])
    dom = Dom(page)
    shown = {a['data-bytes'] for a in dom.find('tr') if 'data-bytes' in a}
    assert shown == {
        'registered',
        'backend',
        'leftover',
        'in_use',
        'orphan',
        'foreign',
        'unlinked_mapped_bytes',
        'other_bytes',
    }
    assert dom.find('tr', data_family='nccl')
    assert HOSTILE not in page and ESCAPED in page
    assert 'What fills /dev/shm' in page


def test_a_server_with_wedged_regions_needs_a_restart_and_says_what_it_frees():
    summary = dict(SUMMARY, wedged_regions=2, wedged_bytes=6 * MIB)
    page = shm_html_report([row('t1'), row('t2')], 'report', details=[info(summary=summary), info()])
    dom = Dom(page)
    attention = re.search(r'<section id="attention">(.*?)</section>', page, re.S).group(1)
    assert 'data-host="t1"' in attention and 'data-host="t2"' not in attention
    assert 'a restart of the server frees 6.0 MiB' in attention
    assert dom.find('p', data_restart='true') and 'need a restart' in page
    assert '2 wedged region(s)' in sections(page)['t1'] and 'Restart:' not in sections(page)['t2']
