# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The connection options as data (what each is, its default, how a value is checked) and URLs as text, once.

Private to the tritonops.shm collection: no stability promise to other code. Standard library only and no import of
the collection (filters import it; so does the event source, extensions/eda). What reads it:

- base.connection_argument_spec(): the modules' argument spec is ``argument_spec()`` (and an environment fallback
  where ``Option.env`` names one);
- the event source: each server's options are ``convert()``-ed from this table (the source's defaults, then the
  server's own), so an option the modules take is checked there by the same rule;
- client.check_headers and triton_grpc.grpc_metadata: ``check_headers()`` and ``grpc_metadata()`` (the messages name
  the header, never its value);
- every place a URL is shown (messages, reports, metrics labels, events): ``redact_url()``; the modules refuse a
  URL with credentials (client.check_url), and ``url_secrets()`` are masked in what they return;
- tests/unit/plugins/test_connection_options.py: the doc fragment, the role, the playbooks and the event source's
  DOCUMENTATION agree with ``OPTIONS``.

Each option says how it goes on the wire (``Option.wire``: the address, the timeout, a TLS parameter, the headers, one
header), and ``wire_config()`` is the one place that turns the options' values into what a transport sends
(``WireConfig``): triton_http, triton_grpc and the event source take that and nothing else, with one ``USER_AGENT``.

**Add a connection option**: one ``Option`` here, with its ``wire``; the doc fragment tritonops.shm.triton and the
copies test_connection_options.py names (it fails until each has it); a changelog fragment. test_option_behaviour.py
sets every option over HTTP, gRPC and the event source and fails until the servers see it.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

GRPC_SCHEMES = ('grpc', 'grpcs')
DEFAULT_GRPC_PORT = 8001
DEFAULT_PORTS = {'http': 80, 'https': 443, 'grpc': DEFAULT_GRPC_PORT, 'grpcs': DEFAULT_GRPC_PORT}


def has_userinfo(url: str | None) -> bool:
    """True when the URL carries a ``user[:password]@`` part before its host."""
    text = str(url or '')
    if '://' not in text:
        return False
    netloc = text.split('://', 1)[1].split('/', 1)[0].split('?', 1)[0].split('#', 1)[0]
    return '@' in netloc


def redact_url(url: Any) -> Any:
    """The URL with any ``user[:password]@`` part shown as ``***@``; anything else (None, a number) as it is.

    For every place a URL is shown (messages, reports, metrics labels): credentials in a URL are refused
    (check_url), and an output never carries them even when a URL did not pass through a module.
    """
    if not isinstance(url, str) or not has_userinfo(url):
        return url
    scheme, rest = url.split('://', 1)
    end = min((i for i in (rest.find('/'), rest.find('?'), rest.find('#')) if i >= 0), default=len(rest))
    return f'{scheme}://***@{rest[:end].rpartition("@")[2]}{rest[end:]}'


def url_secrets(url: str | None) -> list[str]:
    """The ``user:password`` part of a URL and its password (as written and decoded): strings to mask in outputs."""
    if not has_userinfo(url):
        return []
    userinfo = str(url).split('://', 1)[1].split('/', 1)[0].rpartition('@')[0]
    password = userinfo.partition(':')[2]
    return sorted({s for s in (userinfo, password, unquote(password)) if len(s) >= 3})


def url_key(url: str) -> tuple:
    """What identifies a server's URL whatever its spelling: scheme, host, port, path; no user:password, no final /."""
    url = url.strip().rstrip('/')
    if '://' not in url:
        url = 'http://' + url
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    scheme = parts.scheme.lower()
    return scheme, parts.hostname or '', port or DEFAULT_PORTS.get(scheme, 80), parts.path.rstrip('/')


class OptionError(ValueError):
    """A value of an option that cannot be used; the text names the option, never a secret value."""


# What every request of the collection says it is, over HTTP (User-Agent) and gRPC (the channel's user agent), from
# the modules and the event source alike.
USER_AGENT = 'tritonops.shm'

