"""The update rules. Each is one scalar definition; every kernel is generated from it.

Conventions (see ``docs/rules.md``, generated from these definitions): ``g`` is the incoming gradient,
``x`` the parameter, ``t`` the step count from 1; a rule returns the step ``d`` and the parameter
becomes ``x - d``. In a chain, ``d`` is the next rule's ``g``. For complex parameters ``abs2(g)`` is
``|g|^2`` and second moments stay real. Literals in ``step`` are computed in the parameter's precision.
"""
from __future__ import annotations

import math

from .rule import Rule, hyper, option, state

__all__ = ["Descent", "Momentum", "Nesterov", "RMSProp", "Adam", "AdamW", "AdaGrad", "WeightDecay",
           "ClipGrad", "Rprop", "RAdam", "AdaMax", "OAdam", "AdaDelta", "AMSGrad", "NAdam", "AdaBelief", "Lion",
           "SignDecay", "ClipNorm", "ClipGlobalNorm", "Yogi", "Adan", "Signum", "Trace", "TrustRatio",
           "LAMBDirection", "LAMB", "LARS", "LookaheadSync", "Lookahead", "NonFiniteGuard", "SkipNonFinite"]

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

    ``lr_outside=True`` is torch's/optax's form ``v = momentum * v + g; d = lr * v``: the same for a
    constant lr, different when lr is scheduled (the velocity then remembers unscaled gradients).
    """
    lr = hyper(0.01, low=0.0)
    momentum = hyper(0.9, **_unit)
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
    momentum = hyper(0.9, **_unit)
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


class RMSProp(Rule):
    """RMSProp: ``q = rho*q + (1-rho)*|g|^2``; centred also ``l = rho*l + (1-rho)*g``;
    ``d = lr * g / (sqrt(q - |l|^2) + eps)`` (eps outside the square root);
    ``eps_in_sqrt=True``: ``d = lr * g / sqrt(q - |l|^2 + eps)`` (optax's default).
    """
    lr = hyper(0.001, low=0.0)
    rho = hyper(0.9, **_unit)
    eps = hyper(1e-8, low=0.0)
    centred = option(False)
    eps_in_sqrt = option(False, doc="optax convention: eps added under the square root")
    q = state(0.0, real=True)
    l = state(0.0, when="centred")
    torch = "RMSprop(lr, alpha=rho, eps, centered) (eps_in_sqrt=False)"
    optax = "rmsprop(lr, decay=rho, eps, centered): eps_in_sqrt=True (optax's default)"

    @staticmethod
    def step(g, x, q, l, lr, rho, eps, centred, eps_in_sqrt):
        q = rho * q + (1 - rho) * abs2(g)
        s = q
        if centred:
            l = rho * l + (1 - rho) * g
            s = q - abs2(l)
        if eps_in_sqrt:
            return lr * g / sqrt(s + eps), q, l
        return lr * g / (sqrt(s) + eps), q, l


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
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

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
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, v, lr, beta1, beta2, weight_decay, eps, couple, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        a = (m / bc1) / (sqrt(v / bc2) + eps)
        if couple:
            return lr * (a + weight_decay * x), m, v
        return lr * a + weight_decay * x, m, v


class AdaGrad(Rule):
    """AdaGrad: ``acc = acc + |g|^2`` (starting at ``initial_accumulator``, which defaults to eps as in
    Optimisers.jl); ``d = lr * g / (sqrt(acc) + eps)``; ``eps_in_sqrt=True``: ``d = lr * g / sqrt(acc + eps)``.
    """
    lr = hyper(0.1, low=0.0)
    eps = hyper(1e-8, low=0.0)
    initial_accumulator = hyper(1e-8, low=0.0, doc="start of acc; when not given, the value of eps")
    eps_in_sqrt = option(False, doc="optax convention: eps added under the square root")
    acc = state("initial_accumulator", real=True)
    torch = "Adagrad(lr, eps, initial_accumulator_value=a, lr_decay=0): AdaGrad(lr, eps, initial_accumulator=a)"
    optax = "adagrad(lr, initial_accumulator_value=a, eps): AdaGrad(lr, eps, a, eps_in_sqrt=True)"

    def __init__(self, *args, **kwargs):
        # Optimisers.jl starts the accumulator at eps: keep that tie unless it is given explicitly
        if len(args) < 3 and "initial_accumulator" not in kwargs:
            eps = args[1] if len(args) > 1 else kwargs.get("eps", 1e-8)
            if isinstance(eps, (int, float)) and not isinstance(eps, bool):
                kwargs["initial_accumulator"] = eps
        super().__init__(*args, **kwargs)

    @staticmethod
    def step(g, x, acc, lr, eps, eps_in_sqrt):
        acc = acc + abs2(g)
        if eps_in_sqrt:
            return lr * g / sqrt(acc + eps), acc
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


# ---------------------------------------------------------------------------------------------------
# The rest of the catalog (Optimisers.jl's rules, then rules none of Optimisers.jl/optax/torch share)
# ---------------------------------------------------------------------------------------------------

class Rprop(Rule):
    """Rprop: per-element step sizes ``eta`` (starting at lr) adapted from the sign of ``s = gp*g``:
    ``eta = min(eta*eta_plus, step_max)`` if s > 0, ``max(eta*eta_minus, step_min)`` if s < 0;
    ``gp = 0 if s < 0 else g``; ``d = eta * sign(gp)``.
    """
    lr = hyper(1e-3, low=0.0)
    eta_minus = hyper(0.5, low=0.0, high=1.0, low_open=True, doc="shrink factor on a sign change")
    eta_plus = hyper(1.2, low=1.0, doc="growth factor while the sign is kept")
    step_min = hyper(1e-6, low=0.0)
    step_max = hyper(50.0, low=0.0)
    gp = state(0.0)
    eta = state("lr")
    supports_complex = False
    torch = "Rprop(lr, etas=(eta_minus, eta_plus), step_sizes=(step_min, step_max))"
    optax = "rprop(lr, eta_minus, eta_plus, min_step_size=step_min, max_step_size=step_max)"

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


class RAdam(Rule):
    """Rectified Adam: ``rinf = 2/(1-b2) - 1; r = rinf - 2*t*b2^t/(1-b2^t)``; if ``r > threshold``:
    ``d = lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) * sqrt((r-4)(r-2)rinf / ((rinf-4)(rinf-2)r))``,
    else ``d = lr * m/(1-b1^t)`` (m, v as Adam).
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    eps = hyper(1e-8, low=0.0)
    threshold = hyper(4.0, low=4.0, doc="rectify when r exceeds it (Optimisers.jl 4; torch and optax 5)")
    m = state(0.0)
    v = state(0.0, real=True)
    scalars = ("bc1", "bc2", "rect", "use")
    torch = "RAdam(lr, betas, eps): threshold=5 (torch puts eps outside sqrt(v) before the bias correction)"
    optax = "radam(lr, b1, b2, eps, threshold=5): threshold=5 (optax rectifies when r >= 5)"

    @staticmethod
    def prepare(t, beta1, beta2, threshold):
        b2t = beta2 ** t
        rinf = 2.0 / (1.0 - beta2) - 1.0
        r = rinf - 2.0 * t * b2t / (1.0 - b2t)
        if r > threshold:
            rect = sqrt((r - 4.0) * (r - 2.0) * rinf / ((rinf - 4.0) * (rinf - 2.0) * r))
            return one_minus_pow(beta1, t), 1.0 - b2t, rect, 1.0
        return one_minus_pow(beta1, t), 1.0 - b2t, 0.0 * rinf, 0.0

    @staticmethod
    def step(g, x, m, v, lr, beta1, beta2, eps, bc1, bc2, rect, use):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        if use > 0:
            return lr * (m / bc1) / (sqrt(v / bc2) + eps) * rect, m, v
        return lr * (m / bc1), m, v


