"""report.html of the report and cleanup playbooks, read by a real headless Chromium.

The fleet is real: a tritonserver with a live client, a stale region (a client killed with its
process group), a dangling one (a client killed alone), a region named like an HTML tag
registered over gRPC and an old orphan file named like one; a second server whose process
Ansible cannot see (the module runs in its own PID namespace: an execution environment that
does not share the host's process table); a third that is down. Chromium parses each page
(``--dump-dom``: the DOM after parsing, so a tag in a name would show as an element) and takes
a screenshot, kept under tests/output/ops-panel/ of the collection copy (build/...); with
TRITONOPS_DOCS_IMAGES=DIR the report's and the cleanup's are also copied to DIR (docs/images/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import tritonclient.grpc as grpcclient
import tritonrig
from ansible_helpers import PYTHON, REPO, ansible_playbook

MiB = 1 << 20
HOSTILE = '<img src=x onerror=alert(1)>'
ORPHAN = 'client_' + HOSTILE
AGED = 2.0  # seconds: the orphan's min_age (shm_cleanup_min_age); the fleet fixture waits until it is older
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
OUT = os.path.join(REPO, 'tests', 'output', 'ops-panel')
DOCS_IMAGES = ('report', 'cleanup')  # the screenshots docs/ops-panel.md shows
VOID = {'area', 'base', 'br', 'col', 'embed', 'hr', 'img', 'input', 'link', 'meta', 'source', 'track', 'wbr'}


class Node:
    def __init__(self, tag: str, attrs: dict) -> None:
        self.tag, self.attrs, self.children = tag, attrs, []

    def text(self) -> str:
        return ''.join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str | None = None, **attrs: str) -> list:
        """Descendant elements of tag (any when None) whose attributes have these values (data_x -> data-x)."""
        want = {k.replace('_', '-'): v for k, v in attrs.items()}
        out = []
        for c in self.children:
            if isinstance(c, Node):
                if (tag is None or c.tag == tag) and all(c.attrs.get(k) == v for k, v in want.items()):
                    out.append(c)
                out += c.all(tag, **attrs)
        return out

    def one(self, tag: str | None = None, **attrs: str) -> Node:
        found = self.all(tag, **attrs)
        assert len(found) == 1, (tag, attrs, len(found))
        return found[0]


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node('#document', {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def chromium(page: str, name: str) -> Node:
    """The DOM Chromium built from the page, and its screenshot (1280x1600) kept as OUT/NAME.png."""
    assert CHROMIUM, 'chromium is not installed: .ci/deps installs it (Debian package chromium)'
    os.makedirs(OUT, exist_ok=True)
    profile = os.path.join(OUT, f'.profile-{name}')
    cmd = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', f'--user-data-dir={profile}']
    url = 'file://' + page
    dom = subprocess.run(cmd + ['--dump-dom', url], capture_output=True, text=True, timeout=120, check=True).stdout
    png = os.path.join(OUT, f'{name}.png')
    subprocess.run(
        cmd + [f'--screenshot={png}', '--window-size=1280,1600', '--hide-scrollbars', url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    shutil.rmtree(profile, ignore_errors=True)
    with open(png, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    if os.environ.get('TRITONOPS_DOCS_IMAGES') and name in DOCS_IMAGES:
        shutil.copy(png, os.path.join(os.environ['TRITONOPS_DOCS_IMAGES'], f'ops-panel-{name}.png'))
    with open(os.path.join(OUT, f'{name}.dom.html'), 'w') as f:
        f.write(dom)
    tree = _Tree()
    tree.feed(dom)
    return tree.root


@pytest.fixture
def fleet(make_triton, tmp_path):
    """(inventory, servers, live client): one server to see, one whose process is invisible, one down."""
    seen = make_triton(models=(), grpc=True, shm_size='32m')
    orphan = seen.write_file(ORPHAN, MiB)  # first: it ages while the rest of the fleet starts
    live = seen.client('live', byte_size=2 * MiB)
    seen.leak('dead', byte_size=8 * MiB)
    seen.leak('gone', byte_size=MiB, keep_file=False)
    seen.write_file('/hostile', MiB)  # a client's file, left behind: nobody holds it
    with grpcclient.InferenceServerClient(seen.grpc_url) as client:
        client.register_system_shared_memory(HOSTILE, '/hostile', MiB)
    blind = make_triton(models=(), shm_size='16m')
    blind.leak('elsewhere', byte_size=MiB)
    down = make_triton(models=(), shm_size='16m')
    down.stop()
    # the blind host's modules run in a PID namespace of their own: the server answers, its process is invisible
    wrapper = tmp_path / 'python-blind'
    wrapper.write_text(f'#!/bin/sh\nexec unshare --pid --fork --mount-proc {PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    base = dict(ansible_connection='local', ansible_python_interpreter=PYTHON, prometheus_textfile_dir='')
    hosts = {
        'seen': dict(base, triton_url=seen.url),
        'blind': dict(base, triton_url=blind.url, ansible_python_interpreter=str(wrapper)),
        'down': dict(base, triton_url=down.url),
    }
    inventory = {'all': {'children': {'triton': {'hosts': hosts}}}}
    assert sorted(seen.system_regions()) == sorted(['live', 'dead', 'gone', HOSTILE])
    tritonrig.wait_older([orphan], AGED)
    yield inventory, seen, live
    assert live.alive


def host_section(dom: Node, host: str) -> Node:
    return dom.one('section', data_host=host)


def states(section: Node) -> dict:
    return {
        tr.attrs['data-region']: tr.attrs['data-state']
        for tr in section.one('table', **{'class': 'regions'}).all('tr')
        if 'data-region' in tr.attrs
    }


def counts(section: Node) -> dict:
    return {
        div.attrs['data-state']: int(div.one('dd').text())
        for div in section.one('dl').all('div')
        if 'data-state' in div.attrs
    }


def open_page(page, name: str, title: str) -> Node:
    """The page as Chromium parsed it, checked: mode 0644, its title, self-contained."""
    assert oct(page.stat().st_mode & 0o777) == '0o644'
    raw = page.read_text()
    dom = chromium(str(page), name)
    assert dom.one('title').text() == title
    assert_self_contained(dom, raw)
    return dom


def host_order(dom: Node) -> list:
    return [s.attrs['data-host'] for s in dom.all('section') if 'data-host' in s.attrs]


def attention(dom: Node) -> dict:
    """host -> its line in the box at the top of the page."""
    return {li.attrs['data-host']: li for li in dom.one('section', id='attention').all('li')}


def outcomes(section: Node) -> dict:
    """region -> what the cleanup did with it."""
    return {
        tr.attrs['data-region']: tr.one('td', **{'class': 'outcome'}).text()
        for tr in section.all('tr')
        if 'data-region' in tr.attrs
    }


def assert_self_contained(dom: Node, raw: str) -> None:
    """No script, no external resource, the hostile names only as text; a CSP that forbids scripts and fetches."""
    assert not dom.all('script') and not dom.all('img') and not dom.all('link') and not dom.all('iframe')
    assert all(a.attrs.get('href', '#').startswith('#') for a in dom.all('a'))
    assert 'url(' not in raw and '@import' not in raw and 'http://' not in raw.split('<body')[0]
    csp = dom.one('meta', **{'http-equiv': 'Content-Security-Policy'}).attrs['content']
    assert "default-src 'none'" in csp and 'script-src' not in csp
    assert HOSTILE not in raw and '&lt;img src=x onerror=alert(1)&gt;' in raw


def test_report_html_in_chromium(fleet, tmp_path):
    inventory, seen, live = fleet
    before = (seen.system_regions(), seen.shm_files())
    report_dir = tmp_path / 'report'
    res = ansible_playbook(
        'tritonops.shm.report',
        inventory=inventory,
        extra_vars={
            'report_dir': str(report_dir),
            'shm_cleanup_orphan_patterns': ['client_*'],
            'shm_cleanup_min_age': AGED,
        },
    )
    assert res.stats['seen']['failures'] == 0 and res.stats['blind']['failures'] == 1, res
    assert res.stats['down']['failures'] == 1 and res.stats['localhost']['changed'] == 0, res
    assert (seen.system_regions(), seen.shm_files()) == before and live.alive
    dom = open_page(report_dir / 'report.html', 'report', 'Triton shared memory report')

    # failures first, in the box at the top, with their reason
    assert host_order(dom) == ['down', 'blind', 'seen']
    box = attention(dom)
    assert sorted(box) == ['blind', 'down']
    assert box['down'].attrs['data-status'] == 'down' and 'cannot connect' in box['down'].text()
    assert box['blind'].attrs['data-status'] == 'unlocated' and 'was not found' in box['blind'].text()

    ok = host_section(dom, 'seen')
    assert ok.attrs['data-status'] == 'ok'
    located = ok.one(data_located='true').text()
    assert located.startswith('Server found: listener') and f'pid {seen.pid}' in located
    assert states(ok) == {'live': 'healthy', 'dead': 'stale', 'gone': 'dangling', HOSTILE: 'stale'}
    assert counts(ok) == {
        'healthy': 1,
        'stale': 2,
        'reserved': 0,
        'dangling': 1,
        'unknown': 0,
        'suspect': 0,
        'wedged': 0,
        'cuda': 0,
    }
    rows = {tr.attrs['data-region']: tr for tr in ok.all('tr') if 'data-region' in tr.attrs}
    assert rows[HOSTILE].one('td', **{'class': 'name'}).text() == HOSTILE
    assert f'(pid {live.pid})' in rows['live'].one('td', **{'class': 'holders'}).text()
    assert rows['dead'].one('td', **{'class': 'holders'}).text() == '-'
    orphans = ok.one('table', **{'class': 'orphans'})
    assert [tr.attrs['data-file'] for tr in orphans.all('tr') if 'data-file' in tr.attrs] == [ORPHAN]
    assert orphans.all('td', **{'class': 'path'})[0].text() == ORPHAN
    # the bar: used of size, with the stale, registered and orphan parts (bytes as the filesystem counts them)
    legend = ok.one('div', **{'class': 'legend'})
    assert int(legend.attrs['data-total']) == 32 * MiB
    assert '32.0 MiB' in legend.text() and 'stale 9.0 MiB' in legend.text() and 'orphan 1.0 MiB' in legend.text()
    usage = ok.one('div', **{'class': 'bar'})
    parts = {span.attrs['class']: float(span.attrs['style'][len('width:') : -1]) for span in usage.all('span')}
    assert parts['seg-stale'] == pytest.approx(100.0 * 9 / 32, abs=0.2) and parts['seg-orphan'] == pytest.approx(
        100 / 32, abs=0.2
    )
    assert parts['seg-live'] >= 100.0 * 2 / 32 - 0.2

    blind = host_section(dom, 'blind')
    assert blind.attrs['data-status'] == 'unlocated'
    assert 'was not found' in blind.one('p', data_located='false').text()
    assert states(blind) == {'elsewhere': 'unknown'} and counts(blind)['stale'] == 0
    down = host_section(dom, 'down')
    assert down.attrs['data-status'] == 'down' and 'cannot connect' in down.one('p', **{'class': 'error'}).text()
    assert not down.all('table')


def test_cleanup_html_in_chromium(fleet, tmp_path):
    inventory, seen, live = fleet
    before = (seen.system_regions(), seen.shm_files())
    report_dir = tmp_path / 'cleanup'
    extra = {
        'shm_cleanup_report_dir': str(report_dir),
        'shm_cleanup_orphan_patterns': ['client_*'],
        'shm_cleanup_min_age': AGED,
    }

    res = ansible_playbook('tritonops.shm.cleanup', inventory=inventory, extra_vars=extra, check=True, diff=True)
    assert res.stats['seen']['failures'] == 0 and res.stats['blind']['failures'] == 1, res
    page_diff = res.task(
        "tritonops.shm.shm_cleanup : Write each host's JSON record, summary.md and report.html on the controller",
        host='seen',
    ).get('diff')
    assert not page_diff, str(page_diff)[:300]  # no page-long diff in --diff output
    assert (seen.system_regions(), seen.shm_files()) == before
    dom = open_page(report_dir / 'report.html', 'cleanup-check', 'Triton shared memory cleanup')
    assert 'check mode: nothing was changed' in dom.one('header').text()
    outcome = outcomes(host_section(dom, 'seen'))
    assert (
        outcome['dead'] == 'would be unregistered'
        and outcome['gone'] == 'would be unregistered'
        and outcome['live'] == 'kept'
    )

    res = ansible_playbook('tritonops.shm.cleanup', inventory=inventory, extra_vars=extra)
    assert res.stats['seen']['failures'] == 0 and res.stats['seen']['changed'] >= 1, res
    assert res.stats['blind']['failures'] == 1 and res.stats['down']['failures'] == 1, res
    assert sorted(seen.system_regions()) == sorted(['live', HOSTILE]) and live.alive
    assert ORPHAN not in seen.shm_files() and 'dead' not in seen.shm_files()
    dom = open_page(report_dir / 'report.html', 'cleanup', 'Triton shared memory cleanup')
    assert host_order(dom) == ['blind', 'down', 'seen']
    box = {host: li.text() for host, li in attention(dom).items()}
    assert "failed at 'Locate the Triton server process'" in box['blind'] and 'was not found' in box['blind']
    assert 'cannot connect' in box['down'], box['down']

    ok = host_section(dom, 'seen')
    assert ok.attrs['data-status'] == 'ok'
    assert ok.one(data_located='true').text().startswith('Server found: listener')
    # the regions as this run found them, and what it did with each
    assert states(ok) == {'live': 'healthy', 'dead': 'stale', 'gone': 'dangling', HOSTILE: 'stale'}
    outcome = outcomes(ok)
    assert outcome['dead'] == 'unregistered' and outcome['gone'] == 'unregistered' and outcome['live'] == 'kept'
    assert outcome[HOSTILE].startswith('skipped: ') and 'gRPC' in outcome[HOSTILE]
    orphan = ok.one('tr', data_file=ORPHAN)
    assert (
        orphan.one('td', **{'class': 'path'}).text() == ORPHAN
        and orphan.one('td', **{'class': 'outcome'}).text() == 'removed'
    )
    done = ok.one('p', **{'class': 'done'}).text()
    assert (
        '2 region(s) unregistered' in done
        and '2 file(s) removed' in done
        and "freed 10.0 MiB (9.0 MiB of files, 1.0 MiB of the dangling regions' memory)" in done
    )
    bars = [b.attrs['data-bar'] for b in ok.all('div', **{'class': 'bar'})]
    assert bars == ['/dev/shm before', '/dev/shm after']
    blind = host_section(dom, 'blind')
    assert blind.attrs['data-status'] == 'failed' and 'was not found' in blind.one('p', data_located='false').text()
