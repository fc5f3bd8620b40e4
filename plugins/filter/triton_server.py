# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the triton_server role derives from its variables, as pure functions.

Documentation: plugins/filter/triton_version.yml, triton_gpus.yml, triton_endpoints.yml
(``ansible-doc -t filter tritonops.shm.NAME``).
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

# First versions whose client shared memory is off unless --allow-client-shm=true
# (triton-inference-server/server PR 8721, NGC release 26.04 = server 2.68.0), as major * 1000 + minor.
CLIENT_SHM_OFF_SINCE = {'server': 2068, 'ngc': 26004}
_VERSION = re.compile(r'^v?([0-9]+)[.]([0-9]+)')
_ALLOW_TRUE = ('true', 'yes', '1')
_ALLOW_FALSE = ('false', 'no', '0')
READY_PATH = '/v2/health/ready'
_ANY_ADDRESS = ('0.0.0.0', '', '::')


def _text(value, what, name):
    """A str from a str, or an int or float (YAML reads 26.05 as a number); None is ''."""
    if value is None:
        return ''
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError('%s: %s must be a string, got %s %r' % (name, what, type(value).__name__, value))
    return str(value).strip()


def image_tag(image):
    """The tag of an image reference: '24.10-py3' from nvcr.io/nvidia/tritonserver:24.10-py3; '' untagged or by digest only."""
    last = image.split('@')[0].split('/')[-1]
    return last.split(':')[1] if ':' in last else ''


def triton_version(image, version='', allow_client_shm='auto'):
    """The Triton version of an image (or of an explicit version text), and whether --allow-client-shm=true is added."""
    image = _text(image, 'the image', 'triton_version')
    text = _text(version, 'version', 'triton_version') or image_tag(image)
    found = _VERSION.match(text)
    major, minor = (int(found.group(1)), int(found.group(2))) if found else (None, None)
    if major == 2:
        kind = 'server'
    elif major is not None and major >= 19:
        kind = 'ngc'
    else:
        kind = 'unknown'
    number = major * 1000 + minor if kind != 'unknown' else 0
    off = kind != 'unknown' and number >= CLIENT_SHM_OFF_SINCE[kind]
    if isinstance(allow_client_shm, bool):
        mode = 'true' if allow_client_shm else 'false'
    else:
        mode = _text(allow_client_shm, 'allow_client_shm', 'triton_version').lower()
        if mode not in ('auto',) + _ALLOW_TRUE + _ALLOW_FALSE:
            raise AnsibleFilterError("triton_version: allow_client_shm must be auto, true or false, got %r" % (allow_client_shm,))
    flag = mode in _ALLOW_TRUE or (mode == 'auto' and off)
    return dict(text=text, kind=kind, number=number, client_shm_off_by_default=off, allow_client_shm=flag)


def triton_gpus(value):
    """The GPUs of the container: the ids, Docker's device requests and Podman's CDI devices."""
    if value is None or value == '':
        ids = []
    elif isinstance(value, bool) or not isinstance(value, (str, int, list, tuple)):
        raise AnsibleFilterError("triton_gpus: expected '', 'all', a GPU index or UUID, or a list of them, got %s %r"
                                 % (type(value).__name__, value))
    else:
        items = value if isinstance(value, (list, tuple)) else [value]
        ids = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (str, int)) or not str(item).strip():
                raise AnsibleFilterError('triton_gpus: each GPU must be a non-empty index or UUID, got %r in %r' % (item, value))
            ids.append(str(item).strip())
        if 'all' in ids and ids != ['all']:
            raise AnsibleFilterError("triton_gpus: 'all' cannot be combined with other GPUs, got %r" % (value,))
    if not ids:
        docker = []
    elif ids == ['all']:
        docker = [dict(driver='nvidia', count=-1, capabilities=[['gpu']])]
    else:
        docker = [dict(driver='nvidia', device_ids=ids, capabilities=[['gpu']])]
    return dict(ids=ids, docker_device_requests=docker, podman_devices=['nvidia.com/gpu=' + i for i in ids])


def _port(value, what):
    if isinstance(value, bool):
        value = None
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise AnsibleFilterError('triton_endpoints: %s must be a port number (0 disables it), got %r' % (what, value))
    if port > 65535:
        raise AnsibleFilterError('triton_endpoints: %s must be at most 65535, got %r' % (what, value))
    return port


def triton_endpoints(listen_address, http_port=8000, grpc_port=8001, metrics_port=8002, network_mode='bridge', ready_url=''):
    """The ports the container publishes and the URLs the role uses, from the listen address and the ports."""
    address = _text(listen_address, 'listen_address', 'triton_endpoints')
    http = _port(http_port, 'http_port')
    ports = [p for p in (http, _port(grpc_port, 'grpc_port'), _port(metrics_port, 'metrics_port')) if p > 0]
    host_network = _text(network_mode, 'network_mode', 'triton_endpoints') == 'host'
    ready = _text(ready_url, 'ready_url', 'triton_endpoints')
    if not ready:
        ready = 'http://%s:%d%s' % ('127.0.0.1' if address in _ANY_ADDRESS else address, http, READY_PATH)
    return dict(ports=ports,
                published_ports=[] if host_network else ['%s:%d:%d' % (address, p, p) for p in ports],
                ready_url=ready,
                url=ready[:-len(READY_PATH)] if ready.endswith(READY_PATH) else ready)


class FilterModule(object):
    def filters(self):
        return dict(triton_version=triton_version, triton_gpus=triton_gpus, triton_endpoints=triton_endpoints)
