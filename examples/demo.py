"""What ``make demo`` runs: two short real optimisations, each one compiled loop, and a convergence plot.

1. Logistic regression on synthetic data with a fused chain (weight decay -> gradient clipping -> Adam)
   through ``numbaopt.minimize``; compared with the same steps taken by a Python loop of ``update_`` and by
   a plain Python loop of NumPy (the loss, its gradient and the three rules written with NumPy arrays).
2. The 6-qubit transverse-field Ising VQE (``examples/vqe.py``) with Adam and an exponentially decaying
   learning-rate schedule applied inside the compiled loop, to 1e-4 relative of the exact ground energy; compared with
   a Python loop around the same ``@njit`` simulator and a NumPy Adam step.

With matplotlib installed (``pip install 'numbaopt[plot]'``; ``make demo`` installs it) it writes
``demo_convergence.png`` (or the path given as the first argument): the error on a log scale against the
iteration and against the wall time, compiled loop vs Python loop, for both problems.
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

B1, B2, EPS = 0.9, 0.999, 1e-8


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


def numpy_adam_step(x, g, m, v, t, lr):
    """Adam's published step with NumPy arrays, in place (numbaopt's Adam computes the same formula)."""
    m *= B1
    m += (1 - B1) * g
    v *= B2
    v += (1 - B2) * g * g
    x -= lr * (m / (1 - B1 ** t)) / (np.sqrt(v / (1 - B2 ** t)) + EPS)


def timed_minimize(fun, x0, rule, every, measure=None, **kw):
    """``minimize`` once for its time, once more with a callback every ``every`` iterations reading the
    clock (the curves' time axis: measured, not interpolated) and ``measure(x)`` when given.
    Returns (result, seconds, iterations, times, measures) of the callback points."""
    t0 = time.perf_counter()
    res = no.minimize(fun, x0, rule, **kw)
    dt = time.perf_counter() - t0
    its, ts, ms = [], [], []

    def stamp(r):
        ts.append(time.perf_counter() - t1)
        its.append(r.nit)
        if measure is not None:
            ms.append(measure(r.x))

    t1 = time.perf_counter()
    no.minimize(fun, x0, rule, callback=stamp, callback_every=every, **kw)
    return res, dt, np.array(its), np.array(ts), np.array(ms)


def newton_fixed_point(A, y, wd, iters=30):
    """Where the chain stops moving: ``grad(loss) + wd * w = 0`` (clipping keeps zero at zero), i.e. the
    minimum of the mean logistic loss + ``wd/2 |w|^2``, by Newton's method (independent of numbaopt)."""
    m, n = A.shape
    w = np.zeros(n)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(A @ w)))
        grad = A.T @ (p - y) / m + wd * w
        hess = (A.T * (p * (1 - p))) @ A / m + wd * np.eye(n)
        w -= np.linalg.solve(hess, grad)
    return w


