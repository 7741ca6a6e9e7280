"""Host-level wrappers around a rule: gradient accumulation and mixed precision.

They cannot be fused into an elementwise kernel (AccumGrad must not touch the inner state on most
calls; MixedPrecision changes the array the kernels run on), so each wrapper makes its own per-array
state type. ``numbaopt.setup`` calls ``wrapper.setup_leaf(x)``; ``update``/``update_`` call
``state._numbaopt_update(model, grad, inplace)``; the tree engine does the same per leaf. The inner
rule still runs as its generated kernel.
"""
from __future__ import annotations

import numpy as np

from .leaf import as_rule

__all__ = ["AccumGrad", "MixedPrecision", "AccumGradState", "MixedPrecisionState"]


def _check_grad(where, x_shape, x_dtype, g):
    """Validate a gradient before anything is written; returns it as an array of ``x_dtype``."""
    if type(g) is not np.ndarray:
        if isinstance(g, (int, float, complex, np.number)) and not isinstance(g, bool) and x_shape == ():
            g = np.asarray(g)
        else:
            raise TypeError(f"{where}: expected the gradient as a numpy array, got {type(g).__name__}")
    if g.shape != tuple(x_shape):
        raise ValueError(f"{where}: gradient shape {g.shape}, expected {tuple(x_shape)}")
    if g.dtype != x_dtype:
        if g.dtype.kind != np.dtype(x_dtype).kind or g.dtype.kind not in "fc":
            raise TypeError(f"{where}: gradient dtype {g.dtype}, expected {np.dtype(x_dtype)} (same kind as "
                            "the parameter)")
    return g


def _check_model(where, x, shape, dtype):
    if type(x) is not np.ndarray:
        raise TypeError(f"{where}: expected the parameter as a numpy array, got {type(x).__name__}")
    if x.shape != tuple(shape) or x.dtype != dtype:
        raise ValueError(f"{where}: parameter {x.dtype}{list(x.shape)}, but the state was set up for "
                         f"{np.dtype(dtype)}{list(shape)}")


class AccumGrad:
    """Accumulate ``n`` gradients, then apply ``rule`` once with their mean.

    Calls 1..n-1 of every cycle change neither the parameter nor the inner state; call n applies the
    inner step to ``(g_1 + ... + g_n) / n`` (summed in the parameter's precision; put it inside
    ``MixedPrecision`` to sum float16 gradients in float32). Optimisers.jl's
    ``OptimiserChain(AccumGrad(n), rule)`` is ``AccumGrad(n, rule)`` here; optax's
    ``MultiSteps(rule, every_k_schedule=n)`` is the same.
    """

    __slots__ = ("n", "rule")

    def __init__(self, n: int, rule):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"AccumGrad: n={n!r}; expected an integer >= 1")
        object.__setattr__(self, "n", int(n))
        object.__setattr__(self, "rule", as_rule(rule))

    def __setattr__(self, name, value):
        raise AttributeError("AccumGrad is immutable")

    def setup_leaf(self, x) -> "AccumGradState":
        """The state for one parameter array: the inner state and a zero accumulator."""
        from . import api
        inner = api.setup(self.rule, x)
        return AccumGradState(self, inner, np.zeros(x.shape, dtype=x.dtype), 0)

    def __eq__(self, other):
        return type(other) is AccumGrad and (self.n, self.rule) == (other.n, other.rule)

    def __hash__(self):
        return hash((AccumGrad, self.n, self.rule))

    def __repr__(self):
        return f"AccumGrad({self.n}, {self.rule!r})"


class AccumGradState:
    """State of :class:`AccumGrad` on one array: ``inner`` (the rule's state), ``acc`` (the running sum)
    and ``count`` (gradients accumulated in the current cycle)."""

    __slots__ = ("wrapper", "inner", "acc", "count")

    def __init__(self, wrapper, inner, acc, count):
        self.wrapper, self.inner, self.acc, self.count = wrapper, inner, acc, count

    @property
    def t(self) -> int:
        """Steps the inner rule has taken."""
        return self.inner.t

    @property
    def rule(self):
        """The rule that runs (inside the wrapper; ``wrapper`` is the AccumGrad itself)."""
        return self.inner.rule

    def _numbaopt_adjust(self, hyper, inplace):
        from . import api
        if inplace:
            self.inner = api.adjust_(self.inner, **hyper)
            return self
        return AccumGradState(self.wrapper, api.adjust(self.inner, **hyper), self.acc.copy(), self.count)

    def _numbaopt_update(self, model, grad, inplace):
        from . import api
        _check_model("AccumGrad", model, self.acc.shape, self.acc.dtype)
        g = _check_grad("AccumGrad", self.acc.shape, self.acc.dtype, grad)
        acc = self.acc + g  # a new array: the old sum stays valid if the inner step raises
        count = self.count + 1
        if count < self.wrapper.n:
            if inplace:
                self.acc, self.count = acc, count
                return self, model
            return AccumGradState(self.wrapper, self.inner, acc, count), model.copy()
        mean = acc / acc.dtype.type(self.wrapper.n)
        if inplace:
            self.inner, model = api.update_(self.inner, model, mean)
            self.acc, self.count = np.zeros_like(acc), 0
            return self, model
        inner, model = api.update(self.inner, model, mean)
        return AccumGradState(self.wrapper, inner, np.zeros_like(acc), 0), model

    def __repr__(self):
        return f"AccumGradState({self.wrapper!r}, count={self.count}, inner={self.inner!r})"