# Where an option's value goes on the wire (Wire.part).
ADDRESS = 'address'  # the URL: scheme, host, port (and an HTTP path)
TIMEOUT = 'timeout'  # seconds a request (HTTP) or a call (gRPC) may take as a whole
TLS = 'tls'  # a field of Tls: how the TLS handshake is made
HEADERS = 'headers'  # a dict of headers: HTTP headers, gRPC metadata
HEADER = 'header'  # one header, named by Wire.name (the headers option wins over it)


class Wire(NamedTuple):
    """How an option goes on the wire: its part (ADDRESS, TIMEOUT, TLS, HEADERS, HEADER) and, for TLS, the Tls field
    it sets, for HEADER the header it is sent as."""

    part: str
    name: str = ''


class Option(NamedTuple):
    """One connection option: its Ansible type, default, whether it is required, an environment fallback, no_log, and
    how it goes on the wire."""

    type: str
    default: Any = None
    required: bool = False
    env: str | None = None
    no_log: bool | None = None
    wire: Wire | None = None


OPTIONS = {
    'url': Option('str', required=True, env='TRITON_URL', wire=Wire(ADDRESS)),
    'timeout': Option('float', 10.0, wire=Wire(TIMEOUT)),
    'validate_certs': Option('bool', True, wire=Wire(TLS, 'verify')),
    'ca_path': Option('path', wire=Wire(TLS, 'ca')),
    'headers': Option('dict', {}, no_log=True, wire=Wire(HEADERS)),
    'client_cert': Option('path', wire=Wire(TLS, 'cert')),
    'client_key': Option('path', no_log=False, wire=Wire(TLS, 'key')),
}


class Tls(NamedTuple):
    """The TLS parameters of a connection: verify the server's certificate, against ca (a PEM file or a directory,
    None: the system's store), present cert (with key when it is not in the same file)."""

    verify: bool = True
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


class WireConfig(NamedTuple):
    """What a transport sends, as wire_config() built it from the options: the address, the timeout, the TLS
    parameters, the headers (as given: each transport checks them by its own rule) and the user agent."""

    url: str
    timeout: float
    tls: Tls
    headers: dict
    user_agent: str = USER_AGENT


def wire_config(params: dict) -> WireConfig:
    """The WireConfig of the options in params (a missing or None value: the option's default), each placed where its
    Option.wire says; ValueError for an option of OPTIONS without a known wire (a new option must say how it is sent);
    OptionError for a client_key without a client_cert (a key alone authenticates nothing: never silently dropped).
    """
    address, timeout, tls, headers, single = None, None, {}, {}, {}
    for name, option in OPTIONS.items():
        value = params.get(name)
        if value is None:
            value = option.default
        part, field = option.wire or (None, '')
        if part == ADDRESS:
            address = value
        elif part == TIMEOUT:
            timeout = value
        elif part == TLS and field in Tls._fields:
            tls[field] = value
        elif part == HEADERS:
            headers = dict(value or {})
        elif part == HEADER and field:
            if value is not None:
                single[field] = value
        else:
            raise ValueError(f'connection option {name} does not say how it goes on the wire ({option.wire!r})')
    for field, value in single.items():
        if not any(field.lower() == str(given).lower() for given in headers):
            headers[field] = value
    if tls.get('key') and not tls.get('cert'):
        raise OptionError('client_key is set without client_cert: give the client certificate it belongs to (or none)')
    return WireConfig(address, timeout, Tls(**tls), headers)


# Header names the connection itself sets: a header of the same name in the headers option is not sent (a request
# with a body says its own Content-Type; a proxy's credentials are the proxy's, from the environment).
FRAMING_HEADERS = frozenset(
    ('content-length', 'transfer-encoding', 'connection', 'content-type', 'proxy-authorization')
)


def http_headers(wire: WireConfig, host: str, accept: str, basic: bool = False) -> dict:
    """The headers of an HTTP request to wire's server: Host, Accept, Accept-Encoding, User-Agent, with basic the URL's
    user:password as Basic credentials (the modules refuse such a URL), then wire's headers (they win, whatever their
    case) but those the connection itself sets (Content-Length, Transfer-Encoding, Connection)."""
    parts = urlsplit(wire.url)
    out = {'Host': host, 'Accept': accept, 'Accept-Encoding': 'identity', 'User-Agent': wire.user_agent}
    if basic and (parts.username is not None or parts.password is not None):
        credentials = f'{unquote(parts.username or "")}:{unquote(parts.password or "")}'
        out['Authorization'] = 'Basic ' + base64.b64encode(credentials.encode('utf-8')).decode('ascii')
    for name, value in wire.headers.items():
        name = str(name)
        if name.lower() in FRAMING_HEADERS:
            continue
        for same in [h for h in out if h.lower() == name.lower()]:
            del out[same]
        out[name] = str(value)
    return out


