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

The package in modules: ``base`` (:class:`Schedule`, the convention's functions, :class:`constant`,
:class:`join`), ``decay``, ``warmup`` and ``cycles``; every name is imported from here
(``numbaopt.schedules.cosine``), and the classes report this package as their module (their checkpoints name
``numbaopt.schedules:cosine``, whichever file defines them).
"""
from .base import Schedule, constant, is_schedule, join, real_scalar, schedule_table, schedule_value
from .cycles import linear_one_cycle, one_cycle, sgdr, sgdr_cycles
from .decay import cosine, exponential, inverse_sqrt, linear, piecewise_constant, polynomial, step_decay
from .warmup import ademamix_alpha, ademamix_beta3, warmup_constant, warmup_cosine, warmup_exponential

__all__ = ["Schedule", "constant", "linear", "exponential", "piecewise_constant", "step_decay", "cosine",
           "warmup_cosine", "one_cycle", "join", "polynomial", "warmup_constant", "warmup_exponential",
           "linear_one_cycle", "sgdr", "sgdr_cycles", "inverse_sqrt", "ademamix_alpha", "ademamix_beta3",
           "schedule_value",
           "schedule_table", "real_scalar",
           "is_schedule"]

for _name in __all__:  # one public home: numbaopt.schedules (saved checkpoints, pickles, the API reference)
    globals()[_name].__module__ = __name__
del _name
