"""Compiled optimisation loops: :func:`minimize`, :func:`minimize_batch` and the :class:`SPSA` estimator.

When the objective is an ``@njit`` function, the whole loop (objective and gradient, the rule's step,
the stopping tests, a schedule) runs as ONE compiled call per chunk of iterations; Python only runs
between chunks (callbacks, the progress bar). A plain Python objective runs the very same loop body
interpreted (the driver's ``py_func``), so both paths have the same semantics and, for the same
objective, give bitwise identical iterates.

How the driver is compiled and cached: for each (chain, dtype) the rule's kernels live in a generated
module (:mod:`numbaopt.compiler`). This module writes, next to it, a small driver module that imports
that module's ``step_inline`` kernel by its content-hashed name (a changed rule is a new kernel module, hence
a new driver file: the cache never replays a stale step) and is compiled with ``cache=True``. The user's
objective is passed to the driver as a first-class function (``numba.types.FunctionType`` of its
signature), not as a dispatcher type: a dispatcher-typed argument misses Numba's cache in every new
process and leaves a new cache file each time, while a function-typed one is an ordinary cached
signature, and the objective's code is called through its address, so editing it can never replay stale
code.
"""
from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compiler.notice import register as register_public
from .drivers import CALLBACK, FTOL, GTOL, MAXITER, REASONS, RULE_ERROR, RUNNING, TARGET, driver_module
from .problem import DEFAULT_GTOL, Problem, count, loss_value
from .results import BatchResult, OptimizeResult

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from ..rules.base import Rule
    from ..rules.chain import Chain
    from ..schedules import Schedule
    from .spsa import SPSA

    #: ``minimize(schedule=...)``: a schedule (or function of the count) for ``lr``, or one per hyperparameter
    ScheduleArg = Schedule | Callable[[int], float] | Mapping[str, Schedule | Callable[[int], float]] | None

__all__ = ["minimize", "minimize_batch"]

#: the wall time a chunk of compiled iterations aims for when a progress bar is shown
_TARGET_CHUNK_S = 0.1
#: the shortest time between two updates of the bar's loss and gradient-norm postfix
_POSTFIX_S = 0.1


class Bar:
    """The tqdm bar of ``progress=True``: iterations done (the furthest row of a batch), the loss and the
    gradient norm as a postfix (at most every ``_POSTFIX_S``), left on screen at the end."""

    def __init__(self, p):
        # tqdm.auto only inside Jupyter: elsewhere it merely adds the cost of looking for IPython
        if "ipykernel" in sys.modules:
            from tqdm.auto import tqdm
        else:
            from tqdm import tqdm
        self.p, self.shown, self.posted = p, 0, -np.inf
        self.bar = tqdm(total=p.maxiter, unit="it", leave=True, dynamic_ncols=True)

    def show(self, final=False):
        p = self.p
        now = time.perf_counter()
        if final or now - self.posted >= _POSTFIX_S:
            self.posted = now
            r = int(np.nanargmin(p.F[:, 0])) if p.B > 1 and np.isfinite(p.F[:, 0]).any() else 0
            post = {"loss": f"{p.F[r, 0]:.6g}", "|g|": f"{p.F[r, 2]:.3g}"}
            if p.B > 1:  # the best row's loss and gradient norm, and how many rows still run
                post["running"] = f"{int(np.sum(p.I[:, 3] == RUNNING))}/{p.B}"
            self.bar.set_postfix(post, refresh=False)
        done = int(np.max(p.I[:, 0]))
        self.bar.update(done - self.shown)  # redraws at most every tqdm mininterval (0.1 s)
        self.shown = done
        if final:
            self.bar.refresh()

    def close(self):
        self.bar.close()


#: the codes counted as success (``converged``): a tolerance, or the loss target, was met
SUCCESS = (GTOL, FTOL, TARGET)


def run(p, compiled, callback, callback_every, progress, make_snapshot, threads=1):
    """Advance ``p`` to the end: chunks of compiled (or interpreted) iterations, Python in between."""
    advance = p.runner(compiled, threads)
    try:
        _chunks(p, advance, callback, callback_every, progress, make_snapshot)
    finally:
        advance.close()


def _chunks(p, advance, callback, callback_every, progress, make_snapshot):
    total = p.maxiter + 1
    bar = None
    if progress:
        try:
            bar = Bar(p)
        except ImportError:
            warnings.warn("progress=True needs tqdm (pip install tqdm); running without a progress bar",
                          stacklevel=4)
    if callback is not None:
        chunk = callback_every
    elif bar is not None:
        chunk = 64
    else:
        chunk = total
    first = True
    try:
        while True:
            t0 = time.perf_counter()
            advance(chunk)
            dt = time.perf_counter() - t0
            if first:  # every row has evaluated its gradient once: was grad_out written?
                p.check_gradient_written()
                first = False
            active = p.I[:, 3] == RUNNING
            if bar is not None:
                bar.show(final=not active.any())
                if callback is None:  # chunks of about _TARGET_CHUNK_S: Python runs ~10 times a second
                    chunk = int(min(max(chunk * min(4.0, _TARGET_CHUNK_S / max(dt, 1e-9)), 1), total))
            if not active.any():
                break
            if callback is not None:
                try:
                    stop = callback(make_snapshot())
                except StopIteration:
                    stop = True
                if stop:
                    p.I[active, 3] = CALLBACK
                    if bar is not None:
                        bar.show(final=True)
                    break
    finally:
        if bar is not None:
            bar.close()


