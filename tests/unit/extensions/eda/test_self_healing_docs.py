"""docs/self-healing.md and .zh.md agree with the rulebooks and the event source.

Every YAML block parses; the vars.yml examples are accepted by the source's own argument
checks; every variable a rulebook reads is documented in both languages, and nothing
else is documented as a variable.
"""

from __future__ import annotations

import os
import re

import pytest
import yaml
from test_triton_shm_source import COLLECTION, make_ca, source

RULEBOOKS = os.path.join(COLLECTION, 'extensions', 'eda', 'rulebooks')
PAGES = ['self-healing.md', 'self-healing.zh.md']


def page(name):
    with open(os.path.join(COLLECTION, 'docs', name), encoding='utf-8') as f:
        return f.read()


def rulebook_variables():
    found = set()
    for name in ('self_heal.yml', 'self_heal_alertmanager.yml'):
        with open(os.path.join(RULEBOOKS, name)) as f:
            text = re.sub(r'(?m)^\s*#.*$', '', f.read())
        found |= set(re.findall(r'\{\{\s*([a-z_]+)', text)) | set(re.findall(r'\bvars\.([a-z_]+)', text))
    return found - {'event'}


@pytest.mark.parametrize('name', PAGES)
def test_yaml_examples_parse_and_the_poller_accepts_them(name, tmp_path):
    blocks = [textwrap_dedent(b) for b in re.findall(r'```yaml\n(.*?)```', page(name), re.S)]
    assert len(blocks) >= 5
    documents = [yaml.safe_load(b) for b in blocks]
    poller_vars = [d for d in documents if isinstance(d, dict) and 'triton_shm_servers' in d]
    assert len(poller_vars) == 1
    ca = make_ca(str(tmp_path), 'ca')['cert']  # the page's CA file does not exist here
    documented = [dict(s, ca_path=ca) if 'ca_path' in s else s for s in poller_vars[0]['triton_shm_servers']]
    servers, interval = source.parse_args(
        {
            'servers': documented,
            'interval': poller_vars[0]['self_heal_interval'],
            'threshold_percent': poller_vars[0]['self_heal_percent'],
        }
    )
    assert [s['host'] for s in servers] == ['gpu-node-1', 'gpu-node-2'] and interval == 30


def textwrap_dedent(block):
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return '\n'.join(line[indent:] for line in lines)


@pytest.mark.parametrize('name', PAGES)
def test_every_rulebook_variable_is_documented(name):
    documented = set(re.findall(r'^\| `([a-z_]+)` \|', page(name), re.M))
    variables = rulebook_variables()
    assert variables == {
        'triton_shm_servers',
        'self_heal_percent',
        'self_heal_interval',
        'self_heal_hosts',
        'self_heal_webhook_token',
        'self_heal_webhook_host',
        'self_heal_webhook_port',
    }
    assert variables == documented
