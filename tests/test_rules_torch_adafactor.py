"""Adafactor in torch's convention (``Adafactor(convention="torch")``) against ``torch.optim.Adafactor`` itself (CPU,
float64 and float32), over a model of matrices, a batch of matrices, a one-column matrix, a vector and a scalar; and
``inverse_sqrt``, its step size."""
import numpy as np
import pytest

import numbaopt as no

torch = pytest.importorskip("torch")
if not hasattr(torch.optim, "Adafactor"):  # pragma: no cover - torch < 2.5
    pytest.skip("torch.optim.Adafactor needs torch 2.5", allow_module_level=True)

SHAPES = [(6, 5), (4,), (2, 3, 4), (7, 1), ()]
STEPS = 25


def _run(dtype, kw, tkw, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    grads = [[(rng.standard_normal(s) * scale).astype(dtype) for s in SHAPES] for _ in range(STEPS)]
    model = {f"p{i}": x.copy() for i, x in enumerate(xs)}
    state = no.setup(no.Adafactor(convention="torch", **kw), model)
    params = [torch.tensor(x.copy(), requires_grad=True) for x in xs]
    opt = torch.optim.Adafactor(params, **tkw)
    for gs in grads:
        state, model = no.update_(state, model, {f"p{i}": g for i, g in enumerate(gs)})
        for p, g in zip(params, gs):
            p.grad = torch.tensor(g)
        opt.step()
    return xs, [model[f"p{i}"] for i in range(len(SHAPES))], [p.detach().numpy() for p in params]


CASES = [
    ({}, {}),
    (dict(lr=0.05, weight_decay_rate=0.1, clipping_threshold=2.0, eps=1e-3, min_scale=1e-2),
     dict(lr=0.05, weight_decay=0.1, d=2.0, eps=(1e-3, 1e-2))),
    (dict(decay_rate=0.5, factored=True), dict(beta2_decay=-0.5)),
]


@pytest.mark.parametrize("kw,tkw", CASES, ids=["defaults", "options", "decay"])
def test_matches_torch_optim_adafactor_in_float64(kw, tkw):
    xs, got, expect = _run(np.float64, kw, tkw)
    for x0, a, b, shape in zip(xs, got, expect, SHAPES):
        assert a.shape == shape and np.abs(a - x0).max() > 0
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13, err_msg=str(shape))


def test_matches_torch_in_float32_with_gradients_below_the_machine_epsilon_floor():
    """Gradients of 1e-5 make the mean square (1e-10) smaller than float32's epsilon (1.2e-7): torch's floors
    (``max(mean, eps)`` and ``max(v, eps^2)``) decide the step, in the parameters' precision."""
    xs, got, expect = _run(np.float32, {}, {}, scale=1e-5, seed=3)
    for a, b, shape in zip(got, expect, SHAPES):
        assert a.dtype == np.float32
        if shape == (7, 1):  # documented: a one-column matrix steps as unfactored, unlike torch below the floor
            continue
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=str(shape))


def test_arguments_without_a_torch_counterpart_are_refused():
    with pytest.raises(ValueError, match="momentum"):
        no.Adafactor(momentum=0.9, convention="torch")
    with pytest.raises(ValueError, match="convention"):
        no.Adafactor(convention="jax")
    with pytest.raises(TypeError, match="lr must be a number"):
        no.Adafactor(lr=no.linear(1.0, 0.0, 10), convention="torch")


def test_inverse_sqrt_is_min_of_peak_and_rsqrt_t():
    s = no.inverse_sqrt(0.01)
    ts = np.array([1, 100, 10_000, 40_000])
    np.testing.assert_allclose(s.values(ts), np.minimum(0.01, 1 / np.sqrt(ts)))
    assert s(40_000) == 0.005
    with pytest.raises(ValueError):
        no.inverse_sqrt(-1.0)
