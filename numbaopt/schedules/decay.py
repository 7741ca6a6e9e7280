"""Schedules that go from a start to an end value: linear, polynomial, exponential, piecewise constant,
cosine, and the inverse square root. The step convention: see the package's docstring (``numbaopt.schedules``)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import Schedule, check_num

__all__ = ["linear", "polynomial", "exponential", "piecewise_constant", "step_decay", "cosine", "inverse_sqrt"]


def _ts(ts):
    return np.asarray(ts, dtype=np.float64)


class linear(Schedule):
    """From ``start`` at t = 1 to ``end`` at t = 1 + steps, linearly; ``end`` afterwards."""

    def __init__(self, start: float, end: float, steps: int) -> None:
        self.start, self.end = check_num("start", start), check_num("end", end)
        self.steps = check_num("steps", steps, low=1, integer=True)

    def _params(self):
        return {"start": self.start, "end": self.end, "steps": self.steps}

    def values(self, ts):
        frac = np.clip((_ts(ts) - 1) / self.steps, 0.0, 1.0)
        return self.start + (self.end - self.start) * frac


class polynomial(Schedule):
    """From ``start`` to ``end`` along a polynomial of degree ``power``: ``start`` for the first ``begin``
    steps, then over ``steps`` steps, ``end`` afterwards. With the count ``c = t - 1``,

    ``value(t) = (start - end) * (1 - k / steps) ** power + end``,  ``k = clip(c - begin, 0, steps)``,

    as optax's ``polynomial_schedule(start, end, power, steps, begin)`` (``power=1`` is :class:`linear`).
    ``power > 1`` leaves ``start`` slowly and reaches ``end`` flat; ``power < 1`` the opposite.

    Examples
    --------
    >>> s = no.polynomial(1.0, 0.01, 2, 100, begin=5)
    >>> [round(s(t), 4) for t in (1, 6, 7, 105, 106, 200)]
    [1.0, 1.0, 0.9803, 0.0101, 0.01, 0.01]
    >>> no.Adam(lr=s)
    Adam(lr=polynomial(start=1.0, end=0.01, power=2.0, steps=100, begin=5), beta1=0.9, beta2=0.999, eps=1e-08)
    """

    def __init__(self, start: float, end: float, power: float, steps: int, begin: int = 0) -> None:
        self.start, self.end = check_num("start", start), check_num("end", end)
        self.power = check_num("power", power, low=0.0)
        self.steps = check_num("steps", steps, low=1, integer=True)
        self.begin = check_num("begin", begin, low=0, integer=True)

    def _params(self):
        return {"start": self.start, "end": self.end, "power": self.power, "steps": self.steps,
                "begin": self.begin}

    def values(self, ts):
        k = np.clip(_ts(ts) - 1 - self.begin, 0.0, self.steps)
        return (self.start - self.end) * (1 - k / self.steps) ** self.power + self.end


class exponential(Schedule):
    """``start * decay ** ((t-1) / every)``; ``staircase=True`` floors the exponent (decays in steps);
    never below ``end`` when decaying (default 0; when growing, a non-zero ``end`` is a cap)."""

    def __init__(self, start: float, decay: float, every: int = 1, staircase: bool = False,
                 end: float = 0.0) -> None:
        self.start = check_num("start", start)
        self.decay = check_num("decay", decay, low=0.0)
        self.every = check_num("every", every, low=1, integer=True)
        if not isinstance(staircase, bool):
            raise TypeError(f"staircase must be a bool, got {staircase!r}")
        self.staircase, self.end = staircase, check_num("end", end)

    def _params(self):
        return {"start": self.start, "decay": self.decay, "every": self.every, "staircase": self.staircase,
                "end": self.end}

    def values(self, ts):
        e = (_ts(ts) - 1) / self.every
        if self.staircase:
            e = np.floor(e)
        v = self.start * self.decay ** e
        if self.decay < 1:
            return np.maximum(v, self.end)  # end is a floor when decaying
        return np.minimum(v, self.end) if self.end else v  # and a cap (when given) when growing


class piecewise_constant(Schedule):
    """``values[k]`` once ``boundaries[k-1]`` steps have been taken: ``piecewise_constant([1e-3, 1e-4], [100])``
    uses 1e-3 for the first 100 steps (t = 1..100) and 1e-4 from the 101st (t = 101, count 100) on, as
    optax's ``piecewise_constant_schedule(1e-3, {100: 0.1})`` and torch's ``MultiStepLR(milestones=[100],
    gamma=0.1)``. A boundary of 0 starts at ``values[1]``."""

    def __init__(self, values: Sequence[float], boundaries: Sequence[int]) -> None:
        vals = [check_num("values[i]", v) for v in values]
        bounds = [check_num("boundaries[i]", b, low=0, integer=True) for b in boundaries]
        if len(vals) != len(bounds) + 1:
            raise ValueError(f"piecewise_constant: {len(vals)} values need {len(vals) - 1} boundaries, "
                             f"got {len(bounds)}")
        if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
            raise ValueError(f"piecewise_constant: boundaries {bounds} must increase")
        self.vals, self.boundaries = tuple(vals), tuple(bounds)

    def _params(self):
        return {"values": list(self.vals), "boundaries": list(self.boundaries)}

    def values(self, ts):
        # the count of steps taken (t - 1) against the boundaries: optax's and torch's switch point
        idx = np.searchsorted(np.array(self.boundaries, dtype=np.int64), np.asarray(ts) - 1, side="right")
        return np.array(self.vals, dtype=np.float64)[idx]


def step_decay(start: float, factor: float, every: int) -> exponential:
    """``start * factor ** floor((t-1)/every)`` (torch's StepLR): an exponential schedule in stairs."""
    return exponential(start, factor, every, staircase=True)


class cosine(Schedule):
    """Cosine decay from ``start`` to ``end`` over ``steps`` steps (t = 1 .. 1 + steps), ``end`` after:
    ``end + (start - end) * (1 + cos(pi * (t-1)/steps)) / 2``."""

    def __init__(self, start: float, steps: int, end: float = 0.0) -> None:
        self.start, self.end = check_num("start", start), check_num("end", end)
        self.steps = check_num("steps", steps, low=1, integer=True)

    def _params(self):
        return {"start": self.start, "steps": self.steps, "end": self.end}

    def values(self, ts):
        frac = np.clip((_ts(ts) - 1) / self.steps, 0.0, 1.0)
        return self.end + (self.start - self.end) * 0.5 * (1 + np.cos(np.pi * frac))


class inverse_sqrt(Schedule):
    """``min(peak, 1 / sqrt(t))``: Adafactor's relative step size (``rho_t`` of ``torch.optim.Adafactor``, whose
    ``lr`` is ``peak``; ``peak=0.01`` is the paper's ``min(1e-2, 1/sqrt(t))``).

    Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018, section 8.
    https://arxiv.org/abs/1804.04235

    Examples
    --------
    >>> s = no.inverse_sqrt(0.25)
    >>> [s(t) for t in (1, 16, 25, 100)]
    [0.25, 0.25, 0.2, 0.1]
    """

    def __init__(self, peak: float) -> None:
        self.peak = check_num("peak", peak, low=0.0)

    def _params(self):
        return {"peak": self.peak}

    def values(self, ts):
        return np.minimum(self.peak, 1.0 / np.sqrt(_ts(ts)))
