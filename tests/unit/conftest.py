"""Make ``ansible_collections.tritonops.shm`` importable under plain pytest (``make units``).

``ansible_collections`` is a namespace package: adding the collections root
(``build/`` when the tests run from build/ansible_collections/tritonops/shm)
to sys.path lets this collection's plugins be imported next to the ones the
``ansible`` package installs. ansible-test sets this up itself.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_COLLECTION = os.path.dirname(os.path.dirname(_HERE))
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_COLLECTION)))

if _COLLECTION.split(os.sep)[-3:] == ['ansible_collections', 'tritonops', 'shm'] and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
