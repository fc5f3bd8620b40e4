# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One strict HTTP/1.1 response reader: bytes in, answers out, no I/O.

Private to the tritonops.shm collection: no stability promise to other code.

The modules' one HTTP path (triton_http) and the EDA poller's (triton_aio, for
extensions/eda/plugins/event_source/triton_shm.py) read every answer with ResponseReader.
This file imports the standard library and connection.hide (itself standard library only: filters may import it).

What it accepts, and nothing else (a server that is not Triton, or a hostile one, gets an
HttpError whose text escapes what the server sent):
- ``HTTP/1.0`` or ``HTTP/1.1``, every line ending in CRLF (a bare CR or LF is refused);
- a head (status line and headers) of at most ``max_head`` bytes, header names that are tokens,
  no folded lines, no control characters in values;
- a body framed by Content-Length, by ``chunked`` (each chunk-size line at most MAX_CHUNK_LINE
  bytes, CRLF after each chunk checked, trailers read and bounded by ``max_head``), or by the end
  of the connection (``eof()``); never both Content-Length and Transfer-Encoding;
- at most ``max_body`` bytes of body: a Content-Length or a chunk size that would pass it is
  refused when it is read, before its bytes come (TooLarge), so memory stays under the cap.
Interim 1xx answers are skipped. The work per byte is constant: a line that never ends costs its
bytes once, up to its bound, then is refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import hide

MAX_HEAD_BYTES = 64 << 10  # status line and headers; the trailers of a chunked body have the same bound
MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions, without its CRLF
# A whole head at once (the common case, one regex in C); any head it refuses is read again line by line for the reason.
_WHOLE_HEAD = re.compile(
    rb'HTTP/1\.([01]) ([0-9]{3})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?\r\n'
    rb"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*)\r\n"
)
# The headers that frame the body, in a head _WHOLE_HEAD accepted (names in any case, values without their spaces).
_FRAMING = re.compile(rb'^(content-length|transfer-encoding|connection):[ \t]*(.*?)[ \t]*\r$', re.I | re.M)
_STATUS_LINE = re.compile(rb'HTTP/1\.([01]) ([0-9]{3})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?\Z')
_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\Z")
_CHUNK_SIZE = re.compile(rb'([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?\Z')

_HEAD, _LENGTH, _SIZE, _DATA, _CRLF, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


def not_http(start: bytes, hidden: Sequence[str] = ()) -> str:
    """What a server whose answer does not start with ``HTTP/`` is, from its first bytes, and what to use instead.

    An HTTP/2 server (Triton's gRPC port) opens with a SETTINGS frame (9-byte frame header: length, type 4, flags,
    stream 0); a TLS server answers a clear-text request with a TLS record (an alert or a handshake, version 3.x).
    Anything else is shown escaped.
    """
    if len(start) >= 9 and start[3] == 0x04 and start[4] in (0, 1) and start[5:9] == bytes(4):
        return (
            "this port speaks HTTP/2, as Triton's gRPC port does (8001 by default): use grpc://HOST:PORT for it, or the "
            "URL of Triton's HTTP port (8000 by default)"
        )
    if len(start) >= 3 and start[0] in (0x15, 0x16) and start[1] == 0x03:
        return 'this port speaks TLS: use https:// (or grpcs:// for a gRPC port with TLS)'
    return escape(start, 60, hidden)


class HttpError(ValueError):
    """What came is not an HTTP/1.1 answer this reader accepts; the message says why (the server's bytes escaped)."""


class TooLarge(HttpError):
    """The answer is larger than the reader's cap (max_body)."""


class Response(NamedTuple):
    """One complete answer: status, reason, headers (the raw header lines, checked), body, whether the connection stays open."""

    status: int
    reason: str
    headers: bytes
    body: bytes
    keep_alive: bool


