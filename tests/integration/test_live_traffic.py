"""Live traffic: the cleanup role runs again and again next to live inference clients while others die.

A short, bounded run of tests/bench/soak.py (`make soak` is the long one): real
tritonclient processes run inferences through their shared-memory regions on the
python-backend echo model, SIGKILLed clients keep leaking, and the role
tritonops.shm.shm_cleanup runs repeatedly. Nothing live may be lost, nothing
leaked may be left.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench'))

import soak  # noqa: E402  pylint: disable=wrong-import-position


def test_cleanup_next_to_live_traffic_loses_nothing_and_leaves_no_leak(tmp_path):
    figures = soak.soak(duration=25, max_runs=3, live=2, leak_interval=0.5, workdir=str(tmp_path))
    print('FIGURE live_traffic: ' + json.dumps(figures))
    assert figures['failures'] == [], figures['failures']
    assert figures['cleanup_runs'] >= 2 and figures['cleanup_failed_runs'] == 0
    assert figures['leaked_regions'] >= 4, 'clients were really SIGKILLed while the cleanup ran'
    assert figures['leaked_unregistered_by_cleanup'] >= figures['leaked_regions']
    assert figures['inferences_attempted'] >= 100
    assert figures['inferences_failed'] == 0
    assert figures['live_regions_removed'] == 0
    assert figures['live_clients_alive_at_end'] == 2
    assert figures['leaked_regions_left'] == 0 and figures['leaked_files_left'] == 0
    assert figures['backend_files_kept'] is True
