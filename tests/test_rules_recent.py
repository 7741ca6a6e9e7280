"""The rules of issue 15 that fit the elementwise / per-array-reduction machinery: ADOPT, AdEMAMix, EMA, ZeroNaNs,
KeepParamsNonNegative, NormalizeByUpdateNorm, ClipByBlockRMS, and ClipNorm / ClipGlobalNorm with any p > 0.

Each against an independent float64 NumPy reference of its published formula (written from the papers and optax's
documented conventions, not from the definitions) for 25 steps, in float32, float64 and complex128 where the rule
supports complex numbers (``|g|^2`` convention), and against optax 0.2.8 in float64 (x64 enabled; optax schedules
fed a float64 count, since an int32 count makes them compute in float32). ``update`` and ``update_`` agree bitwise;
each rule also runs in a chain over a nested model, pure and in place.
"""
import math

import numpy as np
import pytest

import numbaopt as no
from numbaopt.rules.ops import INF, abs2, absval, isfinite  # the names OldClipNorm's bodies use

N_STEPS = 25
F64_TOL = 1e-10      # against the NumPy reference (float64 / complex128)
OPTAX_TOL = 1e-12    # against optax in float64


# ---- references: f(S, xs, gs, t) -> (S, ds) over the leaves xs of a model (a list), S a dict ----------------------
def a2(g):
    return (g * np.conj(g)).real


def r_adopt(lr, b1=0.9, b2=0.9999, eps=1e-6, e=0.25, nesterov=False, clip=True):
    """Taniguchi et al. 2024, Algorithm 1 (clipped form); as in optax the first gradient only sets v_0 = g_0^2
    and that call makes no step; the clip at the k-th real step (k = t - 1) is k**e."""
    def f(S, xs, gs, t):
        ds = []
        for i, g in enumerate(gs):
            if t == 1:
                S[i] = (np.zeros_like(g), a2(g))
                ds.append(np.zeros_like(g))
                continue
            m, v = S[i]
            u = g / np.maximum(np.sqrt(v), eps)
            if clip:
                u = np.clip(u, -(t - 1) ** e, (t - 1) ** e)
            m = b1 * m + (1 - b1) * u
            S[i] = (m, b2 * v + (1 - b2) * a2(g))
            ds.append(lr * (b1 * m + (1 - b1) * u) if nesterov else lr * m)
        return S, ds
    return f


def r_ademamix(lr, b1=0.9, b2=0.999, b3=0.9999, alpha=5.0, eps=1e-8, wd=0.0):
    """Pagliardini et al. 2024, Algorithm 1; b3 and alpha are numbers or functions of the step t."""
    def f(S, xs, gs, t):
        B3 = b3(t) if callable(b3) else b3
        A = alpha(t) if callable(alpha) else alpha
        ds = []
        for i, (x, g) in enumerate(zip(xs, gs)):
            m1, m2, v = S.get(i, (0.0, 0.0, 0.0))
            m1 = b1 * m1 + (1 - b1) * g
            m2 = B3 * m2 + (1 - B3) * g
            v = b2 * v + (1 - b2) * a2(g)
            S[i] = (m1, m2, v)
            u = (m1 / (1 - b1 ** t) + A * m2) / (np.sqrt(v / (1 - b2 ** t)) + eps)
            ds.append(lr * (u + wd * x))
        return S, ds
    return f


def r_ema(decay, debias=True):
    def f(S, xs, gs, t):
        ds = []
        for i, g in enumerate(gs):
            m = decay * S.get(i, 0.0) + (1 - decay) * g
            S[i] = m
            ds.append(m / (1 - decay ** t) if debias else m)
        return S, ds
    return f


def r_zero_nans():
    def f(S, xs, gs, t):
        return S, [np.where(np.isnan(g.real) | np.isnan(np.imag(g)), 0.0, g) for g in gs]
    return f


def r_nonneg():
    def f(S, xs, gs, t):
        return S, [x - np.maximum(x - g, 0.0) for x, g in zip(xs, gs)]  # the projection of x - g onto x >= 0
    return f


