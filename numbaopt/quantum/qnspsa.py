"""QN-SPSA, quantum natural SPSA (Gacon, Zoufal, Carleo, Woerner, "Simultaneous Perturbation Stochastic
Approximation of the Quantum Fisher Information", Quantum 5, 567 (2021)), step for step as PennyLane's
``qml.QNSPSAOptimizer`` (pennylane/optimize/qnspsa.py); the whole loop is compiled for ``@njit`` objectives.

Per step, for each resampling, three +-1 directions ``h, h1, h2`` (PennyLane's order), ``eps``, the fidelity
``F(a, b) = |<psi(a)|psi(b)>|^2`` and the step count ``k = 1, 2, ...`` (``G_0 = I``)::

    g   = (f(x + eps h) - f(x - eps h)) / (2 eps) h                               (2 evaluations)
    M   = -(F(x, x + eps (h1 + h2)) - F(x, x + eps h1) - F(x, x + eps (h2 - h1)) + F(x, x - eps h1))
          / (8 eps^2) (h1 h2^T + h2 h1^T)                                         (4 overlaps)
    A   = k / (k + 1) G_(k-1) + 1 / (k + 1) mean(M) = V Lambda V^T                 (running average)
    G_k = (sqrtm(A A) + reg I) / (1 + reg) = V (|Lambda| + reg) / (1 + reg) V^T
    x'  = pinv(G_k) (-lr mean(g) + G_k x), rejected (blocking) if f(x) + 2 std(last losses) < f(x')

PennyLane calls scipy's ``sqrtm`` and ``pinv``; here a Jacobi routine of our own diagonalises ``A``, starting
from the last eigenbasis ``W`` (``W A W^T`` is diagonal plus the rank-2 ``W M W^T``, built in O(n^2)).
``average="raw"`` averages the raw estimates instead (the paper's, Qiskit's). The loss of an accepted point is
carried over, where PennyLane measures ``f(x)`` again: the same iterates for a deterministic ``fun``.
docs/quantum.md (QN-SPSA) has the details and the measurements.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, types

from ..loops import CALLBACK, NONFINITE, TARGET, OptimizeResult
from ..loops.drivers import REASONS, stop_reason
from ..loops.fnref import FnRef, fn_type, fnref_type
from ..loops.problem import count, is_njit, loss_value
from ..loops.spsa import rademacher
from .linalg import jacobi_eigh

__all__ = ["minimize_qnspsa", "pennylane_directions", "TARGET"]

_NJ = dict(cache=True, error_model="numpy", nogil=True)

# the status codes and messages are numbaopt.loops' (TARGET: the loss reached ``f_target``); there is no gradient
_REASONS = {**REASONS, NONFINITE: "non-finite loss"}
# the integer state of a run (array I): which slot holds what
_IT, _K, _NFEV, _NOV, _REASON, _REJECTED, _USE_DIR, _BLOCKING, _R, _MAXITER, _AVG_REG = range(11)
_JACOBI_SWEEPS = 100  # Jacobi converges quadratically: a warm start takes a few sweeps, a cold one ~10


# ---------------------------------------------------------------------------------------------
# compiled kernels (called from the compiled driver and, as compiled code too, from the interpreted one)
# ---------------------------------------------------------------------------------------------
@njit(**_NJ)
def _shift(out, x, eps, d1, c1, d2, c2):
    """``out = x + eps * (c1 d1 + c2 d2)``: the sum of directions first, as PennyLane writes
    ``arg + eps * (dir1 + dir2)`` (exact in integers, so the perturbed points are PennyLane's bit for bit)."""
    for i in range(x.shape[0]):
        out[i] = x[i] + eps * (c1 * d1[i] + c2 * d2[i])


@njit(**_NJ)
def _add_gradient(g, coef, h, first):
    for i in range(g.shape[0]):
        g[i] = coef * h[i] if first else g[i] + coef * h[i]


@njit(**_NJ)
def _np_sum(a, m):
    """``numpy.sum(a[:m])`` with NumPy's own summation order (sequential below 8, eight partial sums up to
    128), so the blocking tolerance is PennyLane's to the bit."""
    if m < 8:
        s = 0.0
        for i in range(m):
            s += a[i]
        return s
    r = a[:8].copy()
    i = 8
    while i < m - m % 8:
        for j in range(8):
            r[j] += a[i + j]
        i += 8
    s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for j in range(i, m):
        s += a[j]
    return s


@njit(**_NJ)
def _std(a, m, tmp):
    """``numpy.std(a[:m])`` (population standard deviation), computed as NumPy does."""
    mean = _np_sum(a, m) / m
    for i in range(m):
        d = a[i] - mean
        tmp[i] = d * d
    return math.sqrt(_np_sum(tmp, m) / m)


@njit(**_NJ)
def _metric_step(W, EV, D, S, R, k, reg, B, AB, average_regularized):
    """Average the metric estimates of this step (the step count is ``k``) into the running average and
    regularise it: ``B = W A W^T`` in O(n^2), Jacobi from there. ``EV[0] = mu = (|lambda| + reg) / (1 + reg)``
    (``G = W^T diag(mu) W``, the matrix of the step) and ``EV[1] = lambda``, the raw average's eigenvalues;
    PennyLane averages into the regularised ``G`` (``average_regularized``), Gacon et al. into the raw one."""
    n = W.shape[0]
    mu, lam = EV[0], EV[1]
    base = mu if average_regularized else lam
    for r in range(R):
        for j in range(2):
            h = D[r, j + 1]
            for i in range(n):
                acc = 0.0
                for c in range(n):
                    acc += W[i, c] * h[c]
                AB[r, j, i] = acc
    wk, wm = k / (k + 1), 1 / (k + 1)
    for i in range(n):
        for j in range(i, n):
            m = 0.0
            for r in range(R):
                m += S[r] * (AB[r, 0, i] * AB[r, 1, j] + AB[r, 1, i] * AB[r, 0, j])
            v = wm * (m / R)
            if i == j:
                v += wk * base[i]
            B[i, j] = B[j, i] = v
    sweeps = jacobi_eigh(B, W, _JACOBI_SWEEPS)
    for i in range(n):
        lam[i] = B[i, i]
        mu[i] = (abs(lam[i]) + reg) / (1.0 + reg)
    return sweeps


@njit(**_NJ)
def _natural_step(x, g, W, mu, lr, out, Y):
    """``out = pinv(G) (-lr g + G x)`` for ``G = W^T diag(mu) W``, with NumPy's pinv cutoff."""
    n = x.shape[0]
    cut = 1e-15 * np.max(mu)
    for i in range(n):
        y = 0.0
        z = 0.0
        for c in range(n):
            y += W[i, c] * x[c]
            z += W[i, c] * g[c]
        Y[i] = (mu[i] * y - lr * z) / mu[i] if mu[i] > cut else 0.0
    for c in range(n):
        out[c] = 0.0
    for i in range(n):
        for c in range(n):
            out[c] += W[i, c] * Y[i]


@njit(**_NJ)
def _run(fun, overlap, args, x, xn, xp, g, D, DIR, W, EV, B, AB, Y, S, ring, hist, I, HP, rng, nsteps):
    """Up to ``nsteps`` QN-SPSA steps from the state in the arrays (resumable: chunks for callbacks).
    ``HP = [lr, eps, eps**2, reg, f_target, f(x)]``; ``I`` holds the counters (slots named in the module)."""
    lr, eps, eps2, reg, f_target, f = HP[0], HP[1], HP[2], HP[3], HP[4], HP[5]
    it, k, R, maxiter = I[_IT], I[_K], I[_R], I[_MAXITER]
    stop = it + nsteps
    reason = I[_REASON]
    while reason == 0 and it < stop:
        for r in range(R):
            d = D[r]
            for j in range(3):
                if I[_USE_DIR] != 0:
                    d[j, :] = DIR[it, r, j]
                else:
                    rademacher(rng, 0, d[j])
            _shift(xp, x, eps, d[0], 1.0, d[0], 0.0)
            fp = np.float64(fun(xp, *args))
            _shift(xp, x, eps, d[0], -1.0, d[0], 0.0)
            fm = np.float64(fun(xp, *args))
            _add_gradient(g, (fp - fm) / (2.0 * eps), d[0], r == 0)
            _shift(xp, x, eps, d[1], 1.0, d[2], 1.0)
            f0 = np.float64(overlap(x, xp, *args))
            _shift(xp, x, eps, d[1], 1.0, d[2], 0.0)
            f1 = np.float64(overlap(x, xp, *args))
            _shift(xp, x, eps, d[1], -1.0, d[2], 1.0)
            f2 = np.float64(overlap(x, xp, *args))
            _shift(xp, x, eps, d[1], -1.0, d[2], 0.0)
            f3 = np.float64(overlap(x, xp, *args))
            S[r] = -(f0 - f1 - f2 + f3) / (8.0 * eps2)
        if R > 1:
            for i in range(g.shape[0]):
                g[i] = g[i] / R
        I[_NFEV] += 2 * R
        I[_NOV] += 4 * R
        _metric_step(W, EV, D, S, R, k, reg, B, AB, I[_AVG_REG] != 0)
        _natural_step(x, g, W, EV[0], lr, xn, Y)
        k += 1
        if I[_BLOCKING] != 0:  # blocking: PennyLane's tolerance from the losses of the last history_length steps
            fn = np.float64(fun(xn, *args))
            I[_NFEV] += 1
            H = ring.shape[0]
            ring[(k - 2) % H] = f
            tol = 2.0 * _std(ring, H if k > H else k - 1, Y)
            if f + tol < fn:
                I[_REJECTED] += 1
            else:
                x[:] = xn
                f = fn
        else:
            x[:] = xn
            f = np.float64(fun(x, *args))
            I[_NFEV] += 1
        it += 1
        hist[it] = f
        reason = stop_reason(f, 0.0, np.nan, it, maxiter, -1.0, -1.0, f_target)  # no gtol, no ftol
    I[_IT], I[_K], I[_REASON] = it, k, reason
    HP[5] = f
    return 0


# ---------------------------------------------------------------------------------------------
# the Python side
# ---------------------------------------------------------------------------------------------
def pennylane_directions(seed, n, steps, resamplings=1):
    """The +-1 directions ``qml.QNSPSAOptimizer(seed=seed)`` draws for ONE trainable array of ``n`` entries,
    shape ``(steps, resamplings, 3, n)`` (``[h, h1, h2]`` per resampling): PennyLane calls
    ``np.random.default_rng(seed).choice([-1, 1], size=shape)`` for the gradient direction, then ``dir1`` and
    ``dir2``, per resampling and step. Pass it as ``minimize_qnspsa(..., directions=...)``."""
    rng = np.random.default_rng(seed)
    out = np.empty((steps, resamplings, 3, n))
    for s in range(steps):
        for r in range(resamplings):
            for j in range(3):
                out[s, r, j] = rng.choice([-1, 1], size=n)
    return out


_entries: dict = {}  # compiled entry points of _run, by signature


def _positive(name, v, zero_ok=False):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"minimize_qnspsa: {name} must be a real number, got {v!r}")
    v = float(v)
    if not (math.isfinite(v) and (v >= 0 if zero_ok else v > 0)):
        raise ValueError(f"minimize_qnspsa: {name}={v!r}; expected a finite number {'>= 0' if zero_ok else '> 0'}")
    return v


