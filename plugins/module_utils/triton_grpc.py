# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gRPC client for Triton's shared-memory and health APIs, behind the same calls as the HTTP one.

Private to the tritonops.shm collection: no stability promise to other code.
Chosen for ``grpc://HOST:PORT`` and ``grpcs://HOST:PORT`` URLs (base.make_client). It offers
the methods of triton_api.TritonClient with the same results and the same TritonError
semantics, over one channel for the whole module run. Region names are sent as they are:
gRPC carries any name, including those an HTTP path cannot (space, ``#``, ``/``, non-ASCII).

Needs ``grpcio`` and Triton's own protobuf messages, both from ``tritonclient[grpc]``
(docs/concepts.md says why); imported only when a gRPC URL is used.
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import traceback

from urllib.parse import urlsplit

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError, UnaddressableName, classify
from ansible_collections.tritonops.shm.plugins.module_utils.triton_api import FromParams, _short

GRPC_SCHEMES = ('grpc', 'grpcs')
GRPC_REQUIREMENT = 'tritonclient[grpc]'
DEFAULT_GRPC_PORT = 8001

# gRPC codes that mean no answer came from the server (the transport failed), as a connection error does over HTTP
_NO_ANSWER = ('UNAVAILABLE', 'DEADLINE_EXCEEDED')
_TLS_WORDS = ('ssl', 'tls', 'handshake', 'certificate')
_METADATA_KEY = re.compile(r'^[0-9a-z_.-]+$')
_RESERVED_KEYS = ('content-type', 'te', 'user-agent', 'host', 'connection')
_MAX_MESSAGE = 64 << 20   # a status of 100,000 regions is a few MiB


class _Lib(object):
    """grpcio and Triton's messages, imported on first use (HTTP URLs never pay for the import)."""
    grpc = None
    pb = None
    pb_grpc = None
    error = None


def load_grpc():
    """Import grpcio and tritonclient's protobuf messages once; None when they are there, else the import traceback."""
    if _Lib.grpc is None and _Lib.error is None:
        try:
            import grpc  # pylint: disable=import-outside-toplevel
            from tritonclient.grpc import service_pb2, service_pb2_grpc  # pylint: disable=import-outside-toplevel
        except ImportError:
            _Lib.error = traceback.format_exc()
        else:
            _Lib.grpc, _Lib.pb, _Lib.pb_grpc = grpc, service_pb2, service_pb2_grpc
    return _Lib.error


def is_grpc_url(url):
    """True for grpc:// and grpcs:// URLs (the scheme picks the transport)."""
    scheme = (url or '').strip().split('://', 1)[0].lower() if '://' in (url or '') else ''
    return scheme in GRPC_SCHEMES


def _read(path, what):
    try:
        with open(path, 'rb') as f:
            return f.read()
    except OSError as exc:
        raise TritonError('cannot read %s %s: %s' % (what, path, exc.strerror or exc), url=None)


def _read_ca(path):
    """PEM bytes of ca_path: a file, or every certificate file of a directory (as requests accepts)."""
    if not os.path.isdir(path):
        return _read(path, 'ca_path')
    pems = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            data = _read(full, 'ca_path file')
            if b'-----BEGIN CERTIFICATE-----' in data:
                pems.append(data.rstrip(b'\n') + b'\n')
    if not pems:
        raise TritonError('ca_path %s is a directory without PEM certificates' % path)
    return b''.join(pems)


def grpc_metadata(headers):
    """The headers option as gRPC metadata: lower-case keys, printable ASCII values.

    A header gRPC cannot carry raises TritonError naming the header, never its value.
    """
    out = []
    for key, value in (headers or {}).items():
        name = str(key).strip().lower()
        text = str(value)
        if not _METADATA_KEY.match(name) or name.startswith('grpc-') or name.startswith(':') or name in _RESERVED_KEYS:
            raise TritonError('header %r cannot be sent as gRPC metadata: names are lower-case letters, digits and -_. '
                              'and must not be reserved (grpc-*, content-type, te, user-agent, host, connection)' % (str(key),))
        if name.endswith('-bin'):
            raise TritonError('header %r cannot be sent as gRPC metadata: -bin (binary) metadata is not supported' % (str(key),))
        if any(ord(c) < 0x20 or ord(c) > 0x7e for c in text):
            raise TritonError('the value of header %r cannot be sent as gRPC metadata: only printable ASCII is allowed '
                              '(the value is not shown)' % (str(key),))
        out.append((name, text))
    return tuple(out)


class TritonGrpcClient(FromParams):
    """gRPC client for one Triton server: one channel per module run, the calls of TritonClient."""

    def __init__(self, url, timeout=10.0, validate_certs=True, ca_path=None, headers=None,
                 client_cert=None, client_key=None):
        if load_grpc() is not None:
            raise RuntimeError('%s is required' % GRPC_REQUIREMENT)
        url = (url or '').strip()
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in GRPC_SCHEMES or not parts.hostname:
            raise TritonError('url %r is not a grpc:// or grpcs:// URL of a Triton server (e.g. grpc://127.0.0.1:8001)' % (url,), url=url)
        if parts.path.strip('/') or parts.query or parts.fragment or parts.username or parts.password:
            raise TritonError('url %r: a gRPC URL is grpc://HOST:PORT or grpcs://HOST:PORT, with no path, query or user' % (url,), url=url)
        try:
            port = parts.port
        except ValueError as exc:
            raise TritonError('url %r has an invalid port: %s' % (url, exc), url=url)
        self.scheme = scheme
        self.host = parts.hostname
        self.port = port or DEFAULT_GRPC_PORT
        host = '[%s]' % self.host if ':' in self.host else self.host
        self.target = '%s:%d' % (host, self.port)
        self.base = '%s://%s' % (scheme, self.target)
        self.timeout = timeout
        self.metadata = grpc_metadata(headers)
        self.credentials = None
        if scheme == 'grpcs':
            if not validate_certs:
                raise TritonError('validate_certs=false is not possible with %s: grpcio always verifies the server certificate. '
                                  'Set ca_path to the CA that issued it (or to the certificate itself when it is self-signed)'
                                  % self.base, url=self.base)
            cert = _read(client_cert, 'client_cert') if client_cert else None
            key = _read(client_key, 'client_key') if client_key else cert   # a client_cert file may hold the key too
            roots = _read_ca(ca_path) if ca_path else None
            self.credentials = _Lib.grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=cert)
        self.requests_made = 0
        self._channel = None
        self._stub = None

    def use_keep_alive(self):
        """Every call already goes over the one channel of this client: nothing to switch."""
        return True

    def close(self):
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None

    # -- transport -----------------------------------------------------------------

    def _service(self):
        if self._stub is None:
            options = [('grpc.max_receive_message_length', _MAX_MESSAGE), ('grpc.max_send_message_length', _MAX_MESSAGE)]
            if self.credentials is None:
                self._channel = _Lib.grpc.insecure_channel(self.target, options=options)
            else:
                self._channel = _Lib.grpc.secure_channel(self.target, self.credentials, options=options)
            self._stub = _Lib.pb_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    def call(self, method, request, what):
        """One RPC of Triton's GRPCInferenceService; every failure becomes a TritonError naming the URL."""
        self.requests_made += 1
        try:
            return getattr(self._service(), method)(request, timeout=self.timeout, metadata=self.metadata)
        except _Lib.grpc.RpcError as exc:
            raise self._error(exc, what)

    def _error(self, exc, what):
        code = exc.code() if hasattr(exc, 'code') else None
        name = getattr(code, 'name', None) or 'UNKNOWN'
        details = (exc.details() if hasattr(exc, 'details') else None) or str(exc)
        where = '%s at %s' % (what, self.base)
        if name == 'DEADLINE_EXCEEDED':
            return TritonError('%s: no answer within %ss (timeout)' % (where, self.timeout), url=self.base)
        if name == 'UNAVAILABLE':
            low = details.lower()
            if 'http1' in low or 'http/1' in low:
                return TritonError('%s: cannot connect to Triton over gRPC: %s (is this the HTTP port? Triton serves gRPC '
                                   'on --grpc-port, 8001 by default)' % (where, _short(details)), url=self.base)
            if self.scheme == 'grpcs' and any(w in low for w in _TLS_WORDS):
                return TritonError('%s: TLS verification failed: %s' % (where, _short(details)), url=self.base)
            hint = ''
            if 'socket closed' in low:
                hint = (' (the server closed the connection: with grpcs://, does it require a client certificate (client_cert, '
                        'client_key)?' if self.scheme == 'grpcs' else
                        ' (the server closed the connection: is this port serving TLS (use grpcs://) or HTTP rather than gRPC?)')
            return TritonError('%s: cannot connect to Triton (refused or unreachable): %s%s' % (where, _short(details), hint),
                               url=self.base)
        if name == 'UNIMPLEMENTED':
            return TritonError("%s: gRPC %s: %s (is this Triton's gRPC port?)" % (where, name, _short(details)),
                               url=self.base, status=name, server_error=details, transport='grpc')
        return classify(details)('%s: gRPC %s: %s' % (where, name, _short(details)), url=self.base, status=name,
                                 server_error=details, transport='grpc')

    # -- server ---------------------------------------------------------------------

    def server_metadata(self):
        resp = self.call('ServerMetadata', _Lib.pb.ServerMetadataRequest(), 'read server metadata')
        if not resp.version:
            raise TritonError('read server metadata at %s: the answer is not Triton server metadata (no version)' % self.base,
                              url=self.base)
        return dict(name=resp.name, version=resp.version, extensions=list(resp.extensions))

    def health(self, which):
        """True/False for live or ready (an error answer from the server means not live/ready)."""
        if which not in ('live', 'ready'):
            raise ValueError('unknown health check %r' % (which,))
        try:
            if which == 'live':
                return bool(self.call('ServerLive', _Lib.pb.ServerLiveRequest(), 'health live').live)
            return bool(self.call('ServerReady', _Lib.pb.ServerReadyRequest(), 'health ready').ready)
        except TritonError as exc:
            if exc.status is not None:
                return False
            raise

    # -- shared memory --------------------------------------------------------------

    def status(self, kind):
        """The regions of kind, as the HTTP API lists them (the same keys), ordered by name."""
        what = 'read %s shared memory status' % kind
        if kind == 'system':
            resp = self.call('SystemSharedMemoryStatus', _Lib.pb.SystemSharedMemoryStatusRequest(), what)
            out = [dict(name=r.name, key=r.key, offset=int(r.offset), byte_size=int(r.byte_size)) for r in resp.regions.values()]
        elif kind == 'cuda':
            resp = self.call('CudaSharedMemoryStatus', _Lib.pb.CudaSharedMemoryStatusRequest(), what)
            out = [dict(name=r.name, device_id=int(r.device_id), byte_size=int(r.byte_size)) for r in resp.regions.values()]
        else:
            raise ValueError('unknown shared memory kind %r' % (kind,))
        return sorted(out, key=lambda r: r['name'])

    @staticmethod
    def unaddressable(name):
        """None when a region of this name can be addressed (any name but the empty one); else why not."""
        return None if name else 'an empty region name is refused (over gRPC it would address every region)'

    @staticmethod
    def _name(name, what):
        # over gRPC an empty name means *every* region: never send one by accident
        if not name:
            raise UnaddressableName('%s: an empty region name is refused (over gRPC it would address every region)' % what)
        return name

    def register_system(self, name, key, offset, byte_size):
        what = "register system region '%s'" % name
        req = _Lib.pb.SystemSharedMemoryRegisterRequest(name=self._name(name, what), key=key, offset=offset, byte_size=byte_size)
        self.call('SystemSharedMemoryRegister', req, what)

    def register_cuda(self, name, raw_handle_b64, device_id, byte_size):
        what = "register cuda region '%s'" % name
        try:
            raw = base64.b64decode(raw_handle_b64, validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise TritonError('%s: raw_handle is not base64: %s' % (what, exc), url=self.base)
        req = _Lib.pb.CudaSharedMemoryRegisterRequest(name=self._name(name, what), raw_handle=raw, device_id=device_id,
                                                      byte_size=byte_size)
        self.call('CudaSharedMemoryRegister', req, what)

    def unregister(self, kind, name):
        what = "unregister %s region '%s'" % (kind, name)
        if kind == 'system':
            self.call('SystemSharedMemoryUnregister', _Lib.pb.SystemSharedMemoryUnregisterRequest(name=self._name(name, what)), what)
        elif kind == 'cuda':
            self.call('CudaSharedMemoryUnregister', _Lib.pb.CudaSharedMemoryUnregisterRequest(name=self._name(name, what)), what)
        else:
            raise ValueError('unknown shared memory kind %r' % (kind,))
