"""Schedules: pure functions of the step count ``t`` (1-based) that can drive any hyperparameter.

A schedule is evaluated once per step on the host and passed to the kernel as a runtime scalar, so a
schedule never recompiles anything. Filled in by the catalog (see :mod:`numbaopt.schedules`).
"""
from __future__ import annotations


class Schedule:
    """Base class: ``schedule(t) -> float`` for t = 1, 2, ..."""

    def __call__(self, t: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError
