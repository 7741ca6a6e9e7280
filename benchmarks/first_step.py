"""Fast to the first step, measured: each case runs in a fresh process, "cold" with an empty kernel cache
(``NUMBAOPT_CACHE_DIR`` and ``NUMBA_CACHE_DIR`` pointed at a new temporary folder), "warm" in a second
process that finds the first one's cache; times include process start and the imports. Beside them, in the
same run, the floor: a process that only imports numpy and numba. One thread (``NUMBA_NUM_THREADS=1``).

Each phase is reported with its own time, the time from spawning the process to its end, and the seconds numba's
compile events (``numba:compile``) covered in it: a call that compiles what an earlier call already needed shows
up as compiling time in a later phase.

    python benchmarks/first_step.py [--runs 3] [--cases adam_tree,clip_adamw,...] [--json out.json]

The table in docs/performance.md ("Fast to the first step") comes from this script.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# The body of every case: `phases` is a list of (name, callable); each callable is one first use. The
# harness around it times the import, each phase, and the compile events inside each phase.
PRELUDE = r"""
import json, os, sys, time
t0 = time.perf_counter()
import numpy as np
import numbaopt as no
t_import = time.perf_counter() - t0
from numba.core import event
box = [0.0]
class _Compiles(event.Listener):
    # seconds spent compiling, outermost compilations only (a parent's time includes its callees')
    depth, start = 0, 0.0
    def on_start(self, ev):
        if self.depth == 0:
            self.start = time.perf_counter()
        self.depth += 1
    def on_end(self, ev):
        self.depth -= 1
        if self.depth == 0:
            box[0] += time.perf_counter() - self.start
event.register("numba:compile", _Compiles())
"""

POSTLUDE = r"""
out = {"import": t_import, "phases": []}
for name, f in phases:
    box[0] = 0.0
    a = time.perf_counter()
    f()
    out["phases"].append([name, time.perf_counter() - a, box[0], time.time() - float(os.environ["SPAWNED_AT"])])
print("RESULT " + json.dumps(out))
"""

CASES = {
    "import_numba": ("import numpy and numba only (the floor)", "import numba\nphases = []\n"),
    "import": ("import numbaopt", "phases = []\n"),
    "adam_array": ("Adam, one 4096 float32 array: first update_", r"""
x = np.ones(4096, np.float32); g = np.full(4096, 0.5, np.float32)
s = no.setup(no.Adam(1e-3), x)
phases = [("update_", lambda: no.update_(s, x, g))]
"""),
    "adam_tree": ("Adam, dict tree {(64,32), (32,)} float32: update_, update_, update", r"""
m = {"W": np.ones((64, 32), np.float32), "b": np.zeros(32, np.float32)}
g = {"W": np.full((64, 32), 0.5, np.float32), "b": np.full(32, 0.5, np.float32)}
st = [no.setup(no.Adam(1e-3), m), m]
def step_():
    st[0], st[1] = no.update_(st[0], st[1], g)
phases = [("update_", step_), ("2nd update_", step_), ("update", lambda: no.update(st[0], st[1], g))]
"""),
    "clip_adamw": ("chain(ClipGlobalNorm, AdamW) float64 tree {(256,128), (128,)}: update_, update_, update", r"""
m = {"W": np.ones((256, 128)), "b": np.zeros(128)}
g = {"W": np.full((256, 128), 0.5), "b": np.full(128, 0.5)}
st = [no.setup(no.chain(no.ClipGlobalNorm(1.0), no.AdamW(1e-3, weight_decay=1e-2)), m), m]
def step_():
    st[0], st[1] = no.update_(st[0], st[1], g)
phases = [("update_", step_), ("2nd update_", step_), ("update", lambda: no.update(st[0], st[1], g))]
"""),
    "adafactor": ("Adafactor() tree {(256,128), (128,)} float32: update_, update_, update", r"""
m = {"W": np.ones((256, 128), np.float32), "b": np.zeros(128, np.float32)}
g = {"W": np.full((256, 128), 0.5, np.float32), "b": np.full(128, 0.5, np.float32)}
st = [no.setup(no.Adafactor(), m), m]
def step_():
    st[0], st[1] = no.update_(st[0], st[1], g)
phases = [("update_", step_), ("2nd update_", step_), ("update", lambda: no.update(st[0], st[1], g))]
"""),
    "adafactor_threads": ("Adafactor() on one (256,128) float32 array, threaded (threshold 0): update_, update_",
                          r"""
no.set_parallel_threshold(0)
x = np.ones((256, 128), np.float32); g = np.full((256, 128), 0.5, np.float32)
st = [no.setup(no.Adafactor(), x), x]
def step_():
    st[0], st[1] = no.update_(st[0], st[1], g)
phases = [("update_", step_), ("2nd update_", step_)]
"""),
    "pure_large": ("pure update on 16 elements, then on 20M elements (threshold 0)", r"""
no.set_parallel_threshold(0)
small = np.ones(16, np.float32); big = np.ones(20_000_000, np.float32)
s1 = no.setup(no.Adam(1e-3), small); s2 = no.setup(no.Adam(1e-3), big)
phases = [("update_ small", lambda: no.update_(s1, small, small)),
          ("update small", lambda: no.update(s1, small, small)),
          ("update 20M", lambda: no.update(s2, big, big))]
"""),
}


def run_case(body: str, cache: str) -> dict:
    env = dict(os.environ, NUMBAOPT_CACHE_DIR=cache, NUMBA_CACHE_DIR=cache, NUMBA_NUM_THREADS="1",
               SPAWNED_AT=repr(time.time()))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PRELUDE + body + POSTLUDE], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    res["wall"] = wall
    return res


def measure(name: str, runs: int) -> dict:
    """``runs`` pairs of (cold, warm) processes, each pair with its own new cache folder."""
    body = CASES[name][1]
    cold, warm = [], []
    for _ in range(runs):
        cache = tempfile.mkdtemp(prefix="numbaopt-first-step-")
        try:
            cold.append(run_case(body, cache))
            warm.append(run_case(body, cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return {"cold": cold, "warm": warm}


def _med(xs):
    return statistics.median(xs)


def summarise(name: str, res: dict) -> str:
    cold, warm = res["cold"], res["warm"]
    parts = [f"{name:12s} cold {_med([r['wall'] for r in cold]):6.2f} s (range {min(r['wall'] for r in cold):.2f}-"
             f"{max(r['wall'] for r in cold):.2f})  warm {_med([r['wall'] for r in warm]):5.2f} s  "
             f"import {_med([r['import'] for r in cold]):.3f} s"]
    for i, phase in enumerate(p[0] for p in cold[0]["phases"]):
        ct = _med([r["phases"][i][1] for r in cold])
        cc = _med([r["phases"][i][2] for r in cold])
        wt = _med([r["phases"][i][1] for r in warm])
        wc = _med([r["phases"][i][2] for r in warm])
        cs = _med([r["phases"][i][3] for r in cold])
        ws = _med([r["phases"][i][3] for r in warm])
        parts.append(f"    {phase:14s} cold {ct:6.3f} s (compiling {cc:6.3f} s; {cs:5.2f} s from spawn)   "
                     f"warm {wt:6.3f} s (compiling {wc:.3f} s; {ws:5.2f} s from spawn)")
    return "\n".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="cold/warm process pairs per case (medians)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    results = {}
    for name in names:
        results[name] = measure(name, args.runs)
        print(summarise(name, results[name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
