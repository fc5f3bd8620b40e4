# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one HTTP client for Triton's shared-memory and health APIs.

Private to the tritonops.shm collection: no stability promise to other code.
Modules never build URLs themselves; every request goes through TritonClient,
which owns the session, timeouts, TLS, headers, URL-encoding of region names,
and turns every failure into a TritonError whose message names the URL.
"""
from __future__ import annotations

import json
import socket
import string
import traceback

from http import client as http_client
from urllib.parse import urlsplit

from ansible_collections.tritonops.shm.plugins.module_utils.errors import TritonError, UnaddressableName, classify

REQUESTS_IMPORT_ERROR = None
try:
    import requests
    HAS_REQUESTS = True
except ImportError:
    HAS_REQUESTS = False
    REQUESTS_IMPORT_ERROR = traceback.format_exc()


# Triton 2.68 (NGC 26.04) and later turn client shared memory off unless started with the flag below.
CLIENT_SHM_DISABLED = 'Client shared memory is disabled'
CLIENT_SHM_HINT = ("this Triton has client shared memory turned off (2.68 and later, by default): start it with "
                   "--allow-client-shm=true (role tritonops.shm.triton_server: triton_server_allow_client_shm: true, "
                   "or auto, which adds it for 2.68 and later)")


# Characters a URL path segment may carry as they are (RFC 3986 pchar, plus '%' kept raw).
_SEGMENT_SAFE = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%")


def region_segment(name):
    """The region name as a URL path segment, sent byte for byte.

    Triton's HTTP endpoint does not percent-decode region names: registering
    ``a%20b`` creates a region literally named ``a%20b``. So a name is sent as it
    is, and a name with characters a path segment cannot carry (space, ``#``,
    ``?``, ``/``, non-ASCII, controls) cannot be addressed over HTTP at all
    (such regions can only come from gRPC clients, and a ``grpc://`` URL handles
    them, see triton_grpc): that raises TritonError with ``unaddressable`` set,
    before anything is sent.
    """
    bad = sorted(set(c for c in name if c not in _SEGMENT_SAFE))
    if not name or bad:
        raise UnaddressableName("region name %r cannot be addressed over Triton's HTTP API: it contains %s, and Triton does not "
                          "decode percent-encoding in region names (use names of letters, digits and -._~ only). "
                          "Such a region comes from a gRPC client: a grpc:// URL of the same server (its gRPC port, "
                          "8001 by default) can unregister and clean it"
                          % (name, ', '.join(repr(c) for c in bad) or 'nothing'))
    return name


def region_path(kind, name):
    """The URL path of one region (see region_segment)."""
    return '/v2/%s/region/%s' % (_kind_root(kind), region_segment(name))


def _kind_root(kind):
    if kind == 'system':
        return 'systemsharedmemory'
    if kind == 'cuda':
        return 'cudasharedmemory'
    raise ValueError('unknown shared memory kind %r' % (kind,))


class FromParams(object):
    """Both transports' clients are built the same way from the connection options."""

    @classmethod
    def from_params(cls, params):
        return cls(params['url'], timeout=params.get('timeout') or 10.0,
                   validate_certs=params.get('validate_certs', True), ca_path=params.get('ca_path'),
                   headers=params.get('headers'), client_cert=params.get('client_cert'),
                   client_key=params.get('client_key'))


