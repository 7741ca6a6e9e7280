"""The operations on a tree's state: the step entry points, ``adjust``/``adjust_``, ``freeze_``/``thaw_``,
copies. Each checks everything before it changes anything."""
from __future__ import annotations

from typing import Any, TypeVar

from ..backends.cuda.group import DeviceGroup
from ..backends.state import Leaf, enter, in_use, leave
from .collect import collect
from .fastpath import FastPlan
from .groups import TreeLeaf
from .state import StateNode, StateTree, core, part
from .step import step_tree

__all__ = ["update_tree", "update_tree_", "freeze_", "thaw_", "copy_state",
           "check_swapped", "not_a_state"]

M = TypeVar("M")
Sub = TypeVar("Sub", bound="StateNode | TreeLeaf")  # a state tree, a part of one, or one of its leaves


def not_a_state(e: TypeError, fname: str, state: Any, model: Any) -> TypeError:
    """The error for a first argument that is no state: optax's order ``update(grads, state, params)``
    (a state second) is named as such."""
    if isinstance(model, (Leaf, StateNode, DeviceGroup)):
        return TypeError(f"{fname}: the first argument is of type {type(state).__name__} and the second a "
                         f"{type(model).__name__}: this is optax's order, update(grads, state, params); numbaopt's "
                         f"is {fname}(state, model, grads)")
    return TypeError(f"{e}; the arguments are {fname}(state, model, grads)")


def swapped_error(fname: str) -> ValueError:
    return ValueError(f"{fname}: the gradients are the parameter arrays this state stepped in place last, and "
                      "the model holds none of them: the model and the gradients look swapped. "
                      f"The order is {fname}(state, model, grads) (optax's is update(grads, state, params)); "
                      "nothing was done")


def check_swapped(model: Any, grads: Any, fname: str, fp: FastPlan) -> None:
    """Refuse ``update_(state, grads, model)``: a ``ValueError`` when the trained leaves of ``grads`` are
    exactly the parameter arrays this state stepped in place last (those of its fast plan ``fp``) and
    ``model`` holds none of them. By identity only: gradients that merely look like the model, or a model
    passed as its own gradient, are never refused; the one call refused besides the swap is stepping another
    model with the last model's own arrays as the gradients (pass copies then).

    Not checked against the model a state was *set up* on: setup binds a state to a structure, not to
    arrays (a template model, then stepping copies of it with the template as the gradient, is correct)."""
    try:
        pl, gl = fp.gather(model, grads)
    except Exception:
        return  # not this model's structure: the step names what is wrong
    arrays = fp.params
    if len(gl) == len(arrays) and all(g is a for g, a in zip(gl, arrays)) \
            and not any(m is a for m, a in zip(pl, arrays)):
        raise swapped_error(fname)


def update_tree_(state: StateTree, model: M, grads: Any) -> tuple[StateTree, M]:
    """In place: see :func:`numbaopt.update_`."""
    try:  # free unless it raises (zero-cost exceptions)
        c = core(state, "update_")
    except TypeError as e:
        raise not_a_state(e, "update_", state, model) from None
    if c.users:  # enter(c) inlined (two calls fewer on the fast path): no call between the test and the store
        raise in_use("update_", state)
    c.users = -1
    try:
        fp = c.fast
        if fp is not None and fp.run(c, model, grads):
            return state, model
        collected = None
        if fp is not None:  # off the fast path (a miss): are the model and the gradients swapped?
            check_swapped(model, grads, "update_", fp)
        else:  # no plan yet (a first step): plan from the leaves and step through it where it applies, so
            # that every step of a plain tree, the first too, takes one path and compiles its helpers once
            collected = collect(c, model, grads)
            fp = FastPlan.build(c, collected[0], collected[1])
            if fp is not None and fp.run(c, model, grads):
                c.fast = fp
                return state, model
        _, out, (xu, iu) = step_tree(c, model, grads, True, collected)
        c.fast = FastPlan.build(c, xu, iu, fp)  # the next step of this model can take the fast path
        return state, out
    finally:
        c.users = 0


def update_tree(state: StateTree, model: M, grads: Any) -> tuple[StateTree, M]:
    """Pure: see :func:`numbaopt.update`."""
    try:
        c = core(state, "update")
    except TypeError as e:
        raise not_a_state(e, "update", state, model) from None
    enter(c, "update", False)
    try:
        fp = c.fast
        if fp is not None:
            check_swapped(model, grads, "update", fp)
        new, out, _ = step_tree(c, model, grads, False)
    finally:
        leave(c, False)
    return StateTree(new), out


def copy_state(state: StateTree) -> StateTree:
    """A deep copy of a state tree (new arenas, counters, frozen flags)."""
    c = core(state, "copy")
    enter(c, "copy", False)
    try:
        return StateTree(c.copy())
    finally:
        leave(c, False)


def _units_of(sub, fname):
    """``(core, units)`` of a state tree, a part of one, or one of its leaves."""
    c, units, _ = part(sub, fname)
    return c, (units if units is not None else sub.units())


def freeze_(sub: Sub) -> Sub:
    """Freeze every leaf of ``sub`` (a state tree, ``state.part`` or a leaf): not updated, state untouched."""
    c, us = _units_of(sub, "freeze_")
    enter(c, "freeze_")
    c.frozen[us] = True
    c.fast = None
    leave(c)
    return sub


def thaw_(sub: Sub) -> Sub:
    """Undo :func:`freeze_` on ``sub``."""
    c, us = _units_of(sub, "thaw_")
    enter(c, "thaw_")
    c.frozen[us] = False
    c.fast = None
    leave(c)
    return sub
