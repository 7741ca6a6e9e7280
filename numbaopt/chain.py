"""``chain(rule1, rule2, ...)``: each rule's step is the next rule's gradient, fused into one kernel."""
from __future__ import annotations

from .rule import Rule

__all__ = ["Chain", "chain"]


class Chain:
    """A composition of rules. Elementwise members run as ONE generated kernel (one pass over memory).

    ``chain(WeightDecay(5e-4), ClipGrad(1.0), Adam(1e-3))`` computes ``d1 = g + wd*x``,
    ``d2 = clamp(d1)``, ``d = adam(d2)`` per element and writes ``x - d``. Nested chains are flattened.
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
        if not flat:
            raise ValueError("chain: needs at least one rule")
        object.__setattr__(self, "rules", tuple(flat))

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
    """Compose rules; a chain of one rule is that rule."""
    c = Chain(*rules)
    return c.rules[0] if len(c.rules) == 1 else c
