"""The SPSA gradient estimate (two objective evaluations per iteration), used by the compiled loops."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["SPSA", "rademacher"]


@njit(cache=True, error_model="numpy", nogil=True)
def rademacher(rng, r, out):
    """Fill ``out`` with independent +-1 from the splitmix64 stream whose state is ``rng[r]`` (advanced past the
    draws): a tiny seedable generator whose whole state is one uint64, so chunked and interpreted loops draw
    exactly the same perturbations. The compiled loops' SPSA (a stream per row) and QN-SPSA draw from it."""
    s = rng[r]
    for i in range(out.shape[0]):
        s = s + np.uint64(0x9E3779B97F4A7C15)
        z = s
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        out[i] = 1.0 if (z >> np.uint64(63)) == np.uint64(0) else -1.0
    rng[r] = s


class SPSA:
    """Simultaneous-perturbation gradient estimate (Spall, 1992): pass as ``jac=SPSA(...)``.

    At iteration ``k`` (from 0) it draws ``delta`` with independent +-1 entries and estimates the
    gradient from two evaluations of ``fun(x, *args) -> loss``::

        c_k = c / (k + 1)**gamma,   a_k = a / (A + k + 1)**alpha
        g   = a_k * (fun(x + c_k*delta) - fun(x - c_k*delta)) / (2*c_k) * delta

    The rule then steps with ``g``: with ``numbaopt.Descent(lr=1.0)`` this is Spall's SPSA; with Adam or
    another scale-free rule use ``a=1, alpha=0`` (gain 1). ``seed`` makes the perturbations
    reproducible (each row of a batch gets its own stream); ``None`` draws a fresh seed.
    Defaults are Spall's ``alpha=0.602``, ``gamma=0.101``. Real parameters only.
    """

    def __init__(self, c: float = 0.1, gamma: float = 0.101, a: float = 1.0, A: float = 0.0, alpha: float = 0.602,
                 seed: int | None = None) -> None:
        vals: dict[str, float] = {}
        for name, v, low in (("c", c, True), ("gamma", gamma, False), ("a", a, True), ("A", A, False),
                             ("alpha", alpha, False)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"SPSA: {name} must be a real number, got {v!r}")
            v = float(v)
            if not math.isfinite(v) or v < 0 or (low and v == 0):
                raise ValueError(f"SPSA: {name}={v!r}; expected a finite number "
                                 f"{'> 0' if low else '>= 0'}")
            vals[name] = v
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise TypeError(f"SPSA: seed must be a non-negative integer or None, got {seed!r}")
        self.c, self.gamma, self.a, self.A, self.alpha = (vals[k] for k in ("c", "gamma", "a", "A", "alpha"))
        self.seed = None if seed is None else int(seed)

    def gains(self, k):
        """``(a_k, c_k)`` at iteration ``k`` (from 0)."""
        return self.a / (self.A + k + 1.0) ** self.alpha, self.c / (k + 1.0) ** self.gamma

    def gain_vector(self):
        return np.array([self.a, self.A, self.alpha, self.c, self.gamma], dtype=np.float64)

    def streams(self, B):
        seed = self.seed if self.seed is not None else np.random.SeedSequence().entropy
        ss = np.random.SeedSequence(seed).spawn(B)
        return np.array([s.generate_state(1, np.uint64)[0] for s in ss], dtype=np.uint64)

    def __repr__(self):
        return (f"SPSA(c={self.c}, gamma={self.gamma}, a={self.a}, A={self.A}, alpha={self.alpha}, "
                f"seed={self.seed})")
