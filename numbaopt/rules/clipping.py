"""Clipping and guards: elementwise clipping, per-array and global norm clipping and normalisation
(reductions), the non-finite step guard, NaN zeroing and the non-negativity constraint."""
from __future__ import annotations

import math
import numbers

from .base import Rule, hyper, option
from .chain import chain
from .ops import abs2, clamp, absval, isfinite, INF

__all__ = ["ClipGrad", "ClipNorm", "ClipGlobalNorm", "ClipByBlockRMS", "NonFiniteGuard", "SkipNonFinite",
           "NormalizeByUpdateNorm", "ZeroNaNs", "KeepParamsNonNegative"]

#: the infinity norm (``p=INF_P``)
INF_P = float("inf")


class _AnyOrder:
    """The last "choice" of a norm order as docs/rules.md lists it: any other p > 0."""

    def __repr__(self):
        return "any p > 0"


class _NormOrder(option):
    """A compile-time norm order ``p``: any real p > 0, ``inf`` included (a float literal of the kernels)."""

    def __init__(self, default, doc=""):
        super().__init__(default, choices=(1.0, 2.0, INF_P, _AnyOrder()), doc=doc)

    def check(self, owner: str, value):
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0  # NaN fails too
        if not ok:
            raise ValueError(f"{owner}: option {self.name}={value!r}; expected a norm order p > 0 (inf included)")
        return float(value)


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
    """Norm clipping: ``n = ||g||_p`` over the array (any p > 0, inf included), ``d = g * min(max_norm / (n + eps), 1)``
    (``eps = 0`` by default, as Optimisers.jl and optax; torch's ``clip_grad_norm_`` is ``eps=1e-6``).

    ``n`` is ``sqrt(sum |g|^2)`` for p = 2, ``sum |g|`` for p = 1, ``max |g|`` for p = inf and
    ``(sum |g|^p)^(1/p)`` (summed in float64) for any other p. A non-finite ``n`` raises ValueError (nothing
    is written) unless ``error_if_nonfinite=False``, when the step goes ahead with ``min(max_norm/n, 1)`` (NaN
    or 0, as torch and Optimisers.jl).

    Pascanu, Mikolov and Bengio, "On the difficulty of training recurrent neural networks", 2013.
    https://arxiv.org/abs/1211.5063
    Examples
    --------
    >>> x = np.zeros(2); state = no.setup(no.chain(no.ClipNorm(1.0), no.Descent(1.0)), x)
    >>> state, x = no.update_(state, x, np.array([3.0, 4.0]))   # norm 5: the step is g / 5
    >>> print(x.round(4))
    [-0.6 -0.8]
    >>> state = no.setup(no.chain(no.ClipNorm(1.0, p=3), no.Descent(1.0)), np.zeros(2))
    >>> print(no.update(state, np.zeros(2), np.array([3.0, 4.0]))[1].round(4))   # (3^3 + 4^3)^(1/3) = 4.498
    [-0.667  -0.8893]
    """
    max_norm = hyper(10.0, low=0.0)
    p = _NormOrder(2.0, doc="the norm: any p > 0 (1, 2 and inf have exact special cases)")
    eps = hyper(0.0, low=0.0, doc="added to the norm: d = g * min(max_norm / (n + eps), 1); torch's "
                "clip_grad_norm_ adds 1e-6")
    error_if_nonfinite = option(True)
    reduce_ops = _norm_ops
    finals = ("scale", "error")
    error_message = "the gradient norm is not finite (NaN or Inf); nothing was changed " \
                    "(pass error_if_nonfinite=False to step anyway)"
    torch = "clip_grad_norm_(params, max_norm, norm_type=p, error_if_nonfinite) per array, with eps=1e-6"
    optax = "(clip_by_block_rms is RMS-based); per-array norm clip has no direct optax equivalent"

    @staticmethod
    def reduce(g, x, p):
        if p == 2.0:
            return abs2(g)
        if p == 1.0:
            return absval(g)
        if p != INF:
            return float(absval(g)) ** p
        if isfinite(g):  # a max would lose a NaN: report it as an infinite norm
            return absval(g) * 1.0
        return INF

    @staticmethod
    def finish(total, max_norm, p, eps, error_if_nonfinite):
        # the max over no elements is the identity -inf: the norm of an empty gradient is 0
        n = math.sqrt(total) if p == 2.0 else max(total, 0.0)
        if p != 1.0 and p != 2.0 and p != INF:
            n = n ** (1.0 / p)
        if not math.isfinite(n) and error_if_nonfinite:
            return 0.0, 1.0
        return (min(max_norm / (n + eps), 1.0) if n > 0.0 else 1.0), 0.0

    @staticmethod
    def step(g, x, scale):
        return g * scale