def grpc_channel_options(wire: WireConfig, max_message: int) -> list[tuple[str, Any]]:
    """The gRPC channel options for wire: the user agent, the largest message received and sent."""
    return [
        ('grpc.primary_user_agent', wire.user_agent),
        ('grpc.max_receive_message_length', max_message),
        ('grpc.max_send_message_length', max_message),
    ]


def argument_spec() -> dict:
    """OPTIONS as an AnsibleModule argument spec (without the environment fallback, which needs Ansible)."""
    spec = {}
    for name, option in OPTIONS.items():
        entry: dict = {'type': option.type}
        if option.required:
            entry['required'] = True
        if option.default is not None:
            entry['default'] = type(option.default)(option.default)  # a fresh {} for each spec
        if option.no_log is not None:
            entry['no_log'] = option.no_log
        spec[name] = entry
    return spec


def number(value: Any, what: str, positive: bool = True) -> float:
    """value as a finite float (greater than 0 when positive); OptionError naming what otherwise."""
    if isinstance(value, bool):
        raise OptionError(f'{what} must be a number, got {value!r}')
    try:
        found = float(value)
    except (TypeError, ValueError):
        raise OptionError(f'{what} must be a number, got {value!r}') from None
    if not math.isfinite(found):
        raise OptionError(f'{what} must be a finite number, got {value!r}')
    if positive and found <= 0:
        raise OptionError(f'{what} must be greater than 0, got {value!r}')
    return found


def boolean(value: Any, what: str) -> bool:
    """value as a bool (a bool, or yes/no, true/false, on/off, 1/0 as text); OptionError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ('true', 'yes', 'on', '1', 'false', 'no', 'off', '0'):
        return value.lower() in ('true', 'yes', 'on', '1')
    raise OptionError(f'{what} must be a boolean, got {value!r}')


# RFC 9110 token characters: what a header (field) name may contain.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def check_headers(headers: Any, what: str = 'headers') -> dict:
    """headers as a dict of str to str when both transports can send each; OptionError naming the header otherwise.

    A name is an RFC 9110 token; a value has no control character (CR, LF, NUL, ...: a YAML block scalar ends in a
    newline) and no leading or trailing whitespace. The message never shows a value: it is often a secret.
    """
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise OptionError(f'{what} must be a dict of header names to values')
    out = {}
    for name, value in headers.items():
        name, text = str(name), str(value)
        if not name or not set(name) <= _TOKEN:
            shown = ''.join(c if c in _TOKEN else '?' for c in name[:64])
            raise OptionError(
                f'{what}: the header name {shown!r} is not a valid HTTP header name (letters, digits '
                f"and !#$%&'*+-.^_`|~ only); nothing was sent"
            )
        if any(ord(c) < 32 and c != '\t' or ord(c) == 127 for c in text):
            raise OptionError(
                f'{what}: the value of header {name!r} contains a control character (a line break, '
                f'NUL, ...; a YAML block scalar "|" ends in a newline: use "|-" or a plain string); '
                f'the value is not shown, nothing was sent'
            )
        if any(0x80 <= ord(c) < 0xA0 for c in text):
            raise OptionError(
                f'{what}: the value of header {name!r} contains a control character (U+0080 to U+009F); the value is '
                f'not shown, nothing was sent'
            )
        try:
            text.encode('latin-1')
        except UnicodeEncodeError:
            raise OptionError(
                f'{what}: the value of header {name!r} has a character HTTP cannot carry (only Latin-1 text, as both '
                f'transports send it); the value is not shown, nothing was sent'
            ) from None
        if text != text.strip():
            raise OptionError(
                f'{what}: the value of header {name!r} begins or ends with whitespace; the value is '
                f'not shown, nothing was sent'
            )
        out[name] = text
    return out


_METADATA_KEY = re.compile(r'^[0-9a-z_.\-]+$')
_RESERVED_KEYS = frozenset(('content-type', 'te', 'user-agent', 'host', 'connection'))


def grpc_metadata(headers: dict | None) -> tuple[tuple[str, str], ...]:
    """The headers option as gRPC metadata: lower-case keys, printable ASCII values; OptionError naming the header."""
    out = []
    for key, value in (headers or {}).items():
        name = str(key).strip().lower()
        text = str(value)
        if not _METADATA_KEY.match(name) or name.startswith('grpc-') or name in _RESERVED_KEYS:
            raise OptionError(
                f'header {str(key)!r} cannot be sent as gRPC metadata: names are lower-case letters, digits '
                'and -_. and must not be reserved (grpc-*, content-type, te, user-agent, host, connection)'
            )
        if name.endswith('-bin'):
            raise OptionError(
                f'header {str(key)!r} cannot be sent as gRPC metadata: -bin (binary) metadata is not supported'
            )
        if any(ord(c) < 0x20 or ord(c) > 0x7E for c in text):
            raise OptionError(
                f'the value of header {str(key)!r} cannot be sent as gRPC metadata: only printable ASCII is '
                'allowed (the value is not shown)'
            )
        out.append((name, text))
    return tuple(out)


def convert(name: str, value: Any, what: str) -> Any:
    """A value of the connection option name, checked and converted by its type in OPTIONS; OptionError otherwise.

    For callers without AnsibleModule (the event source): float (a positive number), bool, dict (headers), path
    and str (None or a string).
    """
    kind = OPTIONS[name].type
    if kind == 'float':
        return number(value, what)
    if kind == 'bool':
        return boolean(value, what)
    if kind == 'dict':
        return check_headers(value, what)
    if value is not None and not isinstance(value, str):
        raise OptionError(f'{what} must be a string, got {type(value).__name__}')
    return value


def is_grpc(url: str) -> bool:
    """True for a grpc:// or grpcs:// URL."""
    return urlsplit(url).scheme.lower() in GRPC_SCHEMES


