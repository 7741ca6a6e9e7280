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

from ..compiler.intrinsics import NO_NRT, load_i32, load_i64  # NO_NRT: ~25 ns a leaf less in gather_lists
from .alias import fast_hits

__all__ = ["OK", "gather_lists", "data_pointers", "ARRAY_TYPE"]

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


@njit(cache=True, error_model="numpy", **NO_NRT)
def gather_lists(plist, glist, tab, dims, arraytype, out, W):
    """The trees' fast path: validate parameter and gradient leaves given as two Python lists.

    ``plist``/``glist`` are ``id()`` of two lists of ``n = tab.shape[0]`` objects; their item pointers
    are read directly (no Python ints are made). Row ``j`` of ``tab`` is ``(pid, writeable, ndim,
    dimstart, descr, dest)``: parameter ``j`` must be the object ``pid`` (the one seen when the plan was
    made); both leaves must be exact ndarrays, C-contiguous and aligned (the parameter writeable when
    ``writeable``), with the descriptor ``descr`` and shape ``dims[dimstart:dimstart + ndim]``. Data
    pointers go to ``out[0, dest]`` and ``out[1, dest]``; the parameter's must be ``xptr`` (columns 6 and 7 are
    the parameter's data pointer and byte size when the plan was made). Then every gradient is checked against
    ``W`` (:func:`numbaopt.backends.alias.fast_table` of the parameters, owner ``j``, and the state
    arenas): -2 when one overlaps something the step writes. Returns -1, ``j`` for a failed
    leaf, ``n`` when a list has the wrong length, or -2. Packed arguments: each array argument costs
    dispatch time. Runs with the GIL held, so the lists cannot change during the call.
    """
    n = tab.shape[0]
    if load_i64(plist + 16) != n or load_i64(glist + 16) != n:
        return n
    pitems = load_i64(plist + 24)
    gitems = load_i64(glist + 24)
    for j in range(n):
        p = load_i64(pitems + 8 * j)
        g = load_i64(gitems + 8 * j)
        if p != tab[j, 0] or load_i64(g + 8) != arraytype:
            return j
        nd = tab[j, 2]
        if load_i32(p + 24) != nd or load_i32(g + 24) != nd:
            return j
        pd = load_i64(p + 32)
        gd = load_i64(g + 32)
        s = tab[j, 3]
        for k in range(nd):
            if load_i64(pd + 8 * k) != dims[s + k] or load_i64(gd + 8 * k) != dims[s + k]:
                return j
        pf = load_i32(p + 64)
        gf = load_i32(g + 64)
        if (pf & 0x101) != 0x101 or (gf & 0x101) != 0x101:
            return j
        if tab[j, 1] != 0 and (pf & 0x400) == 0:
            return j
        if load_i64(p + 56) != tab[j, 4] or load_i64(g + 56) != tab[j, 4]:
            return j
        d = tab[j, 5]
        xp = load_i64(p + 16)
        if xp != tab[j, 6]:
            return j
        out[0, d] = xp
        gp = load_i64(g + 16)
        out[1, d] = gp
        # aliasing, against the parameters' addresses of the plan (each is verified in its own row)
        if fast_hits(W, g, (gf & OWNDATA) != 0, gp, gp + tab[j, 7], j, tab[j, 0]):
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
