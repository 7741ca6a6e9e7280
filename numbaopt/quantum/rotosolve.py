"""Rotosolve: exact coordinate minimisation of a cost that is a trigonometric polynomial in every angle.

For a circuit whose angle ``theta_d`` enters through gates ``exp(-i theta_d P / 2)`` (``P`` a Pauli word), the
cost restricted to that angle, all others fixed, is a Fourier series with integer frequencies ``1..R_d``
(``R_d`` the number of gates it feeds):

    f(theta_d + s) = a_0 + sum_{k=1..R} (a_k cos(k s) + b_k sin(k s))

so ``2R + 1`` evaluations determine it exactly and its global minimum over the angle can be found classically.
One *sweep* visits the angles in index order and moves each to the minimiser of its restriction
(Vidal & Theis 2018, arXiv:1812.06323; Ostaszewski, Grant, Benedetti, "Structure optimization for parameterized
quantum circuits", Quantum 5, 391 (2021); Wierichs, Izaac, Wang, Lin, "General parameter-shift rules for quantum
gradients", Quantum 6, 677 (2022)). PennyLane's ``RotosolveOptimizer.step`` is one sweep; this module follows
``pennylane/optimize/rotosolve.py`` (0.45) so that the iterates coincide:

* ``R = 1`` (``min_analytic``): with ``f0 = f(0)``, ``f+- = f(+-pi/2)``, ``C = (f+ + f-)/2``,
  ``B = atan2(2 f0 - f+ - f-, f+ - f-)``, the step is ``s* = -pi/2 - B`` (moved into ``(-pi, pi]``) and the
  minimum ``C - sqrt((f0 - C)^2 + (f+ - f-)^2/4)``; the angle becomes ``theta_d + s*`` (not wrapped).
* ``R > 1`` (``fourier.reconstruct`` with ``nums_frequency``): evaluations at the equidistant shifts
  ``s_mu = 2 pi mu / (2R + 1)``, ``mu = -R..R``, reconstruct the restriction (here by the exact discrete Fourier
  transform, PennyLane by the equivalent Dirichlet kernel), and a univariate global minimiser picks the new
  angle in ``[-pi, pi]`` (PennyLane: its ``substep_optimizer``, by default four rounds of a 100-point grid with
  Nelder-Mead polishing; here a dense grid, then a safeguarded Newton iteration on the reconstruction's
  derivative from every discrete local minimum of the grid, which finds the minimiser to rounding).

Evaluations: the current value is reused as ``f(0)`` of every angle (it is the previous angle's reconstructed
minimum), so an angle costs ``2 R_d`` new evaluations; every sweep ends with one fresh evaluation, which is
``history``, the stopping tests and the next sweep's first ``f(0)``. PennyLane instead re-evaluates ``f(0)``
for every angle but the first (``2 R_d + 1`` evaluations); the two values differ by rounding, so the iterates
agree to rounding (``tests/test_rotosolve.py``). A cost that is *not* a trigonometric polynomial of the stated
degrees (too small ``num_freqs``, shot noise) makes the reconstruction, and hence the reused value, inexact.

Compiled: for an ``@njit`` ``fun`` the sweep loop (:func:`_sweeps`, ``cache=True``) runs compiled and calls
``fun`` through its address (:class:`numbaopt.loops.fnref.FnRef`, a first-class function type), so a fresh
process loads it from Numba's cache; otherwise the same loop body runs interpreted (``_sweeps.py_func``) calling
the same compiled helpers, so the iterates are bitwise those of the compiled loop.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from numba import njit, types

from ..loops.drivers import CALLBACK, FTOL, MAXITER, NONFINITE, REASONS, RUNNING, TARGET, stop_reason
from ..loops.fnref import FnRef, fn_type, register_fnref
from ..loops.problem import checked_loss, count, is_njit, loss_targets, nonneg
from ..loops.results import OptimizeResult

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["rotosolve", "min_analytic", "min_trig", "GRID_PER_FREQ", "MESSAGES"]

_NJ = dict(cache=True, error_model="numpy")

_PI = math.pi
_HALF_PI = 0.5 * math.pi
_TWO_PI = 2.0 * math.pi
#: grid points per frequency of the dense grid that seeds the Newton refinement for ``R > 1``: a degree-R
#: trigonometric polynomial has at most R local minima, so 64 R points put several in every basin but the
#: narrowest (nearly degenerate, hence nearly equal) ones
GRID_PER_FREQ = 64
#: Newton iterations of one refinement (quadratic convergence: typically 3 to 6 are used)
_MAX_NEWTON = 60
#: the codes counted as success (``converged``)
_SUCCESS = (FTOL, TARGET)
#: ``message`` by status: the loops' reasons, in sweeps, and without a gradient
MESSAGES = {**REASONS, MAXITER: "maximum number of sweeps reached", NONFINITE: "non-finite loss",
            FTOL: "relative loss change between sweeps <= ftol"}


# ---------------------------------------------------------------------------------------------
# the univariate minimisers (compiled; the interpreted loop calls these same functions)
# ---------------------------------------------------------------------------------------------
@njit(**_NJ)
def min_analytic(f0, fp, fm):
    """``(step, minimum)`` of ``a + b cos(s) + c sin(s)`` from its values at ``0``, ``pi/2``, ``-pi/2``.

    PennyLane's ``RotosolveOptimizer.min_analytic`` with frequency 1, operation for operation (Ostaszewski et
    al. 2021, appendix A): the step lies in ``(-pi, pi]``; the minimum is the reconstruction's."""
    shift = _HALF_PI
    c = 0.5 * (fp + fm)
    b = math.atan2(2.0 * f0 - fp - fm, fp - fm)
    step = -shift - b
    a = math.sqrt((f0 - c) ** 2 + 0.25 * (fp - fm) ** 2)
    if step <= -2.0 * shift:
        step = step + 4.0 * shift
    return step, -a + c