def r_normalize(scale=1.0, eps=1e-6):
    def f(S, xs, gs, t):
        n = math.sqrt(sum(a2(g).sum() for g in gs))  # one norm over the tree
        return S, [scale * g / (n + eps) for g in gs]
    return f


def pnorm(gs, p):
    a = np.concatenate([np.abs(g).ravel() for g in gs])
    return a.max() if p == math.inf else (a ** p).sum() ** (1 / p)


def r_clip(max_norm, p, tree=False):
    def f(S, xs, gs, t):
        if tree:
            n = pnorm(gs, p)
            return S, [g * min(max_norm / n, 1.0) for g in gs]
        return S, [g * min(max_norm / pnorm([g], p), 1.0) for g in gs]
    return f


def r_block_rms(threshold):
    def f(S, xs, gs, t):  # per leaf: optax's clip_by_block_rms
        return S, [g / max(1.0, math.sqrt(a2(g).mean()) / threshold) for g in gs]
    return f


def r_descent(lr):
    return lambda S, xs, gs, t: (S, [lr * g for g in gs])


def r_adam(lr, b1=0.9, b2=0.999, eps=1e-8):
    def f(S, xs, gs, t):
        ds = []
        for i, g in enumerate(gs):
            m, v = S.get(i, (0.0, 0.0))
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * a2(g)
            S[i] = (m, v)
            ds.append(lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps))
        return S, ds
    return f


def r_weight_decay(wd):
    return lambda S, xs, gs, t: (S, [g + wd * x for x, g in zip(xs, gs)])


def r_chain(*refs):
    def f(S, xs, gs, t):
        for k, r in enumerate(refs):
            S[k], gs = r(S.get(k, {}), xs, gs, t)
        return S, gs
    return f


def run_reference(ref, xs0, grads):
    """``grads``: one list of leaves per step."""
    xs = [x.astype(np.complex128 if np.iscomplexobj(x) else np.float64) for x in xs0]
    S = {}
    for t, gs in enumerate(grads, start=1):
        S, ds = ref(S, xs, [g.astype(x.dtype) for x, g in zip(xs, gs)], t)
        xs = [x - d for x, d in zip(xs, ds)]
    return xs


# ---- optax (float64) -------------------------------------------------------------------------------------------
def _jax():
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")
    jax.config.update("jax_enable_x64", True)
    return jax


def run_optax(make_tx, model, grads):
    jax = _jax()
    import optax
    tm = jax.tree_util.tree_map
    params = tm(jax.numpy.asarray, model)
    tx = make_tx(optax)
    st = tx.init(params)
    for g in grads:
        updates, st = tx.update(tm(jax.numpy.asarray, g), st, params)
        params = optax.apply_updates(params, updates)
    return tm(np.asarray, params)


def f64_count(sched):
    """An optax schedule evaluated at a float64 count (an int32 count makes it compute in float32)."""
    import jax.numpy as jnp
    return lambda c: sched(jnp.asarray(c, jnp.float64))


def neg(optax, tx):  # optax adds its updates: a transform of g alone is a step of -g
    return optax.chain(tx, optax.scale(-1.0))


# ---- data ------------------------------------------------------------------------------------------------------
def draw(rng, shape, dtype, scale=1.0):
    a = rng.standard_normal(shape) * scale
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape) * scale
    return a.astype(dtype)


def array_data(dtype, positive=False, nans=False, n=23, seed=0):
    rng = np.random.default_rng(seed)
    x0 = draw(rng, n, dtype)
    if positive:
        x0 = np.abs(x0).astype(dtype) * 0.3
    grads = [draw(rng, n, dtype) for _ in range(N_STEPS)]
    if nans:
        for k, g in enumerate(grads):
            g[(3 * k) % n] = np.nan
            if np.dtype(dtype).kind == "c":
                g[(5 * k + 1) % n] = complex(1.0, np.nan)  # NaN in the imaginary part only
    return x0, grads


