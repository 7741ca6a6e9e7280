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

__all__ = ["refusal", "phased", "DeviceRun", "device_phased"]


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


def _leaf_phase(s, run, r) -> None:
    """Leaf-scope reduction ``r`` of one run: partials, finals per leaf, a refusal raised."""
    mod = run.grp.mod
    getattr(mod, f"partial_{r}")(*run.args(True))
    getattr(mod, f"finish_leaves_{r}")(run.P, run.hp, run.F)
    _raise_refusal(s, [(run, r)])


def _tree_phase(s, members) -> None:
    """One tree-scope reduction over ``members`` = [(run, member index)]: the partials of every run, combined
    in run order (each run's module reads its own columns), one ``finish`` (the members agree on what it
    reads: :mod:`.scopes`), the finals put into every run's table."""
    for run, r in members:
        getattr(run.grp.mod, f"partial_{r}")(*run.args(True))
    run0, r0 = members[0]
    lay0 = run0.grp.layout
    tot = lay0.totals(r0)
    for run, r in members:
        getattr(run.grp.mod, f"combine_{r}")(run.P, tot)
    row = np.empty(lay0.row_len(r0), dtype=np.float64)
    getattr(run0.grp.mod, f"finish_row_{r0}")(tot, run0.hp, row)
    for run, r in members:
        getattr(run.grp.mod, f"put_finals_{r}")(row, run.P, run.F)
    _raise_refusal(s, members)


def _raise_refusal(s, members) -> None:
    """Raise the refusal of a reduction over ``members`` = [(run, member index)], if it refuses: named after a
    leaf whose own contribution is not finite when there is one (a tree-scope refusal flags every leaf)."""
    run0, r0 = members[0]
    if "error" not in type(run0.grp.layout.rules[r0]).finals:
        return
    bad = [(run, r) for run, r in members if _bad_leaves(run, r)]
    if bad:
        own = [(run, r) for run, r in bad if _bad_leaves(run, r, own=True)]
        raise refusal(s, *(own or bad)[0])


def phased(s, dom) -> None:
    """The reductions of a domain (:func:`numbaopt.tree.scopes.domains`), in chain order: each run's leaf-scope
    reductions on their own, each tree-scope one once every run holding it has reached it."""
    in_order(dom, [run.grp.layout.reducers for run in dom], lambda i, r: _leaf_phase(s, dom[i], r),
             lambda held: _tree_phase(s, [(dom[i], r) for i, r in held]))
    for run in dom:
        run.checked = True


class DeviceRun:
    """A device group as :func:`numbaopt.tree.scopes.domains` takes runs."""

    __slots__ = ("grp",)

    def __init__(self, grp):
        self.grp = grp


def device_phased(dom, prepared) -> None:
    """The reductions of device groups that a tree-scope reduction spans, pass by pass in chain order: for a
    tree-scope one, every group's dry pass, the totals combined on the host (in group order), every group's finish
    from them; then each group's status (a refusal raises before anything is written)."""
    def alone(i, r):
        dg = dom[i].grp
        dg.reduce_pass(prepared[id(dg)], r)
        dg.finish_pass(prepared[id(dg)], r)

    def together(held):
        for i, r in held:
            dom[i].grp.reduce_pass(prepared[id(dom[i].grp)], r)
        ops = reduce_ops(dom[held[0][0]].grp.layout.rules[held[0][1]])
        tot = None
        for i, r in held:
            mine = dom[i].grp.totals(r)
            tot = mine if tot is None else np.array([a + b if op == "sum" else max(a, b)
                                                     for a, b, op in zip(tot, mine, ops)])
        for i, r in held:
            dom[i].grp.set_totals(r, tot)
            dom[i].grp.finish_pass(prepared[id(dom[i].grp)], r)

    in_order(dom, [run.grp.mod.plan.phases for run in dom], alone, together)
    for run in dom:
        run.grp.reduced(prepared[id(run.grp)])
