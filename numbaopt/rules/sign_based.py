"""Rules driven by the sign of the gradient or of a momentum (Rprop, Lion, Signum) and L1 decay."""
from __future__ import annotations

from .base import Rule, hyper, state, UNIT
from .ops import sign

__all__ = ["Rprop", "Lion", "Signum", "SignDecay"]


class Rprop(Rule):
    """Rprop: per-element step sizes ``eta`` (starting at lr) adapted from the sign of ``s = gp*g``:
    ``eta = min(eta*eta_plus, step_max)`` if s > 0, ``max(eta*eta_minus, step_min)`` if s < 0;
    ``gp = 0 if s < 0 else g``; ``d = eta * sign(gp)``.

    Riedmiller and Braun, "A direct adaptive method for faster backpropagation learning: the RPROP
    algorithm", 1993. https://doi.org/10.1109/ICNN.1993.298623
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Rprop(lr=0.1), x)   # eta grows by 1.2 while the sign holds
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.636 -1.636]
    """
    lr = hyper(1e-3, low=0.0)
    eta_minus = hyper(0.5, low=0.0, high=1.0, low_open=True, doc="shrink factor on a sign change")
    eta_plus = hyper(1.2, low=1.0, doc="growth factor while the sign is kept")
    step_min = hyper(1e-6, low=0.0)
    step_max = hyper(50.0, low=0.0, allow_inf=True, doc="inf: unbounded steps")
    gp = state(0.0)
    eta = state("lr")
    supports_complex = False
    torch = "Rprop(lr, etas=(eta_minus, eta_plus), step_sizes=(step_min, step_max))"
    optax = "rprop(lr, eta_minus, eta_plus, min_step_size=step_min, max_step_size=step_max) lags one step: its " \
            "update at step t is Rprop's step t-1 (0 at t = 1), and 0 where g_t flips sign against it"

    @staticmethod
    def step(g, x, gp, eta, eta_minus, eta_plus, step_min, step_max):
        s = gp * g
        if s > 0:
            eta = min(eta * eta_plus, step_max)
        elif s < 0:
            eta = max(eta * eta_minus, step_min)
        if s < 0:
            gp = g * 0
        else:
            gp = g
        return eta * sign(gp), gp, eta


class Lion(Rule):
    """Lion (Chen et al. 2023, arXiv 2302.06675): ``c = b1*m + (1-b1)*g; d = lr * (sign(c) + wd*x);
    m = b2*m + (1-b2)*g``.

    Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023. https://arxiv.org/abs/2302.06675
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Lion(lr=0.1), x)   # steps of exactly lr
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7 -1.7]
    """
    lr = hyper(1e-4, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.99, **UNIT)
    weight_decay = hyper(0.0, low=0.0, doc="decoupled, scaled by lr as in the paper")
    m = state(0.0)
    supports_complex = False
    torch = "(lion-pytorch Lion(lr, betas, weight_decay))"
    optax = "lion(lr, b1, b2, weight_decay)"

    @staticmethod
    def step(g, x, m, lr, beta1, beta2, weight_decay):
        c = beta1 * m + (1 - beta1) * g
        m = beta2 * m + (1 - beta2) * g
        return lr * (sign(c) + weight_decay * x), m


class Signum(Rule):
    """Signum (Bernstein et al. 2018): ``m = beta*m + (1-beta)*g; d = lr * sign(m)``.

    Bernstein, Wang, Azizzadenesheli and Anandkumar, "signSGD: Compressed Optimisation for Non-Convex
    Problems", 2018. https://arxiv.org/abs/1802.04434
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Signum(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7 -1.7]
    """
    lr = hyper(1e-3, low=0.0)
    beta = hyper(0.9, **UNIT)
    m = state(0.0)
    supports_complex = False
    torch = "(none)"
    optax = "(none; sign of optax.ema)"

    @staticmethod
    def step(g, x, m, lr, beta):
        m = beta * m + (1 - beta) * g
        return lr * sign(m), m


class SignDecay(Rule):
    """L1 decay: ``d = g + weight_decay * sign(x)`` (put it before the main rule).

    Tibshirani, "Regression Shrinkage and Selection via the Lasso", 1996 (the L1 penalty).
    https://doi.org/10.1111/j.2517-6161.1996.tb02080.x
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.chain(no.SignDecay(0.1), no.Descent(1.0)), x)
    >>> for _ in range(2): state, x = no.update_(state, x, np.zeros(2))   # no gradient: 0.1 towards 0 per step
    >>> print(x.round(4))
    [ 0.8 -1.8]
    """
    weight_decay = hyper(1e-3, low=0.0)
    supports_complex = False
    torch = "(none)"
    optax = "(none; add_decayed_weights is L2)"

    @staticmethod
    def step(g, x, weight_decay):
        return g + weight_decay * sign(x)
