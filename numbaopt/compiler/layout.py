"""Where everything of a chain sits in the generated kernels: hyperparameters, state arrays, reductions.

:class:`ChainLayout` is what the emitters (:mod:`.cpu`, :mod:`.cuda`) generate from and what the backends
and the tree pipeline use to build hyperparameter vectors, state arrays and the reduction tables:

* ``hp``: every member's hyperparameters, in chain order, in the parameters' real precision;
* ``S``: one flat array per active state declaration (``state_decls``), in chain order;
* ``C``: the step counters of a leaf (see :data:`COUNTERS`);
* per reduction rule ``r``: ``acc_cols[r]`` columns of partial accumulators (plus one column saying whether
  the leaf contributed) in ``P``, and ``fin_cols[r]`` columns of finals in ``F`` (both float64).

Stages (:mod:`numbaopt.rules.stages`) change how the chain runs: the members before an ``AccumGrad``
(the *prefix*) run on every gradient and count steps in ``C[TP]``; the members after it run on the mean
every ``n``-th call and count steps in ``C[T]``. A ``MixedPrecision`` first member makes the compute
dtype its master dtype.
"""
from __future__ import annotations

import math

import numpy as np

from ..rules.base import is_scheduled
from .placement import empty_staggered, page_offsets

__all__ = ["ChainLayout", "real_dtype", "reduce_ops", "COUNTERS", "T", "TP", "CNT", "SKIPPED",
           "STEPPED", "SKIP", "ACCUMULATED", "RESET", "ALIASED", "ERROR_BASE"]

_F32_MAX = float(np.finfo(np.float32).max)

#: the rows of a counter array ``C``: steps taken by the members after an AccumGrad (all members when
#: there is none), calls taken by the members before it, gradients in the current accumulation cycle,
#: steps skipped (a rule asked to skip: SkipNonFinite)
COUNTERS = ("t", "tp", "count", "skipped")
T, TP, CNT, SKIPPED = range(4)

#: statuses returned by the single-array kernels (the tree kernels return STEPPED or an error): stepped;
#: skipped (nothing written); accumulated (an AccumGrad call that did not complete its cycle); reset
#: (the cycle completed but a member after the AccumGrad skipped the step); ERROR_BASE + r: reduction
#: rule r refused the step (nothing written); aliased: the gradient overlaps an array the kernel writes
#: (nothing read or written; the caller runs the kernel again on a copy of the gradient)
STEPPED, SKIP, ACCUMULATED, RESET, ALIASED, ERROR_BASE = 0, 1, -1, -2, -3, 2


def real_dtype(dtype) -> np.dtype:
    """The real dtype of the same precision (float32 for complex64)."""
    dtype = np.dtype(dtype)
    return np.dtype(dtype.type(0).real.dtype) if dtype.kind == "c" else dtype


def reduce_ops(rule) -> tuple:
    """The accumulation ops of a reduction rule ("sum" or "max" per contribution)."""
    ops = type(rule).reduce_ops
    return tuple(ops(rule) if callable(ops) else ops)


