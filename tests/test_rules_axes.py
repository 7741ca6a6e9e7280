"""Axis reductions (per row / column / unit of a leaf): Centralize, AdaptiveGradClip, ScaleByFactoredRMS,
ScaleByParamBlockRMS and Adafactor, and the mechanism itself (a user-defined axis rule).

Each rule against an independent float64 NumPy reference written from the papers and optax's documented
conventions (``np.mean``/``np.linalg.norm`` over axes, not the generated per-unit loops) for 20 steps over a model
of many shapes, in float32, float64 and complex128; against optax 0.2.8 in float64; ``update`` and ``update_``
bitwise equal, a tree bitwise equal to its leaves stepped one by one; save/load; the O(rows + cols) state of
Adafactor on ResNet-18's shapes; the paths that do not take axis reductions yet refuse them clearly.
"""
import math

import numpy as np
import pytest

import numbaopt as no
from numbaopt.rules import Rule, hyper, state
from numbaopt.rules.ops import abs2

N_STEPS = 20
SHAPES = {"w": (6, 9), "b": (9,), "k": (3, 2, 5, 4), "s": (), "row": (1, 7), "t": (4, 1, 3), "e": (0, 3)}


def a2(g):
    return (g * np.conj(g)).real


def model_of(dtype, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    out = {}
    for k, s in shapes.items():
        v = rng.normal(size=s) + (1j * rng.normal(size=s) if np.dtype(dtype).kind == "c" else 0)
        out[k] = np.asarray(v, dtype=dtype)
    return out


# ---- references: f(S, x, g, t) -> (S, d) for one leaf --------------------------------------------------------------
def r_centralize():
    def f(S, x, g, t):
        return S, (g - g.mean(axis=tuple(range(1, g.ndim)), keepdims=True) if g.ndim > 1 else g)
    return f


def _agc_axes(shape):
    nd = len(shape)
    if sum(1 for n in shape if n != 1) <= 1:
        return tuple(range(nd))
    return {2: (0,), 3: (0,), 4: (0, 1, 2), 5: (0, 1, 2, 3)}[nd]


def r_agc(clipping, eps=1e-3):
    """Brock et al. 2021: per unit, g * min(1, clipping * max(||x||, eps) / ||g||) (optax's form, floor 1e-6)."""
    def f(S, x, g, t):
        ax = _agc_axes(x.shape)
        gn = np.sqrt(a2(g).sum(axis=ax, keepdims=True))
        pn = np.sqrt(a2(x).sum(axis=ax, keepdims=True))
        mx = clipping * np.maximum(pn, eps)
        return S, np.where(gn < mx, g, g * (mx / np.maximum(gn, 1e-6)))
    return f


def r_factored(decay_rate=0.8, offset=0.0, eps=1e-30, factored=True, mdf=128):
    """Shazeer and Stern 2018, Algorithm 4 (factored) / 2 (unfactored), with optax's choice of the two largest axes."""
    def f(S, x, g, t):
        rho = 1.0 - (t - offset) ** -decay_rate
        G = a2(g) + eps
        order = np.argsort(x.shape)
        if factored and x.ndim >= 2 and x.shape[order[-2]] >= mdf:
            d1, d0 = int(order[-2]), int(order[-1])
            vr, vc = S.get("vr", 0.0), S.get("vc", 0.0)
            vr = rho * vr + (1 - rho) * G.mean(axis=d0)
            vc = rho * vc + (1 - rho) * G.mean(axis=d1)
            S = {"vr": vr, "vc": vc}
            rm = vr.mean(axis=d1 - 1 if d1 > d0 else d1, keepdims=True)
            return S, g * np.expand_dims((vr / rm) ** -0.5, d0) * np.expand_dims(vc ** -0.5, d1)
        v = rho * S.get("v", 0.0) + (1 - rho) * G
        return {"v": v}, g * v ** -0.5
    return f


def r_param_rms(min_scale=1e-3):
    def f(S, x, g, t):
        rms = math.sqrt(a2(x).mean()) if x.size else 0.0
        return S, g * (min_scale if rms <= min_scale else rms)
    return f


def r_block_rms(threshold):
    def f(S, x, g, t):
        rms = math.sqrt(a2(g).mean()) if g.size else 0.0
        return S, g / max(1.0, rms / threshold)
    return f


def r_scale(c):
    return lambda S, x, g, t: (S, c * g)


def r_ema(decay):
    def f(S, x, g, t):
        m = decay * S.get("m", 0.0) + (1 - decay) * g
        return {"m": m}, m
    return f


def r_decay(wd):
    return lambda S, x, g, t: (S, g + wd * x)


def r_chain(*fs):
    def f(S, x, g, t):
        S = list(S) if S else [{} for _ in fs]
        for i, h in enumerate(fs):
            S[i], g = h(S[i], x, g, t)
        return S, g
    return f


def r_adafactor(lr=None, mdf=128, decay_rate=0.8, clipping=1.0, momentum=None, wd=None, scale=True):
    fs = [r_factored(decay_rate, mdf=mdf)]
    fs += [r_block_rms(clipping)] if clipping is not None else []
    fs += [r_scale(lr)] if lr is not None else []
    fs += [r_param_rms()] if scale else []
    fs += [r_ema(momentum)] if momentum is not None else []
    fs += [r_decay(wd)] if wd is not None else []
    return r_chain(*fs)


def reference_run(ref, model, grads):
    xs = {k: v.astype(np.complex128 if v.dtype.kind == "c" else np.float64) for k, v in model.items()}
    S = {k: {} for k in xs}
    for t, gs in enumerate(grads, start=1):
        for k in xs:
            g = gs[k].astype(xs[k].dtype)
            S[k], d = ref(S[k], xs[k], g, t)
            xs[k] = xs[k] - d
    return xs


def grads_of(model, seed=1, n=N_STEPS):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        gs = {}
        for k, v in model.items():
            g = rng.normal(size=v.shape) + (1j * rng.normal(size=v.shape) if v.dtype.kind == "c" else 0)
            gs[k] = np.asarray(g, dtype=v.dtype)
        out.append(gs)
    return out


CASES = {
    "centralize": (lambda: no.chain(no.Centralize(), no.Descent(0.1)), lambda: r_chain(r_centralize(), r_scale(0.1))),
    "agc": (lambda: no.chain(no.AdaptiveGradClip(0.05), no.Descent(0.1)),
            lambda: r_chain(r_agc(0.05), r_scale(0.1))),
    "factored": (lambda: no.chain(no.ScaleByFactoredRMS(min_dim_size_to_factor=2), no.Descent(0.01)),
                 lambda: r_chain(r_factored(mdf=2), r_scale(0.01))),
    "unfactored": (lambda: no.chain(no.ScaleByFactoredRMS(factored=False, decay_rate=0.5), no.Descent(0.01)),
                   lambda: r_chain(r_factored(0.5, factored=False), r_scale(0.01))),
    "param_rms": (lambda: no.chain(no.ScaleByParamBlockRMS(0.5), no.Descent(0.1)),
                  lambda: r_chain(r_param_rms(0.5), r_scale(0.1))),
    "adafactor": (lambda: no.Adafactor(lr=0.05, min_dim_size_to_factor=3, momentum=0.9, weight_decay_rate=1e-3),
                  lambda: r_adafactor(0.05, mdf=3, momentum=0.9, wd=1e-3)),
    "adafactor_relative": (lambda: no.Adafactor(min_dim_size_to_factor=4, clipping_threshold=None),
                           lambda: r_adafactor(None, mdf=4, clipping=None)),
    "centralize_agc_clip": (lambda: no.chain(no.Centralize(), no.AdaptiveGradClip(0.02), no.ClipGlobalNorm(2.0),
                                             no.Adam(0.01)), None),
}


def _agc_model(model):
    return {k: v for k, v in model.items() if k != "e"} | {"e": np.zeros((0,), model["w"].dtype)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][1] is not None])