# (id, rule, reference, complex supported, data options, optax optimiser equivalent or None)
CASES = [
    ("ADOPT", no.ADOPT(0.01), r_adopt(0.01), False, {},
     lambda o: o.contrib.adopt(0.01)),
    ("AdEMAMix", no.AdEMAMix(0.01, beta3=0.99, alpha=2.0, weight_decay=0.1),
     r_ademamix(0.01, b3=0.99, alpha=2.0, wd=0.1), True, {},
     lambda o: o.contrib.ademamix(0.01, b3=0.99, alpha=2.0, weight_decay=0.1)),
    ("EMA", no.EMA(0.8), r_ema(0.8), True, {}, lambda o: neg(o, o.ema(0.8))),
    ("ZeroNaNs", no.ZeroNaNs(), r_zero_nans(), True, {"nans": True}, lambda o: neg(o, o.zero_nans())),
    ("KeepParamsNonNegative", no.KeepParamsNonNegative(), r_nonneg(), False, {"positive": True},
     lambda o: o.chain(o.scale(-1.0), o.keep_params_nonnegative())),
    ("NormalizeByUpdateNorm", no.NormalizeByUpdateNorm(0.5), r_normalize(0.5), True, {},
     lambda o: neg(o, o.normalize_by_update_norm(0.5))),
    ("ClipNorm-p3", no.ClipNorm(1.0, p=3), r_clip(1.0, 3.0), True, {}, None),
    ("ClipByBlockRMS", no.ClipByBlockRMS(0.5), r_block_rms(0.5), True, {},
     lambda o: neg(o, o.clip_by_block_rms(0.5))),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_reference_and_optax_and_paths_agree_bitwise(case, dtype):
    _, rule, ref, cplx, opts, make_tx = case
    if np.dtype(dtype).kind == "c" and not cplx:
        with pytest.raises(TypeError, match="complex"):
            no.setup(rule, np.zeros(3, dtype))
        return
    x0, grads = array_data(dtype, **opts)
    s1, x1 = no.setup(rule, x0), x0.copy()
    s2, x2 = no.setup(rule, x0), x0.copy()
    for g in grads:
        s1, x1 = no.update_(s1, x1, g)
        s2, x2 = no.update(s2, x2, g)
        assert x1.tobytes() == x2.tobytes()
    assert x1.dtype == np.dtype(dtype) and s1.t == N_STEPS
    for a, b in zip(s1.arrays, s2.arrays):
        assert a.dtype.kind == "f" and a.dtype.itemsize <= x1.dtype.itemsize or a.dtype == x1.dtype
        assert a.tobytes() == b.tobytes()
    expect = run_reference(ref, [x0], [[g] for g in grads])[0]
    assert np.isfinite(x1).all() and np.abs(x1 - x0).max() > 0
    if np.dtype(dtype) == np.float32:
        # per-step rounding of the state; a clamp (ADOPT) or a projection (x - g vs 0) can flip on a near tie
        close = np.isclose(x1, expect, rtol=5e-4, atol=5e-4)
        assert close.mean() >= 0.95, (x1[~close], expect[~close])
    else:
        np.testing.assert_allclose(x1, expect, rtol=F64_TOL, atol=F64_TOL)
    if make_tx is not None and dtype == np.float64:
        np.testing.assert_allclose(x1, run_optax(make_tx, x0, grads), rtol=OPTAX_TOL, atol=OPTAX_TOL)


# ---- in a chain, over a nested model, pure and in place -----------------------------------------------------------
def model(positive=False, seed=0):
    rng = np.random.default_rng(seed)
    m = {"enc": {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)},
         "dec": [rng.standard_normal(5), rng.standard_normal((2, 2))]}
    return _map(lambda a: np.abs(a) * 0.3, m) if positive else m


def _map(f, m):
    return {"enc": {"w": f(m["enc"]["w"]), "b": f(m["enc"]["b"])}, "dec": [f(m["dec"][0]), f(m["dec"][1])]}


def leaves(m):
    return [m["enc"]["w"], m["enc"]["b"], m["dec"][0], m["dec"][1]]


