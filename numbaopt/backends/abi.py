"""Reading NumPy array headers from compiled code, given ``id(array)``.

``x.ctypes.data`` or ``x.__array_interface__`` costs microseconds per array, too slow for a tree of
1000 leaves; ``id(x)`` costs ~30 ns. On CPython with NumPy, ``id(x)`` is the address of the
``PyArrayObject`` whose header holds the data pointer, ``nd``, the dimensions, the descriptor and the
flags. :func:`gather_lists` reads those for many arrays in one compiled call, validates them (type, shape,
C-contiguity, alignment, writeability, dtype) and returns the data addresses.

The layout is verified at import against ``x.ctypes.data``/``x.shape``/``x.flags`` for a few arrays
(with ``ctypes``, no compilation); when anything disagrees :data:`OK` is False and the tree engine
uses its general path only.
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np
from numba import njit

from ..compiler.intrinsics import NO_NRT, load_i32, load_i64, store_i64  # NO_NRT: ~25 ns a leaf less in gather_lists
from .alias import fast_hits

__all__ = ["OK", "gather_lists", "data_pointers", "ARRAY_TYPE", "TAB_COLS"]

#: ``id(np.ndarray)``: what the header of an exact ndarray points to
ARRAY_TYPE = id(np.ndarray)

OB_TYPE, DATA, ND, DIMS, DESCR, FLAGS = 8, 16, 24, 32, 56, 64
C_CONTIGUOUS, OWNDATA, ALIGNED, WRITEABLE = 0x1, 0x4, 0x100, 0x400
LIST_SIZE, LIST_ITEMS = 16, 24  # PyListObject: ob_size, ob_item


def _i64(addr):
    return ctypes.c_int64.from_address(addr).value


def _i32(addr):
    return ctypes.c_int32.from_address(addr).value


def _verify() -> bool:
    if sys.byteorder != "little" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    try:
        base = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
        samples = [np.zeros(5, np.float32), base, base[:, ::2], base.T, np.zeros((), np.complex64),
                   np.zeros((0, 3), np.float32)]
        ro = np.ones(3, np.float32)
        ro.flags.writeable = False
        samples.append(ro)
        for x in samples:
            a = id(x)
            if _i64(a + OB_TYPE) != id(np.ndarray) or _i64(a + DATA) != x.ctypes.data:
                return False
            if _i32(a + ND) != x.ndim or _i64(a + DESCR) != id(x.dtype):
                return False
            dims = _i64(a + DIMS)
            if tuple(_i64(dims + 8 * k) for k in range(x.ndim)) != x.shape:
                return False
            fl = _i32(a + FLAGS)
            if bool(fl & C_CONTIGUOUS) != x.flags.c_contiguous or bool(fl & WRITEABLE) != x.flags.writeable \
                    or bool(fl & ALIGNED) != x.flags.aligned or bool(fl & OWNDATA) != x.flags.owndata:
                return False
        items = [object(), 1.5, "x"]
        if _i64(id(items) + OB_TYPE) != id(list) or _i64(id(items) + LIST_SIZE) != 3:
            return False
        if [_i64(_i64(id(items) + LIST_ITEMS) + 8 * k) for k in range(3)] != [id(v) for v in items]:
            return False
        return True
    except Exception:  # pragma: no cover - any surprise disables the fast path
        return False


#: whether the header layout was verified on this interpreter (else the trees never take the fast path)
OK = _verify()


#: the columns of a row of :func:`gather_lists`'s table
TAB_COLS = 8


@njit(cache=True, error_model="numpy", **NO_NRT)
def gather_lists(plist, glist, n, tab, dims, arraytype, xout, gout, table):
    """The trees' fast path: validate parameter and gradient leaves given as two Python lists.

    ``plist``/``glist`` are ``id()`` of two lists of ``n`` objects; their item pointers are read directly (no
    Python ints are made). ``tab``, ``dims``, ``xout``, ``gout`` and ``table`` are the addresses of C-contiguous
    int64 arrays that the caller keeps alive: the ``(n, 8)`` table, the shapes, the two outputs and
    :func:`numbaopt.backends.alias.fast_table`. Row ``j`` of ``tab`` is ``(pid, writeable, ndim, dimstart,
    descr, dest, xptr, nbytes)``: parameter ``j`` must be the object ``pid`` (the one seen when the plan was
    made); both leaves must be exact ndarrays, C-contiguous and aligned (the parameter writeable when
    ``writeable``), with the descriptor ``descr`` and shape ``dims[dimstart:dimstart + ndim]``; the parameter's
    data pointer must be ``xptr``. Data pointers go to ``xout[dest]`` and ``gout[dest]``. Then every
    gradient is checked against ``table`` (the parameters, owner ``j``, and the state arenas): -2 when one
    overlaps something the step writes. Returns -1, ``j`` for a failed leaf, ``n`` when a list has the wrong
    length, or -2. Integers only: each array argument costs dispatch time, and its indexing compile time (this
    compiles in every cold first step). Runs with the GIL held, so the lists cannot change during the call.
    """
    if load_i64(plist + LIST_SIZE) != n or load_i64(glist + LIST_SIZE) != n:
        return n
    pitems = load_i64(plist + LIST_ITEMS)
    gitems = load_i64(glist + LIST_ITEMS)
    for j in range(n):
        p = load_i64(pitems + 8 * j)
        g = load_i64(gitems + 8 * j)
        row = tab + 8 * TAB_COLS * j
        if p != load_i64(row) or load_i64(g + OB_TYPE) != arraytype:
            return j
        nd = load_i64(row + 16)
        if load_i32(p + ND) != nd or load_i32(g + ND) != nd:
            return j
        pd = load_i64(p + DIMS)
        gd = load_i64(g + DIMS)
        s = dims + 8 * load_i64(row + 24)
        for k in range(nd):
            want = load_i64(s + 8 * k)
            if load_i64(pd + 8 * k) != want or load_i64(gd + 8 * k) != want:
                return j
        pf = load_i32(p + FLAGS)
        gf = load_i32(g + FLAGS)
        if (pf & 0x101) != 0x101 or (gf & 0x101) != 0x101:  # C_CONTIGUOUS | ALIGNED
            return j
        if load_i64(row + 8) != 0 and (pf & WRITEABLE) == 0:
            return j
        descr = load_i64(row + 32)
        if load_i64(p + DESCR) != descr or load_i64(g + DESCR) != descr:
            return j
        xp = load_i64(p + DATA)
        if xp != load_i64(row + 48):
            return j
        d = load_i64(row + 40)
        gp = load_i64(g + DATA)
        store_i64(xout + 8 * d, xp)
        store_i64(gout + 8 * d, gp)
        # aliasing, against the parameters' addresses of the plan (each is verified in its own row)
        if fast_hits(table, g, (gf & OWNDATA) != 0, gp, gp + load_i64(row + 56), j, p):
            return -2
    return -1


@njit(cache=True, error_model="numpy", **NO_NRT)
def data_pointers(ids, arraytype, out):
    """``out[j]`` = the data pointer of the ndarray at address ``ids[j]`` (objects alive for the call).
    Returns -1, or the first ``j`` that is not an exact ndarray (its header is not read)."""
    for j in range(ids.shape[0]):
        if load_i64(ids[j] + 8) != arraytype:
            return j
        out[j] = load_i64(ids[j] + 16)
    return -1
