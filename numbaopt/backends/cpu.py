"""CPU backend: runs the generated kernels on one array (serial or threaded) or on many leaves at once."""
from __future__ import annotations

import os

import numpy as np

__all__ = ["parallel_threshold", "set_parallel_threshold", "run_inplace", "run_outplace", "raise_status"]

_threshold = [int(os.environ.get("NUMBAOPT_PARALLEL_THRESHOLD", 1 << 20))]


def parallel_threshold() -> int:
    """Arrays with at least this many elements use the threaded (``prange``) kernel."""
    return _threshold[0]


def set_parallel_threshold(n: int) -> int:
    """Set the size from which the threaded kernel is used (``NUMBAOPT_PARALLEL_THRESHOLD`` sets the
    initial value). Serial and threaded kernels give bitwise identical results. Returns the old value."""
    n = int(n)
    if n < 0:
        raise ValueError(f"parallel threshold must be >= 0, got {n}")
    old, _threshold[0] = _threshold[0], n
    return old


def raise_status(leaf, status: int, where: str = "") -> None:
    """Turn a kernel's non-zero status into the rule's error (status >= 2)."""
    if status >= 2:
        rule = leaf.rule.rules[status - 2]
        msg = getattr(type(rule), "error_message", "reduction reported an error")
        raise ValueError(f"{where + ': ' if where else ''}{type(rule).__name__}: {msg}")


def run_inplace(leaf, x1, g1) -> int:
    """One step on flat contiguous ``x1`` (written) and ``g1``; state written in place."""
    k = leaf.kernels()
    f = k.inplace_par if x1.shape[0] >= _threshold[0] else k.inplace
    return f(x1, g1, *leaf.arrays, leaf.hp, leaf.t + 1)


def run_outplace(leaf, x1, g1, xo, so) -> int:
    """One step reading ``x1``, ``g1`` and ``leaf.arrays``; writing ``xo`` and the arrays ``so``."""
    k = leaf.kernels()
    f = k.outplace_par if x1.shape[0] >= _threshold[0] else k.outplace
    return f(x1, g1, *leaf.arrays, leaf.hp, leaf.t + 1, xo, *so)


def bind_inplace(leaf):
    """A Python callable ``(x, g, t) -> status`` with kernels, state and hyperparameters bound as
    default arguments (cheaper per call than unpacking ``*leaf.arrays``).

    ``x`` and ``g`` must be 1-D, C-contiguous, aligned, writeable arrays of the leaf's dtype and size
    (``update_`` checks this): below the parallel threshold the serial kernel's compiled entry point
    for exactly those types is called, skipping Numba's dispatch (≈ 0.4 µs of a ≈ 1 µs call on a
    small array). Above it, and wherever no entry point can be had, the dispatcher is called.
    """
    k = leaf.kernels()
    ser, par, hp, th = k.inplace, k.inplace_par, leaf.hp, _threshold
    a = leaf.arrays
    n = leaf.size
    if n < th[0]:  # compile (or load from the disk cache) only what this size will run
        try:
            from numba import from_dtype, typeof, types
            xt = types.Array(from_dtype(leaf.dtype), 1, "C")
            ser = ser.compile((xt, xt) + tuple(typeof(s) for s in a) + (typeof(hp), typeof(1)))
        except Exception:  # no compiled code to bind (e.g. NUMBA_DISABLE_JIT): the dispatcher decides
            ser = k.inplace
    if len(a) == 0:
        return lambda x, g, t: (ser if n < th[0] else par)(x, g, hp, t)
    if len(a) == 1:
        return lambda x, g, t, a0=a[0]: (ser if n < th[0] else par)(x, g, a0, hp, t)
    if len(a) == 2:
        return lambda x, g, t, a0=a[0], a1=a[1]: (ser if n < th[0] else par)(x, g, a0, a1, hp, t)
    if len(a) == 3:
        return lambda x, g, t, a0=a[0], a1=a[1], a2=a[2]: \
            (ser if n < th[0] else par)(x, g, a0, a1, a2, hp, t)
    return lambda x, g, t: (ser if n < th[0] else par)(x, g, *a, hp, t)
