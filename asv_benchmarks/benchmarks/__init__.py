"""numbaopt's airspeed-velocity suites (see ``asv.conf.json``; run them with ``make bench``).

The suites measure the numbaopt installed in the Python that runs them: in asv's own environments
(``asv run``/``asv continuous`` over commits) that is the commit under test, with ``make bench``
(``--environment existing:../.venv/bin/python``) the working tree, installed there in editable mode.
Only a Python without numbaopt falls back to the checkout these files sit in. Timings are for one
thread unless ``NUMBA_NUM_THREADS`` is set (it must be set before Numba is imported, hence here).
"""
import importlib.util
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
# putting the checkout first unconditionally would measure it instead of the commit asv installed
if importlib.util.find_spec("numbaopt") is None and REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