def escape(text: str | bytes, limit: int = 200, hidden: Sequence[str] = ()) -> str:
    """Text a server sent, safe for a message or a log line: printable characters kept, any other one escaped.

    Control characters (ESC, CR, LF, NUL, …), bidi overrides and line separators become ``\\x1b``,
    ``\\r``, ``\\u202e``…; bytes are read as UTF-8 (invalid bytes as U+FFFD); cut to limit characters
    with ``...``. Each of hidden (connection.secrets: longest first) is shown as ``********`` before anything is cut,
    so a secret the cut would split shows no part of itself.
    """
    if isinstance(text, (bytes, bytearray)):
        longest = max((len(secret) for secret in hidden), default=0)
        text = bytes(text[: (limit + longest) * 4]).decode('utf-8', 'replace')
    text = hide(text, hidden)
    cut = len(text) > limit
    text = text[:limit]
    if not text.isprintable():
        text = ''.join(c if c.isprintable() else c.encode('unicode_escape').decode('ascii') for c in text)
    return f'{text}...' if cut else text


class ResponseReader:
    """Reads the answers of one connection, one after the other: feed() the bytes as they come.

    feed(data) returns the Response once it is complete (None until then); the bytes after it stay
    in ``leftover`` (an answer nobody asked for: callers close the connection). eof() is the
    connection's end: the answer whose body runs to the end, else HttpError (cut short). start()
    readies the reader for the next answer on the same connection. Every refusal is an HttpError
    (TooLarge for the cap); after one, the connection must be closed.
    """

    __slots__ = (
        'max_body',
        'max_head',
        '_buf',
        '_state',
        '_scan',
        '_status',
        '_reason',
        '_headers',
        '_keep_alive',
        '_left',
        '_chunks',
        '_size',
        '_trailer_bytes',
        'response',
        'seen',
        '_memo',
        '_memo_max',
        'hidden',
    )

    def __init__(
        self, max_body: int, max_head: int = MAX_HEAD_BYTES, memo: bool = True, hidden: Sequence[str] = ()
    ) -> None:
        """hidden: the connection's secrets (connection.secrets), never in an HttpError's text, not even cut short."""
        self.max_body = max_body
        self.hidden = hidden
        self.max_head = max_head
        self._buf = bytearray()
        self._memo: tuple = (b'', None)  # the last small answer that came whole in one read, and what it was read as
        # memo=False: a reader whose answers differ each time (the poller's status answers) keeps no copy of the last
        self._memo_max = 4096 if memo else 0
        self.start()

    def start(self) -> None:
        """Ready for the next answer (the bytes left after the last one are dropped)."""
        self._buf.clear()
        self._state = _HEAD
        self._scan = 0
        self._status = 0
        self._reason = ''
        self._headers = b''
        self._keep_alive = True
        self._left = 0
        self._chunks: list = []
        self._size = 0
        self._trailer_bytes = 0
        self.response: Response | None = None
        self.seen = False  # a byte of this answer came

    @property
    def leftover(self) -> bytes:
        """The bytes after the complete answer."""
        return bytes(self._buf) if self._state == _DONE else b''

    @property
    def status(self) -> int:
        """The status of the answer once its head is read (0 before)."""
        return self._status

    @property
    def reason(self) -> str:
        return self._reason

    @property
    def until_close(self) -> bool:
        """The head is read and the body runs to the end of the connection (no Content-Length, not chunked)."""
        return self._state == _UNTIL_CLOSE

    def feed(self, data: bytes) -> Response | None:
        if self._state == _DONE:
            self._buf += data
            return self.response
        fresh = self._state == _HEAD and not self._buf
        if fresh and data == self._memo[0] and data:
            # the same bytes as the last answer that came whole in one read (a bulk unregister's answers): the same answer
            self.seen, self.response, self._state = True, self._memo[1], _DONE
            return self.response
        if data:
            self.seen = True
            self._buf += data
        step = True
        while step and self._state != _DONE:
            step = self._STEPS[self._state](self)
        if fresh and self.response is not None and not self._buf and 0 < len(data) <= self._memo_max:
            self._memo = (bytes(data), self.response)
        return self.response

    def eof(self) -> Response:
        """The connection ended: the answer, when its body runs to the end of the connection; HttpError otherwise."""
        if self._state == _DONE:
            return self.response
        if self._state == _UNTIL_CLOSE:
            self._take_until_close()
            return self._finish()
        if self._state == _HEAD and not self.seen:
            raise HttpError('the server closed the connection without an answer')
        raise HttpError('the answer was cut short: the connection closed before its end')

    # -- the states ----------------------------------------------------------------------------------

    def _line_end(self, bound: int, what: str) -> int:
        """The end of the CRLF line at the start of the buffer, -1 while incomplete; HttpError past bound or for a bare CR/LF."""
        end = self._buf.find(b'\r\n', self._scan)
        if end < 0:
            if len(self._buf) > bound:
                raise HttpError(f'{what} is longer than {bound} bytes')
            self._scan = max(0, len(self._buf) - 1)
            return -1
        self._scan = 0
        if end > bound:
            raise HttpError(f'{what} is longer than {bound} bytes')
        return end

    def _head(self) -> bool:
        buf = self._buf
        if len(buf) >= 5 and not buf.startswith(b'HTTP/'):
            start = bytes(buf[: 60 + max((len(secret) for secret in self.hidden), default=0)])  # a whole secret to hide
            raise HttpError(f'the answer is not HTTP: {not_http(start, self.hidden)}')
        end = buf.find(b'\r\n\r\n', self._scan)
        if end < 0:
            if len(buf) > self.max_head:
                raise HttpError(
                    f'the head of the answer (status line and headers) is longer than {self.max_head} bytes'
                )
            self._scan = max(0, len(buf) - 3)
            return False
        self._scan = 0
        if end + 4 > self.max_head:
            raise HttpError(f'the head of the answer (status line and headers) is longer than {self.max_head} bytes')
        match = _WHOLE_HEAD.match(buf, 0, end + 4)
        if match is None:
            self._refuse_head(bytes(buf[:end]))
        version, code, reason, block = match.groups()  # copies, before the buffer moves on
        del buf[: end + 4]
        status = int(code)
        if 100 <= status < 200:
            if status == 101:
                raise HttpError('the server switched protocols (101), which was not asked for')
            return True  # an interim answer: the real one follows
        self._status, self._reason, self._headers = status, reason.decode('latin-1') if reason else '', block
        self._frame(version == b'1', _FRAMING.findall(block) if block else ())
        return True

    def _refuse_head(self, head: bytes) -> None:
        """The HttpError for a head _WHOLE_HEAD refused, naming its first bad line."""
        lines = head.split(b'\r\n')
        if not _STATUS_LINE.match(lines[0]):
            raise HttpError(f'the answer is not HTTP: {escape(lines[0], 80, self.hidden)}')
        for line in lines[1:]:
            if not _HEADER.match(line):
                raise HttpError(f'the answer is not HTTP (a bad header line): {escape(line, 80, self.hidden)}')
        raise HttpError(f'the answer is not HTTP: {escape(head, 80, self.hidden)}')

    def _frame(self, http11: bool, framing: list) -> None:
        """How the body ends, from the framing headers (RFC 9112 6.3), and whether the connection stays open."""
        length = None
        codings: list = []
        keep_alive = http11
        for name, value in framing:
            name = name.lower()
            if name == b'content-length':
                if length is not None and length != value:
                    raise HttpError(
                        f'the answer is not HTTP (bad Content-Length {escape(length + b", " + value, 80, self.hidden)})'
                    )
                length = value
            elif name == b'transfer-encoding':
                codings += [c.strip().lower().decode('latin-1') for c in value.split(b',')]
            else:
                tokens = [t.strip().lower() for t in value.split(b',')]
                keep_alive = b'close' not in tokens if http11 else b'keep-alive' in tokens
        self._keep_alive = keep_alive
        if self._status in (204, 304):
            self._state = _LENGTH
            self._left = 0
            return
        if codings:
            if length is not None:
                raise HttpError('the answer has both Transfer-Encoding and Content-Length')
            if codings != ['chunked']:
                raise HttpError(
                    f'the answer has a transfer encoding this source does not read: {escape(", ".join(codings), 80, self.hidden)}'
                )
            self._state = _SIZE
            return
        if length is not None:
            if not length.isdigit() or len(length) > 19:
                raise HttpError(f'the answer is not HTTP (bad Content-Length {escape(length, 80, self.hidden)})')
            self._left = int(length)
            if self._left > self.max_body:
                raise TooLarge(f'the answer is larger than {self.max_body} bytes (Content-Length {self._left})')
            self._state = _LENGTH
            return
        self._keep_alive = False  # the body ends when the connection does
        self._state = _UNTIL_CLOSE

    def _length(self) -> bool:
        if len(self._buf) < self._left:
            return False
        body = bytes(self._buf[: self._left])
        del self._buf[: self._left]
        self._chunks = [body]
        self._finish()
        return False

    def _size_line(self) -> bool:
        end = self._line_end(MAX_CHUNK_LINE, 'a chunk-size line')
        if end < 0:
            return False
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        match = _CHUNK_SIZE.match(line)
        if not match:
            raise HttpError(f'the answer is not HTTP (bad chunk size {escape(line, 40, self.hidden)!r})')
        size = int(match.group(1), 16)
        if size == 0:
            self._state = _TRAILERS
        elif self._size + size > self.max_body:
            raise TooLarge(
                f'the answer is larger than {self.max_body} bytes (a chunk of {size} bytes after {self._size})'
            )
        else:
            self._size += size
            self._left = size
            self._state = _DATA
        return True

    def _data(self) -> bool:
        if not self._buf:
            return False
        take = min(self._left, len(self._buf))
        self._chunks.append(bytes(self._buf[:take]))
        del self._buf[:take]
        self._left -= take
        if self._left:
            return False
        self._state = _CRLF
        return True

    def _crlf(self) -> bool:
        if len(self._buf) < 2:
            if self._buf and self._buf[:1] != b'\r':
                raise HttpError('the answer is not HTTP (a chunk does not end where its size says)')
            return False
        if self._buf[:2] != b'\r\n':
            raise HttpError('the answer is not HTTP (a chunk does not end where its size says)')
        del self._buf[:2]
        self._state = _SIZE
        return True

    def _trailers(self) -> bool:
        end = self._line_end(self.max_head - self._trailer_bytes, 'the trailers of the answer')
        if end < 0:
            return False
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        if not line:
            self._finish()
            return False
        self._trailer_bytes += end + 2
        if not _HEADER.match(line):
            raise HttpError(f'the answer is not HTTP (a bad trailer line): {escape(line, 80, self.hidden)}')
        return True

    def _take_until_close(self) -> None:
        if self._buf:
            self._size += len(self._buf)
            if self._size > self.max_body:
                raise TooLarge(f'the answer is larger than {self.max_body} bytes')
            self._chunks.append(bytes(self._buf))
            self._buf.clear()

    def _until_close(self) -> bool:
        self._take_until_close()
        return False

    def _finish(self) -> Response:
        body = self._chunks[0] if len(self._chunks) == 1 else b''.join(self._chunks)
        self._chunks = []
        self.response = Response(self._status, self._reason, self._headers, body, self._keep_alive)
        self._state = _DONE
        return self.response

    _STEPS = {
        _HEAD: _head,
        _LENGTH: _length,
        _SIZE: _size_line,
        _DATA: _data,
        _CRLF: _crlf,
        _TRAILERS: _trailers,
        _UNTIL_CLOSE: _until_close,
    }


def read_one(data: bytes, max_body: int, max_head: int = MAX_HEAD_BYTES) -> tuple[Response | None, int]:
    """(the first complete answer in data or None while incomplete, the bytes it used); HttpError when it is not one."""
    reader = ResponseReader(max_body, max_head)
    response = reader.feed(data)
    return response, (len(data) - len(reader.leftover) if response is not None else 0)