def logistic_demo(m=200, n=10, steps=3000, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    y = (rng.random(m) < 1.0 / (1.0 + np.exp(-A @ w_true))).astype(np.float64)
    wd, delta, lr = 1e-4, 1.0, 0.05
    rule = no.chain(no.WeightDecay(wd), no.ClipGrad(delta), no.Adam(lr))
    w0 = np.zeros(n)

    t0 = time.perf_counter()
    no.minimize(logistic_loss, w0, rule, args=(A, y), maxiter=2)  # compile (or load from the cache)
    first_min = time.perf_counter() - t0
    w_star = newton_fixed_point(A, y, wd)
    dist = lambda w: float(np.linalg.norm(w - w_star))  # noqa: E731
    res, t_comp, c_its, c_ts, c_err = timed_minimize(logistic_loss, w0, rule, 20, dist, args=(A, y),
                                                     maxiter=steps, gtol=1e-5)

    # the same iterations, driven from Python (a loop of update_), for comparison; precompile: every kernel
    # update_ will use compiled (or loaded from the disk cache) now, outside the timed loop
    w = w0.copy()
    g = np.empty_like(w)
    state = no.setup(rule, w)
    t0 = time.perf_counter()
    no.precompile(state, w)
    first_upd = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(res.nit):
        logistic_loss(w, g, A, y)
        state, w = no.update_(state, w, g)
    t_upd = time.perf_counter() - t0
    same = bool(np.array_equal(w, res.x))

    # a plain Python loop of NumPy: the loss and gradient, weight decay, clipping and Adam
    w = w0.copy()
    mo, v = np.zeros(n), np.zeros(n)
    py_err, py_ts = np.empty(res.nit), np.empty(res.nit)
    t0 = time.perf_counter()
    for k in range(res.nit):
        z = A @ w
        loss = np.mean(np.logaddexp(0.0, z) - y * z)  # noqa: F841  (computed, as a loop would, for its cost)
        d = A.T @ (1.0 / (1.0 + np.exp(-z)) - y) / m + wd * w
        np.clip(d, -delta, delta, out=d)
        numpy_adam_step(w, d, mo, v, k + 1, lr)
        py_ts[k] = time.perf_counter() - t0
        py_err[k] = np.linalg.norm(w - w_star)  # after the clock: not part of the loop's cost
    t_np = py_ts[-1]

    acc = np.mean((A @ res.x > 0) == (y > 0.5))
    print("1. logistic regression: %d samples x %d features, chain(WeightDecay, ClipGrad, Adam)" % (m, n))
    print("   loss %.6f after %d iterations (%s); training accuracy %.3f" % (res.fun, res.nit, res.message, acc))
    print("   first use, not in the times below (compiles once per machine, then loads from the disk cache): "
          "minimize %.2f s, update_ %.2f s (precompile)" % (first_min, first_upd))
    print("   compiled minimize %.3f s; Python loop of update_ %.3f s (same result: %s); Python loop of NumPy "
          "%.3f s" % (t_comp, t_upd, same, t_np))
    return dict(title="logistic regression (%d x %d), chain(WeightDecay, ClipGrad, Adam)" % (m, n),
                ylabel="|w - w*| (w*: Newton's method)", compiled=(c_its, c_ts, c_err),
                python=(np.arange(1, res.nit + 1), py_ts, py_err), python_name="Python loop, NumPy")


def vqe_demo(nq=6, layers=6, lr=0.05, maxiter=3000):
    # a Schedule (indexed by the step t, from 1) rather than a function: the Python loop below calls it
    # with the same t as the compiled loop, whatever convention a plain function would follow
    sched = no.schedules.exponential(lr, 0.5, 1000)
    exact = vqe.exact_ground_energy(nq)
    x0 = vqe.initial_angles(nq, layers)
    args = (nq, layers, 1.0, 1.0)
    t0 = time.perf_counter()
    no.minimize(vqe.energy_grad, x0, no.Adam(lr), args=args, maxiter=2)  # compile (or load from the cache)
    first_min = time.perf_counter() - t0
    res, dt, c_its, c_ts, _ = timed_minimize(vqe.energy_grad, x0, no.Adam(lr), 20, args=args, maxiter=maxiter,
                                             gtol=1e-6, schedule=sched)
    # a Python loop around the same @njit simulator, with NumPy Adam and the same schedule
    th = x0.copy()
    g, mo, v = np.empty_like(th), np.zeros_like(th), np.zeros_like(th)
    py_e, py_ts = np.empty(res.nit + 1), np.empty(res.nit + 1)
    t0 = time.perf_counter()
    for k in range(res.nit + 1):
        py_e[k] = vqe.energy_grad(th, g, *args)  # the energy at iterate k: known once it is evaluated
        py_ts[k] = time.perf_counter() - t0
        if k < res.nit:
            numpy_adam_step(th, g, mo, v, k + 1, sched(k + 1))
    # the compiled loop's energy at the callback points: history[nit - 1] was evaluated by then
    err = res.history - exact
    rel = abs(res.fun - exact) / abs(exact)
    print("2. VQE, transverse-field Ising chain, %d qubits, %d angles, Adam, lr halved every 1000 steps"
          % (nq, vqe.n_params(nq, layers)))
    print("   first use, not in the times below (compiles once per machine, then loads from the disk cache): "
          "minimize %.2f s" % first_min)
    print("   energy %.8f  exact %.8f  relative error %.1e (%s 1e-4) in %d iterations, %.2f s"
          % (res.fun, exact, rel, "<" if rel < 1e-4 else "NOT <", res.nit, dt))
    print("   Python loop (same @njit simulator, NumPy Adam): energy %.8f, %.2f s" % (py_e[-1], py_ts[-1]))
    return dict(title="VQE, TFIM %d qubits, %d angles, Adam" % (nq, vqe.n_params(nq, layers)),
                ylabel="energy - exact ground energy", compiled=(c_its, c_ts, err[c_its - 1]),
                python=(np.arange(res.nit + 1), py_ts, py_e - exact),
                python_name="Python loop, @njit simulator + NumPy Adam",
                iterations=(np.arange(err.size), err)), rel


def plot(cases, path):
    """The convergence figure: one row per problem, the error against the iteration and against the wall
    time, both compiled loop and Python loop, log scales."""
    from matplotlib.figure import Figure  # no pyplot: the user's backend is not touched

    fig = Figure(figsize=(11, 4.2 * len(cases)))  # a fixed layout: constrained layout doubles the drawing
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.07, top=0.95, wspace=0.22, hspace=0.3)
    axes = fig.subplots(len(cases), 2, squeeze=False)
    for (ax_i, ax_t), c in zip(axes, cases):
        its, ts, err = c["compiled"]
        p_its, p_ts, p_err = c["python"]
        full_its, full_err = c.get("iterations", (its, err))  # every iteration where the history has it
        ax_i.plot(full_its, full_err, lw=2, label="numbaopt.minimize (compiled loop)")
        ax_i.plot(p_its, p_err, "--", lw=1.2, label=c["python_name"])
        ax_i.set_xlabel("iteration")
        # the compiled loop's clock is read by a callback every few iterations, the Python loop's every one
        ax_t.plot(ts, err, lw=2, label="numbaopt.minimize (compiled loop)")
        ax_t.plot(p_ts, p_err, "--", lw=1.2, label=c["python_name"])
        ax_t.set_xscale("log")
        ax_t.set_xlabel("wall time (s, log scale)")
        for ax in (ax_i, ax_t):
            ax.set_yscale("log")
            ax.minorticks_off()  # a third of the drawing time, and no information here
            ax.set_ylabel(c["ylabel"])
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=8)
        ax_i.set_title(c["title"], fontsize=10)
    fig.savefig(path, dpi=90)
    return os.path.abspath(path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else "demo_convergence.png"
    t0 = time.perf_counter()
    c1 = logistic_demo()
    c2, rel = vqe_demo()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("3. no convergence plot: matplotlib is not installed (pip install 'numbaopt[plot]' or "
              "pip install matplotlib)")
    else:
        print("3. convergence plot (log-scale error vs iteration and vs time): %s" % plot([c1, c2], path))
    print("demo finished in %.1f s" % (time.perf_counter() - t0))
    return 0 if rel < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