def tree_grads(nans=False, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(N_STEPS):
        g = _map(lambda a: 2 * rng.standard_normal(a.shape), model())
        if nans:
            g["dec"][0][k % 5] = np.nan
            g["enc"]["w"][k % 3, (2 * k) % 4] = np.nan
        out.append(g)
    return out


def alpha_ref(t):  # no.linear(0.0, 5.0, 10) and optax.linear_schedule(0.0, 5.0, 10) at count t - 1
    return 5.0 * min((t - 1) / 10, 1.0)


def b3_ref(t):
    return 0.9 + (0.999 - 0.9) * min((t - 1) / 10, 1.0)


TREE_CASES = [
    ("ZeroNaNs+ADOPT-nesterov",
     no.chain(no.ZeroNaNs(), no.ADOPT(0.01, nesterov=True, clip_exponent=0.5)),
     r_chain(r_zero_nans(), r_adopt(0.01, nesterov=True, e=0.5)), {"nans": True},
     lambda o: o.chain(o.zero_nans(), o.contrib.adopt(0.01, nesterov=True, clip_value_fn=lambda c: c ** 0.5))),
    ("AdEMAMix-schedules+KeepParamsNonNegative",
     no.chain(no.AdEMAMix(0.05, beta3=no.linear(0.9, 0.999, 10), alpha=no.linear(0.0, 5.0, 10), weight_decay=0.1),
              no.KeepParamsNonNegative()),
     r_chain(r_ademamix(0.05, b3=b3_ref, alpha=alpha_ref, wd=0.1), r_nonneg()), {"positive": True},
     lambda o: o.chain(o.contrib.ademamix(0.05, b3=f64_count(o.linear_schedule(0.9, 0.999, 10)),
                                          alpha=f64_count(o.linear_schedule(0.0, 5.0, 10)), weight_decay=0.1),
                       o.keep_params_nonnegative())),
    ("NormalizeByUpdateNorm+EMA",
     no.chain(no.NormalizeByUpdateNorm(2.0), no.EMA(0.8), no.Descent(0.1)),
     r_chain(r_normalize(2.0), r_ema(0.8), r_descent(0.1)), {},
     lambda o: o.chain(o.normalize_by_update_norm(2.0), o.ema(0.8), o.sgd(0.1))),
    ("WeightDecay+EMA-nodebias+ADOPT-noclip",
     no.chain(no.WeightDecay(0.1), no.EMA(0.5, debias=False), no.ADOPT(0.01, use_clipping=False)),
     r_chain(r_weight_decay(0.1), r_ema(0.5, debias=False), r_adopt(0.01, clip=False)), {},
     lambda o: o.chain(o.add_decayed_weights(0.1), o.ema(0.5, debias=False),
                       o.contrib.adopt(0.01, use_clipping=False))),
    ("ClipByBlockRMS+Adam", no.chain(no.ClipByBlockRMS(0.3), no.Adam(0.01)),
     r_chain(r_block_rms(0.3), r_adam(0.01)), {},
     lambda o: o.chain(o.clip_by_block_rms(0.3), o.adam(0.01))),
    ("ClipNorm-p0.5+ClipGlobalNorm-p3",
     no.chain(no.ClipNorm(2.0, p=0.5), no.ClipGlobalNorm(1.0, p=3), no.Descent(0.1)),
     r_chain(r_clip(2.0, 0.5), r_clip(1.0, 3.0, tree=True), r_descent(0.1)), {}, None),
]


@pytest.mark.parametrize("inplace", [True, False], ids=["update_", "update"])
@pytest.mark.parametrize("case", TREE_CASES, ids=[c[0] for c in TREE_CASES])
def test_in_a_chain_over_a_nested_model(case, inplace):
    _, rule, ref, opts, make_tx = case
    m0, grads = model(opts.get("positive", False)), tree_grads(opts.get("nans", False))
    m = _map(np.copy, m0)
    state = no.setup(rule, m)
    step = no.update_ if inplace else no.update
    for g in grads:
        state, m = step(state, m, g)
    ours = leaves(m)
    if inplace:
        assert all(a is b for a, b in zip(ours, leaves(m)))
    expect = run_reference(ref, leaves(m0), [leaves(g) for g in grads])
    for a, b in zip(ours, expect):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=F64_TOL, atol=F64_TOL)
    if opts.get("positive"):
        assert min(a.min() for a in ours) == 0.0  # the constraint was active
    if make_tx is not None:
        for a, b in zip(ours, leaves(run_optax(make_tx, m0, grads))):
            np.testing.assert_allclose(a, b, rtol=OPTAX_TOL, atol=OPTAX_TOL)


