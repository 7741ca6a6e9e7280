"""The CUDA runtime: imports ``numba.cuda`` (on first use of the backend, never at ``import numbaopt``).

It holds what generated CUDA modules import (:func:`leaf_ptr`), the state-filling kernel, the launch
constants and the registry of generated CUDA modules. Under Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1`` before numba is imported) it generates for the simulator.
"""
from __future__ import annotations

import ctypes

import numpy as np
from numba import cuda

from ...compiler import cuda as emit
from ...compiler.cache import cached, import_generated, rule_key
from ...compiler.inliner import STAMP as INLINER_STAMP, finish_source
from ...compiler.layout import ChainLayout

__all__ = ["SIM", "TPB", "CHUNK", "NO_STATUS", "leaf_ptr", "fill", "kernels", "simulator"]


def simulator() -> bool:
    """Whether Numba's CUDA simulator is active (``NUMBA_ENABLE_CUDASIM=1`` before importing numba)."""
    return "simulator" in getattr(cuda.jit, "__module__", "")


SIM = simulator()
#: threads per block, and elements per block in the multi-leaf kernels (small in the simulator, where every
#: thread is a Python thread started per launch, ~0.3 ms each: 8 threads still reduce a block in shared memory in
#: three halvings, and the suite's leaves still span several blocks)
TPB = 8 if SIM else 256
CHUNK = TPB * (2 if SIM else 8)
NO_STATUS = emit.NO_STATUS

if SIM:
    def leaf_ptr(addr, n, dtype):
        """Simulator: the NumPy array of ``n`` items of ``dtype`` at host address ``addr``."""
        dt = np.dtype(dtype)
        n = int(n)
        if n == 0:
            return np.empty(0, dtype=dt)
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(int(addr))
        return np.frombuffer(buf, dtype=dt)
else:
    from numba.cuda import types as _nbtypes
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def leaf_ptr(typingctx, addr, n, dtype):
        """``leaf_ptr(address, n, np.float32) -> float32*`` in a kernel (``n`` is for the simulator)."""
        if isinstance(dtype, _nbtypes.NumberClass):
            elem = dtype.instance_type
        elif isinstance(dtype, _nbtypes.DType):
            elem = dtype.dtype
        else:
            return None
        if not isinstance(addr, _nbtypes.Integer):
            return None
        sig = _nbtypes.CPointer(elem)(addr, n, dtype)

        def gen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(_nbtypes.CPointer(elem)))

        return sig, gen


@cuda.jit(cache=True)
def fill(a, v):
    """``a[:] = v`` on the device (state initialisation without a host buffer)."""
    i = cuda.grid(1)
    s = cuda.gridsize(1)
    while i < a.shape[0]:
        a[i] = v
        i += s


def kernels(rule, dtype):
    """The generated CUDA module for ``rule`` and ``dtype`` (imported once per process); ``mod.plan`` is
    its :class:`numbaopt.compiler.cuda.Plan`."""
    dtype = np.dtype(dtype)
    key = ("cuda", SIM, tuple(rule_key(r) for r in rule.rules), dtype.str)

    def make():
        mod = import_generated(emit.raw_source(rule, dtype, SIM, TPB, CHUNK), prefix="cuda_",
                               finish=finish_source, stamp=INLINER_STAMP)
        mod.plan = emit.Plan(ChainLayout(rule))
        return mod

    return cached(key, make)
