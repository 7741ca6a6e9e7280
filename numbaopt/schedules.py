"""Schedules: pure functions of the step that can drive any hyperparameter.

``Adam(lr=cosine(1e-3, 1000))`` or ``chain(WeightDecay(linear(1e-4, 0, 500)), Adam())``: a schedule
is evaluated once per step on the host and passed to the kernel as a runtime scalar, so it never
recompiles anything. Every schedule is printable (its repr rebuilds it), has a vectorised
``values(ts)`` (used to fill hyperparameter tables for compiled loops) and ``plot()`` when matplotlib
is installed.

The step convention (one for every schedule and every function):

* a numbaopt :class:`Schedule` is indexed by the step ``t``, counted from 1: ``s(1)`` is the value the
  first step uses;
* any other callable driving a hyperparameter (``Adam(lr=lambda c: 1e-3 * 0.99**c)``, an optax schedule,
  ``minimize(schedule=...)``) receives the *count*, ``c = t - 1``: the number of steps already taken, 0 at the
  first step. That is optax's ``count`` (``optax.adam(sched)`` calls ``sched(count)``) and torch's
  ``last_epoch`` (``LambdaLR(opt, f)`` multiplies by ``f(epoch)``), so ``Adam(lr=optax_sched)`` takes the steps
  of ``optax.adam(optax_sched)``;
* the two agree: every schedule here equals its optax counterpart at ``count = t - 1``
  (``cosine(v, n)(t) == optax.cosine_decay_schedule(v, n)(t - 1)``), boundaries included:
  ``piecewise_constant([a, b], [100])`` uses ``b`` from the 101st step (count 100) on, as optax's
  ``piecewise_constant_schedule`` and torch's ``MultiStepLR(milestones=[100])``.

:func:`schedule_value` and :func:`schedule_table` apply this convention; nothing else does.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["Schedule", "constant", "linear", "exponential", "piecewise_constant", "step_decay", "cosine",
           "warmup_cosine", "one_cycle", "join", "schedule_value", "schedule_table", "real_scalar", "is_schedule"]


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

    def plot(self, steps: int = 1000, ax=None, path=None):
        """Plot the schedule over ``1..steps`` with matplotlib (an optional extra); returns the axes.

        With ``path`` (and no ``ax``) the figure is a ``matplotlib.figure.Figure`` saved there, outside
        pyplot: the user's backend and open figures are left alone. Without either, pyplot's current
        figure machinery is used as it is (no backend is set)."""
        try:
            import matplotlib  # noqa: F401
        except ImportError:  # keep the package importable without the plotting extra
            raise ImportError("Schedule.plot needs matplotlib: pip install 'numbaopt[plot]'") from None
        ts = np.arange(1, int(steps) + 1)
        if ax is None and path is not None:
            from matplotlib.figure import Figure
            ax = Figure().add_subplot()
        elif ax is None:
            import matplotlib.pyplot as plt
            _, ax = plt.subplots()
        ax.plot(ts, self.values(ts))
        ax.set_xlabel("step t")
        ax.set_title(repr(self), fontsize=8)
        if path is not None:
            ax.figure.savefig(path, dpi=120, bbox_inches="tight")
        return ax


def is_schedule(v) -> bool:
    """Whether ``v`` drives a hyperparameter per step: a :class:`Schedule` or any other callable (a class,
    ``float`` say, is not one: it is a type, not a value)."""
    return callable(v) and not isinstance(v, type)


def schedule_value(s, t: int):
    """The raw value of ``s`` for step ``t`` (counted from 1): ``s(t)`` for a :class:`Schedule`,
    ``s(t - 1)`` (the count of steps already taken) for any other callable. See the module docstring."""
    return s(int(t)) if isinstance(s, Schedule) else s(int(t) - 1)


def schedule_table(s, ts) -> np.ndarray:
    """``schedule_value(s, t)`` for every step of ``ts`` as float64: ``s.values(ts)`` for a Schedule, one
    call per step for a function (each value a real scalar, see :func:`real_scalar`)."""
    ts = np.asarray(ts, dtype=np.int64).reshape(-1)
    if isinstance(s, Schedule):
        return np.asarray(s.values(ts), dtype=np.float64).reshape(-1)
    out = np.empty(ts.shape, dtype=np.float64)
    for k, t in enumerate(ts.tolist()):
        out[k] = real_scalar(s(t - 1))
    return out


def real_scalar(v):
    """``v`` as a Python number when it is one real scalar: an int, a float, a NumPy scalar or a 0-d array
    (a JAX or torch scalar, as optax schedules return); a ``TypeError`` otherwise (bool, complex, an array
    of another shape, anything else)."""
    if type(v) is float:  # the common case, first
        return v
    if isinstance(v, bool) or isinstance(v, (np.bool_, complex, np.complexfloating)):
        raise TypeError(f"returned {v!r} ({type(v).__name__}); expected one real number")
    if isinstance(v, (int, float, np.integer, np.floating)):
        return v
    try:
        a = np.asarray(v)
    except Exception:  # an object NumPy cannot read is simply not a number
        a = None
    if a is None or a.shape != () or a.dtype.kind not in "iuf":
        what = (f"an array of shape {a.shape}" if a is not None and a.shape != () else
                f"{type(v).__name__} {v!r:.60}")
        raise TypeError(f"returned {what}; expected one real number")
    return a.item()


def _ts(ts):
    return np.asarray(ts, dtype=np.float64)


class constant(Schedule):
    """``value`` at every step."""

    def __init__(self, value: float) -> None:
        self.value = _num("value", value)

    def _params(self):
        return {"value": self.value}

    def values(self, ts):
        return np.full(np.shape(ts), self.value, dtype=np.float64)


class linear(Schedule):
    """From ``start`` at t = 1 to ``end`` at t = 1 + steps, linearly; ``end`` afterwards."""

    def __init__(self, start: float, end: float, steps: int) -> None:
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

    def __init__(self, start: float, decay: float, every: int = 1, staircase: bool = False,
                 end: float = 0.0) -> None:
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
    """``values[k]`` once ``boundaries[k-1]`` steps have been taken: ``piecewise_constant([1e-3, 1e-4], [100])``
    uses 1e-3 for the first 100 steps (t = 1..100) and 1e-4 from the 101st (t = 101, count 100) on, as
    optax's ``piecewise_constant_schedule(1e-3, {100: 0.1})`` and torch's ``MultiStepLR(milestones=[100],
    gamma=0.1)``. A boundary of 0 starts at ``values[1]``."""

    def __init__(self, values: Sequence[float], boundaries: Sequence[int]) -> None:
        vals = [_num("values[i]", v) for v in values]
        bounds = [_num("boundaries[i]", b, low=0, integer=True) for b in boundaries]
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
        self.start, self.end = _num("start", start), _num("end", end)
        self.steps = _num("steps", steps, low=1, integer=True)

    def _params(self):
        return {"start": self.start, "steps": self.steps, "end": self.end}

    def values(self, ts):
        frac = np.clip((_ts(ts) - 1) / self.steps, 0.0, 1.0)
        return self.end + (self.start - self.end) * 0.5 * (1 + np.cos(np.pi * frac))


class join(Schedule):
    """Schedules in sequence, each restarted: ``join([s0, s1, s2], [b1, b2])`` runs ``s0`` for the first
    ``b1`` steps (t = 1..b1), then ``s1`` from its own t = 1 at t = b1 + 1 up to t = b2, then ``s2`` from its
    t = 1 at t = b2 + 1. As optax's ``join_schedules`` (which switches when ``count >= b``, count = t - 1)."""

    def __init__(self, schedules: Sequence[Schedule], boundaries: Sequence[int]) -> None:
        scheds = list(schedules)
        for s in scheds:
            if not isinstance(s, Schedule):
                raise TypeError(f"join: expected schedules, got {s!r}")
        bounds = [_num("boundaries[i]", b, low=1, integer=True) for b in boundaries]
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
        starts = (0,) + self.boundaries  # the counts at which each schedule starts
        which = np.searchsorted(np.array(self.boundaries, dtype=np.int64), ts - 1, side="right")
        for k, s in enumerate(self.schedules):
            sel = which == k
            if sel.any():
                out[sel] = s.values(ts[sel] - starts[k])
        return out


