# -*- coding: utf-8 -*-
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The TLS settings of the connection options, one way for the modules' HTTP transport and the EDA poller.

Private to the tritonops.shm collection: no stability promise to other code.

Standard library only, nothing of the collection: the poller (extensions/eda/plugins/event_source/triton_shm.py)
loads this file by its path, as it loads http_reader.py.
"""
from __future__ import annotations

import os
import ssl


def tls_context(validate_certs: bool, ca_path: str | None, client_cert: str | None, client_key: str | None) -> ssl.SSLContext:
    """An SSLContext for the options: ca_path a PEM file or a directory of them (else the system's store), no
    verification at all with validate_certs false, a client certificate (and its key, when not in the same file).

    OSError (ssl.SSLError is one) when a file cannot be read or loaded.
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
        context.load_cert_chain(client_cert, client_key or None)
    return context
