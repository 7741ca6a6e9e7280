"""Learning-rate-free rules (D-Adaptation, Prodigy) and the scalar state of reductions they are written with.

Each against an independent float64 NumPy reference of the published algorithm over a list of leaves (the estimate
is tree-wide: one inner product and one l1 norm over every leaf) and against optax 0.2.8 in float64, over one array
and over a nested model; ``update`` and ``update_`` agree bitwise; the estimate is one number for the whole tree
(equal to stepping the leaves concatenated); the state survives checkpoints; and the places without scalar state
(GPU, minimize, AccumGrad, a member after Prodigy, malformed definitions) refuse clearly.
"""
import math

import numpy as np
import pytest

import numbaopt as no
from numbaopt.rules.ops import absval, sqrt
from test_rules_recent import a2, draw, run_optax, f64_count

N_STEPS = 25
F64_TOL = 1e-10
OPTAX_TOL = 1e-12


# ---- references: over a list of leaves, the estimate shared --------------------------------------------------------
def vdot(a, b):
    return sum(float(np.sum((np.conj(x) * y).real)) for x, y in zip(a, b))


def l1(a):
    return sum(float(np.abs(x).sum()) for x in a)


def r_dadapt(xs0, grads, lr=1.0, b1=0.9, b2=0.999, eps=1e-8, d0=1e-6, wd=0.0):
    """Defazio and Mishchenko 2023, Algorithm (AdamW form) as optax's dadapt_adamw states it; ``lr(t)`` a number or
    a function of the step t."""
    xs = [x.astype(np.result_type(x, np.float64)) for x in xs0]
    m = [np.zeros_like(x) for x in xs]
    v = [np.zeros(x.shape) for x in xs]
    s = [np.zeros_like(x) for x in xs]
    d, r, c = d0, 0.0, math.sqrt(b2)
    for t, gs in enumerate(grads, start=1):
        gs = [g.astype(x.dtype) for x, g in zip(xs, gs)]
        L = lr(t) if callable(lr) else lr
        dlr = d * L * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        inner = vdot(gs, [sk / (np.sqrt(vk) + eps) for sk, vk in zip(s, v)])
        m = [b1 * mk + (1 - b1) * dlr * g for mk, g in zip(m, gs)]
        v = [b2 * vk + (1 - b2) * a2(g) for vk, g in zip(v, gs)]
        s = [c * sk + (1 - c) * dlr * g for sk, g in zip(s, gs)]
        r = c * r + (1 - c) * dlr * inner
        den = l1(s)
        xs = [x - (mk / (np.sqrt(vk) + eps) + wd * dlr * x) for x, mk, vk in zip(xs, m, v)]
        d = max(d, r / ((1 - c) * den)) if den > 0 else d
    return xs, d


def r_prodigy(xs0, grads, lr=1.0, b1=0.9, b2=0.999, b3=None, eps=1e-8, d0=1e-6, coef=1.0, wd=0.0, safeguard=False):
    """Mishchenko and Defazio 2024, Algorithm 4 (Adam form) as optax's prodigy states it."""
    b3 = math.sqrt(b2) if b3 is None else b3
    xs = [x.astype(np.result_type(x, np.float64)) for x in xs0]
    x0 = [x.copy() for x in xs]
    m = [np.zeros_like(x) for x in xs]
    v = [np.zeros(x.shape) for x in xs]
    s = [np.zeros_like(x) for x in xs]
    d, r = d0, 0.0
    for t, gs in enumerate(grads, start=1):
        gs = [g.astype(x.dtype) for x, g in zip(xs, gs)]
        L = lr(t) if callable(lr) else lr
        dlr = d * L * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        r = b3 * r + (d / d0) * dlr * vdot(gs, [a - b for a, b in zip(x0, xs)])
        m = [b1 * mk + (1 - b1) * d * g for mk, g in zip(m, gs)]
        v = [b2 * vk + (1 - b2) * d * d * a2(g) for vk, g in zip(v, gs)]
        s = [b3 * sk + (d if safeguard else dlr) * d / d0 * g for sk, g in zip(s, gs)]
        den = l1(s)
        d_new = max(d, coef * r / den) if den > 0 else d
        xs = [x - dlr * (mk / (np.sqrt(vk) + d_new * eps) + wd * x) for x, mk, vk in zip(xs, m, v)]
        d = d_new
    return xs, d


