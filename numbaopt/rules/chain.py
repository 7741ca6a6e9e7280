"""``chain(rule1, rule2, ...)``: each rule's step is the next rule's gradient, fused into one kernel.

A member may be a *rule chooser* ``fn(path, leaf) -> rule`` (:func:`numbaopt.muon`, :func:`masked`, your own):
the chain is then a rule chooser for :func:`numbaopt.setup` too, each leaf getting the chain of what its
members give it (optax's ``chain(clip_by_global_norm(1.0), partition(...))``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

from .base import Rule

__all__ = ["Chain", "chain", "check_members", "ChainChooser", "masked", "Masked"]


def check_members(rules) -> tuple:
    """Check where the stages of a chain stand; returns ``rules`` as a tuple.

    ``MixedPrecision`` changes the array every later member computes on, so it must come first; a rule with
    ``last_member`` (Prodigy) must come last;
    ``AccumGrad`` splits the chain into what runs on every gradient and what runs on their mean, so
    there is at most one of each.
    """
    rules = tuple(rules)
    for k, r in enumerate(rules):
        if type(r).stage == "master" and k != 0:
            raise ValueError(f"chain: {r!r} must be the first member (it makes the master copy every later "
                             f"member computes on); it is member {k} of {len(rules)}")
        if type(r).last_member and k != len(rules) - 1:
            raise ValueError(f"chain: {type(r).__name__} must be the last member (its state follows the step it "
                             f"makes: a member after it would change that step); it is member {k} of {len(rules)}")
    n_acc = sum(1 for r in rules if type(r).stage == "accumulate")
    if n_acc > 1:
        raise ValueError(f"chain: {n_acc} AccumGrad members; use one (AccumGrad(a) then AccumGrad(b) is "
                         "AccumGrad(a * b))")
    return rules


class Chain:
    """A composition of rules. Elementwise members run as ONE generated kernel (one pass over memory).

    ``chain(WeightDecay(5e-4), ClipGrad(1.0), Adam(1e-3))`` computes ``d1 = g + wd*x``,
    ``d2 = clamp(d1)``, ``d = adam(d2)`` per element and writes ``x - d``. Nested chains are flattened.
    The stages of :mod:`numbaopt.rules.stages` are members too: ``chain(AccumGrad(4), ClipGlobalNorm(1.0),
    Adam())`` (Optimisers.jl's ``OptimiserChain(AccumGrad(4), ClipNorm(1), Adam())``, optax's
    ``MultiSteps(chain(clip_by_global_norm(1.0), adam()), 4)``). ``chain()`` is the identity: ``d = g``.
    """

    __slots__ = ("rules",)

    def __init__(self, *rules):
        flat = []
        for r in rules:
            if isinstance(r, Chain):
                flat.extend(r.rules)
            elif isinstance(r, Rule):
                flat.append(r)
            elif isinstance(r, type) and issubclass(r, Rule):
                raise TypeError(f"chain: got the class {r.__name__}; pass an instance, e.g. {r.__name__}()")
            else:
                raise TypeError(f"chain: expected rules, got {r!r}")
        object.__setattr__(self, "rules", check_members(flat))

    def __setattr__(self, name, value):
        raise AttributeError("Chain is immutable; use numbaopt.adjust on its state")

    def __reduce__(self):
        return (Chain, self.rules)

    def __eq__(self, other):
        return isinstance(other, Chain) and self.rules == other.rules

    def __hash__(self):
        return hash(self.rules)

    def __len__(self):
        return len(self.rules)

    def __getitem__(self, i):
        return self.rules[i]

    def replace(self, **kw) -> "Chain":
        """Set each named hyperparameter in every member that has it (as Optimisers.jl's adjust)."""
        valid = sorted({n for r in self.rules for n in r._values})
        unknown = set(kw) - set(valid)
        if unknown:
            raise ValueError(f"chain: unknown hyperparameter(s) {sorted(unknown)}; valid: {valid}")
        return Chain(*[r.replace(**{k: v for k, v in kw.items() if k in r._values}) for r in self.rules])

    def __repr__(self):
        return f"chain({', '.join(map(repr, self.rules))})"


def _is_chooser(r) -> bool:
    return callable(r) and not isinstance(r, (Rule, Chain, type))


@overload
def chain(*rules: Rule | Chain) -> Rule | Chain: ...
@overload
def chain(*rules: Rule | Chain | Callable[[Any, Any], Any]) -> Rule | Chain | ChainChooser: ...
def chain(*rules):
    """Compose rules; a chain of one rule is that rule, and ``chain()`` the identity (``d = g``). With a rule
    chooser among the members, a :class:`ChainChooser` (a rule chooser for :func:`numbaopt.setup`)."""
    if any(_is_chooser(r) for r in rules):
        return ChainChooser(rules)
    c = Chain(*rules)
    return c.rules[0] if len(c.rules) == 1 else c


class ChainChooser:
    """A chain some of whose members are rule choosers ``fn(path, leaf)``: itself a rule chooser, giving each
    leaf the chain of its members' rules (the same member objects give the same chain object). A member
    chooser returning ``None`` leaves the leaf untrained, except a :func:`masked` member, which is then left
    out of that leaf's chain.

    >>> import numpy as np, numbaopt as no
    >>> choose = no.chain(no.ClipGlobalNorm(1.0), no.muon(0.02))   # one norm over every leaf, then Muon/Adam
    >>> [type(r).__name__ for r in choose(None, np.ones((2, 2))).rules]
    ['ClipGlobalNorm', 'Muon']
    >>> [type(r).__name__ for r in choose(None, np.ones(2)).rules]
    ['ClipGlobalNorm', 'Adam']
    """

    __slots__ = ("members", "_made")

    def __init__(self, members):
        members = tuple(members)
        for r in members:
            if not (isinstance(r, (Rule, Chain)) or _is_chooser(r)):
                Chain(r)  # the usual TypeError for what is neither a rule nor a chooser
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "_made", {})

    def __setattr__(self, name, value):
        raise AttributeError("ChainChooser is immutable")

    def __call__(self, path, x):
        rules = []
        for m in self.members:
            if not _is_chooser(m):
                rules.append(m)
                continue
            r = m(path, x)
            if r is None:
                if isinstance(m, Masked):
                    continue
                return None
            if not isinstance(r, (Rule, Chain)):
                raise TypeError(f"chain: the member {m!r} returned {r!r}, not a rule")
            rules.append(r)
        key = tuple(map(id, rules))
        got = self._made.get(key)
        if got is None:  # the rules are kept alive with it: their ids stay theirs
            got = self._made[key] = (rules, chain(*rules))
        return got[1]

    def __repr__(self):
        return f"chain({', '.join(map(_member_repr, self.members))})"


