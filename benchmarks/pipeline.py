"""The step pipeline, measured side by side: in-place ``update_`` and pure ``update`` against hand-written steps.

Run: ``NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/pipeline.py [--quick] [--json out.json]``
(``make bench-pipeline``).

Everything runs in ONE process, the variants of a case in interleaved rounds (the order rotates every
round), and the medians are compared, so the drifts of a shared machine hit every variant alike.
Adam, float32, lr 1e-3, one thread.

* ``update_`` cases (the fast in-place paths): one array of 16 and of 1M elements, a list of 1000 arrays
  of 1000 elements, ResNet-18's 62 parameter shapes in a dict of dataclasses. Beside each, the
  hand-written ``@njit`` in-place Adam on the same arrays (one call per array, from Python). The hand-written
  kernels take the hyperparameters as runtime arguments (as ``benchmarks/compare.py``'s): compiled in as
  constants they run ~1.5x faster at 1M elements here, which no optimiser that lets one change them gets.
* ``update`` cases (pure): 1000 × 1000 (list), one 16M leaf in a list, ResNet-18 shapes (list), and one
  bare 1M array. The reference is the hand-written out-of-place ``@njit`` Adam writing into fresh
  ``np.empty`` arrays every step (new parameter, new m, new v per leaf): what a functional step must at
  least cost. The target is ``update / reference <= 1.2``.
* memory: the peak of ``tracemalloc`` (NumPy reports its buffers to it) during one pure ``update`` of
  each case, as a multiple of the bytes of the new parameters plus the new state (3 × 4 bytes per
  element for float32 Adam): 1.0 is the limit (nothing allocated but the results).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import time
import tracemalloc

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

import numbaopt as no  # noqa: E402
from compare import adam_hand as adam_inplace  # noqa: E402  (the in-place yardstick of make bench-compare)
from tree_compare import resnet18_shapes  # noqa: E402

F32 = np.float32
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8


@njit(error_model="numpy", nogil=True)
def adam_outplace(x, g, m, v, xo, mo, vo, t, lr, beta1, beta2, eps):
    """Hand-written fused out-of-place Adam: reads x, g, m, v; writes the fresh xo, mo, vo."""
    f = np.float32
    lr, b1, b2, eps = f(lr), f(beta1), f(beta2), f(eps)
    bc1 = -math.expm1(f(t) * math.log(b1))
    bc2 = -math.expm1(f(t) * math.log(b2))
    c1, c2 = f(1) - b1, f(1) - b2
    for i in range(x.shape[0]):
        gi = g[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * (gi * gi)
        mo[i] = mi
        vo[i] = vi
        xo[i] = x[i] - lr * (mi / bc1) / (math.sqrt(vi / bc2) + eps)


@dataclasses.dataclass
class Layer:
    w: np.ndarray


def arrays(shapes, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s).astype(F32) for s in shapes]
    gs = [(rng.standard_normal(s) * 1e-3).astype(F32) for s in shapes]
    return xs, gs


def interleaved(variants: dict, number: int, rounds: int) -> dict:
    """Median seconds per call of each variant over ``rounds`` rotating rounds of ``number`` calls."""
    names = list(variants)
    samples = {k: [] for k in names}
    for f in variants.values():  # warm up: compile, plan
        f()
        f()
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            s = r % len(names)
            for k in names[s:] + names[:s]:
                f = variants[k]
                t0 = time.perf_counter()
                for _ in range(number):
                    f()
                samples[k].append((time.perf_counter() - t0) / number)
    finally:
        gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


def peak_bytes(fn) -> int:
    """Peak bytes allocated (tracemalloc) while ``fn()`` runs, above what was allocated before it."""
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
        del out
    finally:
        tracemalloc.stop()
    return peak - base


# -------------------------------------------------------------------------------------------------
# cases


def inplace_case(name, shapes, container, number, rounds):
    xs, gs = arrays(shapes)
    hx = [x.copy() for x in xs]
    hm = [np.zeros_like(x).reshape(-1) for x in xs]
    hv = [np.zeros_like(x).reshape(-1) for x in xs]
    hxf = [x.reshape(-1) for x in hx]
    hgf = [g.reshape(-1) for g in gs]
    tcount = [0]
    if container == "bare":
        model, grads = xs[0], gs[0]
    elif container == "dict":
        model = {f"l{i}": Layer(x) for i, x in enumerate(xs)}
        grads = {f"l{i}": Layer(g) for i, g in enumerate(gs)}
    else:
        model, grads = xs, gs
    state = no.setup(no.Adam(), model)

    def ours():
        no.update_(state, model, grads)

    def hand():
        tcount[0] += 1
        t = tcount[0]
        for x, g, m, v in zip(hxf, hgf, hm, hv):
            adam_inplace(x, g, m, v, LR, B1, B2, EPS, t)

    med = interleaved({"update_": ours, "hand": hand}, number, rounds)
    return {"case": name, "kind": "update_", "ours_us": med["update_"] * 1e6, "hand_us": med["hand"] * 1e6,
            "ratio": med["update_"] / med["hand"]}


def pure_case(name, shapes, container, number, rounds):
    xs, gs = arrays(shapes)
    if container == "bare":
        model, grads = xs[0], gs[0]
    else:
        model, grads = xs, gs
    state = no.setup(no.Adam(), model)
    hm = [np.zeros(x.size, F32) for x in xs]
    hv = [np.zeros(x.size, F32) for x in xs]
    hgf = [g.reshape(-1) for g in gs]
    hxf = [x.reshape(-1) for x in xs]

    def ours():
        return no.update(state, model, grads)

    def hand():
        new = []
        for x, g, m, v in zip(hxf, hgf, hm, hv):
            xo, mo, vo = np.empty_like(x), np.empty_like(m), np.empty_like(v)
            adam_outplace(x, g, m, v, xo, mo, vo, 1, LR, B1, B2, EPS)
            new.append((xo, mo, vo))
        return new

    med = interleaved({"update": ours, "hand": hand}, number, rounds)
    n = sum(x.size for x in xs)
    result_bytes = 3 * 4 * n
    peak_ours = peak_bytes(ours)
    peak_hand = peak_bytes(hand)
    return {"case": name, "kind": "update", "ours_us": med["update"] * 1e6, "hand_us": med["hand"] * 1e6,
            "ratio": med["update"] / med["hand"], "elements": n,
            "peak_ours": peak_ours / result_bytes, "peak_hand": peak_hand / result_bytes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test, not a measurement)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--only", choices=("update_", "update"), help="run one kind of case")
    args = ap.parse_args()
    q = args.quick
    r = 3 if q else 21
    import numba
    print(f"numba {numba.__version__}, numpy {np.__version__}, NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}",
          flush=True)
    res = []
    R18 = resnet18_shapes()
    if args.only in (None, "update_"):
        res.append(inplace_case("one array, 16", [(16,)], "bare", 2000, r))
        res.append(inplace_case("one array, 1M", [(1 << 20,)], "bare", 5, r))
        res.append(inplace_case("1000 leaves × 1000 (list)", [(1000,)] * 1000, "list", 5, r))
        res.append(inplace_case("ResNet-18 shapes (dict of dataclasses)", R18, "dict", 1, r if q else 11))
        for c in res:
            print(f"  {c['case']}: update_ {c['ours_us']:.2f} µs, hand {c['hand_us']:.2f} µs, "
                  f"ratio {c['ratio']:.2f}", flush=True)
    if args.only in (None, "update"):
        pure = [pure_case("one array, 1M", [(1 << 20,)], "bare", 5, r),
                pure_case("1000 leaves × 1000 (list)", [(1000,)] * 1000, "list", 3, r),
                pure_case("one 16M leaf (list)", [(1 << 24,)], "list", 1, r if q else 11),
                pure_case("ResNet-18 shapes (list)", R18, "list", 1, r if q else 11)]
        for c in pure:
            print(f"  {c['case']}: update {c['ours_us']:.0f} µs, hand {c['hand_us']:.0f} µs, "
                  f"ratio {c['ratio']:.2f}; peak memory {c['peak_ours']:.2f}× the results "
                  f"(hand {c['peak_hand']:.2f}×)", flush=True)
        res += pure
    print()
    print("| kind | case | numbaopt (µs) | hand-written (µs) | ratio | peak memory / results (numbaopt, hand) |")
    print("|---|---|---|---|---|---|")
    for c in res:
        mem = f"{c['peak_ours']:.2f}, {c['peak_hand']:.2f}" if "peak_ours" in c else ""
        print(f"| `{c['kind']}` | {c['case']} | {c['ours_us']:.2f} | {c['hand_us']:.2f} | {c['ratio']:.2f} | {mem} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
