"""The CUDA backend under Numba's simulator. These tests need ``NUMBA_ENABLE_CUDASIM=1`` set before numba
is imported, so they run in their own process (``tests/test_cuda_sim.py`` starts it); in any other
pytest process they are not collected.

Two changes to the simulator's process, neither to the kernels:

* The simulator runs each block's threads as Python threads while the launching thread polls them in a loop;
  under the interpreter's default 5 ms switch interval the poller holds the GIL for most of each launch. A
  0.1 ms interval hands the GIL to the simulated threads sooner: the suite's kernels run 2-3x faster.
* ``cuda.shared.array`` is made atomic (:func:`_shared_array`). The simulator (numba-cuda 0.21-0.30 at least)
  gives a block's threads one array per call site by looking the site up in a dict and inserting a new array
  when it is missing, without a lock: two threads that both miss each insert their own, and one thread then
  reduces into an array the others never read (a block sum short by that thread's share). Rare under the 5 ms
  interval, it failed a CI run under the 0.1 ms one (an Adafactor tree 4% off the CPU). On a GPU a shared array
  is one per block by construction; the lock makes the simulator do what the hardware does.
"""
import os
import sys
import threading

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    import numpy as np
    from numba.cuda.simulator import kernelapi

    sys.setswitchinterval(1e-4)
    _SHARED_LOCK = threading.Lock()
    _simulators_array = kernelapi.FakeCUDAShared.array

    def _shared_array(self, shape, dtype, alignment=None):
        """``FakeCUDAShared.array`` with its find-or-insert under a lock: one array per (file, line) of the
        caller and kernel launch, as the simulator keys them (dynamic shared memory and ``alignment`` go to
        the simulator's own code, which takes no per-site decision)."""
        if shape == 0 or alignment is not None:
            return _simulators_array(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno)
        with _SHARED_LOCK:
            found = self._allocations.get(site)
            if found is None:
                if isinstance(dtype, kernelapi.types.Type):
                    dtype = kernelapi.numpy_support.as_dtype(dtype)
                found = self._allocations[site] = np.empty(shape, dtype)
        return found

    kernelapi.FakeCUDAShared.array = _shared_array
