"""Learning-rate-free rules: D-Adaptation and Prodigy estimate the distance ``d`` to the solution as they go and
scale an AdamW step by it. The estimate is tree-wide: each step sums two contributions over every leaf (an inner
product and an l1 norm) and renews two scalars, kept as the scalar state of a tree-scope reduction
(``state(scalar=True)``; every leaf stepped keeps a copy, as it keeps its step count). Over one array the tree is
that array. ``lr`` multiplies the estimate (1.0 by default; a schedule is the usual warmup/decay).
"""
from __future__ import annotations

import math

from .base import Rule, hyper, option, state, UNIT
from .ops import sqrt, abs2, absval, conj, real, one_minus_pow

__all__ = ["DAdaptAdamW", "Prodigy"]


class DAdaptAdamW(Rule):
    """D-Adaptation of AdamW (optax's ``contrib.dadapt_adamw``): with ``dlr = d * lr * sqrt(1-b2^t) / (1-b1^t)``
    and ``c = sqrt(b2)``, ``m = b1*m + (1-b1)*dlr*g``, ``v = b2*v + (1-b2)*|g|^2``, ``s = c*s + (1-c)*dlr*g``;
    tree-wide, ``r = c*r + (1-c)*dlr*<g, s_old / (sqrt(v_old) + eps)>`` and ``d = max(d, r / ((1-c)*||s||_1))``;
    the step is ``m / (sqrt(v) + eps) + weight_decay*dlr*x`` (the new ``d`` serves the next step).

    ``d`` starts at ``d0`` (an under-estimate). A zero ``||s||_1`` (every gradient zero so far) keeps ``d``
    (optax's division gives NaN there).

    Defazio and Mishchenko, "Learning-Rate-Free Learning by D-Adaptation", ICML 2023.
    https://arxiv.org/abs/2301.07733
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.DAdaptAdamW(), x)
    >>> for _ in range(50): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4), round(float(state.state["d"]), 4))   # d grew from d0 = 1e-6 to the distance's scale
    [-0.0994 -0.3725] 2.0108
    """
    lr = hyper(1.0, low=0.0, doc="multiplies the estimate d (a schedule: warmup / decay)")
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
    eps = hyper(1e-8, low=0.0)
    d0 = hyper(1e-6, low=0.0, low_open=True, doc="the first estimate of the distance d")
    weight_decay = hyper(0.0, low=0.0)
    m = state(0.0)
    v = state(0.0, real=True)
    s = state(0.0)
    d = state("d0", scalar=True)
    numerator = state(0.0, scalar=True)
    scalars = ("bc", "c")
    reduce_ops = ("sum", "sum")
    finals = ("d_now",)
    scope = "tree"
    torch = "(none in torch.optim; facebookresearch/dadaptation's DAdaptAdam(lr=1.0, decouple=True))"
    optax = "contrib.dadapt_adamw(learning_rate, betas=(beta1, beta2), eps, estim_lr0=d0, weight_decay)"

    @staticmethod
    def prepare(t, beta1, beta2):
        return sqrt(one_minus_pow(beta2, t)) / one_minus_pow(beta1, t), sqrt(beta2)

    @staticmethod
    def reduce(g, x, v, s, d, lr, eps, bc, c):
        dlr = d * lr * bc
        s_new = c * s + (1 - c) * dlr * g
        return (1 - c) * dlr * real(conj(g) * s) / (sqrt(v) + eps), absval(s_new)

    @staticmethod
    def finish(inner, l1, d, numerator, beta2):
        c = math.sqrt(beta2)
        numerator = c * numerator + inner
        d_new = max(d, numerator / ((1 - c) * l1)) if l1 > 0.0 else d
        return d, d_new, numerator

    @staticmethod
    def step(g, x, m, v, s, lr, beta1, beta2, eps, weight_decay, bc, c, d_now):
        dlr = d_now * lr * bc
        m = beta1 * m + (1 - beta1) * dlr * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        s = c * s + (1 - c) * dlr * g
        return m / (sqrt(v) + eps) + weight_decay * dlr * x, m, v, s


