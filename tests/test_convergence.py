"""Convergence: every rule at its default hyperparameters on two small problems.

(a) a random 10x10 linear regression ``mean((W x - W' x)^2)`` with a fresh batch of x each step,
    from W = 0: the loss must fall below 1% of its initial value within the stated number of steps;
(b) a quadratic bowl ``0.5*(x0^2 + 10*x1^2)`` from (1, -1): below 1e-4 of its initial value.

The step budgets are about 1.5-2x what the rules need (measured with other seeds), so a rule whose
update is wrong (sign, scale, bias correction) fails them. Gradient transforms (decays, clips, the
momentum trace) run in front of ``Descent()``.
"""
import numpy as np
import pytest

import numbaopt as no

pytestmark = pytest.mark.slow

# name: (rule at defaults, regression budget, bowl budget)
CASES = {
    "Descent": (no.Descent(), 300, 100),
    "Momentum": (no.Momentum(), 300, 150),
    "Nesterov": (no.Nesterov(), 2000, 600),
    "Rprop": (no.Rprop(), 200, 100),
    "RMSProp": (no.RMSProp(), 3000, 2000),
    "Adam": (no.Adam(), 4000, 4000),
    "RAdam": (no.RAdam(), 6000, 5000),
    "AdaMax": (no.AdaMax(), 6000, 3000),
    "OAdam": (no.OAdam(), 3000, 2000),
    "AdaGrad": (no.AdaGrad(), 400, 300),
    "AdaDelta": (no.AdaDelta(), 6000, 3000),
    "AMSGrad": (no.AMSGrad(), 2500, 2500),
    "NAdam": (no.NAdam(), 4000, 4000),
    "AdamW": (no.AdamW(), 4000, 4000),
    "AdaBelief": (no.AdaBelief(), 2000, 1000),
    "Lion": (no.Lion(), 25000, 15000),
    "Yogi": (no.Yogi(), 500, 500),
    "Adan": (no.Adan(), 4000, 2000),
    "Signum": (no.Signum(), 3000, 2000),
    "LAMB": (no.LAMB(), 12000, 8000),
    "LARS": (no.LARS(), 300, 800),
    "Lookahead(Adam)": (no.Lookahead(no.Adam()), 7000, 6000),
    "SkipNonFinite(Adam)": (no.SkipNonFinite(no.Adam()), 4000, 4000),
    "WeightDecay+Descent": (no.chain(no.WeightDecay(), no.Descent()), 300, 100),
    "SignDecay+Descent": (no.chain(no.SignDecay(), no.Descent()), 300, 100),
    "ClipGrad+Descent": (no.chain(no.ClipGrad(), no.Descent()), 300, 100),
    "ClipNorm+Descent": (no.chain(no.ClipNorm(), no.Descent()), 300, 100),
    "ClipGlobalNorm+Descent": (no.chain(no.ClipGlobalNorm(), no.Descent()), 400, 150),
    "Trace+Descent": (no.chain(no.Trace(), no.Descent(0.01)), 300, 150),
    "AccumGrad(2, Adam)": (no.AccumGrad(2, no.Adam()), 8000, 8000),
}


def steps_to_regress(rule, budget, seed):
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal((10, 10))
    w = np.zeros(100)
    s = no.setup(rule, w)
    first = None
    for t in range(budget + 1):
        x = rng.standard_normal((10, 32))  # fresh data every step
        r = (w.reshape(10, 10) - w_true) @ x
        loss = np.mean(r * r)
        first = loss if first is None else first
        if loss < 1e-2 * first:
            return t
        s, w = no.update_(s, w, ((2.0 / r.size) * (r @ x.T)).reshape(-1))
    return None


def steps_to_bowl(rule, budget):
    a = np.array([1.0, 10.0])
    x = np.array([1.0, -1.0])
    s = no.setup(rule, x)
    f0 = 0.5 * np.sum(a * x * x)
    for t in range(budget + 1):
        if 0.5 * np.sum(a * x * x) < 1e-4 * f0:
            return t
        s, x = no.update_(s, x, a * x)
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_converges_at_defaults(name):
    rule, reg_budget, bowl_budget = CASES[name]
    n = steps_to_regress(rule, reg_budget, seed=12345)
    assert n is not None, f"{name}: regression loss not below 1% of its start within {reg_budget} steps"
    n = steps_to_bowl(rule, bowl_budget)
    assert n is not None, f"{name}: bowl not below 1e-4 of its start within {bowl_budget} steps"


def test_the_check_can_fail():
    # gradient descent with lr * curvature > 2 diverges on the bowl; a step of the wrong size fails
    with np.errstate(over="ignore", invalid="ignore"):
        assert steps_to_bowl(no.Descent(0.25), 4000) is None
    assert steps_to_regress(no.Adam(1e-5), 4000, seed=12345) is None
