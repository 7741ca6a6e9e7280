"""The operations on a tree's state: the step entry points, ``adjust``/``adjust_``, ``freeze_``/``thaw_``,
copies. Each checks everything before it changes anything."""
from __future__ import annotations

from ..backends.cuda.group import DeviceMember
from ..backends.state import adjusted_rule, enter, in_use, leave
from ..compiler import ChainLayout
from .fastpath import FastPlan
from .groups import TreeLeaf
from .state import StateNode, StateTree, core
from .step import step_tree

__all__ = ["update_tree", "update_tree_", "adjust_tree", "adjust_tree_", "freeze_", "thaw_", "copy_state"]


def update_tree_(state, model, grads):
    """In place: see :func:`numbaopt.update_`."""
    c = core(state, "update_")
    if c.users:  # enter(c) inlined (two calls fewer on the fast path): no call between the test and the store
        raise in_use("update_", state)
    c.users = -1
    try:
        fp = c.fast
        if fp is not None and fp.run(c, model, grads):
            return state, model
        _, out, (xu, iu) = step_tree(c, model, grads, True)
        c.fast = FastPlan.build(c, xu, iu, fp)  # the next step of this model can take the fast path
        return state, out
    finally:
        c.users = 0


def update_tree(state, model, grads):
    """Pure: see :func:`numbaopt.update`."""
    c = core(state, "update")
    enter(c, "update", False)
    try:
        new, out, _ = step_tree(c, model, grads, False)
    finally:
        leave(c, False)
    return StateTree(new), out


def _plan_adjust(c, hyper: dict):
    """New rules and hyperparameter vectors for every group (checked), or a ValueError naming the
    problem; nothing is changed here."""
    everything = list(c.groups) + list(c.device_groups)
    valid = {n for g in everything for r in g.rule.rules for n in r._hypers}
    options = {n for g in everything for r in g.rule.rules for n in r._options}
    for n in hyper:
        if n not in valid:
            if n in options:
                raise ValueError(f"{n} is a compile-time option; set up a new state to change it")
            raise ValueError(f"unknown hyperparameter {n!r}; valid: {sorted(valid)}")
    out = []
    for g in everything:
        names = {n for r in g.rule.rules for n in r._hypers}
        kw = {k: v for k, v in hyper.items() if k in names}
        if not kw:
            continue
        rule = adjusted_rule(g.rule, kw)
        hp = ChainLayout(rule).hyper_vector(g.t + 1, g.t + 1, g.dtype)  # a schedule out of its domain raises here
        out.append((g, rule, hp))
    return out


def adjust_tree_(state, **hyper):
    """Change hyperparameters in place (see :func:`numbaopt.adjust_`); never recompiles."""
    c = core(state, "adjust_")
    enter(c, "adjust_")
    try:
        changes = _plan_adjust(c, hyper)
        for g, rule, hp in changes:  # nothing below can fail
            g.set_rule_(rule, hp)
        c.fast = None
    finally:
        leave(c)
    return state


def adjust_tree(state, **hyper):
    """A new state with new hyperparameters; moments and step counts are kept."""
    c = core(state, "adjust")
    _plan_adjust(c, hyper)  # validate before copying
    return adjust_tree_(copy_state(state), **hyper)


def copy_state(state) -> StateTree:
    """A deep copy of a state tree (new arenas, counters, frozen flags)."""
    c = core(state, "copy")
    enter(c, "copy", False)
    try:
        return StateTree(c.copy())
    finally:
        leave(c, False)


def _units_of(sub, fname):
    """``(core, units)`` of a state tree, a part of one, or one of its leaves."""
    if isinstance(sub, TreeLeaf) and sub.core_ref is not None:
        c = sub.core_ref()
        if c is None:
            raise TypeError(f"{fname}: this leaf's state tree is gone")
        return c, [sub.unit]
    if isinstance(sub, StateNode):
        return sub._core, sub.units()
    if isinstance(sub, DeviceMember):
        raise TypeError(f"{fname}: a device leaf is frozen through the container above it (state['gpu'])")
    raise TypeError(f"{fname}: expected a state tree, a part of one (state.layer) or one of its leaves, "
                    f"got {type(sub).__name__}")


def freeze_(sub):
    """Freeze every leaf of ``sub`` (a state tree, ``state.part`` or a leaf): not updated, state untouched."""
    c, us = _units_of(sub, "freeze_")
    enter(c, "freeze_")
    c.frozen[us] = True
    c.fast = None
    leave(c)
    return sub


def thaw_(sub):
    """Undo :func:`freeze_` on ``sub``."""
    c, us = _units_of(sub, "thaw_")
    enter(c, "thaw_")
    c.frozen[us] = False
    c.fast = None
    leave(c)
    return sub
