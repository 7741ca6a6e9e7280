"""One optimisation problem (or a batch of them) validated and laid out for the drivers: nothing runs here."""
from __future__ import annotations

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

from ..backends.state import Leaf, as_rule, check_param_dtype
from ..compiler import ChainLayout, real_dtype
from ..schedules import is_schedule, schedule_table
from .blocks import BlockRunner, row_blocks
from .drivers import driver_module, kernel_key, python_driver
from .fnref import compiled_entry
from .spsa import SPSA

__all__ = ["Problem", "is_njit", "nonneg", "count", "as_params", "schedule_values", "check_values", "schedule_slots",
           "DefaultTolerance", "DEFAULT_GTOL", "checked_jac", "fill_unwritten", "unwritten_gradient", "loss_targets"]


class DefaultTolerance(float):
    """A tolerance nobody chose: the signature's default. It is a ``float`` (``gtol=1e-6`` everywhere), but
    the loops can tell it from the same number passed explicitly: with ``jac=SPSA(...)`` the default gtol is
    disabled, because a stochastic estimate can be exactly zero (at a point of symmetry, for one draw of
    the perturbation) far from any minimum."""

    __slots__ = ()

    def __repr__(self):
        return float.__repr__(self)


#: ``gtol``'s default in :func:`minimize` and :func:`minimize_batch`
DEFAULT_GTOL = DefaultTolerance(1e-6)

# the bit pattern grad_out holds before the first evaluation: a quiet NaN with a payload no arithmetic
# produces (computed NaNs carry an empty payload), so "still this pattern" means "never written"
_UNWRITTEN = {8: (np.uint64, 0x7FF8_0000_DEAD_BEEF), 4: (np.uint32, 0x7FC0_BEEF)}


def fill_unwritten(G):
    """Fill ``G`` with the never-written pattern (real and imaginary parts of complex entries alike)."""
    real = G.view(real_dtype(G.dtype))
    ut, bits = _UNWRITTEN[real.dtype.itemsize]
    real.view(ut)[...] = bits


def unwritten_gradient(G):
    """``(row, count)`` of the first row of ``G`` with entries still holding the never-written pattern, or
    ``None``: called after every row has evaluated its gradient once."""
    real = G.view(real_dtype(G.dtype))
    ut, bits = _UNWRITTEN[real.dtype.itemsize]
    parts = 2 if G.dtype.kind == "c" else 1  # an element is unwritten if either of its parts is
    left = (real.view(ut) == ut(bits)).reshape(G.shape[0], -1, parts).any(axis=2).sum(axis=1)
    rows = np.nonzero(left)[0]
    return None if rows.size == 0 else (int(rows[0]), int(left[rows[0]]))


def checked_jac(jac, seen):
    """A Python ``jac`` whose first return value other than ``None`` is described in ``seen`` (typically the
    gradient returned instead of written into ``grad_out``: the error after the first call names it)."""
    def checked(x, g, *a):
        r = jac(x, g, *a)
        if r is not None and not seen:
            seen.append(_what(r))
    return checked


def _what(v):
    shape = getattr(v, "shape", ())
    return f"an array of shape {tuple(shape)}" if shape != () else f"{type(v).__name__} {v!r:.60}"


def loss_value(v, name: str = "fun") -> float:
    """The loss a Python objective returned, as a float; a ``TypeError`` naming ``name`` for anything that is
    not one real number (a string, ``None``, an array of more than one element, a complex number)."""
    if isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, bool):
        return float(v)
    shape = getattr(v, "shape", ())
    if v is None or isinstance(v, (str, bytes, bool, complex, np.complexfloating, tuple, list)) or shape != ():
        hint = ("; the gradient goes into grad_out: `def fun(x, grad_out, *args): grad_out[:] = <gradient>; "
                "return <loss>`" if isinstance(v, (tuple, list)) else "")
        raise TypeError(f"{name} must return the loss, one real number; it returned {_what(v)}{hint}")
    try:
        return float(v)  # a 0-d array, a torch or JAX scalar
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must return the loss, one real number; it returned {type(v).__name__} "
                        f"({e})") from None


