"""Gradients that share memory with what a step writes.

An element loop reads ``g[i]`` before it writes ``x[i]`` and the state at the same ``i``, so a gradient that
*is* its own parameter is safe. A gradient that overlaps anything else the step writes is not: a shifted
view of its own parameter (``update_(s, b[1:7], b[0:6])``), another leaf's parameter (grads ``[b, a]`` for
the model ``[a, b]``), a state array. Such a gradient is copied before the step, so ``update_`` gives the
numbers ``update`` gives. The single-array kernels check their own arguments (a few nanoseconds, see
``_aliased`` in :mod:`numbaopt.compiler.prelude`); trees check here, on byte intervals: the general path
with :func:`overlapping`, the fast path inside :func:`numbaopt.backends.abi.gather_lists` against a table
made once per plan (:func:`written_table`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["overlapping", "written_table", "intervals", "shares"]

try:  # NumPy 2 moved it
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # pragma: no cover - NumPy 1.x
    byte_bounds = np.byte_bounds


def intervals(arrays, addresses) -> tuple:
    """``(lo, hi)`` byte bounds of ``arrays`` (``addresses`` their data pointers; strided ones measured)."""
    n = len(arrays)
    lo = np.asarray(addresses, dtype=np.int64).copy()
    hi = np.empty(n, dtype=np.int64)
    for k, a in enumerate(arrays):
        if a.flags.c_contiguous:
            hi[k] = lo[k] + a.nbytes
        else:  # a strided view: the span of its elements
            lo[k], hi[k] = byte_bounds(a) if a.size else (lo[k], lo[k])
    return lo, hi


def written_table(lo, hi, own) -> np.ndarray:
    """The rows ``(lo, hi, running max of hi, owner)`` of the non-empty written intervals, sorted by ``lo``:
    what :func:`overlapping` and the trees' fast path search (``owner`` -1: not a parameter)."""
    lo, hi, own = (np.asarray(v, dtype=np.int64) for v in (lo, hi, own))
    keep = hi > lo
    lo, hi, own = lo[keep], hi[keep], own[keep]
    order = np.argsort(lo, kind="stable")
    W = np.empty((len(lo), 4), dtype=np.int64)
    W[:, 0], W[:, 1], W[:, 3] = lo[order], hi[order], own[order]
    if len(lo):
        W[:, 2] = np.maximum.accumulate(W[:, 1])
    return W


@njit(cache=True, error_model="numpy", inline="always")
def hits(W, lo, hi, own) -> bool:
    """Whether the gradient interval ``[lo, hi)`` of leaf ``own`` overlaps a row of ``W`` other than its own
    parameter's identical interval (binary search on the sorted starts; exact scan only on a hit)."""
    if hi <= lo:
        return False
    a, b = 0, W.shape[0]
    while a < b:  # a = the number of rows starting before hi
        m = (a + b) >> 1
        if W[m, 0] < hi:
            a = m + 1
        else:
            b = m
    if a == 0 or W[a - 1, 2] <= lo:
        return False
    for q in range(a):
        if W[q, 1] > lo and not (W[q, 3] == own and W[q, 0] == lo and W[q, 1] == hi):
            return True
    return False


@njit(cache=True, error_model="numpy")
def _overlapping(W, glo, ghi, gown, out):
    for k in range(glo.shape[0]):
        out[k] = hits(W, glo[k], ghi[k], gown[k])


def overlapping(W, glo, ghi, gown) -> np.ndarray:
    """A boolean per gradient interval: does it overlap a written interval of ``W`` (see :func:`hits`)?"""
    out = np.zeros(len(glo), dtype=np.bool_)
    if len(glo) and len(W):
        _overlapping(W, np.asarray(glo, np.int64), np.asarray(ghi, np.int64), np.asarray(gown, np.int64), out)
    return out


def shares(lo: int, hi: int, spans) -> bool:
    """Whether ``[lo, hi)`` overlaps one of a few ``(lo, hi)`` spans other than by being identical to it
    (a device leaf's gradient against its parameter and state arrays: a handful, no table needed)."""
    return hi > lo and any(a < hi and lo < b and not (a == lo and b == hi) for a, b in spans)
