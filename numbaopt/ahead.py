"""``precompile(state, model)``: compile ahead of time every kernel a state will need, so that the first real
step is as fast as the others (notebooks, benchmarks, services that must answer their first request quickly).

The kernels' types depend on the rules, the dtypes and the array kinds, not on the sizes: a tree's kernels take
data addresses and flat state arenas, one array's kernels take flat arrays. So the work is done on stand-ins:
a fresh state of the same rules and dtypes over small arrays (the same number of dimensions, at most 2
elements along each), stepped like the real one would be (in place twice, so the fast path's helpers compile
too; pure; threaded). Nothing of the caller's state or model is read beyond its rules, dtypes and shapes, and
nothing is written: parameters, state arrays, counters and hyperparameters stay byte-identical. The
compilation lands in Numba's memory (and, for the kernels, in the disk cache for later processes).
"""
from __future__ import annotations

from typing import Any, TypeVar, cast

import numpy as np

from .api import setup, update, update_
from .backends.cpu import parallel_threshold, step_array
from .backends.cuda import DeviceGroup, DeviceLeaf
from .backends.state import Leaf
from .compiler.notice import register
from .tree.state import StateTree, core

__all__ = ["precompile"]

S = TypeVar("S", Leaf, StateTree)


def _small(shape) -> tuple:
    return tuple(min(int(d), 2) for d in shape)


def _try(step, *args, **kw) -> None:
    """One stand-in step. A rule refusing it (its values are not the caller's) still compiled what it ran;
    the steps after it compile the rest."""
    try:
        step(*args, **kw)
    except ValueError:
        pass


def _like(a: Any, shape, dtype, fill) -> np.ndarray:
    """A small stand-in for ``a`` (an array or None): ``shape`` and ``dtype``, read-only where ``a`` is."""
    out = np.full(shape, fill, dtype=dtype)
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        out.flags.writeable = False
    return out


def _leaf(state: Leaf, model: Any, grads: Any, inplace: bool, pure: bool, threaded: bool) -> None:
    shape = _small(state.shape)
    x = _like(model, shape, state.param_dtype, 1.0)
    gdt = grads.dtype if isinstance(grads, np.ndarray) else state.param_dtype
    g = _like(grads, shape, gdt, 0.5)
    stand = setup(state.rule, x)
    if pure:
        _try(update, stand, x, g)
    if inplace:
        for _ in range(2):  # the second: the bound fast call of a 1-D array
            _try(update_, stand, x, g)
    if threaded:
        for mode in ((True,) if inplace else ()) + ((False,) if pure else ()):
            _try(step_array, stand, x, g, mode, par=True)


def _tree(state: StateTree, inplace: bool, pure: bool) -> None:
    c = core(state, "precompile")
    if c.device_groups:
        raise NotImplementedError("precompile: a state with device leaves (the GPU kernels are compiled on "
                                  "first use)")
    s = c.structure
    units = range(s.n_unique)
    model = [np.full(_small(s.u_shape[u]), 1.0, dtype=s.u_dtype[u]) for u in units]
    rules = {id(model[u]): c.groups[s.u_group[u]].rule for u in units}
    stand = setup(lambda path, x: rules[id(x)], model)  # the same rules in the same order: the same groups
    grads = [np.full_like(x, 0.5) for x in model]
    if pure:
        _try(update, stand, model, grads)
    if inplace:
        for _ in range(2):  # the first plans the fast path, the second takes it
            _try(update_, stand, model, grads)
    sc = core(stand, "precompile")
    if len(sc.groups) > 1:  # a step of some groups only (the others' gradients None): reductions apart
        for grp in sc.groups:
            mine = set(grp.members)
            part = [g if u in mine else None for u, g in enumerate(grads)]
            if pure:
                _try(update, stand, model, part)
            if inplace:
                _try(update_, stand, model, part)


def precompile(state: S, model: Any = None, grads: Any = None, *, threaded: bool | None = None, pure: bool = True,
               inplace: bool = True) -> S:
    """Compile now every kernel ``state`` will need, so that no later step compiles; returns ``state``.

    ``state``: what :func:`numbaopt.setup` returned for one array (a :class:`numbaopt.Leaf`) or a nested model
    (a state tree). ``inplace`` compiles what :func:`numbaopt.update_` runs (for a tree, its fast path's helpers
    too), ``pure`` what :func:`numbaopt.update` runs. ``threaded``: the threaded kernels of one array too
    (``None``: when the array has at least :func:`numbaopt.parallel_threshold` elements; a tree's kernels are
    serial). ``model`` and ``grads`` (optional): for one array, a read-only parameter or gradient, or a gradient
    of another dtype, take kernels of their own, so pass them when they are unusual; a tree's kernels depend on
    its rules and dtypes only.

    The work is done on small stand-in arrays of the same dtypes and rules, stepped in place twice and once
    pure: nothing of ``state`` or ``model`` is written (parameters, state arrays, counters and
    hyperparameters stay byte-identical), and no copy of a large model is made. Compiled kernels are kept in
    Numba's disk cache, so a later process loads them instead of compiling. Device states are refused
    (``NotImplementedError``). See docs/performance.md, "Compile ahead and the compile notice".

    >>> import numpy as np, numbaopt as no
    >>> model = {"w": np.zeros((3, 2)), "b": np.zeros(2)}
    >>> state = no.precompile(no.setup(no.Adam(1e-3), model), model)
    >>> state, model = no.update_(state, model, {"w": np.ones((3, 2)), "b": np.ones(2)})   # compiles nothing
    """
    t = type(state)
    if t is Leaf:
        if threaded is None:
            threaded = cast(Leaf, state).size >= parallel_threshold()
        _leaf(cast(Leaf, state), model, grads, inplace, pure, bool(threaded))
    elif t is StateTree:
        _tree(cast(StateTree, state), inplace, pure)
    elif t is DeviceLeaf or t is DeviceGroup:
        raise NotImplementedError(f"precompile: a {t.__name__} (the GPU kernels are compiled on first use)")
    elif hasattr(t, "_numbaopt_step_"):
        raise NotImplementedError(f"precompile: a {t.__name__} (precompile a local state of the same rules)")
    else:
        raise TypeError(f"precompile: expected a state from numbaopt.setup, got {t.__name__}")
    return state


register(precompile, quiet=True)  # the compile notice: the caller chose to pay here (logged at INFO)
