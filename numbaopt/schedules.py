"""Schedules: pure functions of the step count ``t`` (1-based) that can drive any hyperparameter.

``Adam(lr=cosine(1e-3, 1000))`` or ``chain(WeightDecay(linear(1e-4, 0, 500)), Adam())``: a schedule
is evaluated once per step on the host and passed to the kernel as a runtime scalar, so it never
recompiles anything. Every schedule is printable (its repr rebuilds it), has a vectorised
``values(ts)`` (used to fill hyperparameter tables for compiled loops) and ``plot()`` when matplotlib
is installed. ``t`` counts steps from 1: ``s(1)`` is the value used by the first step.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["Schedule", "constant", "linear", "exponential", "piecewise_constant", "step_decay", "cosine",
           "warmup_cosine", "one_cycle", "join"]


def _num(name, v, low=None, high=None, integer=False):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {v!r}")
    try:
        f = float(v)
    except OverflowError:  # an int beyond float64
        raise ValueError(f"{name} (an integer of {len(str(v))} digits) is too large") from None
    if not math.isfinite(f):
        raise ValueError(f"{name}={v!r} must be a finite number")
    if integer and f != int(v):
        raise ValueError(f"{name}={v!r} must be an integer")
    v = int(v) if integer else f
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name}={v!r} must be in [{low if low is not None else '-inf'}, "
                         f"{high if high is not None else 'inf'}]")
    return v


class Schedule:
    """Base class: ``schedule(t) -> float`` for t = 1, 2, ...; ``values(ts)`` for an array of steps.

    Subclasses implement ``values`` (NumPy, float64); ``__call__`` evaluates one step through it, so
    the scalar and the vectorised forms cannot disagree.
    """

    def values(self, ts) -> np.ndarray:  # pragma: no cover - abstract
        """The schedule at every step of ``ts`` (an integer array), as float64."""
        raise NotImplementedError

    def __call__(self, t: int) -> float:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"{type(self).__name__}: the step t={t!r} must be an integer >= 1")
        return float(self.values(np.array([t], dtype=np.int64))[0])

    def _params(self) -> dict:
        return {}

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._params().items())})"

    def __eq__(self, other):
        return type(self) is type(other) and self._params() == other._params()

    def __hash__(self):
        return hash((type(self), repr(self)))

    def plot(self, steps: int = 1000, ax=None):
        """Plot the schedule over ``1..steps`` with matplotlib (an optional extra); returns the axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:  # keep the package importable without the plotting extra
            raise ImportError("Schedule.plot needs matplotlib: pip install 'numbaopt[plot]'") from None
        ts = np.arange(1, int(steps) + 1)
        if ax is None:
            _, ax = plt.subplots()
        ax.plot(ts, self.values(ts))
        ax.set_xlabel("step t")
        ax.set_title(repr(self), fontsize=8)
        return ax


def _ts(ts):
    return np.asarray(ts, dtype=np.float64)


class constant(Schedule):
    """``value`` at every step."""

    def __init__(self, value):
        self.value = _num("value", value)

    def _params(self):
        return {"value": self.value}

    def values(self, ts):
        return np.full(np.shape(ts), self.value, dtype=np.float64)


class linear(Schedule):
    """From ``start`` at t = 1 to ``end`` at t = 1 + steps, linearly; ``end`` afterwards."""

    def __init__(self, start, end, steps):
        self.start, self.end = _num("start", start), _num("end", end)
        self.steps = _num("steps", steps, low=1, integer=True)

    def _params(self):
        return {"start": self.start, "end": self.end, "steps": self.steps}

    def values(self, ts):
        frac = np.clip((_ts(ts) - 1) / self.steps, 0.0, 1.0)
        return self.start + (self.end - self.start) * frac


class exponential(Schedule):
    """``start * decay ** ((t-1) / every)``; ``staircase=True`` floors the exponent (decays in steps);
    never below ``end`` when decaying (default 0; when growing, a non-zero ``end`` is a cap)."""

    def __init__(self, start, decay, every=1, staircase=False, end=0.0):
        self.start = _num("start", start)
        self.decay = _num("decay", decay, low=0.0)
        self.every = _num("every", every, low=1, integer=True)
        if not isinstance(staircase, bool):
            raise TypeError(f"staircase must be a bool, got {staircase!r}")
        self.staircase, self.end = staircase, _num("end", end)

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
    """``values[0]`` until step ``boundaries[0]`` (exclusive), then ``values[1]``, ...:
    ``piecewise_constant([1e-3, 1e-4], [100])`` uses 1e-3 for t < 100 and 1e-4 from t = 100."""

    def __init__(self, values, boundaries):
        vals = [_num("values[i]", v) for v in values]
        bounds = [_num("boundaries[i]", b, low=1, integer=True) for b in boundaries]
        if len(vals) != len(bounds) + 1:
            raise ValueError(f"piecewise_constant: {len(vals)} values need {len(vals) - 1} boundaries, "
                             f"got {len(bounds)}")
        if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
            raise ValueError(f"piecewise_constant: boundaries {bounds} must increase")
        self.vals, self.boundaries = tuple(vals), tuple(bounds)

    def _params(self):
        return {"values": list(self.vals), "boundaries": list(self.boundaries)}

    def values(self, ts):
        idx = np.searchsorted(np.array(self.boundaries, dtype=np.int64), np.asarray(ts), side="right")
        return np.array(self.vals, dtype=np.float64)[idx]