@njit(**_NJ)
def _coefficients(E, r, C):
    """``C = [a_0, a_1..a_r, b_1..b_r]`` of the trigonometric polynomial through ``E[mu + r] = g(2 pi mu / N)``,
    ``mu = -r..r``, ``N = 2r + 1``: the discrete Fourier transform, exact for degree ``<= r`` (discrete
    orthogonality of ``cos(k t), sin(k t)`` on ``N`` equidistant points)."""
    n = 2 * r + 1
    for k in range(r + 1):
        sa = 0.0
        sb = 0.0
        for j in range(n):
            t = k * (_TWO_PI * (j - r) / n)
            sa += E[j] * math.cos(t)
            sb += E[j] * math.sin(t)
        if k == 0:
            C[0] = sa / n
        else:
            C[k] = 2.0 * sa / n
            C[r + k] = 2.0 * sb / n


@njit(**_NJ)
def _trig_value(C, r, s):
    g = C[0]
    for k in range(1, r + 1):
        g += C[k] * math.cos(k * s) + C[r + k] * math.sin(k * s)
    return g


@njit(**_NJ)
def _trig_derivatives(C, r, s):
    """``(g'(s), g''(s))``."""
    d1 = 0.0
    d2 = 0.0
    for k in range(1, r + 1):
        c, sn = math.cos(k * s), math.sin(k * s)
        d1 += k * (C[r + k] * c - C[k] * sn)
        d2 -= k * k * (C[k] * c + C[r + k] * sn)
    return d1, d2


@njit(**_NJ)
def _refine(C, r, s, h):
    """A local minimiser of ``g`` near the grid point ``s`` (a discrete local minimum, so one lies in
    ``(s - h, s + h)``): Newton on ``g' = 0``, kept inside the bracket, bisecting where Newton leaves it
    (``rtsafe``, Numerical Recipes section 9.4). Without a sign change of ``g'`` over the bracket (a flat or
    nearly degenerate basin) only Newton steps that stay inside it and descend are taken."""
    lo, hi = s - h, s + h
    bracket = _trig_derivatives(C, r, lo)[0] < 0.0 and _trig_derivatives(C, r, hi)[0] > 0.0
    for _ in range(_MAX_NEWTON):
        d1, d2 = _trig_derivatives(C, r, s)
        if d1 == 0.0:
            break
        if bracket:
            if d1 < 0.0:
                lo = s
            else:
                hi = s
        sn = s - d1 / d2 if d2 > 0.0 else math.nan
        if not (lo < sn < hi):  # also NaN
            if not bracket:
                break
            sn = 0.5 * (lo + hi)
        if abs(sn - s) <= 4e-16 * max(1.0, abs(s)):
            s = sn
            break
        if not bracket and _trig_value(C, r, sn) > _trig_value(C, r, s):
            break
        s = sn
    return s