def message(code, rules):
    if code in REASONS:
        return REASONS[code]
    rule = rules.rules[code - RULE_ERROR]  # RULE_ERROR + k: member k's reduction refused the step
    msg = getattr(type(rule), "error_message", "reduction reported an error")
    return f"{type(rule).__name__}: {msg}"


def finish(p):
    """Make ``fun`` the loss at the final ``x`` where the loop did not evaluate it: every row under
    SPSA (it never evaluates fun at x_k itself), rows stopped by the callback (x moved after the last
    evaluation)."""
    for r in range(p.B):
        it = p.I[r, 0]
        if p.mode == "spsa":
            f = loss_value(p.fun(p.X[r], *p.args))
        elif p.I[r, 3] == CALLBACK:
            g = p.G[r]
            if p.mode == "fg":
                f = loss_value(p.fun(p.X[r], g, *p.args))
            else:
                f = loss_value(p.fun(p.X[r], *p.args))
                p.jac(p.X[r], g, *p.args)
            p.F[r, 2] = driver_module(p.rules[0], p.dtype).grad_norm(g)  # cached: no compile here
        else:
            continue
        p.F[r, 0] = f
        p.H[r, it if p.keep else 0] = f


# ---------------------------------------------------------------------------------------------
# the public drivers
# ---------------------------------------------------------------------------------------------
def minimize(fun: Callable[..., Any], x0: ArrayLike, rule: Rule | Chain, jac: Callable[..., Any] | SPSA | None = None,
             *, args: tuple[Any, ...] = (), maxiter: int = 1000, gtol: float | None = DEFAULT_GTOL,
             ftol: float | None = None, schedule: ScheduleArg = None,
             f_target: float | None = None, callback: Callable[[OptimizeResult], bool | None] | None = None,
             callback_every: int = 1, progress: bool = False, compiled: bool | None = None,
             history: bool = True) -> OptimizeResult:
    """Minimise ``fun`` from ``x0`` with an update rule (or a fused chain); a scipy-like driver.

    ``fun(x, grad_out, *args) -> loss`` writes the gradient into ``grad_out``; or give
    ``fun(x, *args) -> loss`` with ``jac(x, grad_out, *args)``; or ``jac=SPSA(...)`` to estimate the
    gradient from two evaluations per step. ``x`` is 1-D (``x0`` is flattened and copied; float32 stays
    float32). When ``fun`` (and ``jac``) are ``@numba.njit`` functions the whole loop runs compiled, in
    chunks; otherwise (or with ``compiled=False``) the same loop runs in Python.

    Each iteration evaluates the loss and gradient at ``x_k``, then stops when the gradient's 2-norm is
    ``<= gtol``, when ``|f_k - f_(k-1)| <= ftol * max(|f_k|, |f_(k-1)|, 1)``, when the loss or gradient
    is not finite, or after ``maxiter`` steps (``None`` disables a tolerance); otherwise the rule steps.
    ``f_target`` stops as soon as the loss is ``<= f_target`` (status ``TARGET``, counted in ``converged``),
    tested inside the compiled loop right after each evaluation. With SPSA the test is on the mean of the two
    perturbed evaluations (no extra evaluation per step); ``fun`` and ``history[nit]`` are then the loss at
    the final ``x``, evaluated once more, which can lie above the target.
    With ``jac=SPSA(...)`` the default ``gtol`` is disabled (an estimate can be exactly zero far from a
    minimum); an explicit ``gtol`` applies to the estimate of each iteration.
    ``schedule`` drives hyperparameters inside the compiled loop: a numbaopt schedule, or a function of the
    count ``c`` of steps taken (0 at the first step, as optax and torch's LambdaLR),
    for ``lr``, or a dict ``{name: schedule}`` (schedules set in the rule itself work too); every value is
    validated before the loop starts. ``callback(result) -> stop?`` runs every ``callback_every``
    iterations with a snapshot (its ``x`` is the live array: do not modify it); returning True or raising
    StopIteration stops. ``progress=True`` shows a tqdm bar (optional extra) with the loss and the gradient
    norm, left on screen at the end; the compiled loop then runs in chunks of about 0.1 s (the cost is
    measured in docs/loops.md). ``history=False`` keeps no loss history (it takes ``maxiter + 1`` floats
    per problem otherwise). ``fun`` (or ``jac``) must write the gradient into ``grad_out``: one that
    returns it instead, or leaves entries unwritten, is a ``TypeError`` after the first evaluation.
    """
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")
    callback_every = count("callback_every", callback_every, 1)
    p = Problem(fun, x0, rule, jac, args, maxiter, gtol, ftol, schedule, "x0", False, history, f_target)

    def snapshot():
        # between chunks x is x_nit (stepped), evaluated up to x_(nit-1): fun is history[-1]
        it = int(p.I[0, 0])
        return OptimizeResult(x=p.X[0], fun=float(p.F[0, 0]), nit=it, grad_norm=float(p.F[0, 2]),
                              history=p.H[0, :it] if p.keep else None, t=int(p.I[0, 1]))

    run(p, compiled, callback, callback_every, progress, snapshot)
    finish(p)
    it, t, skipped, code = (int(v) for v in p.I[0])
    per_eval = 2 if p.mode == "spsa" else 1
    nfev = (it * per_eval + 1) if p.mode == "spsa" else it + 1
    if p.mode == "spsa" and code not in (MAXITER, CALLBACK):
        nfev += 2  # the iteration that met a tolerance evaluated fun twice before stopping
    x = p.X[0].copy()
    return OptimizeResult(x=x, fun=float(p.F[0, 0]), nit=it, nfev=nfev, converged=code in SUCCESS,
                          status=code, message=message(code, p.rules[0]),
                          history=p.H[0, :it + 1].copy() if p.keep else None,
                          grad_norm=float(p.F[0, 2]), t=t, skipped=skipped, state=p.S)