def checked_loss(fun, name: str = "fun"):
    """``fun`` whose every return value goes through :func:`loss_value` (the Python loop's objective)."""
    def checked(*a):
        return loss_value(fun(*a), name)
    return checked


def is_njit(f) -> bool:
    """Whether ``f`` is an ``@numba.njit`` function."""
    return isinstance(f, CPUDispatcher)


def nonneg(name, v, allow_none=True):
    if v is None and allow_none:
        return -1.0  # disabled: no norm or change is <= -1
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a non-negative number{' or None' if allow_none else ''}, got {v!r}")
    v = float(v)
    if not v >= 0:
        raise ValueError(f"{name}={v!r}; expected a non-negative number{' or None' if allow_none else ''}")
    return v


def count(name, v, low):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    if v < low:
        raise ValueError(f"{name}={v}; expected an integer >= {low}")
    return int(v)


def loss_targets(f_target, B, per_row):
    """``f_target`` as B per-row loss targets (float64; ``-inf``: none): ``None``, one real number, or (with
    ``per_row``, for :func:`minimize_batch`) an array of B numbers. NaN is refused (no loss is ``<=`` NaN:
    a NaN target would silently never stop); ``+inf`` stops every row at its first evaluation."""
    if f_target is None:
        return np.full(B, -np.inf)
    what = f"a real number or an array of {B} per-row targets" if per_row else "a real number"
    if isinstance(f_target, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
        raise TypeError(f"f_target must be {what} (or None), got {f_target!r}")
    if isinstance(f_target, (int, float, np.integer, np.floating)):
        ft = np.full(B, float(f_target))
    else:  # an array (or a 0-d array, a torch or JAX scalar: one number)
        try:
            a = np.asarray(f_target)
        except Exception as e:  # noqa: BLE001 - whatever the object, the error names f_target
            raise TypeError(f"f_target must be {what} (or None), got {type(f_target).__name__} ({e})") from None
        if a.dtype.kind not in "iuf":
            raise TypeError(f"f_target must be {what} (or None), got an array of dtype {a.dtype}")
        if a.ndim and not per_row:
            raise TypeError(f"f_target must be {what} (or None), got an array of shape {a.shape}; one target "
                            "per row is for minimize_batch")
        if a.shape not in ((), (B,)):
            raise ValueError(f"f_target: shape {a.shape} for {B} rows; expected {what}")
        ft = np.array(np.broadcast_to(a.astype(np.float64), (B,)))
    if np.isnan(ft).any():
        r = int(np.argmax(np.isnan(ft)))
        raise ValueError(f"f_target{f'[{r}]' if per_row and np.ndim(f_target) else ''} is NaN; expected a real "
                         "number (-inf or None: no target)")
    return ft


def as_params(x0, where, ndim):
    a = np.asarray(x0)
    if a.dtype.kind in "biu":
        if a.dtype.kind == "b":
            raise TypeError(f"{where}: boolean array; expected real or complex parameters")
        a = a.astype(np.float64)
    elif a.dtype.kind not in "fc":
        raise TypeError(f"{where}: dtype {a.dtype}; expected float32, float64, complex64 or complex128")
    check_param_dtype(a.dtype, where)
    if ndim == 1:
        a = a.reshape(-1)
    elif a.ndim != 2:
        raise ValueError(f"{where}: shape {a.shape}; expected (B, n): one row of parameters per problem")
    if a.size == 0:
        raise ValueError(f"{where}: no parameters (shape {a.shape})")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{where}: contains NaN or inf")
    return np.array(a, dtype=a.dtype, order="C", copy=True).reshape(-1, a.shape[-1])


def schedule_values(s, ts):
    """The values of ``s`` for the steps ``ts`` (a Schedule at t, a function at the count t - 1: the
    convention of :mod:`numbaopt.schedules`, as a rule's own hyperparameters)."""
    return schedule_table(s, ts)


def check_values(decl, owner, values):
    """Every value of a schedule table inside the hyperparameter's domain (before anything runs)."""
    bad = np.isnan(values) if decl.allow_inf else ~np.isfinite(values)
    if decl.low is not None:
        bad |= (values <= decl.low) if decl.low_open else (values < decl.low)
    if decl.high is not None:
        bad |= (values >= decl.high) if decl.high_open else (values > decl.high)
    if bad.any():
        k = int(np.argmax(bad))
        try:
            decl.check(owner, float(values[k]))
        except ValueError as e:
            raise ValueError(f"schedule at step {k + 1}: {e}") from None


def schedule_slots(layout, schedule):
    """[(index in hp, rule index, decl, schedule)] from the rule's own schedules and ``schedule=``."""
    slots = {}
    for k, (r_i, n) in enumerate(layout.hyper_names):
        v = layout.rules[r_i]._values[n]
        if is_schedule(v):
            slots[k] = (r_i, n, v)
    if schedule is not None:
        if not isinstance(schedule, dict):
            schedule = {"lr": schedule}
        valid = sorted({n for _, n in layout.hyper_names})
        for name, s in schedule.items():
            if not callable(s):
                raise TypeError(f"schedule[{name!r}]: expected a Schedule or a function of the step count, got {s!r}")
            ks = [k for k, (_, n) in enumerate(layout.hyper_names) if n == name]
            if not ks:
                raise ValueError(f"schedule: unknown hyperparameter {name!r}; valid: {valid}")
            for k in ks:
                slots[k] = (layout.hyper_names[k][0], name, s)
    return slots


class Problem:
    """Everything the drivers need for B rows of n parameters (validated, nothing written yet)."""

    def __init__(self, fun, X0, rule, jac, args, maxiter, gtol, ftol, schedule, where, per_row_rules,
                 history=True, f_target=None):
        if not callable(fun):
            raise TypeError(f"fun must be callable, got {fun!r}")
        if not isinstance(args, tuple):
            raise TypeError(f"args must be a tuple, got {type(args).__name__}")
        self.maxiter = count("maxiter", maxiter, 0)
        if isinstance(jac, SPSA) and isinstance(gtol, DefaultTolerance):
            gtol = None  # an estimate, not a gradient: see DefaultTolerance
        self.gtol, self.ftol = nonneg("gtol", gtol), nonneg("ftol", ftol)
        X = as_params(X0, where, 1 if not per_row_rules else 2)
        self.X = X
        B, n = X.shape
        self.dtype = X.dtype
        if isinstance(rule, (list, tuple)):
            if not per_row_rules:
                raise TypeError("rule: expected a rule or chain (a list of rules is for minimize_batch)")
            if len(rule) != B:
                raise ValueError(f"rule: {len(rule)} rules for {B} rows; expected one rule or {B}")
            rules = [as_rule(r) for r in rule]
        else:
            rules = [as_rule(rule)]
        for r in rules:
            lay = ChainLayout(r)
            lay.refuse_axes("rule")
            if lay.accum is not None or lay.master is not None:  # counters and copies kept on the host
                raise TypeError(f"rule: {r!r} has a stage (AccumGrad or MixedPrecision); minimize needs a chain "
                                "of elementwise and reduction rules")
        key0 = kernel_key(rules[0])
        for i, r in enumerate(rules[1:], 1):
            if kernel_key(r) != key0:
                raise ValueError(f"rule[{i}]: {r!r} does not share rule types and options with rule[0] "
                                 f"{rules[0]!r}; one compiled kernel serves every row")
        self.spsa = jac if isinstance(jac, SPSA) else None
        if jac is not None and self.spsa is None and not callable(jac):
            raise TypeError(f"jac must be None, a function jac(x, grad_out, *args) or SPSA(...), got {jac!r}")
        if self.spsa is not None and self.dtype.kind == "c":
            raise TypeError(f"SPSA: complex parameters ({self.dtype}) are not supported; use real parameters")
        self.mode = "spsa" if self.spsa is not None else ("jac" if jac is not None else "fg")
        self.fun, self.jac, self.args = fun, (None if self.spsa is not None else jac), args
        leaf = Leaf(rules[0], (B * n,), self.dtype)  # complex support checked here
        self.leaf, self.layout = leaf, leaf.layout
        self.rules = rules
        # hyperparameters: one row shared, or one per row
        HP = np.stack([Leaf(r, (1,), self.dtype).hp for r in rules]) if len(rules) > 1 else leaf.hp[None, :].copy()
        # schedules: tables of values for t = 1..maxiter, validated now
        per = [schedule_slots(ChainLayout(r), schedule) for r in rules]
        ks = sorted(set().union(*[set(p) for p in per]))
        for i, p in enumerate(per):
            if set(p) != set(ks):
                raise ValueError(f"rule[{i}]: schedules must drive the same hyperparameters in every row")
        T = max(self.maxiter, 1)
        rdt = real_dtype(self.dtype)
        TAB = np.zeros((len(per) if ks else 1, len(ks), T), dtype=rdt)
        ts = np.arange(1, T + 1)
        for i, p in enumerate(per):
            for j, k in enumerate(ks):
                r_i, name, s = p[k]
                try:
                    vals = schedule_values(s, ts)
                except Exception as e:  # the user's function: name the hyperparameter it was computing
                    kind = TypeError if isinstance(e, TypeError) else ValueError
                    raise kind(f"schedule for {name!r}: {type(e).__name__}: {e}") from e
                if vals.shape[0] != T:
                    raise ValueError(f"schedule for {name!r}: values(ts) returned {vals.shape[0]} values for "
                                     f"{T} steps")
                decl = rules[i].rules[r_i]._hypers[name]
                check_values(decl, type(rules[i].rules[r_i]).__name__, vals)
                TAB[i, j] = vals
                HP[i if HP.shape[0] > 1 else 0, k] = vals[0]
        if ks and TAB.shape[0] > 1 and HP.shape[0] == 1:
            HP = np.repeat(HP, B, axis=0)
        self.HP, self.TAB = HP, TAB
        self.idx = np.array(ks, dtype=np.int64)
        self.B, self.n = B, n
        self.FT = loss_targets(f_target, B, per_row_rules)
        self.G = np.zeros_like(X)
        if self.spsa is None:  # fun/jac write it: a gradient left unwritten is caught after the first call
            fill_unwritten(self.G)
        self.jac_returned: list = []  # what a jac returned instead of None (the first time), for the error
        if len(rules) > 1:  # initial state may depend on each row's hyperparameters (AdaGrad: eps)
            rows = [Leaf(r, (n,), self.dtype).arrays for r in rules]
            self.S = tuple(np.concatenate([a[k] for a in rows]) for k in range(len(leaf.arrays)))
        else:
            self.S = tuple(leaf.arrays)
        self.I = np.zeros((B, 4), dtype=np.int64)      # it, t, skipped, reason
        self.F = np.zeros((B, 3), dtype=np.float64)    # f, fprev, grad norm
        self.F[:, 1] = np.nan
        # the loss history: (B, maxiter + 1) floats, or one column (overwritten) with history=False
        self.H = np.full((B, self.maxiter + 1 if history else 1), np.nan)
        self.keep = bool(history)
        if self.spsa is not None:
            self.sp = self.spsa.gain_vector()
            self.rng = self.spsa.streams(B)
            self.XP = np.empty_like(X)
            self.D = np.empty((B, n), dtype=np.float64)
        else:
            self.sp = np.zeros(5)
            self.rng = np.zeros(B, dtype=np.uint64)
            self.XP = np.empty((1, 1), dtype=self.dtype)
            self.D = np.empty((1, 1))

    # -- the call -----------------------------------------------------------------------------
    def runs_compiled(self, compiled):
        """Whether the loop runs compiled: ``compiled``, or by default when ``fun`` (and ``jac``) are njit."""
        if compiled is None:
            return is_njit(self.fun) and (self.jac is None or is_njit(self.jac))
        return bool(compiled)

    def runner(self, compiled, threads=1):
        """``advance(nsteps)`` (a :class:`BlockRunner`; ``close()`` it): every running row goes on for up to
        ``nsteps`` iterations, compiled or interpreted, its rows in ``threads`` blocks (one thread each)."""
        if not self.runs_compiled(compiled):
            py = python_driver(self.rules[0], self.dtype, self.mode)
            fun = checked_loss(self.fun)  # a str, None or vector loss is named, not a NumPy error or a NaN
            jac = None if self.jac is None else checked_jac(self.jac, self.jac_returned)  # named in errors
            whole = (self._arrays(), self._tail())
            return BlockRunner(lambda a, nsteps: py(fun, jac, self.args, *a[0], nsteps, *a[1]), [(0, self.B)],
                               [whole], self.I)
        if not is_njit(self.fun) or (self.jac is not None and not is_njit(self.jac)):
            raise TypeError("compiled=True needs fun (and jac) to be @numba.njit functions")
        entry, fun, jac = compiled_entry(getattr(driver_module(self.rules[0], self.dtype), f"run_{self.mode}"), self)
        blocks = row_blocks(self.B, threads)
        whole = (self._arrays(), self._tail())
        block_args = [whole]
        if len(blocks) > 1:
            block_args = [self.block(lo, hi) for lo, hi in blocks]

            def types_of(a):
                return tuple(numba.typeof(v) for v in a[0] + a[1])

            # the entry point unboxes its arguments unchecked: every block must have the batch's types
            if any(types_of(a) != types_of(whole) for a in block_args):
                raise RuntimeError("numbaopt: a block of rows does not have the batch's array types")
        return BlockRunner(lambda a, nsteps: entry(fun, jac, self.args, *a[0], nsteps, *a[1]), blocks, block_args,
                           self.I)

    def block(self, lo, hi):
        """``(arrays, tail)`` of the driver's call for rows ``lo:hi``, as views: every array indexed by row is
        sliced (the rule state is flat, ``n`` entries a row); a shared one (one row of hyperparameters or
        schedules for every row, SPSA's scratch when unused) is passed whole, read-only, except the one
        row of hyperparameters when a schedule drives it: each row writes its own step's values into it
        just before stepping, so each block gets its own copy (sharing it, a block at step 40 could
        overwrite the learning rate a block at step 50 is about to use)."""
        n, B = self.n, self.B

        def rows(a):
            return a[lo:hi] if B > 1 and a.shape[0] == B else a

        X, G, S, HP, TAB, idx, I, F, H = self._arrays()
        maxiter, gtol, ftol, FT, sp, rng, XP, D = self._tail()
        S = tuple(s[lo * n:hi * n] for s in S)
        HP = rows(HP) if HP.shape[0] == B or idx.size == 0 else HP.copy()
        return ((rows(X), rows(G), S, HP, rows(TAB), idx, rows(I), rows(F), rows(H)),
                (maxiter, gtol, ftol, rows(FT), sp, rows(rng), rows(XP), rows(D)))

    def check_gradient_written(self):
        """After the first chunk (every row evaluated once): a ``TypeError`` when ``fun`` (or ``jac``) left
        entries of ``grad_out`` unwritten, instead of a loop that "converges" on a zero gradient at ``x0``
        or stops on a NaN."""
        if self.spsa is not None:
            return
        bad = unwritten_gradient(self.G)
        if bad is None:
            return
        r, k = bad
        who = ("jac(x, grad_out, *args)", "jac") if self.mode == "jac" else ("fun(x, grad_out, *args)", "fun")
        row = f" (row {r})" if self.B > 1 else ""
        fix = ("`def jac(x, grad_out, *args): grad_out[:] = <gradient>`" if self.mode == "jac" else
               "`def fun(x, grad_out, *args): grad_out[:] = <gradient>; return <loss>`, or give fun(x, *args) "
               "-> loss with jac(x, grad_out, *args)")
        ret = f"; it returned {self.jac_returned[0]}" if self.mode == "jac" and self.jac_returned else ""
        raise TypeError(f"{who[0]} did not write the gradient into grad_out: {k} of {self.n} entries were left "
                        f"unwritten at x0{row}{ret}. {who[1]} must fill grad_out in place (returning the gradient "
                        f"does not work): {fix}")

    def _arrays(self):
        return (self.X, self.G, self.S, self.HP, self.TAB, self.idx, self.I, self.F, self.H)

    def _tail(self):
        return (self.maxiter, self.gtol, self.ftol, self.FT, self.sp, self.rng, self.XP, self.D)
