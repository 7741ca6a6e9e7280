"""The CUDA backend under Numba's simulator. These tests need ``NUMBA_ENABLE_CUDASIM=1`` set before numba
is imported, so they run in their own process (``tests/test_cuda_sim.py`` starts it); in any other
pytest process they are not collected.

The simulator runs each block's threads as Python threads while the launching thread polls them in a loop;
under the interpreter's default 5 ms switch interval the poller holds the GIL for most of each launch. A
0.1 ms interval hands the GIL to the simulated threads sooner: the suite's kernels run 2-3x faster (same
kernels, same results; only the interpreter's thread scheduling changes, and only in this process).
"""
import os
import sys

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    sys.setswitchinterval(1e-4)
