"""Benchmarks of the core: Adam on one float32 array, in place and out of place, fusion, first call.

Each numbaopt timing sits next to the same work done by a plain hand-written ``@njit`` fused Adam
loop (float32 literals and hyperparameters, ``error_model='numpy'``), as a parameter of the same
benchmark, so one ``asv run`` shows both side by side. ``benchmarks/compare.py`` (``make
bench-compare``) gives the same comparison as one interleaved table with ratios.
"""
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from numba import njit

import numbaopt as no
from numbaopt.compiler import kernels

F32 = np.float32
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
SIZES = [16, 4096, 1 << 20, 1 << 24]


# no cache=True: Numba ties a cached function to the module name it was compiled under, and asv
# imports this file under another name than a direct import does
@njit(error_model="numpy", nogil=True)
def adam_hand(x, g, m, v, lr, beta1, beta2, eps, t):
    """Adam written by hand, in the published formula's order (the generated kernel's yardstick)."""
    f = np.float32
    lr, b1, b2, eps = f(lr), f(beta1), f(beta2), f(eps)
    # 1 - b**t as numbaopt's one_minus_pow computes it, so that the results can be compared bitwise
    bc1 = -math.expm1(f(t) * math.log(b1))
    bc2 = -math.expm1(f(t) * math.log(b2))
    c1 = f(1) - b1
    c2 = f(1) - b2
    for i in range(x.shape[0]):
        gi = g[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        x[i] = x[i] - lr * (mi / bc1) / (math.sqrt(vi / bc2) + eps)


def _map_pass(step):
    """One pass of a stateless one-hyperparameter rule's generated ``step``: ``out = step(g, x, h)``."""
    @njit(error_model="numpy", nogil=True)
    def run(x, g, out, h):
        for i in range(x.shape[0]):
            out[i] = step(g[i], x[i], h)
    return run


def _data(n):
    rng = np.random.default_rng(0)
    return rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32)


_case = {}


def case(key, build):
    """The arrays and state of one benchmark case, built once per process and warmed by one step.

    asv re-runs ``setup`` before every timing sample (each sample then times a single call, asv#966);
    keeping the case here makes that cheap, so a suite can take hundreds of samples of a 1 µs step.
    Only the latest case is kept alive (a 16M case holds 256 MB).
    """
    got = _case.get(key)
    if got is None:
        _case.clear()
        got = _case[key] = build()
    return got


class _Suite:
    # single-call samples: many of them (a median over hundreds), within a few seconds per case
    repeat = (20, 500, 3.0)
    timeout = 180


class AdamInplace(_Suite):
    """``update_(state, x, g)`` with Adam on one float32 array vs the hand-written loop."""

    params = (SIZES, ["numbaopt update_", "hand-written njit"])
    param_names = ["n", "impl"]

    def setup(self, n, impl):
        self.c = case(("adam", n, impl), lambda: self.build(n, impl))

    def time_adam(self, n, impl):
        c = self.c
        if impl == "numbaopt update_":
            no.update_(c["state"], c["x"], c["g"])
        else:
            c["t"] += 1
            adam_hand(c["x"], c["g"], c["m"], c["v"], LR, B1, B2, EPS, c["t"])

    @staticmethod
    def build(n, impl):
        x, g = _data(n)
        if impl == "numbaopt update_":
            c = dict(x=x, g=g, state=no.setup(no.Adam(lr=LR, beta1=B1, beta2=B2, eps=EPS), x))
            no.update_(c["state"], x, g)
            return c
        c = dict(x=x, g=g, m=np.zeros(n, F32), v=np.zeros(n, F32), t=1)
        adam_hand(x, g, c["m"], c["v"], LR, B1, B2, EPS, 1)
        return c


class AdamOutplace(_Suite):
    """Pure ``update(state, x, g)``: fresh parameter and state arrays, inputs untouched."""

    params = [SIZES]
    param_names = ["n"]

    def setup(self, n):
        self.c = case(("outplace", n), lambda: self.build(n))

    def time_update(self, n):
        c = self.c
        c["state"], _ = no.update(c["state"], c["x"], c["g"])  # as a training loop uses it

    @staticmethod
    def build(n):
        x, g = _data(n)
        c = dict(x=x, g=g, state=no.setup(no.Adam(lr=LR, beta1=B1, beta2=B2, eps=EPS), x))
        c["state"], _ = no.update(c["state"], x, g)
        return c