# ---- behaviours -----------------------------------------------------------------------------------------------
def test_adopt_first_step_only_measures_the_gradient():
    x = np.array([1.0, -2.0, 3.0])
    g = np.array([0.5, 4.0, -1e-9])
    s, x1 = no.update(no.setup(no.ADOPT(0.1), x), x, g)
    assert x1.tobytes() == x.tobytes() and s.t == 1
    m, v = s.arrays
    assert (m == 0).all() and v.tobytes() == (g * g).tobytes()


def test_zero_nans_passes_infinities_and_zeroes_either_part():
    x = np.zeros(4, np.complex64)
    g = np.array([np.inf, complex(np.nan, 1.0), complex(1.0, np.nan), 2.0], np.complex64)
    _, x1 = no.update(no.setup(no.ZeroNaNs(), x), x, g)
    assert x1.dtype == np.complex64
    assert x1[0] == -np.inf and x1[1] == 0 and x1[2] == 0 and x1[3] == -2
    _, y = no.update(no.setup(no.ZeroNaNs(), np.zeros(2, np.float32)), np.zeros(2, np.float32),
                     np.array([np.nan, -np.inf], np.float32))
    assert y.dtype == np.float32 and y[0] == 0 and y[1] == np.inf


def test_keep_params_nonnegative_moves_negative_parameters_to_zero():
    x = np.array([-1.0, 2.0, 0.5])
    _, x1 = no.update(no.setup(no.chain(no.Descent(1.0), no.KeepParamsNonNegative()), x), x, np.array([0.0, 1.0, 1.0]))
    assert x1.tolist() == [0.0, 1.0, 0.0]


class OldClipNorm(no.Rule):
    """ClipNorm as it was before any p > 0 (p in 1, 2, inf): ``d = g * min(max_norm / ||g||_p, 1)``."""
    max_norm = no.hyper(10.0, low=0.0)
    p = no.option(2.0, choices=(1.0, 2.0, math.inf))
    error_if_nonfinite = no.option(True)
    reduce_ops = staticmethod(lambda rule: ("max",) if rule.p == math.inf else ("sum",))
    finals = ("scale", "error")
    error_message = "not finite"

    @staticmethod
    def reduce(g, x, p):
        if p == 2.0:
            return abs2(g)
        if p == 1.0:
            return absval(g)
        if isfinite(g):
            return absval(g) * 1.0
        return INF

    @staticmethod
    def finish(total, max_norm, p, error_if_nonfinite):
        n = math.sqrt(total) if p == 2.0 else max(total, 0.0)
        if not math.isfinite(n) and error_if_nonfinite:
            return 0.0, 1.0
        return (min(max_norm / n, 1.0) if n > 0.0 else 1.0), 0.0

    @staticmethod
    def step(g, x, scale):
        return g * scale


def test_clip_norm_p_1_2_inf_unchanged_bitwise():
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal(40).astype(np.float32)
    new = no.chain(no.ClipNorm(9.0, p=1), no.ClipNorm(3.0, p=2), no.ClipNorm(0.5, p=math.inf), no.Descent(1.0))
    old = no.chain(OldClipNorm(9.0, p=1), OldClipNorm(3.0, p=2), OldClipNorm(0.5, p=math.inf), no.Descent(1.0))
    sn, xn, so, xo = no.setup(new, x0), x0.copy(), no.setup(old, x0), x0.copy()
    for _ in range(4):
        g = (3 * rng.standard_normal(40)).astype(np.float32)
        sn, xn = no.update_(sn, xn, g)
        so, xo = no.update_(so, xo, g)
    assert xn.tobytes() == xo.tobytes() and not (xn == x0).all()


