"""``eval_params(state, model)``: the parameters to evaluate a model at, for rules whose evaluation point differs
from the trained parameters (schedule-free learning, parameter averaging).

A rule says how with its ``evaluate(x, <state names>, <hyperparameter names>)`` (NumPy, on whole arrays; see
:class:`numbaopt.ScheduleFree`, :class:`numbaopt.ParamAverage`); a chain without such a member evaluates at its
parameters. Nothing is written: the result is a new model (``model`` itself when no leaf changes).
"""
from __future__ import annotations

import numpy as np

from .backends.cuda import DeviceLeaf, DeviceMember
from .backends.state import Leaf, as_reader
from .rules.base import step_args
from .tree.paths import where
from .tree.state import StateTree, core
from .tree.structure import rebuild, walk_leaves

__all__ = ["eval_params"]


def _evaluator(layout, what: str):
    """The one member of a chain that defines ``evaluate`` (its index), or None."""
    found = [i for i, r in enumerate(layout.rules) if type(r).evaluate is not None]
    if len(found) > 1:
        names = ", ".join(type(layout.rules[i]).__name__ for i in found)
        raise TypeError(f"eval_params: {what}: two members define evaluation parameters ({names}); a chain may "
                        "have one")
    return found[0] if found else None


def _leaf_eval(leaf: Leaf, x, w: str):
    """The evaluation parameters of one leaf for its trained parameter ``x`` (a new array, or ``x``)."""
    r_i = _evaluator(leaf.layout, w)
    if r_i is None:
        return x
    if type(x) is not np.ndarray:
        raise TypeError(f"eval_params: {w}: expected a numpy array, got {type(x).__name__} (evaluation parameters "
                        "are computed for NumPy parameters)")
    if x.shape != leaf.shape or x.dtype != leaf.param_dtype:
        raise ValueError(f"eval_params: {w}: {x.dtype}{list(x.shape)}, but the state was set up for "
                         f"{leaf.param_dtype}{list(leaf.shape)}")
    rule = leaf.layout.rules[r_i]
    f = type(rule).evaluate
    slots = {d.name: k for d, k in leaf.layout.state_slots[r_i] if k is not None}
    t = max(leaf.t, 1)
    args = []
    for n in step_args(f)[1:]:
        if n in slots:
            args.append(leaf.arrays[slots[n]].reshape(leaf.shape))
        elif n in rule._hypers:
            args.append(rule.value_at(n, t))
        else:
            args.append(rule._values[n])
    base = leaf.master.reshape(leaf.shape) if leaf.master is not None else x
    with np.errstate(all="ignore"):  # the rule's arithmetic, as the kernels do it (inf/nan propagate)
        out = np.asarray(f(base, *args)).astype(leaf.dtype, copy=False)
    return out.astype(leaf.param_dtype)  # a new array: the state and the model are untouched


def eval_params(state, model):
    """The model at its evaluation parameters: for each trained leaf whose chain has a member with evaluation
    parameters (``ScheduleFree``: the averaged sequence ``x``; ``ParamAverage``: the average), a new array;
    every other leaf as it is. ``state`` is the state of ``model`` (a tree's or one array's); neither is
    changed. A mismatch of ``model`` and ``state`` is a ``TypeError``/``ValueError`` naming the path."""
    if isinstance(state, (DeviceLeaf, DeviceMember)):
        raise TypeError("eval_params: GPU state; bring it to the host first (state.to_host())")
    if isinstance(state, Leaf):
        return as_reader(state, "eval_params", lambda: _leaf_eval(state, model, "model"))
    if not isinstance(state, StateTree):
        raise TypeError(f"eval_params: expected a state from numbaopt.setup, got {type(state).__name__}")
    c = core(state, "eval_params")
    s = c.structure
    xs = [None] * len(s.paths)
    walk_leaves(s.root, model, "model", xs, False)

    def read():
        new, done = {}, {}
        for p in s.trained_pos:
            u = s.pos_u[p]
            if u not in done:  # a tied array: one result, shared like the array
                leaf = c.leaf(u)
                if isinstance(leaf, (DeviceLeaf, DeviceMember)):
                    raise TypeError(f"eval_params: {where('model', s.paths[p])}: a GPU leaf; bring it to the host")
                done[u] = _leaf_eval(leaf, xs[p], where("model", s.paths[p]))
            if done[u] is not xs[p]:
                new[p] = done[u]
        return rebuild(s.root, model, new, inplace=False) if new else model
    return as_reader(c, "eval_params", read)
