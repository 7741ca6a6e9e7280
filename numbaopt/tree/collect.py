"""The first phase of a tree step: read the model and gradient leaves and check them against the state.

Nothing is written here. Every mismatch is a ``TypeError``/``ValueError`` naming the path in the tree
(``grads['enc'].w``). The result, per unit (trained array, tied positions counted once): the parameter,
what the writeability trait says of it, and its gradient (cast to the compute dtype; tied gradients
summed; ``None`` for a ``None`` gradient or a frozen leaf).
"""
from __future__ import annotations

import numbers

import numpy as np

from ..backends.cuda.arrays import check_device_param, check_tree_grad, host_grad_error
from ..backends.state import check_grad
from .params import ND_READONLY, ND_WRITEABLE, param_info
from .paths import where
from .state import TreeCore
from .structure import walk_leaves

__all__ = ["collect", "check_leaf"]


def check_leaf(info, x, dtype, shape, w):
    """A model leaf against what the state was set up for."""
    if info is None:
        raise TypeError(f"{w}: expected a {dtype} parameter of shape {shape}, got {type(x).__name__}")
    if info.dtype != dtype:
        raise TypeError(f"{w}: dtype {info.dtype}, but the state was set up for {dtype}")
    if tuple(info.shape) != shape:
        raise ValueError(f"{w}: shape {tuple(info.shape)}, but the state was set up for shape {shape}")
    if info.backend == "cuda":  # contiguous and writeable: checked here, before any group writes
        check_device_param(x, w)


def _host_grad(g, dtype, shape, compute, w):
    if type(g) is not np.ndarray and not isinstance(g, (np.ndarray, numbers.Number)):
        try:
            info = param_info(g)
        except TypeError as e:
            raise TypeError(f"{w}: {e}") from None
        if info is None:
            raise TypeError(f"{w}: expected a {dtype} array of shape {shape} (or None), got {type(g).__name__}")
        if info.backend != "cpu":
            raise host_grad_error(g, w)
        g = np.asarray(info.to_array(g))
    return check_grad(g, dtype, shape, w, compute)


def collect(c: TreeCore, model, grads):
    """``(xu, iu, gu)``: per unit the parameter, its ``ParamInfo`` and its gradient (or None)."""
    s = c.structure
    n = len(s.paths)
    xs = [None] * n
    walk_leaves(s.root, model, "model", xs, False)
    gs = [None] * n
    walk_leaves(s.root, grads, "grads", gs, True)
    U = s.n_unique
    xu, iu, gu = [None] * U, [None] * U, [None] * U
    frozen = c.frozen.tolist()
    compute_of = s.u_compute
    seen = {}
    for p in s.trained_pos:
        u = s.pos_u[p]
        x = xs[p]
        shape, dtype = s.u_shape[u], s.u_dtype[u]
        if type(x) is np.ndarray and x.dtype == dtype and x.shape == shape:
            # the common leaf, classified without the trait's dispatch (same answer as param_info)
            info = ND_WRITEABLE if x.flags.writeable else ND_READONLY
        else:
            w = where("model", s.paths[p])
            try:
                info = param_info(x)
            except TypeError as e:
                raise TypeError(f"{w}: {e}") from None
            check_leaf(info, x, dtype, shape, w)
        if info.tieable:
            u0 = seen.setdefault(id(x), u)
            if u0 != u:
                raise ValueError(f"{where('model', s.paths[p])}: the same array as {s.where(u0)}, but the state "
                                 "was set up for two different arrays (set up a new state)")
        if xu[u] is None:
            xu[u], iu[u] = x, info
        elif xu[u] is not x:
            raise ValueError(f"{where('model', s.paths[p])}: the state was set up with this leaf tied to "
                             f"{s.where(u)} (the same array); now they differ")
        g = gs[p]
        if g is None or frozen[u]:  # a frozen leaf's gradient is ignored, as in the fast path
            continue
        if info.backend == "cuda":
            g = check_tree_grad(g, dtype, shape, where("grads", s.paths[p]), gu[u] is not None)
        else:
            compute = compute_of[u]
            if not (type(g) is np.ndarray and g.dtype == compute and g.shape == shape):
                g = _host_grad(g, dtype, shape, compute, where("grads", s.paths[p]))
            # np.add of 0-d arrays gives a NumPy scalar: keep an ndarray (the kernel reads its header)
            g = g if gu[u] is None else np.asarray(gu[u] + g)
        gu[u] = g
    return xu, iu, gu
