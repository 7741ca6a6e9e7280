"""Rules whose evaluation parameters differ from the trained ones: schedule-free learning and parameter
averaging (Polyak / EMA / SWA). Each keeps the difference between the sequence it evaluates at and the
parameters it trains as per-element state ``s`` (zero at setup: no copy of the model is taken), and defines
``evaluate``, which :func:`numbaopt.eval_params` applies. Their per-leaf scalars (schedule-free's weight sum)
are per-unit state of an axis reduction over the whole leaf (:func:`numbaopt.rules.base.whole_leaf`).
"""
from __future__ import annotations

from .adaptive import RMSProp
from .base import Rule, hyper, option, state, whole_leaf
from .basic import Descent, WeightDecay
from .chain import chain

__all__ = ["ScheduleFree", "ScheduleFreeSGD", "ScheduleFreeAdamW", "ParamAverage"]


class ScheduleFree(Rule):
    """Schedule-free averaging of the rule before it (optax's ``contrib.schedule_free``), last in a chain: the
    members before it step ``z`` (``z = z - g``, their step ``g``), the evaluation point ``x`` averages the ``z``
    with weights ``c = lr_max^p / sum(lr_max^p)`` (``lr_max`` the largest ``lr`` so far), and the parameters move
    to the gradient point ``y``: ``x = (1 - c)*x + c*z``, ``y = b1*x + (1 - b1)*z``, ``d = y_old - y``. The state
    keeps ``s = z - y``; evaluate the model at ``x = y - (1 - b1)/b1 * s`` (:func:`numbaopt.eval_params`).

    ``lr`` is the learning rate of the members before it (give both the same schedule); it sets the weights
    only. optax evaluates a schedule for the weights one count later than for the step.

    Defazio et al., "The Road Less Scheduled", 2024. https://arxiv.org/abs/2405.15682
    Examples
    --------
    >>> x = np.array([1.0, -2.0]); rule = no.chain(no.Descent(0.1), no.ScheduleFree(lr=0.1))
    >>> state = no.setup(rule, x)
    >>> for _ in range(3): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(x.round(4), no.eval_params(state, x).round(4))
    [ 0.631  -1.2621] [ 0.6459 -1.2917]
    """
    lr = hyper(1.0, low=0.0, doc="the learning rate of the members before it (sets the averaging weights)")
    b1 = hyper(0.9, low=0.0, high=1.0, low_open=True, doc="the interpolation between x and z in y")
    weight_lr_power = hyper(2.0, low=0.0, doc="the weights are lr_max ** weight_lr_power")
    s = state(0.0)
    weight_sum = state(0.0, real=True, axis="batch")
    max_lr = state(0.0, real=True, axis="batch")
    axes = ("batch",)
    finals = ("c",)
    geometry = staticmethod(whole_leaf)
    torch = "(schedulefree.SGDScheduleFree / AdamWScheduleFree wrap their own base)"
    optax = "contrib.schedule_free(base, learning_rate, b1, weight_lr_power)"

    @staticmethod
    def finish(count, weight_sum, max_lr, lr, weight_lr_power):
        max_lr = max(max_lr, lr)
        weight = max_lr ** weight_lr_power
        total = weight_sum + weight
        return (weight / total if total > 0.0 else 0.0), total, max_lr

    @staticmethod
    def step(g, x, s, b1, c_batch):
        z = x + s - g
        xe = x - (1 - b1) / b1 * s
        xe = (1 - c_batch) * xe + c_batch * z
        y = b1 * xe + (1 - b1) * z
        return x - y, z - y

    @staticmethod
    def evaluate(x, s, b1):
        return x - (1 - b1) / b1 * s