class AdaMax(Rule):
    """AdaMax: ``m`` as Adam; ``u = max(b2*u, |g|)``; ``d = (lr/(1-b1^t)) * m / (u + eps)``;
    ``eps_in_max=True`` (torch, optax): ``u = max(b2*u, |g| + eps); d = (lr/(1-b1^t)) * m / u``.
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    eps = hyper(1e-8, low=0.0)
    eps_in_max = option(False, doc="torch/optax convention: eps added to |g| inside the max")
    m = state(0.0)
    u = state(0.0, real=True)
    scalars = ("bc1",)
    torch = "Adamax(lr, betas, eps): eps_in_max=True"
    optax = "adamax(lr, b1, b2, eps): eps_in_max=True"

    @staticmethod
    def prepare(t, beta1):
        return (one_minus_pow(beta1, t),)

    @staticmethod
    def step(g, x, m, u, lr, beta1, beta2, eps, eps_in_max, bc1):
        m = beta1 * m + (1 - beta1) * g
        if eps_in_max:
            u = max(beta2 * u, absval(g) + eps)
            return (lr / bc1) * m / u, m, u
        u = max(beta2 * u, absval(g))
        return (lr / bc1) * m / (u + eps), m, u


class OAdam(Rule):
    """Optimistic Adam: ``term = lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)`` (m, v as Adam);
    ``d = 2*term - previous term``.
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.5, **_unit)
    beta2 = hyper(0.9, **_unit)
    eps = hyper(1e-8, low=0.0)
    m = state(0.0)
    v = state(0.0, real=True)
    term = state(0.0)
    scalars = ("bc1", "bc2")
    torch = "(none)"
    optax = "optimistic_adam / optimistic_gradient_descent differ: use OAdam (Optimisers.jl's form)"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, v, term, lr, beta1, beta2, eps, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        prev = term
        term = lr * (m / bc1) / (sqrt(v / bc2) + eps)
        return 2 * term - prev, m, v, term


