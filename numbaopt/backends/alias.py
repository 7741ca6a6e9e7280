"""Gradients that share memory with what a step writes.

An element loop reads ``g[i]`` before it writes ``x[i]`` and the state at the same ``i``, so a gradient that
*is* its own parameter is safe. A gradient that overlaps anything else the step writes is not: a shifted
view of its own parameter (``update_(s, b[1:7], b[0:6])``), another leaf's parameter (grads ``[b, a]`` for
the model ``[a, b]``), a state array. Such a gradient is copied before the step, so ``update_`` gives the
numbers ``update`` gives. The single-array kernels check their own arguments (a few nanoseconds, see
``_alias_lines`` in :mod:`numbaopt.compiler.cpu`); trees and device groups check here, on byte intervals:
the general path and the device groups with :func:`aliased_leaves` (one compiled call), the fast path
inside :func:`numbaopt.backends.abi.gather_lists` against a table made once per plan (:func:`fast_table`).
Both are written to compile quickly (plain loops; the sort of a plan's table is NumPy's, on the host): they
are compiled by every cold first step, whatever the rule.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..compiler.intrinsics import NO_NRT

__all__ = ["sorted_intervals", "fast_table", "fast_hits", "hits", "shares", "aliased_leaves"]


def sorted_intervals(lo, hi, own) -> np.ndarray:
    """The rows ``(lo, hi, running max of hi, owner)`` of the non-empty intervals ``[lo, hi)``, sorted by
    ``lo``: what :func:`hits` searches (``owner`` -1: not a parameter). NumPy on the host (once per fast
    plan): compiled, its sort alone took 1.2-2.1 s of a cold first step (docs/performance.md)."""
    lo, hi, own = np.asarray(lo, np.int64), np.asarray(hi, np.int64), np.asarray(own, np.int64)
    keep = np.flatnonzero(hi > lo)
    order = keep[np.argsort(lo[keep], kind="stable")]
    W = np.empty((order.shape[0], 4), dtype=np.int64)
    W[:, 0], W[:, 1], W[:, 3] = lo[order], hi[order], own[order]
    np.maximum.accumulate(W[:, 1], out=W[:, 2])
    return W


@njit(cache=True, error_model="numpy", inline="always")
def hits(W, lo, hi, own, start, stop) -> bool:
    """Whether the gradient interval ``[lo, hi)`` of leaf ``own`` overlaps a row ``start..stop-1`` of ``W``
    other than its own parameter's identical interval (binary search on the sorted starts; exact scan only
    on a hit)."""
    if hi <= lo:
        return False
    a, b = start, stop
    while a < b:  # a = the first row starting at or after hi
        m = (a + b) >> 1
        if W[m, 0] < hi:
            a = m + 1
        else:
            b = m
    if a == start or W[a - 1, 2] <= lo:
        return False
    for q in range(start, a):
        if W[q, 1] > lo and not (W[q, 3] == own and W[q, 0] == lo and W[q, 1] == hi):
            return True
    return False


def fast_table(lo, hi, own, param_ids, params_own: bool, arena_lo, arena_hi) -> np.ndarray:
    """The trees' fast-path table: the written intervals ``[lo, hi)`` of ``own`` (parameters and arenas, as
    :func:`sorted_intervals`) plus what makes the common case one probe.

    Two arrays that own their memory (NumPy's OWNDATA) never overlap unless they are the same array. So when
    every parameter owns its memory, a gradient that owns its memory overlaps what the step writes only by
    being another leaf's parameter (a hash probe of the parameters' object addresses) or by overlapping a
    state arena (a few intervals); other gradients (views) take the binary search. Rows: 0 the header
    ``(intervals, hash mask, params_own, arenas)``; then the sorted intervals; the arenas ``(lo, hi)``;
    the hash slots (object address, 0 = empty).
    """
    W = sorted_intervals(np.asarray(lo, np.int64), np.asarray(hi, np.int64), np.asarray(own, np.int64))
    n = len(param_ids)
    size = 1
    while size < 2 * max(n, 1):
        size *= 2
    H = np.zeros((size, 4), dtype=np.int64)
    for pid in param_ids:
        k = _slot.py_func(int(pid), size - 1)  # on the host: no compiled call (nor its compile)
        while H[k, 0] != 0:
            k = (k + 1) & (size - 1)
        H[k, 0] = pid
    A = np.zeros((len(arena_lo), 4), dtype=np.int64)
    A[:, 0], A[:, 1], A[:, 3] = arena_lo, arena_hi, -1
    head = np.array([[len(W), size - 1, int(params_own), len(A)]], dtype=np.int64)
    return np.concatenate([head, W, A, H])


@njit(cache=True, error_model="numpy", inline="always")
def _slot(addr, mask):
    return ((addr >> 4) ^ (addr >> 13)) & mask


@njit(cache=True, error_model="numpy", inline="always")
def fast_hits(T, g, gown, lo, hi, j, pid) -> bool:
    """Whether the gradient of leaf ``j`` (object address ``g``, owning its memory when ``gown``, interval
    ``[lo, hi)``) overlaps what the step writes, by the table of :func:`fast_table` (``pid``: leaf j's
    parameter object)."""
    nw, mask, na = T[0, 0], T[0, 1], T[0, 3]
    if not (gown and T[0, 2] != 0):
        return hits(T, lo, hi, j, 1, 1 + nw)
    if g != pid:  # not its own parameter: is it another leaf's?
        k = 1 + nw + na + _slot(g, mask)
        while T[k, 0] != 0:
            if T[k, 0] == g:
                return True
            k = 1 + nw + na + ((k - 1 - nw - na + 1) & mask)
    for q in range(1 + nw, 1 + nw + na):  # the arenas
        if T[q, 0] < hi and lo < T[q, 1]:
            return True
    return False


def shares(lo: int, hi: int, spans) -> bool:
    """Whether ``[lo, hi)`` overlaps one of a few ``(lo, hi)`` spans other than by being identical to it
    (a device leaf's gradient against its parameter and state arrays: a handful, no table needed)."""
    return hi > lo and any(a < hi and lo < b and not (a == lo and b == hi) for a, b in spans)


#: above this many leaves the host sorts the parameters' intervals for :func:`aliased_leaves` (NumPy's sort,
#: a few microseconds), below it the compiled insertion sort is quicker than the call
_PRESORT = 32
_NATURAL = np.empty(0, dtype=np.int64)


def aliased_leaves(xaddr, gaddr, nbytes, owner, alo, ahi, out) -> int:
    """The trees' general path, in one compiled call: ``out[k] = True`` where gradient ``k`` (at ``gaddr[k]``,
    ``nbytes[k]`` bytes; 0: not stepped) overlaps a parameter the kernels write (``xaddr``, same sizes) other
    than its own (``owner``: equal owners are the same leaf) or a state arena ``[alo, ahi)``. Returns the
    number of such gradients."""
    perm = np.argsort(xaddr, kind="stable") if len(xaddr) > _PRESORT else _NATURAL
    W = np.empty((len(xaddr) + len(alo), 4), dtype=np.int64)
    return _aliased(xaddr, gaddr, nbytes, owner, alo, ahi, out, W, perm)


@njit(cache=True, error_model="numpy", **NO_NRT)
def _aliased(xaddr, gaddr, nbytes, owner, alo, ahi, out, W, perm):
    """:func:`aliased_leaves` in the scratch rows ``W``, the parameters' intervals inserted in the order
    ``perm`` (empty: index order). Loops only, no NumPy functions and no allocation: it compiles in a fraction
    of a second, where ``np.argsort``, ``np.concatenate`` and boolean masks took 2.5-3 s (docs/performance.md)."""
    n, na = xaddr.shape[0], alo.shape[0]
    m = 0
    for q in range(n + na):  # insertion by start: the rows (lo, hi, -, owner), the running max after
        if q < n:
            k = perm[q] if perm.shape[0] else q
            lo, hi, ow = xaddr[k], xaddr[k] + nbytes[k], owner[k]
            if gaddr[k] == 0:
                continue
        else:
            lo, hi, ow = alo[q - n], ahi[q - n], np.int64(-1)
        if hi <= lo:
            continue
        r = m
        while r > 0 and W[r - 1, 0] > lo:
            W[r, 0], W[r, 1], W[r, 3] = W[r - 1, 0], W[r - 1, 1], W[r - 1, 3]
            r -= 1
        W[r, 0], W[r, 1], W[r, 3] = lo, hi, ow
        m += 1
    top = np.int64(0)
    for r in range(m):
        top = max(top, W[r, 1])
        W[r, 2] = top
    bad = 0
    for k in range(n):
        out[k] = gaddr[k] != 0 and hits(W, gaddr[k], gaddr[k] + nbytes[k], owner[k], 0, m)
        bad += out[k]
    return bad