class ClipGlobalNorm(ClipNorm):
    """Global-norm clipping: one norm ``n = ||g||_p`` over every leaf of the tree (or over the array),
    then ``d = g * min(max_norm / (n + eps), 1)`` everywhere (torch's ``clip_grad_norm_``: ``eps=1e-6``); non-finite
    n raises unless disabled. With a rule chooser it spans every leaf holding the same clip, whatever the rest of
    each leaf's chain (parameter groups: docs/trees.md); ``span="name"`` gives a set of leaves a norm of its own.

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
    torch = "clip_grad_norm_(model.parameters(), max_norm, norm_type=p, error_if_nonfinite) with eps=1e-6"
    optax = "clip_by_global_norm(max_norm) (p=2; optax never raises: error_if_nonfinite=False)"


class ClipByBlockRMS(Rule):
    """Per-array RMS clipping (optax's ``clip_by_block_rms``): ``rms = sqrt(mean(|g|^2))`` over the array (a
    "block": one leaf of the tree, each with its own), ``d = g / max(1, rms / threshold)``. The update clipping
    of Adafactor, applied to the gradient; an empty array is left alone.

    Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018, section 6.
    https://arxiv.org/abs/1804.04235
    Examples
    --------
    >>> x = np.zeros(2); state = no.setup(no.chain(no.ClipByBlockRMS(1.0), no.Descent(1.0)), x)
    >>> state, x = no.update_(state, x, np.array([3.0, 4.0]))   # rms = sqrt(12.5): the step is g / 3.5355
    >>> print(x.round(4))
    [-0.8485 -1.1314]
    """
    threshold = hyper(1.0, low=0.0, low_open=True, allow_inf=True, doc="inf: no clipping")
    reduce_ops = ("sum", "sum")
    finals = ("denom",)
    torch = "(none)"
    optax = "clip_by_block_rms(threshold)"

    @staticmethod
    def reduce(g, x):
        return abs2(g), 1.0

    @staticmethod
    def finish(total, count, threshold):
        rms = math.sqrt(total / count) if count > 0.0 else 0.0
        return (max(1.0, rms / threshold),)

    @staticmethod
    def step(g, x, denom):
        return g / denom


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


class NormalizeByUpdateNorm(Rule):
    """Normalisation by the global norm (optax's ``normalize_by_update_norm``): one norm
    ``n = ||g||_2`` over every leaf of the tree (or over the array), then ``d = g / ((n + eps) / scale_factor)``,
    i.e. ``scale_factor * g / (n + eps)``, everywhere. A non-finite norm (or a zero one with eps = 0) gives
    a zero or NaN step, as optax's.

    Hazan, Levy and Shalev-Shwartz, "Beyond Convexity: Stochastic Quasi-Convex Optimization", NeurIPS 2015
    (normalized gradient descent). https://arxiv.org/abs/1507.02030
    Examples
    --------
    >>> model = {"a": np.zeros(1), "b": np.zeros(1)}
    >>> state = no.setup(no.chain(no.NormalizeByUpdateNorm(eps=0.0), no.Descent(0.5)), model)
    >>> state, model = no.update_(state, model, {"a": np.array([3.0]), "b": np.array([4.0])})   # one norm: 5
    >>> print(model["a"], model["b"])
    [-0.3] [-0.4]
    """
    scale_factor = hyper(1.0, low=0.0)
    eps = hyper(1e-6, low=0.0)
    reduce_ops = ("sum",)
    finals = ("gn",)
    scope = "tree"
    torch = "(none)"
    optax = "normalize_by_update_norm(scale_factor, eps) in a chain (as a whole optimiser, its scale_factor=-s " \
            "is NormalizeByUpdateNorm(s))"

    @staticmethod
    def reduce(g, x):
        return abs2(g)

    @staticmethod
    def finish(total, scale_factor, eps):
        return ((math.sqrt(total) + eps) / scale_factor,)

    @staticmethod
    def step(g, x, gn):
        return g / gn


class ZeroNaNs(Rule):
    """NaN entries of the gradient replaced by zero (optax's ``zero_nans``): ``d = 0`` where ``g`` is NaN
    (for complex ``g``, NaN in either part), else ``d = g``; infinities pass unchanged.

    optax's transformation (DeepMind et al., "The DeepMind JAX Ecosystem", 2020).
    https://optax.readthedocs.io/en/latest/api/transformations.html
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.ZeroNaNs(), no.Descent(0.1)), x)
    >>> state, x = no.update_(state, x, np.array([np.nan, 1.0]))   # the NaN element does not move
    >>> print(x.round(4))
    [ 1.  -2.1]
    """
    torch = "torch.nan_to_num(grad, nan=0.0, posinf=inf, neginf=-inf)"
    optax = "zero_nans() (its found_nan flags are not kept)"

    @staticmethod
    def step(g, x):
        if g != g:  # NaN (either part of a complex number)
            return 0.0
        return g


class KeepParamsNonNegative(Rule):
    """Keep the parameters non-negative (optax's ``keep_params_nonnegative``): ``d = x`` where ``x - g < 0``,
    else ``d = g``: the new parameter is ``max(x - g, 0)``, the projection of projected gradient descent onto
    ``x >= 0`` (a negative parameter is moved to 0). Put it last in a chain: its ``g`` is the final step.

    Gradient projection (Goldstein 1964, Levitin and Polyak 1966) as optax's transformation (DeepMind et al.,
    "The DeepMind JAX Ecosystem", 2020). https://optax.readthedocs.io/en/latest/api/transformations.html
    Examples
    --------
    >>> x = np.array([1.0, 0.05]); state = no.setup(no.chain(no.Descent(0.1), no.KeepParamsNonNegative()), x)
    >>> state, x = no.update_(state, x, np.array([1.0, 1.0]))   # 0.05 - 0.1 < 0: stops at 0
    >>> print(x.round(4))
    [0.9 0. ]
    """
    supports_complex = False
    torch = "(none: param.clamp_(min=0) after the step)"
    optax = "keep_params_nonnegative() (last in the chain)"

    @staticmethod
    def step(g, x):
        if x - g < 0:
            return x
        return g