@njit(**_NJ)
def min_trig(C, r, m):
    """``(s*, g(s*))``: the global minimum over a period of ``g(s) = C[0] + sum_k C[k] cos(ks) + C[r+k] sin(ks)``.

    ``m`` grid points over ``[0, 2 pi)``; every discrete local minimum (cyclically) is refined by
    :func:`_refine` and the lowest refined value wins (the first of equal ones, so a constant ``g`` keeps
    ``s* = 0``). ``s*`` lies in ``(-2 pi / m, 2 pi)``."""
    h = _TWO_PI / m
    best_s, best_g = 0.0, math.inf
    g_prev = _trig_value(C, r, (m - 1) * h)
    g_cur = _trig_value(C, r, 0.0)
    g_first = g_cur
    for i in range(m):
        g_next = g_first if i == m - 1 else _trig_value(C, r, (i + 1) * h)
        if g_cur <= g_prev and g_cur <= g_next:
            s = _refine(C, r, i * h, h)
            g = _trig_value(C, r, s)
            if not g <= g_cur:  # refinement never does worse than its grid point
                s, g = i * h, g_cur
            if g < best_g:
                best_s, best_g = s, g
        g_prev, g_cur = g_cur, g_next
    if best_g == math.inf:  # no discrete minimum: only with NaN coefficients
        return math.nan, math.nan
    return best_s, best_g


@njit(**_NJ)
def _min_numeric(E, r, xd, C):
    """``(new angle, minimum)`` for ``R = r > 1`` from the ``2r + 1`` evaluations ``E`` around ``xd``: the new
    angle is absolute and lies in ``[-pi, pi)`` (PennyLane: the substep optimiser's bounds ``[-pi, pi]``)."""
    _coefficients(E, r, C)
    s, g = min_trig(C, r, GRID_PER_FREQ * r)
    x = xd + s
    return x - _TWO_PI * math.floor((x + _PI) / _TWO_PI), g


@njit(**_NJ)
def _shift(r, mu):
    """The ``mu``-th equidistant shift for ``r`` frequencies, as PennyLane's ``_reconstruct_equ`` computes it."""
    return mu / ((r + 0.5) / _PI)


# ---------------------------------------------------------------------------------------------
# the loop: sweeps until a stopping test, or nsteps more sweeps (a chunk between callbacks)
# ---------------------------------------------------------------------------------------------
@njit(**_NJ)
def _sweeps(fun, args, x, R, E, C, nsteps, maxiter, ftol, ftarget, I, F, H):
    """Run up to ``nsteps`` sweeps; ``I = [sweeps, nfev, status]``, ``F = [f, f of the previous sweep]``,
    ``H[k]`` the loss after sweep ``k``. The first call evaluates ``f(x0)``. Stopping tests follow every fresh
    evaluation, in :func:`numbaopt.minimize`'s order: non-finite, ``f_target``, ``ftol``, ``maxiter``."""
    n = x.shape[0]
    it = I[0]
    nfev = I[1]
    f = F[0]
    fprev = F[1]
    reason = RUNNING
    if nfev == 0:
        f = np.float64(fun(x, *args))
        nfev = 1
        H[0] = f
        fresh = True
    else:
        fresh = False
    stop = it + nsteps
    while True:
        if fresh:  # the tests, right after every fresh evaluation (no gradient: gn2 = 0, gtol2 = -1)
            reason = stop_reason(f, 0.0, fprev, it, maxiter, -1.0, ftol, ftarget)
            if reason != RUNNING:
                break
        if it >= stop:
            break
        cur = f  # f at the current x: fresh, then each angle's reconstructed minimum
        for d in range(n):
            r = R[d]
            xd = x[d]
            if r == 1:
                x[d] = xd + _HALF_PI
                fp = np.float64(fun(x, *args))
                x[d] = xd - _HALF_PI
                fm = np.float64(fun(x, *args))
                step, low = min_analytic(cur, fp, fm)
                xn = xd + step
            else:
                for mu in range(1, r + 1):
                    x[d] = xd - _shift(r, mu)
                    E[r - mu] = np.float64(fun(x, *args))
                    x[d] = xd + _shift(r, mu)
                    E[r + mu] = np.float64(fun(x, *args))
                E[r] = cur
                xn, low = _min_numeric(E, r, xd, C)
            nfev += 2 * r
            if not (math.isfinite(xn) and math.isfinite(low)):
                x[d] = xd  # an angle whose restriction is not finite stays where it was
                reason = NONFINITE
                break
            x[d] = xn
            cur = low
        if reason != RUNNING:
            f = cur
            break
        fprev = f
        f = np.float64(fun(x, *args))
        nfev += 1
        it += 1
        H[it] = f
        fresh = True
    I[0] = it
    I[1] = nfev
    I[2] = reason
    F[0] = f
    F[1] = fprev
    return reason


