"""QN-SPSA vs SPSA on examples/vqe.py (TFIM, 6 qubits, 6 layers, initial_angles(6, 6)).

Iterations, evaluations and seconds to relative error 1e-2 and 1e-3 (capped); docs/quantum.md quotes them.

    python benchmarks/qnspsa_vs_spsa.py qnspsa --lr 1e-2 --seed 0
    python benchmarks/qnspsa_vs_spsa.py spsa --rule adam --a 0.003 --c 0.05 --seed 0
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import vqe  # noqa: E402

import numbaopt as no  # noqa: E402
from numbaopt.quantum.qnspsa import minimize_qnspsa  # noqa: E402


fidelity = vqe.fidelity


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("method", choices=["qnspsa", "spsa"])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eps", type=float, default=1e-2)
    ap.add_argument("--c", type=float, default=0.1)
    ap.add_argument("--a", type=float, default=0.1)
    ap.add_argument("--A", type=float, default=0.0)
    ap.add_argument("--alpha", type=float, default=0.602)
    ap.add_argument("--gamma", type=float, default=0.101)
    ap.add_argument("--rule", default="descent")
    ap.add_argument("--noblock", action="store_true")
    ap.add_argument("--average", default="pennylane")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--maxiter", type=int, default=100000)
    ap.add_argument("--cap", type=float, default=120.0, help="seconds")
    ap.add_argument("--every", type=int, default=10)
    o = ap.parse_args()
    nq, L = 6, 6
    args = (nq, L, 1.0, 1.0)
    x0 = vqe.initial_angles(nq, L)
    ex = vqe.exact_ground_energy(nq)
    marks = {1e-2: None, 1e-3: None}
    t0 = [0.0]

    def cb(r):
        # the energy AT x (SPSA's snapshot fun is the mean of its two perturbed evaluations); not counted
        rel = (vqe.energy(r.x, *args) - ex) / abs(ex)
        for tol in marks:
            if marks[tol] is None and rel <= tol:
                marks[tol] = (r.nit, time.perf_counter() - t0[0])
        return marks[1e-3] is not None or time.perf_counter() - t0[0] > o.cap

    # warm-up (load the compiled code from the cache, not timed)
    if o.method == "qnspsa":
        run = lambda mi, cb: minimize_qnspsa(vqe.energy, fidelity, x0, lr=o.lr, finite_diff_step=o.eps, args=args,
                                             blocking=not o.noblock, average=o.average, maxiter=mi, seed=o.seed,
                                             callback=cb, callback_every=o.every)
        per_it = 3  # fun evaluations per step (2 gradient + 1 blocking or loss), plus 4 overlaps
    else:
        rule = no.Descent(1.0) if o.rule == "descent" else no.Adam(o.a)
        sp = no.SPSA(c=o.c, gamma=o.gamma, a=o.a if o.rule == "descent" else 1.0, A=o.A,
                     alpha=o.alpha if o.rule == "descent" else 0.0, seed=o.seed)
        run = lambda mi, cb: no.minimize(vqe.energy, x0, rule, jac=sp, args=args, maxiter=mi, callback=cb,
                                         callback_every=o.every)
        per_it = 2
    run(2, None)
    t0[0] = time.perf_counter()
    r = run(o.maxiter, cb)
    dt = time.perf_counter() - t0[0]
    print(f"{o.method} {vars(o)}")
    print(f"  final rel err {(r.fun - ex) / abs(ex):.3e} after {r.nit} iterations, {dt:.1f} s ({r.message});"
          f" nfev {r.nfev}" + (f", overlaps {r.n_overlap}, rejected {r.rejected}" if o.method == "qnspsa" else ""))
    for tol, m in marks.items():
        if m is None:
            print(f"  {tol:g}: not reached")
        else:
            it, s = m
            ev = f"{it * per_it} fun + {4 * it} overlap" if o.method == "qnspsa" else f"{it * per_it} fun"
            print(f"  {tol:g}: {it} iterations, {ev} evaluations, {s:.2f} s")


if __name__ == "__main__":
    main()
