"""The quantum natural gradient's linear algebra: solve ``(G + lam*I) out = g`` in compiled code, without LAPACK.

Numba's ``np.linalg`` calls LAPACK through SciPy; numbaopt does not depend on SciPy, so the two solvers
the natural gradient needs are written here, for the small dense symmetric matrices of variational circuits
(tens to a few hundred angles):

* a Cholesky factorisation ``A = L L^T`` (``n^3/3`` multiply-adds), the path whenever ``A = G + lam*I`` is
  positive definite and not nearly singular: every pivot above ``PIVOT_RTOL`` times the largest diagonal
  entry (a pivot of a positive semidefinite matrix without full rank comes out at rounding level, or
  negative);
* otherwise the pseudo-inverse of the symmetric matrix by the cyclic Jacobi eigenvalue method
  (Golub & Van Loan, *Matrix Computations*, 4th ed., section 8.5; :func:`jacobi_eigh`, which QN-SPSA also uses,
  warm-started from its last eigenbasis): ``A = V diag(w) V^T``, eigenvalues with
  ``|w_i| <= PINV_RCOND * max |w|`` dropped. That is what PennyLane's ``QNGOptimizer`` does on every step
  (``pennylane/optimize/qng.py``, ``apply_grad``: ``pinv(G + lam*I) @ g`` with NumPy's default
  ``rcond=1e-15``; the singular values of a symmetric matrix are the ``|w_i|``), so a singular metric
  (``lam=0`` with a redundant parametrisation) gives the same minimum-norm step as PennyLane.

Where both apply (a well-conditioned ``A``) they agree to rounding, so iterates match PennyLane's to about
``cond(A) * 1e-16``. ``G`` is read as ``(G + G^T) / 2`` (a metric is symmetric; for an exactly symmetric
``G`` the mean changes no bit).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["natural_gradient", "jacobi_eigh", "workspace", "PIVOT_RTOL", "PINV_RCOND", "CHOLESKY", "PINV", "NONFINITE"]

_NJ = dict(cache=True, error_model="numpy")

#: a Cholesky pivot at or below this times the largest diagonal entry sends the solve to the pseudo-inverse
PIVOT_RTOL = 1e-12
#: eigenvalues at or below this times the largest ``|eigenvalue|`` are dropped (NumPy ``pinv``'s default rcond)
PINV_RCOND = 1e-15
#: what :func:`natural_gradient` returns: the path it took
CHOLESKY, PINV, NONFINITE = 0, 1, -1
#: Jacobi sweeps before giving up on the last rounding-level off-diagonal entries (6 to 10 are typical)
_MAX_SWEEPS = 60


def workspace(n: int) -> np.ndarray:
    """Scratch memory for :func:`natural_gradient` on ``n`` parameters: ``(2n + 1, n)`` float64 (the factor or
    the eigen-decomposition, its eigenvectors and one vector). Pass it to avoid an allocation per call."""
    return np.empty((2 * n + 1, n))


@njit(**_NJ)
def _load(G, lam, A):
    """``A = (G + G^T)/2 + lam*I``; whether every entry (and lam) is finite."""
    n = A.shape[0]
    ok = math.isfinite(lam)
    for i in range(n):
        for j in range(n):
            a = 0.5 * (np.float64(G[i, j]) + np.float64(G[j, i]))
            ok = ok and math.isfinite(a)
            A[i, j] = a
        A[i, i] += lam
    return ok


@njit(**_NJ)
def _cholesky(A):
    """Overwrite the lower triangle of ``A`` with ``L`` (``A = L L^T``); False when a pivot is at or below
    ``PIVOT_RTOL * max_i A_ii`` (not positive definite, or too close to singular for a meaningful solve)."""
    n = A.shape[0]
    dmax = 0.0
    for i in range(n):
        dmax = max(dmax, A[i, i])
    tol = PIVOT_RTOL * dmax
    for j in range(n):
        s = A[j, j]
        for k in range(j):
            s -= A[j, k] * A[j, k]
        if not s > tol:  # also catches dmax <= 0 (a zero metric with lam = 0)
            return False
        d = math.sqrt(s)
        A[j, j] = d
        for i in range(j + 1, n):
            s = A[i, j]
            for k in range(j):  # rows i and j of L, both contiguous
                s -= A[i, k] * A[j, k]
            A[i, j] = s / d
    return True


@njit(**_NJ)
def _cholesky_solve(L, b):
    """Solve ``L L^T x = b`` in place in ``b`` (forward, then backward substitution)."""
    n = L.shape[0]
    for i in range(n):
        s = np.float64(b[i])
        for k in range(i):
            s -= L[i, k] * b[k]
        b[i] = s / L[i, i]
    for i in range(n - 1, -1, -1):
        s = np.float64(b[i])
        for k in range(i + 1, n):
            s -= L[k, i] * b[k]
        b[i] = s / L[i, i]


@njit(**_NJ)
def _rotate(A, i, j, k, l, s, tau):
    """Rotate the pair ``(A[i, j], A[k, l])`` by the Jacobi rotation ``(s, tau = s / (1 + c))``."""
    a, b = A[i, j], A[k, l]
    A[i, j] = a - s * (b + tau * a)
    A[k, l] = b + s * (a - tau * b)


@njit(**_NJ)
def jacobi_eigh(A, W, max_sweeps):
    """Diagonalise the symmetric ``A`` (upper triangle read; the lower one is scratch) in place by cyclic
    Jacobi rotations, applied to the rows of ``W`` too: ``diag(A) -> Lambda``, ``W -> Q^T W`` for ``A = Q
    Lambda Q^T``. Returns the sweeps taken (``max_sweeps + 1``: not converged). Numerical Recipes' rotations
    (Press et al., 11.1) and threshold in the first 3 sweeps; an element below ``eps ||A||_F`` (the rounding
    of a rotation; eigenvalues to ``~eps ||A||``, as LAPACK's) or too small to change its diagonal elements is
    set to 0 (NR's test alone chases rounding next to near-zero eigenvalues: twice the sweeps on a VQE metric).
    """
    n = A.shape[0]
    fro = 0.0
    for p in range(n):
        fro += A[p, p] * A[p, p]
        for q in range(p + 1, n):
            fro += 2.0 * A[p, q] * A[p, q]
    tiny = 2.220446049250313e-16 * math.sqrt(fro)
    for sweep in range(max_sweeps):
        off = 0.0
        for p in range(n - 1):
            for q in range(p + 1, n):
                off += abs(A[p, q])
        if off == 0.0:
            return sweep
        thresh = 0.2 * off / (n * n) if sweep < 3 else 0.0
        for p in range(n - 1):
            for q in range(p + 1, n):
                apq = A[p, q]
                g = 100.0 * abs(apq)
                app, aqq = A[p, p], A[q, q]
                if abs(apq) <= tiny or (sweep > 3 and abs(app) + g == abs(app) and abs(aqq) + g == abs(aqq)):
                    A[p, q] = 0.0
                    continue
                if abs(apq) <= thresh:
                    continue
                h = aqq - app
                if abs(h) + g == abs(h):
                    t = apq / h
                else:
                    theta = 0.5 * h / apq
                    t = 1.0 / (abs(theta) + math.sqrt(1.0 + theta * theta))
                    if theta < 0.0:
                        t = -t
                c = 1.0 / math.sqrt(1.0 + t * t)
                s = t * c
                tau = s / (1.0 + c)
                A[p, p] = app - t * apq
                A[q, q] = aqq + t * apq
                A[p, q] = 0.0
                for j in range(p):  # (j, p), (j, q) for j < p < q, and so on: the upper triangle only
                    _rotate(A, j, p, j, q, s, tau)
                for j in range(p + 1, q):
                    _rotate(A, p, j, j, q, s, tau)
                for j in range(q + 1, n):
                    _rotate(A, p, j, q, j, s, tau)
                for j in range(n):
                    _rotate(W, p, j, q, j, s, tau)
    return max_sweeps + 1


@njit(**_NJ)
def _pinv_solve(A, V, tmp, g, out):
    """``out = pinv(A) g`` for the symmetric ``A`` (destroyed): eigenvalues at or below ``PINV_RCOND`` times the
    largest |eigenvalue| are dropped."""
    n = A.shape[0]
    for i in range(n):
        for j in range(n):
            V[i, j] = 1.0 if i == j else 0.0
    jacobi_eigh(A, V, _MAX_SWEEPS)  # V -> Q^T: its rows are the eigenvectors
    wmax = 0.0
    for i in range(n):
        wmax = max(wmax, abs(A[i, i]))
    cut = PINV_RCOND * wmax
    for i in range(n):  # tmp = diag(1/w) V^T g, kept eigenvalues only (reads g before out is written)
        w = A[i, i]
        if abs(w) > cut:
            s = 0.0
            for k in range(n):
                s += V[i, k] * np.float64(g[k])
            tmp[i] = s / w
        else:
            tmp[i] = 0.0
    for k in range(n):
        s = 0.0
        for i in range(n):
            s += V[i, k] * tmp[i]
        out[k] = s


@njit(**_NJ)
def natural_gradient(g, G, lam, out, work=None):
    """Write the natural gradient ``(G + lam*I)^+ g`` into ``out``; returns the path taken.

    ``g`` (n,) is the gradient, ``G`` (n, n) the metric tensor (read as ``(G + G^T)/2``; a block-diagonal
    approximation is the full matrix with zeros off the blocks: the Cholesky factor keeps those zeros exactly),
    ``lam`` the Tikhonov regularisation PennyLane's ``QNGOptimizer`` calls ``lam``. ``out`` may be ``g`` itself
    (in-place). ``work`` is scratch from :func:`workspace` (allocated per call when omitted). Callable from
    ``@njit`` code and from Python. Returns ``CHOLESKY`` (0: positive definite, solved by Cholesky), ``PINV``
    (1: singular or nearly so, pseudo-inverse as PennyLane) or ``NONFINITE`` (-1: ``G``, ``g`` or ``lam`` not
    finite; ``out`` is NaN, so a loop on it stops on a non-finite gradient). A ``ValueError`` names a shape
    mismatch.
    """
    n = g.shape[0]
    if G.ndim != 2 or G.shape[0] != n or G.shape[1] != n:
        raise ValueError("natural_gradient: G must have shape (n, n) for a gradient g of n entries")
    if out.shape[0] != n:
        raise ValueError("natural_gradient: out must have the shape of g")
    if work is None:
        buf = np.empty((2 * n + 1, n))
    else:
        buf = work
    if buf.shape[0] < 2 * n + 1 or buf.shape[1] != n:
        raise ValueError("natural_gradient: work must have shape (2n + 1, n): use numbaopt.quantum.workspace(n)")
    A = buf[:n]
    finite = _load(G, np.float64(lam), A)
    for i in range(n):
        finite = finite and math.isfinite(g[i])
    if not finite:
        for i in range(n):
            out[i] = np.nan
        return NONFINITE
    if _cholesky(A):
        tmp = buf[2 * n]
        for i in range(n):
            tmp[i] = g[i]
        _cholesky_solve(A, tmp)
        for i in range(n):
            out[i] = tmp[i]
        return CHOLESKY
    _load(G, np.float64(lam), A)  # the failed factorisation overwrote part of A
    _pinv_solve(A, buf[n:2 * n], buf[2 * n], g, out)
    return PINV