def _member_repr(m) -> str:
    return repr(m) if isinstance(m, (Rule, Chain, Masked)) else getattr(m, "__qualname__", None) or repr(m)


class Masked:
    """:func:`masked`'s rule chooser: ``rule`` where ``mask(path, leaf)`` is true."""

    __slots__ = ("rule", "mask")

    def __init__(self, rule, mask):
        if not isinstance(rule, (Rule, Chain)):
            raise TypeError(f"masked: expected a rule or a chain, got {rule!r}")
        if not callable(mask):
            raise TypeError(f"masked: the mask must be a function mask(path, leaf) -> bool, got {mask!r}")
        self.rule, self.mask = rule, mask

    def __call__(self, path, x):
        return self.rule if self.mask(path, x) else None

    def __repr__(self):
        return f"masked({self.rule!r}, {getattr(self.mask, '__qualname__', None) or self.mask!r})"


def masked(rule, mask) -> Masked:
    """``rule`` on the leaves where ``mask(path, leaf)`` is true (optax's ``masked``): in a chain, the other leaves
    go without that member; given to :func:`numbaopt.setup` alone, only those leaves are trained.

    Weight decay on the matrices only, one global clip over every leaf:

    >>> import numpy as np, numbaopt as no
    >>> model = {"w": np.ones((2, 2)), "b": np.ones(2)}
    >>> opt = no.chain(no.ClipGlobalNorm(1.0), no.Adam(1e-3), no.masked(no.WeightDecay(1e-4), lambda p, x: x.ndim == 2))
    >>> state = no.setup(opt, model)
    >>> print([type(r).__name__ for r in state["w"].rule.rules], [type(r).__name__ for r in state["b"].rule.rules])
    ['ClipGlobalNorm', 'Adam', 'WeightDecay'] ['ClipGlobalNorm', 'Adam']
    """
    return Masked(rule, mask)
