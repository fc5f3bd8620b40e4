# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one exception family of the collection.

Private to the tritonops.shm collection: no stability promise to other code.

Every error raised on purpose is a TritonOpsError whose ``msg`` is the whole message a module
fails with (what, where, why). A condition Triton reports (a region in use, not found, client
shared memory disabled, …) is decided once, where the server's answer is parsed, by raising the
matching subclass; nothing later reads message text::

    TritonOpsError
    ├── ParameterError          an option value refused before anything is done
    ├── ShmFsError              a refused or failed operation on the shm directory or a file in it
    │   ├── LockError           the per-server lock could not be taken in time
    │   ├── PathRefused         a path that could lead outside a root or the shm directory (a symlink on the way)
    │   └── ShmDirInUse         a running tritonserver uses the shm directory a sweep was asked to clean
    ├── DiscoveryError          server_pid or shm_dir cannot be used
    │   └── ServerNotFound      an action needs the server process and it was not found
    └── TritonError             a failed request to Triton (url, status, server_error)
        ├── UnaddressableName   a region name this transport cannot address (nothing was sent)
        ├── RegionInUse         Triton >= 2.50 refuses to unregister: requests in flight
        ├── RegionNotFound      Triton does not have the region
        ├── RegisterOverflow    Triton >= 2.58 refuses a register whose byte_size + offset overflows
        ├── ReservedKey         Triton >= 2.60 refuses a key with its python backend prefix (>= 2.61: or an invalid key)
        ├── ClientShmDisabled   Triton >= 2.68 started without --allow-client-shm=true (HTTP 501, gRPC UNIMPLEMENTED)
        ├── ShmUnsupported      a server without shared memory at all (2.73 tritonfrontend bindings, HTTP 503)
        ├── Restricted          the API is behind a header the request lacked (--http-restricted-api, --grpc-restricted-protocol)
        └── MalformedAnswer     an answer that is not what Triton sends (a region without a string name, …)

Standard library only and nothing of the collection, so that filters may import it; the EDA poller reads Triton's
refusals through it (client.error_from_answer) the way the modules do.
"""

from __future__ import annotations

import re


class TritonOpsError(Exception):
    """Base of every error the collection raises on purpose; ``msg`` is the whole message."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg

    def __str__(self) -> str:
        return self.msg


class ParameterError(TritonOpsError):
    """An option value that is refused before anything is read or changed."""


class ShmFsError(TritonOpsError):
    """A refused or failed filesystem operation; the message says what and why."""


class LockError(ShmFsError):
    """The per-server lock could not be taken in time; the message says which and why."""


class PathRefused(ShmFsError):
    """A path refused before it is used: a symlink on the way through another process's root, or one that changed."""


class ShmDirInUse(ShmFsError):
    """A running tritonserver uses the shm directory (or cannot be proven not to): a sweep of it is refused."""


class DiscoveryError(TritonOpsError):
    """The server_pid or shm_dir given cannot be used."""


class ServerNotFound(DiscoveryError):
    """An action needs the server process and its shm directory, and they were not found."""


class TritonError(TritonOpsError):
    """A failed Triton request: what was attempted, where, and the server's own reason.

    ``status`` is the transport's own code when the server answered (None when it did not): the HTTP
    status (int) over HTTP, the gRPC status code name (str, e.g. ``'INTERNAL'``) over gRPC;
    ``transport`` says which (``'http'`` or ``'grpc'``) for every error a client raises, None for an
    error raised elsewhere (e.g. before a client exists).
    """

    def __init__(
        self,
        msg: str,
        url: str | None = None,
        status: int | str | None = None,
        server_error: str | None = None,
        transport: str | None = None,
    ) -> None:
        super().__init__(msg)
        self.url = url
        self.status = status
        self.server_error = server_error
        self.transport = transport

    # Kept as read-only views of the class: the condition is the class, decided where the answer is parsed.
    @property
    def in_use(self) -> bool:
        return isinstance(self, RegionInUse)

    @property
    def not_found(self) -> bool:
        return isinstance(self, RegionNotFound)

    @property
    def unaddressable(self) -> bool:
        return isinstance(self, UnaddressableName)

    def as_dict(self) -> dict:
        """Where, the transport's own code, and the server's own text: the keys every ``failure`` has."""
        return {'url': self.url, 'status': self.status, 'server_error': self.server_error}

    def failure(self) -> dict:
        """The ``failure`` a module returns: as_dict(), plus ``transport`` when a client raised the error.

        ``status`` keeps the transport's own code (an int over HTTP, a str over gRPC) and
        ``transport`` (``http`` or ``grpc``) says how to read it; doc fragment tritonops.shm.triton.
        """
        out = self.as_dict()
        if self.transport is not None:
            out['transport'] = self.transport
        return out


class UnaddressableName(TritonError):
    """A region name the transport cannot address; raised before anything is sent."""