class TritonClient(FromParams):
    """HTTP(S) client for one Triton server, one requests session per module run."""

    def __init__(self, url, timeout=10.0, validate_certs=True, ca_path=None, headers=None,
                 client_cert=None, client_key=None):
        if not HAS_REQUESTS:
            raise RuntimeError('requests is required')
        url = (url or '').strip()
        if '://' not in url:
            url = 'http://' + url
        parts = urlsplit(url)
        if parts.scheme not in ('http', 'https') or not parts.hostname:
            raise TritonError("url %r is not an http(s) URL of a Triton server (e.g. http://127.0.0.1:8000; grpc://127.0.0.1:8001 for gRPC)" % (url,), url=url)
        try:
            parts.port  # pylint: disable=pointless-statement
        except ValueError as exc:
            raise TritonError('url %r has an invalid port: %s' % (url, exc), url=url)
        self.base = url.rstrip('/')
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == 'https' else 80)
        self.scheme = parts.scheme
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({'Accept': 'application/json'})
        self.session.headers.update(dict((str(k), str(v)) for k, v in (headers or {}).items()))
        if ca_path and validate_certs:
            self.session.verify = ca_path
        else:
            self.session.verify = bool(validate_certs)
        if client_cert:
            self.session.cert = (client_cert, client_key) if client_key else client_cert
        self.requests_made = 0
        self._keep_alive = None

    def use_keep_alive(self):
        """Send the following requests over one persistent plain connection, when nothing needs requests.

        For bulk work (a thousand unregisters): requests' per-call machinery costs several times a
        loopback request. Applies to http:// URLs that no proxy setting covers; https and proxied URLs
        keep going through requests. Returns True when the keep-alive connection is used.
        """
        if self.scheme != 'http' or (self.session.trust_env and requests.utils.get_environ_proxies(self.base)):
            return False
        headers = dict(self.session.headers)
        headers['Accept-Encoding'] = 'identity'   # answers are read as they come, never decompressed
        if not _KeepAlive.usable_headers(headers):
            return False
        self._keep_alive = _KeepAlive(self.host, self.port, self.timeout, headers)
        return True

    # -- transport -----------------------------------------------------------------

    def request(self, method, path, body=None, what=None, expect_json=True):
        """Send one request; return (status, decoded JSON or None). Raise TritonError on any failure."""
        url = self.base + path
        what = what or '%s %s' % (method, path)
        data = headers = None
        if body is not None:
            data = json.dumps(body)
            headers = {'Content-Type': 'application/json'}
        self.requests_made += 1
        try:
            if self._keep_alive is not None:
                resp = self._keep_alive.send(method, path, data, headers)
            else:
                prepared = self.session.prepare_request(requests.Request(method, url, data=data, headers=headers))
                prepared.url = url  # byte for byte: requests would re-quote the path (e.g. turn %41 into A)
                # verify/cert passed explicitly: otherwise REQUESTS_CA_BUNDLE would override ca_path and validate_certs=false
                settings = self.session.merge_environment_settings(url, {}, None, self.session.verify, self.session.cert)
                resp = self.session.send(prepared, timeout=self.timeout, **settings)
        except requests.exceptions.SSLError as exc:
            raise TritonError('%s at %s: TLS verification failed: %s' % (what, url, exc), url=url)
        except requests.exceptions.ConnectTimeout as exc:
            raise TritonError('%s at %s: connection timed out after %ss: %s' % (what, url, self.timeout, exc), url=url)
        except requests.exceptions.ReadTimeout:
            raise TritonError('%s at %s: no answer within %ss (timeout)' % (what, url, self.timeout), url=url)
        except requests.exceptions.ConnectionError as exc:
            raise TritonError('%s at %s: cannot connect to Triton (refused or unreachable): %s' % (what, url, _short(exc)), url=url)
        except requests.exceptions.RequestException as exc:
            raise TritonError('%s at %s: request failed: %s' % (what, url, _short(exc)), url=url)
        except OSError as exc:
            # requests raises a bare OSError for a ca_path / client_cert it cannot read
            raise TritonError('%s at %s: %s' % (what, url, _short(exc)), url=url)
        return self._decode(resp, what, url, expect_json)

    @staticmethod
    def _decode(resp, what, url, expect_json):
        data = None
        decode_error = None
        if resp.content:
            try:
                data = resp.json()
            except ValueError as exc:
                decode_error = exc
        if resp.status_code >= 400:
            server_error = None
            if isinstance(data, dict) and isinstance(data.get('error'), str):
                server_error = data['error']
            detail = server_error or _snippet(resp.text) or resp.reason
            if CLIENT_SHM_DISABLED in (server_error or ''):
                detail = '%s; %s' % (detail, CLIENT_SHM_HINT)
            raise classify(server_error)('%s at %s: HTTP %s: %s' % (what, url, resp.status_code, detail), url=url,
                                         status=resp.status_code, server_error=server_error, transport='http')
        if expect_json and decode_error is not None:
            raise TritonError('%s at %s: the response is not Triton JSON (is another web server on this port?): %s'
                              % (what, url, _snippet(resp.text)), url=url, status=resp.status_code)
        return resp.status_code, data

    def _json_list(self, path, what):
        _status, data = self.request('GET', path, what=what)
        if not isinstance(data, list) or not all(isinstance(i, dict) for i in data):
            raise TritonError('%s at %s: expected a JSON list of regions, got %s' % (what, self.base + path, _snippet(json.dumps(data))),
                              url=self.base + path)
        return data

    @staticmethod
    def unaddressable(name):
        """None when a region of this name can be addressed over HTTP; else why not (see region_segment)."""
        try:
            region_segment(name)
        except TritonError as exc:
            return exc.msg
        return None

    # -- server ---------------------------------------------------------------------

    def server_metadata(self):
        _status, data = self.request('GET', '/v2', what='read server metadata')
        if not isinstance(data, dict) or 'version' not in data:
            raise TritonError('read server metadata at %s: the response is not Triton server metadata: %s'
                              % (self.base + '/v2', _snippet(json.dumps(data))), url=self.base + '/v2')
        return data

    def health(self, which):
        """True/False for /v2/health/live or /ready (a 4xx/5xx answer means not live/ready)."""
        try:
            status, _data = self.request('GET', '/v2/health/%s' % which, what='health %s' % which, expect_json=False)
        except TritonError as exc:
            if exc.status is not None:
                return False
            raise
        return status == 200

    # -- shared memory --------------------------------------------------------------

    def status(self, kind):
        return self._json_list('/v2/%s/status' % _kind_root(kind), 'read %s shared memory status' % kind)

    def register_system(self, name, key, offset, byte_size):
        body = dict(key=key, offset=offset, byte_size=byte_size)
        self.request('POST', region_path('system', name) + '/register', body=body,
                     what="register system region '%s'" % name, expect_json=False)

    def register_cuda(self, name, raw_handle_b64, device_id, byte_size):
        body = dict(raw_handle=dict(b64=raw_handle_b64), device_id=device_id, byte_size=byte_size)
        self.request('POST', region_path('cuda', name) + '/register', body=body,
                     what="register cuda region '%s'" % name, expect_json=False)

    def unregister(self, kind, name):
        self.request('POST', region_path(kind, name) + '/unregister',
                     what="unregister %s region '%s'" % (kind, name), expect_json=False)


