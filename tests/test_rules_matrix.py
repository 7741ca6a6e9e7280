"""Matrix rules: Muon (Newton-Schulz orthogonalised momentum on each 2-D leaf) and ``numbaopt.muon`` (Muon for
matrices, a fallback rule for the other leaves).

Against an independent float64 NumPy reference of the published iteration (both conventions), against optax
0.2.8's ``contrib.muon`` in float64 (Muon and its Adam fallback over a tree), against ``torch.optim.Muon`` (which
orthogonalises in bfloat16: a loose tolerance); float32 stays float32; pure, in place, tree and single array
agree bitwise; save/load; a leaf that is not a matrix is refused with the way out.
"""
import numpy as np
import pytest

import numbaopt as no

A, B, C = 3.4445, -4.7750, 2.0315


def r_muon(lr, beta=0.95, eps=1e-7, wd=0.0, nesterov=True, steps=5, convention="torch"):
    """Jordan et al. 2024 (torch.optim.Muon's form; ``convention="optax"``: optax.contrib.muon's)."""
    def ns(u):
        X = u.T if u.shape[0] > u.shape[1] else u
        n = np.linalg.norm(X)
        X = X / (n + eps if convention == "optax" else max(n, eps))
        for _ in range(steps):
            Am = X @ X.T
            X = A * X + (B * Am + C * Am @ Am) @ X
        return X.T if u.shape[0] > u.shape[1] else X

    def f(S, x, g, t):
        m = beta * S.get("m", 0.0) + (1 - beta) * g
        S["m"] = m
        if convention == "optax":
            u = beta * m / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta ** t) if nesterov else m / (1 - beta ** t)
            s = np.sqrt(max(1.0, x.shape[1] / x.shape[0]))
        else:
            u = (1 - beta) * g + beta * m if nesterov else m
            s = np.sqrt(max(1.0, x.shape[0] / x.shape[1]))
        return S, x - lr * (s * ns(u) + wd * x)
    return f


SHAPES = {"w": (6, 4), "v": (3, 5), "sq": (4, 4)}


def model_of(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}


def grads_of(seed, n, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()} for _ in range(n)]


