"""CPU backend: one array's step through the generated kernels (serial or threaded), and the bound fast call.

:func:`step_array` is the whole step of one array, pure or in place: validate, evaluate the schedules,
run ONE kernel call (which does every reduction before its first write, so a refusal writes nothing),
then hand back the parameter (written in place, or a new array where the old one may not be written).
Trees go through :mod:`numbaopt.tree.step`, which runs the many-leaf kernels of the same module.
"""
from __future__ import annotations

import os

import numpy as np

from ..compiler.layout import ALIASED, STEPPED
from . import pool
from .cuda.arrays import is_device_array
from .state import Leaf, check_grad, status_error

__all__ = ["parallel_threshold", "set_parallel_threshold", "run_inplace", "run_outplace", "bind_inplace",
           "step_array", "new_readonly"]

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


def run_inplace(leaf: Leaf, x1, g1, hp=None, par=None) -> int:
    """One step on flat contiguous ``x1`` (written) and ``g1``; state and counters written in place.
    A gradient overlapping ``x1`` or the state (a shifted view of the parameter) is copied first.
    ``par``: the threaded kernel (True) or the serial one (False); None: by the parallel threshold."""
    k = leaf.kernels()
    f = k.inplace_par if (x1.shape[0] >= _threshold[0] if par is None else par) else k.inplace
    hp = leaf.hp if hp is None else hp
    status = f(x1, g1, *leaf.arrays, hp, leaf.counters)
    if status == ALIASED:  # the kernel checked before touching anything: step on a copy
        status = f(x1, g1.copy(), *leaf.arrays, hp, leaf.counters)
    return status


def run_outplace(leaf: Leaf, x1, g1, xo, so, counters, hp=None, par=None) -> int:
    """One step reading ``x1``, ``g1`` and ``leaf.arrays``; writing ``xo``, the arrays ``so`` and ``counters``
    (a gradient overlapping what is written is copied first). ``par``: see :func:`run_inplace`. A chain whose
    ``layout.pure_by_copy`` copies ``x1`` and the state into ``xo`` and ``so`` and steps those in place."""
    k = leaf.kernels()
    par = x1.shape[0] >= _threshold[0] if par is None else par
    hp = leaf.hp if hp is None else hp
    if leaf.layout.pure_by_copy:  # the in-place kernel on copies (ChainLayout.pure_by_copy)
        xo[:] = x1
        for o, a in zip(so, leaf.arrays):
            if o is not a:
                o[:] = a
        f = k.inplace_par if par else k.inplace
        status = f(xo, g1, *so, hp, counters)
        if status == ALIASED:  # only the state stepped in place can overlap the gradient
            status = f(xo, g1.copy(), *so, hp, counters)
        return status
    f = k.outplace_par if par else k.outplace
    status = f(x1, g1, *leaf.arrays, hp, counters, xo, *so)
    if status == ALIASED:
        status = f(x1, g1.copy(), *leaf.arrays, hp, counters, xo, *so)
    return status


def bind_inplace(leaf: Leaf):
    """A Python callable ``(x, g) -> status`` with kernel, state, hyperparameters and counters bound as
    default arguments (cheaper per call than unpacking ``*leaf.arrays``).

    ``x`` and ``g`` must be 1-D, C-contiguous, aligned, writeable arrays of the leaf's dtype and size
    (``update_`` checks this; a gradient overlapping ``x`` or the state returns ``ALIASED``, nothing done):
    below the parallel threshold the serial kernel's compiled entry point for exactly those types is called,
    skipping Numba's dispatch (~0.4 µs of a ~1 µs call on a small array).
    """
    k = leaf.kernels()
    a, hp, C, n, th = leaf.arrays, leaf.hp, leaf.counters, leaf.size, _threshold
    ser, par = k.inplace, k.inplace_par
    if n < th[0]:
        try:  # compile (or load from the disk cache) only what this size runs
            from numba import from_dtype, typeof, types
            xt = types.Array(from_dtype(leaf.dtype), 1, "C")
            sig = (xt, xt) + tuple(typeof(s) for s in a) + (typeof(hp), typeof(C))
            got = ser.overloads.get(sig)  # made already (numbaopt.precompile): no trip through the compiler lock
            ser = got.entry_point if got is not None else ser.compile(sig)
        except Exception:  # no compiled code to bind (e.g. NUMBA_DISABLE_JIT): the dispatcher decides
            ser = k.inplace
    # the threshold is read at every call: set_parallel_threshold applies to bound states too
    if len(a) == 0:
        return lambda x, g: (ser if n < th[0] else par)(x, g, hp, C)
    if len(a) == 1:
        return lambda x, g, a0=a[0]: (ser if n < th[0] else par)(x, g, a0, hp, C)
    if len(a) == 2:
        return lambda x, g, a0=a[0], a1=a[1]: (ser if n < th[0] else par)(x, g, a0, a1, hp, C)
    if len(a) == 3:
        return lambda x, g, a0=a[0], a1=a[1], a2=a[2]: (ser if n < th[0] else par)(x, g, a0, a1, a2, hp, C)
    return lambda x, g: (ser if n < th[0] else par)(x, g, *a, hp, C)


