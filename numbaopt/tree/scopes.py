"""Which leaves a tree-scope reduction spans: the scope rule of parameter groups.

A tree-scope reduction (``ClipGlobalNorm``, ``NormalizeByUpdateNorm``, ``NonFiniteGuard``, the estimates of
``DAdaptAdamW`` and ``Prodigy``, a rule of yours with ``scope = "tree"``) spans every leaf whose chain holds
*the same reduction at the same place*, whatever else differs between the leaves' chains:

* **the same reduction**: the same class and options, the same ``span`` name, and the same values of the
  hyperparameters its shared part reads: its ``finish`` and the first values of its scalar state
  (``ClipGlobalNorm``'s ``max_norm``; ``Prodigy``'s ``beta2``, ``beta3``, ``d_coef`` and ``d0``). Its other
  hyperparameters may differ per leaf: each leaf's contribution is computed with its own (``Prodigy``'s
  ``lr`` and ``weight_decay`` per parameter group, one estimate, as torch's param groups have it);
* **at the same place**: after stateful members (moments, ``AccumGrad``) of the same kinds. Stateless members
  before it (weight decay, scaling, a mask, a guard) and every member after it may differ.

Leaves holding reductions of one class and span name that are not all the same reductions at the same places
are refused at setup (a ``ValueError`` naming two leaves and their members): a global norm is never silently
one norm per group. ``span="name"`` separates scopes on purpose (``ClipGlobalNorm(1.0, span="enc")``).

:func:`check` is setup's check; :func:`domains` links the runs of a step that reduce together.
"""
from __future__ import annotations

from ..compiler import chain_key
from ..compiler.cache import rule_key
from ..rules.base import SCALAR, step_args

__all__ = ["ScopeKey", "scope_keys", "Planned", "check", "domains", "Domain", "in_order"]


def _stateful(rule) -> bool:
    """Whether a member changes what reaches later members through state of its own (moments, an AccumGrad's
    sum, an axis member's unit states): such members before a reduction define its place."""
    return bool(rule.active_states()) or type(rule).stage == "accumulate" or bool(type(rule).axes)


class ScopeKey:
    """What makes two tree-scope reduction members one reduction (see the module docstring)."""

    __slots__ = ("rule", "span", "kind", "shared", "place", "nth", "_hash")

    def __init__(self, rule, before):
        cls = type(rule)
        self.rule, self.span, self.kind = rule, rule.span, rule_key(rule)
        names = [n for n in step_args(cls.finish) if n in cls._hypers]
        names += [d.init for d in cls._states.values() if d.axis == SCALAR and isinstance(d.init, str)]
        self.shared = tuple((n, rule._values[n]) for n in dict.fromkeys(names))
        self.place = tuple(rule_key(m) for m in before if _stateful(m))
        #: the members of its family before it in the chain (two equal clips in a row are two reductions)
        self.nth = sum(1 for m in before if type(m) is cls and m.span == rule.span and type(m).scope == "tree")
        self._hash = hash((self.span, self.kind, self.place, self.nth))

    def __eq__(self, other):
        return (isinstance(other, ScopeKey) and self._hash == other._hash and self.span == other.span
                and self.kind == other.kind and self.place == other.place and self.nth == other.nth
                and self.shared == other.shared)

    def __hash__(self):
        return self._hash

    @property
    def family(self) -> tuple:
        """Reductions of one family must agree across leaves: the same class and span name."""
        return self.span, type(self.rule)

    def describe(self) -> str:
        """The member with what decides its scope, for messages."""
        place = ", ".join(key[1] for key in self.place)  # (module, qualified name, ...)
        return f"{self.rule!r} (after {place})" if place else repr(self.rule)

    def difference(self, other: ScopeKey) -> str:
        """Why two keys of one family are not one reduction, in words."""
        if self.kind != other.kind:
            return "different options"
        if self.place != other.place:
            return "different places in their chains (after different stateful members)"
        diff = [f"{n} {v!r} vs {w!r}" for (n, v), (_, w) in zip(self.shared, other.shared) if v != w]
        return "different settings (" + ", ".join(diff) + ")"


def scope_keys(layout) -> list:
    """``[(r, ScopeKey)]`` for every tree-scope reduction member ``r`` of a chain layout (kept on the layout)."""
    got = layout.__dict__.get("_scope_keys")
    if got is None:
        got = layout._scope_keys = [(r, ScopeKey(layout.rules[r], layout.rules[:r])) for r in layout.tree_reducers()]
    return got


class Planned:
    """A group as the scope check sees it (setup, load, adjust): its ``rule`` and ``layout``, its ``first`` leaf (a
    unit of the structure), whether it is a ``device`` group."""

    __slots__ = ("layout", "rule", "first", "device")

    def __init__(self, rule, layout, first: int, device: bool):
        self.rule, self.layout, self.first, self.device = rule, layout, first, device


