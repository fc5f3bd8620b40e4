"""Unit tests for the tritonops.shm.shm_md and shm_redact_url filters, rendered by a real CommonMark + GFM-table parser."""

from __future__ import annotations

import pytest
from markdown_it import MarkdownIt

from ansible_collections.tritonops.shm.plugins.filter.shm_text import FilterModule, shm_md, shm_redact_url

HOSTILE = [
    '<img src=x onerror=alert(1)>',
    '<script>alert(1)</script>',
    '[click](http://evil.example)',
    '![i](http://e/x.png)',
    '# heading',
    'a|b|c',
    '**bold** _em_ `code` ~~s~~',
    '\x1b[31mred\x1b[0m\x1b]0;title\x07',
    'line\nbreak\r\n## two',
    'x\u202etxt.exe',
    '&lt;entity&gt; &amp;',
    'back\\slash\\|',
    '<http://auto.link>',
    ' padded ',
    'plain-name_1.0',
]


def cell_tokens(text: str) -> list:
    """The inline tokens of the one cell of a one-row GFM table holding text."""
    md = MarkdownIt('commonmark').enable('table')
    tokens = md.parse(f'| a | b |\n|---|---|\n| {text} | end |\n')
    return [t for t in tokens if t.type == 'inline']


@pytest.mark.parametrize('value', HOSTILE)
def test_hostile_text_stays_one_plain_table_cell(value):
    inline = cell_tokens(shm_md(value))
    assert [t.content for t in inline][-1] == 'end', 'the row still has its two cells'
    children = inline[-2].children
    assert {c.type for c in children} <= {'text'}, [c.type for c in children]  # no html_inline, link, image, em, code
    shown = ''.join(c.content for c in children)
    assert '\x1b' not in shown and '\n' not in shown and '\r' not in shown and '\u202e' not in shown
    if all(ord(c) >= 32 and c != '\u202e' for c in value) and value == value.strip():
        assert shown == value, 'printable text renders as exactly itself'


def test_control_characters_are_shown_as_escapes():
    html = MarkdownIt('commonmark').renderInline(shm_md('a\x1b[2Jb\nc\u202ed'))
    assert html == 'a\\x1b[2Jb\\nc\\u202ed'


def test_none_and_numbers():
    assert shm_md(None) == '-' and shm_md(3) == '3'


def test_redact_url_filter():
    assert shm_redact_url('http://u:p@h:1/x') == 'http://***@h:1/x' and shm_redact_url(None) is None
    assert set(FilterModule().filters()) == {'shm_md', 'shm_redact_url'}
