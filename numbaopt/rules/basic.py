"""Plain descent, momentum and weight decay: the rules with at most one state array."""
from __future__ import annotations

from .base import Rule, hyper, option, state, UNIT
from .ops import one_minus_pow

__all__ = ["Descent", "Momentum", "Nesterov", "WeightDecay", "Trace", "EMA"]


class Descent(Rule):
    """Plain gradient descent: ``d = lr * g``.

    Robbins and Monro, "A Stochastic Approximation Method", 1951. https://doi.org/10.1214/aoms/1177729586
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Descent(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.512 -1.024]
    """
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

    Polyak, "Some methods of speeding up the convergence of iteration methods", 1964.
    https://doi.org/10.1016/0041-5553(64)90137-5
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Momentum(lr=0.1, momentum=0.9), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.062 -0.124]
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

    Nesterov, 1983; in this form Sutskever, Martens, Dahl and Hinton, "On the importance of initialization and
    momentum in deep learning", ICML 2013. https://proceedings.mlr.press/v28/sutskever13.html
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Nesterov(lr=0.1, momentum=0.9), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [-0.1084  0.2167]
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
    """L2 weight decay: ``d = g + weight_decay * x`` (put it before the main rule in a chain).

    Krogh and Hertz, "A Simple Weight Decay Can Improve Generalization", NeurIPS 1991.
    https://papers.nips.cc/paper/1991/hash/8eefcfdf5990e441f0fb6f3fad709e21-Abstract.html
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.WeightDecay(0.1), no.Descent(0.5)), x)
    >>> for _ in range(2): state, x = no.update_(state, x, np.zeros(2))   # no gradient: x * (1 - 0.05)
    >>> print(x.round(4))
    [ 0.9025 -1.805 ]
    """
    weight_decay = hyper(5e-4, low=0.0)
    torch = "the weight_decay argument of most torch optimisers"
    optax = "add_decayed_weights(weight_decay)"

    @staticmethod
    def step(g, x, weight_decay):
        return g + weight_decay * x


class Trace(Rule):
    """Momentum trace without a learning rate (optax's ``trace``): ``m = g + momentum*m``;
    ``d = m``, or ``g + momentum*m`` with ``nesterov=True``. Used by LARS.

    Polyak, "Some methods of speeding up the convergence of iteration methods", 1964.
    https://doi.org/10.1016/0041-5553(64)90137-5
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.Trace(0.5), no.Descent(0.1)), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.302 -0.604]
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


class EMA(Rule):
    """Exponential moving average of the updates (optax's ``ema``): ``m = (1-decay)*g + decay*m``;
    ``d = m / (1 - decay^t)``, or ``d = m`` with ``debias=False`` (``Trace`` accumulates without the
    ``1-decay``).

    Kingma and Ba, "Adam: A Method for Stochastic Optimization", 2015, sec. 3 (the debiased moving average).
    https://arxiv.org/abs/1412.6980
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.EMA(0.5), no.Descent(0.1)), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.4808 -0.9615]
    """
    decay = hyper(0.9, **UNIT)
    debias = option(True)
    m = state(0.0)
    scalars = ("bc",)
    torch = "(none: torch.optim.swa_utils averages parameters, not updates)"
    optax = "ema(decay, debias)"

    @staticmethod
    def prepare(t, decay):
        return (one_minus_pow(decay, t),)

    @staticmethod
    def step(g, x, m, decay, debias, bc):
        m = (1 - decay) * g + decay * m
        if debias:
            return m / bc, m
        return m, m
