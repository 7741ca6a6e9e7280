"""Parameter groups under one global clip, measured: one in-place step of ``chain(ClipGlobalNorm, AdamW)`` on the
same tree as one group (one rule for every leaf: the fused kernel) and as two groups (a learning rate and weight
decay per group, one norm: the reduction passes across groups), float32, medians of interleaved rounds; then the
first steps of the two-group tree in fresh processes with an empty kernel cache (``--cold``).

    python benchmarks/param_groups.py --rounds 15 [--cold 3]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numbaopt as no  # noqa: E402
from axis_rules import timed  # noqa: E402

ONE = no.chain(no.ClipGlobalNorm(1.0), no.AdamW(0.05, weight_decay=0.01))


def two_groups(path, x):
    wd, lr = (0.01, 0.05) if np.ndim(x) == 2 else (0.0, 0.02)
    return no.chain(no.ClipGlobalNorm(1.0), no.AdamW(lr=lr, weight_decay=wd))


def model(rows, cols):
    return {"W": np.ones((rows, cols), np.float32), "b": np.zeros(cols, np.float32)}


def step_case(rule, rows, cols):
    m = model(rows, cols)
    g = {"W": np.full((rows, cols), 0.5, np.float32), "b": np.full(cols, 0.5, np.float32)}
    box = [no.setup(rule, m), m]

    def f(n=1):
        for _ in range(n):
            box[0], box[1] = no.update_(box[0], box[1], g)
    return f


COLD = r"""
import sys, time
t0 = time.perf_counter()
import numpy as np, numbaopt as no
sys.path.insert(0, {here!r})
from param_groups import two_groups, model
m = model(256, 128)
g = {{"W": np.ones((256, 128), np.float32), "b": np.ones(128, np.float32)}}
s = no.setup(two_groups, m)
a = time.perf_counter(); s, m = no.update_(s, m, g); b = time.perf_counter()
s, m = no.update_(s, m, g); c = time.perf_counter()
no.update(s, m, g); d = time.perf_counter()
print(f"{{b - a:.2f}} {{c - b:.3f}} {{d - c:.2f}} {{d - t0:.2f}}")
"""


def cold(runs: int) -> None:
    print("| fresh process, empty cache | update_ (s) | 2nd update_ (s) | then update (s) | from start (s) |")
    print("|---|---:|---:|---:|---:|")
    here = os.path.dirname(os.path.abspath(__file__))
    for k in range(runs):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, NUMBAOPT_CACHE_DIR=d, NUMBA_CACHE_DIR=d, NUMBA_NUM_THREADS="1")
            out = subprocess.run([sys.executable, "-c", COLD.format(here=here)], capture_output=True, text=True,
                                 env=env, check=True).stdout.split()
        print(f"| run {k + 1} | " + " | ".join(out) + " |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cold", type=int, default=0, help="fresh processes timing the first steps (empty cache)")
    args = ap.parse_args(argv)
    print(f"numba threads {os.environ.get('NUMBA_NUM_THREADS', 'default')}; medians of {args.rounds} rounds")
    print("| tree | one group (µs) | two groups, one norm (µs) | ratio |")
    print("|---|---:|---:|---:|")
    for rows, cols, n in ((4, 3, 2000), (256, 128, 200), (1024, 1024, 5)):
        cases = {"one": step_case(ONE, rows, cols), "two": step_case(two_groups, rows, cols)}
        t = timed({k: (lambda f=f, n=n: f(n)) for k, f in cases.items()}, args.rounds)
        one, two = t["one"] / n * 1e6, t["two"] / n * 1e6
        print(f"| {rows}x{cols} + {cols} | {one:.1f} | {two:.1f} | {two / one:.2f} |")
    if args.cold:
        cold(args.cold)


if __name__ == "__main__":
    main()
