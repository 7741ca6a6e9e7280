"""``chain(rule1, rule2, ...)``: each rule's step is the next rule's gradient, fused into one kernel."""
from __future__ import annotations

from .base import Rule

__all__ = ["Chain", "chain", "check_members"]


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


def chain(*rules) -> Rule | Chain:
    """Compose rules; a chain of one rule is that rule, and ``chain()`` the identity (``d = g``)."""
    c = Chain(*rules)
    return c.rules[0] if len(c.rules) == 1 else c