def test_against_numpy_reference(case, dtype):
    make, ref = CASES[case]
    model = model_of(dtype)
    grads = grads_of(model)
    state = no.setup(make(), model)
    m = {k: v.copy() for k, v in model.items()}
    for gs in grads:
        state, m = no.update_(state, m, gs)
    want = reference_run(ref(), model, grads)
    tol = 2e-4 if dtype == np.float32 else 1e-10
    for k in model:
        assert m[k].dtype == np.dtype(dtype), k  # float32 stays float32
        np.testing.assert_allclose(m[k], want[k], rtol=tol, atol=tol, err_msg=f"{case} {k}")
    for leaf in (state[k] for k in model):
        for name, a in leaf.state.items():
            real = np.dtype(dtype).type(0).real.dtype
            assert a.dtype in (np.dtype(dtype), real), name


@pytest.mark.parametrize("case", list(CASES))
def test_pure_in_place_and_single_arrays_agree_bitwise(case):
    make = CASES[case][0]
    model = model_of(np.float64, seed=3)
    grads = grads_of(model, seed=4, n=6)
    s_pure, m_pure = no.setup(make(), model), model
    s_in, m_in = no.setup(make(), model), {k: v.copy() for k, v in model.items()}
    singles = {k: (no.setup(make(), v), v.copy()) for k, v in model.items()}
    for gs in grads:
        old, before = m_pure, {k: v.copy() for k, v in m_pure.items()}
        s_pure, m_pure = no.update(s_pure, m_pure, gs)
        for k in before:  # update wrote nothing
            assert np.array_equal(before[k], old[k]), k
        s_in, m_in = no.update_(s_in, m_in, gs)
        for k, (s, x) in singles.items():
            singles[k] = no.update_(s, x, gs[k])
    for k in model:
        assert np.array_equal(m_pure[k], m_in[k]), k
        assert np.array_equal(singles[k][1], m_in[k]), k
        for name, a in s_in[k].state.items():
            assert np.array_equal(a, s_pure[k].state[name]), (k, name)
            assert np.array_equal(a, singles[k][0].state[name]), (k, name)