def _directions(directions, maxiter, R, n):
    D = np.asarray(directions, dtype=np.float64)
    if D.ndim == 3 and R == 1:
        D = D[:, None]
    if D.ndim != 4 or D.shape[1:] != (R, 3, n) or D.shape[0] < maxiter:
        raise ValueError(f"minimize_qnspsa: directions must have shape (steps >= maxiter={maxiter}, resamplings={R}, "
                         f"3, n={n}) ([h, h1, h2] per resampling), got {np.shape(directions)}")
    if not np.all(np.abs(D) == 1.0):
        raise ValueError("minimize_qnspsa: directions must hold only +1 and -1")
    return np.ascontiguousarray(D)


def _compiled(fun, overlap, x, args, arrays):
    arr = numba.typeof(x)
    atys = tuple(numba.typeof(a) for a in args)
    fty, frt = fn_type(fun, (arr,) + atys, "fun(x, *args)")
    oty, ort = fn_type(overlap, (arr, arr) + atys, "overlap(x1, x2, *args)")
    for what, rt in (("fun", frt), ("overlap", ort)):
        if not isinstance(rt, (types.Float, types.Integer)) or isinstance(rt, types.Boolean):
            raise TypeError(f"minimize_qnspsa: {what} must return a real scalar, but returns {rt}")
    f_ref, o_ref = FnRef(fun, fty), FnRef(overlap, oty)
    sig = (fnref_type(fty), fnref_type(oty), numba.typeof(args)) + tuple(numba.typeof(a) for a in arrays) + \
        (types.int64,)
    entry = _entries.get(sig)
    if entry is None:
        _run.compile(sig)
        entry = _entries[sig] = _run.overloads[sig].entry_point
    return lambda nsteps: entry(f_ref, o_ref, args, *arrays, nsteps)


