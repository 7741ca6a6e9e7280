"""Compiled optimisation loops against Python loops (all numbers from one process, medians, interleaved).

    .venv/bin/python benchmarks/loops.py            # full run (about a minute)
    .venv/bin/python benchmarks/loops.py --quick    # fewer repeats

1. Adam on a quadratic sum (x - c)^2 with 16 and 256 parameters, steps per second:
   compiled ``numbaopt.minimize`` (njit objective) | Python loop: njit gradient + ``update_`` |
   Python loop: NumPy gradient + NumPy Adam (in place).
2. One Adam step on 16 float64 parameters inside a user's @njit loop: ``jit_step``'s step vs the same
   step written by hand (ns per step; target < 100 ns).
3. The VQE example (6 qubits, 6 layers): time to reach 1e-3 (relative) of the exact ground energy,
   compiled ``minimize`` vs a Python loop over the same simulator and ``update_``; and PennyLane's
   ``qml.AdamOptimizer`` on the same ansatz with ``default.qubit`` when PennyLane is installed, with numbaopt's
   beta1, beta2, eps (PennyLane's default beta2 is 0.99). The two Adams still differ in where eps goes:
   PennyLane folds the bias corrections into the step size and adds eps to the uncorrected sqrt(v), i.e.
   numbaopt's update with eps / sqrt(1 - beta2^t); the iterates differ (by ~1e-2 in angles whose gradient is
   ~1e-7), the iteration counts nearly agree. benchmarks/vqe_vs_pennylane.py matches the eps exactly.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import numpy as np
from numba import njit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
import numbaopt as no  # noqa: E402
import vqe  # noqa: E402


@njit(cache=True, error_model="numpy")
def quad(x, g, c):
    s = 0.0
    for i in range(x.shape[0]):
        d = x[i] - c[i]
        g[i] = 2.0 * d
        s += d * d
    return s


def bench_minimize(n, steps):
    c = np.linspace(-1, 1, n)
    x0 = np.zeros(n)
    t0 = time.perf_counter()
    r = no.minimize(quad, x0, no.Adam(1e-3), args=(c,), maxiter=steps, gtol=None)
    dt = time.perf_counter() - t0
    assert r.nit == steps
    return dt / steps


def bench_update_loop(n, steps):
    c = np.linspace(-1, 1, n)
    x = np.zeros(n)
    g = np.empty(n)
    state = no.setup(no.Adam(1e-3), x)
    update_ = no.update_
    t0 = time.perf_counter()
    for _ in range(steps):
        quad(x, g, c)
        state, x = update_(state, x, g)
    return (time.perf_counter() - t0) / steps


def bench_numpy_loop(n, steps, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    c = np.linspace(-1, 1, n)
    x = np.zeros(n)
    m = np.zeros(n)
    v = np.zeros(n)
    g = np.empty(n)
    tmp = np.empty(n)
    t0 = time.perf_counter()
    for t in range(1, steps + 1):
        np.subtract(x, c, out=g)
        float(np.dot(g, g))  # the loss, as the other two compute it
        g *= 2.0
        m *= b1
        m += (1 - b1) * g
        v *= b2
        np.multiply(g, g, out=tmp)
        tmp *= 1 - b2
        v += tmp
        np.divide(v, 1 - b2 ** t, out=tmp)
        np.sqrt(tmp, out=tmp)
        tmp += eps
        np.divide(m, tmp, out=tmp)
        tmp *= lr / (1 - b1 ** t)
        x -= tmp
    return (time.perf_counter() - t0) / steps


@njit(error_model="numpy")  # no cache: a dispatcher argument misses the cache in every process
def loop_jit_step(step, x, g, S, hp, steps):
    for t in range(1, steps + 1):
        step(x, g, S, hp, t)
    return x[0]


@njit(cache=True, error_model="numpy")
def loop_hand_adam(x, g, m, v, steps, lr, b1, b2, eps):
    for t in range(1, steps + 1):
        bc1 = 1.0 - b1 ** t
        bc2 = 1.0 - b2 ** t
        for i in range(x.shape[0]):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
            x[i] -= lr * (m[i] / bc1) / (math.sqrt(v[i] / bc2) + eps)
    return x[0]


def bench_jit_step(steps):
    x = np.zeros(16)
    g = np.linspace(-1, 1, 16)
    js = no.jit_step(no.Adam(1e-3), x)
    loop_jit_step(js.step, x, g, js.state, js.hp, 10)
    t0 = time.perf_counter()
    loop_jit_step(js.step, x, g, js.state, js.hp, steps)
    return (time.perf_counter() - t0) / steps


def bench_hand(steps):
    x, m, v = np.zeros(16), np.zeros(16), np.zeros(16)
    g = np.linspace(-1, 1, 16)
    loop_hand_adam(x, g, m, v, 10, 1e-3, 0.9, 0.999, 1e-8)
    t0 = time.perf_counter()
    loop_hand_adam(x, g, m, v, steps, 1e-3, 0.9, 0.999, 1e-8)
    return (time.perf_counter() - t0) / steps


# -- VQE: time to 1e-3 ----------------------------------------------------------------------------
NQ, LAYERS, LR, RTOL = 6, 6, 0.05, 1e-3
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # numbaopt's Adam defaults, given to PennyLane's AdamOptimizer too


def vqe_compiled():
    res, exact, dt = vqe.run(NQ, LAYERS, lr=LR, maxiter=20000, target_rtol=RTOL, every=10)
    assert res.fun <= exact + RTOL * abs(exact)
    return dt, res.nit


def vqe_python():
    exact = vqe.exact_ground_energy(NQ)
    target = exact + RTOL * abs(exact)
    t0 = time.perf_counter()
    x = vqe.initial_angles(NQ, LAYERS, 0)
    g = np.empty_like(x)
    state = no.setup(no.Adam(LR), x)
    it = 0
    while True:
        e = vqe.energy_grad(x, g, NQ, LAYERS, 1.0, 1.0)
        if e <= target:
            break
        state, x = no.update_(state, x, g)
        it += 1
    return time.perf_counter() - t0, it


def vqe_pennylane(max_steps=20000):
    import pennylane as qml
    from pennylane import numpy as pnp
    exact = vqe.exact_ground_energy(NQ)
    target = exact + RTOL * abs(exact)
    circuit = vqe.pennylane_tfim(NQ, LAYERS, "default.qubit", diff_method="adjoint")

    opt = qml.AdamOptimizer(stepsize=LR, beta1=BETA1, beta2=BETA2, eps=EPS)  # as no.Adam(LR)
    theta = pnp.array(vqe.initial_angles(NQ, LAYERS, 0), requires_grad=True)
    t0 = time.perf_counter()
    for it in range(max_steps):  # noqa: B007 (the count is returned)
        theta, e = opt.step_and_cost(circuit, theta)
        if e <= target:
            break
    return time.perf_counter() - t0, it


def median_of(fn, repeats, *a):
    vals = [fn(*a) for _ in range(repeats)]
    if isinstance(vals[0], tuple):
        return statistics.median(v[0] for v in vals), vals[0][1]
    return statistics.median(vals)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    rep = 3 if a.quick else 7
    print(f"# numbaopt loops benchmark: {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}, numpy {np.__version__}, numba {__import__('numba').__version__}")
    # warm-up (compiles or loads from the cache)
    for n in (16, 256):
        bench_minimize(n, 10), bench_update_loop(n, 10), bench_numpy_loop(n, 10)
    vqe_compiled()
    vqe_python()

    print("\n## Adam on sum (x - c)^2, float64: time per step (median of %d), steps per second" % rep)
    print("| parameters | compiled minimize | Python loop of update_ | Python loop, NumPy Adam |")
    print("|---|---|---|---|")
    for n in (16, 256):
        res = {"min": [], "upd": [], "np": []}
        for _ in range(rep):  # interleaved
            res["min"].append(bench_minimize(n, 1_000_000 if not a.quick else 200_000))
            res["upd"].append(bench_update_loop(n, 20_000))
            res["np"].append(bench_numpy_loop(n, 20_000))
        med = {k: statistics.median(v) for k, v in res.items()}
        cells = [f"{med[k] * 1e9:,.0f} ns ({1 / med[k]:,.3g}/s)" for k in ("min", "upd", "np")]
        print(f"| {n} | " + " | ".join(cells) + " |")

    steps = 10_000_000 if not a.quick else 1_000_000
    js, hand = [], []
    for _ in range(rep):
        js.append(bench_jit_step(steps))
        hand.append(bench_hand(steps))
    print("\n## One Adam step, 16 float64 parameters, inside a user's @njit loop (%d steps, median of %d)"
          % (steps, rep))
    print("| jit_step's step | hand-written fused Adam |")
    print("|---|---|")
    print(f"| {statistics.median(js) * 1e9:.1f} ns | {statistics.median(hand) * 1e9:.1f} ns |")

    print(f"\n## VQE, TFIM {NQ} qubits, {vqe.n_params(NQ, LAYERS)} angles, Adam(lr={LR}): time to 1e-3 "
          f"relative (median of {rep})")
    print("| driver | iterations | seconds |")
    print("|---|---|---|")
    rows = []
    c_t, c_it = [], 0
    p_t, p_it = [], 0
    for _ in range(rep):
        dt, c_it = vqe_compiled()
        c_t.append(dt)
        dt, p_it = vqe_python()
        p_t.append(dt)
    rows.append(("numbaopt.minimize (compiled loop, target checked every 10)", c_it, statistics.median(c_t)))
    rows.append(("Python loop: njit simulator + update_", p_it, statistics.median(p_t)))
    try:
        import pennylane  # noqa: F401
    except ImportError:
        rows.append(("PennyLane qml.AdamOptimizer, default.qubit", "-", "not installed"))
    else:
        pt, pit = median_of(vqe_pennylane, max(1, rep // 3))
        rows.append((f"PennyLane qml.AdamOptimizer (beta1 {BETA1}, beta2 {BETA2}, eps {EPS:g}, as numbaopt), "
                     "default.qubit, adjoint", pit, pt))
    for name, it, t in rows:
        print(f"| {name} | {it} | {t if isinstance(t, str) else f'{t:.4f}'} |")


if __name__ == "__main__":
    main()