def minimize_batch(fun: Callable[..., Any], X0: ArrayLike, rule: Rule | Chain | Sequence[Rule | Chain],
                   jac: Callable[..., Any] | SPSA | None = None, *, args: tuple[Any, ...] = (), maxiter: int = 1000,
                   gtol: float | None = DEFAULT_GTOL, ftol: float | None = None, schedule: ScheduleArg = None,
                   f_target: float | ArrayLike | None = None,
                   callback: Callable[[BatchResult], bool | None] | None = None, callback_every: int = 1,
                   progress: bool = False, compiled: bool | None = None, history: bool = True,
                   threads: int = 1) -> BatchResult:
    """Minimise ``fun`` from every row of ``X0`` (shape ``(B, n)``): B independent problems at once.

    Each row has its own rule state, its own step count and its own stopping status; one compiled call
    advances every running row (per chunk of iterations). ``fun``, ``jac``, ``args`` and the options are
    those of :func:`minimize` (``fun`` sees one row at a time); row ``r`` gives exactly the iterates of
    ``minimize(fun, X0[r], ...)``. ``rule`` is one rule for all rows, or a list of B rules of the same
    types and options (e.g. a sweep over ``lr``). ``callback`` receives a :class:`BatchResult` snapshot.

    ``f_target``: one loss target for every row, or an array of B per-row targets; a row stops as soon as
    its loss is ``<=`` its target (status ``TARGET``), the others go on (multi-start: stop each start once
    it is good enough). ``threads=k`` runs the rows in ``k`` contiguous blocks, one thread each (the compiled
    driver releases the GIL), bitwise the result of ``threads=1``: see :mod:`numbaopt.loops.blocks`. Only
    a compiled loop runs in parallel: with a Python objective (or ``compiled=False``) it warns and runs on
    one thread. ``fun`` must then be thread-safe (no scratch array shared through ``args``).
    """
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")
    callback_every = count("callback_every", callback_every, 1)
    threads = count("threads", threads, 1)
    p = Problem(fun, X0, rule, jac, args, maxiter, gtol, ftol, schedule, "X0", True, history, f_target)
    if threads > 1 and not p.runs_compiled(compiled):
        warnings.warn(f"minimize_batch(threads={threads}): the objective runs in Python (it holds the GIL), so "
                      "the rows run on one thread; pass @numba.njit functions to run them in parallel",
                      RuntimeWarning, stacklevel=2)
        threads = 1

    def snapshot():
        return batch_result(p, live=True)

    run(p, compiled, callback, callback_every, progress, snapshot, threads)
    finish(p)
    return batch_result(p, live=False)


def batch_result(p, live):
    its = p.I[:, 0].copy()
    codes = p.I[:, 3].copy()
    if p.mode == "spsa":
        nfev = its * 2 + 1 + np.where(np.isin(codes, (MAXITER, CALLBACK, RUNNING)), 0, 2)
    else:
        nfev = its + 1
    width = int(its.max()) + 1
    return BatchResult(x=p.X if live else p.X.copy(), fun=p.F[:, 0].copy(), nit=its, nfev=nfev,
                       converged=np.isin(codes, SUCCESS), status=codes,
                       message=[message(int(c), p.rules[0]) if c else "running" for c in codes],
                       history=p.H[:, :width].copy() if p.keep else None, grad_norm=p.F[:, 2].copy(),
                       t=p.I[:, 1].copy(),
                       skipped=p.I[:, 2].copy(), state=p.S)


register_public(minimize, minimize_batch)  # the compile notice charges their compilation to them
