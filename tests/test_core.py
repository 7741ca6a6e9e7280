"""The rule compiler on one array: references, variants, dtypes, layouts, caching and bad input."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

import numbaopt as no
from numbaopt.compiler import cpu as codegen
from numbaopt.compiler import kernels

SCALE = 2.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Independent float64 references of the published formulas (shared/reference/rules.md)
# ---------------------------------------------------------------------------------------------
def ref_descent(h):
    return lambda st, x, g, t: (st, h["lr"] * g)


def ref_momentum(h):
    def f(st, x, g, t):
        v = h["momentum"] * st.get("v", 0 * g) + h["lr"] * g
        return {"v": v}, v
    return f


def ref_nesterov(h):
    def f(st, x, g, t):
        v, mu, lr = st.get("v", 0 * g), h["momentum"], h["lr"]
        d = -mu ** 2 * v + (1 + mu) * lr * g
        return {"v": mu * v - lr * g}, d
    return f


def ref_rmsprop(h, centred=False):
    def f(st, x, g, t):
        q = h["rho"] * st.get("q", np.zeros(g.shape)) + (1 - h["rho"]) * np.abs(g) ** 2
        if centred:
            l_ = h["rho"] * st.get("l", 0 * g) + (1 - h["rho"]) * g
            return {"q": q, "l": l_}, h["lr"] * g / (np.sqrt(q - np.abs(l_) ** 2) + h["eps"])
        return {"q": q}, h["lr"] * g / (np.sqrt(q) + h["eps"])
    return f


def _adam_dir(h, st, g, t):
    m = h["beta1"] * st.get("m", 0 * g) + (1 - h["beta1"]) * g
    v = h["beta2"] * st.get("v", np.zeros(g.shape)) + (1 - h["beta2"]) * np.abs(g) ** 2
    a = (m / (1 - h["beta1"] ** t)) / (np.sqrt(v / (1 - h["beta2"] ** t)) + h["eps"])
    return {"m": m, "v": v}, a


def ref_adam(h):
    def f(st, x, g, t):
        s, a = _adam_dir(h, st, g, t)
        return s, h["lr"] * a
    return f


def ref_adamw(h, couple=True):
    def f(st, x, g, t):
        s, a = _adam_dir(h, st, g, t)
        wd = h["weight_decay"]
        return s, (h["lr"] * (a + wd * x) if couple else h["lr"] * a + wd * x)
    return f


def ref_adagrad(h):
    def f(st, x, g, t):
        acc = st.get("acc", np.full(g.shape, h["eps"])) + np.abs(g) ** 2
        return {"acc": acc}, h["lr"] * g / (np.sqrt(acc) + h["eps"])
    return f


def ref_weightdecay(h):
    return lambda st, x, g, t: (st, g + h["weight_decay"] * x)


def ref_clipgrad(h):
    return lambda st, x, g, t: (st, np.clip(g, -h["delta"], h["delta"]))


CASES = [
    (no.Descent(0.05), ref_descent, {}),
    (no.Momentum(0.01, 0.8), ref_momentum, {}),
    (no.Nesterov(0.01, 0.7), ref_nesterov, {}),
    (no.RMSProp(0.01), ref_rmsprop, {}),
    (no.RMSProp(0.01, centred=True), ref_rmsprop, {"centred": True}),
    (no.Adam(0.01), ref_adam, {}),
    (no.AdamW(0.01, weight_decay=0.1), ref_adamw, {}),
    (no.AdamW(0.01, weight_decay=0.1, couple=False), ref_adamw, {"couple": False}),
    (no.AdaGrad(0.1), ref_adagrad, {}),
    (no.WeightDecay(0.1), ref_weightdecay, {}),
    (no.ClipGrad(0.3), ref_clipgrad, {}),
]
COMPLEX_OK = {"Descent", "Momentum", "RMSProp", "Adam"}


def run_reference(ref, x0, grads):
    x = x0.astype(np.complex128 if np.iscomplexobj(x0) else np.float64)
    st = {}
    for t, g in enumerate(grads, start=1):
        st, d = ref(st, x, g.astype(x.dtype), t)
        x = x - d
    return x


def make_grads(rng, shape, dtype, n=25):
    out = []
    for _ in range(n):
        g = rng.standard_normal(shape)
        if np.dtype(dtype).kind == "c":
            g = g + 1j * rng.standard_normal(shape)
        out.append(g.astype(dtype))
    return out


@pytest.mark.parametrize("rule,ref,opts", CASES, ids=lambda c: repr(c) if isinstance(c, no.Rule) else "")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
def test_rule_matches_float64_reference(rule, ref, opts, dtype):
    if np.dtype(dtype).kind == "c" and type(rule).__name__ not in COMPLEX_OK:
        pytest.skip("reference checked for complex on Descent, Momentum, RMSProp, Adam")
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(37).astype(dtype)
    if np.dtype(dtype).kind == "c":
        x0 = (x0 + 1j * rng.standard_normal(37)).astype(dtype)
    grads = make_grads(rng, x0.shape, dtype)
    state = no.setup(rule, x0)
    x = x0.copy()
    for g in grads:
        state, x = no.update_(state, x, g)
    assert x.dtype == np.dtype(dtype)
    assert state.t == len(grads)
    expect = run_reference(ref(rule.hyper_values(), **opts), x0, grads)
    tol = 2e-4 if np.dtype(dtype) == np.float32 else 1e-10
    np.testing.assert_allclose(x, expect, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# Variants: in place vs out of place, serial vs threaded, pure update leaves inputs alone
# ---------------------------------------------------------------------------------------------
RULES = [c[0] for c in CASES] + [no.chain(no.WeightDecay(0.01), no.ClipGrad(1.0), no.Adam(0.01))]
REAL_DTYPES = [np.float32, np.float64]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_i=st.integers(0, len(RULES) - 1), dtype=st.sampled_from(REAL_DTYPES + [np.complex64]),
       shape=st.lists(st.integers(0, 5), min_size=0, max_size=3), steps=st.integers(1, 3),
       seed=st.integers(0, 2 ** 16))
def test_inplace_equals_outofplace_bitwise(rule_i, dtype, shape, steps, seed):
    rule = RULES[rule_i]
    if np.dtype(dtype).kind == "c" and not all(type(r).supports_complex for r in getattr(rule, "rules", [rule])):
        return
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(shape).astype(dtype)
    grads = make_grads(rng, x0.shape, dtype, steps)
    s1, s2 = no.setup(rule, x0), no.setup(rule, x0)
    x1, x2 = x0.copy(), x0.copy()
    for g in grads:
        g_before = g.copy()
        x1_before = x1.copy()
        s1, x1_new = no.update(s1, x1, g)
        np.testing.assert_array_equal(x1, x1_before)  # pure: the input is untouched
        np.testing.assert_array_equal(g, g_before)
        x1 = x1_new
        s2, x2 = no.update_(s2, x2, g)
    assert x1.tobytes() == x2.tobytes()
    for a, b in zip(s1.arrays, s2.arrays):
        assert a.tobytes() == b.tobytes()
    assert s1.t == s2.t == steps


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_i=st.integers(0, len(RULES) - 1), dtype=st.sampled_from(REAL_DTYPES),
       base=st.tuples(st.integers(1, 7), st.integers(1, 7)), steps=st.tuples(st.integers(1, 3), st.integers(-3, 3)),
       start=st.tuples(st.integers(0, 2), st.integers(0, 2)), transpose=st.booleans(),
       grad_layout=st.sampled_from(["C", "F", "strided"]), seed=st.integers(0, 2 ** 16))
def test_strided_views_in_place_equal_pure_and_write_through(rule_i, dtype, base, steps, start, transpose,
                                                             grad_layout, seed):
    """Any strided view (negative steps, transposed) of a larger array: update_ writes through to the
    base, leaves the rest of the base alone, and gives the same bits as the pure update of a copy."""
    rule = RULES[rule_i]
    rng = np.random.default_rng(seed)
    buf = rng.standard_normal(base).astype(dtype)
    s0, s1 = steps
    s1 = s1 or 1
    view = buf[start[0]::s0, start[1]::s1]
    if transpose:
        view = view.T
    if view.size == 0:
        return
    if grad_layout == "C":
        g = np.ascontiguousarray(rng.standard_normal(view.shape).astype(dtype))
    elif grad_layout == "F":
        g = np.asfortranarray(rng.standard_normal(view.shape).astype(dtype))
    else:
        g = rng.standard_normal((view.shape[0] * 2, view.shape[1])).astype(dtype)[::2]
    outside = np.ones(buf.shape, dtype=bool)
    outside[start[0]::s0, start[1]::s1] = False
    rest = buf[outside].copy()
    st_pure, st_inplace = no.setup(rule, view), no.setup(rule, view)
    st_pure, x_pure = no.update(st_pure, view.copy(), g)
    st_inplace, out = no.update_(st_inplace, view, g)
    assert out is view and np.shares_memory(out, buf)
    assert np.ascontiguousarray(view).tobytes() == np.ascontiguousarray(x_pure).tobytes()
    assert buf[outside].tobytes() == rest.tobytes()
    for a, b in zip(st_pure.arrays, st_inplace.arrays):
        assert a.tobytes() == b.tobytes()


def test_update_does_not_touch_state():
    x = np.linspace(-1, 1, 10)
    s = no.setup(no.Adam(0.1), x)
    s, x = no.update_(s, x, np.ones(10))
    arrays = [a.copy() for a in s.arrays]
    s2, _ = no.update(s, x, np.ones(10))
    for a, b in zip(arrays, s.arrays):
        np.testing.assert_array_equal(a, b)
    assert s.t == 1 and s2.t == 2
    assert all(a is not b for a, b in zip(s.arrays, s2.arrays))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_i=st.integers(0, len(RULES) - 1), n=st.integers(0, 300), seed=st.integers(0, 100))
def test_serial_equals_parallel_bitwise(rule_i, n, seed):
    rule = RULES[rule_i]
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(n).astype(np.float32)
    grads = make_grads(rng, x0.shape, np.float32, 3)
    results = []
    for threshold in (10 ** 9, 0):
        old = no.set_parallel_threshold(threshold)
        try:
            s, x = no.setup(rule, x0), x0.copy()
            s_pure = no.setup(rule, x0)
            xp = x0.copy()
            for g in grads:
                s, x = no.update_(s, x, g)
                s_pure, xp = no.update(s_pure, xp, g)
        finally:
            no.set_parallel_threshold(old)
        results.append((x.tobytes(), xp.tobytes(), [a.tobytes() for a in s.arrays]))
    assert results[0] == results[1]


# ---------------------------------------------------------------------------------------------
# Fusion
# ---------------------------------------------------------------------------------------------
def test_fused_chain_equals_rules_applied_one_after_another():
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal(50)
    grads = make_grads(rng, x0.shape, np.float64, 20)
    wd, delta = 0.05, 0.8
    c = no.chain(no.WeightDecay(wd), no.ClipGrad(delta), no.Momentum(0.02, 0.9))
    s, x = no.setup(c, x0), x0.copy()
    for g in grads:
        s, x = no.update_(s, x, g)
    # one after another: each rule's output is the next rule's gradient
    xr, v = x0.copy(), np.zeros_like(x0)
    for g in grads:
        d = g + wd * xr
        d = np.clip(d, -delta, delta)
        v = 0.9 * v + 0.02 * d
        xr = xr - v
    np.testing.assert_allclose(x, xr, rtol=1e-13, atol=1e-13)
    assert len(s.arrays) == 1  # only Momentum has state


def test_chain_is_one_kernel_with_one_loop():
    c = no.chain(no.WeightDecay(), no.ClipGrad(1.0), no.Adam())
    src = codegen.generate_source(c, np.float32)
    body = src[src.index("def inplace("):src.index("def outplace(")]
    assert body.count("for i in range(n)") == 1
    # the members' steps are written out in that loop (compiler.inliner), in the chain's order
    assert not any(f"step_{r}(" in body for r in range(3))
    loop = body[body.index("for i in range(n)"):]
    assert loop.index("h0_") < loop.index("h1_") < loop.index("h2_")


def test_chain_flattens_and_validates():
    c = no.chain(no.chain(no.WeightDecay(), no.ClipGrad()), no.Adam())
    assert len(c.rules) == 3
    assert no.chain(no.Adam()) == no.Adam()
    with pytest.raises(TypeError, match="instance"):
        no.chain(no.Adam)
    assert no.chain().rules == () and no.chain(no.chain(), no.Adam()) == no.Adam()  # chain() is the identity
    with pytest.raises(ValueError, match="valid"):
        c.replace(nope=1)
    assert c.replace(lr=0.5).rules[2].lr == 0.5


# ---------------------------------------------------------------------------------------------
# Hyperparameters are runtime: no recompilation
# ---------------------------------------------------------------------------------------------
def test_changing_hyperparameters_never_recompiles():
    x = np.ones(8, np.float32)
    g = np.ones(8, np.float32)
    s = no.setup(no.Adam(0.1), x)
    s, x = no.update_(s, x, g)
    k = s.kernels()
    n_sigs = len(k.inplace.signatures)
    before = x.copy()
    no.adjust_(s, lr=0.0)
    s, x = no.update_(s, x, g)
    np.testing.assert_array_equal(x, before)  # lr = 0 really reached the kernel
    s2 = no.adjust(s, lr=0.5, beta1=0.5)
    s2, x2 = no.update(s2, x, g)
    assert not np.array_equal(x2, x)
    s3 = no.setup(no.Adam(lr=0.3, eps=1e-6), x)
    s3, x = no.update_(s3, x, g)
    assert len(k.inplace.signatures) == n_sigs
    assert s3.kernels() is k  # the same generated module serves every hyperparameter value


def test_adjust_errors():
    s = no.setup(no.RMSProp(), np.ones(3))
    with pytest.raises(ValueError, match="valid"):
        no.adjust(s, learning_rate=0.1)
    with pytest.raises(ValueError, match="option"):
        no.adjust(s, centred=True)
    with pytest.raises(ValueError, match="outside"):
        no.adjust(s, lr=-1.0)


# ---------------------------------------------------------------------------------------------
# Generated code: float32 stays float32, and the disk cache serves a second process
# ---------------------------------------------------------------------------------------------
def _run(code, env_extra):
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_float32_kernels_contain_no_float64(tmp_path):
    out = _run("""
        import numpy as np, numbaopt as no
        from numbaopt.tree.state import core
        rules = [no.Adam(), no.AdamW(couple=False), no.RMSProp(centred=True), no.AdaGrad(), no.Nesterov(),
                 no.chain(no.WeightDecay(), no.ClipGrad(1.0), no.Momentum())]
        for dtype in (np.float32, np.complex64):
            for r in rules:
                if dtype == np.complex64 and type(r).__name__ == "Chain":
                    continue
                x = np.ones(8, dtype)
                s = no.setup(r, x)
                s, _ = no.update_(s, x.copy(), x)
                s, _ = no.update(s, x, x)
                k = s.kernels()
                for fn in (k.inplace, k.outplace):
                    for ir in fn.inspect_llvm().values():
                        print(type(r).__name__, dtype.__name__, "double" in ir, "fpext" in ir)
                # the trees' many-leaves kernel (its hyperparameters are in the parameters' precision too)
                tree = no.setup(r, {"a": np.ones(3, dtype), "b": np.ones(5, dtype)})
                no.update_(tree, {"a": np.ones(3, dtype), "b": np.ones(5, dtype)},
                           {"a": np.ones(3, dtype), "b": np.ones(5, dtype)})
                for ir in core(tree).groups[0].mod.apply.inspect_llvm().values():
                    print(type(r).__name__, dtype.__name__, "multi", "double" in ir, "fpext" in ir)
        # a negative control: the same check does see float64 in a float64 kernel
        x = np.ones(8)
        s = no.setup(no.Adam(), x); s, _ = no.update_(s, x, x)
        print("control", any("double" in ir for ir in s.kernels().inplace.inspect_llvm().values()))
    """, {"NUMBAOPT_CACHE_DIR": str(tmp_path)})
    lines = out.strip().splitlines()
    assert lines[-1] == "control True"
    assert len(lines) > 10
    for line in lines[:-1]:
        assert line.endswith("False False"), line


def test_second_process_compiles_nothing(tmp_path):
    code = """
        import numpy as np, numbaopt as no
        x = np.ones(16, np.float32)
        s = no.setup(no.chain(no.WeightDecay(), no.Adam()), x)
        s, x = no.update_(s, x, x.copy())
        st = s.kernels().inplace.stats
        print(sum(st.cache_hits.values()), sum(st.cache_misses.values()), s.kernels().source_path)
    """
    first = _run(code, {"NUMBAOPT_CACHE_DIR": str(tmp_path)}).split()
    second = _run(code, {"NUMBAOPT_CACHE_DIR": str(tmp_path)}).split()
    assert first[1] == "1" and first[0] == "0"      # compiled in the first process
    assert second[0] == "1" and second[1] == "0"    # loaded from disk in the second
    assert first[2] == second[2] and first[2].startswith(str(tmp_path))


def test_generated_module_named_by_content(tmp_path, monkeypatch):
    a = codegen.generate_source(no.Adam(), np.float32)
    b = codegen.generate_source(no.Adam(lr=0.5), np.float32)
    c = codegen.generate_source(no.Adam(), np.float64)
    assert a == b and a != c  # hyperparameter values are not baked in; the dtype is


# ---------------------------------------------------------------------------------------------
# Dtypes and layouts
# ---------------------------------------------------------------------------------------------
def test_zero_d_and_empty_arrays():
    x = np.array(1.0, np.float32)
    s = no.setup(no.Adam(0.1), x)
    s, y = no.update_(s, x, np.array(1.0, np.float32))
    assert y is x and y.shape == () and x < 1.0
    e = np.zeros((0, 3))
    s = no.setup(no.Adam(), e)
    s, e2 = no.update(s, e, np.zeros((0, 3)))
    assert e2.shape == (0, 3) and s.t == 1


def test_strided_view_writes_through_to_base():
    base = np.ones((6, 8))
    view = base[::2, 1::3]
    g = np.full(view.shape, 2.0)
    s = no.setup(no.Descent(0.5), view)
    s, out = no.update_(s, view, g)
    assert out is view
    np.testing.assert_array_equal(base[::2, 1::3], 0.0)
    assert base.sum() == base.size - view.size  # only the view's elements changed


def test_fortran_order_and_strided_gradient():
    x = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    g = np.ones((4, 3)).T  # a transposed (strided) gradient
    s = no.setup(no.Momentum(0.1, 0.0), x)
    s2, y = no.update(s, x, g)
    np.testing.assert_allclose(y, x - 0.1)
    s, x = no.update_(s, x, g)
    np.testing.assert_array_equal(x, y)


def test_read_only_parameter_is_not_written():
    x = np.ones(5)
    x.flags.writeable = False
    s = no.setup(no.Adam(0.1), x)
    s, y = no.update_(s, x, np.ones(5))
    assert y is not x and np.all(x == 1.0) and np.all(y < 1.0)
    assert s.t == 1 and np.all(s.arrays[0] != 0)  # the state itself was written in place


def test_complex_moments_stay_real_and_use_abs2():
    x = np.zeros(3, np.complex128)
    g = np.array([3 + 4j, 1j, -2.0])
    s = no.setup(no.Adam(1.0, 0.0, 0.0, 0.0), x)
    assert s.arrays[1].dtype == np.float64
    s, x = no.update_(s, x, g)
    np.testing.assert_allclose(s.state["v"], np.abs(g) ** 2)
    np.testing.assert_allclose(x, -g / np.abs(g))


def test_nan_gradient_propagates():
    s = no.setup(no.Adam(), np.ones(3))
    s, x = no.update_(s, np.ones(3), np.array([1.0, np.nan, np.inf]))
    assert np.isnan(x[1]) and np.isfinite(x[0]) and s.t == 1


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error, and nothing modified
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x,g,err,match", [
    (np.ones(4), np.ones(5), ValueError, r"shape \(5,\), expected \(4,\)"),
    (np.ones(4), np.ones((4, 1)), ValueError, "shape"),
    (np.ones(4), np.ones(4, np.int64), TypeError, "int64"),
    (np.ones(4), np.ones(4, bool), TypeError, "bool"),
    (np.ones(4), np.ones(4, np.complex128), TypeError, "complex128"),
    (np.ones(4), [1.0, 2.0, 3.0, 4.0], TypeError, "numpy array"),
])
def test_bad_gradient_raises_and_changes_nothing(x, g, err, match):
    s = no.setup(no.Adam(), x)
    s, x = no.update_(s, x, np.ones(4))
    before = (x.copy(), [a.copy() for a in s.arrays], s.t)
    for fn in (no.update, no.update_):
        with pytest.raises(err, match=match):
            fn(s, x, g)
    np.testing.assert_array_equal(x, before[0])
    for a, b in zip(s.arrays, before[1]):
        np.testing.assert_array_equal(a, b)
    assert s.t == before[2]


def test_state_for_another_shape_or_dtype():
    s = no.setup(no.Adam(), np.ones(4))
    with pytest.raises(ValueError, match=r"set up for shape \(4,\)"):
        no.update_(s, np.ones(5), np.ones(5))
    with pytest.raises(TypeError, match="set up for float64"):
        no.update_(s, np.ones(4, np.float32), np.ones(4, np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, bool, np.uint8])
def test_integer_parameters_rejected(dtype):
    with pytest.raises(TypeError, match="float32, float64"):
        no.setup(no.Adam(), np.ones(3, dtype))


def test_float16_points_to_mixed_precision():
    with pytest.raises(TypeError, match="MixedPrecision"):
        no.setup(no.Adam(), np.ones(3, np.float16))


@pytest.mark.parametrize("make,err,match", [
    (lambda: no.Adam(lr=-1.0), ValueError, "outside"),
    (lambda: no.Adam(beta1=1.0), ValueError, r"\[0.0, 1.0\)"),
    (lambda: no.Adam(lr=float("nan")), ValueError, "NaN"),
    (lambda: no.Adam(lr="0.1"), TypeError, "real number"),
    (lambda: no.Adam(learning_rate=0.1), ValueError, "valid"),
    (lambda: no.RMSProp(centred="yes"), ValueError, "expected one of"),
    (lambda: no.Momentum(0.1, 0.9, 3), TypeError, "positional"),
])
def test_bad_hyperparameters(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_rules_are_immutable_and_printable():
    r = no.Adam(lr=0.01)
    with pytest.raises(AttributeError, match="immutable"):
        r.lr = 0.1
    assert "Adam(lr=0.01" in repr(r)
    assert r.replace(lr=0.1).lr == 0.1 and r.lr == 0.01
    assert r == no.Adam(0.01) and hash(r) == hash(no.Adam(0.01))
    s = no.setup(r, np.ones((2, 3), np.float32))
    assert "t=0" in repr(s) and "float32[2×3]" in repr(s)
    assert set(s.state) == {"m", "v"} and s.state["m"].shape == (2, 3)


def test_complex_rejected_for_real_only_rule():
    with pytest.raises(TypeError, match="complex"):
        no.setup(no.ClipGrad(), np.ones(3, np.complex128))


# ---------------------------------------------------------------------------------------------
# Malformed definitions fail at class creation
# ---------------------------------------------------------------------------------------------
def test_malformed_rule_definitions():
    with pytest.raises(TypeError, match="must start with"):
        class Bad1(no.Rule):
            lr = no.hyper(0.1)

            @staticmethod
            def step(x, g, lr):
                return lr * g
    with pytest.raises(TypeError, match="states"):
        class Bad2(no.Rule):
            m = no.state(0.0)

            @staticmethod
            def step(g, x, lr):
                return g, g
    with pytest.raises(TypeError, match="cannot see"):
        class Bad3(no.Rule):
            @staticmethod
            def step(g, x):
                return g * SCALE  # a module global of the user's: not visible to generated code
    with pytest.raises(TypeError, match="staticmethod"):
        class Bad4(no.Rule):
            def step(g, x):
                return g


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 4e-15), (np.float32, 2e-6)])
def test_bias_correction_is_accurate(dtype, rtol):
    """``one_minus_pow`` (1 - b**t without cancellation) against 40-digit decimal arithmetic.

    (Its float32 form computes in float32: test_float32_kernels_contain_no_float64 checks the IR.)"""
    from decimal import Decimal, getcontext
    getcontext().prec = 40
    f = kernels(no.Adam(), dtype).one_minus_pow
    for b in (0.0, 0.5, 0.9, 0.99, 0.999, 0.9999999):
        bb = dtype(b)  # the hyperparameter as the kernel holds it
        for t in (1, 2, 3, 10, 1000, 10 ** 6):
            got = f(bb, dtype(t))
            exact = 1 - Decimal(float(bb)) ** t
            assert abs(Decimal(float(got)) - exact) <= Decimal(rtol) * exact, (b, t, got, exact)
    # b = 0 (beta1 = 0 in Adam: no momentum): log(0) = -inf gives exactly 1, not NaN
    s = no.setup(no.Adam(lr=0.1, beta1=0.0), np.ones(3, dtype))
    s, x = no.update(s, np.ones(3, dtype), np.full(3, 2.0, dtype))
    assert np.all(np.isfinite(x))