def check(planned, where) -> None:
    """Setup's check of the scope rule over ``planned`` groups (:class:`Planned`); ``where(unit)`` names a leaf.
    Within a family (class and span name), every group holding any of it holds the same keys in the same order;
    otherwise a ``ValueError`` naming two leaves and their members. A scope over device groups and host groups,
    or a tree-wide estimate (scalar state) over several device groups, is a ``NotImplementedError``."""
    seen: dict = {}  # family -> (group, its keys of that family)
    for g in planned:
        mine: dict = {}
        for _, key in scope_keys(g.layout):
            mine.setdefault(key.family, []).append(key)
        for fam, keys in mine.items():
            other = seen.setdefault(fam, (g, keys))
            if other[0] is not g and other[1] != keys:
                _conflict(fam, (g, keys), other, lambda p: where(p.first))
    for dom in domains(planned, group=_itself):
        devices = [p for p in dom if p.device]
        if devices and len(devices) < len(dom):
            raise NotImplementedError(
                f"{where(dom[0].first)}: a tree-scope reduction (e.g. a global-norm clip) over leaves on the GPU and "
                f"elsewhere ({', '.join(where(p.first) for p in dom[1:])}); the GPU backend combines the totals of "
                "device groups only: keep those leaves on the device, or give the two sides span names of their own")
        if len(devices) > 1 and any(p.layout.n_scalar(r) for p in devices for r, _ in scope_keys(p.layout)):
            raise NotImplementedError(
                f"{where(dom[0].first)}: a tree-scope reduction with scalar state (a tree-wide estimate) over device "
                f"leaves of several groups ({', '.join(where(p.first) for p in dom[1:])}: another dtype or other "
                "hyperparameters); on the GPU it spans one group: give those leaves one rule and one dtype")


def _conflict(fam, a, b, where) -> None:
    (ga, ka), (gb, kb) = a, b
    span, cls = fam
    if len(ka) != len(kb):
        why = f"{len(kb)} vs {len(ka)} {cls.__name__} members"
    else:
        why = next(x.difference(y) for x, y in zip(kb, ka) if x != y)
    name = f"the span {span!r}" if span is not None else "the whole tree"
    raise ValueError(
        f"setup: {where(gb)} and {where(ga)} hold {cls.__name__} reductions over {name} that cannot be one: "
        f"{why}. {where(gb)}: {', '.join(k.describe() for k in kb)}; {where(ga)}: "
        f"{', '.join(k.describe() for k in ka)}. A tree-scope reduction spans every leaf holding the same one at "
        f"the same place (docs/trees.md, \"Parameter groups\"): give every leaf the same {cls.__name__}, or give "
        f"each set of leaves its own scope on purpose with {cls.__name__}(..., span=\"<name>\")")


class Domain(list):
    """Runs of one step that reduce together (a list of runs, in step order) and, per run, the slot of each of
    its tree-scope reductions (``slot_of[i]``: {member index: slot}); ``holders[slot]``: how many runs hold it;
    ``plan``: what a caller made of it once (the passes of a fast plan's steps), or None."""

    __slots__ = ("slot_of", "holders", "plan")


def _itself(g):
    return g


def _group_of(run):
    return run.grp


def domains(runs, every: bool = False, group=_group_of) -> list:
    """The runs linked by a tree-scope reduction (several runs only); ``every``: every run with a reduction,
    runs of the same kernels linked too (a core's ``reducer`` combines each domain's leaf-scope reductions across
    processes as well, one table per reduction over every leaf of those kernels). ``group(run)``: the group a run
    steps (anything with ``layout`` and ``rule``: a run's group, a device group, a :class:`Planned`)."""
    parent = list(range(len(runs)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    slots: dict = {}  # ScopeKey -> slot id
    owner: dict = {}  # slot id -> the first run holding it
    slot_of, by_rule = [], {}
    for i, run in enumerate(runs):
        lay = group(run).layout
        mine = {}
        for r, key in scope_keys(lay):
            s = mine[r] = slots.setdefault(key, len(slots))
            parent[find(i)] = find(owner.setdefault(s, i))
        slot_of.append(mine)
        if every and lay.reducers:  # the same kernels: one domain (the reducer runs one table per reduction)
            j = by_rule.setdefault(chain_key(group(run).rule), i)
            parent[find(i)] = find(j)
    comps: dict = {}
    for i, run in enumerate(runs):
        if (group(run).layout.reducers if every else slot_of[i]):
            comps.setdefault(find(i), []).append(i)
    out = []
    for members in comps.values():
        if not every and len(members) < 2:
            continue
        d = Domain(runs[i] for i in members)
        d.slot_of = [slot_of[i] for i in members]
        d.plan = None
        d.holders = {}
        for m in d.slot_of:
            for s in m.values():
                d.holders[s] = d.holders.get(s, 0) + 1
        out.append(d)
    return out


def in_order(dom, queues) -> list:
    """The reductions of a domain in chain order: ``queues[i]`` lists member ``i``'s reduction passes (member
    indices of its chain, in order). Returns the steps: ``(i, r)`` for a pass of one member alone (a leaf-scope
    reduction, an axis member), a list ``[(i, r), ...]`` for a tree-scope reduction once every member holding it
    has reached it."""
    heads = [0] * len(dom)
    steps: list = []
    while True:
        waiting: dict = {}
        for i, q in enumerate(queues):
            slots = dom.slot_of[i]
            while heads[i] < len(q) and q[heads[i]] not in slots:
                steps.append((i, q[heads[i]]))
                heads[i] += 1
            if heads[i] < len(q):
                waiting.setdefault(slots[q[heads[i]]], []).append(i)
        if not waiting:
            return steps
        ready = [slot for slot, held in waiting.items() if len(held) == dom.holders[slot]]
        if not ready:  # check() keeps the chains' orders compatible
            raise RuntimeError("numbaopt: tree-scope reductions in incompatible orders across groups")
        held = waiting[min(ready)]
        steps.append([(i, queues[i][heads[i]]) for i in held])
        for i in held:
            heads[i] += 1