# (id, rule, reference keywords for r_*, optax maker)
CASES = [
    ("DAdaptAdamW", no.DAdaptAdamW(), r_dadapt, {}, lambda o: o.contrib.dadapt_adamw()),
    ("DAdaptAdamW-wd", no.DAdaptAdamW(0.5, beta1=0.8, weight_decay=0.1, d0=1e-3), r_dadapt,
     dict(lr=0.5, b1=0.8, wd=0.1, d0=1e-3),
     lambda o: o.contrib.dadapt_adamw(0.5, betas=(0.8, 0.999), weight_decay=0.1, estim_lr0=1e-3)),
    ("Prodigy", no.Prodigy(), r_prodigy, {}, lambda o: o.contrib.prodigy()),
    ("Prodigy-options", no.Prodigy(0.7, beta3=0.9, d_coef=2.0, weight_decay=0.05, d0=1e-3), r_prodigy,
     dict(lr=0.7, b3=0.9, coef=2.0, wd=0.05, d0=1e-3),
     lambda o: o.contrib.prodigy(0.7, beta3=0.9, estim_lr_coef=2.0, weight_decay=0.05, estim_lr0=1e-3)),
    ("Prodigy-safeguard", no.Prodigy(safeguard_warmup=True, d0=1e-2), r_prodigy, dict(safeguard=True, d0=1e-2),
     lambda o: o.contrib.prodigy(safeguard_warmup=True, estim_lr0=1e-2)),
]
IDS = [c[0] for c in CASES]


def data(dtype, shapes=((23,),), seed=0):
    """Parameters, and gradients with a steady direction plus noise (the distance estimate grows)."""
    rng = np.random.default_rng(seed)
    xs = [draw(rng, sh, dtype) for sh in shapes]
    base = [draw(rng, sh, dtype) for sh in shapes]
    return xs, [[(b + 0.5 * draw(rng, sh, dtype)).astype(dtype) for b, sh in zip(base, shapes)]
                for _ in range(N_STEPS)]


def leaf(state, *path):
    for k in path:
        state = state[k]
    return state


