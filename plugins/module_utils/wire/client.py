# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one client interface both transports implement, and what they share.

Private to the tritonops.shm collection: no stability promise to other code.

``Client`` declares, once, every call the modules and module_utils make on a Triton server;
triton_http.TritonClient (HTTP) and triton_grpc.TritonGrpcClient (gRPC) implement it, and
base.make_client picks one by the URL's scheme (``is_grpc_url``). Next to it: the URL parsing,
the kind and health checks, the text helpers, and ``error_from_answer``, the one place where an
error answer of the server (its own text) becomes a TritonError subclass. This file imports only
the standard library, errors, records (the region fields), connection (the options' checks, URLs shown) and
http_reader (for escape).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple
from urllib.parse import SplitResult, urlsplit

from ansible_collections.tritonops.shm.plugins.module_utils.errors import (
    ClientShmDisabled,
    MalformedAnswer,
    ParameterError,
    RegisterOverflow,
    ReservedKey,
    Restricted,
    ShmUnsupported,
    TritonError,
    classify,
    restricted_header,
    restricted_hint,
)
from ansible_collections.tritonops.shm.plugins.module_utils.rules import records
from ansible_collections.tritonops.shm.plugins.module_utils.wire import connection
from ansible_collections.tritonops.shm.plugins.module_utils.wire.connection import has_userinfo, redact_url
from ansible_collections.tritonops.shm.plugins.module_utils.wire.http_reader import escape

HTTP = 'http'
GRPC = 'grpc'
GRPC_SCHEMES = ('grpc', 'grpcs')
HEALTH_CHECKS = ('live', 'ready')
DEFAULT_TIMEOUT = connection.OPTIONS['timeout'].default
# The largest answer the modules read, over HTTP (body) and gRPC (message): a status of 100,000 regions is
# about 15 MiB of JSON. A larger answer fails with a message naming the URL (docs/reliability.md).
MAX_ANSWER_BYTES = 64 << 20

# Triton 2.68 and later turn client shared memory off unless started with the flag below.
CLIENT_SHM_HINT = (
    'this Triton has client shared memory turned off (2.68 and later, by default): start it with '
    '--allow-client-shm=true (role tritonops.shm.triton_server: triton_server_allow_client_shm: true, '
    'or auto, which adds it for 2.68 and later)'
)
SHM_UNSUPPORTED_HINT = (
    'this server offers no shared memory at all (Triton 2.73 and later started through the in-process '
    'tritonfrontend bindings): there is nothing to check or clean on it, and this is not a leak; '
    'nothing was retried'
)
OVERFLOW_HINT = (
    'Triton 2.58 and later refuse a byte_size + offset that does not fit its size type: '
    'use a smaller offset or byte_size'
)
RESERVED_KEY_HINT = (
    "Triton 2.60 and later refuse keys with the python backend's reserved prefix (2.61 and later also "
    'keys that are only slashes): choose another key'
)
# The way out the message adds for a condition, by its class (any other answer gets the transport's own hint).
_HINTS = {
    ClientShmDisabled: CLIENT_SHM_HINT,
    ShmUnsupported: SHM_UNSUPPORTED_HINT,
    RegisterOverflow: OVERFLOW_HINT,
    ReservedKey: RESERVED_KEY_HINT,
}


# -- text -------------------------------------------------------------------------------------------


def short(text: Any, limit: int = 300) -> str:
    """str(text) cut to limit characters (an exception's text in a message)."""
    text = str(text)
    return text if len(text) <= limit else f'{text[:limit]}...'


def snippet(text: str | bytes | None, limit: int = 200, hidden: Sequence[str] = ()) -> str:
    """The start of a response body on one line, for a message (empty for no body); control characters escaped, each
    of hidden (connection.secrets) shown as ******** before the cut."""
    text = (text or '').strip()
    return escape(text.replace(b'\n', b' ') if isinstance(text, bytes) else text.replace('\n', ' '), limit, hidden)


# -- what every call checks -------------------------------------------------------------------------


def check_regions(kind: str, regions: list, where: str, url: str, transport: str) -> list:
    """regions when each is a region of kind as Triton lists it (records.check_regions); MalformedAnswer naming where
    otherwise."""
    try:
        records.check_regions(records.KINDS[check_kind(kind)], regions)
    except records.BadRegion as bad:
        detail = bad.describe(escape) + ('' if bad.field is None else '; nothing was done with it')
        raise MalformedAnswer(
            f'{where}: the answer is not a Triton {kind} shared memory status: {detail}',
            url=url,
            transport=transport,
        ) from None
    return regions


def check_metadata(data: dict, where: str, url: str, transport: str) -> dict:
    """data when its name and version are strings and its extensions a list of strings; MalformedAnswer otherwise."""
    extensions = data.get('extensions', [])
    if (
        not isinstance(data.get('version'), str)
        or not isinstance(data.get('name', ''), str)
        or not isinstance(extensions, list)
        or not all(isinstance(e, str) for e in extensions)
    ):
        raise MalformedAnswer(
            f'{where}: the answer is not Triton server metadata (name and version strings, extensions a '
            f'list of strings): {escape(repr(data), 200)}',
            url=url,
            transport=transport,
        )
    return data


def check_kind(kind: str) -> str:
    """kind when it is a shared-memory kind (records.KINDS); ValueError otherwise (a caller's bug)."""
    if kind not in records.KINDS:
        raise ValueError(f'unknown shared memory kind {kind!r}')
    return kind


def record_kind(kind: str) -> records.Kind:
    """The records.Kind of the kind name (ValueError for none: a caller's bug)."""
    return records.KINDS[check_kind(kind)]


def check_health(which: str) -> str:
    """which when it is a health check (live, ready); ValueError otherwise (a caller's bug)."""
    if which not in HEALTH_CHECKS:
        raise ValueError(f'unknown health check {which!r}')
    return which


# -- URLs -------------------------------------------------------------------------------------------


def url_scheme(url: str | None) -> str:
    """The URL's scheme in lower case, '' when it has none."""
    text = (url or '').strip()
    return text.split('://', 1)[0].lower() if '://' in text else ''


def is_grpc_url(url: str | None) -> bool:
    """True for grpc:// and grpcs:// URLs (the scheme picks the transport)."""
    return url_scheme(url) in GRPC_SCHEMES


class Url(NamedTuple):
    """A URL split for a transport: scheme (lower case), host, port (None when left out), and the rest."""

    scheme: str
    host: str
    port: int | None
    parts: SplitResult


USERINFO_REFUSAL = (
    'carries a user:password@ part: credentials in a URL are refused (they would be shown in '
    'outputs, reports and metrics labels, and they are never sent); give them in headers, '
    'e.g. Authorization, which is never logged'
)


def check_url(url: str | None) -> None:
    """ParameterError for a URL with credentials in it; the message shows the URL without them."""
    if has_userinfo(url):
        raise ParameterError(f'url {redact_url(url)} {USERINFO_REFUSAL}')


def check_headers(headers: Any) -> None:
    """ParameterError for a header either transport would refuse, naming the header and never showing its value.

    The rule is connection.check_headers (the event source checks its headers by it too). The HTTP library's own
    refusal quotes the value, which is often a secret: this check runs before any request, for HTTP and gRPC alike.
    """
    with _as_parameter_error():
        connection.check_headers(headers)


def wire_of(url: str | connection.WireConfig, options: dict) -> connection.WireConfig:
    """What a transport's constructor was given as a WireConfig: one as it is, or a URL and connection options by name
    (connection.wire_config); TypeError for a name that is not a connection option."""
    if isinstance(url, connection.WireConfig):
        if options:
            raise TypeError(f'a WireConfig and options by name: {", ".join(sorted(options))}')
        return url
    unknown = sorted(set(options) - set(connection.OPTIONS))
    if unknown:
        raise TypeError(f'not connection options: {", ".join(unknown)}')
    return _wire_config({**options, 'url': url})


def _wire_config(params: dict) -> connection.WireConfig:
    """connection.wire_config, its refusal of the options as a ParameterError (a module's parameter, nothing sent)."""
    with _as_parameter_error():
        return connection.wire_config(params)


@contextlib.contextmanager
def _as_parameter_error() -> Iterator[None]:
    """connection's refusal of an option (OptionError, the event source's word) as the modules' ParameterError."""
    try:
        yield
    except connection.OptionError as exc:
        raise ParameterError(str(exc)) from None


def split_url(url: str, schemes: tuple[str, ...], refusal: str) -> Url:
    """url split into a Url; TritonError(refusal) for another scheme or no host, and for an invalid port or a character
    a request line cannot carry (outside printable ASCII: a path percent-encoded, a host name in punycode)."""
    odd = connection.unsendable(url)
    if odd:
        raise TritonError(f'url {url!r} {odd}', url=url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in schemes or not parts.hostname:
        raise TritonError(refusal, url=url)
    try:
        port = parts.port
    except ValueError as exc:
        raise TritonError(f'url {url!r} has an invalid port: {exc}', url=url) from exc
    return Url(scheme, parts.hostname, port, parts)


def index_entry(name: Any, version: Any = '', state: Any = '', reason: Any = '') -> dict:
    """One model of repository_index(), the same keys and types over both transports."""
    return {'name': str(name), 'version': str(version or ''), 'state': str(state or ''), 'reason': str(reason or '')}


def host_port(host: str, port: int) -> str:
    """host:port, with an IPv6 host in brackets."""
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


# -- the server's own error text --------------------------------------------------------------------


def error_from_answer(
    where: str,
    code: str,
    detail: str,
    server_error: str | None,
    *,
    url: str | None,
    status: int | str,
    transport: str,
    hint: str = '',
) -> TritonError:
    """The TritonError for an error answer of the server, decided from the server's own text.

    The one place both transports turn an answer into an error: the subclass comes from the text
    (errors.classify: in use, not found, overflow, reserved key, client shared memory off, no shared
    memory at all), a condition with a known way out gets it (_HINTS: e.g. CLIENT_SHM_HINT for HTTP
    501 and gRPC UNIMPLEMENTED alike), and any other answer the transport's own hint. The message
    reads ``WHERE: CODE: DETAIL`` (``… at URL: HTTP 400: …``, ``… at URL: gRPC INTERNAL: …``).
    """
    cls = classify(server_error)
    way_out = _HINTS.get(cls)
    if cls is Restricted:
        way_out = restricted_hint(restricted_header(server_error), transport == GRPC)
    detail = f'{detail}; {way_out}' if way_out else f'{detail}{hint}'
    return cls(f'{where}: {code}: {detail}', url=url, status=status, server_error=server_error, transport=transport)


# -- bulk unregister --------------------------------------------------------------------------------


class Answer(NamedTuple):
    """The server's answer to one unregister of a batch: error None when it succeeded."""

    name: str
    error: TritonError | None


class UnregisterBatch:
    """Unregister many regions; iterating yields one Answer per name sent, in the order the answers come.

    This base sends them one after the other with ``client.unregister``; a transport may send several at
    once (Client.unregister_many). stop() sends no further name: the iteration still yields the answers
    of the names already sent, then ends. A name never sent yields nothing.
    """

    def __init__(self, client: Any, kind: str, names: Iterable[str]) -> None:
        self.client = client
        self.kind = kind
        self.names = list(names)
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def __iter__(self) -> Iterator[Answer]:
        for name in self.names:
            if self.stopped:
                return
            try:
                self.client.unregister(self.kind, name)
            except TritonError as exc:
                yield Answer(name, exc)
            else:
                yield Answer(name, None)


def unregister_batch(client: Any, kind: str, names: Iterable[str]) -> UnregisterBatch:
    """The client's own batch (Client.unregister_many), or the one-after-the-other one for a client of unregister() alone."""
    if isinstance(client, Client):
        return client.unregister_many(kind, names)
    return UnregisterBatch(client, kind, names)


# -- the interface ----------------------------------------------------------------------------------


class Library(NamedTuple):
    """Whether a transport's Python library can be imported: ok, else the import traceback (error)."""

    requirement: str
    error: str | None = None
    reason: str | None = None  # for missing_required_lib: why it is needed

    @property
    def ok(self) -> bool:
        return self.error is None


class Client(abc.ABC):
    """One Triton server over one transport: the calls the collection makes, the same for both.

    Results have one shape whatever the transport (status() lists dicts with the HTTP API's keys,
    ordered as the server lists them over HTTP, by name over gRPC); every failure is a TritonError
    (errors.py) naming the URL, with ``transport`` set to ``'http'`` or ``'grpc'`` and ``status``
    the transport's own code when the server answered. One connection (HTTP keep-alive, or the gRPC
    channel) serves the calls until close(); a call after close() connects again. A client is a
    context manager that closes itself.

    Each transport's constructor takes a connection.WireConfig (what from_params passes), or a URL and
    connection options by name (``wire_of``), sends nothing, and raises TritonError for options it
    cannot use.
    """

    transport: str = ''  # HTTP or GRPC, set by each transport
    base: str  # the URL without trailing '/', as messages name it
    host: str
    port: int
    scheme: str  # http, https, grpc or grpcs
    timeout: float  # seconds per request (connect and read) or per call
    requests_made: int  # requests sent so far (tests and benchmarks read it)

    @classmethod
    @abc.abstractmethod
    def library(cls) -> Library:
        """Whether this transport's Python library is there (checked once by base.make_client)."""

    @classmethod
    def from_params(cls, params: dict) -> Client:
        """The client for a module's connection options (base.connection_argument_spec)."""
        return cls(_wire_config(params))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def error(self, msg: str, url: str | None = None) -> TritonError:
        """A TritonError of this client's transport for a failure without an answer (or a wrong one)."""
        return TritonError(msg, url=url or self.base, transport=self.transport)

    # -- server -------------------------------------------------------------------------------------

    @abc.abstractmethod
    def server_metadata(self) -> dict:
        """{'name', 'version', 'extensions'}; TritonError when the answer is not Triton's."""

    def health(self, which: str) -> bool:
        """True/False for live or ready: an error answer means not live/ready, no answer raises TritonError."""
        check_health(which)
        try:
            return self._health(which)
        except TritonError as exc:
            if exc.status is not None:
                return False
            raise

    @abc.abstractmethod
    def _health(self, which: str) -> bool:
        """The server's answer to the health check which (raise TritonError on an error answer)."""

    # -- shared memory ------------------------------------------------------------------------------

    @abc.abstractmethod
    def status(self, kind: str) -> list[dict]:
        """The regions of kind, each with the fields of its records.Kind."""

    @abc.abstractmethod
    def register(self, kind: str, name: str, values: dict) -> None:
        """Register a region of kind: values maps each of its records.Kind.register names to its value (a HANDLE as
        base64 text), say {key, offset, byte_size} for a system region on the file key (relative to /dev/shm)."""

    @abc.abstractmethod
    def unregister(self, kind: str, name: str) -> None:
        """Unregister one region (RegionInUse, RegionNotFound: errors.py)."""

    def unregister_many(self, kind: str, names: Iterable[str]) -> UnregisterBatch:
        """Unregister many regions (see UnregisterBatch); this base sends them one after the other."""
        return UnregisterBatch(self, kind, names)

    @staticmethod
    @abc.abstractmethod
    def unaddressable(name: str) -> str | None:
        """None when this transport can address a region of this name; else why not (nothing is sent)."""

    # -- model repository (triton_backend_pool) ----------------------------------------------------

    @abc.abstractmethod
    def repository_index(self) -> list[dict]:
        """The models of the repository: {name, version, state, reason} each (version, state, reason '' when not given)."""

    @abc.abstractmethod
    def model_config(self, name: str) -> dict:
        """The model's configuration as the server completed it (the JSON form of Triton's ModelConfig)."""

    @abc.abstractmethod
    def load_model(self, name: str, config: dict | None = None, timeout: float | None = None) -> None:
        """Load (or reload) the model name; returns when the server answers (timeout: seconds, None: the client's).

        config: a whole model configuration to load it with instead of the repository's (the load API's
        ``config`` parameter). A server without --model-control-mode=explicit refuses: errors.ModelControlRefused.
        """

    # -- connection ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def use_keep_alive(self) -> bool:
        """Send the following calls over one persistent connection where possible; True when they are."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection(s) this client holds; idempotent."""