# ---------------------------------------------------------------------------------------------
# the public entry point
# ---------------------------------------------------------------------------------------------
def _angles(x0) -> np.ndarray:
    a = np.asarray(x0)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise TypeError(f"x0: dtype {a.dtype}; expected real angles (float or integer)")
    if a.size == 0:
        raise ValueError(f"x0: no parameters (shape {a.shape})")
    if not np.all(np.isfinite(a)):
        raise ValueError("x0: contains NaN or inf")
    return np.array(a, dtype=np.float64, order="C", copy=True).reshape(-1)


def _frequencies(num_freqs, shape) -> np.ndarray:
    """``num_freqs`` as one int64 per angle (C order of ``x0``), every entry ``>= 1``."""
    n = int(np.prod(shape))
    if isinstance(num_freqs, (bool, np.bool_)):
        raise TypeError(f"num_freqs must be a positive integer or an integer array, got {num_freqs!r}")
    if isinstance(num_freqs, (int, np.integer)):
        if num_freqs < 1:
            raise ValueError(f"num_freqs={num_freqs}; expected an integer >= 1 (frequencies 1..num_freqs)")
        return np.full(n, int(num_freqs), dtype=np.int64)
    a = np.asarray(num_freqs)
    if a.dtype.kind not in "iu":
        raise TypeError(f"num_freqs: dtype {a.dtype}; expected integers (the number of frequencies of each angle)")
    if a.shape not in (tuple(shape), (n,)):
        raise ValueError(f"num_freqs: shape {a.shape} for {n} angles (x0 of shape {tuple(shape)}); expected one "
                         f"integer, or an array of shape {tuple(shape)} or ({n},)")
    if np.any(a < 1):
        k = int(np.argmax(a.reshape(-1) < 1))
        raise ValueError(f"num_freqs[{k}] = {int(a.reshape(-1)[k])}; every angle needs an integer >= 1")
    return a.astype(np.int64).reshape(-1)


def _compiled_fun(fun, x, args):
    """``FnRef`` of the njit ``fun`` for ``(x, *args)``; a ``TypeError`` when it does not compile or returns
    something other than a real number."""
    register_fnref()  # the FnRef type must exist before the loop is typed
    fty, rt = fn_type(fun, (numba.typeof(x),) + tuple(numba.typeof(a) for a in args), "fun(x, *args)")
    if not isinstance(rt, (types.Float, types.Integer)) or isinstance(rt, types.Boolean):
        raise TypeError(f"fun must return a real scalar loss, but returns {rt}")
    return FnRef(fun, fty)


