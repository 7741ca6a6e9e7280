"""The per-call cost of ``update_`` in this checkout against a git revision, measured side by side.

Run: ``NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/revisions.py REV [--rounds 7]`` (e.g. ``HEAD~3``).

The revision is checked out into a temporary ``git worktree``. Then the same timing script runs in fresh
processes, alternating the checkout and the revision for ``--rounds`` rounds: the drifts of a shared machine
hit both alike. Medians are compared. Each process imports ``numbaopt`` from its own tree (``PYTHONPATH``),
warms up (compiles or loads its kernels), and reports the best of several repeats for each case. The cases
are the ones where the Python overhead decides: Adam on one 16-element float64 array, a one-leaf tree of
16 elements, a list of 100 arrays of 16 elements, and one 1M-element float32 array (where the kernel
decides).
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

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)

TIMING = r'''
import json, sys, timeit
import numpy as np
import numbaopt as no
import os
assert os.path.realpath(no.__file__).startswith(sys.argv[1]), (no.__file__, sys.argv[1])
out = {}
def best(f, number, repeat=9):
    f()
    return min(timeit.repeat(f, number=number, repeat=repeat)) / number * 1e9
x = np.ones(16); g = np.full(16, 1e-3); s = no.setup(no.Adam(), x); no.update_(s, x, g)
out["array 16"] = best(lambda: no.update_(s, x, g), 20000)
xc = np.ones(16); sc = no.setup(no.Adam(lr=no.cosine(1e-3, 10**7)), xc); no.update_(sc, xc, g)
out["array 16, cosine lr"] = best(lambda: no.update_(sc, xc, g), 2000)
m = {"w": np.ones(16)}; gm = {"w": np.full(16, 1e-3)}; st = no.setup(no.Adam(), m)
no.update_(st, m, gm); no.update_(st, m, gm)
out["tree of 1 leaf (16)"] = best(lambda: no.update_(st, m, gm), 5000)
L = [np.ones(16) for _ in range(100)]; GL = [np.full(16, 1e-3) for _ in range(100)]; sl = no.setup(no.Adam(), L)
no.update_(sl, L, GL); no.update_(sl, L, GL)
out["list of 100 leaves (16)"] = best(lambda: no.update_(sl, L, GL), 500)
X = np.ones(1 << 20, np.float32); G = np.full(1 << 20, 1e-3, np.float32); sx = no.setup(no.Adam(), X)
no.update_(sx, X, G)
out["array 1M float32"] = best(lambda: no.update_(sx, X, G), 20, repeat=5)
print(json.dumps(out))
'''


def _run(tree, py):
    env = dict(os.environ, PYTHONPATH=tree, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "1"))
    # cwd: ``python -c`` puts the working directory first on sys.path
    r = subprocess.run([py, "-c", TIMING, os.path.realpath(tree)], env=env, capture_output=True, text=True,
                       cwd=tree)
    if r.returncode:
        raise RuntimeError(f"the timing script failed in {tree}:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the git revision to compare with (e.g. HEAD~1)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    py = sys.executable
    tmp = tempfile.mkdtemp(prefix="numbaopt-rev-")
    base = os.path.join(tmp, "tree")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", base, args.rev], check=True)
    try:
        runs = {"revision": [], "checkout": []}
        for k in range(args.rounds):
            order = [("revision", base), ("checkout", ROOT)]
            for name, tree in (order if k % 2 == 0 else order[::-1]):
                runs[name].append(_run(tree, py))
        cases = list(runs["checkout"][0])
        print(f"{'case':28} {args.rev + ' (ns)':>16} {'checkout (ns)':>14} {'ratio':>7}   medians of {args.rounds}")
        for c in cases:
            a = statistics.median(r[c] for r in runs["revision"])
            b = statistics.median(r[c] for r in runs["checkout"])
            print(f"{c:28} {a:16.0f} {b:14.0f} {b / a:7.3f}")
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
