"""Recent adaptive-moment rules (2024): ADOPT and AdEMAMix, elementwise like the Adam family."""
from __future__ import annotations

from .base import Rule, hyper, option, state, UNIT
from .ops import sqrt, abs2, clamp, one_minus_pow

__all__ = ["ADOPT", "AdEMAMix"]


class ADOPT(Rule):
    """ADOPT (optax's ``contrib.adopt``): at t = 1 only ``v = |g|^2`` (``m`` stays 0, ``d = 0``); then
    ``u = clamp(g / max(sqrt(v), eps), -c, c)`` with ``c = (t-1)^clip_exponent`` (no clamp when
    ``use_clipping=False``), ``m = b1*m + (1-b1)*u``, ``v = b2*v + (1-b2)*|g|^2`` (the old ``v`` normalises
    ``g``); ``d = lr * m``, or ``lr * (b1*m + (1-b1)*u)`` with ``nesterov=True``.

    Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal Rate", NeurIPS 2024.
    https://arxiv.org/abs/2411.02853
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.ADOPT(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the first step only measures |g|^2
    >>> print(x.round(4))
    [ 0.9711 -1.971 ]
    """
    lr = hyper(1e-3, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.9999, **UNIT)
    eps = hyper(1e-6, low=0.0)
    clip_exponent = hyper(0.25, low=0.0, doc="the clip value at step t is (t-1)**clip_exponent (optax: count**0.25)")
    nesterov = option(False)
    use_clipping = option(True, doc="clamp the normalised gradient to [-c, c], c = (t-1)**clip_exponent")
    m = state(0.0)
    v = state(0.0, real=True)
    scalars = ("b1", "b2", "clip")
    supports_complex = False  # the clamp orders g
    torch = "(none in torch.optim; the authors' ADOPT(lr, betas, eps, weight_decay=0) and timm's Adopt)"
    optax = "contrib.adopt(lr, b1, b2, eps, nesterov, use_clipping, clip_value_fn=lambda c: c**clip_exponent)"

    @staticmethod
    def prepare(t, beta1, beta2, clip_exponent):
        clip = (t - 1.0) ** clip_exponent
        if t > 1.0:
            return beta1, beta2, clip
        return 1.0, 0.0, clip  # the first step: v = |g|^2, m unchanged

    @staticmethod
    def step(g, x, m, v, lr, eps, nesterov, use_clipping, b1, b2, clip):
        u = g / max(sqrt(v), eps)
        if use_clipping:
            u = clamp(u, -clip, clip)
        m = (1 - b1) * u + b1 * m
        v = (1 - b2) * abs2(g) + b2 * v
        if nesterov:
            return lr * ((1 - b1) * u + b1 * m), m, v
        return lr * m, m, v


class AdEMAMix(Rule):
    """AdEMAMix (optax's ``contrib.ademamix``): ``m1 = b1*m1 + (1-b1)*g`` (fast, bias-corrected),
    ``m2 = b3*m2 + (1-b3)*g`` (slow, not corrected), ``v = b2*v + (1-b2)*|g|^2``;
    ``d = lr * ((m1/(1-b1^t) + alpha*m2) / (sqrt(v/(1-b2^t)) + eps) + wd*x)``. ``alpha`` and ``beta3`` may be
    schedules (the paper warms both up over the run: ``alpha=no.ademamix_alpha(alpha, T)``,
    ``beta3=no.ademamix_beta3(beta3, T)``); a function receives the count ``t - 1``, as optax's.

    Pagliardini, Ablin and Grangier, "The AdEMAMix Optimizer: Better, Faster, Older", 2024.
    https://arxiv.org/abs/2409.03137
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AdEMAMix(lr=0.1, beta3=0.9), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.4276 -1.4223]
    """
    lr = hyper(1e-3, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
    beta3 = hyper(0.9999, **UNIT)
    alpha = hyper(5.0, low=0.0)
    eps = hyper(1e-8, low=0.0)
    weight_decay = hyper(0.0, low=0.0)
    m1 = state(0.0)
    m2 = state(0.0)
    v = state(0.0, real=True)
    scalars = ("bc1", "bc2")
    torch = "(none in torch.optim; the authors' AdEMAMix(lr, betas=(b1, b2, b3), alpha, eps, weight_decay))"
    optax = "contrib.ademamix(lr, b1, b2, b3, alpha, eps, weight_decay) (eps_root=0)"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m1, m2, v, lr, beta1, beta2, beta3, alpha, eps, weight_decay, bc1, bc2):
        m1 = (1 - beta1) * g + beta1 * m1
        m2 = (1 - beta3) * g + beta3 * m2
        v = (1 - beta2) * abs2(g) + beta2 * v
        u = (m1 / bc1 + alpha * m2) / (sqrt(v / bc2) + eps)
        return lr * (u + weight_decay * x), m1, m2, v