def unsendable(url: str) -> str | None:
    """The refusal of a URL with a character a request line or Host header cannot carry (outside printable ASCII,
    or a space), naming the character and the way out; None when every character can be sent."""
    odd = next((c for c in url if not ' ' < c < '\x7f'), None)
    if odd is None:
        return None
    return (
        f'has the character {odd!r}, which a request cannot carry: percent-encode it in the path '
        '(%C3%A4 for \u00e4), write a host name in its ASCII (punycode) form'
    )


def checked_url(url: Any, what: str, of: str, grpc: bool = False) -> str:
    """url without spaces around and a trailing /, http:// when it names no scheme; OptionError when it is not
    http(s) (with grpc: or grpc(s)://HOST:PORT, nothing more). The message shows the URL without credentials."""
    if not isinstance(url, str) or not url.strip():
        raise OptionError(f'{what} is required')
    url = url.strip().rstrip('/')
    if '://' not in url:
        url = 'http://' + url
    parts = urlsplit(url)
    shown = redact_url(url)
    refusal = unsendable(url)
    if refusal:
        raise OptionError(f'{what} {shown} {refusal}')
    try:
        parts.port  # pylint: disable=pointless-statement
    except ValueError:
        raise OptionError(f'{what} {shown} has an invalid port') from None
    schemes = ('http', 'https') + (GRPC_SCHEMES if grpc else ())
    if parts.scheme.lower() not in schemes or not parts.hostname or any(c in url for c in ' \r\n\t'):
        kind = ' (nor a grpc:// or grpcs:// one)' if grpc else ''
        raise OptionError(f'{what} {shown} is not an http(s) URL{kind} of {of}')
    if parts.scheme.lower() in GRPC_SCHEMES and (parts.path or parts.query or parts.fragment or '@' in parts.netloc):
        raise OptionError(
            f'{what} {shown}: a gRPC URL is grpc://HOST:PORT or grpcs://HOST:PORT, with no path, query or user'
        )
    return url


