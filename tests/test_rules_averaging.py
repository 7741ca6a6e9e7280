"""Per-leaf state and evaluation parameters: NovoGrad (a second moment per array), schedule-free SGD / AdamW
and ParamAverage (Polyak / SWA / EMA averaging), and ``numbaopt.eval_params``.

Each against an independent float64 NumPy reference of the paper's formulas (schedule-free keeps ``z`` itself
there, as the paper does, where the rule keeps ``z - y``), against optax 0.2.8 (NovoGrad, schedule-free) and
torch's ``swa_utils.AveragedModel`` (ParamAverage) in float64; pure and in place bitwise equal; a tree with a
tied leaf; save/load of the per-leaf state.
"""
import math

import numpy as np
import pytest

import numbaopt as no

N_STEPS = 20
SHAPES = {"w": (4, 5), "b": (5,), "s": (), "e": (0,)}


def a2(g):
    return (g * np.conj(g)).real


def model_of(dtype, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for k, s in SHAPES.items():
        v = rng.normal(size=s) + (1j * rng.normal(size=s) if np.dtype(dtype).kind == "c" else 0)
        out[k] = np.asarray(v, dtype=dtype)
    return out


def grads_of(model, seed=1, n=N_STEPS):
    rng = np.random.default_rng(seed)
    return [{k: np.asarray(rng.normal(size=v.shape) + (1j * rng.normal(size=v.shape) if v.dtype.kind == "c" else 0),
                           dtype=v.dtype) for k, v in model.items()} for _ in range(n)]


# ---- references: f(S, x, g, t) -> (S, x_new, x_eval) for one leaf ----------------------------------------------
def r_novograd(lr, b1=0.9, b2=0.25, eps=1e-6, wd=0.0):
    """Ginsburg et al. 2019, Algorithm 1 (optax's form: nu starts at ||g_1||^2, m at g_1 / sqrt(nu) + wd*x)."""
    def f(S, x, g, t):
        n2 = float(a2(g).sum())
        nu = n2 if t == 1 else b2 * S["nu"] + (1 - b2) * n2
        m = (0.0 if t == 1 else b1 * S["m"]) + g / (math.sqrt(nu) + eps) + wd * x
        S.update(nu=nu, m=m)
        x = x - lr * m
        return S, x, x
    return f


def r_schedule_free(lr, b1=0.9, power=2.0, wd=0.0, b2=None, eps=1e-8):
    """Defazio et al. 2024, Algorithm 1 (SGD; with ``b2`` the AdamW form: the bias-corrected RMS of g), the
    sequences z (base iterate), x (average) and y (gradient point) kept as the paper keeps them."""
    def f(S, y, g, t):
        if t == 1:
            S.update(z=y.copy(), x=y.copy(), wsum=0.0, lmax=0.0, v=0.0)
        if b2 is not None:
            S["v"] = b2 * S["v"] + (1 - b2) * a2(g)
            u = g / (np.sqrt(S["v"] / (1 - b2 ** t)) + eps) + wd * y
        else:
            u = g + wd * y
        L = lr(t) if callable(lr) else lr
        S["lmax"] = max(S["lmax"], L)
        w = S["lmax"] ** power
        S["wsum"] += w
        c = w / S["wsum"] if S["wsum"] > 0 else 0.0
        S["z"] = S["z"] - L * u
        S["x"] = (1 - c) * S["x"] + c * S["z"]
        y = b1 * S["x"] + (1 - b1) * S["z"]
        return S, y, S["x"]
    return f


def r_average(lr, kind, decay=0.9):
    """SGD with the average of its iterates after every step (SWA: the running mean; EMA from the first)."""
    def f(S, x, g, t):
        x = x - lr * g
        if t == 1:
            S["a"] = x.copy()
        elif kind == "swa":
            S["a"] = S["a"] + (x - S["a"]) / t
        else:
            S["a"] = decay * S["a"] + (1 - decay) * x
        return S, x, S["a"]
    return f


CASES = {
    "novograd": (lambda: no.NovoGrad(0.05, weight_decay=0.01), lambda: r_novograd(0.05, wd=0.01), True),
    "sf_sgd": (lambda: no.ScheduleFreeSGD(0.1, weight_decay=0.01), lambda: r_schedule_free(0.1, wd=0.01), True),
    "sf_sgd_warmup": (lambda: no.ScheduleFreeSGD(no.warmup_constant(0.2, 5), b1=0.8, weight_lr_power=1.0),
                      lambda: r_schedule_free(lambda t: 0.2 * min(t - 1, 5) / 5, b1=0.8, power=1.0), True),
    "sf_adamw": (lambda: no.ScheduleFreeAdamW(0.05, weight_decay=0.01),
                 lambda: r_schedule_free(0.05, wd=0.01, b2=0.999), False),
    "swa": (lambda: no.chain(no.Descent(0.1), no.ParamAverage()), lambda: r_average(0.1, "swa"), True),
    "ema": (lambda: no.chain(no.Descent(0.1), no.ParamAverage(0.9, kind="ema")), lambda: r_average(0.1, "ema"),
            True),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("case", list(CASES))
def test_against_numpy_reference(case, dtype):
    make, ref, cplx = CASES[case]
    if np.dtype(dtype).kind == "c" and not cplx:
        pytest.skip("RMSProp's bias-corrected form is real here (a complex second moment is |g|^2, fine; the "
                    "reference keeps it real too)")
    model = model_of(dtype)
    grads = grads_of(model)
    st, m = no.setup(make(), model), {k: v.copy() for k, v in model.items()}
    f = ref()
    S = {k: {} for k in model}
    xs = {k: v.astype(np.complex128 if v.dtype.kind == "c" else np.float64) for k, v in model.items()}
    ev = {}
    for t, gs in enumerate(grads, start=1):
        st, m = no.update_(st, m, gs)
        for k in model:
            S[k], xs[k], ev[k] = f(S[k], xs[k], gs[k].astype(xs[k].dtype), t)
    got_ev = no.eval_params(st, m)
    tol = 2e-4 if dtype == np.float32 else 1e-10
    for k in model:
        assert m[k].dtype == np.dtype(dtype) and got_ev[k].dtype == np.dtype(dtype), k
        np.testing.assert_allclose(m[k], xs[k], rtol=tol, atol=tol, err_msg=f"{case} {k}")
        np.testing.assert_allclose(got_ev[k], ev[k], rtol=tol, atol=tol, err_msg=f"{case} {k} (eval)")


@pytest.mark.parametrize("case", list(CASES))
def test_pure_in_place_single_and_saved_agree_bitwise(case, tmp_path):
    make = CASES[case][0]
    model = model_of(np.float32, seed=3)
    grads = grads_of(model, seed=4, n=8)
    s_pure, m_pure = no.setup(make(), model), model
    s_in, m_in = no.setup(make(), model), {k: v.copy() for k, v in model.items()}
    singles = {k: (no.setup(make(), v), v.copy()) for k, v in model.items()}
    for i, gs in enumerate(grads):
        s_pure, m_pure = no.update(s_pure, m_pure, gs)
        s_in, m_in = no.update_(s_in, m_in, gs)
        singles = {k: no.update_(s, x, gs[k]) for k, (s, x) in singles.items()}
        if i == 3:  # save and continue from the file
            no.save(tmp_path / "s.npz", s_in)
            s_in = no.load(tmp_path / "s.npz")
    e_pure, e_in = no.eval_params(s_pure, m_pure), no.eval_params(s_in, m_in)
    for k in model:
        assert np.array_equal(m_pure[k], m_in[k]) and np.array_equal(singles[k][1], m_in[k]), k
        assert np.array_equal(e_pure[k], e_in[k]), k
        assert np.array_equal(no.eval_params(singles[k][0], singles[k][1]), e_in[k]), k


def test_eval_params_on_trees():
    """A tied array gets one evaluation array (still tied); leaves of other rules are the model's own; nothing
    is written; mismatches name the path."""
    w = np.ones(3)
    model = {"a": w, "b": [w, np.zeros(2)], "c": np.ones(2)}
    st = no.setup(lambda path, x: no.Adam(0.1) if str(path) == "['c']" else no.ScheduleFreeSGD(0.5), model)
    before = {k: np.array(v, copy=True) for k, v in (("w", w), ("c", model["c"]))}
    st, model = no.update_(st, model, {"a": np.ones(3), "b": [np.ones(3), np.ones(2)], "c": np.ones(2)})
    st, model = no.update_(st, model, {"a": np.ones(3), "b": [np.ones(3), np.ones(2)], "c": np.ones(2)})
    snap = {k: np.array(v, copy=True) for k, v in (("w", model["a"]), ("c", model["c"]))}
    ev = no.eval_params(st, model)
    assert ev["a"] is ev["b"][0]  # tied: one array
    assert not np.array_equal(ev["a"], model["a"])
    assert np.array_equal(model["a"], snap["w"]) and np.array_equal(model["c"], snap["c"])
    assert not np.array_equal(before["w"], model["a"])
    assert ev["c"] is model["c"]  # Adam: evaluated at the trained parameters
    with pytest.raises(ValueError, match=r"model\['a'\]"):
        no.eval_params(st, {"a": np.ones(4), "b": [np.ones(4), model["b"][1]], "c": model["c"]})
    # a chain without evaluation parameters: the model itself
    st2 = no.setup(no.Adam(), {"x": np.ones(2)})
    m2 = {"x": np.ones(2)}
    assert no.eval_params(st2, m2) is m2
    with pytest.raises(TypeError, match="two members"):
        no.eval_params(no.setup(no.chain(no.ScheduleFreeSGD(0.1), no.ParamAverage()), np.ones(2)), np.ones(2))


def test_against_optax():
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import optax
    from optax import contrib
    cases = {
        "novograd": (no.NovoGrad(0.05, 0.8, 0.3, 1e-5, weight_decay=0.01), optax.novograd(0.05, 0.8, 0.3, 1e-5,
                                                                                          weight_decay=0.01)),
        "sf_sgd": (no.ScheduleFreeSGD(0.1, weight_decay=0.01), contrib.schedule_free_sgd(0.1, weight_decay=0.01)),
        "sf_adamw": (no.ScheduleFreeAdamW(0.05, b1=0.95, weight_decay=0.01),
                     contrib.schedule_free_adamw(0.05, b1=0.95, weight_decay=0.01)),
    }
    model = {k: v for k, v in model_of(np.float64, seed=9).items() if k != "e"}
    for name, (ours, tx) in cases.items():
        grads = grads_of(model, seed=10)
        p = {k: jnp.asarray(v) for k, v in model.items()}
        os_ = tx.init(p)
        st, m = no.setup(ours, model), {k: v.copy() for k, v in model.items()}
        for gs in grads:
            u, os_ = tx.update({k: jnp.asarray(v) for k, v in gs.items()}, os_, p)
            p = optax.apply_updates(p, u)
            st, m = no.update_(st, m, gs)
        for k in m:
            np.testing.assert_allclose(m[k], np.asarray(p[k]), rtol=1e-12, atol=1e-13, err_msg=f"{name} {k}")
        if name.startswith("sf"):
            ev, oe = no.eval_params(st, m), contrib.schedule_free_eval_params(os_, p)
            for k in m:
                np.testing.assert_allclose(ev[k], np.asarray(oe[k]), rtol=1e-12, atol=1e-13, err_msg=f"{name} {k}")


@pytest.mark.parametrize("kind", ["swa", "ema"])
def test_param_average_against_torch(kind):
    torch = pytest.importorskip("torch")
    from torch.optim import swa_utils
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3).double()
    avg = swa_utils.AveragedModel(net) if kind == "swa" else \
        swa_utils.AveragedModel(net, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model = {"w": net.weight.detach().numpy().copy(), "b": net.bias.detach().numpy().copy()}
    st = no.setup(no.chain(no.Descent(0.1), no.ParamAverage(0.8, kind=kind)), model)
    rng = np.random.default_rng(1)
    for _ in range(12):
        g = {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=3)}
        net.weight.grad, net.bias.grad = torch.from_numpy(g["w"].copy()), torch.from_numpy(g["b"].copy())
        opt.step()
        avg.update_parameters(net)
        st, model = no.update_(st, model, g)
    ev = no.eval_params(st, model)
    np.testing.assert_allclose(model["w"], net.weight.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(ev["w"], avg.module.weight.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ev["b"], avg.module.bias.detach().numpy(), rtol=1e-12)
