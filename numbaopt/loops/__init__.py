"""Compiled optimisation loops: :func:`minimize`, :func:`minimize_batch` and the :class:`SPSA` estimator.

:mod:`.drivers` (the generated loop bodies), :mod:`.problem` (validation and layout), :mod:`.fnref` (the
objective as a first-class function), :mod:`.blocks` (a batch's rows on several threads), :mod:`.results`,
:mod:`.spsa`, :mod:`.minimize` (the entry points).

Status codes: ``RUNNING`` 0, ``GTOL`` 1, ``FTOL`` 2, ``NONFINITE`` 3, ``MAXITER`` 4, ``CALLBACK`` 5, ``TARGET`` 6
(the loss reached ``f_target``), ``RULE_ERROR + k`` (7 + k): member ``k`` of the chain refused the step.
"""
from .drivers import CALLBACK, FTOL, GTOL, MAXITER, NONFINITE, RULE_ERROR, RUNNING, TARGET
from .minimize import minimize, minimize_batch
from .results import BatchResult, OptimizeResult
from .spsa import SPSA

__all__ = ["minimize", "minimize_batch", "SPSA", "OptimizeResult", "BatchResult", "RUNNING", "GTOL", "FTOL",
           "NONFINITE", "MAXITER", "CALLBACK", "TARGET", "RULE_ERROR"]