_COMPUTE = (np.dtype(np.float32), np.dtype(np.float64))


class MixedPrecision:
    """Low-precision parameters with a higher-precision master copy: ``MixedPrecision(np.float32, rule)``.

    The state keeps a ``dtype`` copy of the parameter; each step casts the gradient to ``dtype``, runs
    ``rule``'s kernel on the master copy (so every moment is ``dtype`` too) and writes the master back
    into the parameter, rounded to the parameter's dtype. This is the way to train float16 parameters
    here: Numba has no float16 on the CPU, so float32 is the compute path.

    Float16 and a tiny ``eps``: Adam's eps = 1e-8 is below float16's smallest subnormal (6e-8), so a
    float16 computation would divide by ``sqrt(v) + 0`` (Optimisers.jl floors eps at 1e-7 for Float16).
    Here eps, v and the division live in the float32 master state, where 1e-8 is an ordinary number:
    no floor is needed and none is applied, so the trajectory equals the float32 one up to the final
    rounding of each written parameter.
    """

    __slots__ = ("dtype", "rule")

    def __init__(self, dtype, rule):
        dt = np.dtype(dtype)
        if dt not in _COMPUTE:
            raise TypeError(f"MixedPrecision: master dtype {dt}; expected float32 or float64")
        object.__setattr__(self, "dtype", dt)
        object.__setattr__(self, "rule", as_rule(rule))

    def __setattr__(self, name, value):
        raise AttributeError("MixedPrecision is immutable")

    def setup_leaf(self, x) -> "MixedPrecisionState":
        """The state for one parameter array: the float master copy and the inner rule's state on it."""
        from . import api
        if type(x) is not np.ndarray or x.dtype.kind != "f":
            raise TypeError(f"MixedPrecision: expected a real floating-point numpy array, got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
        master = x.astype(self.dtype)
        return MixedPrecisionState(self, api.setup(self.rule, master), master, x.dtype)

    def __eq__(self, other):
        return type(other) is MixedPrecision and (self.dtype, self.rule) == (other.dtype, other.rule)

    def __hash__(self):
        return hash((MixedPrecision, self.dtype, self.rule))

    def __repr__(self):
        return f"MixedPrecision({self.dtype.name}, {self.rule!r})"


class MixedPrecisionState:
    """State of :class:`MixedPrecision` on one array: ``master`` (the high-precision parameter) and
    ``inner`` (the rule's state for it); ``param_dtype`` is the dtype written back."""

    __slots__ = ("wrapper", "inner", "master", "param_dtype")

    def __init__(self, wrapper, inner, master, param_dtype):
        self.wrapper, self.inner, self.master, self.param_dtype = wrapper, inner, master, np.dtype(param_dtype)

    @property
    def t(self) -> int:
        """Steps taken."""
        return self.inner.t

    @property
    def rule(self):
        """The rule that runs on the master copy (``wrapper`` is the MixedPrecision itself)."""
        return self.inner.rule

    def _numbaopt_adjust(self, hyper, inplace):
        from . import api
        if inplace:
            self.inner = api.adjust_(self.inner, **hyper)
            return self
        return MixedPrecisionState(self.wrapper, api.adjust(self.inner, **hyper), self.master.copy(),
                                   self.param_dtype)

    def _numbaopt_update(self, model, grad, inplace):
        from . import api
        _check_model("MixedPrecision", model, self.master.shape, self.param_dtype)
        g = _check_grad("MixedPrecision", self.master.shape, self.param_dtype, grad)
        g = g.astype(self.master.dtype)
        if inplace:
            self.inner, self.master = api.update_(self.inner, self.master, g)
            if model.flags.writeable:
                model[...] = self.master  # rounded to the parameter's dtype
                return self, model
            return self, self.master.astype(self.param_dtype)
        inner, master = api.update(self.inner, self.master, g)
        return MixedPrecisionState(self.wrapper, inner, master, self.param_dtype), master.astype(self.param_dtype)

    def __repr__(self):
        return f"MixedPrecisionState({self.wrapper!r}, master {self.master.dtype.name}, inner={self.inner!r})"
