"""Plain descent, momentum and weight decay: the rules with at most one state array."""
from __future__ import annotations

from .base import Rule, hyper, option, state, UNIT

__all__ = ["Descent", "Momentum", "Nesterov", "WeightDecay", "Trace"]


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

    ``lr_outside=True`` is torch's/optax's form ``v = momentum * v + g; d = lr * v``: the same for a
    constant lr, different when lr is scheduled (the velocity then remembers unscaled gradients).
    """
    lr = hyper(0.01, low=0.0)
    momentum = hyper(0.9, **UNIT)
    lr_outside = option(False, doc="torch/optax convention: the velocity accumulates g, lr scales it")
    v = state(0.0)
    torch = "SGD(lr, momentum, dampening=0): lr_outside=True (equal to the default for constant lr)"
    optax = "sgd(lr, momentum): lr_outside=True (equal to the default for constant lr)"

    @staticmethod
    def step(g, x, v, lr, momentum, lr_outside):
        if lr_outside:
            v = momentum * v + g
            return lr * v, v
        v = momentum * v + lr * g
        return v, v


class Nesterov(Rule):
    """Nesterov momentum: ``d = -mu^2 * v + (1 + mu) * lr * g`` with the old v; ``v = mu * v - lr * g``.

    ``lr_outside=True`` is torch's/optax's form ``v = mu * v + g; d = lr * (g + mu * v)``: the same for
    a constant lr, different when lr is scheduled.
    """
    lr = hyper(0.001, low=0.0)
    momentum = hyper(0.9, **UNIT)
    lr_outside = option(False, doc="torch/optax convention: the velocity accumulates g, lr scales the step")
    v = state(0.0)
    torch = "SGD(lr, momentum, nesterov=True, dampening=0): lr_outside=True (equal to the default for constant lr)"
    optax = "sgd(lr, momentum, nesterov=True): lr_outside=True (equal to the default for constant lr)"

    @staticmethod
    def step(g, x, v, lr, momentum, lr_outside):
        if lr_outside:
            v = momentum * v + g
            return lr * (g + momentum * v), v
        d = -(momentum * momentum) * v + (1 + momentum) * lr * g
        return d, momentum * v - lr * g


class WeightDecay(Rule):
    """L2 weight decay: ``d = g + weight_decay * x`` (put it before the main rule in a chain)."""
    weight_decay = hyper(5e-4, low=0.0)
    torch = "the weight_decay argument of most torch optimisers"
    optax = "add_decayed_weights(weight_decay)"

    @staticmethod
    def step(g, x, weight_decay):
        return g + weight_decay * x


class Trace(Rule):
    """Momentum trace without a learning rate (optax's ``trace``): ``m = g + momentum*m``;
    ``d = m``, or ``g + momentum*m`` with ``nesterov=True``. Used by LARS.
    """
    momentum = hyper(0.9, **UNIT)
    nesterov = option(False)
    m = state(0.0)
    torch = "(the momentum buffer of SGD, dampening=0)"
    optax = "trace(decay=momentum, nesterov)"

    @staticmethod
    def step(g, x, m, momentum, nesterov):
        m = g + momentum * m
        if nesterov:
            return g + momentum * m, m
        return m, m