def ScheduleFreeSGD(lr=1.0, b1=0.9, weight_decay=None, weight_lr_power=2.0):
    """Schedule-free SGD (optax's ``contrib.schedule_free_sgd``): ``chain(WeightDecay(weight_decay),
    Descent(lr), ScheduleFree(lr, b1, weight_lr_power))``; the decay is scaled by lr, as in optax and PyTorch.
    A warmup is a schedule for ``lr`` (``numbaopt.warmup_constant``). Evaluate at :func:`numbaopt.eval_params`.

    Defazio et al., "The Road Less Scheduled", 2024. https://arxiv.org/abs/2405.15682
    Examples
    --------
    >>> x = np.array([1.0, 2.0, 3.0]); state = no.setup(no.ScheduleFreeSGD(0.25), x)
    >>> for _ in range(5): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(round(float((no.eval_params(state, x) ** 2).sum()), 4))   # f at the evaluation point
    0.2159
    """
    members = [WeightDecay(weight_decay)] if weight_decay is not None else []
    return chain(*members, Descent(lr), ScheduleFree(lr, b1, weight_lr_power))


def ScheduleFreeAdamW(lr=0.0025, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, weight_lr_power=2.0):
    """Schedule-free AdamW (optax's ``contrib.schedule_free_adamw``): ``chain(RMSProp(1, b2, eps,
    bias_correction=True), WeightDecay(weight_decay), Descent(lr), ScheduleFree(lr, b1, weight_lr_power))``: the
    bias-corrected RMS scaling (Adam without momentum: the averaging replaces it), decoupled decay scaled by lr.

    Defazio et al., "The Road Less Scheduled", 2024. https://arxiv.org/abs/2405.15682
    Examples
    --------
    >>> x = np.array([1.0, 2.0, 3.0]); state = no.setup(no.ScheduleFreeAdamW(1.0), x)
    >>> for _ in range(5): state, x = no.update_(state, x, 2 * x)   # the gradient of sum(x**2)
    >>> print(round(float((no.eval_params(state, x) ** 2).sum()), 2))
    0.41
    """
    return chain(RMSProp(1.0, b2, eps, bias_correction=True), WeightDecay(weight_decay), Descent(lr),
                 ScheduleFree(lr, b1, weight_lr_power))


class ParamAverage(Rule):
    """Averaged parameters for evaluation (torch's ``swa_utils.AveragedModel``), last in a chain: the trained
    parameters move as the members before it say (``d = g``), and ``a``, the average of the parameters after each
    step, is kept as ``s = a - x``. ``kind="swa"``: the plain mean of every step's parameters (Polyak averaging,
    SWA); ``kind="ema"``: ``a = decay*a + (1 - decay)*x`` from the first step's parameters on (torch's
    ``get_ema_multi_avg_fn(decay)``). Evaluate the model at ``a = x + s`` (:func:`numbaopt.eval_params`).

    Polyak and Juditsky, "Acceleration of Stochastic Approximation by Averaging", 1992; Izmailov et al.,
    "Averaging Weights Leads to Wider Optima and Better Generalization", 2018. https://arxiv.org/abs/1803.05407
    Examples
    --------
    >>> x = np.array([4.0]); state = no.setup(no.chain(no.Descent(1.0), no.ParamAverage()), x)
    >>> for g in ([1.0], [1.0], [1.0]): state, x = no.update_(state, x, np.array(g))   # x: 3, 2, 1
    >>> print(x, no.eval_params(state, x))
    [1.] [2.]
    """
    decay = hyper(0.999, low=0.0, high=1.0, high_open=True, doc="the EMA's decay (kind='ema')")
    kind = option("swa", choices=("swa", "ema"))
    s = state(0.0)
    scalars = ("keep",)
    torch = "swa_utils.AveragedModel(model) (kind='swa'); AveragedModel(model, multi_avg_fn=" \
            "get_ema_multi_avg_fn(decay)) (kind='ema')"
    optax = "(none: optax.ema averages updates)"

    @staticmethod
    def prepare(t, decay, kind):
        if t <= 1:
            return (0.0,)  # the first step's parameters start the average
        if kind == "swa":
            return ((t - 1) / t,)
        return (decay,)

    @staticmethod
    def step(g, x, s, keep):
        # the new average minus the new parameters, a' - x' = keep * (a - x') with x' = x - g and a = x + s
        return g, keep * (s + g)

    @staticmethod
    def evaluate(x, s):
        return x + s
