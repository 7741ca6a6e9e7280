"""The update rules. Each is one scalar definition; every kernel is generated from it.

Conventions (see ``docs/rules.md``, generated from these definitions): ``g`` is the incoming gradient,
``x`` the parameter, ``t`` the step count from 1; a rule returns the step ``d`` and the parameter
becomes ``x - d``. In a chain, ``d`` is the next rule's ``g``. For complex parameters ``abs2(g)`` is
``|g|^2`` and second moments stay real. Literals in ``step`` are computed in the parameter's precision.
"""
from __future__ import annotations

from .rule import Rule, hyper, option, state

__all__ = ["Descent", "Momentum", "Nesterov", "RMSProp", "Adam", "AdamW", "AdaGrad", "WeightDecay",
           "ClipGrad"]

_unit = dict(low=0.0, high=1.0, high_open=True)


class Descent(Rule):
    """Plain gradient descent: ``d = lr * g``."""
    lr = hyper(0.1, low=0.0)
    torch = "SGD(lr)"
    optax = "sgd(lr)"

    @staticmethod
    def step(g, x, lr):
        return lr * g


class Momentum(Rule):
    """Classical momentum: ``v = momentum * v + lr * g; d = v``.

    torch puts lr outside (``b = mu*b + g; d = lr*b``): equal for a constant lr.
    """
    lr = hyper(0.01, low=0.0)
    momentum = hyper(0.9, **_unit)
    v = state(0.0)
    torch = "SGD(lr, momentum) (equal for constant lr)"
    optax = "sgd(lr, momentum) (equal for constant lr)"

    @staticmethod
    def step(g, x, v, lr, momentum):
        v = momentum * v + lr * g
        return v, v


class Nesterov(Rule):
    """Nesterov momentum: ``d = -mu^2 * v + (1 + mu) * lr * g`` with the old v; ``v = mu * v - lr * g``."""
    lr = hyper(0.001, low=0.0)
    momentum = hyper(0.9, **_unit)
    v = state(0.0)
    torch = "SGD(lr, momentum, nesterov=True) (equal for constant lr)"
    optax = "sgd(lr, momentum, nesterov=True)"

    @staticmethod
    def step(g, x, v, lr, momentum):
        d = -(momentum * momentum) * v + (1 + momentum) * lr * g
        return d, momentum * v - lr * g


class RMSProp(Rule):
    """RMSProp: ``q = rho*q + (1-rho)*|g|^2``; centred also ``l = rho*l + (1-rho)*g``;
    ``d = lr * g / (sqrt(q - |l|^2) + eps)`` (eps outside the square root).
    """
    lr = hyper(0.001, low=0.0)
    rho = hyper(0.9, **_unit)
    eps = hyper(1e-8, low=0.0)
    centred = option(False)
    q = state(0.0, real=True)
    l = state(0.0, when="centred")
    torch = "RMSprop(lr, alpha=rho, eps, centered)"
    optax = "rmsprop(lr, decay=rho, eps, centered, eps_in_sqrt=False)"

    @staticmethod
    def step(g, x, q, l, lr, rho, eps, centred):
        q = rho * q + (1 - rho) * abs2(g)
        if centred:
            l = rho * l + (1 - rho) * g
            return lr * g / (sqrt(q - abs2(l)) + eps), q, l
        return lr * g / (sqrt(q) + eps), q, l


class Adam(Rule):
    """Adam (Kingma & Ba, 2015): ``m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*|g|^2;
    d = lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    eps = hyper(1e-8, low=0.0)
    m = state(0.0)
    v = state(0.0, real=True)
    scalars = ("bc1", "bc2")
    torch = "Adam(lr, betas, eps)"
    optax = "adam(lr, b1, b2, eps)"

    @staticmethod
    def prepare(t, beta1, beta2):
        return 1.0 - beta1 ** t, 1.0 - beta2 ** t

    @staticmethod
    def step(g, x, m, v, lr, beta1, beta2, eps, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        return lr * (m / bc1) / (sqrt(v / bc2) + eps), m, v


class AdamW(Rule):
    """AdamW: ``a`` = the Adam direction with lr = 1; coupled (torch's AdamW): ``d = lr * (a + wd * x)``;
    ``couple=False``: ``d = lr * a + wd * x``.
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    weight_decay = hyper(0.0, low=0.0)
    eps = hyper(1e-8, low=0.0)
    couple = option(True)
    m = state(0.0)
    v = state(0.0, real=True)
    scalars = ("bc1", "bc2")
    torch = "AdamW(lr, betas, eps, weight_decay) with couple=True"
    optax = "adamw(lr, b1, b2, eps, weight_decay) with couple=True"

    @staticmethod
    def prepare(t, beta1, beta2):
        return 1.0 - beta1 ** t, 1.0 - beta2 ** t

    @staticmethod
    def step(g, x, m, v, lr, beta1, beta2, weight_decay, eps, couple, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        a = (m / bc1) / (sqrt(v / bc2) + eps)
        if couple:
            return lr * (a + weight_decay * x), m, v
        return lr * a + weight_decay * x, m, v


class AdaGrad(Rule):
    """AdaGrad: ``acc = acc + |g|^2`` (starting at eps); ``d = lr * g / (sqrt(acc) + eps)``."""
    lr = hyper(0.1, low=0.0)
    eps = hyper(1e-8, low=0.0)
    acc = state("eps", real=True)
    torch = "Adagrad(lr, eps, initial_accumulator_value=eps)"
    optax = "adagrad(lr, initial_accumulator_value=eps, eps)"

    @staticmethod
    def step(g, x, acc, lr, eps):
        acc = acc + abs2(g)
        return lr * g / (sqrt(acc) + eps), acc


class WeightDecay(Rule):
    """L2 weight decay: ``d = g + weight_decay * x`` (put it before the main rule in a chain)."""
    weight_decay = hyper(5e-4, low=0.0)
    torch = "the weight_decay argument of most torch optimisers"
    optax = "add_decayed_weights(weight_decay)"

    @staticmethod
    def step(g, x, weight_decay):
        return g + weight_decay * x


class ClipGrad(Rule):
    """Elementwise clipping: ``d = clamp(g, -delta, delta)``."""
    delta = hyper(10.0, low=0.0)
    supports_complex = False
    torch = "torch.nn.utils.clip_grad_value_(params, delta)"
    optax = "clip(delta)"

    @staticmethod
    def step(g, x, delta):
        return clamp(g, -delta, delta)
