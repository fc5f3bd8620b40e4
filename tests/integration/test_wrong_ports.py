"""Errors for wrong ports (issue 44, goal 4), against the real Triton 2.51 and a real web server.

Before, http:// at Triton's gRPC port said ``the answer is not HTTP: \\x00\\x00\\x18\\x04…`` and a web server's page
came back as its HTML. Now each says what is on the port and what to use instead.
"""

from __future__ import annotations

import http.server
import json
import threading

import tritonrig
from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'


def failed_with(result, *needles):
    assert result.get('failed') is True, result
    for needle in needles:
        assert needle in result['msg'], (needle, result['msg'])
    assert 'Traceback' not in json.dumps(result) and '\\x00' not in result['msg'], result['msg']


def test_the_grpc_port_given_as_http_and_the_http_port_given_as_https_say_what_to_use(tmp_path):
    with tritonrig.TritonServer(workdir=str(tmp_path), models=(), grpc=True) as server:  # __enter__ starts it
        failed_with(
            run_module(INFO, dict(url=f'http://{server.grpc_url}')),
            f'http://{server.grpc_url}',
            "speaks HTTP/2, as Triton's gRPC port does",
            'use grpc://HOST:PORT',
        )
        failed_with(
            run_module(INFO, dict(url=f'https://127.0.0.1:{server.http_port}')),
            'if this port serves plain HTTP, use http://',
        )
        failed_with(run_module(INFO, dict(url=f'grpc://127.0.0.1:{server.http_port}')), 'or HTTP rather than gRPC')


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        body = (
            b'<!DOCTYPE html><html><head><title>Grafana</title></head><body><div id="app">Loading</div></body></html>'
        )
        self.send_response(200)
        self.send_header('Content-Type', 'text/html; charset=utf-8')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_web_page_on_the_port_is_named_without_its_markup():
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        res = run_module(INFO, dict(url=f'http://127.0.0.1:{httpd.server_address[1]}'))
    finally:
        httpd.shutdown()
        httpd.server_close()
    failed_with(res, 'not Triton JSON', 'an HTML page: Grafana Loading', "Triton's HTTP port is 8000 by default")
    assert '<' not in res['msg']
