"""numbaopt's airspeed-velocity suites (see ``asv.conf.json``; run them with ``make bench``).

The suites measure the working tree they sit in: the repository root goes first on ``sys.path``, so
``asv run --environment existing:...`` needs no installed copy of the package. Timings are for one
thread unless ``NUMBA_NUM_THREADS`` is set (it must be set before Numba is imported, hence here).
"""
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