class _Response(object):
    """The parts of a requests.Response that TritonClient reads, for the keep-alive connection."""

    def __init__(self, status_code, reason, content):
        self.status_code = status_code
        self.reason = reason
        self.content = content

    @property
    def text(self):
        return self.content.decode('utf-8', 'replace')

    def json(self):
        return json.loads(self.content.decode('utf-8'))


class _KeepAlive(object):
    """One persistent plain HTTP/1.1 connection (the standard library's http.client), for bulk calls.

    requests costs about 0.4 ms of Python per call, several times a loopback request to Triton;
    http.client over one kept-alive connection costs what tritonclient does. Failures are raised
    as the requests exceptions they correspond to, so TritonClient.request reports them exactly
    as for requests.
    """

    def __init__(self, host, port, timeout, headers):
        self.host = host
        self.port = port
        self.timeout = timeout
        self.headers = dict((k, v) for k, v in headers.items()
                            if k.lower() not in ('host', 'content-length', 'connection', 'transfer-encoding'))
        self.conn = None

    @staticmethod
    def usable_headers(headers):
        """Header names and values http.client can send as they are (no line breaks, ASCII)."""
        for k, v in headers.items():
            text = '%s%s' % (k, v)
            if '\r' in text or '\n' in text or any(ord(c) > 126 for c in text):
                return False
        return True

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def send(self, method, path, data=None, headers=None, _retried=False):
        if any(c in path for c in ' \r\n\t') or not path.startswith('/'):
            raise requests.exceptions.InvalidURL('invalid request path %r' % (path,))
        fresh = self.conn is None
        if fresh:
            self.conn = http_client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        body = data.encode('utf-8') if isinstance(data, str) else (data or b'')
        hdrs = dict(self.headers)
        hdrs.update(headers or {})
        hdrs['Content-Length'] = str(len(body))
        try:
            self.conn.request(method, path, body=body, headers=hdrs)
            resp = self.conn.getresponse()
            content = resp.read()
        except socket.timeout:
            self.close()
            raise requests.exceptions.ReadTimeout('read timed out')
        except (http_client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            # an idle kept-alive connection the server closed: reconnect once (Triton's
            # shared-memory calls are idempotent: register of an existing spec, unregister)
            self.close()
            if fresh or _retried:
                raise requests.exceptions.ConnectionError(exc)
            return self.send(method, path, data, headers, _retried=True)
        except (OSError, http_client.HTTPException) as exc:
            self.close()
            raise requests.exceptions.ConnectionError(exc)
        if resp.will_close:
            self.close()
        return _Response(resp.status, resp.reason, content)


def _short(exc):
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + '...'


def _snippet(text, limit=200):
    text = (text or '').strip().replace('\n', ' ')
    return text if len(text) <= limit else text[:limit] + '...'