class AdaDelta(Rule):
    """AdaDelta (no learning rate): ``acc = rho*acc + (1-rho)*|g|^2;
    d = g * sqrt(dacc + eps) / sqrt(acc + eps); dacc = rho*dacc + (1-rho)*|d|^2``.
    """
    rho = hyper(0.9, **_unit)
    eps = hyper(1e-8, low=0.0)
    acc = state(0.0, real=True)
    dacc = state(0.0, real=True)
    torch = "Adadelta(lr=1.0, rho, eps)"
    optax = "adadelta(learning_rate=1.0, rho, eps)"

    @staticmethod
    def step(g, x, acc, dacc, rho, eps):
        acc = rho * acc + (1 - rho) * abs2(g)
        d = g * sqrt(dacc + eps) / sqrt(acc + eps)
        dacc = rho * dacc + (1 - rho) * abs2(d)
        return d, acc, dacc


class AMSGrad(Rule):
    """AMSGrad: m, v as Adam (all three states start at ``initial_value``, Optimisers.jl: eps).
    ``correction="none"`` (Optimisers.jl): ``vhat = max(vhat, v); d = lr * m / (sqrt(vhat) + eps)``;
    ``"torch"``: ``vhat = max(vhat, v); d = lr * (m/(1-b1^t)) / (sqrt(vhat)/sqrt(1-b2^t) + eps)``;
    ``"optax"``: ``vhat = max(vhat, v/(1-b2^t)); d = lr * (m/(1-b1^t)) / (sqrt(vhat) + eps)``.
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    eps = hyper(1e-8, low=0.0)
    initial_value = hyper(1e-8, low=0.0, doc="start of m, v and vhat (Optimisers.jl eps; torch and optax 0)")
    correction = option("none", choices=("none", "torch", "optax"), doc="bias correction convention")
    m = state("initial_value")
    v = state("initial_value", real=True)
    vhat = state("initial_value", real=True)
    scalars = ("bc1", "bc2")
    torch = "Adam(lr, betas, eps, amsgrad=True): correction='torch', initial_value=0"
    optax = "amsgrad(lr, b1, b2, eps): correction='optax', initial_value=0"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, v, vhat, lr, beta1, beta2, eps, correction, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        if correction == "torch":
            vhat = max(vhat, v)
            return lr * (m / bc1) / (sqrt(vhat) / sqrt(bc2) + eps), m, v, vhat
        if correction == "optax":
            vhat = max(vhat, v / bc2)
            return lr * (m / bc1) / (sqrt(vhat) + eps), m, v, vhat
        vhat = max(vhat, v)
        return lr * m / (sqrt(vhat) + eps), m, v, vhat


class NAdam(Rule):
    """Nesterov Adam (Optimisers.jl's form, Dozat's Algorithm 2): m, v as Adam;
    ``d = lr * (b1*m/(1-b1^(t+1)) + (1-b1)*g/(1-b1^t)) / (sqrt(v*b2/(1-b2^t)) + eps)``;
    ``b2_factor=False`` (optax) drops the ``b2`` under the square root.
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    eps = hyper(1e-8, low=0.0)
    b2_factor = option(True, doc="multiply v by b2 under the square root (Optimisers.jl; optax omits it)")
    m = state(0.0)
    v = state(0.0, real=True)
    scalars = ("bc1", "bc1n", "bc2")
    torch = "NAdam differs (momentum decay schedule psi); no exact equivalent"
    optax = "nadam(lr, b1, b2, eps): b2_factor=False"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta1, t + 1.0), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, v, lr, beta1, beta2, eps, b2_factor, bc1, bc1n, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        num = lr * (beta1 * m / bc1n + (1 - beta1) * g / bc1)
        if b2_factor:
            return num / (sqrt(v * beta2 / bc2) + eps), m, v
        return num / (sqrt(v / bc2) + eps), m, v