@pytest.mark.parametrize("convention", ["torch", "optax"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_against_numpy_reference(convention, nesterov, dtype):
    model, grads = model_of(dtype), grads_of(1, 12, dtype)
    rule = no.Muon(0.05, 0.9, 1e-7, 0.01, nesterov=nesterov, convention=convention)
    st, m = no.setup(rule, model), {k: v.copy() for k, v in model.items()}
    f = r_muon(0.05, 0.9, 1e-7, 0.01, nesterov, 5, convention)
    S, xs = {k: {} for k in model}, {k: v.astype(np.float64) for k, v in model.items()}
    for t, gs in enumerate(grads, start=1):
        st, m = no.update_(st, m, gs)
        for k in model:
            S[k], xs[k] = f(S[k], xs[k], gs[k].astype(np.float64), t)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    for k in model:
        assert m[k].dtype == dtype and st[k].state["mu"].dtype == dtype
        np.testing.assert_allclose(m[k], xs[k], rtol=tol, atol=tol, err_msg=k)


def test_pure_in_place_single_and_saved_agree_bitwise(tmp_path):
    model, grads = model_of(np.float32, 2), grads_of(3, 6, np.float32)
    rule = no.Muon(0.05, weight_decay=0.01)
    s_pure, m_pure = no.setup(rule, model), model
    s_in, m_in = no.setup(rule, model), {k: v.copy() for k, v in model.items()}
    singles = {k: (no.setup(rule, v), v.copy()) for k, v in model.items()}
    for i, gs in enumerate(grads):
        s_pure, m_pure = no.update(s_pure, m_pure, gs)
        s_in, m_in = no.update_(s_in, m_in, gs)
        singles = {k: no.update_(s, x, gs[k]) for k, (s, x) in singles.items()}
        if i == 2:
            no.save(tmp_path / "m.npz", s_in)
            s_in = no.load(tmp_path / "m.npz")
    for k in model:
        assert np.array_equal(m_pure[k], m_in[k]) and np.array_equal(singles[k][1], m_in[k]), k


def test_muon_with_its_fallback_against_optax():
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import optax
    model = dict(model_of(np.float64, 4), b=np.random.default_rng(5).standard_normal(4), s=np.array(0.5))
    rng = np.random.default_rng(6)
    for nesterov in (True, False):
        tx = optax.contrib.muon(0.05, beta=0.9, eps=1e-8, weight_decay=0.01, nesterov=nesterov)
        ours = no.muon(0.05, 0.9, 1e-8, 0.01, nesterov=nesterov, convention="optax",
                       fallback=no.NAdam(0.05, 0.9, 0.999, 1e-8, b2_factor=False) if nesterov
                       else no.Adam(0.05, 0.9, 0.999, 1e-8))  # optax: adamw(..., nesterov=nesterov)
        p = {k: jnp.asarray(v) for k, v in model.items()}
        os_ = tx.init(p)
        update = jax.jit(tx.update)  # one compile; eagerly, Newton-Schulz's loop compiles at every step
        st, m = no.setup(ours, model), {k: v.copy() for k, v in model.items()}
        for _ in range(10):
            g = {k: rng.standard_normal(np.shape(v)) for k, v in model.items()}
            u, os_ = update({k: jnp.asarray(v) for k, v in g.items()}, os_, p)
            p = optax.apply_updates(p, u)
            st, m = no.update_(st, m, g)
        for k in m:
            np.testing.assert_allclose(m[k], np.asarray(p[k]), rtol=1e-12, atol=1e-13, err_msg=f"{nesterov} {k}")


def test_against_torch_muon_loosely():
    """torch.optim.Muon orthogonalises in bfloat16 (8 bits of mantissa): the same step to a few percent."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon needs torch >= 2.9")
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((8, 5))
    w = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.Muon([w], lr=0.02, weight_decay=0.1, momentum=0.95)
    x = w0.copy()
    st = no.setup(no.Muon(0.02, 0.95, 1e-7, 0.1), x)
    for _ in range(3):
        g = rng.standard_normal((8, 5))
        w.grad = torch.from_numpy(g.copy())
        before = x.copy()
        opt.step()
        st, x = no.update_(st, x, g)
        theirs = before - w.detach().numpy()
        ours = before - x
        assert np.linalg.norm(ours - theirs) < 0.05 * np.linalg.norm(theirs)
        x = w.detach().numpy().copy()  # continue from torch's iterate (its rounding is not ours)


def test_not_a_matrix_is_refused_with_the_way_out():
    with pytest.raises(ValueError, match=r"shape \(3,\).*numbaopt.muon"):
        no.setup(no.Muon(), np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        no.setup(no.Muon(), {"a": np.ones((2, 2, 2))})
    with pytest.raises(TypeError, match="complex"):
        no.setup(no.Muon(), np.ones((2, 2), np.complex128))


def test_composes_with_skip_nonfinite_mixed_precision_and_schedules():
    model, grads = model_of(np.float32, 8), grads_of(9, 4, np.float32)
    plain = no.setup(no.Muon(no.exponential(0.05, 0.9)), model)
    wrapped = no.setup(no.SkipNonFinite(no.Muon(no.exponential(0.05, 0.9))), model)
    mp, mw = {k: v.copy() for k, v in model.items()}, {k: v.copy() for k, v in model.items()}
    m16 = {k: v.astype(np.float16) for k, v in model.items()}
    half = no.setup(no.MixedPrecision(np.float32, no.Muon(0.05)), m16)
    ref = no.setup(no.Muon(0.05), {k: v.astype(np.float32) for k, v in m16.items()})
    m32 = {k: v.astype(np.float32) for k, v in m16.items()}
    for i, gs in enumerate(grads):
        plain, mp = no.update_(plain, mp, gs)
        wrapped, mw = no.update_(wrapped, mw, gs)
        if i == 1:
            bad = dict(gs, w=np.full((6, 4), np.nan, np.float32))
            before = {k: v.copy() for k, v in mw.items()}
            wrapped, mw = no.update_(wrapped, mw, bad)
            assert all(np.array_equal(before[k], mw[k]) for k in mw) and wrapped["w"].skipped == 1
        g16 = {k: v.astype(np.float16) for k, v in gs.items()}
        half, m16 = no.update_(half, m16, g16)
        ref, m32 = no.update_(ref, m32, {k: v.astype(np.float32) for k, v in g16.items()})
    for k in model:
        assert np.array_equal(mp[k], mw[k]), k
        assert np.array_equal(half[k].master.reshape(SHAPES[k]), m32[k]), k