class ChainLayout:
    """Slots of one chain (a rule or a :class:`numbaopt.Chain`) in the generated kernels."""

    def __init__(self, rule):
        self.rules = tuple(rule.rules)
        self.hyper_slots = []   # per rule: {name: index in hp}
        self.state_slots = []   # per rule: list of (state decl, index in S or None)
        self.hyper_names = []   # flat: (rule index, name)
        self.state_decls = []   # flat: (rule index, state decl)
        k = 0
        for r_i, r in enumerate(self.rules):
            slots = {}
            for n in r._hypers:
                slots[n] = k
                self.hyper_names.append((r_i, n))
                k += 1
            self.hyper_slots.append(slots)
            active = {id(s) for s in r.active_states()}
            ss = []
            for s in r._states.values():
                if id(s) in active:
                    ss.append((s, len(self.state_decls)))
                    self.state_decls.append((r_i, s))
                else:
                    ss.append((s, None))
            self.state_slots.append(ss)
        self.n_hyper = k
        self.n_state = len(self.state_decls)
        stages = [type(r).stage for r in self.rules]
        #: index of the AccumGrad member, or None
        self.accum = stages.index("accumulate") if "accumulate" in stages else None
        #: the master dtype of a MixedPrecision first member, or None
        self.master = self.rules[0].dtype if stages[:1] == ["master"] else None
        self.reducers = [i for i, r in enumerate(self.rules) if getattr(type(r), "reduce", None) is not None]
        self.scheduled = is_scheduled(rule)
        # per hyperparameter: (its rule, its name, whether it counts calls before an AccumGrad), for fill_hyper
        self._hyper_refs = [(self.rules[r_i], n, self.in_prefix(r_i)) for r_i, n in self.hyper_names]
        self.acc_cols, self.fin_cols = {}, {}
        a = f = 0
        for r in self.reducers:
            self.acc_cols[r] = a
            self.fin_cols[r] = f
            a += len(reduce_ops(self.rules[r])) + 1  # + the "contributed" flag
            f += len(type(self.rules[r]).finals)
        self.n_acc, self.n_fin = max(a, 1), max(f, 1)

    # -- the prefix/suffix split of an AccumGrad ------------------------------------------------
    def in_prefix(self, r_i: int) -> bool:
        """Whether member ``r_i`` runs before the AccumGrad (on every call, counting calls in ``tp``)."""
        return self.accum is not None and r_i < self.accum

    def state_part(self, k: int) -> str:
        """``"prefix"``, ``"acc"`` or ``"suffix"``: which part of the chain state array ``k`` belongs to."""
        r_i = self.state_decls[k][0]
        if self.accum is None or r_i > self.accum:
            return "suffix"
        return "acc" if r_i == self.accum else "prefix"

    def compute_dtype(self, param_dtype) -> np.dtype:
        """The dtype the kernels compute in for a parameter of ``param_dtype`` (the master dtype, if any)."""
        return self.master if self.master is not None else np.dtype(param_dtype)

    # -- hyperparameters ------------------------------------------------------------------------
    def hyper_vector(self, t: int = 1, tp: int | None = None, dtype=np.float64) -> np.ndarray:
        """Hyperparameters for step ``t`` (``tp`` for members before an AccumGrad), in the real precision of
        ``dtype`` (so a float32 kernel contains no float64 arithmetic at all)."""
        hp = np.empty(max(self.n_hyper, 1), dtype=real_dtype(dtype))
        self.fill_hyper(hp, t, t if tp is None else tp)
        return hp

    def fill_hyper(self, hp, t: int, tp: int | None = None):
        """Write the hyperparameters for step ``t`` (``tp``) into ``hp``. Schedules are evaluated and checked:
        a value outside its domain is a ``ValueError`` naming the rule, hyperparameter and step, and then
        ``hp`` is left as it was."""
        tp = t if tp is None else tp
        vals = [r.value_at(n, tp if pre else t) for r, n, pre in self._hyper_refs]
        # float32 kernels: a finite value beyond float32 would become inf there (one max in the common case)
        if hp.dtype.itemsize == 4 and vals and max(map(abs, vals)) > _F32_MAX:
            for (r_i, n), v in zip(self.hyper_names, vals):
                if abs(v) > _F32_MAX and math.isfinite(v):
                    raise ValueError(f"{type(self.rules[r_i]).__name__}: hyperparameter {n}={v!r} is beyond float32 "
                                     f"(the parameters' precision, max {_F32_MAX:.4g}); it would be inf there")
        hp[:len(vals)] = vals

    # -- state ----------------------------------------------------------------------------------
    def state_dtypes(self, dtype) -> list:
        """The dtype of each state array for compute dtype ``dtype`` (``real=True`` states stay real)."""
        dtype = np.dtype(dtype)
        return [real_dtype(dtype) if s.real else dtype for _, s in self.state_decls]

    def initial_values(self) -> list:
        """The initial value of each state array (a number, or the value of a hyperparameter at step 1)."""
        out = []
        for r_i, decl in self.state_decls:
            init = decl.init
            if isinstance(init, str):
                init = self.rules[r_i].value_at(init, 1)
            out.append(init)
        return out

    def new_state(self, size: int, dtype, anchor: int = 0) -> tuple:
        """Fresh host state arrays of ``size`` elements for compute dtype ``dtype``, placed at page offsets apart
        from each other and from ``anchor`` (the parameter's; see :mod:`.placement`)."""
        out = []
        offsets = page_offsets(self.n_state, anchor)
        for v, dt, off in zip(self.initial_values(), self.state_dtypes(dtype), offsets):
            a = empty_staggered(size, dt, off)
            a[...] = v
            out.append(a)
        return tuple(out)

    def state_names(self) -> list:
        """State names as ``leaf.state`` shows them (``m``, ``v``; ``name_k`` when two members share one)."""
        names = [d.name for _, d in self.state_decls]
        return [d.name if names.count(d.name) == 1 else f"{d.name}_{r_i}" for r_i, d in self.state_decls]

    # -- reductions -----------------------------------------------------------------------------
    def refusing(self) -> list:
        """The reduction rules that can refuse a step (an ``error`` final)."""
        return [r for r in self.reducers if "error" in type(self.rules[r]).finals]

    def tree_reducers(self) -> list:
        """The reduction rules whose scope is the whole tree."""
        return [r for r in self.reducers if type(self.rules[r]).scope == "tree"]