class ChainFusion(_Suite):
    """``chain(WeightDecay, ClipGrad, Adam)``: one fused generated kernel vs one pass per rule.

    Unfused, WeightDecay and ClipGrad each run their own generated ``step`` over the array into a
    buffer (12 arrays of memory traffic per element instead of 7), then Adam's ``update_``.
    """

    params = ([4096, 1 << 20, 1 << 24], ["fused", "unfused"])
    param_names = ["n", "variant"]

    def setup(self, n, variant):
        self.c = case(("chain", n, variant), lambda: self.build(n, variant))

    def time_chain(self, n, variant):
        c = self.c
        if variant == "fused":
            no.update_(c["state"], c["x"], c["g"])
        else:
            c["wd_pass"](c["x"], c["g"], c["d"], c["wd"])
            c["clip_pass"](c["x"], c["d"], c["d"], c["delta"])
            no.update_(c["state"], c["x"], c["d"])

    @classmethod
    def build(cls, n, variant):
        x, g = _data(n)
        wd, clip, adam = no.WeightDecay(5e-4), no.ClipGrad(1.0), no.Adam(lr=LR)
        if variant == "fused":
            c = dict(x=x, g=g, state=no.setup(no.chain(wd, clip, adam), x))
        else:
            c = dict(x=x, g=g, state=no.setup(adam, x), d=np.empty(n, F32),
                     wd_pass=_map_pass(kernels(wd, F32).step_0),
                     clip_pass=_map_pass(kernels(clip, F32).step_0),
                     wd=F32(wd.weight_decay), delta=F32(clip.delta))
        holder = cls()
        holder.c = c
        holder.time_chain(n, variant)  # compile and warm outside the timing
        return c


_FIRST_STEP = """
import numpy as np
import numbaopt as no
x = np.ones(16, dtype=np.float32)
state = no.setup(no.Adam(), x)
state, x = no.update_(state, x, np.ones(16, dtype=np.float32))
"""

#: the tree case of benchmarks/first_step.py (docs/performance.md, "Fast to the first step"): a dict of two
#: float32 leaves, update_, update_ (the fast path), then the pure update
_FIRST_TREE_STEPS = """
import numpy as np
import numbaopt as no
m = {"W": np.ones((64, 32), np.float32), "b": np.zeros(32, np.float32)}
g = {"W": np.full((64, 32), 0.5, np.float32), "b": np.full(32, 0.5, np.float32)}
state = no.setup(no.Adam(1e-3), m)
state, m = no.update_(state, m, g)
state, m = no.update_(state, m, g)
no.update(state, m, g)
"""


def _child_setup(cache_dir):
    """Code run (untimed) in the fresh process before the timed first step."""
    # the fresh process imports the numbaopt this one measures (the commit asv installed, or the checkout)
    lines = ["import os, sys", f"sys.path.insert(0, {os.path.dirname(os.path.dirname(no.__file__))!r})"]
    if cache_dir is None:  # cold: a new empty kernel cache (numbaopt's and Numba's), removed at exit
        lines += ["import atexit, shutil, tempfile",
                  "d = tempfile.mkdtemp(prefix='numbaopt-cold-')",
                  "atexit.register(shutil.rmtree, d, True)",
                  "os.environ['NUMBAOPT_CACHE_DIR'] = os.environ['NUMBA_CACHE_DIR'] = d"]
    else:
        lines.append(f"os.environ['NUMBAOPT_CACHE_DIR'] = os.environ['NUMBA_CACHE_DIR'] = {cache_dir!r}")
    return "\n".join(lines)


class FirstCall:
    """A fresh Python process from ``import numbaopt`` to the end of its first Adam step(s): one array's
    first ``update_``, or a two-leaf tree's ``update_``, ``update_``, ``update``.

    "warm": the kernel cache holds the compiled kernels (every run after the first);
    "cold": an empty cache directory (``NUMBAOPT_CACHE_DIR`` and ``NUMBA_CACHE_DIR``), so every kernel, the
    library's helpers too, is generated and compiled.
    """

    params = (["warm cache", "cold cache"], ["one array", "tree"])
    param_names = ["cache", "case"]
    number = 1
    repeat = (1, 5, 60.0)
    warmup_time = 0
    processes = 1
    timeout = 300

    def setup(self, cache, case):
        self.dir = None
        if cache == "warm cache":
            self.dir = tempfile.mkdtemp(prefix="numbaopt-warm-")
            env = dict(os.environ, NUMBAOPT_CACHE_DIR=self.dir, NUMBA_CACHE_DIR=self.dir)
            subprocess.run([sys.executable, "-c", _child_setup(self.dir) + "\n" + self._code(case)],
                           check=True, env=env)

    def teardown(self, cache, case):
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _code(case):
        return _FIRST_STEP if case == "one array" else _FIRST_TREE_STEPS

    def timeraw_first_step(self, cache, case):
        return self._code(case), _child_setup(self.dir)