def warmup_cosine(peak: float, warmup: int, steps: int, start: float = 0.0, end: float = 0.0) -> join:
    """Linear warmup from ``start`` to ``peak`` over ``warmup`` steps, then cosine decay to ``end``
    (total ``steps`` including the warmup), as optax's ``warmup_cosine_decay_schedule``."""
    warmup = _num("warmup", warmup, low=1, integer=True)
    steps = _num("steps", steps, low=warmup + 1, integer=True)
    return join([linear(start, peak, warmup), cosine(peak, steps - warmup, end)], [warmup])


def one_cycle(peak: float, steps: int, pct_start: float = 0.3, div_factor: float = 25.0,
              final_div_factor: float = 1e4) -> join:
    """The one-cycle policy (Smith 2018), as optax's ``cosine_onecycle_schedule(steps, peak, pct_start,
    div_factor, final_div_factor)``: from ``peak/div_factor`` up to ``peak`` after ``int(pct_start*steps)``
    steps (clamped to 1..steps-1), then down to ``peak/(div_factor*final_div_factor)`` after ``steps`` steps
    (t = steps + 1), both halves cosine-shaped. torch's ``OneCycleLR(total_steps=N)`` places its peak at
    count ``pct_start*N - 1`` and its end at count ``N - 1``: ``one_cycle(peak, N - 1, pct)`` equals it when
    ``int(pct*(N - 1)) == pct*N - 1`` (``N = 12, pct_start = 0.25``, say)."""
    steps = _num("steps", steps, low=2, integer=True)
    pct = _num("pct_start", pct_start, low=0.0, high=1.0)
    up = min(max(int(pct * steps), 1), steps - 1)  # int() truncates, as optax's boundary
    lo = peak / _num("div_factor", div_factor, low=1.0)
    final = lo / _num("final_div_factor", final_div_factor, low=1.0)
    return join([cosine(lo, up, peak), cosine(peak, steps - up, final)], [up])
