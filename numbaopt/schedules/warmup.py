"""Schedules with a linear warmup: then a cosine decay, a constant or an exponential decay. The step
convention: see the package's docstring (``numbaopt.schedules``)."""
from __future__ import annotations

import math

import numpy as np

from .base import Schedule, check_num, join
from .decay import cosine, linear

__all__ = ["warmup_cosine", "warmup_constant", "warmup_exponential", "ademamix_alpha", "ademamix_beta3"]


def warmup_cosine(peak: float, warmup: int, steps: int, start: float = 0.0, end: float = 0.0) -> join:
    """Linear warmup from ``start`` to ``peak`` over ``warmup`` steps, then cosine decay to ``end``
    (total ``steps`` including the warmup), as optax's ``warmup_cosine_decay_schedule``."""
    warmup = check_num("warmup", warmup, low=1, integer=True)
    steps = check_num("steps", steps, low=warmup + 1, integer=True)
    return join([linear(start, peak, warmup), cosine(peak, steps - warmup, end)], [warmup])


def warmup_constant(peak: float, warmup: int, start: float = 0.0) -> linear:
    """Linear warmup from ``start`` to ``peak`` over ``warmup`` steps, then ``peak`` for ever: ``start + (peak -
    start) * (t - 1) / warmup`` up to ``t = 1 + warmup``. As optax's ``warmup_constant_schedule(start, peak,
    warmup)`` (which is its ``linear_schedule``); it is ``linear(start, peak, warmup)``.

    Examples
    --------
    >>> s = no.warmup_constant(1e-3, 4)
    >>> [s(t) for t in (1, 3, 5, 100)]
    [0.0, 0.0005, 0.001, 0.001]
    >>> s
    linear(start=0.0, end=0.001, steps=4)
    """
    return linear(start, peak, check_num("warmup", warmup, low=1, integer=True))


class warmup_exponential(Schedule):
    """Linear warmup from ``start`` to ``peak`` over ``warmup`` steps, then ``peak`` for ``begin`` more steps,
    then exponential decay (growth when ``decay > 1``) by ``decay`` every ``every`` steps. With the count
    ``c = t - 1`` and ``k = c - warmup - begin``:

    * ``c < warmup``: ``(start - peak) * (1 - c / warmup) + peak``;
    * otherwise ``peak * decay ** max(k / every, 0)`` (``floor(k / every)`` with ``staircase=True``), never
      below ``end`` when decaying (never above when growing; no bound when ``end`` is None).

    As optax's ``warmup_exponential_decay_schedule(start, peak, warmup, every, decay, begin, staircase, end)``.
    ``warmup=0`` starts at ``peak``.

    Examples
    --------
    >>> s = no.warmup_exponential(1.0, 2, 0.5, every=2, start=0.5, end=0.3)
    >>> [s(t) for t in range(1, 8)]
    [0.5, 0.75, 1.0, 0.7071067811865476, 0.5, 0.3535533905932738, 0.3]
    >>> no.warmup_exponential(1.0, 2, 0.5, every=2, staircase=True).values(np.arange(3, 9))
    array([1.  , 1.  , 0.5 , 0.5 , 0.25, 0.25])
    """

    def __init__(self, peak: float, warmup: int, decay: float, every: int = 1, begin: int = 0,
                 staircase: bool = False, start: float = 0.0, end: float | None = None) -> None:
        self.peak, self.start = check_num("peak", peak), check_num("start", start)
        self.warmup = check_num("warmup", warmup, low=0, integer=True)
        self.decay = check_num("decay", decay, low=0.0)
        if self.decay == 0:
            raise ValueError("warmup_exponential: decay=0 must be > 0 (optax makes decay_rate=0 a constant "
                             "schedule: write warmup_constant)")
        self.every = check_num("every", every, low=1, integer=True)
        self.begin = check_num("begin", begin, low=0, integer=True)
        if not isinstance(staircase, bool):
            raise TypeError(f"staircase must be a bool, got {staircase!r}")
        self.staircase = staircase
        self.end = None if end is None else check_num("end", end)

    def _params(self):
        return {"peak": self.peak, "warmup": self.warmup, "decay": self.decay, "every": self.every,
                "begin": self.begin, "staircase": self.staircase, "start": self.start, "end": self.end}

    def values(self, ts):
        c = np.asarray(ts, dtype=np.float64) - 1
        p = (c - self.warmup - self.begin) / self.every
        if self.staircase:
            p = np.floor(p)
        v = self.peak * self.decay ** np.maximum(p, 0.0)  # p <= 0: peak, as optax's where(k <= 0, peak, ...)
        if self.end is not None:
            v = (np.maximum if self.decay < 1 else np.minimum)(v, self.end)
        if self.warmup:
            v = np.where(c < self.warmup, (self.start - self.peak) * (1 - c / self.warmup) + self.peak, v)
        return v


