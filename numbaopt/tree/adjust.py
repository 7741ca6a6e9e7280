"""``adjust`` / ``adjust_`` of a state tree or of a part of it: new hyperparameters for some leaves.

The part is the whole state, a container of it (``state["enc"]``, Optimisers.jl's ``adjust!(tree.layers[3],
0.04)``, torch's ``optimizer.param_groups[i]["lr"] = ...``) or one of its leaves. A group (leaves sharing a rule
and a compute dtype, one kernel call) that lies wholly inside the part gets the new rule; a group cut by the part
is split in two groups, the part's leaves with their state moved into a group of the new rule. The kernels are
those of the same chain (an ``adjust`` changes no option), so nothing recompiles; moments, step counts, master
copies and unit states are kept. The scope of every tree-scope reduction must stay what it was
(:mod:`.scopes`): adjusting, say, a global clip's ``max_norm`` on part of the tree only is refused.

Everything is checked (names, domains, a schedule's value at the current step, the scopes) before anything
changes. Leaf views taken before a split (``state["enc"].w``) keep the state they showed: take them again.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from ..backends.cuda.group import DeviceGroup
from ..backends.state import adjusted_rule, enter, leave
from ..compiler import ChainLayout
from . import scopes
from .state import StateTree, Structure, part

__all__ = ["adjust_tree_", "adjust_tree"]


class _Change(NamedTuple):
    """One group's change: ``js`` (its leaves in the part; all of them, or a split), ``members`` (its units),
    the new ``rule`` and its hyperparameters ``hp``."""

    device: bool
    index: int
    group: Any
    js: list
    members: list
    rule: Any
    hp: Any

    @property
    def whole(self) -> bool:
        return len(self.js) == len(self.members)


def _device_members(s, di) -> list:
    """The units of device group ``di``, in its order."""
    return sorted((u for u in range(s.n_unique) if s.u_device[u] == di), key=lambda u: s.u_j[u])


def _parts(c, units) -> list:
    """``[(device?, index, group, [j in the group inside the part], members)]`` for every group the part meets."""
    s = c.structure
    sel = None if units is None else set(units)
    out = []
    for gi, g in enumerate(c.groups):
        js = [j for j, u in enumerate(g.members) if sel is None or u in sel]
        if js:
            out.append((False, gi, g, js, list(g.members)))
    for di, dg in enumerate(c.device_groups):
        members = _device_members(s, di)
        js = [j for j, u in enumerate(members) if sel is None or u in sel]
        if js:
            out.append((True, di, dg, js, members))
    return out


def _plan(c, units, hyper: dict, name: str) -> list:
    """The groups to change (:class:`_Change`: all of their leaves, or a split); raises before anything
    changes."""
    parts = _parts(c, units)
    if not parts:
        raise ValueError(f"{name} holds no trained leaf: nothing to adjust")
    valid = {n for p in parts for r in p[2].rule.rules for n in r._hypers}
    options = {n for p in parts for r in p[2].rule.rules for n in r._options}
    for n in hyper:
        if n not in valid:
            if n in options:
                raise ValueError(f"{n} is a compile-time option; set up a new state to change it")
            raise ValueError(f"unknown hyperparameter {n!r}" + ("" if units is None else f" in {name}")
                             + f"; valid: {sorted(valid)}")
    out = []
    for dev, i, g, js, members in parts:
        names = {n for r in g.rule.rules for n in r._hypers}
        kw = {k: v for k, v in hyper.items() if k in names}
        if not kw:
            continue
        rule = adjusted_rule(g.rule, kw)
        t = int((g.ts if dev else g.C[0])[js].max())  # a schedule out of its domain raises here
        out.append(_Change(dev, i, g, js, members, rule, ChainLayout(rule).hyper_vector(t + 1, t + 1, g.dtype)))
    _check_scopes(c, out)
    return out


def _check_scopes(c, plan) -> None:
    """The scopes after the plan, checked as setup checks them (a split must not cut a tree reduction)."""
    changed = {(ch.device, ch.index): ch for ch in plan}
    planned = []
    for dev, groups in ((False, c.groups), (True, c.device_groups)):
        for i, g in enumerate(groups):
            members = _device_members(c.structure, i) if dev else g.members
            got = changed.get((dev, i))
            if got is None:
                planned.append(scopes.Planned(g.rule, g.layout, members[0], dev))
                continue
            planned.append(scopes.Planned(got.rule, ChainLayout(got.rule), members[got.js[0]], dev))
            rest = [u for j, u in enumerate(members) if j not in set(got.js)]
            if rest:
                planned.append(scopes.Planned(g.rule, g.layout, rest[0], dev))
    try:
        scopes.check(planned, c.structure.where)
    except (ValueError, NotImplementedError) as e:
        raise type(e)(f"adjusting part of the tree would change which leaves a tree-scope reduction spans: {e}") \
            from None


def _split_device(dg, js, rule, hp) -> tuple:
    """A device group cut in two: (the leaves outside ``js``, under its rule; those inside, under ``rule``)."""
    host = dg.to_host()
    inside = set(js)
    rest = DeviceGroup.from_host([lf for j, lf in enumerate(host) if j not in inside])
    new = DeviceGroup.from_host([host[j] for j in js])
    new.set_rule_(rule, hp)
    return rest, new


def _commit(c, plan) -> None:
    """Carry out a checked plan on the core ``c`` (nothing below raises on checked input)."""
    splits = [ch for ch in plan if not ch.whole]
    for ch in plan:
        if ch.whole:
            ch.group.set_rule_(ch.rule, ch.hp)
    if not splits:
        c.fast = None
        return
    s = c.structure
    groups, device_groups = list(c.groups), list(c.device_groups)
    dev_members = [_device_members(s, di) for di in range(len(device_groups))]
    for ch in splits:
        inside, g = set(ch.js), ch.group
        rest = [j for j in range(len(ch.members)) if j not in inside]
        if ch.device:
            device_groups[ch.index], new = _split_device(g, ch.js, ch.rule, ch.hp)
            device_groups.append(new)
            dev_members[ch.index] = [ch.members[j] for j in rest]
            dev_members.append([ch.members[j] for j in ch.js])
        else:
            groups[ch.index] = g.subset(rest, g.rule, g.hp)
            groups.append(g.subset(ch.js, ch.rule, ch.hp))
    c.structure = _regrouped(s, groups, dev_members)
    c.groups, c.device_groups = groups, device_groups
    c.fast, c.spans = None, None
    c.leafcache.clear()


def _regrouped(s: Structure, groups, dev_members) -> Structure:
    """A copy of the structure ``s`` (shared by the states derived from one setup: never written) with the
    leaves in ``groups`` (host) and in device groups of ``dev_members`` (their units, in order)."""
    new = Structure.__new__(Structure)
    for k in Structure.__slots__:
        if hasattr(s, k):
            setattr(new, k, getattr(s, k))
    new.u_group, new.u_j, new.u_device = list(s.u_group), list(s.u_j), list(s.u_device)
    for gi, g in enumerate(groups):
        for j, u in enumerate(g.members):
            new.u_group[u], new.u_j[u] = gi, j
    for di, members in enumerate(dev_members):
        for j, u in enumerate(members):
            new.u_device[u], new.u_j[u] = di, j
    new.u_compute = [None if new.u_group[u] is None else groups[new.u_group[u]].dtype for u in range(s.n_unique)]
    return new


def adjust_tree_(sub, **hyper: Any):
    """Change hyperparameters in place (see :func:`numbaopt.adjust_`) of a state tree, a part of it or one of its
    leaves; returns ``sub``. Never recompiles."""
    c, units, name = part(sub, "adjust_")
    enter(c, "adjust_")
    try:
        _commit(c, _plan(c, units, hyper, name))
    finally:
        leave(c)
    return sub


def adjust_tree(sub, **hyper: Any) -> StateTree:
    """A new state tree with new hyperparameters for ``sub`` (the state tree, a part of it or one of its leaves):
    the whole tree, that part adjusted; moments and step counts are kept, ``sub``'s tree is unchanged."""
    c, units, name = part(sub, "adjust")
    enter(c, "adjust", False)
    try:
        _plan(c, units, hyper, name)  # validate before copying
        new = c.copy()
    finally:
        leave(c, False)
    _commit(new, _plan(new, units, hyper, name))
    return StateTree(new)