def rotosolve(fun: Callable[..., Any], x0: ArrayLike, *, args: tuple[Any, ...] = (), num_freqs: int | ArrayLike = 1,
              maxiter: int = 100, ftol: float | None = None, f_target: float | None = None,
              callback: Callable[[OptimizeResult], bool | None] | None = None, callback_every: int = 1,
              compiled: bool | None = None) -> OptimizeResult:
    """Minimise ``fun(x, *args) -> loss`` by Rotosolve sweeps (PennyLane's ``RotosolveOptimizer``, compiled).

    ``fun`` must be a trigonometric polynomial in every angle with integer frequencies ``1..num_freqs[d]``:
    ``num_freqs=1`` for angles that each feed one gate ``exp(-i theta P / 2)`` (RX, RY, RZ, any Pauli rotation),
    ``R`` for an angle feeding ``R`` such gates; one integer for all angles or one per angle (an array of
    ``x0``'s shape or flat). ``x`` is 1-D float64 (``x0`` flattened and copied); ``fun`` must neither keep nor
    modify it. A sweep visits the angles in index order and moves each to the global minimiser of the cost
    along it, from ``2 * num_freqs[d]`` new evaluations (closed form for 1 frequency, a reconstruction and a
    univariate minimisation otherwise), then evaluates the loss once afresh.

    Stops after ``maxiter`` sweeps, when ``|f_k - f_(k-1)| <= ftol * max(|f_k|, |f_(k-1)|, 1)`` between sweeps,
    when the loss is ``<= f_target``, when an evaluation is not finite, or when ``callback(result) -> stop?``
    (every ``callback_every`` sweeps, with a snapshot whose ``x`` is the live array) returns True or raises
    StopIteration. With an ``@numba.njit`` ``fun`` the sweeps run compiled (cached on disk: a fresh process
    compiles nothing of numbaopt's); a Python ``fun`` (a PennyLane QNode works) or ``compiled=False`` runs the
    same loop interpreted, with bitwise the same iterates for the same ``fun``.

    Returns an :class:`~numbaopt.OptimizeResult`: ``x``, ``fun`` (the loss at ``x``, freshly evaluated unless
    the loop stopped on a non-finite value), ``nit`` (sweeps), ``nfev``, ``history`` (the loss at ``x0`` and
    after every sweep, ``nit + 1`` values), ``converged`` (``ftol`` or ``f_target`` met), ``status``,
    ``message``, ``num_freqs`` (per angle) and ``seconds`` (wall time of the loop).
    """
    if not callable(fun):
        raise TypeError(f"fun must be callable, got {fun!r}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")
    callback_every = count("callback_every", callback_every, 1)
    maxiter = count("maxiter", maxiter, 0)
    ftol = nonneg("ftol", ftol)
    ftarget = float(loss_targets(f_target, 1, False)[0])
    shape = np.shape(x0)
    x = _angles(x0)
    R = _frequencies(num_freqs, shape)
    rmax = int(R.max())
    E = np.empty(2 * rmax + 1)
    C = np.empty(2 * rmax + 1)
    I = np.zeros(3, dtype=np.int64)  # noqa: E741  sweeps, nfev, status
    F = np.array([np.nan, np.nan])  # f, f of the previous sweep
    H = np.full(maxiter + 1, np.nan)
    if compiled is None:
        compiled = is_njit(fun)
    if compiled:
        if not is_njit(fun):
            raise TypeError("compiled=True needs fun to be a @numba.njit function")
        loop, f = _sweeps, _compiled_fun(fun, x, args)
    else:
        loop, f = _sweeps.py_func, checked_loss(fun)  # a str, None or vector loss is named, not a NumPy error

    def advance(nsteps):
        return loop(f, args, x, R, E, C, nsteps, maxiter, ftol, ftarget, I, F, H)

    t0 = time.perf_counter()
    if callback is None:
        advance(maxiter)
    else:
        while advance(callback_every) == RUNNING:
            it = int(I[0])
            snap = OptimizeResult(x=x, fun=float(F[0]), nit=it, nfev=int(I[1]), history=H[:it + 1])
            try:
                stop = callback(snap)
            except StopIteration:
                stop = True
            if stop:
                I[2] = CALLBACK
                break
    seconds = time.perf_counter() - t0
    it, code = int(I[0]), int(I[2])
    if code == RUNNING:  # cannot happen: the loop returns only on a reason or after a chunk
        code = MAXITER
    return OptimizeResult(x=x.copy(), fun=float(F[0]), nit=it, nfev=int(I[1]), converged=code in _SUCCESS,
                          status=code, message=MESSAGES[code],
                          history=H[:it + 1].copy(), num_freqs=R, seconds=seconds)
