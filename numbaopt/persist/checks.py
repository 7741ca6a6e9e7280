"""Strict readers of header values and the limits a checkpoint is held to.

Every value of a header is checked for its JSON type before it is used (``true`` is not an integer,
``2.0`` not a dimension, a string not a list), and every size or count against a limit before anything
is allocated on its strength. The step counters are held to the invariants the kernels keep
(:mod:`numbaopt.compiler.layout`), so a file cannot hand a state a step count that overflows, runs
backwards or contradicts its accumulation cycle.
"""
from __future__ import annotations

import math

import numpy as np

from ..backends.state import SUPPORTED
from ..compiler.layout import COUNTERS
from .files import CheckpointError

__all__ = ["MAX_COUNT", "MAX_ELEMENTS", "MAX_NDIM", "PARAM_DTYPES", "as_dict", "as_list", "as_int", "as_bool",
           "as_str", "shape_of", "elements", "param_dtype", "compute_dtype", "counter_problem", "check_counters"]

#: the largest step counter (t, tp, count, skipped): t stays exact as a float64 (hyperparameter schedules,
#: bias corrections) and ``t + 1`` cannot overflow the kernels' int64 counters
MAX_COUNT = 2 ** 53
#: the most elements of one leaf, and of all leaves of a group together: the groups' offset tables are
#: int64, and nothing real comes near (2**48 float64 elements are 2 PiB)
MAX_ELEMENTS = 2 ** 48
#: NumPy's own limit on the number of dimensions
MAX_NDIM = 64
#: a parameter's dtype as the header names it (``dtype.str``): real or complex floats, native byte order
PARAM_DTYPES = {np.dtype(t).str: np.dtype(t) for t in
                (np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128, np.clongdouble)}
_COMPUTE_DTYPES = {d.str: d for d in SUPPORTED}


def _kind(v) -> str:
    return "null" if v is None else type(v).__name__


def as_dict(v, what: str, keys=None) -> dict:
    """``v`` if it is a JSON object (with exactly ``keys``, when given)."""
    if not isinstance(v, dict):
        raise CheckpointError(f"{what} is {_kind(v)}, expected an object")
    if keys is not None and set(v) != set(keys):
        missing, extra = sorted(set(keys) - set(v)), sorted(set(v) - set(keys))
        raise CheckpointError(f"{what} has fields {sorted(v)}" + (f"; missing {missing}" if missing else "")
                              + (f"; unknown {extra}" if extra else ""))
    return v


def as_list(v, what: str, length: int | None = None) -> list:
    """``v`` if it is a JSON array (of ``length`` items, when given)."""
    if not isinstance(v, list):
        raise CheckpointError(f"{what} is {_kind(v)}, expected a list")
    if length is not None and len(v) != length:
        raise CheckpointError(f"{what} has {len(v)} entries, expected {length}")
    return v


def as_int(v, what: str, low: int | None = 0, high: int | None = None) -> int:
    """``v`` if it is an integer (not a bool, not a float) in ``[low, high]`` (None: unbounded)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise CheckpointError(f"{what} is {_kind(v)} {v!r:.40}, expected an integer")
    if (low is not None and v < low) or (high is not None and v > high):
        lo, hi = "-inf" if low is None else low, "inf" if high is None else high
        raise CheckpointError(f"{what}={v} is outside [{lo}, {hi}]" if abs(v) < 10 ** 40 else
                              f"{what} (an integer of {len(str(abs(v)))} digits) is outside [{lo}, {hi}]")
    return v


def as_bool(v, what: str) -> bool:
    if not isinstance(v, bool):
        raise CheckpointError(f"{what} is {_kind(v)} {v!r:.40}, expected true or false")
    return v


def as_str(v, what: str) -> str:
    if not isinstance(v, str):
        raise CheckpointError(f"{what} is {_kind(v)} {v!r:.40}, expected a string")
    return v


def shape_of(v, what: str) -> tuple:
    """A shape: a list of at most :data:`MAX_NDIM` non-negative integers of at most :data:`MAX_ELEMENTS`
    elements in all (counted exactly, not in wrapping int64)."""
    dims = as_list(v, what)
    if len(dims) > MAX_NDIM:
        raise CheckpointError(f"{what} has {len(dims)} dimensions (at most {MAX_NDIM})")
    shape = tuple(as_int(n, f"{what}[{k}]", 0, MAX_ELEMENTS) for k, n in enumerate(dims))
    if math.prod(shape) > MAX_ELEMENTS:
        raise CheckpointError(f"{what} {list(shape)} has {math.prod(shape)} elements (at most 2**48)")
    return shape


def elements(shape) -> int:
    return math.prod(shape)


def param_dtype(v, what: str) -> np.dtype:
    """A parameter's dtype (``dtype.str`` of a real or complex float type of this machine's byte order)."""
    s = as_str(v, what)
    if s not in PARAM_DTYPES:
        raise CheckpointError(f"{what} {s!r} is not a parameter dtype (one of {sorted(PARAM_DTYPES)})")
    return PARAM_DTYPES[s]


def compute_dtype(v, what: str) -> np.dtype:
    """A dtype the kernels compute in (float32/64, complex64/128, native byte order)."""
    s = as_str(v, what)
    if s not in _COMPUTE_DTYPES:
        raise CheckpointError(f"{what} {s!r} is not a compute dtype (one of {sorted(_COMPUTE_DTYPES)})")
    return _COMPUTE_DTYPES[s]


def counter_problem(counters, layout) -> str | None:
    """What is wrong with a leaf's counters (``t, tp, count, skipped``) under ``layout``, or None.

    What the kernels keep (:mod:`numbaopt.compiler.layout`): a step advances ``t`` and ``tp`` and ends the
    cycle (``count = 0``); an accumulating call advances ``tp`` and ``count``; a skip before an AccumGrad
    advances ``skipped`` alone, one after it ``tp`` and ``skipped`` and ends the cycle. So ``t <= tp``, and
    ``count <= tp - t`` (``count < n`` does not hold: ``adjust`` may lower ``n`` mid-cycle); without an
    AccumGrad ``tp == t`` and ``count == 0``. ``skipped`` is not bounded by the others (a first call that
    is skipped leaves ``t = tp = 0``).
    """
    vals = [int(c) for c in counters]
    for name, v in zip(COUNTERS, vals):
        if not 0 <= v <= MAX_COUNT:
            return f"step counter {name}={v} is outside [0, 2**53]"
    t, tp, count, _ = vals
    if layout.accum is None:
        if tp != t or count != 0:
            return f"step counters t={t}, tp={tp}, count={count}: without an AccumGrad tp equals t and count is 0"
    elif t > tp or count > tp - t:
        return (f"step counters t={t}, tp={tp}, count={count}: t (steps) cannot exceed tp (calls), nor count "
                "(gradients of this cycle) the calls that did not step")
    return None


def check_counters(counters, layout, what: str) -> None:
    problem = counter_problem(counters, layout)
    if problem is not None:
        raise CheckpointError(f"{what}: {problem}")
