"""Lookahead (Zhang et al. 2019): slow weights synchronised every k steps, as a chain member."""
from __future__ import annotations

from .base import Rule, hyper, state
from .chain import chain

__all__ = ["LookaheadSync", "Lookahead"]


class LookaheadSync(Rule):
    """Lookahead's slow weights (Zhang et al. 2019), placed after the inner rule: the fast weights take
    the inner step ``f = x - g``; every ``k``-th step the slow weights move ``s = s + alpha * (f - s)``
    and the parameter is reset to them (``d = x - s``); ``s`` starts at the parameter at step 1.

    Zhang, Lucas, Hinton and Ba, "Lookahead Optimizer: k steps forward, 1 step back", 2019.
    https://arxiv.org/abs/1907.08610
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.Descent(0.25), no.LookaheadSync(2, 0.5)), x)
    >>> for _ in range(2):
    ...     state, x = no.update_(state, x, 2 * x)
    ...     print(x.round(4))   # the fast weights, then the synchronised slow weights
    [ 0.5 -1. ]
    [ 0.625 -1.25 ]
    """
    k = hyper(5.0, low=1.0, doc="synchronisation period (an integer)")
    alpha = hyper(0.5, low=0.0, high=1.0)
    s = state(0.0)
    scalars = ("first", "sync")
    torch = "(torch-optimizer Lookahead(inner, k, alpha))"
    optax = "lookahead(inner, sync_period=k, slow_step_size=alpha) (optax keeps both weights in the params)"

    def validate(self):
        k = self._values["k"]
        if not isinstance(k, (int, float)) or float(k) != int(k):
            raise ValueError(f"LookaheadSync: k={k!r} must be an integer >= 1")

    @staticmethod
    def prepare(t, k):
        first = 1.0 if t == 1.0 else 0.0
        sync = 1.0 if t % k == 0.0 else 0.0
        return first, sync

    @staticmethod
    def step(g, x, s, alpha, first, sync):
        if first > 0:
            s = x
        if sync > 0:
            s = s + alpha * ((x - g) - s)
            return x - s, s
        return g, s


def Lookahead(rule, k=5, alpha=0.5):
    """Lookahead around ``rule``: ``chain(rule, LookaheadSync(k, alpha))`` (one fused kernel). The
    parameter holds the fast weights between synchronisations, the state the slow weights.

    Zhang, Lucas, Hinton and Ba, "Lookahead Optimizer: k steps forward, 1 step back", 2019.
    https://arxiv.org/abs/1907.08610
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Lookahead(no.Adam(0.1), k=2, alpha=0.5), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.8007 -1.8003]
    """
    return chain(rule, LookaheadSync(k, alpha))
