"""Layer-wise trust ratios (one reduction per array): TrustRatio, and LAMB and LARS built from it."""
from __future__ import annotations

import math

from .base import Rule, hyper, state, UNIT
from .basic import Trace, WeightDecay
from .chain import chain
from .ops import sqrt, abs2, one_minus_pow

__all__ = ["TrustRatio", "LAMBDirection", "LAMB", "LARS"]


class TrustRatio(Rule):
    """Layer-wise trust ratio: ``r = trust_coefficient * ||x|| / (||g|| + trust_eps)`` over the array
    (``r = 1`` when either norm is 0); ``d = lr * r * g``. A building block of LAMB and LARS.

    You, Gitman and Ginsburg, "Large Batch Training of Convolutional Networks", 2017.
    https://arxiv.org/abs/1708.03888
    Examples
    --------
    >>> x = np.array([3.0, 4.0]); state = no.setup(no.TrustRatio(lr=0.1), x)   # ||x|| = 5
    >>> state, x = no.update_(state, x, np.array([1.0, 0.0]))   # ||g|| = 1: ratio 5, d = 0.1 * 5 * g
    >>> print(x.round(4))
    [2.5 4. ]
    """
    lr = hyper(1e-3, low=0.0)
    trust_coefficient = hyper(1.0, low=0.0)
    trust_eps = hyper(0.0, low=0.0)
    reduce_ops = ("sum", "sum")
    finals = ("ratio",)
    torch = "(none)"
    optax = "chain(scale_by_trust_ratio(trust_coefficient, eps=trust_eps), scale_by_learning_rate(lr))"

    @staticmethod
    def reduce(g, x):
        return abs2(x), abs2(g)

    @staticmethod
    def finish(xx, gg, trust_coefficient, trust_eps):
        pn = math.sqrt(xx)
        un = math.sqrt(gg)
        if pn == 0.0 or un == 0.0:
            return (1.0,)
        return (trust_coefficient * pn / (un + trust_eps),)

    @staticmethod
    def step(g, x, lr, ratio):
        return lr * ratio * g


class LAMBDirection(Rule):
    """The LAMB direction before its trust ratio: the Adam direction with lr = 1 plus decoupled decay,
    ``d = (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + weight_decay * x``.

    You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", 2020.
    https://arxiv.org/abs/1904.00962
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.LAMBDirection(), no.Descent(0.1)), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7016 -1.7006]
    """
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
    eps = hyper(1e-6, low=0.0)
    weight_decay = hyper(0.0, low=0.0)
    m = state(0.0)
    v = state(0.0, real=True)
    scalars = ("bc1", "bc2")
    torch = "(none)"
    optax = "chain(scale_by_adam(b1, b2, eps), add_decayed_weights(weight_decay))"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, v, beta1, beta2, eps, weight_decay, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        return (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * x, m, v


def LAMB(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
    """LAMB (You et al. 2019, optax's form): ``chain(LAMBDirection(beta1, beta2, eps, weight_decay),
    TrustRatio(lr))``: the Adam direction plus decoupled decay ``u``, scaled per array by
    ``||x|| / ||u||`` and by lr. Same as ``optax.lamb(lr, b1, b2, eps, weight_decay=wd)``.

    You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", 2020.
    https://arxiv.org/abs/1904.00962
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.LAMB(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.5702 -1.5675]
    """
    return chain(LAMBDirection(beta1, beta2, eps, weight_decay), TrustRatio(lr, 1.0, 0.0))


def LARS(lr=1.0, weight_decay=0.0, trust_coefficient=1e-3, eps=0.0, momentum=0.9, nesterov=False):
    """LARS (You et al. 2017, optax's form): ``chain(WeightDecay(weight_decay),
    TrustRatio(lr, trust_coefficient, eps), Trace(momentum, nesterov=nesterov))``: ``u = g + wd*x`` scaled
    per array by ``trust_coefficient * ||x|| / (||u|| + eps)`` and lr, then momentum. Same as
    ``optax.lars(lr, weight_decay, trust_coefficient=..., eps, momentum, nesterov)``.

    You, Gitman and Ginsburg, "Large Batch Training of Convolutional Networks", 2017.
    https://arxiv.org/abs/1708.03888
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.LARS(lr=0.1, trust_coefficient=1.0), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.486 -0.972]
    """
    return chain(WeightDecay(weight_decay), TrustRatio(lr, trust_coefficient, eps),
                 Trace(momentum, nesterov=nesterov))