class Prodigy(Rule):
    """Prodigy (optax's ``contrib.prodigy``), D-Adaptation with the recent gradients weighted more: with
    ``dlr = d * lr * sqrt(1-b2^t) / (1-b1^t)`` and ``dg = d*g``, ``m = b1*m + (1-b1)*dg``,
    ``v = b2*v + (1-b2)*|dg|^2``, ``s = b3*s + (dlr/d0)*dg`` (``(d/d0)*dg`` with ``safeguard_warmup``); tree-wide,
    ``r = b3*r + (d/d0)*dlr*<g, x0 - x>`` and ``d' = max(d, d_coef * r / ||s||_1)``; the step is
    ``dlr * (m / (sqrt(v) + d'*eps) + weight_decay*x)``. ``beta3 = -1`` (the default) is ``sqrt(beta2)``.

    ``x0 - x`` is kept as state ``p`` (zero at setup, plus each step: no copy of the model), so Prodigy is the last
    member of a chain. A zero ``||s||_1`` keeps ``d`` (optax's division gives NaN there).

    Mishchenko and Defazio, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner", ICML 2024.
    https://arxiv.org/abs/2306.06101
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Prodigy(), x)
    >>> for _ in range(50): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4), round(float(state.state["d"]), 4))   # d grew from d0 = 1e-6 to the distance's scale
    [0.2642 0.1267] 0.7092
    """
    lr = hyper(1.0, low=0.0, doc="multiplies the estimate d (a schedule: warmup / decay)")
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
    beta3 = hyper(-1.0, low=-1.0, high=1.0, high_open=True, doc="the estimate's decay; -1: sqrt(beta2)")
    eps = hyper(1e-8, low=0.0)
    d0 = hyper(1e-6, low=0.0, low_open=True, doc="the first estimate of the distance d")
    d_coef = hyper(1.0, low=0.0, low_open=True, doc="multiplies every new estimate")
    weight_decay = hyper(0.0, low=0.0)
    safeguard_warmup = option(False, doc="leave lr out of s (large steps early in a warmup)")
    m = state(0.0)
    v = state(0.0, real=True)
    s = state(0.0)
    p = state(0.0)
    d = state("d0", scalar=True)
    numerator = state(0.0, scalar=True)
    scalars = ("bc", "b3")
    reduce_ops = ("sum", "sum")
    finals = ("d_now", "d_next")
    scope = "tree"
    last_member = True
    torch = "(none in torch.optim; konstmish/prodigy's Prodigy(lr=1.0, betas, beta3, d0, d_coef, weight_decay))"
    optax = ("contrib.prodigy(learning_rate, betas=(beta1, beta2), beta3, eps, estim_lr0=d0, estim_lr_coef=d_coef, "
             "weight_decay, safeguard_warmup)")

    def validate(self):
        b3 = self._values["beta3"]
        if isinstance(b3, float) and b3 < 0.0 and b3 != -1.0:
            raise ValueError(f"Prodigy: beta3={b3!r}; expected -1 (sqrt(beta2)) or a number in [0, 1)")

    @staticmethod
    def prepare(t, beta1, beta2, beta3):
        return sqrt(one_minus_pow(beta2, t)) / one_minus_pow(beta1, t), (beta3 if beta3 >= 0 else sqrt(beta2))

    @staticmethod
    def reduce(g, x, s, p, d, lr, d0, bc, b3, safeguard_warmup):
        dlr = d * lr * bc
        s_new = b3 * s + ((d if safeguard_warmup else dlr) * d / d0) * g
        return (d / d0) * dlr * real(conj(g) * p), absval(s_new)

    @staticmethod
    def finish(inner, l1, d, numerator, beta2, beta3, d_coef):
        b3 = beta3 if beta3 >= 0.0 else math.sqrt(beta2)
        numerator = b3 * numerator + inner
        d_new = max(d, d_coef * numerator / l1) if l1 > 0.0 else d
        return d, d_new, d_new, numerator

    @staticmethod
    def step(g, x, m, v, s, p, lr, beta1, beta2, eps, d0, weight_decay, safeguard_warmup, bc, b3, d_now, d_next):
        dlr = d_now * lr * bc
        dg = d_now * g
        m = beta1 * m + (1 - beta1) * dg
        v = beta2 * v + (1 - beta2) * abs2(dg)
        s = b3 * s + ((d_now if safeguard_warmup else dlr) / d0) * dg
        u = dlr * (m / (sqrt(v) + d_next * eps) + weight_decay * x)
        return u, m, v, s, p + u
