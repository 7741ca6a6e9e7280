"""The public API on one array: ``setup``, ``update`` (pure), ``update_`` (in place), ``adjust``.

``setup``/``update``/``update_``/``adjust`` accept a nested model as well (dataclasses, dicts, lists,
tuples...): anything that is not an array is handed to the tree engine (:mod:`numbaopt.engine`).
"""
from __future__ import annotations

import numpy as np

from .backends import cpu
from .backends import cuda as _cuda  # imports numba.cuda only when a device array is seen
from .leaf import Leaf, as_rule, check_param_dtype

__all__ = ["setup", "update", "update_", "adjust", "adjust_", "jit_step", "JitStep"]


def _is_array_leaf(model) -> bool:
    return type(model) is np.ndarray


def setup(rule, model):
    """Optimiser state for ``model``: one array (a :class:`Leaf`) or a nested model (a state tree).

    For a tree, ``rule`` may also be a function ``fn(path, leaf) -> rule or None`` choosing per leaf.
    """
    if _is_array_leaf(model):
        rule = as_rule(rule)
        if hasattr(rule, "setup_leaf"):  # host-level wrappers make their own state type
            return rule.setup_leaf(model)
        check_param_dtype(model.dtype)
        return Leaf(rule, model.shape, model.dtype)
    if _cuda.is_device_array(model):
        return _cuda.setup_leaf(rule, model)
    from . import engine
    return engine.setup(rule, model)


def _check(leaf, x, g, where_x="x", where_g="g"):
    """Validate before anything is written; returns flat contiguous ``g``."""
    if type(x) is not np.ndarray:
        raise TypeError(f"{where_x}: expected a numpy array, got {type(x).__name__}")
    if x.dtype != leaf.dtype:
        raise TypeError(f"{where_x}: dtype {x.dtype}, but the state was set up for {leaf.dtype}")
    if x.shape != leaf.shape:
        raise ValueError(f"{where_x}: shape {x.shape}, but the state was set up for shape {leaf.shape}")
    if type(g) is not np.ndarray:
        if isinstance(g, (int, float, complex, np.number)) and not isinstance(g, bool) and x.ndim == 0:
            g = np.asarray(g)
        else:
            raise TypeError(f"{where_g}: expected a numpy array, got {type(g).__name__}"
                            + (" on the GPU for a host parameter (no silent copies)" if _cuda.is_device_array(g) else ""))
    if g.shape != x.shape:
        raise ValueError(f"{where_g}: shape {g.shape}, expected {x.shape}")
    gd = g.dtype
    if gd != x.dtype:
        if gd.kind != x.dtype.kind or gd.kind not in "fc":
            raise TypeError(f"{where_g}: dtype {gd}, expected {x.dtype} (same kind as the parameter)")
        g = g.astype(x.dtype)
    if g.ndim != 1 or not g.flags.c_contiguous:
        g = np.ascontiguousarray(g).reshape(-1)
    return g


def _refresh(leaf):
    if leaf.scheduled:
        leaf.layout.fill_hyper(leaf.hp, leaf.t + 1)


def update(state, model, grad):
    """Pure step: returns ``(new_state, new_model)``; ``state``, ``model`` and ``grad`` are untouched."""
    if type(state) is Leaf:
        return _update_leaf(state, model, grad)
    hook = getattr(state, "_numbaopt_update", None)
    if hook is not None:
        return hook(model, grad, False)
    from . import engine
    return engine.update(state, model, grad)


def update_(state, model, grad):
    """In-place step: writes the parameter (when writeable) and the state; returns ``(state, model)``.

    A read-only array is not written: a new array is returned, so always use the returned model.
    """
    if type(state) is Leaf:
        # fast path: a writeable contiguous array and a gradient of the same dtype and shape. On a small
        # array each check here costs about a tenth of the whole step: keep them few and flat.
        if type(model) is np.ndarray and type(grad) is np.ndarray and not state.scheduled:
            dt = state.dtype
            shape = state.shape
            if model.dtype is dt and grad.dtype is dt and model.shape == shape and grad.shape == shape:
                flags = model.flags
                gflags = grad.flags
                if flags.carray and gflags.carray and len(shape) == 1:
                    # 1-D, C-contiguous, aligned and writeable: the types bind_inplace compiled for
                    call = state.fast
                    if call is None:
                        call = state.fast_call()
                    status = call(model, grad, state.t + 1)
                elif flags.writeable and flags.c_contiguous and gflags.c_contiguous and model.ndim == 1:
                    # a read-only or unaligned array is another compiled type: Numba's dispatcher picks it
                    status = cpu.run_inplace(state, model, grad)
                else:
                    return _update_leaf_(state, model, grad)
                if status == 0:
                    state.t += 1
                else:
                    cpu.raise_status(state, status)
                    state.skipped += 1
                return state, model
        return _update_leaf_(state, model, grad)
    hook = getattr(state, "_numbaopt_update", None)
    if hook is not None:  # host-level wrappers (AccumGrad, MixedPrecision, ...) carry their own state type
        return hook(model, grad, True)
    from . import engine
    return engine.update_(state, model, grad)


