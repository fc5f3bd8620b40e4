# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The TLS settings of the connection options, one way for the modules' transports and the EDA poller.

Private to the tritonops.shm collection: no stability promise to other code.

Standard library only, nothing of the collection: the modules' transports and the poller's (triton_aio) use it.
"""

from __future__ import annotations

import os
import ssl
from typing import NamedTuple


class TlsFileError(ValueError):
    """A TLS file (ca_path, client_cert, client_key) that cannot be read; the message names the option and the path."""


class GrpcPems(NamedTuple):
    """The PEM bytes grpc.ssl_channel_credentials takes (None: not given)."""

    root_certificates: bytes | None
    private_key: bytes | None
    certificate_chain: bytes | None


def tls_context(
    validate_certs: bool, ca_path: str | None, client_cert: str | None, client_key: str | None
) -> ssl.SSLContext:
    """An SSLContext for the options: ca_path a PEM file or a directory of them (else the system's store), no
    verification at all with validate_certs false, a client certificate (and its key, when not in the same file).

    OSError (ssl.SSLError is one) when a file cannot be read or loaded, TlsFileError for an encrypted key.
    """
    if validate_certs:
        if ca_path and os.path.isdir(ca_path):
            context = ssl.create_default_context(capath=ca_path)
        else:
            context = ssl.create_default_context(cafile=ca_path or None)
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert:
        # an encrypted key: refused, never OpenSSL's prompt for its passphrase (it reads the terminal: a module or the
        # event source started from one would wait there for good)
        context.load_cert_chain(client_cert, client_key or None, password=_no_passphrase)
    return context


def _no_passphrase() -> bytes:
    raise TlsFileError('the client key is encrypted: give it unencrypted (no passphrase is ever asked for)')


LOAD_FAILED = 'cannot load the TLS files (ca_path, client_cert, client_key)'


def loaded_context(
    validate_certs: bool, ca_path: str | None, client_cert: str | None, client_key: str | None
) -> ssl.SSLContext:
    """tls_context; TlsFileError in the one wording of every HTTPS transport (the modules' and the event source's)
    when a file cannot be read or loaded: LOAD_FAILED, then the reason cut to 300 characters."""
    try:
        return tls_context(validate_certs, ca_path, client_cert, client_key)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        reason = str(exc)
        raise TlsFileError(f'{LOAD_FAILED}: {reason if len(reason) <= 300 else reason[:300] + "..."}') from exc


def read_file(path: str, what: str) -> bytes:
    try:
        with open(path, 'rb') as f:
            return f.read()
    except OSError as exc:
        raise TlsFileError(f'cannot read {what} {path}: {exc.strerror or exc}') from exc


def ca_pem(path: str) -> bytes:
    """PEM bytes of ca_path: a file, or every certificate file of a directory (as tls_context accepts)."""
    if not os.path.isdir(path):
        return read_file(path, 'ca_path')
    pems = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            data = read_file(full, 'ca_path file')
            if b'-----BEGIN CERTIFICATE-----' in data:
                pems.append(data.rstrip(b'\n') + b'\n')
    if not pems:
        raise TlsFileError(f'ca_path {path} is a directory without PEM certificates')
    return b''.join(pems)


def grpc_pems(ca_path: str | None, client_cert: str | None, client_key: str | None) -> GrpcPems:
    """What a grpcs:// channel is built with; the client_cert file may hold the key too. TlsFileError for a file.

    A client_key without a client_cert never reaches here (connection.wire_config refuses it); were it to, it is left
    out, as tls_context leaves it out (grpcio aborts the process on a key without a certificate)."""
    cert = read_file(client_cert, 'client_cert') if client_cert else None
    key = (read_file(client_key, 'client_key') if client_key else cert) if cert else None
    return GrpcPems(ca_pem(ca_path) if ca_path else None, key, cert)
