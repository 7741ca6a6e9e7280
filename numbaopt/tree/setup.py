"""``setup`` over a nested model: find the parameters, tie repeated arrays, group the leaves.

Leaves are grouped by (rule, compute dtype) on the host and by (rule, dtype) on the GPU; each group is
stepped by one kernel call. ``rule`` may be a function ``fn(path, leaf) -> rule or None`` choosing per
leaf (torch's param groups, optax's ``partition``): a tree-scope reduction (a global-norm clip) then spans
every leaf holding the same one at the same place, across groups (:mod:`.scopes`).
"""
from __future__ import annotations

import warnings

import numpy as np

from ..backends.cuda.group import tree_group
from ..backends.state import as_rule, check_param_dtype
from ..compiler import ChainLayout
from ..rules.base import Rule
from ..rules.chain import Chain
from . import scopes
from .groups import Group
from .params import param_info
from .state import Structure, new_state
from .structure import flatten

__all__ = ["setup_tree", "check_scopes"]

def _kind(x) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype} array"
    return "None" if x is None else type(x).__name__


def _nothing_trained(name: str, paths: list, values: list, pos_param: list) -> None:
    """A model in which setup finds nothing to train: a ``ValueError`` saying what it found (an optimiser
    that silently steps nothing is a bug to find, not a result); a warning when parameters are there but the
    user excluded every one of them."""
    n_param = sum(pos_param)
    if n_param:
        leaves = "its parameter leaf is" if n_param == 1 else f"its {n_param} parameter leaves are all"
        warnings.warn(f"setup: no leaf of {name} is trained: {leaves} excluded "
                      "(not_trainable fields, a container's trainable keys, frozen torch Parameters or a rule "
                      "chooser returning None), so every step leaves the model as it is", UserWarning, stacklevel=4)
        return
    if not paths:
        raise ValueError(f"setup: found no trainable parameter in {name}: it holds no leaf at all (an empty "
                         "container)")
    shown = ", ".join(f"model{p} ({_kind(x)})" for p, x in zip(paths[:5], values[:5]))
    more = f", and {len(paths) - 5} more" if len(paths) > 5 else ""
    n = len(paths)
    whole = (f"; numbaopt does not know {name} as a container, so it took the whole model as one leaf"
             if n == 1 and not paths[0] else "")
    raise ValueError(f"setup: found no trainable parameter in {name}: {n} {'leaf' if n == 1 else 'leaves'} carried "
                     f"through unchanged: {shown}{more}{whole}. Parameters are float or complex arrays, tensors "
                     "and scalars. A torch module? A JAX pytree? An object of your own? Register its container "
                     "type with numbaopt.register_container (or its array type with numbaopt.param_info.register)")


def _choose(rule):
    if isinstance(rule, (Rule, Chain)):
        return None, rule
    if callable(rule) and not isinstance(rule, type):
        return rule, None
    return None, as_rule(rule)