class AdaBelief(Rule):
    """AdaBelief: ``m = b1*m + (1-b1)*g; s = b2*s + (1-b2)*|g-m|^2 + eps;
    d = lr * (m/(1-b1^t)) / (sqrt(s/(1-b2^t)) + eps)``.
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    eps = hyper(1e-16, low=0.0)
    m = state(0.0)
    s = state(0.0, real=True)
    scalars = ("bc1", "bc2")
    torch = "(adabelief-pytorch AdaBelief(lr, betas, eps, rectify=False, weight_decouple=False))"
    optax = "adabelief(lr, b1, b2, eps, eps_root=eps)"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, s, lr, beta1, beta2, eps, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        s = beta2 * s + (1 - beta2) * abs2(g - m) + eps
        return lr * (m / bc1) / (sqrt(s / bc2) + eps), m, s


class Lion(Rule):
    """Lion (Chen et al. 2023, arXiv 2302.06675): ``c = b1*m + (1-b1)*g; d = lr * (sign(c) + wd*x);
    m = b2*m + (1-b2)*g``.
    """
    lr = hyper(1e-4, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.99, **_unit)
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


class SignDecay(Rule):
    """L1 decay: ``d = g + weight_decay * sign(x)`` (put it before the main rule)."""
    weight_decay = hyper(1e-3, low=0.0)
    supports_complex = False
    torch = "(none)"
    optax = "(none; add_decayed_weights is L2)"

    @staticmethod
    def step(g, x, weight_decay):
        return g + weight_decay * sign(x)


def _norm_ops(rule):
    return ("max",) if rule.p == INF_P else ("sum",)


INF_P = float("inf")


class ClipNorm(Rule):
    """Norm clipping: ``n = ||g||_p`` over the array (p = 1, 2 or inf), ``d = g * min(max_norm / n, 1)``.

    A non-finite ``n`` raises ValueError (nothing is written) unless ``error_if_nonfinite=False``, when
    the step goes ahead with ``min(max_norm/n, 1)`` (NaN or 0, as torch and Optimisers.jl).
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
        n = math.sqrt(total) if p == 2.0 else total
        if not math.isfinite(n) and error_if_nonfinite:
            return 0.0, 1.0
        return min(max_norm / n, 1.0), 0.0

    @staticmethod
    def step(g, x, scale):
        return g * scale


