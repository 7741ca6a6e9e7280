"""Cyclic schedules: the one-cycle policy (cosine and linear) and cosine annealing with warm restarts (SGDR).
The step convention: see the package's docstring (``numbaopt.schedules``)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .base import Schedule, check_num, join
from .decay import cosine, linear
from .warmup import warmup_cosine

__all__ = ["one_cycle", "linear_one_cycle", "sgdr", "sgdr_cycles"]


def one_cycle(peak: float, steps: int, pct_start: float = 0.3, div_factor: float = 25.0,
              final_div_factor: float = 1e4) -> join:
    """The one-cycle policy (Smith 2018), as optax's ``cosine_onecycle_schedule(steps, peak, pct_start,
    div_factor, final_div_factor)``: from ``peak/div_factor`` up to ``peak`` after ``int(pct_start*steps)``
    steps (clamped to 1..steps-1), then down to ``peak/(div_factor*final_div_factor)`` after ``steps`` steps
    (t = steps + 1), both halves cosine-shaped. torch's ``OneCycleLR(total_steps=N)`` places its peak at
    count ``pct_start*N - 1`` and its end at count ``N - 1``: ``one_cycle(peak, N - 1, pct)`` equals it when
    ``int(pct*(N - 1)) == pct*N - 1`` (``N = 12, pct_start = 0.25``, say)."""
    steps = check_num("steps", steps, low=2, integer=True)
    pct = check_num("pct_start", pct_start, low=0.0, high=1.0)
    up = min(max(int(pct * steps), 1), steps - 1)  # int() truncates, as optax's boundary
    lo = peak / check_num("div_factor", div_factor, low=1.0)
    final = lo / check_num("final_div_factor", final_div_factor, low=1.0)
    return join([cosine(lo, up, peak), cosine(peak, steps - up, final)], [up])


def linear_one_cycle(peak: float, steps: int, pct_start: float = 0.3, pct_final: float = 0.85,
                     div_factor: float = 25.0, final_div_factor: float = 1e4) -> join:
    """The one-cycle policy in three linear phases, as optax's ``linear_onecycle_schedule(steps, peak, pct_start,
    pct_final, div_factor, final_div_factor)``: from ``lo = peak/div_factor`` up to ``peak`` after
    ``int(pct_start*steps)`` steps, back down to ``lo`` after ``int(pct_final*steps)`` steps, then down to
    ``lo/final_div_factor`` after ``steps`` steps (t = steps + 1), and that value afterwards. The three
    boundaries must increase (``int(pct_start*steps)`` may be 0: the cycle starts at its peak). The values are
    optax's products ``lo*div_factor``, ``.../div_factor``, ``.../final_div_factor`` (``peak`` up to rounding).
    :func:`one_cycle` is the cosine-shaped policy in two phases.

    Examples
    --------
    >>> s = no.linear_one_cycle(1.0, 10, pct_start=0.2, pct_final=0.6, div_factor=10.0, final_div_factor=10.0)
    >>> [round(s(t), 6) for t in range(1, 13)]
    [0.1, 0.55, 1.0, 0.775, 0.55, 0.325, 0.1, 0.0775, 0.055, 0.0325, 0.01, 0.01]
    """
    steps = check_num("steps", steps, low=2, integer=True)
    pct = check_num("pct_start", pct_start, low=0.0, high=1.0)
    pct_final = check_num("pct_final", pct_final, low=0.0, high=1.0)
    up, down = int(pct * steps), int(pct_final * steps)  # int() truncates, as optax's boundaries
    if not up < down < steps:
        raise ValueError(f"linear_one_cycle: the phases end at counts int(pct_start*steps) = {up}, "
                         f"int(pct_final*steps) = {down} and steps = {steps}, which must increase "
                         "(pct_start < pct_final < 1, apart enough for this many steps)")
    peak = check_num("peak", peak)
    div = check_num("div_factor", div_factor, low=1.0)
    lo = peak / div
    top = lo * div  # optax's cumulative products of the scales, in its order
    back = top * (1.0 / div)
    final = back * (1.0 / check_num("final_div_factor", final_div_factor, low=1.0))
    parts = [linear(lo, top, up)] if up else []
    parts += [linear(top, back, down - up), linear(back, final, steps - down)]
    return join(parts, [up, down] if up else [down])


class sgdr(Schedule):
    """Cosine annealing with warm restarts (SGDR: Loshchilov and Hutter 2017), restarting for ever: cycle ``k``
    (from 0) lasts ``T_k = period * mult**k`` steps; with ``c`` the count of steps taken since it began (0 at its
    first step),

    ``value = end + (peak - end) * (1 + cos(pi * c / T_k)) / 2``,

    so each cycle starts at ``peak`` and its last step is one step short of ``end``. As torch's
    ``CosineAnnealingWarmRestarts(opt, T_0=period, T_mult=mult, eta_min=end)`` with the optimiser's ``lr=peak``,
    and as optax's ``sgdr_schedule`` over the cycles it is given (``sgdr_cycles([dict(peak=peak, steps=T_k,
    end=end) for k in range(n)])``, which stays at ``end`` after its last cycle where this one restarts).

    Examples
    --------
    >>> s = no.sgdr(1.0, 4, mult=2)
    >>> [round(s(t), 4) for t in range(1, 14)]
    [1.0, 0.8536, 0.5, 0.1464, 1.0, 0.9619, 0.8536, 0.6913, 0.5, 0.3087, 0.1464, 0.0381, 1.0]
    """

    def __init__(self, peak: float, period: int, mult: int = 1, end: float = 0.0) -> None:
        self.peak, self.end = check_num("peak", peak), check_num("end", end)
        self.period = check_num("period", period, low=1, integer=True)
        self.mult = check_num("mult", mult, low=1, integer=True)

    def _params(self):
        return {"peak": self.peak, "period": self.period, "mult": self.mult, "end": self.end}

    def values(self, ts):
        c = np.asarray(ts, dtype=np.int64) - 1
        if self.mult == 1:
            into, length = c % self.period, float(self.period)
        else:  # the cycles' first counts, exactly in integers, up to the last count asked for
            starts, lengths, s, n = [], [], 0, self.period
            last = int(c.max()) if c.size else 0
            while s <= last:
                starts.append(s)
                lengths.append(float(n))
                s, n = s + n, n * self.mult
            k = np.searchsorted(np.array(starts, dtype=np.int64), c, side="right") - 1
            into, length = c - np.array(starts, dtype=np.int64)[k], np.array(lengths)[k]
        return self.end + (self.peak - self.end) * 0.5 * (1 + np.cos(np.pi * into / length))


#: optax's keywords of a warmup_cosine_decay_schedule, and this package's
_OPTAX_KEYS = {"init_value": "start", "peak_value": "peak", "warmup_steps": "warmup", "decay_steps": "steps",
               "end_value": "end"}
_KEYS = ("peak", "warmup", "steps", "start", "end")


def sgdr_cycles(cycles: Sequence[Mapping[str, float]]) -> join:
    """Warm restarts of given cycles, as optax's ``sgdr_schedule(cosine_kwargs)``: each cycle is a dict of
    :func:`warmup_cosine`'s keywords (``peak``, ``steps`` its length including the warmup; ``warmup`` default 0,
    ``start`` and ``end`` default 0.0), run from its own first step; the last one stays at its ``end``. optax's
    keywords ``init_value``, ``peak_value``, ``warmup_steps``, ``decay_steps``, ``end_value`` are ``start``,
    ``peak``, ``warmup``, ``steps``, ``end`` here. :class:`sgdr` is the usual spelling (a period, its
    multiplier, no end).

    Examples
    --------
    >>> s = no.sgdr_cycles([dict(peak=1.0, steps=4), dict(peak=0.5, warmup=2, steps=6, end=0.1)])
    >>> [round(s(t), 4) for t in range(1, 12)]
    [1.0, 0.8536, 0.5, 0.1464, 0.0, 0.25, 0.5, 0.4414, 0.3, 0.1586, 0.1]
    """
    cycles = list(cycles)
    if not cycles:
        raise ValueError("sgdr_cycles: no cycle given")
    scheds, bounds, total = [], [], 0
    for k, kw in enumerate(cycles):
        if not isinstance(kw, Mapping):
            raise TypeError(f"sgdr_cycles: cycle {k} must be a dict of warmup_cosine's keywords, got {kw!r}")
        bad = [n for n in kw if n not in _KEYS]
        if bad:
            hint = "; ".join(f"optax's {n} is {_OPTAX_KEYS[n]}" for n in bad if n in _OPTAX_KEYS)
            raise ValueError(f"sgdr_cycles: cycle {k} has no keyword {bad[0]!r} (the keywords: "
                             f"{', '.join(_KEYS)}){': ' + hint if hint else ''}")
        if "peak" not in kw or "steps" not in kw:
            raise ValueError(f"sgdr_cycles: cycle {k} needs peak and steps, got {dict(kw)!r}")
        warmup = check_num(f"cycles[{k}].warmup", kw.get("warmup", 0), low=0, integer=True)
        steps = check_num(f"cycles[{k}].steps", kw["steps"], low=warmup + 1, integer=True)
        peak, end = kw["peak"], kw.get("end", 0.0)
        scheds.append(warmup_cosine(peak, warmup, steps, kw.get("start", 0.0), end) if warmup else
                      cosine(peak, steps, end))
        total += steps
        bounds.append(total)
    return join(scheds, bounds[:-1])
