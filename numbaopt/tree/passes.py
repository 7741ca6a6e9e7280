"""The reduction passes of a tree step, run ahead of its commits (see :mod:`.step`): the host runs of a domain
(:func:`phased`: leaf-scope reductions run by run, tree-scope ones over every run holding them) and the device
groups a tree-scope reduction spans (:func:`device_phased`), in the order :func:`numbaopt.tree.scopes.in_order`
gives; :func:`refusal` is the error of a refused step, naming the leaf that caused it."""
from __future__ import annotations

import math

import numpy as np

from ..backends.state import status_error
from ..compiler.layout import ERROR_BASE, reduce_ops
from .scopes import in_order

__all__ = ["refusal", "phased", "device_phased"]


def _columns(run, r) -> tuple:
    """Reducer ``r``'s columns in ``run``'s tables: its first partial, its "contributed" flag, its error final."""
    lay = run.grp.layout
    rule = lay.rules[r]
    c0 = lay.acc_cols[r]
    return c0, c0 + len(reduce_ops(rule)), lay.fin_cols[r] + type(rule).finals.index("error")


def _bad_leaves(run, r, own: bool = False) -> list:
    """The leaves of ``run`` for which reducer ``r`` refuses the step (``own``: whose own contribution is not
    finite: the cause, when a tree-scope refusal flags every leaf)."""
    c0, flag, err = _columns(run, r)
    return [j for j in range(len(run.grp.members)) if run.P[j, flag] != 0.0 and run.F[j, err] != 0.0
            and not (own and all(math.isfinite(v) for v in run.P[j, c0:flag]))]


def refusal(s, run, r) -> ValueError:
    """The error of reduction rule ``r`` refusing ``run``'s step, naming the leaf that caused it."""
    grp = run.grp
    bad = (_bad_leaves(run, r, own=True) if type(grp.layout.rules[r]).scope == "tree" else []) or _bad_leaves(run, r)
    where_ = s.where(grp.members[bad[0]], "grads") if bad else ""
    return status_error(grp.rule, ERROR_BASE + r, where_)


class _Pass:
    """One reducer of one run, with its kernels looked up once: ``partial``, ``combine``, ``put``, ``finish``
    (``finish_leaves``, a leaf-scope one), ``finish_row``, and the columns of its error final (or None)."""

    __slots__ = ("run", "r", "partial", "combine", "put", "finish", "finish_row", "flag", "err", "row_err")

    def __init__(self, run, r):
        mod, rule = run.grp.mod, run.grp.layout.rules[r]
        self.run, self.r = run, r
        self.partial, self.combine = getattr(mod, f"partial_{r}"), getattr(mod, f"combine_{r}")
        self.put, self.finish = getattr(mod, f"put_finals_{r}"), getattr(mod, f"finish_leaves_{r}")
        self.finish_row = getattr(mod, f"finish_row_{r}")
        _, self.flag, self.err = _columns(run, r) if "error" in type(rule).finals else (None, None, None)
        self.row_err = type(rule).finals.index("error") if self.err is not None else None  # in finish_row's row

    def refuses(self) -> bool:
        """Whether a leaf that contributed has the error final set."""
        P, F = self.run.P, self.run.F
        return self.err is not None and bool(np.any((P[:, self.flag] != 0.0) & (F[:, self.err] != 0.0)))


def _alone(s, p: _Pass) -> None:
    """A leaf-scope reduction of one run: partials, finals per leaf, a refusal raised."""
    run = p.run
    p.partial(*run.args(True))
    p.finish(run.P, run.hp, run.F)
    if p.refuses():
        raise refusal(s, run, p.r)


def _together(s, passes, tot0, row) -> None:
    """One tree-scope reduction over ``passes``: the partials of every run, combined in run order (each run's
    module reads its own columns), one ``finish`` (the members agree on what it reads: :mod:`.scopes`), the finals
    put into every run's table; a refusal named after a leaf whose own contribution is not finite, when there is
    one (a tree-scope refusal flags every leaf)."""
    for p in passes:
        p.partial(*p.run.args(True))
    tot = tot0.copy()
    for p in passes:
        p.combine(p.run.P, tot)
    first = passes[0]
    first.finish_row(tot, first.run.hp, row)
    for p in passes:
        p.put(row, p.run.P, p.run.F)
    if first.row_err is not None and row[first.row_err] != 0.0:  # one number says whether to look further
        bad = [p for p in passes if p.refuses()]
        if bad:
            own = [p for p in bad if _bad_leaves(p.run, p.r, own=True)]
            raise refusal(s, (own or bad)[0].run, (own or bad)[0].r)


def phased(s, dom) -> None:
    """The reductions of a domain (:func:`numbaopt.tree.scopes.domains`), in chain order: each run's leaf-scope
    reductions on their own, each tree-scope one once every run holding it has reached it. The order and the
    kernels are found once per domain (a fast plan's domains serve every step)."""
    plan = dom.plan
    if plan is None:
        plan = dom.plan = []
        for step in in_order(dom, [run.grp.layout.reducers for run in dom]):
            if isinstance(step, tuple):
                plan.append((_Pass(dom[step[0]], step[1]),))
                continue
            passes = [_Pass(dom[i], r) for i, r in step]
            lay, r0 = dom[step[0][0]].grp.layout, step[0][1]
            plan.append((passes, lay.totals(r0), np.empty(lay.row_len(r0), dtype=np.float64)))
    for step in plan:
        if len(step) == 1:
            _alone(s, step[0])
        else:
            _together(s, *step)
    for run in dom:
        run.checked = True


def device_phased(dom, prepared) -> None:
    """The reductions of the device groups ``dom`` that a tree-scope reduction spans (``prepared``: each group's
    prepared step, by id), pass by pass in chain order: for a tree-scope one, every group's dry pass, the totals
    combined on the host (in group order), every group's finish from them; then each group's status (a refusal
    raises before anything is written)."""
    for step in in_order(dom, [dg.mod.plan.phases for dg in dom]):
        if isinstance(step, tuple):
            dg, r = dom[step[0]], step[1]
            dg.reduce_pass(prepared[id(dg)], r)
            dg.finish_pass(prepared[id(dg)], r)
            continue
        for i, r in step:
            dom[i].reduce_pass(prepared[id(dom[i])], r)
        ops = reduce_ops(dom[step[0][0]].layout.rules[step[0][1]])
        tot = None
        for i, r in step:
            mine = dom[i].totals(r)
            tot = mine if tot is None else np.array([a + b if op == "sum" else max(a, b)
                                                     for a, b, op in zip(tot, mine, ops)])
        for i, r in step:
            dom[i].set_totals(r, tot)
            dom[i].finish_pass(prepared[id(dom[i])], r)
    for dg in dom:
        dg.reduced(prepared[id(dg)])
