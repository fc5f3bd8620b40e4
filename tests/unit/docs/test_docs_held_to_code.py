"""Docs held to the code (issue 44, goal 7).

- Every message that docs/troubleshooting.md (and its 中文 page) quotes in the first column of its tables exists in the
  code: each run of three or more literal words of the quote is in a string of plugins/, extensions/, roles/ or
  playbooks/ (an f-string's placeholders split it). ``…`` marks what the message fills in at run time; words with
  digits, quotes, slashes or an upper-case placeholder (``HOST:PORT``, ``N``) are values, as are the texts of the
  libraries the modules pass on (grpcio, OpenSSL, Ansible's missing-library message).
- Each 中文 page has the English page's sections (the same heading levels, in the same order) and its tables (the same
  number, each with the same number of rows).
"""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest
from doc_sources import COLLECTION

# texts of other software the modules pass on as they are
EXTERNAL = (
    'Socket closed',
    'CERTIFICATE_VERIFY_FAILED: self signed certificate in certificate chain',
    'Failed to import the required Python library',
)
VALUE = re.compile(r"""[^\s]*[0-9'"/\\<>{}=@]+[^\s]*|\b[A-Z]{1,5}(?::[A-Z]{1,5})?\b""")


def _code_parts() -> list:
    """Every string literal of the code, split at its f-string placeholders; the text of every YAML and template."""
    parts = []
    for path in glob.glob(os.path.join(COLLECTION, 'plugins', '**', '*.py'), recursive=True) + glob.glob(
        os.path.join(COLLECTION, 'extensions', '**', '*.py'), recursive=True
    ):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                parts += ''.join(
                    v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else '\0' for v in node.values
                ).split('\0')
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts.append(node.value)
    for pattern in ('roles/**/*.yml', 'playbooks/**/*.yml', 'extensions/**/*.yml', '**/*.j2'):
        for path in glob.glob(os.path.join(COLLECTION, pattern), recursive=True):
            with open(path) as f:
                parts.append(f.read())
    return parts


CODE = _code_parts()


def quoted(page: str) -> list:
    """The `code` spans of the first column of every table row of page (outside code blocks)."""
    out, fenced = [], False
    with open(os.path.join(COLLECTION, 'docs', page)) as f:
        for line in f:
            if line.startswith('```'):
                fenced = not fenced
            cells = line.split('|')
            if fenced or not line.startswith('|') or len(cells) < 3:
                continue
            out += re.findall(r'`([^`]+)`', cells[1])
    return out


def literal_runs(quote: str) -> list:
    """The runs of three or more literal words of a quoted message (see the module docstring)."""
    runs = []
    for piece in re.split('|'.join(['…', r'\.\.\.'] + [re.escape(e) for e in EXTERNAL]), quote):
        for part in re.split(r':\s', piece):  # messages are composed at ': ' (what at URL: why)
            for run in VALUE.split(part):
                run = run.strip(' :,;()[]')
                if len(run.split()) >= 3:
                    runs.append(run)
    return runs


def missing(quote: str) -> list:
    return [run for run in literal_runs(quote) if not any(run in part for part in CODE)]


@pytest.mark.parametrize('page', ['troubleshooting.md', 'troubleshooting.zh.md'])
def test_every_message_troubleshooting_quotes_is_in_the_code(page):
    quotes = quoted(page)
    assert len(quotes) >= 20, quotes  # the page has its tables of messages
    assert sum(len(literal_runs(q)) for q in quotes) >= 30
    unknown = {q: missing(q) for q in quotes if missing(q)}
    assert not unknown, f'{page} quotes messages the code does not have: {unknown}'


@pytest.mark.parametrize(
    'quote',
    [
        'the lock on the shm directory is held by another run',  # "lock on" where the code says "lock of"
        'cannot connect to Triton (refused or unreachable): … the server is on fire today',
    ],
)
def test_a_message_the_code_does_not_have_is_found(quote):
    assert missing(quote)


def _structure(path: str) -> tuple:
    """(the heading levels in order, the row count of each table), outside code blocks."""
    levels, tables, fenced, in_table = [], [], False, False
    with open(path) as f:
        for line in f:
            if line.startswith('```'):
                fenced = not fenced
            if fenced:
                continue
            heading = re.match(r'(#{1,6}) ', line)
            if heading:
                levels.append(len(heading.group(1)))
            if line.startswith('|'):
                if not in_table:
                    tables.append(0)
                tables[-1] += 1
            in_table = line.startswith('|')
    return levels, tables


PAIRS = sorted(
    os.path.relpath(p, COLLECTION)
    for p in glob.glob(os.path.join(COLLECTION, 'docs', '*.md')) + [os.path.join(COLLECTION, 'README.md')]
    if not p.endswith('.zh.md')
)


@pytest.mark.parametrize('page', PAIRS)
def test_each_chinese_page_has_the_english_pages_sections_and_tables(page):
    en = _structure(os.path.join(COLLECTION, page))
    zh = _structure(os.path.join(COLLECTION, page[: -len('.md')] + '.zh.md'))
    assert zh[0] == en[0], f'{page}: heading levels differ: English {en[0]}, 中文 {zh[0]}'
    assert zh[1] == en[1], f'{page}: table row counts differ: English {en[1]}, 中文 {zh[1]}'