def new_readonly(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only (the new value of a read-only parameter is read-only too)."""
    a.flags.writeable = False
    return a


def _check_x(leaf: Leaf, x, where):
    if type(x) is not np.ndarray:
        raise TypeError(f"{where}: expected a numpy array, got {type(x).__name__}")
    if x.dtype != leaf.param_dtype:
        raise TypeError(f"{where}: dtype {x.dtype}, but the state was set up for {leaf.param_dtype}")
    if x.shape != leaf.shape:
        raise ValueError(f"{where}: shape {x.shape}, but the state was set up for shape {leaf.shape}")


def _result(x, new_flat):
    """The new parameter: ``new_flat`` shaped like ``x``, read-only when ``x`` is."""
    out = new_flat.reshape(x.shape)
    return out if x.flags.writeable else new_readonly(out)


def step_array(leaf: Leaf, x, g, inplace: bool, where=("x", "g"), par=None):
    """One step of ``leaf`` on the array ``x`` with gradient ``g``: ``(state, x)``.

    In place: the state is written; ``x`` too when it is writeable (a strided view is stepped through a
    contiguous copy written back), else a new read-only array is returned. Pure: a new state and a new
    parameter array, the inputs untouched. A ``None`` gradient skips the step (pure: a copy of the state).
    Anything refused raises before the first write. ``par``: the threaded kernels (True), the serial ones
    (False), or by the parallel threshold (None).
    """
    _check_x(leaf, x, where[0])
    if g is None:
        return (leaf, x) if inplace else (leaf.copy(), x)
    if is_device_array(g):
        raise TypeError(f"{where[1]}: a device array ({type(g).__name__}) on the GPU for a host parameter (no silent "
                        "copies: copy it to the host yourself)")
    g1 = check_grad(g, leaf.param_dtype, leaf.shape, where[1], leaf.dtype).reshape(-1)
    if not g1.flags.c_contiguous:
        g1 = np.ascontiguousarray(g1)
    hp = leaf.step_hp()  # schedules checked before anything is written
    master = leaf.master
    if not inplace:
        x1 = master if master is not None else np.ascontiguousarray(x).reshape(-1)
        xo = pool.empty(leaf.size, leaf.dtype)
        out = [pool.empty_like(a) for a in leaf.arrays]
        counters = leaf.counters.copy()
        status = run_outplace(leaf, x1, g1, xo, out, counters, hp, par)
        if status >= 2:
            raise status_error(leaf.rule, status, where[1])
        new = leaf.derive(out, counters, master=xo if master is not None else None)
        if hp is not leaf.hp:
            new.hp[:] = hp
        return new, _result(x, xo.astype(leaf.param_dtype) if master is not None else xo)
    if master is not None:
        status = run_inplace(leaf, master, g1, hp, par)
        if status >= 2:
            raise status_error(leaf.rule, status, where[1])
        leaf.hp[:] = hp
        if status == STEPPED:  # the master moved: round it into the parameter
            if x.flags.writeable:
                x[...] = master.reshape(x.shape)
            else:
                x = new_readonly(master.astype(leaf.param_dtype).reshape(x.shape))
        return leaf, x
    if x.flags.writeable and x.flags.c_contiguous:
        status = run_inplace(leaf, x.reshape(-1), g1, hp, par)
    elif x.flags.writeable:
        tmp = np.ascontiguousarray(x).reshape(-1)
        status = run_inplace(leaf, tmp, g1, hp, par)
        if status == STEPPED:
            x[...] = tmp.reshape(x.shape)  # write through to the base of a strided view
    else:
        x1 = np.ascontiguousarray(x).reshape(-1)
        xo = np.empty_like(x1)
        status = run_outplace(leaf, x1, g1, xo, leaf.arrays, leaf.counters, hp, par)  # the state in place
        if status < 2:
            x = new_readonly(xo.reshape(x.shape))
    if status >= 2:
        raise status_error(leaf.rule, status, where[1])
    if hp is not leaf.hp:
        leaf.hp[:] = hp
    return leaf, x
