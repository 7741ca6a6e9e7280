"""Trees vs one flat array: one ``update_`` of Adam (float32), medians measured side by side.

Run: ``NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/tree_compare.py [--reps N]``

For each case the tree (a list of arrays, or a dict of dataclass layers for the ResNet-18 shapes) and a
single flat array of the same total size are timed in alternating blocks in one process, so both see
the same machine load; the ratio tree/flat is what the issue's target refers to. Also reported: the
Python overhead of ``update_`` on a tree holding one 16-element leaf, next to the same step on the bare
array and a direct call of the generated kernel.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numbaopt as no  # noqa: E402
from numbaopt.tree.state import core  # noqa: E402


def resnet18_shapes():
    """The 62 parameter shapes of torchvision's ResNet-18 (11,689,512 parameters)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            c_in = cin if block == 0 else cout
            shapes += [(cout, c_in, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
            if block == 0 and (stride != 1 or c_in != cout):
                shapes += [(cout, c_in, 1, 1), (cout,), (cout,)]
        cin = cout
    shapes += [(1000, 512), (1000,)]
    return shapes


@dataclasses.dataclass
class Param:
    w: np.ndarray


def timed(fn, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def side_by_side(fns: dict, reps: int, blocks: int = 20):
    """Median µs per call of each function, measured in ``blocks`` interleaved rounds."""
    times = {k: [] for k in fns}
    for f in fns.values():  # warm up (compiles, plans)
        f()
        f()
    for _ in range(blocks):
        for k, f in fns.items():
            times[k] += timed(f, max(1, reps // blocks))
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def case(name, shapes, reps, container="list"):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gs = [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes]
    if container == "dict":
        model = {f"p{i}": Param(x) for i, x in enumerate(xs)}
        grads = {f"p{i}": Param(g) for i, g in enumerate(gs)}
    else:
        model, grads = xs, gs
    flat = np.concatenate([x.ravel() for x in xs])
    gflat = np.concatenate([g.ravel() for g in gs])
    st_tree = no.setup(no.Adam(), model)
    st_flat = no.setup(no.Adam(), flat)

    def tree():
        no.update_(st_tree, model, grads)

    def one():
        no.update_(st_flat, flat, gflat)

    med = side_by_side({"tree": tree, "flat": one}, reps)
    assert core(st_tree).fast is not None, "the fast path did not engage"
    n = sum(int(np.prod(s)) for s in shapes)
    print(f"| {name} | {len(shapes)} | {n:,} | {med['tree']:.0f} | {med['flat']:.0f} | "
          f"{med['tree'] / med['flat']:.2f} |", flush=True)


def overhead(reps):
    x = np.ones(16, np.float32)
    g = np.full(16, 1e-3, np.float32)
    model, grads = {"w": x}, {"w": g}
    st_tree = no.setup(no.Adam(), model)
    xa = x.copy()
    st_arr = no.setup(no.Adam(), xa)
    leaf = no.setup(no.Adam(), x.copy())
    kern = leaf.kernels().inplace
    xk = x.copy()
    hp = leaf.hp
    a0, a1 = leaf.arrays
    C = leaf.counters

    def tree():
        no.update_(st_tree, model, grads)

    def arr():
        no.update_(st_arr, xa, g)

    def kernel():
        kern(xk, g, a0, a1, hp, C)

    med = side_by_side({"tree": tree, "array": arr, "kernel": kernel}, reps)
    print(f"| `update_` on a tree with one 16-element leaf | {med['tree']:.2f} |")
    print(f"| `update_` on the bare array (single-array fast path) | {med['array']:.2f} |")
    print(f"| direct call of the generated in-place kernel | {med['kernel']:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    import numba
    print(f"numba {numba.__version__}, numpy {np.__version__}, NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}")
    print()
    print("| case | leaves | elements | tree update_ (µs) | flat array (µs) | tree / flat |")
    print("|---|---|---|---|---|---|")
    for n in (10, 100, 1000):
        case(f"{n} leaves × 1000 (list)", [(1000,)] * n, args.reps)
    case("1000 leaves × 1000 (dict of dataclasses)", [(1000,)] * 1000, args.reps, container="dict")
    case("ResNet-18 shapes (list)", resnet18_shapes(), max(10, args.reps // 8))
    case("ResNet-18 shapes (dict of dataclasses)", resnet18_shapes(), max(10, args.reps // 8), container="dict")
    print()
    print("| Python overhead | median µs |")
    print("|---|---|")
    overhead(args.reps * 50)


if __name__ == "__main__":
    main()
