"""Reduce the learning rate when the loss stops improving: optax's ``contrib.reduce_on_plateau`` on the host.

A :class:`~numbaopt.schedules.Schedule` is a pure function of the step, tabulated ahead; this one needs the
loss, so it is an object the training loop feeds: ``scale = plateau.update(loss)``, or
``plateau.adjust_(state, loss, lr=base_lr)``, which sets ``lr = base_lr * scale`` through
:func:`numbaopt.adjust_` whenever that value changes (an adjust never recompiles anything).
"""
from __future__ import annotations

import math
from typing import Any, TypeVar, cast

from .api import adjust_
from .schedules.base import check_num, real_scalar

__all__ = ["ReduceOnPlateau"]

_S = TypeVar("_S")

#: the state that ``state_dict`` and ``load_state_dict`` carry, as optax's ReduceLROnPlateauState
_STATE = ("scale", "best_value", "plateau_count", "cooldown_count", "count", "avg_value")


class ReduceOnPlateau:
    """A scale for the learning rate, multiplied by ``factor`` when the loss has not improved for ``patience``
    evaluations: optax's ``contrib.reduce_on_plateau(factor, patience, rtol, atol, cooldown, accumulation_size,
    min_scale)``, the same state machine, in float64.

    Each :meth:`update` adds a loss to a running mean; every ``accumulation_size`` losses the mean ``m`` is
    judged, then the mean restarts:

    * ``m`` improves when ``m < (1 - rtol) * best - atol`` (``best`` starts at ``inf``); then ``best = m``
      and the plateau count restarts at 0, else it grows by 1;
    * during a cooldown (``cooldown`` judgements after a reduction) the plateau count stays 0;
    * otherwise, when the plateau count reaches ``patience``: ``scale = max(scale * factor, min_scale)``, the
      count restarts and the cooldown begins (``scale`` is also raised to ``min_scale`` at every judgement).

    The scale returned applies to the step taken with this loss, as optax's
    ``chain(adam(lr), reduce_on_plateau())`` scales the update of the call given ``value=loss``.
    torch's ``ReduceLROnPlateau(patience=p, threshold=rtol, threshold_mode='rel', eps=0)`` reduces after
    ``p + 1`` bad evaluations: it is ``patience=p + 1`` here (with ``atol=0``, ``accumulation_size=1``).
    ``patience=0``, which optax accepts and then reduces on every *improvement* (its count is 0 exactly then),
    is refused.

    Examples
    --------
    >>> x = np.array([1.0, -2.0])
    >>> state = no.setup(no.Adam(lr=0.1), x)
    >>> plateau = no.ReduceOnPlateau(factor=0.5, patience=2)
    >>> for loss in [3.0, 2.0, 2.5, 2.4, 2.2, 2.1, 1.0]:
    ...     state = plateau.adjust_(state, loss, lr=0.1)   # before the step this loss belongs to
    ...     state, x = no.update_(state, x, 2 * x)
    ...     print(plateau.scale, end=" ")
    1.0 1.0 1.0 0.5 0.5 0.25 0.25
    >>> state.rule.value_at("lr", state.t)
    0.025
    """

    def __init__(self, factor: float = 0.1, patience: int = 10, rtol: float = 1e-4, atol: float = 0.0,
                 cooldown: int = 0, accumulation_size: int = 1, min_scale: float = 0.0) -> None:
        self.factor = check_num("factor", factor)
        if not 0.0 < self.factor < 1.0:
            raise ValueError(f"ReduceOnPlateau: factor={factor!r} must be in (0, 1)")
        self.patience = check_num("patience", patience, low=0, integer=True)
        if self.patience == 0:
            raise ValueError("ReduceOnPlateau: patience=0 would reduce on every improvement (optax's plateau count "
                             "is 0 exactly then); patience=1 reduces on the first evaluation without one")
        self.rtol = check_num("rtol", rtol, low=0.0, high=1.0)
        self.atol = check_num("atol", atol, low=0.0)
        if self.rtol == 0 and self.atol == 0:
            raise ValueError("ReduceOnPlateau: rtol and atol are both 0; at least one must be positive")
        self.cooldown = check_num("cooldown", cooldown, low=0, integer=True)
        self.accumulation_size = check_num("accumulation_size", accumulation_size, low=1, integer=True)
        self.min_scale = check_num("min_scale", min_scale, low=0.0)
        self._applied: tuple | None = None  # (state, hyperparameter, value) adjust_ set last
        self.reset()

    def reset(self) -> None:
        """Back to the initial state (scale 1, no best loss yet), as optax's ``init``."""
        self.scale, self.best_value, self.avg_value = 1.0, math.inf, 0.0
        self.plateau_count = self.cooldown_count = self.count = 0

    def update(self, loss: Any) -> float:
        """Feed one loss (a real number, a 0-d NumPy, JAX or torch array); returns the scale for this step."""
        try:
            value = float(real_scalar(loss))
        except TypeError as e:
            raise TypeError(f"ReduceOnPlateau.update: the loss {e}") from None
        count = self.count + 1
        avg = (self.count * self.avg_value + value) / count
        if count < self.accumulation_size:
            self.count, self.avg_value = count, avg
            return self.scale
        improved = avg < (1 - self.rtol) * self.best_value - self.atol  # never for a NaN mean
        if improved:
            self.best_value = avg
        plateau = 0 if improved else self.plateau_count + 1
        if self.cooldown_count > 0:
            self.plateau_count, self.cooldown_count = 0, self.cooldown_count - 1
        elif plateau == self.patience:
            self.plateau_count, self.cooldown_count = 0, self.cooldown
            self.scale = max(self.scale * self.factor, self.min_scale)
        else:
            self.plateau_count, self.cooldown_count = plateau, 0
            self.scale = max(self.scale, self.min_scale)
        self.count, self.avg_value = 0, 0.0
        return self.scale

    def adjust_(self, state: _S, loss: Any, lr: float, hyper: str = "lr") -> _S:
        """:meth:`update` with ``loss``, then set the state's hyperparameter ``hyper`` to ``lr * scale`` with
        :func:`numbaopt.adjust_` if that is not the value this object set on this state last (so once at the
        first call, then only when the scale changes). Call it before the step the loss belongs to; returns
        the state. ``lr`` is the base value, a number (a scheduled learning rate: multiply the scale in yourself)."""
        base = check_num(hyper, lr)
        value = base * self.update(loss)
        applied = self._applied
        if applied is None or applied[0] is not state or applied[1] != hyper or applied[2] != value:
            state = adjust_(cast(Any, state), **{hyper: value})  # any state adjust_ takes
            self._applied = (state, hyper, value)
        return state

    def state_dict(self) -> dict[str, float | int]:
        """The state (scale, best_value, plateau_count, cooldown_count, count, avg_value), for a checkpoint."""
        return {k: getattr(self, k) for k in _STATE}

    def load_state_dict(self, d: dict[str, float | int]) -> None:
        """Restore :meth:`state_dict`'s values (the next :meth:`adjust_` sets the state's value again)."""
        missing = [k for k in _STATE if k not in d]
        if missing:
            raise ValueError(f"ReduceOnPlateau.load_state_dict: missing {missing}")
        self.scale = check_num("scale", d["scale"], low=0.0)
        best = d["best_value"]
        self.best_value = math.inf if best == math.inf else check_num("best_value", best)
        self.avg_value = check_num("avg_value", d["avg_value"])
        for k in ("plateau_count", "cooldown_count", "count"):
            setattr(self, k, check_num(k, d[k], low=0, integer=True))
        self._applied = None

    def __repr__(self) -> str:
        return (f"ReduceOnPlateau(factor={self.factor!r}, patience={self.patience!r}, rtol={self.rtol!r}, "
                f"atol={self.atol!r}, cooldown={self.cooldown!r}, accumulation_size={self.accumulation_size!r}, "
                f"min_scale={self.min_scale!r})")