def test_unit_state_shapes_and_memory_on_resnet18():
    """Adafactor keeps O(rows + cols) per factored matrix: on ResNet-18's parameter shapes (torch layout: conv
    kernels OIHW), fewer than 1/100 of Adam's state values; its state has optax's shapes."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    for cin, cout, n in ((64, 64, 2), (64, 128, 2), (128, 256, 2), (256, 512, 2)):
        for b in range(n):
            c_in = cin if b == 0 else cout
            shapes += [(cout, c_in, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
            if b == 0 and cin != cout:
                shapes += [(cout, cin, 1, 1), (cout,), (cout,)]
    shapes += [(1000, 512), (1000,)]
    model = {f"p{i}": np.zeros(s, np.float32) for i, s in enumerate(shapes)}
    n_params = sum(v.size for v in model.values())
    assert 11_600_000 < n_params < 11_800_000  # ResNet-18: 11.69 M
    ada = no.setup(no.Adafactor(lr=1e-3, min_dim_size_to_factor=32), model)
    adam = no.setup(no.Adam(), model)

    def values(st):
        return sum(a.size for k in model for a in st[k].state.values())
    assert values(adam) == 2 * n_params
    assert values(ada) < n_params / 100
    fc = ada["p%d" % (len(shapes) - 2)].state
    assert fc["v_row"].shape == (1000,) and fc["v_col"].shape == (512,)
    conv = ada["p3"].state  # (64, 64, 3, 3): factored over the two 64s, a batch of 3x3
    assert conv["v_row"].shape == (64, 3, 3) and conv["v_col"].shape == (64, 3, 3) and conv["v_mean"].shape == (3, 3)


def test_save_load_continues_bitwise(tmp_path):
    model = model_of(np.float32, seed=5)
    grads = grads_of(model, seed=6, n=8)
    rule = no.Adafactor(lr=0.1, min_dim_size_to_factor=3, momentum=0.5)
    st, m = no.setup(rule, model), {k: v.copy() for k, v in model.items()}
    single, x = no.setup(rule, model["k"]), model["k"].copy()
    for gs in grads[:4]:
        st, m = no.update_(st, m, gs)
        single, x = no.update_(single, x, gs["k"])
    no.save(tmp_path / "tree.npz", st)
    no.save(tmp_path / "leaf.npz", single)
    st2, m2 = no.load(tmp_path / "tree.npz"), {k: v.copy() for k, v in m.items()}
    single2, x2 = no.load(tmp_path / "leaf.npz"), x.copy()
    for gs in grads[4:]:
        st, m = no.update_(st, m, gs)
        st2, m2 = no.update_(st2, m2, gs)
        single, x = no.update_(single, x, gs["k"])
        single2, x2 = no.update_(single2, x2, gs["k"])
    for k in m:
        assert np.array_equal(m[k], m2[k]), k
    assert np.array_equal(x, x2) and np.array_equal(x, m["k"])


def test_jit_step_takes_the_shape_of_x():
    from numba import njit
    x = model_of(np.float64, seed=7)["w"]
    g = grads_of({"w": x}, seed=8, n=1)[0]["w"]
    step, S, hp = no.jit_step(no.chain(no.Centralize(), no.Descent(1.0)), x)

    @njit
    def run(x1, g1, S, hp):
        return step(x1, g1, S, hp, 1)
    x1 = x.reshape(-1).copy()
    assert run(x1, g.reshape(-1), S, hp) == 0
    np.testing.assert_allclose(x1.reshape(x.shape), x - (g - g.mean(1, keepdims=True)), rtol=1e-14)


def test_paths_without_axis_reductions_refuse_clearly():
    with pytest.raises(TypeError, match="cannot come before an AccumGrad"):  # after it: see test_rules_axes_compose
        no.setup(no.chain(no.Centralize(), no.AccumGrad(2), no.Adam()), np.zeros((3, 3)))
    with pytest.raises(TypeError, match="axis reduction"):
        no.minimize(lambda x: float(x @ x), np.ones(3), no.chain(no.Centralize(), no.Descent(0.1)),
                    jac=lambda x: 2 * x, maxiter=2)
    with pytest.raises(ValueError, match=r"shape \(2, 2, 2, 2, 2, 2\)"):
        no.setup(no.AdaptiveGradClip(), {"w": np.zeros((2,) * 6)})
    with pytest.raises(ValueError, match="min_dim_size_to_factor"):
        no.ScaleByFactoredRMS(min_dim_size_to_factor=-1)


def test_a_user_defined_axis_rule():
    """The docs' example: each column scaled to unit RMS (a per-column reduction with per-column state)."""
    class ColumnNormalise(Rule):
        decay = hyper(0.5, low=0.0, high=1.0)
        seen = state(0.0, real=True, axis="cols")   # per column: the running mean square
        axes = ("cols",)
        reduce_ops = ("sum",)
        finals = ("rms",)

        @staticmethod
        def reduce(g, x):
            return abs2(g)

        @staticmethod
        def finish(total, count, seen, decay):
            seen = decay * seen + (1.0 - decay) * total / count
            return math.sqrt(seen), seen

        @staticmethod
        def step(g, x, rms_cols):
            return g / rms_cols

    x = np.zeros((4, 3))
    st = no.setup(no.chain(ColumnNormalise(), no.Descent(1.0)), x)
    g = np.arange(1.0, 13.0).reshape(4, 3)
    seen = np.zeros(3)
    for _ in range(3):
        before = x.copy()
        st, x = no.update_(st, x, g)
        seen = 0.5 * seen + 0.5 * (g ** 2).mean(axis=0)
        np.testing.assert_allclose(before - x, g / np.sqrt(seen), rtol=1e-14)
    np.testing.assert_allclose(st.state["seen"], seen, rtol=1e-14)
    assert st.state["seen"].shape == (3,)