def setup_tree(rule, model, what=None):
    """The state of a nested model (see :func:`numbaopt.setup`); ``what`` names the model in messages (default:
    its type's name)."""
    chooser, rule = _choose(rule)
    s = Structure()
    paths, pos_param, pos_rule, values, infos = [], [], [], [], []
    layouts = {}  # by rule object: as_rule and the layout once per distinct rule object

    def layout_of(r):
        got = layouts.get(id(r))
        if got is None:
            got = layouts[id(r)] = (r, as_rule(r), ChainLayout(as_rule(r)))
        return got[1], got[2]

    def on_leaf(path, x, trainable):
        try:
            info = param_info(x)
        except TypeError as e:
            raise TypeError(f"model{path}: {e}") from None
        paths.append(path)
        values.append(x)
        infos.append(info)
        pos_param.append(info is not None)
        r = None
        if info is not None and trainable and info.trainable:  # a frozen torch Parameter: not trained
            if chooser is None:
                r = rule
            else:
                try:
                    r = chooser(path, x)
                except TypeError as e:  # a chain of choosers naming a member that gave no rule: say where
                    raise TypeError(f"model{path}: {e}") from None
            if r is not None:
                try:
                    r, layout = layout_of(r)
                except TypeError as e:
                    raise TypeError(f"model{path}: the rule chooser returned {r!r}: {e}" if chooser is not None
                                    else f"model{path}: {e}") from None
                try:
                    check_param_dtype(info.dtype, "x", layout)
                except TypeError:  # the path is formatted only for the message
                    check_param_dtype(info.dtype, f"model{path}", layout)
                if info.backend not in ("cpu", "cuda"):
                    raise NotImplementedError(f"model{path}: a {info.kind} leaf needs the {info.backend!r} "
                                              "backend, which the tree pipeline does not drive yet")
        pos_rule.append(r)
        return r is not None

    s.root = flatten(model, on_leaf)
    s.paths, s.pos_param = paths, pos_param
    s.pos_u = [None] * len(paths)
    s.trained_pos = [p for p, r in enumerate(pos_rule) if r is not None]
    if not s.trained_pos:
        _nothing_trained(what or type(model).__name__, paths, values, pos_param)
    u_of_id, u_rule, u_backend = {}, [], []
    s.u_shape, s.u_dtype, s.u_kind, s.u_positions, s.u_tieable = [], [], [], [], []
    for p in s.trained_pos:
        x, info, r = values[p], infos[p], pos_rule[p]
        u = u_of_id.get(id(x)) if info.tieable else None
        if u is not None:
            if u_rule[u] != r:
                raise ValueError(f"model{paths[p]}: the same array as model{paths[s.u_positions[u][0]]} (tied), "
                                 f"but the rule chooser gave it {r!r} instead of {u_rule[u]!r}")
            s.u_positions[u].append(p)
            s.pos_u[p] = u
            continue
        u = len(u_rule)
        if info.tieable:
            u_of_id[id(x)] = u
        u_rule.append(r)
        s.pos_u[p] = u
        s.u_positions.append([p])
        s.u_shape.append(tuple(info.shape))
        s.u_dtype.append(np.dtype(info.dtype))
        s.u_kind.append(info.kind)
        s.u_tieable.append(info.tieable)
        u_backend.append(info.backend)
    s.n_unique = len(u_rule)
    s.u_group, s.u_device, s.u_j = [None] * s.n_unique, [None] * s.n_unique, [None] * s.n_unique
    distinct, id_map = [], {}  # rules compared once per distinct object, not hashed per leaf
    host_keys, dev_keys = {}, {}
    for u, r in enumerate(u_rule):
        ri = id_map.get(id(r))
        if ri is None:
            ri = next((i for i, d in enumerate(distinct) if d == r), None)
            if ri is None:
                ri = len(distinct)
                distinct.append(r)
            id_map[id(r)] = ri
        if u_backend[u] == "cuda":  # device leaves: one DeviceGroup per (rule, dtype), one launch each
            dev_keys.setdefault((ri, s.u_dtype[u]), []).append(u)
        else:
            compute = layout_of(r)[1].compute_dtype(s.u_dtype[u])
            host_keys.setdefault((ri, compute), []).append(u)
    device_groups = []
    for (ri, _), members in dev_keys.items():
        ps = [s.u_positions[u][0] for u in members]
        device_groups.append(tree_group(distinct[ri], [values[p] for p in ps], [f"model{paths[p]}" for p in ps]))
        for j, u in enumerate(members):
            s.u_device[u], s.u_j[u] = len(device_groups) - 1, j
    groups = []
    for (ri, compute), members in host_keys.items():
        masters = []
        for u in members:
            p = s.u_positions[u][0]
            if s.u_dtype[u] != compute:  # MixedPrecision: the master copy, from the parameter's values
                masters.append(np.array(infos[p].to_array(values[p]), dtype=compute).reshape(-1))
            else:
                masters.append(None)
        try:
            grp = Group(distinct[ri], compute, members, [s.u_shape[u] for u in members],
                        [s.u_dtype[u] for u in members], masters)
        except TypeError as e:
            raise TypeError(f"{s.where(members[0])}: {e}") from None
        for j, u in enumerate(members):
            s.u_group[u], s.u_j[u] = len(groups), j
        groups.append(grp)
    s.u_compute = [None if s.u_group[u] is None else groups[s.u_group[u]].dtype for u in range(s.n_unique)]
    check_scopes(s, groups, device_groups)
    return new_state(s, groups, device_groups)


def check_scopes(s, groups, device_groups) -> None:
    """The scope rule of tree-scope reductions over a state's groups (:func:`numbaopt.tree.scopes.check`)."""
    first_dev = {}
    for u in range(s.n_unique):
        if s.u_device[u] is not None:
            first_dev.setdefault(s.u_device[u], u)
    planned = [scopes.Planned(g.rule, g.layout, g.members[0], False) for g in groups]
    planned += [scopes.Planned(g.rule, g.layout, first_dev[i], True) for i, g in enumerate(device_groups)]
    scopes.check(planned, s.where)
