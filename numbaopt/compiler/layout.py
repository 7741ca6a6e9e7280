"""Where everything of a chain sits in the generated kernels: hyperparameters, state arrays, reductions.

:class:`ChainLayout` is what the emitters (:mod:`.cpu`, :mod:`.cuda`) generate from and what the backends
and the tree pipeline use to build hyperparameter vectors, state arrays and the reduction tables:

* ``hp``: every member's hyperparameters, in chain order, in the parameters' real precision;
* ``S``: one flat array per active state declaration (``state_decls``), in chain order;
* ``C``: the step counters of a leaf (see :data:`COUNTERS`);
* per reduction rule ``r``: ``acc_cols[r]`` columns of partial accumulators (plus one column saying whether
  the leaf contributed, then the leaf's scalar states) in ``P``, and ``fin_cols[r]`` columns of finals (then
  the new scalar states) in ``F`` (both float64);
* unit states: per-unit state of axis reductions and the scalar states of reductions (one unit per leaf), in
  arenas whose offsets the leaf's geometry row gives.

Stages (:mod:`numbaopt.rules.stages`) change how the chain runs: the members before an ``AccumGrad``
(the *prefix*) run on every gradient and count steps in ``C[TP]``; the members after it run on the mean
every ``n``-th call and count steps in ``C[T]``. A ``MixedPrecision`` first member makes the compute
dtype its master dtype.
"""
from __future__ import annotations

import math

import numpy as np

from ..rules.base import SCALAR, is_scheduled, step_args
from .placement import empty_staggered, page_offsets