class RegionInUse(TritonError):
    """Triton >= 2.50 refuses to unregister a region with requests in flight (retry with backoff)."""


class RegionNotFound(TritonError):
    """Triton does not have the region (an unregister of it is someone else's work done)."""


class RegisterOverflow(TritonError):
    """Triton >= 2.58 refuses a register whose byte_size + offset exceeds the largest size it can hold."""


class ReservedKey(TritonError):
    """Triton >= 2.60 refuses a key with the python backend's reserved prefix; 2.61 and later also an all-slash key."""


class ClientShmDisabled(TritonError):
    """Triton >= 2.68 refuses register and unregister unless started with --allow-client-shm=true; status still works."""


class ShmUnsupported(TritonError):
    """The server offers no shared memory at all (2.73 and later through the in-process tritonfrontend bindings).

    Not a leak and not a transient failure: nothing can be read or cleaned there, and nothing is retried.
    """


class Restricted(TritonError):
    """The server puts this API behind a header (--http-restricted-api, --grpc-restricted-protocol) that the request
    lacked, or sent with another value; ``header`` is the header Triton names (over gRPC with its
    ``triton-grpc-protocol-`` prefix), None when its text names none."""

    @property
    def header(self) -> str | None:
        return restricted_header(self.server_error)


class MalformedAnswer(TritonError):
    """The server answered, but not as Triton does (wrong types or missing fields in a status or metadata).

    Raised where the answer is read, naming the URL; nothing is done with such an answer.
    """


class ModelControlRefused(TritonError):
    """The server refuses the repository API's load and unload: it does not run with --model-control-mode=explicit."""


# How each condition reads in the server's own error text (src/shared_memory_manager.cc, http_server.cc,
# grpc/grpc_server.cc of the version named); used only where an answer is parsed, first match wins.
IN_USE_TEXT = 'currently in use'  # 2.50: HTTP 500, gRPC INTERNAL
NOT_FOUND_TEXT = 'Unable to find'
OVERFLOW_TEXT = 'Integer overflow detected'  # 2.58
RESERVED_PREFIX_TEXT = 'as the key contains the reserved prefix'  # 2.60
INVALID_KEY_TEXT = 'invalid shm key'  # 2.61
CLIENT_SHM_DISABLED_TEXT = 'Client shared memory is disabled'  # 2.68: HTTP 501, gRPC UNIMPLEMENTED
UNSUPPORTED_TEXT = 'Shared memory is not supported in this server configuration'  # 2.73 tritonfrontend: HTTP 503
# an API behind a header the request lacked (http_server.cc, grpc_server.cc; 2.51): HTTP 403 "This API is restricted,
# expecting header 'K'", gRPC UNAVAILABLE "This protocol is restricted, expecting header 'triton-grpc-protocol-K'"
RESTRICTED_TEXT = 'is restricted, expecting header'
_RESTRICTED_HEADER = re.compile(r"is restricted, expecting header '([^']*)'")
# a load or unload without --model-control-mode=explicit (model_repository_manager.cc; 2.51 with mode none or poll:
# HTTP 503, gRPC UNAVAILABLE)
MODEL_CONTROL_TEXT = 'explicit model load / unload is not allowed'

_TEXTS = (
    (IN_USE_TEXT, RegionInUse),
    (NOT_FOUND_TEXT, RegionNotFound),
    (OVERFLOW_TEXT, RegisterOverflow),
    (RESERVED_PREFIX_TEXT, ReservedKey),
    (INVALID_KEY_TEXT, ReservedKey),
    (CLIENT_SHM_DISABLED_TEXT, ClientShmDisabled),
    (UNSUPPORTED_TEXT, ShmUnsupported),
    (MODEL_CONTROL_TEXT, ModelControlRefused),
    (RESTRICTED_TEXT, Restricted),
)


def classify(server_error: str | None) -> type[TritonError]:
    """The TritonError subclass for a server's error text (the one place that reads it)."""
    text = server_error or ''
    for needle, cls in _TEXTS:
        if needle in text:
            return cls
    return TritonError


def restricted_header(server_error: str | None) -> str | None:
    """The header a restricted API's refusal names ("… is restricted, expecting header 'K'"), None for another text."""
    match = _RESTRICTED_HEADER.search(server_error or '')
    return match.group(1) if match else None


def restricted_hint(header: str | None, grpc: bool, option: str = 'headers') -> str:
    """The way out of a Restricted refusal: the option to give the header in, with the key Triton expects.

    option names the setting where the caller takes headers (the modules' and the poller's ``headers``).
    """
    flag = '--grpc-restricted-protocol' if grpc else '--http-restricted-api'
    key = header or 'the header the server names'
    return (
        f'the server was started with {flag}, which puts this API behind a header: give it in the {option} option, '
        f'{option}: {{{key}: <the value the server was started with>}} (a wrong value gets the same answer; the '
        'shm_cleanup role takes it as shm_cleanup_headers, the fleet playbooks as triton_headers)'
    )
