"""Compiled optimisation loops: :func:`minimize`, :func:`minimize_batch` and the :class:`SPSA` estimator.

:mod:`.drivers` (the generated loop bodies), :mod:`.problem` (validation and layout), :mod:`.fnref` (the
objective as a first-class function), :mod:`.results`, :mod:`.spsa`, :mod:`.minimize` (the entry points).
"""
from .drivers import CALLBACK, FTOL, GTOL, MAXITER, NONFINITE, RUNNING
from .minimize import minimize, minimize_batch
from .results import BatchResult, OptimizeResult
from .spsa import SPSA

__all__ = ["minimize", "minimize_batch", "SPSA", "OptimizeResult", "BatchResult", "RUNNING", "GTOL", "FTOL",
           "NONFINITE", "MAXITER", "CALLBACK"]