def test_clip_norm_any_p_nonfinite_raises_and_empty_norm_is_zero():
    for p in (3, 0.5):
        x = np.ones(4)
        s = no.setup(no.ClipNorm(1.0, p=p), x)
        for bad in (np.nan, np.inf, -np.inf):
            with pytest.raises(ValueError, match="not finite"):
                no.update_(s, x, np.array([1.0, bad, 1.0, 1.0]))
            assert (x == 1).all() and s.t == 0
        s, x = no.update_(s, x, np.zeros(4))  # a zero gradient has norm 0: no scaling, no error, no NaN
        assert (x == 1).all() and s.t == 1
        s, y = no.update(s, x, np.array([0.0, 2.0, 0.0, 0.0]))  # norm 2 for every p (to rounding: 8**(1/3))
        np.testing.assert_allclose(y, [1.0, 0.0, 1.0, 1.0], rtol=0, atol=1e-15)
    assert no.ClipNorm(p=3).p == 3.0 and no.ClipGlobalNorm(p=1.5).p == 1.5  # a float literal either way


@pytest.mark.parametrize("make, match", [
    (lambda: no.ADOPT(beta1=1.0), "beta1"), (lambda: no.ADOPT(beta2=-0.1), "beta2"),
    (lambda: no.ADOPT(eps=-1e-6), "eps"), (lambda: no.ADOPT(clip_exponent=-0.25), "clip_exponent"),
    (lambda: no.ADOPT(use_clipping=1.5), "use_clipping"),
    (lambda: no.AdEMAMix(beta3=1.0), "beta3"), (lambda: no.AdEMAMix(alpha=-1.0), "alpha"),
    (lambda: no.AdEMAMix(weight_decay=-0.1), "weight_decay"), (lambda: no.AdEMAMix(beta3=lambda c: 1.5), "beta3"),
    (lambda: no.EMA(1.0), "decay"), (lambda: no.EMA(float("nan")), "decay"),
    (lambda: no.NormalizeByUpdateNorm(-1.0), "scale_factor"), (lambda: no.NormalizeByUpdateNorm(eps=-1.0), "eps"),
    (lambda: no.ClipNorm(p=0), "option p"), (lambda: no.ClipNorm(p=-2.0), "option p"),
    (lambda: no.ClipNorm(p=float("nan")), "option p"), (lambda: no.ClipGlobalNorm(p=0.0), "option p"),
    (lambda: no.ClipNorm(p=True), "option p"), (lambda: no.ClipNorm(p="2"), "option p"),
    (lambda: no.ClipNorm(1.0).replace(p=-1), "option p"),
])
def test_bad_hyperparameters_are_value_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_schedule_leaving_the_domain_is_refused_before_anything_changes():
    x = np.ones(3)
    s = no.setup(no.AdEMAMix(0.1, beta3=lambda c: 0.9 if c < 2 else 1.0), x)
    for _ in range(2):
        s, x = no.update_(s, x, x)
    before = (x.copy(), [a.copy() for a in s.arrays])
    with pytest.raises(ValueError, match="beta3"):
        no.update_(s, x, x)
    assert x.tobytes() == before[0].tobytes() and s.t == 2
    assert all(a.tobytes() == b.tobytes() for a, b in zip(s.arrays, before[1]))


@pytest.mark.parametrize("make, match", [
    (lambda: no.ADOPT(b1=0.8), r"optax's b1 is beta1: write ADOPT\(beta1=0.8\)"),
    (lambda: no.ADOPT(clip_value_fn=lambda c: c), r"count\*\*clip_exponent.*ADOPT\(clip_exponent=0.25\)"),
    (lambda: no.AdEMAMix(b3=0.99), r"write AdEMAMix\(beta3=0.99\)"),
    (lambda: no.AdEMAMix(betas=(0.8, 0.9, 0.99)), r"AdEMAMix\(beta1=0.8, beta2=0.9, beta3=0.99\)"),
    (lambda: no.EMA(accumulator_dtype=np.float32), r"MixedPrecision"),
])
def test_optax_spellings_say_what_to_write(make, match):
    with pytest.raises(ValueError, match=match):
        make()