class ClipGlobalNorm(ClipNorm):
    """Global-norm clipping: one norm ``n = ||g||_p`` over every leaf of the tree (or over the array),
    then ``d = g * min(max_norm / n, 1)`` everywhere; non-finite n raises unless disabled.
    """
    max_norm = hyper(1.0, low=0.0)
    scope = "tree"
    torch = "clip_grad_norm_(model.parameters(), max_norm, norm_type=p, error_if_nonfinite)"
    optax = "clip_by_global_norm(max_norm) (p=2; optax never raises: error_if_nonfinite=False)"


class Yogi(Rule):
    """Yogi (Zaheer et al. 2018, optax's form): ``m = b1*m + (1-b1)*g;
    v = v - (1-b2) * sign(v - |g|^2) * |g|^2; d = lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)``;
    m and v start at ``initial_value``.
    """
    lr = hyper(1e-2, low=0.0)
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
    eps = hyper(1e-3, low=0.0)
    initial_value = hyper(1e-6, low=0.0)
    m = state("initial_value")
    v = state("initial_value", real=True)
    scalars = ("bc1", "bc2")
    torch = "(none)"
    optax = "yogi(lr, b1, b2, eps, initial_accumulator_value=initial_value)"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, v, lr, beta1, beta2, eps, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        g2 = abs2(g)
        if v > g2:
            v = v - (1 - beta2) * g2
        elif v < g2:
            v = v + (1 - beta2) * g2
        return lr * (m / bc1) / (sqrt(v / bc2) + eps), m, v


class Adan(Rule):
    """Adan (Xie et al. 2022, the reference implementation's convention): ``diff = g - gp`` (0 at t = 1);
    ``m = b1*m + (1-b1)*g; dm = b2*dm + (1-b2)*diff; n = b3*n + (1-b3)*|g + b2*diff|^2``;
    ``d = lr * ((m/(1-b1^t) + b2*dm/(1-b2^t)) / (sqrt(n/(1-b3^t)) + eps) + wd*x)``; ``gp = g``.
    """
    lr = hyper(1e-3, low=0.0)
    beta1 = hyper(0.98, **_unit)
    beta2 = hyper(0.92, **_unit)
    beta3 = hyper(0.99, **_unit)
    eps = hyper(1e-8, low=0.0)
    weight_decay = hyper(0.0, low=0.0)
    m = state(0.0)
    dm = state(0.0)
    n = state(0.0, real=True)
    gp = state(0.0)
    scalars = ("bc1", "bc2", "bc3", "later")
    torch = "(the Adan reference implementation, no_prox=True)"
    optax = "adan(lr, b1, b2, b3, eps, weight_decay) weights diff by (1-b2) where the reference uses b2: " \
            "no exact equivalent"

    @staticmethod
    def prepare(t, beta1, beta2, beta3):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t), one_minus_pow(beta3, t), min(t - 1.0, 1.0)

    @staticmethod
    def step(g, x, m, dm, n, gp, lr, beta1, beta2, beta3, eps, weight_decay, bc1, bc2, bc3, later):
        diff = (g - gp) * later
        m = beta1 * m + (1 - beta1) * g
        dm = beta2 * dm + (1 - beta2) * diff
        n = beta3 * n + (1 - beta3) * abs2(g + beta2 * diff)
        u = (m / bc1 + beta2 * dm / bc2) / (sqrt(n / bc3) + eps)
        return lr * (u + weight_decay * x), m, dm, n, g


