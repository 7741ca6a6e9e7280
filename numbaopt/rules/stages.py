"""Stages: chain members that are not elementwise steps, gradient accumulation and a master copy.

They are rules (hyperparameters, state, ``adjust``, ``save``/``load`` work as for any rule) whose effect the
compiler and the step pipeline implement, so that every composition stays ONE fused kernel per group of
leaves and a tree-scope reduction after a stage sees exactly what optax's composition would see:

* ``chain(AccumGrad(4), ClipGlobalNorm(1.0), Adam())`` is optax's ``MultiSteps(chain(clip_by_global_norm(1.0),
  adam()), every_k_schedule=4)``: the global norm is taken over the mean gradients of all leaves;
* ``chain(MixedPrecision(np.float32), ClipGlobalNorm(1.0), Adam())`` runs the rest of the chain on float32
  master copies of float16 (or any other float) parameters, the gradients cast to float32.

``AccumGrad(n, rule)`` and ``MixedPrecision(dtype, rule)`` are shorthands: they return the chain
``chain(AccumGrad(n), rule)`` (the same object as the spelled-out chain).
"""
from __future__ import annotations

import numpy as np

from ..schedules import Schedule
from .base import Rule, hyper, option, state
from .chain import chain

__all__ = ["AccumGrad", "MixedPrecision"]


class AccumGrad(Rule):
    """Accumulate ``n`` gradients, then let the members after it take one step with their mean.

    Calls 1..n-1 of every cycle add the gradient (as transformed by the members before ``AccumGrad``) to
    the running sum ``acc`` and change neither the parameter nor the state of the later members; call n
    hands ``(acc + g) / n`` to the later members, which step once, and resets the sum. Their step count
    ``t`` counts these steps; members before ``AccumGrad`` see every call. Optimisers.jl:
    ``OptimiserChain(AccumGrad(n), rule)``; optax: ``MultiSteps(rule, every_k_schedule=n)``. If a later
    member skips the step (``SkipNonFinite``), the cycle still ends and the sum is dropped, as in optax.

    Ott, Edunov, Grangier and Auli, "Scaling Neural Machine Translation", 2018 (accumulated gradients).
    https://arxiv.org/abs/1806.00187
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AccumGrad(2, no.Descent(0.1)), x)
    >>> state, x = no.update_(state, x, np.array([1.0, 1.0]))   # accumulated: x unchanged
    >>> print(x)
    [ 1. -2.]
    >>> state, x = no.update_(state, x, np.array([3.0, 3.0]))   # one step with the mean, 2
    >>> print(x.round(4))
    [ 0.8 -2.2]
    """
    n = hyper(1.0, low=1.0, doc="gradients per step (an integer)")
    acc = state(0.0)
    stage = "accumulate"
    torch = "(accumulate .grad over n backward passes, then optimizer.step())"
    optax = "MultiSteps(rule, every_k_schedule=n)"

    def __new__(cls, n=1, rule=None, **kw):
        if rule is not None:
            return chain(cls(n), rule)
        return super().__new__(cls)

    def __init__(self, n=1, rule=None, **kw):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) and not (
                isinstance(n, (float, np.floating)) and float(n).is_integer()) or n < 1:
            raise ValueError(f"AccumGrad: n={n!r}; expected an integer >= 1")
        super().__init__(n, **kw)

    def validate(self):
        n = self._values["n"]
        if isinstance(n, Schedule) or not float(n).is_integer():
            raise ValueError(f"AccumGrad: n={n!r}; expected an integer >= 1 (not a schedule)")

    def __repr__(self):
        return f"AccumGrad({int(self._values['n'])})"


class MixedPrecision(Rule):
    """Compute on a higher-precision master copy: ``MixedPrecision(np.float32)`` first in a chain.

    The state keeps a ``master`` copy of each parameter whose dtype differs (float16 parameters, say);
    each step casts the gradient to the master dtype, runs the rest of the chain on the master copy (so
    every moment is in that dtype too) and writes the master back into the parameter, rounded to the
    parameter's dtype (a read-only parameter is replaced by a new read-only array). Parameters already of
    the master dtype are stepped directly. This is the way to train float16 parameters: Numba has no
    float16 on the CPU.

    Float16 and a tiny ``eps``: Adam's eps = 1e-8 is below float16's smallest subnormal (6e-8), so a
    float16 computation would divide by ``sqrt(v) + 0`` (Optimisers.jl floors eps at 1e-7 for Float16).
    Here eps, v and the division live in the float32 master state, where 1e-8 is an ordinary number: no
    floor is needed and none is applied.

    Micikevicius et al., "Mixed Precision Training", 2018. https://arxiv.org/abs/1710.03740
    Examples
    --------
    >>> x = np.array([1.0, -2.0], dtype=np.float16)
    >>> state = no.setup(no.MixedPrecision(np.float32, no.Adam(0.1)), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)
    >>> print(x.dtype, x)
    float16 [ 0.7017 -1.7   ]
    """
    master = option("float32", choices=("float32", "float64"), doc="the dtype of the master copy")
    stage = "master"
    supports_complex = False
    torch = "(torch.amp keeps float32 master weights)"
    optax = "(jmp: optax on float32 params, cast to float16 for compute)"

    def __new__(cls, dtype=np.float32, rule=None, **kw):
        if rule is not None:
            return chain(cls(dtype), rule)
        return super().__new__(cls)

    def __init__(self, dtype=np.float32, rule=None, *, master=None):
        name = master if master is not None else np.dtype(dtype).name
        if name not in ("float32", "float64"):
            raise TypeError(f"MixedPrecision: master dtype {name}; expected float32 or float64")
        super().__init__(master=name)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the master copies (and of every computation after this stage)."""
        return np.dtype(self._values["master"])

    def __repr__(self):
        return f"MixedPrecision({self._values['master']})"
