"""What ``make demo`` runs: two short real optimisations, each one compiled loop.

1. Logistic regression on synthetic data with a fused chain (weight decay -> gradient clipping -> Adam)
   through ``numbaopt.minimize``; compared with the same steps taken by a Python loop of ``update_``.
2. The 6-qubit transverse-field Ising VQE (``examples/vqe.py``) with Adam and a decaying learning-rate
   schedule applied inside the compiled loop, to 1e-4 relative of the exact ground energy.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
from numba import njit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numbaopt as no  # noqa: E402
import vqe  # noqa: E402


@njit(cache=True, error_model="numpy")
def logistic_loss(w, grad, A, y):
    """Mean logistic loss of labels y in {0, 1} for scores A @ w; writes the gradient."""
    m, n = A.shape
    for j in range(n):
        grad[j] = 0.0
    loss = 0.0
    for i in range(m):
        z = 0.0
        for j in range(n):
            z += A[i, j] * w[j]
        # log(1 + exp(z)) - y z, evaluated without overflow
        loss += (max(z, 0.0) + np.log1p(np.exp(-abs(z)))) - y[i] * z
        p = 1.0 / (1.0 + np.exp(-z))
        r = (p - y[i]) / m
        for j in range(n):
            grad[j] += r * A[i, j]
    return loss / m


def logistic_demo(m=200, n=10, steps=3000, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    y = (rng.random(m) < 1.0 / (1.0 + np.exp(-A @ w_true))).astype(np.float64)
    rule = no.chain(no.WeightDecay(1e-4), no.ClipGrad(1.0), no.Adam(0.05))
    w0 = np.zeros(n)

    no.minimize(logistic_loss, w0, rule, args=(A, y), maxiter=2)  # compile (or load from the cache)
    t0 = time.perf_counter()
    res = no.minimize(logistic_loss, w0, rule, args=(A, y), maxiter=steps, gtol=1e-5)
    t_comp = time.perf_counter() - t0

    # the same iterations, driven from Python (a loop of update_), for comparison
    w = w0.copy()
    g = np.empty_like(w)
    state = no.setup(rule, w)
    t0 = time.perf_counter()
    for _ in range(res.nit):
        logistic_loss(w, g, A, y)
        state, w = no.update_(state, w, g)
    t_py = time.perf_counter() - t0

    acc = np.mean((A @ res.x > 0) == (y > 0.5))
    print("1. logistic regression: %d samples x %d features, chain(WeightDecay, ClipGrad, Adam)" % (m, n))
    print("   loss %.6f after %d iterations (%s); training accuracy %.3f" % (res.fun, res.nit, res.message, acc))
    print("   compiled minimize %.3f s; Python loop of update_ %.3f s; same result: %s"
          % (t_comp, t_py, bool(np.array_equal(w, res.x))))
    return res


def vqe_demo(nq=6, layers=6, lr=0.05, maxiter=3000):
    exact = vqe.exact_ground_energy(nq)
    res, exact, dt = vqe.run(nq, layers, lr=lr, maxiter=maxiter, schedule=lambda t: lr / (1.0 + t / 1000.0))
    rel = abs(res.fun - exact) / abs(exact)
    print("2. VQE, transverse-field Ising chain, %d qubits, %d angles, Adam with lr/(1 + t/1000)"
          % (nq, vqe.n_params(nq, layers)))
    print("   energy %.8f  exact %.8f  relative error %.1e (%s 1e-4) in %d iterations, %.2f s"
          % (res.fun, exact, rel, "<" if rel < 1e-4 else "NOT <", res.nit, dt))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        ax = res.plot(logy=False)
        ax.axhline(exact, color="k", ls="--", lw=1)
        ax.figure.savefig("vqe.png", dpi=120, bbox_inches="tight")
        print("   convergence plot: vqe.png")
    return res, rel


if __name__ == "__main__":
    logistic_demo()
    _, rel = vqe_demo()
    sys.exit(0 if rel < 1e-4 else 1)