def test_malformed_axis_rules_fail_at_class_creation():
    with pytest.raises(TypeError, match="count"):
        class NoCount(Rule):
            axes = ("rows",)
            reduce_ops = ("sum",)
            finals = ("m",)

            @staticmethod
            def reduce(g, x):
                return g

            @staticmethod
            def finish(total):
                return (total,)

            @staticmethod
            def step(g, x, m_rows):
                return g - m_rows
    with pytest.raises(TypeError, match="m_rows"):
        class WrongFinal(Rule):
            axes = ("rows",)
            reduce_ops = ("sum",)
            finals = ("m",)

            @staticmethod
            def reduce(g, x):
                return g

            @staticmethod
            def finish(total, count):
                return (total,)

            @staticmethod
            def step(g, x, m):
                return g - m
    with pytest.raises(TypeError, match="same number of unit states"):
        class Uneven(Rule):
            a = state(0.0, axis="rows")
            axes = ("rows", "cols")
            reduce_ops = ("sum",)
            finals = ("m",)

            @staticmethod
            def reduce(g, x):
                return g

            @staticmethod
            def finish(total, count, a):
                return total, a

            @staticmethod
            def step(g, x, m_rows, m_cols):
                return g


# ---- optax 0.2.8, float64 -----------------------------------------------------------------------------------------
def _optax_cases():
    import optax
    from optax._src import factorized
    import jax.numpy as jnp

    def rate(i, e):  # optax's power schedule, in float64 (its own computes in float32 whatever the params)
        return 1.0 - (jnp.asarray(i, jnp.float64) + 1.0) ** (-e)

    def ada(lr=None, mdf=128, clip=1.0, mom=None, wd=None, scale=True, factored=True):
        tx = [factorized.scale_by_factored_rms(factored, 0.8, 0, mdf, 1e-30, decay_rate_fn=rate)]
        tx += [optax.clip_by_block_rms(clip)] if clip is not None else []
        tx += [optax.scale_by_learning_rate(lr, flip_sign=False)] if lr is not None else []
        tx += [optax.scale_by_param_block_rms()] if scale else []
        tx += [optax.ema(mom, debias=False)] if mom is not None else []
        tx += [optax.add_decayed_weights(wd)] if wd is not None else []
        return optax.chain(*tx)
    return {
        "adafactor": (no.Adafactor(lr=0.05, min_dim_size_to_factor=3), ada(0.05, 3)),
        "adafactor_full": (no.Adafactor(lr=0.05, min_dim_size_to_factor=2, momentum=0.9, weight_decay_rate=1e-2),
                           ada(0.05, 2, mom=0.9, wd=1e-2)),
        "adafactor_unfactored": (no.Adafactor(lr=0.01, factored=False, multiply_by_parameter_scale=False),
                                 ada(0.01, factored=False, scale=False)),
        "centralize": (no.chain(no.Centralize(), no.Descent(0.1)),
                       optax.chain(optax.centralize(), optax.scale_by_learning_rate(0.1, flip_sign=False))),
        "agc": (no.chain(no.AdaptiveGradClip(0.05), no.Descent(0.1)),
                optax.chain(optax.adaptive_grad_clip(0.05), optax.scale_by_learning_rate(0.1, flip_sign=False))),
    }


