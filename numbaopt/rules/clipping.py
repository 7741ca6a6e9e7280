"""Clipping and guards: elementwise clipping, per-array and global norm clipping (reductions), and the
non-finite step guard."""
from __future__ import annotations

import math

from .base import Rule, hyper, option
from .chain import chain
from .ops import abs2, clamp, absval, isfinite, INF

__all__ = ["ClipGrad", "ClipNorm", "ClipGlobalNorm", "NonFiniteGuard", "SkipNonFinite"]

#: the infinity norm (``p=INF_P``)
INF_P = float("inf")


class ClipGrad(Rule):
    """Elementwise clipping: ``d = clamp(g, -delta, delta)``.

    Pascanu, Mikolov and Bengio, "On the difficulty of training recurrent neural networks", 2013.
    https://arxiv.org/abs/1211.5063
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.ClipGrad(1.0), no.Descent(0.1)), x)
    >>> state, x = no.update_(state, x, np.array([0.5, -4.0]))   # -4 is clipped to -1
    >>> print(x.round(4))
    [ 0.95 -1.9 ]
    """
    delta = hyper(10.0, low=0.0, allow_inf=True, doc="inf: no clipping")
    supports_complex = False
    torch = "torch.nn.utils.clip_grad_value_(params, delta)"
    optax = "clip(delta)"

    @staticmethod
    def step(g, x, delta):
        return clamp(g, -delta, delta)


def _norm_ops(rule):
    return ("max",) if rule.p == INF_P else ("sum",)


class ClipNorm(Rule):
    """Norm clipping: ``n = ||g||_p`` over the array (p = 1, 2 or inf), ``d = g * min(max_norm / n, 1)``.

    A non-finite ``n`` raises ValueError (nothing is written) unless ``error_if_nonfinite=False``, when
    the step goes ahead with ``min(max_norm/n, 1)`` (NaN or 0, as torch and Optimisers.jl).

    Pascanu, Mikolov and Bengio, "On the difficulty of training recurrent neural networks", 2013.
    https://arxiv.org/abs/1211.5063
    Examples
    --------
    >>> x = np.zeros(2); state = no.setup(no.chain(no.ClipNorm(1.0), no.Descent(1.0)), x)
    >>> state, x = no.update_(state, x, np.array([3.0, 4.0]))   # norm 5: the step is g / 5
    >>> print(x.round(4))
    [-0.6 -0.8]
    """
    max_norm = hyper(10.0, low=0.0)
    p = option(2.0, choices=(1.0, 2.0, INF_P), doc="the norm: 1, 2 or inf")
    error_if_nonfinite = option(True)
    reduce_ops = _norm_ops
    finals = ("scale", "error")
    error_message = "the gradient norm is not finite (NaN or Inf); nothing was changed " \
                    "(pass error_if_nonfinite=False to step anyway)"
    torch = "clip_grad_norm_(params, max_norm, norm_type=p, error_if_nonfinite) per array (torch adds 1e-6 to n)"
    optax = "(clip_by_block_rms is RMS-based); per-array norm clip has no direct optax equivalent"

    @staticmethod
    def reduce(g, x, p):
        if p == 2.0:
            return abs2(g)
        if p == 1.0:
            return absval(g)
        if isfinite(g):  # a max would lose a NaN: report it as an infinite norm
            return absval(g) * 1.0
        return INF

    @staticmethod
    def finish(total, max_norm, p, error_if_nonfinite):
        # the max over no elements is the identity -inf: the norm of an empty gradient is 0
        n = math.sqrt(total) if p == 2.0 else max(total, 0.0)
        if not math.isfinite(n) and error_if_nonfinite:
            return 0.0, 1.0
        return (min(max_norm / n, 1.0) if n > 0.0 else 1.0), 0.0

    @staticmethod
    def step(g, x, scale):
        return g * scale


class ClipGlobalNorm(ClipNorm):
    """Global-norm clipping: one norm ``n = ||g||_p`` over every leaf of the tree (or over the array),
    then ``d = g * min(max_norm / n, 1)`` everywhere; non-finite n raises unless disabled.

    Pascanu, Mikolov and Bengio, "On the difficulty of training recurrent neural networks", 2013.
    https://arxiv.org/abs/1211.5063
    Examples
    --------
    >>> model = {"a": np.zeros(1), "b": np.zeros(1)}
    >>> state = no.setup(no.chain(no.ClipGlobalNorm(1.0), no.Descent(1.0)), model)
    >>> state, model = no.update_(state, model, {"a": np.array([3.0]), "b": np.array([4.0])})   # one norm: 5
    >>> print(model["a"], model["b"])
    [-0.6] [-0.8]
    """
    max_norm = hyper(1.0, low=0.0)
    scope = "tree"
    torch = "clip_grad_norm_(model.parameters(), max_norm, norm_type=p, error_if_nonfinite)"
    optax = "clip_by_global_norm(max_norm) (p=2; optax never raises: error_if_nonfinite=False)"


class NonFiniteGuard(Rule):
    """Skip the whole step when any gradient element (of the array, or of any leaf of the tree) is NaN
    or Inf: nothing is written, the step count does not advance and the skip is counted
    (``state.skipped``). Otherwise ``d = g``. Use it through :func:`SkipNonFinite`.

    Micikevicius et al., "Mixed Precision Training", 2018, sec. 3.2 (an overflowing step is skipped).
    https://arxiv.org/abs/1710.03740
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.NonFiniteGuard(), no.Descent(0.1)), x)
    >>> state, x = no.update_(state, x, np.array([np.nan, 1.0]))   # skipped: nothing changes
    >>> state, x = no.update_(state, x, np.array([1.0, 1.0]))
    >>> print(x.round(4), state.skipped)
    [ 0.9 -2.1] 1
    """
    reduce_ops = ("sum",)
    finals = ("skip",)
    scope = "tree"
    torch = "(torch.amp.GradScaler skips such steps)"
    optax = "apply_if_finite(inner, max_consecutive_errors=inf)"

    @staticmethod
    def reduce(g, x):
        return 0.0 if isfinite(g) else 1.0

    @staticmethod
    def finish(bad):
        return (bad,)

    @staticmethod
    def step(g, x):
        return g


def SkipNonFinite(rule):
    """``rule``, except that a step whose gradients contain NaN/Inf in any leaf changes neither the
    parameters nor the state (the check is a fused reduction pass of the same kernel); skipped steps are
    counted in ``state.skipped``.

    Micikevicius et al., "Mixed Precision Training", 2018, sec. 3.2. https://arxiv.org/abs/1710.03740
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.SkipNonFinite(no.Adam(0.1)), x)
    >>> state, x = no.update_(state, x, np.array([np.inf, 1.0]))   # skipped: x, m, v and t unchanged
    >>> state, x = no.update_(state, x, 2 * x)
    >>> print(x.round(4), state.skipped)
    [ 0.9 -1.9] 1
    """
    return chain(NonFiniteGuard(), rule)