__all__ = ["ChainLayout", "real_dtype", "reduce_ops", "GEO", "COUNTERS", "T", "TP", "CNT", "SKIPPED",
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


#: ints per axis member in a geometry row: P, A, Q, B, S, active
GEO = 6


def _cuts(rule, shape):
    """``rule.geometry`` for a leaf of ``shape``, called with the options it names."""
    g = type(rule).geometry
    return g(shape, *[rule._values[n] for n in step_args(g)[1:]])


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
        self.state_decls = []   # flat: (rule index, state decl), the per-element states
        self.unit_decls = []    # flat: (rule index, state decl), the per-unit states of axis reductions
        self.unit_slots = []    # per rule: {axis: [index in unit_decls, ...]}
        k = 0
        for r_i, r in enumerate(self.rules):
            slots = {}
            for n in r._hypers:
                slots[n] = k
                self.hyper_names.append((r_i, n))
                k += 1
            self.hyper_slots.append(slots)
            active = {id(s) for s in r.active_states()}
            ss, us = [], {}
            for s in r._states.values():
                if s.axis is not None:
                    us.setdefault(s.axis, []).append(len(self.unit_decls))
                    self.unit_decls.append((r_i, s))
                    continue
                if id(s) in active:
                    ss.append((s, len(self.state_decls)))
                    self.state_decls.append((r_i, s))
                else:
                    ss.append((s, None))
            self.state_slots.append(ss)
            self.unit_slots.append(us)
        self.n_hyper = k
        self.n_state = len(self.state_decls)
        self.n_unit = len(self.unit_decls)
        #: whether a leaf's state carries unit arrays and a geometry row (axis members or scalar states)
        self.units = bool(self.n_unit) or any(type(r).axes for r in self.rules)
        #: the axis-reduction members, and the layout of a geometry row (see :meth:`geometry_rows`)
        self.axis_rules = [i for i, r in enumerate(self.rules) if type(r).axes]
        self.geo_len = GEO * len(self.axis_rules) + 2 * self.n_unit
        #: a pure step runs the in-place kernels on copies of the parameters and the state (axis members): their
        #: out-of-place kernels would compile for as long again (seconds a chain) for a pass that is not
        #: memory-bound (per-unit reductions, state of rows + columns), so the copies cost little; in place and
        #: pure then agree bit for bit by construction
        self.pure_by_copy = bool(self.axis_rules)
        stages = [type(r).stage for r in self.rules]
        #: index of the AccumGrad member, or None
        self.accum = stages.index("accumulate") if "accumulate" in stages else None
        #: the master dtype of a MixedPrecision first member, or None
        self.master = self.rules[0].dtype if stages[:1] == ["master"] else None
        self.reducers = [i for i, r in enumerate(self.rules)
                         if getattr(type(r), "reduce", None) is not None and not type(r).axes]
        if self.units and self.accum is not None:  # after it: stepped on the cycle's mean, like any member
            before = [r for r in self.rules[:self.accum] if type(r).axes or any(d.axis for d in r._states.values())]
            if before:
                raise TypeError(f"{type(before[0]).__name__} (a reduction with per-unit or scalar state) cannot come "
                                "before an AccumGrad (it would run on every gradient of the cycle); put it after")
        self.scheduled = is_scheduled(rule)
        # per hyperparameter: (its rule, its name, whether it counts calls before an AccumGrad), for fill_hyper
        self._hyper_refs = [(self.rules[r_i], n, self.in_prefix(r_i)) for r_i, n in self.hyper_names]
        self.acc_cols, self.fin_cols = {}, {}
        a = f = 0
        for r in self.reducers:
            self.acc_cols[r] = a
            self.fin_cols[r] = f
            a += len(reduce_ops(self.rules[r])) + 1 + self.n_scalar(r)  # + the "contributed" flag, the states
            f += len(type(self.rules[r]).finals) + self.n_scalar(r)
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

    # -- axis reductions: unit states and geometry ------------------------------------------------
    def refuse_axes(self, where: str, scalar: bool = True, axes: bool = True) -> None:
        """A ``TypeError`` for a path that has no axis reductions (nor, with ``scalar``, scalar states) yet
        (``where`` names it); with ``axes=False`` only matrix rules are refused (the CUDA backend)."""
        matrix = [r for r in self.axis_rules if type(self.rules[r]).matrix is not None]
        if matrix and not axes:
            names = ", ".join(type(self.rules[r]).__name__ for r in matrix)
            raise TypeError(f"{where}: {names} (a matrix rule) runs on the CPU through numbaopt.update/update_ "
                            "only, not on the GPU yet")
        if self.axis_rules and axes:
            names = ", ".join(type(self.rules[r]).__name__ for r in self.axis_rules)
            raise TypeError(f"{where}: {names} (an axis reduction, per row/column of each leaf) runs on the CPU "
                            "through numbaopt.update/update_ only, not here yet")
        scalar = [type(self.rules[r]).__name__ for r in range(len(self.rules)) if scalar and self.n_scalar(r)]
        if scalar:
            raise TypeError(f"{where}: {', '.join(scalar)} (a reduction with scalar state, e.g. a tree-wide "
                            "learning-rate estimate) runs on the CPU through numbaopt.update/update_ only, "
                            "not here yet")

    def unit_arrays(self, arrays) -> tuple:
        """The unit arrays among a leaf's (or a group's) state ``arrays``: after the element states, before the
        geometry table."""
        return tuple(arrays[self.n_state:self.n_state + self.n_unit])

    def scalar_units(self, r: int) -> list:
        """The unit-state indices of member r's scalar states (``state(scalar=True)``), in declaration order."""
        return self.unit_slots[r].get(SCALAR, [])

    def scalar_names(self, r: int) -> list:
        """The names of member r's scalar states."""
        return [self.unit_decls[u][1].name for u in self.scalar_units(r)]

    def n_scalar(self, r: int) -> int:
        """The number of scalar states of member r."""
        return len(self.scalar_units(r))

    def totals(self, r: int) -> np.ndarray:
        """A fresh combined-totals vector of tree-scope reduction r, as ``combine_r`` fills it: each op's
        identity, then (with scalar states) the first contributing leaf's states and a flag saying they are set."""
        ops = reduce_ops(self.rules[r])
        ns = self.n_scalar(r)
        tot = np.zeros(len(ops) + ns + (1 if ns else 0), dtype=np.float64)
        tot[:len(ops)] = [0.0 if op == "sum" else -np.inf for op in ops]
        return tot

    def row_len(self, r: int) -> int:
        """The length of reduction r's finals row (``finish_row_r``): its finals, then its new scalar states."""
        return len(type(self.rules[r]).finals) + self.n_scalar(r)

    @property
    def n_arrays(self) -> int:
        """The arrays a leaf's state passes to the kernels: element states, unit states, the geometry row."""
        return self.n_state + self.n_unit + (1 if self.units else 0)

    def geometry(self, shape) -> list:
        """Per axis member: ``(P, A, Q, B, S, active)`` for a leaf of ``shape`` (``active`` 0 when its geometry
        leaves the leaf out: then the view is ``(1, n, 1, 1, 1)`` and every element maps to unit 0)."""
        shape = tuple(int(n) for n in shape)
        size = int(np.prod(shape, dtype=np.int64))
        out = []
        for r_i in self.axis_rules:
            rule = self.rules[r_i]
            cls = type(rule)
            cuts = _cuts(rule, shape)
            if cuts is None:
                if cls.matrix is not None:
                    hint = getattr(cls, "fallback_hint", "a rule chooser")
                    raise ValueError(f"{cls.__name__} steps matrices; a parameter of shape {shape} is not one "
                                     f"(give other leaves another rule: {hint})")
                out.append((1, size, 1, 1, 1, 0))
                continue
            c = [int(v) for v in cuts]
            if len(c) != 4 or not 0 <= c[0] <= c[1] <= c[2] <= c[3] <= len(shape):
                raise ValueError(f"{cls.__name__}.geometry({shape}) = {cuts!r}; expected cut points "
                                 f"0 <= c0 <= c1 <= c2 <= c3 <= {len(shape)} (or None)")
            bounds = [0, *c, len(shape)]
            dims = [int(np.prod(shape[bounds[k]:bounds[k + 1]], dtype=np.int64)) for k in range(5)]
            if cls.matrix is not None and dims[0] * dims[2] * dims[4] != 1:
                raise ValueError(f"{cls.__name__}.geometry({shape}) = {cuts!r}: a matrix rule views a leaf as one "
                                 "matrix (the P, Q and S groups empty)")
            out.append((*dims, 1))
        return out

    @staticmethod
    def units_of(geo, axis: str) -> int:
        """The number of units of ``axis`` in a leaf of geometry ``geo`` = ``(P, A, Q, B, S, active)`` (one
        unit, of no elements, when the geometry leaves the leaf out; every element its own for ``elements``)."""
        P, A, Q, B, S, act = (int(v) for v in geo)
        if not act:
            return 1
        return {"rows": P * A * Q * S, "cols": P * Q * B * S, "batch": P * Q * S,
                "elements": P * A * Q * B * S}[axis]

    @property
    def axis_slots(self) -> list:
        """``(member, axis)`` for every axis of every axis member, in chain order: the per-unit tables of a
        backend that keeps them across kernels (the CUDA one), one per slot."""
        return [(r, a) for r in self.axis_rules for a in type(self.rules[r]).axes]

    def unit_sizes(self, shape) -> list:
        """The number of values of each unit state for a leaf of ``shape``."""
        geos = self.geometry(shape)
        out = []
        for r_i, d in self.unit_decls:
            if d.axis == SCALAR:
                out.append(1)
                continue
            out.append(self.units_of(geos[self.axis_rules.index(r_i)], d.axis))
        return out

    def unit_span(self, geo, j: int, u: int) -> tuple:
        """``(start, stop)`` of leaf j's values of unit state u in its arena, read from the geometry table ``geo``
        (:meth:`new_units`)."""
        col = GEO * len(self.axis_rules) + 2 * u
        start = int(geo[j, col])
        return start, start + int(geo[j, col + 1])

    def unit_shapes(self, shape) -> list:
        """The shape of each unit state for a leaf of ``shape`` (the leaf's shape without the summed axes)."""
        out = []
        for (r_i, d), size in zip(self.unit_decls, self.unit_sizes(shape)):
            if d.axis == SCALAR:
                out.append(())
                continue
            cuts = _cuts(self.rules[r_i], tuple(shape))
            if cuts is None:
                out.append((size,))
                continue
            c0, c1, c2, c3 = cuts
            keep = {"rows": [*range(c2), *range(c3, len(shape))],
                    "cols": [*range(c0), *range(c1, len(shape))],
                    "batch": [*range(c0), *range(c1, c2), *range(c3, len(shape))]}[d.axis]
            out.append(tuple(shape[k] for k in keep))
        return out

    def new_units(self, shapes, dtype) -> tuple:
        """Unit-state arenas and the geometry table for leaves of ``shapes`` (one row each: the geometry of each
        axis member, then per unit state its offset in its arena and its size); ``()`` without axis members."""
        if not self.units:
            return ()
        G = np.zeros((len(shapes), max(self.geo_len, 1)), dtype=np.int64)
        totals = [0] * self.n_unit
        for j, shape in enumerate(shapes):
            for q, geo in enumerate(self.geometry(shape)):
                G[j, GEO * q:GEO * (q + 1)] = geo
            base = GEO * len(self.axis_rules)
            for u, size in enumerate(self.unit_sizes(shape)):
                G[j, base + 2 * u] = totals[u]
                G[j, base + 2 * u + 1] = size
                totals[u] += size
        dtypes = [real_dtype(dtype) if d.real else np.dtype(dtype) for _, d in self.unit_decls]
        out = []
        for (r_i, d), total, dt in zip(self.unit_decls, totals, dtypes):
            init = d.init if not isinstance(d.init, str) else self.rules[r_i].value_at(d.init, 1)
            out.append(np.full(total, init, dtype=dt))
        return (*out, G)

    def saved_names(self) -> list:
        """The names of the arrays a checkpoint holds for a leaf: the element states, then the unit states."""
        return self.state_names() + self.unit_names()

    def saved_shapes(self, shape) -> list:
        """Their shapes for a leaf of ``shape``."""
        return [tuple(shape)] * self.n_state + self.unit_shapes(shape)

    def saved_dtypes(self, dtype) -> list:
        """Their dtypes for compute dtype ``dtype``."""
        dtype = np.dtype(dtype)
        return self.state_dtypes(dtype) + [real_dtype(dtype) if d.real else dtype for _, d in self.unit_decls]

    def unit_names(self) -> list:
        """Unit-state names as ``leaf.state`` shows them (``name_k`` when two members share one)."""
        names = [d.name for _, d in self.state_decls] + [d.name for _, d in self.unit_decls]
        return [d.name if names.count(d.name) == 1 else f"{d.name}_{r_i}" for r_i, d in self.unit_decls]

    # -- reductions -----------------------------------------------------------------------------
    def refusing(self) -> list:
        """The reduction rules that can refuse a step (an ``error`` final)."""
        return [r for r in self.reducers if "error" in type(self.rules[r]).finals]

    def tree_reducers(self) -> list:
        """The reduction rules whose scope is the whole tree."""
        return [r for r in self.reducers if type(self.rules[r]).scope == "tree"]
