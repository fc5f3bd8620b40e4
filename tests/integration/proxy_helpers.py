"""Real HTTP(S) servers on loopback for fault and security tests.

- ForwardingProxy: forwards every request byte for byte to a real tritonserver
  (like an nginx or an auth proxy in front of Triton), optionally over TLS with
  a client-certificate requirement, and can be told to fail: a hook
  fault(method, path, headers) returns (status, content type, body) to answer
  instead of forwarding, or None to forward.
- make_ca / make_cert: a self-made CA and certificates signed by it (the
  ``cryptography`` package), written as PEM files.
"""

from __future__ import annotations

import datetime
import http.client
import http.server
import ipaddress
import os
import ssl
import threading

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOP_HEADERS = ('connection', 'keep-alive', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'proxy-connection')


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def _handle(self):
        proxy = self.server.proxy
        length = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(length) if length else None
        with proxy.lock:
            proxy.requests.append(dict(method=self.command, path=self.path, headers=dict(self.headers.items())))
        fault = proxy.fault(self.command, self.path, self.headers) if proxy.fault else None
        if fault is not None:
            status, ctype, payload = fault
            self._answer(status, [('Content-Type', ctype)], payload)
            return
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=30)
        try:
            headers = dict((k, v) for k, v in self.headers.items() if k.lower() not in HOP_HEADERS)
            conn.request(self.command, self.path, body=body, headers=headers)  # path as received: byte for byte
            resp = conn.getresponse()
            payload = resp.read()
            self._answer(
                resp.status,
                [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_HEADERS + ('content-length',)],
                payload,
            )
        except OSError as exc:
            self._answer(502, [('Content-Type', 'text/plain')], ('502 Bad Gateway: %s' % exc).encode())
        finally:
            conn.close()

    def _answer(self, status, headers, payload):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header('Content-Length', str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815 (http.server API)

    def log_message(self, *args):
        pass


class ForwardingProxy:
    """A threaded HTTP(S) forwarding proxy on 127.0.0.1 in front of upstream_url (http://host:port)."""

    def __init__(self, upstream_url, tls=None, fault=None):
        hostport = upstream_url.split('://', 1)[-1].rstrip('/')
        host, port = hostport.rsplit(':', 1)
        self.upstream_host, self.upstream_port = host, int(port)
        self.fault = fault
        self.requests = []
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.proxy = self
        self.scheme = 'http'
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = 'https'
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self):
        return self.httpd.server_address[1]

    def url(self, host='127.0.0.1'):
        return '%s://%s:%d' % (self.scheme, host, self.port)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def server_tls_context(cert, key, client_ca=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _write_key(key, path):
    with open(path, 'wb') as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    os.chmod(path, 0o600)


def _write_cert(cert, path):
    with open(path, 'wb') as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def make_ca(directory, name):
    """A self-signed CA: returns dict(cert=path, key=path, obj=(cert, key))."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    paths = dict(cert=os.path.join(directory, name + '.crt'), key=os.path.join(directory, name + '.key'))
    _write_cert(cert, paths['cert'])
    _write_key(key, paths['key'])
    paths['obj'] = (cert, key)
    return paths


def make_cert(directory, name, ca, server=True, hosts=('localhost', '127.0.0.1')):
    """A leaf certificate signed by ca (from make_ca): a server certificate for hosts, or a client certificate."""
    ca_cert, ca_key = ca['obj']
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if server:
        names = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    paths = dict(cert=os.path.join(directory, name + '.crt'), key=os.path.join(directory, name + '.key'))
    _write_cert(cert, paths['cert'])
    _write_key(key, paths['key'])
    return paths
