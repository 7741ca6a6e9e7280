"""The CUDA backend under Numba's simulator. These tests need ``NUMBA_ENABLE_CUDASIM=1`` set before numba
is imported, so they run in their own process (``tests/test_cuda_sim.py`` starts it); in any other
pytest process they are not collected."""
import os

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    collect_ignore_glob = ["test_*.py"]
