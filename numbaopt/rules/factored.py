"""Axis reductions: rules whose step reads statistics of a row, a column or a unit of the leaf.

Each is a short definition of the mechanism in :mod:`.base` (``axes``, ``geometry``, unit states): the compiler
sums ``reduce``'s contributions per unit in the same fused kernel, runs ``finish`` per unit, and the step reads
its element's unit's finals. Adafactor's factored second moments take O(rows + cols) memory per matrix.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .base import Rule, hyper, option, state, whole_leaf
from ..schedules import inverse_sqrt
from .basic import EMA, Descent, WeightDecay
from .chain import chain
from .clipping import ClipByBlockRMS
from .ops import abs2, epsilon, imag, number, real, sqrt

__all__ = ["Centralize", "AdaptiveGradClip", "ScaleByFactoredRMS", "ScaleByParamBlockRMS", "Adafactor", "NovoGrad"]


class Centralize(Rule):
    """Gradient centralisation (optax's ``centralize``): ``d = g - mean(g)``, the mean over all axes but the
    first (one mean per row of a matrix, per output channel of a convolution kernel); arrays of fewer than two
    dimensions are left alone.

    Yong et al., "Gradient Centralization: A New Optimization Technique for Deep Neural Networks", 2020.
    https://arxiv.org/abs/2004.01461
    Examples
    --------
    >>> x = np.zeros((2, 3)); state = no.setup(no.chain(no.Centralize(), no.Descent(1.0)), x)
    >>> state, x = no.update_(state, x, np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]]))
    >>> print(x)
    [[ 1.  0. -1.]
     [ 1.  1. -2.]]
    """
    axes = ("rows",)
    reduce_ops = ("sum", "sum")  # the real and imaginary parts (totals are real)
    finals = ("re", "im")
    torch = "(none)"
    optax = "centralize()"

    @staticmethod
    def geometry(shape):
        return None if len(shape) < 2 else (0, 1, 1, len(shape))

    @staticmethod
    def reduce(g, x):
        return real(g), imag(g)

    @staticmethod
    def finish(re, im, count):
        if count == 0.0:
            return 0.0, 0.0
        return re / count, im / count

    @staticmethod
    def step(g, x, re_rows, im_rows):
        return g - number(re_rows, im_rows)


def _unit_axes(shape):
    """optax's ``unitwise_norm`` units: the whole array for (squeezed) vectors and scalars; for ndim 2 or 3 the
    norm over axis 0, for ndim 4 over axes 0-2, for ndim 5 over axes 0-3 (the last axis is the output unit)."""
    nd = len(shape)
    if sum(1 for n in shape if n != 1) <= 1:
        return (0, nd, nd, nd)
    if nd in (2, 3):
        return (0, 1, 1, nd)
    if nd in (4, 5):
        return (0, nd - 1, nd - 1, nd)
    raise ValueError(f"AdaptiveGradClip: a parameter of shape {shape} has no default units (optax's unitwise_norm "
                     "covers 1 to 5 dimensions)")


class AdaptiveGradClip(Rule):
    """Adaptive gradient clipping (optax's ``adaptive_grad_clip``): per unit, ``max = clipping * max(||x||, eps)``
    and ``d = g`` where ``||g|| < max``, else ``g * max / max(||g||, 1e-6)``. A unit is an output unit of the
    layer (the norms are over axis 0 of a matrix, axes 0-2 of an HWIO convolution kernel, the whole array for a
    vector), as optax's ``unitwise_norm`` defines it.

    Brock, De, Smith and Simonyan, "High-Performance Large-Scale Image Recognition Without Normalization",
    2021. https://arxiv.org/abs/2102.06171
    Examples
    --------
    >>> x = np.array([[3.0], [4.0]]); state = no.setup(no.chain(no.AdaptiveGradClip(0.1), no.Descent(1.0)), x)
    >>> state, x = no.update_(state, x, np.array([[0.0], [2.0]]))   # ||g|| = 2 > 0.1 * 5: scaled to 0.5
    >>> print(x)
    [[3. ]
     [3.5]]
    """
    clipping = hyper(1e-2, low=0.0, doc="the largest ratio of a unit's gradient norm to its parameter norm")
    eps = hyper(1e-3, low=0.0, doc="the smallest parameter norm (zero-initialised units still move)")
    axes = ("cols",)
    reduce_ops = ("sum", "sum")
    finals = ("scale",)
    torch = "(none: timm's adaptive_clip_grad)"
    optax = "adaptive_grad_clip(clipping, eps)"

    @staticmethod
    def geometry(shape):
        return _unit_axes(shape)

    @staticmethod
    def reduce(g, x):
        return abs2(x), abs2(g)

    @staticmethod
    def finish(xx, gg, count, clipping, eps):
        max_norm = clipping * max(math.sqrt(xx), eps)
        g_norm = math.sqrt(gg)
        return (1.0 if g_norm < max_norm else max_norm / max(g_norm, 1e-6),)

    @staticmethod
    def step(g, x, scale_cols):
        return g * scale_cols


class _AnySize:
    """The "choices" of a size as docs/rules.md lists them."""

    def __repr__(self):
        return "any integer >= 0"


class SizeOption(option):
    """A compile-time non-negative integer (a size): any value, not a list of choices."""

    def __init__(self, default, doc=""):
        super().__init__(default, choices=(_AnySize(),), doc=doc)

    def check(self, owner: str, value):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{owner}: option {self.name}={value!r}; expected an integer >= 0")
        return int(value)


def _factored_axes(shape, factored, min_dim_size_to_factor, convention="optax"):
    """optax's choice: the two largest axes (``np.argsort``), factored when the smaller of them has at least
    ``min_dim_size_to_factor`` entries; torch's: the last two axes of every array of two axes or more. Otherwise
    every element is a row of its own (unfactored)."""
    nd = len(shape)
    if factored and nd >= 2 and convention == "torch":
        return (nd - 2, nd - 1, nd - 1, nd)
    if factored and nd >= 2:
        order = np.argsort(shape)
        if shape[order[-2]] >= min_dim_size_to_factor:
            i, j = sorted((int(order[-2]), int(order[-1])))
            return (i, i + 1, j, j + 1)
    return (0, nd, nd, nd)


class ScaleByFactoredRMS(Rule):
    """Adafactor's factored second moment (optax's ``scale_by_factored_rms``): with
    ``rho = 1 - (t - step_offset)^-decay_rate`` and ``G = |g|^2 + eps`` over the two largest axes of the array
    (the others index a batch of matrices), ``v_row = rho*v_row + (1-rho)*mean_col(G)``,
    ``v_col = rho*v_col + (1-rho)*mean_row(G)``, ``v_mean = rho*v_mean + (1-rho)*mean(G)`` (the mean of v_row,
    kept as a state of its own) and ``d = g / sqrt(v_row * v_col / v_mean)``: O(rows + cols) state. An array
    whose second-largest axis is shorter than ``min_dim_size_to_factor`` (every array when ``factored=False``)
    keeps ``v_row`` per element and steps ``d = g / sqrt(v_row)``.

    ``convention="torch"`` (``torch.optim.Adafactor``): the last two axes of every array with two or more
    (``min_dim_size_to_factor`` is not used), ``G = |g|^2``, ``d = g / sqrt(max(v_row * v_col / max(v_mean, eps),
    eps^2))`` and ``d = g / max(sqrt(v_row), eps)`` unfactored, with ``eps = 0`` meaning the machine epsilon of
    the parameters' precision (torch's ``eps=(None, ...)``). A matrix with one column is stepped as unfactored
    (the same unless its mean square is below ``eps``).

    ``v_row`` sums over the later of the two axes and ``v_col`` over the earlier (optax names them by size; the
    step is the same). optax computes ``rho`` in float32 whatever the parameters; here it is in the parameters'
    precision.

    Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
    https://arxiv.org/abs/1804.04235
    Examples
    --------
    >>> rule = no.chain(no.ScaleByFactoredRMS(min_dim_size_to_factor=2), no.Descent(0.1))
    >>> x = np.zeros((2, 2)); state = no.setup(rule, x)
    >>> state, x = no.update_(state, x, np.array([[1.0, 2.0], [3.0, 4.0]]))   # the first step: g / sqrt(estimate)
    >>> print(x.round(4))
    [[-0.0775 -0.1095]
     [-0.1039 -0.098 ]]
    """
    decay_rate = hyper(0.8, low=0.0, doc="rho = 1 - (t - step_offset)^-decay_rate")
    step_offset = hyper(0.0, low=0.0, doc="the step at which a fine-tuning run restarts the decay schedule")
    eps = hyper(1e-30, low=0.0, doc="added to |g|^2 (optax); the floor of sqrt(v), 0: machine epsilon (torch)")
    factored = option(True)
    min_dim_size_to_factor = SizeOption(128, doc="factor only when the second-largest axis has this many entries")
    convention = option("optax", choices=("optax", "torch"))
    v_row = state(0.0, real=True, axis="rows")
    v_col = state(0.0, real=True, axis="cols")
    v_mean = state(0.0, real=True, axis="batch")
    axes = ("rows", "cols", "batch")
    reduce_ops = ("sum",)
    finals = ("factor", "n")  # optax: 1/sqrt(v) per unit (the step multiplies); torch: v; n: the unit's size
    scalars = ("rho", "floor")
    torch = "Adafactor's second moment, convention='torch' (torch.optim.Adafactor)"
    optax = "scale_by_factored_rms(factored, decay_rate, step_offset, min_dim_size_to_factor, eps)"

    @staticmethod
    def geometry(shape, factored, min_dim_size_to_factor, convention):
        return _factored_axes(shape, factored, min_dim_size_to_factor, convention)

    @staticmethod
    def prepare(t, decay_rate, step_offset, eps):
        return 1 - (t - step_offset) ** -decay_rate, (eps if eps > 0 else epsilon())

    @staticmethod
    def reduce(g, x, eps, convention):
        if convention == "torch":
            return abs2(g)
        return abs2(g) + eps

    @staticmethod
    def finish(total, count, v, rho, convention):
        v = rho * v + (1.0 - rho) * (total / count if count > 0.0 else 0.0)  # (an empty array's units)
        if convention == "torch":
            return v, count, v
        return 1.0 / math.sqrt(v), count, v

    @staticmethod
    def step(g, x, convention, floor, factor_rows, factor_cols, factor_batch, n_rows, n_cols, n_batch):
        if convention == "torch":
            if n_rows == 1 and n_cols == n_batch:  # unfactored: the estimate is v_row
                return g / max(sqrt(factor_rows), floor)
            return g / sqrt(max(factor_rows * factor_cols / max(factor_batch, floor), floor * floor))
        # g / sqrt(v_row * v_col / v_mean)
        return g * (factor_rows * factor_cols) / factor_batch


class ScaleByParamBlockRMS(Rule):
    """Scale by the RMS of the parameter array (optax's ``scale_by_param_block_rms``):
    ``d = g * max(sqrt(mean(|x|^2)), min_scale)``, Adafactor's relative step size.

    Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018, section 8.
    https://arxiv.org/abs/1804.04235
    Examples
    --------
    >>> x = np.array([3.0, 4.0]); state = no.setup(no.chain(no.ScaleByParamBlockRMS(), no.Descent(0.1)), x)
    >>> state, x = no.update_(state, x, np.array([1.0, 0.0]))   # rms(x) = 3.5355
    >>> print(x.round(4))
    [2.6464 4.    ]
    """
    min_scale = hyper(1e-3, low=0.0)
    reduce_ops = ("sum", "sum")
    finals = ("scale",)
    torch = "(none)"
    optax = "scale_by_param_block_rms(min_scale)"

    @staticmethod
    def reduce(g, x):
        return abs2(x), 1.0

    @staticmethod
    def finish(total, count, min_scale):
        rms = math.sqrt(total / count) if count > 0.0 else 0.0
        return (min_scale if rms <= min_scale else rms,)

    @staticmethod
    def step(g, x, scale):
        return g * scale


def Adafactor(lr=None, min_dim_size_to_factor=128, decay_rate=0.8, decay_offset=0.0,
              multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=None, weight_decay_rate=None,
              eps=None, factored=True, *, min_scale=1e-3, convention="optax"):
    """Adafactor (optax's ``adafactor``, the same arguments): the chain ``ScaleByFactoredRMS(decay_rate,
    decay_offset, eps, factored=, min_dim_size_to_factor=)``, ``ClipByBlockRMS(clipping_threshold)`` (unless
    None), ``Descent(lr)`` (unless None: then the step is the relative step alone), ``ScaleByParamBlockRMS(min_scale)``
    (when ``multiply_by_parameter_scale``), ``EMA(momentum, debias=False)`` (unless None) and
    ``WeightDecay(weight_decay_rate)`` (unless None). ``eps`` defaults to 1e-30.

    ``convention="torch"`` is ``torch.optim.Adafactor(lr, beta2_decay=-decay_rate, eps=(eps, min_scale),
    d=clipping_threshold, weight_decay=weight_decay_rate)``: the second moment factored over the last two axes
    (``ScaleByFactoredRMS(convention="torch")``, ``eps=None`` the machine epsilon), the clip, the step size
    ``min(lr, 1/sqrt(t))`` (:class:`numbaopt.inverse_sqrt`; ``lr`` defaults to 1e-2) times ``max(min_scale,
    rms(x))`` and the decoupled decay ``lr * weight_decay_rate * x``; ``momentum`` and ``decay_offset`` must be
    left at their defaults there.

    Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
    https://arxiv.org/abs/1804.04235
    Examples
    --------
    >>> x = np.ones((2, 3)); state = no.setup(no.Adafactor(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [[0.7399 0.7399 0.7399]
     [0.7399 0.7399 0.7399]]
    >>> rule = no.Adafactor(lr=0.01, convention="torch")   # torch.optim.Adafactor(params, lr=0.01)
    """
    if convention == "torch":
        return _torch_adafactor(lr, decay_rate, decay_offset, multiply_by_parameter_scale, clipping_threshold,
                                momentum, weight_decay_rate, eps, factored, min_scale)
    if convention != "optax":
        raise ValueError(f"Adafactor: convention={convention!r}; expected 'optax' or 'torch'")
    members = [ScaleByFactoredRMS(decay_rate, decay_offset, 1e-30 if eps is None else eps, factored=factored,
                                  min_dim_size_to_factor=min_dim_size_to_factor)]
    if clipping_threshold is not None:
        members.append(ClipByBlockRMS(clipping_threshold))
    if lr is not None:
        members.append(Descent(lr))
    if multiply_by_parameter_scale:
        members.append(ScaleByParamBlockRMS(min_scale))
    if momentum is not None:
        members.append(EMA(momentum, debias=False))
    if weight_decay_rate is not None:
        members.append(WeightDecay(weight_decay_rate))
    return chain(*members)


def _torch_adafactor(lr, decay_rate, decay_offset, multiply_by_parameter_scale, clipping_threshold, momentum,
                     weight_decay_rate, eps, factored, min_scale):
    bad = [n for n, v, d in (("momentum", momentum, None), ("decay_offset", decay_offset, 0.0),
                             ("multiply_by_parameter_scale", multiply_by_parameter_scale, True)) if v != d]
    if bad:
        raise ValueError(f"Adafactor(convention='torch'): {', '.join(bad)} has no torch.optim.Adafactor "
                         "counterpart; leave it at its default")
    lr = 1e-2 if lr is None else lr
    if not isinstance(lr, numbers.Real) or isinstance(lr, bool):
        raise TypeError(f"Adafactor(convention='torch'): lr must be a number (the step size is min(lr, 1/sqrt(t))), "
                        f"got {lr!r}")
    members = [ScaleByFactoredRMS(decay_rate, 0.0, 0.0 if eps is None else eps, factored=factored,
                                  convention="torch")]
    if clipping_threshold is not None:
        members.append(ClipByBlockRMS(clipping_threshold))
    members += [Descent(inverse_sqrt(lr)), ScaleByParamBlockRMS(min_scale)]
    if weight_decay_rate:
        members.append(WeightDecay(lr * weight_decay_rate))
    return chain(*members)


class NovoGrad(Rule):
    """NovoGrad (optax's ``novograd``): a second moment per layer (array), ``nu = b2*nu + (1-b2)*||g||^2``
    (``nu = ||g||^2`` at the first step), and ``m = b1*m + g / (sqrt(nu + eps_root) + eps) + weight_decay*x``,
    ``d = lr * m``.

    Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive Moments for Training of Deep
    Networks", 2019. https://arxiv.org/abs/1905.11286
    Examples
    --------
    >>> x = np.array([3.0, 4.0]); state = no.setup(no.NovoGrad(lr=0.1), x)
    >>> state, x = no.update_(state, x, np.array([3.0, 4.0]))   # ||g|| = 5: m = g / 5
    >>> print(x.round(4))
    [2.94 3.92]
    """
    lr = hyper(1e-3, low=0.0)
    beta1 = hyper(0.9, low=0.0, high=1.0, high_open=True)
    beta2 = hyper(0.25, low=0.0, high=1.0, high_open=True)
    eps = hyper(1e-6, low=0.0)
    eps_root = hyper(0.0, low=0.0)
    weight_decay = hyper(0.0, low=0.0)
    m = state(0.0)
    nu = state(0.0, real=True, axis="batch")
    axes = ("batch",)
    reduce_ops = ("sum",)
    finals = ("denom",)
    scalars = ("first",)
    geometry = staticmethod(whole_leaf)
    torch = "(none)"
    optax = "novograd(lr, b1, b2, eps, eps_root, weight_decay)"

    @staticmethod
    def prepare(t):
        return (1.0 if t <= 1 else 0.0,)

    @staticmethod
    def reduce(g, x):
        return abs2(g)

    @staticmethod
    def finish(total, count, nu, beta2, eps, eps_root, first):
        nu = total if first != 0.0 else beta2 * nu + (1.0 - beta2) * total
        return math.sqrt(nu + eps_root) + eps, nu

    @staticmethod
    def step(g, x, m, lr, beta1, weight_decay, denom_batch):
        m = beta1 * m + g / denom_batch + weight_decay * x
        return lr * m, m
