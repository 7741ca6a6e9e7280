"""Rules inside a user's @njit code: ``jit_step`` gives a step function, its state and hyperparameters."""
import numpy as np
import pytest
from numba import njit

import numbaopt as no


@njit  # no cache=True: a dispatcher argument (step) misses the cache in every process, adding a file
def user_loop(step, x, g, S, hp, c, lrs, ilr):
    """The documented pattern: the user's own compiled loop (gradient of sum (x - c)^2, a schedule on
    hp[ilr], one rule step per iteration)."""
    for k in range(lrs.shape[0]):
        for i in range(x.shape[0]):
            g[i] = 2 * (x[i] - c[i])
        hp[ilr] = lrs[k]
        status = step(x, g, S, hp, k + 1)
        if status != 0:
            return k
    return lrs.shape[0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_jit_step_in_user_loop_is_bitwise_update_(dtype):
    rule = no.chain(no.WeightDecay(1e-2), no.Adam(0.05))
    c = np.linspace(-1, 1, 16).astype(dtype)
    x0 = np.zeros(16, dtype=dtype)
    lrs = (0.05 / (1 + np.arange(1, 51) / 10)).astype(dtype)

    js = no.jit_step(rule, x0)
    step, S, hp = js
    assert hp.dtype == dtype and all(s.dtype == dtype for s in S)
    x = x0.copy()
    assert user_loop(step, x, np.empty_like(x), S, hp, c, lrs, js.hyper_index("lr")) == 50

    y = x0.copy()
    state = no.setup(rule, y)
    for k in range(50):
        no.adjust_(state, lr=float(lrs[k]))
        state, y = no.update_(state, y, 2 * (y - c))
    assert np.array_equal(x, y)
    assert all(np.array_equal(a, b) for a, b in zip(S, state.arrays))


def test_hyper_index_names_and_errors():
    js = no.jit_step(no.chain(no.WeightDecay(1e-2), no.Adam(0.05)), np.zeros(3))
    assert js.hp[js.hyper_index("weight_decay")] == 1e-2
    assert js.hp[js.hyper_index("lr")] == 0.05
    with pytest.raises(ValueError, match="no hyperparameter 'rate'"):
        js.hyper_index("rate")
    with pytest.raises(TypeError, match="has a stage"):
        no.jit_step(no.AccumGrad(2, no.Adam()), np.zeros(3))
    with pytest.raises(TypeError, match="float16"):
        no.jit_step(no.Adam(), np.zeros(3, np.float16))