def step_decay(start, factor, every):
    """``start * factor ** floor((t-1)/every)`` (torch's StepLR): an exponential schedule in stairs."""
    return exponential(start, factor, every, staircase=True)


class cosine(Schedule):
    """Cosine decay from ``start`` to ``end`` over ``steps`` steps (t = 1 .. 1 + steps), ``end`` after:
    ``end + (start - end) * (1 + cos(pi * (t-1)/steps)) / 2``."""

    def __init__(self, start, steps, end=0.0):
        self.start, self.end = _num("start", start), _num("end", end)
        self.steps = _num("steps", steps, low=1, integer=True)

    def _params(self):
        return {"start": self.start, "steps": self.steps, "end": self.end}

    def values(self, ts):
        frac = np.clip((_ts(ts) - 1) / self.steps, 0.0, 1.0)
        return self.end + (self.start - self.end) * 0.5 * (1 + np.cos(np.pi * frac))


class join(Schedule):
    """Schedules in sequence: ``join([s0, s1, s2], [b1, b2])`` runs ``s0`` for t < b1, then ``s1``
    restarted at its own t = 1 for b1 <= t < b2, then ``s2`` from its t = 1 at b2."""

    def __init__(self, schedules, boundaries):
        scheds = list(schedules)
        for s in scheds:
            if not isinstance(s, Schedule):
                raise TypeError(f"join: expected schedules, got {s!r}")
        bounds = [_num("boundaries[i]", b, low=2, integer=True) for b in boundaries]
        if len(scheds) != len(bounds) + 1:
            raise ValueError(f"join: {len(scheds)} schedules need {len(scheds) - 1} boundaries, got {len(bounds)}")
        if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
            raise ValueError(f"join: boundaries {bounds} must increase")
        self.schedules, self.boundaries = tuple(scheds), tuple(bounds)

    def _params(self):
        return {"schedules": list(self.schedules), "boundaries": list(self.boundaries)}

    def values(self, ts):
        ts = np.asarray(ts, dtype=np.int64)
        out = np.empty(ts.shape, dtype=np.float64)
        starts = (1,) + self.boundaries
        which = np.searchsorted(np.array(self.boundaries, dtype=np.int64), ts, side="right")
        for k, s in enumerate(self.schedules):
            sel = which == k
            if sel.any():
                out[sel] = s.values(ts[sel] - starts[k] + 1)
        return out


def warmup_cosine(peak, warmup, steps, start=0.0, end=0.0):
    """Linear warmup from ``start`` to ``peak`` over ``warmup`` steps, then cosine decay to ``end``
    (total ``steps`` including the warmup), as optax's ``warmup_cosine_decay_schedule``."""
    warmup = _num("warmup", warmup, low=1, integer=True)
    steps = _num("steps", steps, low=warmup + 1, integer=True)
    return join([linear(start, peak, warmup), cosine(peak, steps - warmup, end)], [warmup + 1])


def one_cycle(peak, steps, pct_start=0.25, div_factor=25.0, final_div_factor=1e4):
    """The one-cycle policy (Smith 2018; torch's OneCycleLR with cosine annealing): from
    ``peak/div_factor`` up to ``peak`` over ``pct_start*steps`` steps, then down to
    ``peak/(div_factor*final_div_factor)`` after ``steps`` steps (t = steps + 1, as optax counts), both
    halves cosine-shaped."""
    steps = _num("steps", steps, low=2, integer=True)
    pct = _num("pct_start", pct_start, low=0.0, high=1.0)
    up = min(max(int(round(pct * steps)), 1), steps - 1)
    lo = peak / _num("div_factor", div_factor, low=1.0)
    final = lo / _num("final_div_factor", final_div_factor, low=1.0)
    return join([cosine(lo, up, peak), cosine(peak, steps - up, final)], [up + 1])
