"""Muon's step against the Newton-Schulz iteration alone, written by hand with the same BLAS, and BLAS against a
Numba loop.

    .venv/bin/python benchmarks/muon.py [--rounds 7] [--sizes 256 1024]

``numbaopt`` is ``update_`` of ``Muon`` on one float32 matrix (momentum, five quintic iterations, the step);
``hand NS`` is the five iterations alone in an ``@njit`` function calling ``np.dot`` (SciPy's BLAS, as the
generated kernel does); ``NumPy NS`` the same in NumPy; ``loop NS`` the iterations with ``np.dot`` replaced by a
Numba triple loop (the BLAS-free path, measured at the smallest size only). Medians of interleaved rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from numba import njit

import numbaopt as no

A, B, C = 3.4445, -4.7750, 2.0315


@njit(cache=True)
def ns_blas(U, steps):
    X = U / np.float32(np.sqrt(np.sum(U * U)))
    a, b, c = np.float32(A), np.float32(B), np.float32(C)
    for _ in range(steps):
        G = np.dot(X, X.T)
        X = a * X + np.dot(b * G + c * np.dot(G, G), X)
    return X


@njit(cache=True)
def _mm(P, Q):
    n, k = P.shape
    m = Q.shape[1]
    out = np.zeros((n, m), P.dtype)
    for i in range(n):
        for t in range(k):
            p = P[i, t]
            for j in range(m):
                out[i, j] += p * Q[t, j]
    return out


@njit(cache=True)
def ns_loop(U, steps):
    X = U / np.float32(np.sqrt(np.sum(U * U)))
    a, b, c = np.float32(A), np.float32(B), np.float32(C)
    for _ in range(steps):
        G = _mm(X, np.ascontiguousarray(X.T))
        X = a * X + _mm(b * G + c * _mm(G, G), X)
    return X


def ns_numpy(U, steps):
    X = U / np.sqrt(np.sum(U * U), dtype=np.float32)
    for _ in range(steps):
        G = X @ X.T
        X = np.float32(A) * X + (np.float32(B) * G + np.float32(C) * (G @ G)) @ X
    return X


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| n | numbaopt Muon | hand NS (njit + BLAS) | NumPy NS | loop NS | Muon / hand |\n|---|---|---|---|---|---|")
    for n in args.sizes:
        x = rng.standard_normal((n, n)).astype(np.float32)
        g = rng.standard_normal((n, n)).astype(np.float32)
        st = no.setup(no.Muon(0.02), x)
        cases = {"muon": lambda st=st, x=x, g=g: no.update_(st, x, g), "hand": lambda g=g: ns_blas(g, 5),
                 "numpy": lambda g=g: ns_numpy(g, 5)}
        if n == min(args.sizes):
            cases["loop"] = lambda g=g: ns_loop(g, 5)
        for f in cases.values():
            f()
        t = {k: [] for k in cases}
        for _ in range(args.rounds):
            for k, f in cases.items():
                t0 = time.perf_counter()
                f()
                t[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in t.items()}
        loop = f"{1e3 * med['loop']:.1f} ms" if "loop" in med else "–"
        print(f"| {n} | {1e3 * med['muon']:.1f} ms | {1e3 * med['hand']:.1f} ms | {1e3 * med['numpy']:.1f} ms | "
              f"{loop} | {med['muon'] / med['hand']:.2f} |")


if __name__ == "__main__":
    main()
