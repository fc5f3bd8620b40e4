"""Import first in a benchmark: puts the rig, the integration helpers and the collection on sys.path.

Benchmarks run as scripts from the collection copy (``make bench`` runs them from
build/ansible_collections/tritonops/shm), so ``ansible_collections.tritonops.shm``
is importable from the copy's grandparent's parent.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(HERE))

for _path in (HERE, os.path.join(COLLECTION, 'tests', 'integration'), os.path.join(COLLECTION, 'tests', 'rig')):
    if _path not in sys.path:
        sys.path.insert(0, _path)
if COLLECTION.split(os.sep)[-3:] == ['ansible_collections', 'tritonops', 'shm']:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION))))