def check_close(got, expect, dtype):
    if np.dtype(dtype) == np.float32:
        np.testing.assert_allclose(got, expect, rtol=2e-3, atol=2e-4)
    else:
        np.testing.assert_allclose(got, expect, rtol=F64_TOL, atol=F64_TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_one_array_matches_reference_and_optax_and_paths_agree_bitwise(case, dtype):
    _, rule, ref, kw, make_tx = case
    (x0,), grads = data(dtype)
    s1, x1 = no.setup(rule, x0), x0.copy()
    s2, x2 = no.setup(rule, x0), x0.copy()
    for (g,) in grads:
        s1, x1 = no.update_(s1, x1, g)
        s2, x2 = no.update(s2, x2, g)
        assert x1.tobytes() == x2.tobytes()
    for a, b in zip(s1.arrays, s2.arrays):
        assert a.tobytes() == b.tobytes()
    assert x1.dtype == np.dtype(dtype) and s1.state["d"].shape == ()
    assert s1.state["d"].dtype == np.dtype(dtype).type(0).real.dtype  # float32 stays float32
    (expect,), d = ref([x0], [list(g) for g in grads], **kw)
    assert np.abs(x1 - x0).max() > 0 and d > 1.5 * kw.get("d0", 1e-6)  # the estimate grew: the test can fail
    check_close(x1, expect, dtype)
    assert math.isclose(float(s1.state["d"]), d, rel_tol=1e-3 if dtype == np.float32 else 1e-10)
    if dtype == np.float64:
        np.testing.assert_allclose(x1, run_optax(make_tx, x0, [g for (g,) in grads]), rtol=OPTAX_TOL, atol=OPTAX_TOL)


SHAPES = ((3, 4), (5,), (2, 3, 2))


def as_model(xs):
    return {"enc": {"w": xs[0], "b": xs[1]}, "dec": [xs[2]]}


def leaves_of(m):
    return [m["enc"]["w"], m["enc"]["b"], m["dec"][0]]


@pytest.mark.parametrize("inplace", [True, False], ids=["update_", "update"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_one_estimate_over_a_nested_model_matches_reference_and_optax(case, inplace):
    _, rule, ref, kw, make_tx = case
    xs, grads = data(np.float64, SHAPES, seed=3)
    model = as_model([x.copy() for x in xs])
    state = no.setup(rule, model)
    for gs in grads:
        state, model = (no.update_ if inplace else no.update)(state, model, as_model(gs))
    expect, d = ref(xs, grads, **kw)
    for got, e in zip(leaves_of(model), expect):
        np.testing.assert_allclose(got, e, rtol=F64_TOL, atol=F64_TOL)
    # every leaf keeps the same copy of the tree's estimate
    ds = [float(leaf(state, *p).state["d"]) for p in (("enc", "w"), ("enc", "b"), ("dec", 0))]
    assert ds[0] == ds[1] == ds[2] and math.isclose(ds[0], d, rel_tol=1e-10)
    opt = run_optax(make_tx, as_model(xs), [as_model(gs) for gs in grads])
    for got, e in zip(leaves_of(model), leaves_of(opt)):
        np.testing.assert_allclose(got, e, rtol=OPTAX_TOL, atol=OPTAX_TOL)


@pytest.mark.parametrize("case", CASES[::2], ids=IDS[::2])
def test_the_tree_steps_as_its_leaves_concatenated(case):
    rule = case[1]
    xs, grads = data(np.float64, SHAPES, seed=5)
    model, flat = as_model([x.copy() for x in xs]), np.concatenate([x.ravel() for x in xs])
    st, sf = no.setup(rule, model), no.setup(rule, flat)
    for gs in grads:
        st, model = no.update_(st, model, as_model(gs))
        sf, flat = no.update_(sf, flat, np.concatenate([g.ravel() for g in gs]))
    np.testing.assert_allclose(np.concatenate([x.ravel() for x in leaves_of(model)]), flat, rtol=1e-12, atol=1e-14)


def test_leaves_of_two_dtypes_share_one_estimate():
    rng = np.random.default_rng(7)
    model = {"a": rng.standard_normal(6), "b": rng.standard_normal(4).astype(np.float32)}
    state = no.setup(no.Prodigy(), model)
    for _ in range(6):  # a steady direction: the estimate grows
        g = {"a": 1.0 + 0.1 * rng.standard_normal(6), "b": (1.0 + 0.1 * rng.standard_normal(4)).astype(np.float32)}
        state, model = no.update_(state, model, g)
    da, db = float(leaf(state, "a").state["d"]), float(leaf(state, "b").state["d"])
    assert da > 1e-6 and math.isclose(da, db, rel_tol=1e-6)  # one estimate, stored in each leaf's precision
    assert model["b"].dtype == np.float32


def test_a_scheduled_lr_matches_reference_and_optax():
    (x0,), grads = data(np.float64)
    rule = no.Prodigy(lr=no.linear(1.0, 0.1, 20))
    s, x = no.setup(rule, x0), x0.copy()
    for (g,) in grads:
        s, x = no.update_(s, x, g)

    def lr(t):  # no.linear(1, 0.1, 20) at step t: the count t - 1
        return 1.0 + (0.1 - 1.0) * min(t - 1, 20) / 20
    (expect,), _ = r_prodigy([x0], [list(g) for g in grads], lr=lr)
    np.testing.assert_allclose(x, expect, rtol=F64_TOL, atol=F64_TOL)

    def make(o):
        return o.contrib.prodigy(f64_count(o.linear_schedule(1.0, 0.1, 20)))
    np.testing.assert_allclose(x, run_optax(make, x0, [g for (g,) in grads]), rtol=OPTAX_TOL, atol=OPTAX_TOL)


def test_in_a_chain_after_a_global_clip_matches_optax():
    xs, grads = data(np.float64, SHAPES, seed=9)
    model = as_model([x.copy() for x in xs])
    state = no.setup(no.chain(no.ClipGlobalNorm(1.0), no.Prodigy()), model)
    for gs in grads:
        state, model = no.update_(state, model, as_model(gs))
    opt = run_optax(lambda o: o.chain(o.clip_by_global_norm(1.0), o.contrib.prodigy()), as_model(xs),
                    [as_model(gs) for gs in grads])
    for got, e in zip(leaves_of(model), leaves_of(opt)):
        np.testing.assert_allclose(got, e, rtol=OPTAX_TOL, atol=OPTAX_TOL)


def test_a_leaf_without_gradient_keeps_its_copy_and_the_others_step_as_without_it():
    xs, grads = data(np.float64, SHAPES, seed=11)
    model = as_model([x.copy() for x in xs])
    state = no.setup(no.DAdaptAdamW(), model)
    for gs in grads[:10]:
        g = as_model(gs)
        g["dec"][0] = None  # not stepped: its state, its copy of d, unchanged
        state, model = no.update_(state, model, g)
    assert float(leaf(state, "dec", 0).state["d"]) == 1e-6
    expect, _ = r_dadapt(xs[:2], [gs[:2] for gs in grads[:10]])
    np.testing.assert_allclose(model["enc"]["w"], expect[0], rtol=F64_TOL, atol=F64_TOL)
    np.testing.assert_allclose(model["dec"][0], xs[2])


def test_a_large_array_uses_the_threaded_kernel_and_agrees():
    rng = np.random.default_rng(13)
    x0 = rng.standard_normal(300_000)
    grads = [rng.standard_normal(x0.size) for _ in range(4)]
    s1, x1 = no.setup(no.Prodigy(), x0), x0.copy()
    s2, x2 = no.setup(no.Prodigy(), x0), x0.copy()
    for g in grads:
        s1, x1 = no.update_(s1, x1, g)
        s2, x2 = no.update(s2, x2, g)
    assert x1.tobytes() == x2.tobytes()
    (expect,), _ = r_prodigy([x0], [[g] for g in grads])
    np.testing.assert_allclose(x1, expect, rtol=1e-9, atol=1e-12)


def test_checkpoint_and_state_dict_keep_the_estimate(tmp_path):
    xs, grads = data(np.float64, SHAPES, seed=15)
    model = as_model([x.copy() for x in xs])
    state = no.setup(no.Prodigy(), model)
    for gs in grads[:5]:
        state, model = no.update_(state, model, as_model(gs))
    no.save(tmp_path / "p.npz", state)
    back = no.load(tmp_path / "p.npz")
    sd = no.state_dict(state)
    assert np.asarray(sd["leaves"]["['enc']['w']"]["state"]["d"]).shape == ()
    m1, m2 = model, {"enc": {k: v.copy() for k, v in model["enc"].items()}, "dec": [model["dec"][0].copy()]}
    for gs in grads[5:]:
        state, m1 = no.update_(state, m1, as_model(gs))
        back, m2 = no.update_(back, m2, as_model(gs))
    for a, b in zip(leaves_of(m1), leaves_of(m2)):
        assert a.tobytes() == b.tobytes()


def test_changing_lr_is_a_runtime_value():
    (x0,), grads = data(np.float64)
    s, x = no.setup(no.Prodigy(), x0), x0.copy()
    s, x = no.update_(s, x, grads[0][0])
    s = no.adjust(s, lr=0.5)
    s, x = no.update_(s, x, grads[1][0])
    (expect,), _ = r_prodigy([x0], [list(grads[0]), list(grads[1])], lr=lambda t: 1.0 if t == 1 else 0.5)
    np.testing.assert_allclose(x, expect, rtol=F64_TOL, atol=F64_TOL)


# ---- refusals ------------------------------------------------------------------------------------------------------
def test_prodigy_is_the_last_member_of_a_chain():
    with pytest.raises(ValueError, match="Prodigy must be the last member"):
        no.chain(no.Prodigy(), no.Descent(1.0))
    no.chain(no.ClipGrad(1.0), no.Prodigy())  # before it: fine


def test_accumgrad_and_minimize_refuse_scalar_state():
    with pytest.raises(TypeError, match="cannot come before an AccumGrad"):
        no.setup(no.chain(no.DAdaptAdamW(), no.AccumGrad(2), no.Descent(1.0)), np.zeros(3))
    with pytest.raises(TypeError, match="scalar state"):
        no.minimize(lambda x: float(x @ x), np.ones(3), no.Prodigy(), jac=lambda x: 2 * x, maxiter=2)


@pytest.mark.parametrize("beta3", [-0.5, 1.0, float("nan")])
def test_bad_beta3_is_a_value_error(beta3):
    with pytest.raises(ValueError, match="beta3"):
        no.Prodigy(beta3=beta3)


def test_malformed_scalar_state_definitions_fail_at_class_creation():
    with pytest.raises(TypeError, match="need a reduction"):
        class NoReduce(no.Rule):
            d = no.state(1.0, scalar=True)

            @staticmethod
            def step(g, x):
                return g
    with pytest.raises(TypeError, match="takes .*the scalar states"):
        class WrongOrder(no.Rule):
            lr = no.hyper(1.0)
            d = no.state(1.0, scalar=True)
            reduce_ops = ("sum",)
            finals = ("k",)

            @staticmethod
            def reduce(g, x, d):
                return g * d

            @staticmethod
            def finish(total, lr, d):
                return total, d

            @staticmethod
            def step(g, x, k):
                return g * k
    with pytest.raises(ValueError, match="scalar=True"):
        no.state(1.0, scalar=True, axis="rows")


def test_a_user_rule_with_scalar_state_keeps_a_running_maximum():
    """The mechanism on its own: a per-array running max of |g| that the step divides by (leaf scope)."""
    class MaxNormalised(no.Rule):
        peak = no.state(0.0, scalar=True)
        reduce_ops = ("max",)
        finals = ("scale",)

        @staticmethod
        def reduce(g, x, peak):
            return absval(g)

        @staticmethod
        def finish(top, peak, ):
            peak = max(peak, top)
            return (1.0 / peak if peak > 0.0 else 0.0), peak

        @staticmethod
        def step(g, x, scale):
            return g * scale

    model = {"a": np.zeros(3), "b": np.zeros(2)}
    state = no.setup(MaxNormalised(), model)
    peaks = {"a": 0.0, "b": 0.0}
    rng = np.random.default_rng(17)
    for _ in range(5):
        g = {"a": rng.standard_normal(3) * 3, "b": rng.standard_normal(2)}
        before = {k: v.copy() for k, v in model.items()}
        state, model = no.update_(state, model, g)
        for k in model:
            peaks[k] = max(peaks[k], np.abs(g[k]).max())
            np.testing.assert_allclose(model[k], before[k] - g[k] / peaks[k], rtol=1e-15)
            assert float(leaf(state, k).state["peak"]) == peaks[k]
    assert sqrt  # (the names a body may use are importable from numbaopt.rules.ops)


# ---- composed with the rest ----------------------------------------------------------------------------------------
def copy_model(m):
    return {"enc": {k: v.copy() for k, v in m["enc"].items()}, "dec": [m["dec"][0].copy()]}


@pytest.mark.parametrize("inplace", [True, False], ids=["update_", "update"])
def test_skip_nonfinite_leaves_the_estimate_and_everything_else_as_it_was(inplace):
    xs, grads = data(np.float64, SHAPES, seed=21)
    model = as_model([x.copy() for x in xs])
    state = no.setup(no.SkipNonFinite(no.Prodigy()), model)
    step = no.update_ if inplace else no.update
    kept = []
    for k, gs in enumerate(grads[:12]):
        g = as_model([a.copy() for a in gs])
        if k % 4 == 3:
            g["enc"]["b"][1] = np.nan  # the whole tree's step is skipped
        else:
            kept.append(gs)
        d_before = float(leaf(state, "enc", "w").state["d"])
        state, model = step(state, model, g)
        if k % 4 == 3:
            assert float(leaf(state, "enc", "w").state["d"]) == d_before
    expect, d = r_prodigy(xs, kept)
    for got, e in zip(leaves_of(model), expect):
        np.testing.assert_allclose(got, e, rtol=F64_TOL, atol=F64_TOL)
    assert math.isclose(float(leaf(state, "dec", 0).state["d"]), d, rel_tol=1e-10)


def test_a_refused_step_writes_no_scalar_state():
    xs, grads = data(np.float64, SHAPES, seed=23)
    model = as_model([x.copy() for x in xs])
    state = no.setup(no.chain(no.ClipGlobalNorm(1.0), no.DAdaptAdamW()), model)
    for gs in grads[:3]:
        state, model = no.update_(state, model, as_model(gs))
    before = {p: {k: np.array(v, copy=True) for k, v in leaf(state, *p).state.items()}
              for p in (("enc", "w"), ("enc", "b"), ("dec", 0))}
    x_before = copy_model(model)
    bad = as_model([g.copy() for g in grads[3]])
    bad["dec"][0][0] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        no.update_(state, model, bad)
    for p, arrays in before.items():
        for k, v in arrays.items():
            assert np.array_equal(leaf(state, *p).state[k], v), (p, k)
    for a, b in zip(leaves_of(model), leaves_of(x_before)):
        assert a.tobytes() == b.tobytes()


def test_mixed_precision_master_equals_a_float32_run():
    xs, grads = data(np.float32, SHAPES, seed=25)
    m16 = as_model([x.astype(np.float16) for x in xs])
    m32 = as_model([x.astype(np.float16).astype(np.float32) for x in xs])
    s16 = no.setup(no.chain(no.MixedPrecision(np.float32), no.Prodigy()), m16)
    s32 = no.setup(no.Prodigy(), m32)
    for gs in grads[:8]:
        s16, m16 = no.update_(s16, m16, as_model([g.astype(np.float16) for g in gs]))
        s32, m32 = no.update_(s32, m32, as_model([g.astype(np.float16).astype(np.float32) for g in gs]))
    for a, b in zip(leaves_of(m16), leaves_of(m32)):
        assert a.dtype == np.float16 and np.array_equal(a, b.astype(np.float16))
    assert float(leaf(s16, "enc", "w").state["d"]) == float(leaf(s32, "enc", "w").state["d"])


def test_a_frozen_leaf_is_left_out_of_the_estimate():
    xs, grads = data(np.float64, SHAPES, seed=27)
    model = as_model([x.copy() for x in xs])
    state = no.setup(no.Prodigy(), model)
    no.freeze_(state["dec"])
    for gs in grads[:10]:
        state, model = no.update_(state, model, as_model(gs))
    expect, d = r_prodigy(xs[:2], [gs[:2] for gs in grads[:10]])
    for got, e in zip(leaves_of(model)[:2], expect):
        np.testing.assert_allclose(got, e, rtol=F64_TOL, atol=F64_TOL)
    assert np.array_equal(model["dec"][0], xs[2]) and float(leaf(state, "dec", 0).state["d"]) == 1e-6


def test_jit_step_from_user_njit_code_equals_update_():
    from numba import njit
    (x0,), grads = data(np.float64, seed=29)
    step, S, hp = no.jit_step(no.DAdaptAdamW(), x0)

    @njit
    def run(x, gs, S, hp):
        for t in range(gs.shape[0]):
            step(x, gs[t], S, hp, t + 1)

    x1 = x0.copy()
    run(x1, np.array([g for (g,) in grads]), S, hp)
    s, x2 = no.setup(no.DAdaptAdamW(), x0), x0.copy()
    for (g,) in grads:
        s, x2 = no.update_(s, x2, g)
    assert x1.tobytes() == x2.tobytes()


def test_pickle_and_tied_parameters():
    import pickle
    rng = np.random.default_rng(31)
    w = rng.standard_normal((3, 2))
    model = {"a": w, "b": w, "c": rng.standard_normal(4)}  # "a" and "b" are one tied parameter
    state = no.setup(no.Prodigy(), model)
    g = [{"a": 1 + 0.1 * rng.standard_normal((3, 2)), "b": 1 + 0.1 * rng.standard_normal((3, 2)),
          "c": 1 + 0.1 * rng.standard_normal(4)} for _ in range(6)]  # a steady direction: the estimate grows
    for gs in g[:3]:
        state, model = no.update_(state, model, gs)
    back = pickle.loads(pickle.dumps(state))
    m2 = {"a": model["a"].copy(), "c": model["c"].copy()}
    m2["b"] = m2["a"]
    for gs in g[3:]:
        state, model = no.update_(state, model, gs)
        back, m2 = no.update_(back, m2, gs)
    assert model["a"] is model["b"] and m2["a"].tobytes() == model["a"].tobytes()
    assert m2["c"].tobytes() == model["c"].tobytes()
    assert float(back["a"].state["d"]) == float(state["c"].state["d"]) > 1e-6


@pytest.mark.parametrize("inplace", [True, False], ids=["update_", "update"])
def test_after_an_axis_reduction_over_a_tree(inplace):
    """An axis member (Centralize: the mean over all but the leading axis removed) before the tree-wide estimate:
    its phase runs inside the estimate's dry pass, per leaf."""
    rng = np.random.default_rng(33)
    shapes = [(4, 5), (3, 2, 2)]
    xs = [rng.standard_normal(s) for s in shapes]
    base = [rng.standard_normal(s) for s in shapes]
    grads = [[b + 0.3 * rng.standard_normal(b.shape) for b in base] for _ in range(10)]
    model = {"a": xs[0].copy(), "b": xs[1].copy()}
    state = no.setup(no.chain(no.Centralize(), no.DAdaptAdamW()), model)
    for gs in grads:
        state, model = (no.update_ if inplace else no.update)(state, model, {"a": gs[0], "b": gs[1]})

    def centred(g):
        return g - g.mean(axis=tuple(range(1, g.ndim)), keepdims=True)
    expect, d = r_dadapt(xs, [[centred(g) for g in gs] for gs in grads])
    np.testing.assert_allclose(model["a"], expect[0], rtol=F64_TOL, atol=F64_TOL)
    np.testing.assert_allclose(model["b"], expect[1], rtol=F64_TOL, atol=F64_TOL)
    assert math.isclose(float(state["b"].state["d"]), d, rel_tol=1e-10) and d > 1e-6
