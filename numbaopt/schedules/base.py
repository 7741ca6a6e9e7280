"""The base of every schedule: :class:`Schedule`, the step convention's two functions, checks, and the two
schedules the others are built from (:class:`constant`, :class:`join`). The convention: see the package's
docstring (``numbaopt.schedules``)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["Schedule", "constant", "join", "schedule_value", "schedule_table", "real_scalar", "is_schedule",
           "check_num"]


def check_num(name, v, low=None, high=None, integer=False):
    """``v`` as a float (an int with ``integer=True``), checked: a real finite number in ``[low, high]``; a
    ``TypeError`` or ``ValueError`` naming ``name`` otherwise."""
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


class constant(Schedule):
    """``value`` at every step."""

    def __init__(self, value: float) -> None:
        self.value = check_num("value", value)

    def _params(self):
        return {"value": self.value}

    def values(self, ts):
        return np.full(np.shape(ts), self.value, dtype=np.float64)


class join(Schedule):
    """Schedules in sequence, each restarted: ``join([s0, s1, s2], [b1, b2])`` runs ``s0`` for the first
    ``b1`` steps (t = 1..b1), then ``s1`` from its own t = 1 at t = b1 + 1 up to t = b2, then ``s2`` from its
    t = 1 at t = b2 + 1. As optax's ``join_schedules`` (which switches when ``count >= b``, count = t - 1)."""

    def __init__(self, schedules: Sequence[Schedule], boundaries: Sequence[int]) -> None:
        scheds = list(schedules)
        for s in scheds:
            if not isinstance(s, Schedule):
                raise TypeError(f"join: expected schedules, got {s!r}")
        bounds = [check_num("boundaries[i]", b, low=1, integer=True) for b in boundaries]
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
