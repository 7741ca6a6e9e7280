"""asv: compiled optimisation loops (numbaopt.minimize / minimize_batch / jit_step) against Python loops.

The scripted, side-by-side version with the VQE comparison is ``benchmarks/loops.py``.
"""
import math

import numpy as np
from numba import njit

import numbaopt as no

STEPS = 10_000

# Not cache=True: Numba's cache would record the module under the name it was first imported by
# (asv imports it as benchmarks.bench_loops), and loop_jit_step takes a dispatcher argument, which
# misses the cache in every process anyway. Compiling happens in setup, outside the timings.


@njit(error_model="numpy")
def quad(x, g, c):
    s = 0.0
    for i in range(x.shape[0]):
        d = x[i] - c[i]
        g[i] = 2.0 * d
        s += d * d
    return s


@njit(error_model="numpy")
def loop_jit_step(step, x, g, S, hp, steps):
    for t in range(1, steps + 1):
        step(x, g, S, hp, t)
    return x[0]


@njit(error_model="numpy")
def loop_hand_adam(x, g, m, v, steps, lr, b1, b2, eps):
    for t in range(1, steps + 1):
        bc1 = 1.0 - b1 ** t
        bc2 = 1.0 - b2 ** t
        for i in range(x.shape[0]):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
            x[i] -= lr * (m[i] / bc1) / (math.sqrt(v[i] / bc2) + eps)
    return x[0]


class AdamQuadratic:
    """10^4 Adam steps on sum (x - c)^2: compiled minimize vs Python loops (update_, NumPy Adam)."""
    params = [16, 256]
    param_names = ["n"]

    def setup(self, n):
        self.c = np.linspace(-1, 1, n)
        self.x0 = np.zeros(n)
        no.minimize(quad, self.x0, no.Adam(1e-3), args=(self.c,), maxiter=2, gtol=None)  # compile / load
        x, g = self.x0.copy(), np.empty(n)
        state = no.setup(no.Adam(1e-3), x)
        quad(x, g, self.c)
        no.update_(state, x, g)

    def time_compiled_minimize(self, n):
        no.minimize(quad, self.x0, no.Adam(1e-3), args=(self.c,), maxiter=STEPS, gtol=None)

    def time_compiled_minimize_progress(self, n):
        no.minimize(quad, self.x0, no.Adam(1e-3), args=(self.c,), maxiter=STEPS, gtol=None, progress=True)

    def time_python_loop_update_(self, n):
        x, g = self.x0.copy(), np.empty(n)
        state = no.setup(no.Adam(1e-3), x)
        for _ in range(STEPS):
            quad(x, g, self.c)
            state, x = no.update_(state, x, g)

    def time_python_loop_numpy_adam(self, n, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        x, m, v = self.x0.copy(), np.zeros(n), np.zeros(n)
        for t in range(1, STEPS + 1):
            g = 2.0 * (x - self.c)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            x -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)


class BatchQuadratic:
    """64 independent 16-parameter problems, 1000 steps each: one compiled call vs 64 minimize calls."""

    def setup(self):
        self.c = np.linspace(-1, 1, 16)
        self.X0 = np.random.default_rng(0).normal(size=(64, 16))
        no.minimize_batch(quad, self.X0, no.Adam(1e-3), args=(self.c,), maxiter=2, gtol=None)

    def time_minimize_batch(self):
        no.minimize_batch(quad, self.X0, no.Adam(1e-3), args=(self.c,), maxiter=1000, gtol=None)

    def time_minimize_per_row(self):
        for r in range(self.X0.shape[0]):
            no.minimize(quad, self.X0[r], no.Adam(1e-3), args=(self.c,), maxiter=1000, gtol=None)


class JitStepAdam16:
    """10^6 Adam steps on 16 parameters inside an @njit loop: jit_step's step vs hand-written."""

    def setup(self):
        self.x = np.zeros(16)
        self.g = np.linspace(-1, 1, 16)
        self.js = no.jit_step(no.Adam(1e-3), self.x)
        loop_jit_step(self.js.step, self.x, self.g, self.js.state, self.js.hp, 2)
        self.m, self.v = np.zeros(16), np.zeros(16)
        loop_hand_adam(self.x, self.g, self.m, self.v, 2, 1e-3, 0.9, 0.999, 1e-8)

    def time_jit_step(self):
        loop_jit_step(self.js.step, self.x, self.g, self.js.state, self.js.hp, 1_000_000)

    def time_hand_written(self):
        loop_hand_adam(self.x, self.g, self.m, self.v, 1_000_000, 1e-3, 0.9, 0.999, 1e-8)
