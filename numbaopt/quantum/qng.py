"""Quantum natural gradient (QNG): gradient steps preconditioned by the Fubini-Study metric tensor.

Stokes, Izaac, Killoran, Carleo, "Quantum Natural Gradient", Quantum 4, 269 (2020): for a state
``|psi(theta)>`` the steepest-descent direction in the geometry of states, not of angles, is

    theta <- theta - lr * (G + lam*I)^+ grad f,    G_ij = Re(<d_i psi|d_j psi> - <d_i psi|psi><psi|d_j psi>)

with ``G`` the Fubini-Study metric (PennyLane's ``qml.metric_tensor``: exact, or its block-diagonal
approximation) and ``lam`` a Tikhonov regularisation. PennyLane's ``QNGOptimizer(stepsize, approx, lam)`` is
exactly this with plain descent; :func:`minimize_qng` runs it (or any numbaopt rule on the natural
gradient, e.g. Adam) through :func:`numbaopt.minimize`, so with ``@njit`` ``fun`` and ``metric`` the whole
loop (circuit, gradient, metric, solve, step, stopping tests) is compiled.

How it stays compiled and cached: the objective ``minimize`` sees is :func:`_qng_objective`, one
``@njit(cache=True)`` function that calls the user's ``fun`` and ``metric`` as first-class functions
(:class:`numbaopt.loops.fnref.FnRef`: typed by their signatures, called through their addresses). Its cache
entries are keyed by argument types only, so a fresh process loads it (and the driver) from disk, and an
edited ``fun`` can never replay stale code.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from numba import njit, types
from numba.core.errors import NumbaExperimentalFeatureWarning

from ..loops.fnref import FnRef, fn_type, register_fnref
from ..loops.minimize import minimize
from ..loops.problem import fill_unwritten, is_njit, unwritten_gradient
from ..rules.basic import Descent
from .linalg import PINV, natural_gradient, workspace

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from ..loops.results import OptimizeResult
    from ..rules.base import Rule
    from ..rules.chain import Chain

__all__ = ["minimize_qng", "natural_gradient", "workspace"]

#: the learning rate of the default rule (PennyLane's ``QNGOptimizer(stepsize=0.01)``)
DEFAULT_LR = 0.01


@njit(cache=True, error_model="numpy")
def _qng_objective(x, g, fun, metric, G, work, lam, fun_args, metric_args, first, stats):
    """The loss at ``x``; ``g`` becomes the natural gradient ``(G + lam*I)^+ grad``.

    ``first`` keeps the raw gradient of the first evaluation (still holding the never-written NaN pattern
    where ``fun`` did not write: checked after the loop, since ``g`` itself is overwritten here);
    ``stats`` counts evaluations and pseudo-inverse fallbacks."""
    f = fun(x, g, *fun_args)
    metric(x, G, *metric_args)
    if stats[0] == 0:
        first[:] = g
    stats[0] += 1
    if natural_gradient(g, G, lam, g, work) == PINV:
        stats[1] += 1
    return f


def _describe(v) -> str:
    shape = getattr(v, "shape", None)
    return f"an array of shape {tuple(shape)}" if shape is not None else f"{type(v).__name__} {v!r:.60}"


def _checked_metric(metric, n):
    """A Python ``metric`` whose return value must be ``None`` (a metric returned instead of written is named)."""
    def checked(x, G, *a):
        r = metric(x, G, *a)
        if r is not None:
            raise TypeError(f"metric(x, G_out, *metric_args) must write the ({n}, {n}) metric tensor into G_out "
                            f"and return None; it returned {_describe(r)}")
    return checked


def _param_dtype(x0) -> np.dtype:
    """The dtype ``minimize`` will give ``x`` (integers become float64); complex angles are refused here."""
    dt = np.asarray(x0).dtype
    if dt.kind == "c":
        raise TypeError(f"minimize_qng: complex parameters ({dt}); the metric tensor is for real angles")
    return np.dtype(np.float64) if dt.kind in "iu" else dt


def _compiled_refs(fun, metric, dtype, fun_args, metric_args):
    """``FnRef``s of the user's ``fun`` and ``metric`` for the argument types the loop will pass (compiling
    them if needed); a ``TypeError`` names a function that does not compile or returns the wrong thing."""
    register_fnref()  # the FnRef type must exist before minimize types the argument tuple
    arr = numba.typeof(np.empty(1, dtype))
    mat = numba.typeof(np.empty((1, 1)))
    fty, frt = fn_type(fun, (arr, arr) + tuple(numba.typeof(a) for a in fun_args), "fun(x, grad_out, *args)")
    if not isinstance(frt, (types.Float, types.Integer)) or isinstance(frt, types.Boolean):
        raise TypeError(f"fun must return a real scalar loss, but returns {frt}")
    mty, mrt = fn_type(metric, (arr, mat) + tuple(numba.typeof(a) for a in metric_args),
                       "metric(x, G_out, *metric_args)")
    if mrt != types.none:
        raise TypeError(f"metric(x, G_out, *metric_args) must write the metric tensor into G_out and return None; "
                        f"it returns {mrt}")
    return FnRef(fun, fty), FnRef(metric, mty)


def minimize_qng(fun: Callable[..., Any], metric: Callable[..., Any], x0: ArrayLike, *, lr: float | None = None,
                 lam: float = 0.0, rule: Rule | Chain | None = None, args: tuple[Any, ...] = (),
                 metric_args: tuple[Any, ...] | None = None, **minimize_options: Any) -> OptimizeResult:
    """Minimise ``fun`` by quantum natural gradient steps: ``x <- rule(x, (G(x) + lam*I)^+ grad f(x))``.

    ``fun(x, grad_out, *args) -> loss`` writes the gradient into ``grad_out``; ``metric(x, G_out,
    *metric_args)`` writes the ``(n, n)`` metric tensor into ``G_out`` (the full Fubini-Study metric, or a
    block-diagonal approximation with zeros off the blocks) and returns ``None``; ``metric_args`` defaults to
    ``args``. ``rule`` steps on the natural gradient; ``None`` means ``Descent(lr)`` (``lr`` default 0.01),
    exactly PennyLane's ``QNGOptimizer(stepsize=lr, lam=lam)``; ``lr`` is only for that default (with a rule,
    set the learning rate in the rule). ``lam >= 0`` regularises the metric. The solve is a Cholesky
    factorisation, or the pseudo-inverse PennyLane uses when ``G + lam*I`` is singular
    (:func:`natural_gradient`).

    Everything else is :func:`numbaopt.minimize`'s (``maxiter``, ``gtol``, ``ftol``, ``callback``,
    ``progress``, ``compiled``, ``history``, ``schedule``; ``jac`` is not offered: ``fun`` gives the gradient).
    The loop sees the natural gradient as "the gradient": ``gtol`` and the result's ``grad_norm`` are its
    2-norm (the size of the step Descent takes, over ``lr``), which is the quantity that vanishes at a
    stationary point whatever the metric's scale. When ``fun`` and ``metric`` are both ``@numba.njit`` the
    loop runs compiled (cached: a fresh process compiles nothing); otherwise interpreted. The result is
    ``minimize``'s, plus ``pinv_steps``: how many evaluations fell back to the pseudo-inverse.
    A ``fun`` that leaves ``grad_out`` (or a ``metric`` that leaves ``G_out``) partly unwritten is a
    ``TypeError`` after the loop stops on the resulting NaN; a non-finite metric stops the loop (status
    "non-finite loss or gradient").
    """
    if not callable(fun):
        raise TypeError(f"fun must be callable, got {fun!r}")
    if not callable(metric):
        raise TypeError(f"metric must be callable, got {metric!r}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if metric_args is None:
        metric_args = args
    elif not isinstance(metric_args, tuple):
        raise TypeError(f"metric_args must be a tuple or None, got {type(metric_args).__name__}")
    if "jac" in minimize_options:
        raise TypeError("minimize_qng: jac is not supported; fun(x, grad_out, *args) writes the gradient")
    if isinstance(lam, bool) or not isinstance(lam, (int, float, np.integer, np.floating)):
        raise TypeError(f"lam must be a non-negative number, got {lam!r}")
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam={lam!r}; expected a finite number >= 0")
    if rule is None:
        rule = Descent(DEFAULT_LR if lr is None else lr)
    elif lr is not None:
        raise TypeError("minimize_qng: lr sets the default Descent rule; with rule=..., set the rule's own lr")
    dtype = _param_dtype(x0)
    n = int(np.asarray(x0).size)
    G = np.empty((n, n))
    fill_unwritten(G)  # entries metric never writes keep this pattern: named after the loop
    first = np.empty(n, dtype=dtype)
    stats = np.zeros(2, dtype=np.int64)
    compiled = minimize_options.pop("compiled", None)
    if compiled is None:
        compiled = is_njit(fun) and is_njit(metric)
    if compiled:
        if not (is_njit(fun) and is_njit(metric)):
            raise TypeError("compiled=True needs fun and metric to be @numba.njit functions")
        fref, mref = _compiled_refs(fun, metric, dtype, args, metric_args)
        objective = _qng_objective
    else:
        fref, mref = fun, _checked_metric(metric, n)
        objective = _qng_objective.py_func  # the same body, interpreted: it calls Python functions
    loop_args = (fref, mref, G, workspace(n), float(lam), args, metric_args, first, stats)
    with warnings.catch_warnings():
        # typing the args tuple (two first-class functions) makes Numba warn that first-class function types are
        # experimental, on every dispatch of a fresh process; numbaopt.loops relies on them deliberately (fnref.py)
        warnings.filterwarnings("ignore", category=NumbaExperimentalFeatureWarning)
        res = minimize(objective, x0, rule, args=loop_args, compiled=compiled, **minimize_options)
    if stats[0] > 0:
        bad = unwritten_gradient(first[None, :])
        if bad is not None:
            raise TypeError(f"fun(x, grad_out, *args) did not write the gradient into grad_out: {bad[1]} of {n} "
                            "entries were left unwritten at x0; fun must fill grad_out in place")
        bad = unwritten_gradient(G.reshape(1, -1))
        if bad is not None:
            raise TypeError(f"metric(x, G_out, *metric_args) did not write G_out: {bad[1]} of {n * n} entries of the "
                            f"({n}, {n}) metric tensor were left unwritten; metric must fill all of G_out in place "
                            "(zeros off the blocks of a block-diagonal approximation)")
    res.pinv_steps = int(stats[1])
    return res
