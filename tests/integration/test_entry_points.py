"""Issue 26, the other entry points: secrets (10), Markdown and terminal injection (12), a planted report_dir (9).

Real tritonservers (HTTP and gRPC), a real auth proxy in front of one, the real report and cleanup
playbooks at -vvv with the invocation injected and a log file; every output file (report.json/md/html,
the role's JSON, summary.md and report.html, the node_exporter textfiles) is read back. The planted
report_dir is a real symlink made by the user ``nobody``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import proxy_helpers
import pytest
import tritonclient.grpc as grpcclient
from ansible_helpers import PYTHON, REPO, ansible_playbook
from markdown_it import MarkdownIt

MiB = 1 << 20
REPORT = os.path.join(REPO, 'playbooks', 'report.yml')
CLEANUP = os.path.join(REPO, 'playbooks', 'cleanup.yml')
TOKEN = 's3cr3t-9b2e41d7-never-shown'
PASSWORD = 'pa55-71c0ffee-never-shown'
VERBOSE = {'ANSIBLE_STDOUT_CALLBACK': 'ansible.builtin.default', 'ANSIBLE_INJECT_INVOCATION': '1'}


def require_token(method, path, headers):
    """An auth proxy: 401 unless the Authorization header carries the token."""
    if headers.get('Authorization') != f'Bearer {TOKEN}':
        return 401, 'application/json', b'{"error": "missing or wrong Authorization header"}'
    return None


def outputs(*dirs) -> dict:
    """Every file under dirs: path -> text."""
    found = {}
    for d in dirs:
        for root, _dirs, files in os.walk(d):
            for name in files:
                with open(os.path.join(root, name), errors='replace') as f:
                    found[os.path.join(root, name)] = f.read()
    return found


# -- 10: a header value with a line break, a URL with user:password@ ------------------------------------


def test_bad_header_values_and_url_credentials_are_refused_and_never_shown(make_triton, tmp_path):
    server = make_triton(models=(), grpc=True, shm_size='16m')
    server.leak('stale_one', byte_size=MiB)
    host, port = server.url.split('://', 1)[1].rsplit(':', 1)
    base = dict(
        ansible_connection='local',
        ansible_python_interpreter=PYTHON,
        triton_server_pid=server.pid,
        prometheus_textfile_dir=str(tmp_path / 'textfiles'),
    )
    (tmp_path / 'textfiles').mkdir()
    with proxy_helpers.ForwardingProxy(server.url, fault=require_token) as proxy:
        # a YAML block scalar ("|") ends in a newline: the value the HTTP library refused and echoed
        hosts = {
            'http_header': dict(base, triton_url=proxy.url(), triton_headers={'Authorization': f'Bearer {TOKEN}\n'}),
            'grpc_header': dict(
                base, triton_url=server.grpc_scheme_url, triton_headers={'authorization': f'Bearer {TOKEN}\n'}
            ),
            'userinfo': dict(base, triton_url=f'http://admin:{PASSWORD}@{host}:{port}'),
            'grpc_userinfo': dict(base, triton_url=f'grpc://admin:{PASSWORD}@{server.grpc_url}'),
        }
        inventory = {'all': {'children': {'triton': {'hosts': hosts}}}}
        log = tmp_path / 'ansible.log'
        env = dict(VERBOSE, ANSIBLE_LOG_PATH=str(log))
        report = ansible_playbook(
            REPORT, inventory=inventory, extra_vars={'report_dir': str(tmp_path / 'report')}, env=env, args=['-vvv']
        )
        cleanup = ansible_playbook(
            CLEANUP,
            inventory=inventory,
            env=env,
            args=['-vvv'],
            extra_vars={'shm_cleanup_report_dir': str(tmp_path / 'cleanup')},
        )
        sent = [r['headers'].get('Authorization') for r in proxy.requests]
    texts = {
        'report stdout': report.stdout,
        'report stderr': report.stderr,
        'cleanup stdout': cleanup.stdout,
        'cleanup stderr': cleanup.stderr,
        'log': log.read_text(),
    }
    files = outputs(tmp_path / 'report', tmp_path / 'cleanup', tmp_path / 'textfiles')
    assert {os.path.basename(p) for p in files} >= {
        'report.json',
        'report.md',
        'report.html',
        'summary.md',
        'http_header.json',
        'userinfo.json',
    }
    texts.update(files)
    for where, text in texts.items():
        assert TOKEN not in text, f'the header value leaked into {where}'
        assert PASSWORD not in text, f'the URL password leaked into {where}'
    assert report.rc != 0 and cleanup.rc != 0, 'every host is refused'
    assert sent == [], 'nothing was sent with a refused header'
    assert 'stale_one' in server.system_regions(), 'nothing was done'
    # the refusals say what and why, naming the header, not its value
    assert "the value of header 'Authorization' contains a control character" in report.stdout
    assert "the value of header 'authorization' contains a control character" in report.stdout
    assert f'http://***@{host}:{port} carries a user:password@ part' in report.stdout
    assert 'http://***@' in files[str(tmp_path / 'report' / 'report.json')]


# -- 12: names, versions and error texts in report.md and summary.md -------------------------------------

HOSTILE = [
    '<img src=x onerror=alert(1)>',
    'a|b|c',
    '[click](javascript:alert(1))',
    '# heading',
    '\x1b[31mred\x1b]0;pwn\x07',
    'line\nbreak',
    '**bold**_em_`code`',
]
HOSTILE_VERSION = '<b>2.51</b>|[x](javascript:1)\n# v'
SERVER_ERROR = b'{"error": "<script>alert(1)</script> | [x](http://evil.example) \\u001b[2J\\n# pwned"}'


def markdown_problems(text: str) -> list:
    """What in a Markdown page is not plain text from a value: raw HTML, links, images, escapes, broken table rows.

    The pages' own markup is the only code span (summary.md's ``Mode `stale```) and the fixed headings.
    """
    problems = [c for c in ('\x1b', '\r', '\x07') if c in text]
    md = MarkdownIt('commonmark').enable('table')
    tokens = md.parse(text)
    cells = None
    for t in tokens:
        if t.type in ('html_block', 'html_inline'):
            problems.append(t.content)
        if t.type == 'tr_open':
            cells = 0
        if t.type in ('th_open', 'td_open'):
            cells += 1
        if t.type == 'tr_close':
            # report.md's fleet table has 12 cells, its "What fills /dev/shm" and summary.md's table 11
            problems += [] if cells in (11, 12) else [f'a table row with {cells} cells']
        for c in t.children or []:
            if c.type in ('html_inline', 'link_open', 'image') or c.type == 'code_inline' and c.content != 'stale':
                problems.append(f'{c.type}: {c.content or c.attrs}')
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == 'heading_open']
    problems += [f'heading {h!r}' for h in headings if 'pwn' in h or h.startswith('heading')]
    return problems


def test_hostile_names_and_server_errors_are_plain_text_in_report_md_and_summary_md(make_triton, tmp_path):
    server = make_triton(models=(), grpc=True, shm_size='32m')
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for i, name in enumerate(HOSTILE):
            server.write_file(f'/hostile{i}', MiB)  # a client's file left behind: nobody holds it, stale
            client.register_system_shared_memory(name, f'/hostile{i}', MiB)
    assert sorted(server.system_regions()) == sorted(HOSTILE)

    def hostile_500(method, path, headers):
        return 500, 'application/json', SERVER_ERROR

    metadata = json.dumps(dict(server.api('/v2')[1], version=HOSTILE_VERSION)).encode()

    def hostile_version(method, path, headers):  # the server's own metadata, its version a hostile text
        return (200, 'application/json', metadata) if (method, path) == ('GET', '/v2') else None

    base = dict(ansible_connection='local', ansible_python_interpreter=PYTHON, prometheus_textfile_dir='')
    with (
        proxy_helpers.ForwardingProxy(server.url, fault=hostile_500) as liar,
        proxy_helpers.ForwardingProxy(server.url, fault=hostile_version) as odd,
    ):
        hosts = {
            'seen': dict(base, triton_url=server.url, triton_server_pid=server.pid),
            'liar': dict(base, triton_url=liar.url()),
            'odd': dict(base, triton_url=odd.url(), triton_server_pid=server.pid),
        }
        inventory = {'all': {'children': {'triton': {'hosts': hosts}}}}
        report = ansible_playbook(REPORT, inventory=inventory, extra_vars={'report_dir': str(tmp_path / 'report')})
        cleanup = ansible_playbook(
            CLEANUP, inventory=inventory, extra_vars={'shm_cleanup_report_dir': str(tmp_path / 'cleanup')}
        )
    assert report.rc != 0 and cleanup.rc != 0, 'the liar fails'
    rows = {r['host']: r for r in json.loads((tmp_path / 'report' / 'report.json').read_text())['hosts']}
    assert rows['odd']['status'] == 'ok' and rows['odd']['version'] == HOSTILE_VERSION, rows['odd']
    report_md = (tmp_path / 'report' / 'report.md').read_text()
    summary_md = (tmp_path / 'cleanup' / 'summary.md').read_text()
    assert markdown_problems(report_md) == []
    assert markdown_problems(summary_md) == []
    # the names are there, as text a reader sees whole (escapes shown for control characters)
    rendered = MarkdownIt('commonmark').enable('table').render(report_md + '\n' + summary_md)
    version_shown = '&lt;b&gt;2.51&lt;/b&gt;|[x](javascript:1)\\n# v'  # HOSTILE_VERSION as a reader sees it
    for shown in (
        '&lt;img src=x onerror=alert(1)&gt;',
        'a|b|c',
        '[click](javascript:alert(1))',
        '# heading',
        '\\x1b[31mred\\x1b]0;pwn\\x07',
        'line\\nbreak',
        '**bold**_em_`code`',
        '&lt;script&gt;alert(1)&lt;/script&gt;',
        version_shown,
    ):
        assert shown in rendered, shown
    assert rendered.count(version_shown) >= 2, 'the version, in the report and in the summary'


# -- 9: a report_dir that another user planted as a symlink ---------------------------------------------


def as_nobody(*cmd):
    subprocess.run(['setpriv', '--reuid', 'nobody', '--regid', 'nogroup', '--clear-groups', '--', *cmd], check=True)


@pytest.fixture
def shared():
    """A world-writable sticky directory that nobody can reach, as /tmp is (pytest's tmp_path is 0700)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix='tritonops-shared-', dir='/tmp'))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.parametrize('playbook, var', [(REPORT, 'report_dir'), (CLEANUP, 'shm_cleanup_report_dir')])
def test_a_report_dir_planted_as_a_symlink_by_another_user_is_refused(make_triton, tmp_path, shared, playbook, var):
    server = make_triton(models=(), shm_size='16m')
    victim = tmp_path / 'victim'
    victim.mkdir()
    precious = {name: f'root data in {name}\n' for name in ('report.json', 'summary.md', 'report.html', 'h1.json')}
    for name, text in precious.items():
        (victim / name).write_text(text)
    planted = shared / 'reports'
    as_nobody('ln', '-s', str(victim), str(planted))
    assert planted.is_symlink() and os.lstat(planted).st_uid != 0
    inventory = {
        'all': {
            'children': {
                'triton': {
                    'hosts': {
                        'h1': dict(
                            ansible_connection='local',
                            ansible_python_interpreter=PYTHON,
                            triton_url=server.url,
                            triton_server_pid=server.pid,
                            prometheus_textfile_dir='',
                        )
                    }
                }
            }
        }
    }
    res = ansible_playbook(playbook, inventory=inventory, extra_vars={var: str(planted)})
    assert res.rc != 0
    assert f'{var} {planted} is a symlink to {victim} (not followed; give the real directory)' in res.stdout
    assert {p.name: p.read_text() for p in victim.iterdir()} == precious, 'nothing written through the link'
    # a path through the link is refused too, a real directory works
    res = ansible_playbook(playbook, inventory=inventory, extra_vars={var: str(planted / 'sub')})
    assert res.rc != 0 and 'through a symlink' in res.stdout and not (victim / 'sub').exists()
    res = ansible_playbook(playbook, inventory=inventory, extra_vars={var: str(tmp_path / 'real')})
    assert res.rc == 0, res.stdout[-3000:]
    assert (tmp_path / 'real' / 'report.html').is_file()