def _update_leaf(leaf, x, g):
    g1 = _check(leaf, x, g)
    new = leaf.copy()
    _refresh(new)
    x1 = np.ascontiguousarray(x).reshape(-1)
    xo = np.empty_like(x1)
    out = tuple(np.empty_like(a) for a in leaf.arrays)
    status = cpu.run_outplace(new, x1, g1, xo, out)
    if status == 0:
        new.arrays = out
        new.t += 1
        return new, xo.reshape(x.shape)
    cpu.raise_status(new, status)
    new.skipped += 1
    return new, x.copy()


def _update_leaf_(leaf, x, g):
    g1 = _check(leaf, x, g)
    _refresh(leaf)
    if x.flags.writeable:
        if x.flags.c_contiguous:
            status = cpu.run_inplace(leaf, x.reshape(-1) if x.ndim != 1 else x, g1)
        else:
            tmp = np.ascontiguousarray(x).reshape(-1)
            status = cpu.run_inplace(leaf, tmp, g1)
            if status == 0:
                x[...] = tmp.reshape(x.shape)  # write through to the base of a strided view
    else:
        x1 = np.ascontiguousarray(x).reshape(-1)
        xo = np.empty_like(x1)
        status = cpu.run_outplace(leaf, x1, g1, xo, leaf.arrays)
        if status == 0:
            x = xo.reshape(x.shape)
    if status == 0:
        leaf.t += 1
    else:
        cpu.raise_status(leaf, status)
        leaf.skipped += 1
    return leaf, x


def adjust(state, **hyper):
    """A new state with some hyperparameters changed; moments and step counts are kept.

    Unknown names are a ``ValueError`` listing the valid ones. Never recompiles a kernel.
    """
    if type(state) is Leaf:
        return state.with_rule(state.adjusted_rule(hyper))
    hook = getattr(state, "_numbaopt_adjust", None)
    if hook is not None:  # device states
        return hook(hyper, False)
    from . import engine
    return engine.adjust(state, **hyper)


def adjust_(state, **hyper):
    """Change hyperparameters in place; returns the state."""
    if type(state) is Leaf:
        fresh = state.with_rule(state.adjusted_rule(hyper))
        state.rule, state.layout, state.scheduled = fresh.rule, fresh.layout, fresh.scheduled
        state.hp[:] = fresh.hp  # in place: compiled callers holding hp see the new values
        return state
    hook = getattr(state, "_numbaopt_adjust", None)
    if hook is not None:
        return hook(hyper, True)
    from . import engine
    return engine.adjust_(state, **hyper)


class JitStep:
    """A rule's step for use inside a user's ``@njit`` code.

    ``step(x, g, state, hp, t)`` updates the 1-D contiguous arrays ``x`` and ``state`` in place for step
    number ``t`` (1, 2, ...) and returns a status (0 = stepped). ``hp`` is an array (float32 for float32
    parameters, else float64) of
    hyperparameters (``hyper_index(name)`` says where each lives, so a loop can change them, e.g.
    from a schedule); ``state`` is a tuple of arrays created here on the host.
    """

    def __init__(self, rule, x):
        rule = as_rule(rule)
        if not hasattr(rule, "rules"):  # host-level wrappers (AccumGrad, MixedPrecision) keep host state
            raise TypeError(f"jit_step: {type(rule).__name__} is a host-level wrapper with no compiled step; "
                            "pass a rule or a chain of rules")
        x = np.asarray(x)
        dtype = check_param_dtype(x.dtype)
        leaf = Leaf(rule, (x.size,), dtype)
        self.rule = rule
        self.step = leaf.kernels().step
        self.state = tuple(leaf.arrays)
        self.hp = leaf.hp
        self.layout = leaf.layout

    def hyper_index(self, name: str, rule: int | None = None) -> int:
        """Index of hyperparameter ``name`` in ``hp`` (for a chain, of the first member having it, or of
        member ``rule``)."""
        for k, (r_i, n) in enumerate(self.layout.hyper_names):
            if n == name and (rule is None or rule == r_i):
                return k
        raise ValueError(f"no hyperparameter {name!r}; valid: {[n for _, n in self.layout.hyper_names]}")

    def __iter__(self):
        return iter((self.step, self.state, self.hp))


def jit_step(rule, x) -> JitStep:
    """``step, state, hp = jit_step(rule, x)``: see :class:`JitStep`."""
    return JitStep(rule, x)