def grpc_target(url: str) -> str:
    """HOST:PORT of a grpc(s):// URL, an IPv6 host in brackets, Triton's gRPC port when the URL names none."""
    parts = urlsplit(url)
    host, port = parts.hostname or '', parts.port or DEFAULT_GRPC_PORT
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


def http_request(wire: WireConfig, path: str, accept: str, close: bool = False) -> bytes:
    """The GET of path under wire's URL as HTTP/1.1 bytes (the headers of http_headers); ``Connection: close`` when
    close."""
    parts = urlsplit(wire.url)
    out = http_headers(wire, parts.netloc.rpartition('@')[2], accept, basic=True)
    if close:
        out['Connection'] = 'close'
    target = f'{parts.path}{path}' + (f'?{parts.query}' if parts.query else '')
    head = ''.join(f'{k}: {v}\r\n' for k, v in out.items())
    # the headers in Latin-1, as the modules' HTTP transport sends them (check_headers refuses any other character)
    return f'GET {target} HTTP/1.1\r\n'.encode() + head.encode('latin-1') + b'\r\n'


# A header value ``SCHEME CREDENTIAL`` (RFC 9110 credentials: Bearer, Basic, Token, Negotiate, ...): a server may echo
# the credential without its scheme word.
_SCHEMED = re.compile(r'([A-Za-z][A-Za-z0-9!#$%&\'*+.^_`|~-]*)[ \t]+(\S+)')


MIN_SECRET = 3  # characters: a shorter header value or credential part is not hidden (it would garble every message)


def header_credentials(value: str) -> list[str]:
    """The secret parts of a header value beside the value itself: the credential of ``SCHEME CREDENTIAL`` and, for
    Basic, its decoded ``user:password`` and password (parts shorter than MIN_SECRET characters are not counted)."""
    match = _SCHEMED.fullmatch(str(value).strip())
    if not match:
        return []
    found = [match.group(2)]
    if match.group(1).lower() == 'basic':
        try:
            decoded = base64.b64decode(match.group(2), validate=True).decode('utf-8')
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors: not Basic credentials
            decoded = ''
        found += [decoded, decoded.partition(':')[2]] if ':' in decoded else []
    return [part for part in found if len(part) >= MIN_SECRET]


def secrets(wire: WireConfig) -> list[str]:
    """What must never reach an event, a message or a log, longest first: header values and their credentials
    (header_credentials), the URL's password and the Basic credentials sent. A header value shorter than
    MIN_SECRET characters is no secret (say ``X-Priority: 1``) and hiding it would garble every message: left out."""
    found = [str(v) for v in wire.headers.values() if v is not None and len(str(v)) >= MIN_SECRET]
    found += [part for v in found[:] for part in header_credentials(v)]
    parts = urlsplit(wire.url)
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    found += [
        token.decode('ascii')
        for token in re.findall(rb'^Authorization: Basic (\S+)\r$', http_request(wire, '', ''), re.M)
    ]
    found += [shown for shown in map(_echoed, found) if shown]
    return sorted(set(found), key=len, reverse=True)


def _echoed(secret: str) -> str:
    """How a body read as UTF-8 shows a secret sent beyond ASCII: http_request sends a header in Latin-1, so a server
    that echoes it back gives bytes that read as U+FFFD, or as other characters where they happen to be UTF-8 (the
    secret ``Ã©Ã¨`` reads as ``éè``). '' for an ASCII secret (it reads as itself), one never sent (not Latin-1:
    check_headers refuses it), and a form of one character or of U+FFFD alone (hiding it would garble every message
    with such a character and show nothing of the secret)."""
    if secret.isascii():
        return ''
    try:
        shown = secret.encode('latin-1').decode('utf-8', 'replace')
    except UnicodeEncodeError:
        return ''
    return shown if len(shown) >= 2 and shown.strip('\ufffd') else ''


def hide(text: str, hidden: Sequence[str]) -> str:
    """text with every one of hidden (secrets(): longest first) as ********; before any cut, so that no part shows."""
    for secret in hidden:
        if secret:
            text = text.replace(secret, '********')
    return text


def redact(text: str, url: str, shown_url: str, hidden: Sequence[str]) -> str:
    """text with url shown as shown_url and every one of hidden as ********."""
    return hide(text.replace(url, shown_url), hidden)