class Signum(Rule):
    """Signum (Bernstein et al. 2018): ``m = beta*m + (1-beta)*g; d = lr * sign(m)``."""
    lr = hyper(1e-3, low=0.0)
    beta = hyper(0.9, **_unit)
    m = state(0.0)
    supports_complex = False
    torch = "(none)"
    optax = "(none; sign of optax.ema)"

    @staticmethod
    def step(g, x, m, lr, beta):
        m = beta * m + (1 - beta) * g
        return lr * sign(m), m


class Trace(Rule):
    """Momentum trace without a learning rate (optax's ``trace``): ``m = g + momentum*m``;
    ``d = m``, or ``g + momentum*m`` with ``nesterov=True``. Used by LARS.
    """
    momentum = hyper(0.9, **_unit)
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


class TrustRatio(Rule):
    """Layer-wise trust ratio: ``r = trust_coefficient * ||x|| / (||g|| + trust_eps)`` over the array
    (``r = 1`` when either norm is 0); ``d = lr * r * g``. A building block of LAMB and LARS.
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
    """
    beta1 = hyper(0.9, **_unit)
    beta2 = hyper(0.999, **_unit)
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
    """
    from .chain import chain
    return chain(LAMBDirection(beta1, beta2, eps, weight_decay), TrustRatio(lr, 1.0, 0.0))


def LARS(lr=1.0, weight_decay=0.0, trust_coefficient=1e-3, eps=0.0, momentum=0.9, nesterov=False):
    """LARS (You et al. 2017, optax's form): ``chain(WeightDecay(weight_decay),
    TrustRatio(lr, trust_coefficient, eps), Trace(momentum, nesterov=nesterov))``: ``u = g + wd*x`` scaled
    per array by ``trust_coefficient * ||x|| / (||u|| + eps)`` and lr, then momentum. Same as
    ``optax.lars(lr, weight_decay, trust_coefficient=..., eps, momentum, nesterov)``.
    """
    from .chain import chain
    return chain(WeightDecay(weight_decay), TrustRatio(lr, trust_coefficient, eps),
                 Trace(momentum, nesterov=nesterov))


class LookaheadSync(Rule):
    """Lookahead's slow weights (Zhang et al. 2019), placed after the inner rule: the fast weights take
    the inner step ``f = x - g``; every ``k``-th step the slow weights move ``s = s + alpha * (f - s)``
    and the parameter is reset to them (``d = x - s``); ``s`` starts at the parameter at step 1.
    """
    k = hyper(5.0, low=1.0, doc="synchronisation period (an integer)")
    alpha = hyper(0.5, low=0.0, high=1.0)
    s = state(0.0)
    scalars = ("first", "sync")
    torch = "(torch-optimizer Lookahead(inner, k, alpha))"
    optax = "lookahead(inner, sync_period=k, slow_step_size=alpha) (optax keeps both weights in the params)"

    def validate(self):
        k = self._values["k"]
        if not isinstance(k, (int, float)) or float(k) != int(k):
            raise ValueError(f"LookaheadSync: k={k!r} must be an integer >= 1")

    @staticmethod
    def prepare(t, k):
        first = 1.0 if t == 1.0 else 0.0
        sync = 1.0 if t % k == 0.0 else 0.0
        return first, sync

    @staticmethod
    def step(g, x, s, alpha, first, sync):
        if first > 0:
            s = x
        if sync > 0:
            s = s + alpha * ((x - g) - s)
            return x - s, s
        return g, s


def Lookahead(rule, k=5, alpha=0.5):
    """Lookahead around ``rule``: ``chain(rule, LookaheadSync(k, alpha))`` (one fused kernel). The
    parameter holds the fast weights between synchronisations, the state the slow weights.
    """
    from .chain import chain
    return chain(rule, LookaheadSync(k, alpha))


class NonFiniteGuard(Rule):
    """Skip the whole step when any gradient element (of the array, or of any leaf of the tree) is NaN
    or Inf: nothing is written, the step count does not advance and the skip is counted
    (``state.skipped``). Otherwise ``d = g``. Use it through :func:`SkipNonFinite`.
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
    """
    from .chain import chain
    return chain(NonFiniteGuard(), rule)