class ademamix_alpha(Schedule):
    """AdEMAMix's warmup of ``alpha`` (Pagliardini et al. 2024, Algorithm 1): ``start + (alpha - start) * min(t /
    warmup, 1)`` at step ``t`` (from 1, as the authors' code counts it: ``alpha`` is reached at ``t = warmup``).
    For ``AdEMAMix(alpha=ademamix_alpha(alpha, T))``, with :class:`ademamix_beta3` over the same ``T``.

    Pagliardini, Ablin and Grangier, "The AdEMAMix Optimizer: Better, Faster, Older", 2024.
    https://arxiv.org/abs/2409.03137

    Examples
    --------
    >>> s = no.schedules.ademamix_alpha(8.0, 4)
    >>> [s(t) for t in (1, 2, 4, 100)]
    [2.0, 4.0, 8.0, 8.0]
    """

    def __init__(self, alpha: float, warmup: int, start: float = 0.0) -> None:
        self.alpha, self.start = check_num("alpha", alpha, low=0.0), check_num("start", start, low=0.0)
        self.warmup = check_num("warmup", warmup, low=1, integer=True)

    def _params(self):
        return {"alpha": self.alpha, "warmup": self.warmup, "start": self.start}

    def values(self, ts):
        a = np.minimum(np.asarray(ts, dtype=np.float64) / self.warmup, 1.0)
        return np.where(a < 1.0, (1.0 - a) * self.start + a * self.alpha, self.alpha)


class ademamix_beta3(Schedule):
    """AdEMAMix's warmup of ``beta3`` (Pagliardini et al. 2024, the authors' ``linear_hl_warmup_scheduler``): the
    half-life of the slow average, ``f(b) = ln(1/2) / ln(b + 1e-8) - 1`` steps, grows linearly from ``f(start)`` to
    ``f(beta3)`` over ``warmup`` steps, and ``beta3_t = 0.5 ** (1 / (f_t + 1))``; ``beta3`` from step ``warmup`` on
    (``t`` from 1). A linear warmup of ``beta3`` itself would spend almost all of it at short memories. ``start``
    defaults to AdEMAMix's ``beta1``, as the authors set it.

    Pagliardini, Ablin and Grangier, "The AdEMAMix Optimizer: Better, Faster, Older", 2024.
    https://arxiv.org/abs/2409.03137

    Examples
    --------
    >>> s = no.schedules.ademamix_beta3(0.9999, 1000)
    >>> [round(s(t), 6) for t in (1, 500, 999, 1000)]
    [0.949966, 0.9998, 0.9999, 0.9999]
    """

    def __init__(self, beta3: float, warmup: int, start: float = 0.9) -> None:
        self.beta3 = check_num("beta3", beta3, low=0.0, high=1.0)
        self.start = check_num("start", start, low=0.0, high=1.0)
        if self.beta3 >= 1.0 or self.start >= 1.0:
            raise ValueError(f"ademamix_beta3: beta3={beta3!r} and start={start!r} must be < 1 (a half-life of "
                             "infinitely many steps)")
        self.warmup = check_num("warmup", warmup, low=1, integer=True)

    def _params(self):
        return {"beta3": self.beta3, "warmup": self.warmup, "start": self.start}

    @staticmethod
    def _half_life(b):
        return math.log(0.5) / math.log(b + 1e-8) - 1.0

    def values(self, ts):
        a = np.minimum(np.asarray(ts, dtype=np.float64) / self.warmup, 1.0)
        f = (1.0 - a) * self._half_life(self.start) + a * self._half_life(self.beta3)
        return np.where(a < 1.0, 0.5 ** (1.0 / (f + 1.0)), self.beta3)
