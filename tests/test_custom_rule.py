"""A user's own rule, written outside the package with the same public mechanism as the built-ins."""
import numpy as np
import pytest
from numba import njit

import numbaopt as no
from numbaopt import Rule, hyper, state


class EMAGrad(Rule):
    """Bias-corrected moving average of the gradient: ``m = beta*m + (1-beta)*g; d = lr*m/(1-beta^t)``."""
    lr = hyper(0.1, low=0.0)
    beta = hyper(0.9, low=0.0, high=1.0, high_open=True)
    m = state(0.0)
    scalars = ("bc",)

    @staticmethod
    def prepare(t, beta):
        return (1.0 - beta ** t,)

    @staticmethod
    def step(g, x, m, lr, beta, bc):
        m = beta * m + (1 - beta) * g
        return lr * m / bc, m


def reference(x0, grads, lr, beta, wd=0.0):
    x, m = x0.astype(np.complex128 if np.iscomplexobj(x0) else np.float64), 0.0
    for t, g in enumerate(grads, 1):
        d = g + wd * x
        m = beta * m + (1 - beta) * d
        x = x - lr * m / (1 - beta ** t)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
def test_custom_rule_against_reference(dtype):
    rng = np.random.default_rng(1)
    cplx = np.dtype(dtype).kind == "c"

    def draw():
        return (rng.standard_normal(20) + (1j * rng.standard_normal(20) if cplx else 0)).astype(dtype)

    x0 = draw()
    grads = [draw() for _ in range(25)]
    s, x = no.setup(EMAGrad(0.05, 0.8), x0), x0.copy()
    for g in grads:
        s, x = no.update_(s, x, g)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(x, reference(x0, grads, 0.05, 0.8), rtol=tol, atol=tol)


def test_custom_rule_fuses_with_builtins_and_validates():
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal(9)
    grads = [rng.standard_normal(9) for _ in range(20)]
    s, x = no.setup(no.chain(no.WeightDecay(0.1), EMAGrad(0.05, 0.5)), x0), x0.copy()
    for g in grads:
        s, x = no.update_(s, x, g)
    np.testing.assert_allclose(x, reference(x0, grads, 0.05, 0.5, wd=0.1), rtol=1e-12)
    with pytest.raises(ValueError, match="outside"):
        EMAGrad(beta=1.0)


def test_custom_rule_from_users_njit_loop_matches_update_():
    x0 = np.linspace(-1, 1, 16).astype(np.float32)
    step, S, hp = no.jit_step(EMAGrad(0.1, 0.9), x0)

    @njit
    def loop(x, S, hp, n):
        g = np.empty_like(x)
        for t in range(1, n + 1):
            for i in range(x.shape[0]):
                g[i] = 2 * x[i]  # gradient of sum(x^2)
            step(x, g, S, hp, t)
        return x

    x_jit = loop(x0.copy(), S, hp, 50)
    s, x = no.setup(EMAGrad(0.1, 0.9), x0), x0.copy()
    for _ in range(50):
        s, x = no.update_(s, x, 2 * x)
    assert x_jit.tobytes() == x.tobytes()
    assert np.abs(x).max() < np.abs(x0).max()
