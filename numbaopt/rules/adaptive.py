"""Adaptive-moment rules: per-element step sizes from running moments of the gradient (the Adam family)."""
from __future__ import annotations

from .base import Rule, hyper, option, state, UNIT
from .ops import sqrt, abs2, absval, one_minus_pow

__all__ = ["RMSProp", "Adam", "AdamW", "AdaGrad", "RAdam", "AdaMax", "OAdam", "AdaDelta", "AMSGrad", "NAdam",
           "AdaBelief", "Yogi", "Adan"]


class RMSProp(Rule):
    """RMSProp: ``q = rho*q + (1-rho)*|g|^2``; centred also ``l = rho*l + (1-rho)*g``;
    ``d = lr * g / (sqrt(q - |l|^2) + eps)`` (eps outside the square root);
    ``eps_in_sqrt=True``: ``d = lr * g / sqrt(q - |l|^2 + eps)`` (optax's default);
    ``bias_correction=True`` divides ``q`` (and ``l``) by ``1 - rho^t`` first (optax's ``scale_by_rms`` option).

    Tieleman and Hinton, Lecture 6.5, 2012. https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.RMSProp(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.3692 -1.3087]
    """
    lr = hyper(0.001, low=0.0)
    rho = hyper(0.9, **UNIT)
    eps = hyper(1e-8, low=0.0)
    centred = option(False)
    eps_in_sqrt = option(False, doc="optax convention: eps added under the square root")
    bias_correction = option(False, doc="divide the moments by 1 - rho^t (optax's scale_by_rms option)")
    q = state(0.0, real=True)
    l = state(0.0, when="centred")
    scalars = ("bc",)
    torch = "RMSprop(lr, alpha=rho, eps, centered) (eps_in_sqrt=False)"
    optax = "rmsprop(lr, decay=rho, eps, centered): eps_in_sqrt=True (optax's default)"

    @staticmethod
    def prepare(t, rho):
        return (one_minus_pow(rho, t),)

    @staticmethod
    def step(g, x, q, l, lr, rho, eps, centred, eps_in_sqrt, bias_correction, bc):
        q = rho * q + (1 - rho) * abs2(g)
        s = q / bc if bias_correction else q
        if centred:
            l = rho * l + (1 - rho) * g
            s = (q - abs2(l)) if not bias_correction else q / bc - abs2(l / bc)
        if eps_in_sqrt:
            return lr * g / sqrt(s + eps), q, l
        return lr * g / (sqrt(s) + eps), q, l


class Adam(Rule):
    """Adam (Kingma & Ba, 2015): ``m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*|g|^2;
    d = lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.

    Kingma and Ba, "Adam: A Method for Stochastic Optimization", 2015. https://arxiv.org/abs/1412.6980
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Adam(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7016 -1.7006]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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

    Loshchilov and Hutter, "Decoupled Weight Decay Regularization", 2019. https://arxiv.org/abs/1711.05101
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AdamW(lr=0.1, weight_decay=0.5), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.575 -1.431]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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

    Duchi, Hazan and Singer, "Adaptive Subgradient Methods...", 2011. https://jmlr.org/papers/v12/duchi11a.html
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AdaGrad(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7805 -1.7758]
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


class RAdam(Rule):
    """Rectified Adam: ``rinf = 2/(1-b2) - 1; r = rinf - 2*t*b2^t/(1-b2^t)``; if ``r > threshold``:
    ``d = lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) * sqrt((r-4)(r-2)rinf / ((rinf-4)(rinf-2)r))``,
    else ``d = lr * m/(1-b1^t)`` (m, v as Adam).

    Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond", 2020. https://arxiv.org/abs/1908.03265
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.RAdam(lr=0.1), x)   # r <= 4 at first: no adaptive term
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.4623 -0.9246]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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

    Kingma and Ba, "Adam: A Method for Stochastic Optimization", 2015, sec. 7. https://arxiv.org/abs/1412.6980
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AdaMax(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7155 -1.7076]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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

    Daskalakis, Ilyas, Syrgkanis and Zeng, "Training GANs with Optimism", 2018. https://arxiv.org/abs/1711.00141
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.OAdam(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.6178 -1.6076]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.5, **UNIT)
    beta2 = hyper(0.9, **UNIT)
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

    Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012. https://arxiv.org/abs/1212.5701
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AdaDelta(rho=0.9, eps=1e-2), x)   # a large eps: visible steps
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.249  -1.1263]
    """
    rho = hyper(0.9, **UNIT)
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

    Reddi, Kale and Kumar, "On the Convergence of Adam and Beyond", 2018. https://arxiv.org/abs/1904.09237
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AMSGrad(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [-0.1621 -0.7829]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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

    Dozat, "Incorporating Nesterov Momentum into Adam", 2016. https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.NAdam(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.6404 -1.6341]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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

    Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the Belief...", 2020. https://arxiv.org/abs/2010.07468
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.AdaBelief(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.6523 -1.6506]
    """
    lr = hyper(0.001, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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


class Yogi(Rule):
    """Yogi (Zaheer et al. 2018, optax's form): ``m = b1*m + (1-b1)*g;
    v = v - (1-b2) * sign(v - |g|^2) * |g|^2; d = lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)``;
    m and v start at ``initial_value``.

    Zaheer et al., "Adaptive Methods for Nonconvex Optimization", 2018.
    https://papers.nips.cc/paper/2018/hash/90365351ccc7437a1309dc64e4db32a3-Abstract.html
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Yogi(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7018 -1.7008]
    """
    lr = hyper(1e-2, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.999, **UNIT)
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

    Xie, Zhou, Li, Lin and Yan, "Adan: Adaptive Nesterov Momentum Algorithm...", 2022. https://arxiv.org/abs/2208.06677
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); state = no.setup(no.Adan(lr=0.1), x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4))
    [ 0.7021 -1.7006]
    """
    lr = hyper(1e-3, low=0.0)
    beta1 = hyper(0.98, **UNIT)
    beta2 = hyper(0.92, **UNIT)
    beta3 = hyper(0.99, **UNIT)
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