@pytest.mark.parametrize("case", ["adafactor", "adafactor_full", "adafactor_unfactored", "centralize", "agc"])
def test_against_optax(case):
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import optax
    ours, tx = _optax_cases()[case]
    model = {k: v for k, v in model_of(np.float64, seed=9).items() if k != "e"}
    grads = grads_of(model, seed=10)
    p = {k: jnp.asarray(v) for k, v in model.items()}
    os_ = tx.init(p)
    st, m = no.setup(ours, model), {k: v.copy() for k, v in model.items()}
    for gs in grads:
        u, os_ = tx.update({k: jnp.asarray(v) for k, v in gs.items()}, os_, p)
        p = optax.apply_updates(p, jax.tree.map(lambda a: -a, u))
        st, m = no.update_(st, m, gs)
    for k in m:
        np.testing.assert_allclose(m[k], np.asarray(p[k]), rtol=1e-11, atol=1e-13, err_msg=k)


def test_state_dict_holds_the_unit_states_by_shape():
    model = {k: v for k, v in model_of(np.float64, seed=11).items() if k in ("w", "k", "b")}
    grads = grads_of(model, seed=12, n=3)
    rule = no.Adafactor(lr=0.1, min_dim_size_to_factor=3)
    st, m = no.setup(rule, model), {k: v.copy() for k, v in model.items()}
    for gs in grads[:2]:
        st, m = no.update_(st, m, gs)
    sd = no.state_dict(st)
    w = sd["leaves"]["['w']"]["state"]
    assert w["v_row"].shape == (6,) and w["v_col"].shape == (9,) and w["v_mean"].shape == ()
    np.testing.assert_array_equal(w["v_row"], st["w"].state["v_row"])
    back = no.load(sd)
    fresh = no.setup(rule, model)
    no.load_state_dict(fresh, sd)
    outs = []
    for s in (st, back, fresh):
        _, mm = no.update(s, m, grads[2])
        outs.append(mm)
    for k in m:
        assert np.array_equal(outs[0][k], outs[1][k]) and np.array_equal(outs[0][k], outs[2][k]), k
    bad = no.state_dict(st)
    bad["leaves"]["['w']"]["state"]["v_col"] = np.zeros(8)
    with pytest.raises(ValueError, match=r"v_col"):
        no.load(bad)
    one = no.setup(rule, model["k"])
    one, _ = no.update_(one, model["k"].copy(), grads[0]["k"])
    sd1 = no.state_dict(one)
    assert sd1["leaves"][""]["state"]["v_mean"].shape == (3, 2)
    assert np.array_equal(no.load(sd1).state["v_row"], one.state["v_row"])