def minimize_qnspsa(fun, overlap, x0, *, lr=1e-3, finite_diff_step=1e-2, resamplings=1, blocking=True,
                    history_length=5, regularization=1e-3, average="pennylane", seed=None, directions=None, args=(),
                    maxiter=1000, f_target=None, callback=None, callback_every=1, compiled=None) -> OptimizeResult:
    """Minimise ``fun(x, *args) -> loss`` with QN-SPSA (PennyLane's ``QNSPSAOptimizer``; module docstring).

    ``overlap(x1, x2, *args) -> |<psi(x1)|psi(x2)>|^2``. ``lr`` is PennyLane's ``stepsize``; the other options
    have its names and defaults. Directions: a splitmix64 stream seeded by ``seed`` (``None``: fresh entropy), or
    ``directions``, +-1 of shape ``(steps >= maxiter, resamplings, 3, n)`` (``[h, h1, h2]``;
    :func:`pennylane_directions` gives PennyLane's). ``average``: ``"pennylane"`` (into the regularised metric)
    or ``"raw"``. A step evaluates ``fun`` ``2 resamplings + 1`` and ``overlap`` ``4 resamplings`` times.
    Stops at ``loss <= f_target`` (``converged``), a non-finite loss, ``maxiter`` steps, or when
    ``callback(result)`` (every ``callback_every`` steps; ``x`` is live) returns True or raises StopIteration.
    ``@njit`` ``fun`` and ``overlap`` run compiled (cached, passed by address); otherwise (or ``compiled=False``)
    the same loop runs interpreted, bitwise equal. The result: ``x``, ``fun``, ``nit``, ``nfev``, ``n_overlap``,
    ``rejected``, ``history``, ``metric`` (the last regularised ``G``), ``converged``, ``status``, ``message``.
    """
    for name, f in (("fun", fun), ("overlap", overlap)):
        if not callable(f):
            raise TypeError(f"minimize_qnspsa: {name} must be callable, got {f!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"minimize_qnspsa: callback must be callable, got {callback!r}")
    if not isinstance(args, tuple):
        raise TypeError(f"minimize_qnspsa: args must be a tuple, got {type(args).__name__}")
    x = np.asarray(x0)
    if x.dtype.kind not in "fiu" or x.size == 0:
        raise TypeError(f"minimize_qnspsa: x0 must be a non-empty real array, got dtype {x.dtype} size {x.size}")
    x = np.array(x, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError("minimize_qnspsa: x0 holds a NaN or an infinity")
    n = x.shape[0]
    lr, eps = _positive("lr", lr), _positive("finite_diff_step", finite_diff_step)
    reg = _positive("regularization", regularization, zero_ok=True)
    R, hlen = count("resamplings", resamplings, 1), count("history_length", history_length, 1)
    maxiter, every = count("maxiter", maxiter, 0), count("callback_every", callback_every, 1)
    if not isinstance(blocking, (bool, np.bool_)):
        raise TypeError(f"minimize_qnspsa: blocking must be True or False, got {blocking!r}")
    target = -np.inf if f_target is None else float(f_target)
    if average not in ("pennylane", "raw"):
        raise ValueError(f"minimize_qnspsa: average must be 'pennylane' or 'raw', got {average!r}")
    DIR = np.zeros((1, 1, 3, 1)) if directions is None else _directions(directions, maxiter, R, n)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise TypeError(f"minimize_qnspsa: seed must be a non-negative integer or None, got {seed!r}")
    ss = np.random.SeedSequence(np.random.SeedSequence().entropy if seed is None else int(seed))
    rng = ss.generate_state(1, np.uint64)

    if compiled is None:
        compiled = is_njit(fun) and is_njit(overlap)
    if compiled and not (is_njit(fun) and is_njit(overlap)):
        raise TypeError("minimize_qnspsa: compiled=True needs fun and overlap to be @numba.njit functions")
    f0 = loss_value(fun(x, *args))
    hist = np.full(maxiter + 1, np.nan)
    hist[0] = f0
    I = np.zeros(11, dtype=np.int64)
    I[_K] = I[_NFEV] = 1  # PennyLane's step count k starts at 1; fun was evaluated at x0
    I[_USE_DIR], I[_BLOCKING], I[_R], I[_MAXITER] = directions is not None, bool(blocking), R, maxiter
    I[_AVG_REG] = average == "pennylane"
    I[_REASON] = stop_reason(f0, 0.0, np.nan, 0, maxiter, -1.0, -1.0, target)
    HP = np.array([lr, eps, eps ** 2, reg, target, f0])
    arrays = (x, np.empty(n), np.empty(n), np.zeros(n), np.zeros((R, 3, n)), DIR, np.eye(n), np.ones((2, n)),
              np.empty((n, n)), np.empty((R, 2, n)), np.empty(max(n, hlen)), np.zeros(R), np.zeros(hlen), hist, I,
              HP, rng)
    if compiled:
        step = _compiled(fun, overlap, x, args, arrays)
    else:
        def checked(f, name):
            return lambda *a: loss_value(f(*a), name)
        f_py, o_py = checked(fun, "fun"), checked(overlap, "overlap")
        step = lambda nsteps: _run.py_func(f_py, o_py, args, *arrays, nsteps)  # noqa: E731

    W, mu = arrays[6], arrays[7][0]
    while I[_REASON] == 0:
        step(every if callback is not None else maxiter)
        if I[_REASON] == 0 and callback is not None:
            it = int(I[_IT])
            snap = OptimizeResult(x=x, fun=float(HP[5]), nit=it, history=hist[:it + 1], nfev=int(I[_NFEV]))
            try:
                stop = callback(snap)
            except StopIteration:
                stop = True
            if stop:
                I[_REASON] = CALLBACK
    it, code = int(I[_IT]), int(I[_REASON])
    return OptimizeResult(x=x.copy(), fun=float(HP[5]), nit=it, nfev=int(I[_NFEV]), n_overlap=int(I[_NOV]),
                          rejected=int(I[_REJECTED]), converged=code == TARGET, status=code, message=_REASONS[code],
                          history=hist[:it + 1].copy(), grad_norm=float("nan"), t=it, skipped=int(I[_REJECTED]),
                          state=None, metric=(W.T * mu) @ W)
