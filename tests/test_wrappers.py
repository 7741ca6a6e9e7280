"""AccumGrad and MixedPrecision (host-level wrappers), float16 with a tiny eps."""
import numpy as np
import pytest

import numbaopt as no


def grads(n, size=6, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("inplace", [True, False])
def test_accumgrad_applies_the_mean_every_nth_call(inplace):
    n = 3
    x0 = np.linspace(-1, 1, 6).astype(np.float32)
    gs = grads(2 * n)
    s, x = no.setup(no.AccumGrad(n, no.Adam(0.1)), x0), x0.copy()
    ref_s, ref_x = no.setup(no.Adam(0.1), x0), x0.copy()
    upd = no.update_ if inplace else no.update
    for cycle in range(2):
        block = gs[cycle * n:(cycle + 1) * n]
        for k, g in enumerate(block):
            before_x, before_inner = x.copy(), [a.copy() for a in s.inner.arrays]
            s, x = upd(s, x, g)
            if k < n - 1:  # steps 1..n-1: neither the parameter nor the inner state moves
                assert x.tobytes() == before_x.tobytes()
                assert all(a.tobytes() == b.tobytes() for a, b in zip(s.inner.arrays, before_inner))
        acc = block[0].copy()
        for g in block[1:]:
            acc = acc + g
        ref_s, ref_x = no.update_(ref_s, ref_x, acc / np.float32(n))
        assert x.tobytes() == ref_x.tobytes()
        assert s.t == cycle + 1 and s.count == 0


def test_accumgrad_pure_update_leaves_state_alone_and_validates():
    x = np.zeros(4)
    s = no.setup(no.AccumGrad(2, no.Descent(1.0)), x)
    s2, x2 = no.update(s, x, np.ones(4))
    assert s.count == 0 and s2.count == 1 and (s.acc == 0).all()
    with pytest.raises(ValueError, match="shape"):
        no.update_(s2, x2, np.ones(5))
    with pytest.raises(TypeError, match="dtype"):
        no.update_(s2, x2, np.ones(4, dtype=np.int64))
    assert s2.count == 1
    with pytest.raises(ValueError, match="integer"):
        no.AccumGrad(0, no.Adam())
    assert "AccumGrad(2" in repr(no.AccumGrad(2, no.Adam()))


def test_accumgrad_inner_error_keeps_the_accumulator():
    x = np.ones(3)
    s = no.setup(no.AccumGrad(2, no.chain(no.ClipNorm(1.0), no.Descent(1.0))), x)
    s, x = no.update_(s, x, np.ones(3))
    with pytest.raises(ValueError, match="not finite"):
        no.update_(s, x, np.array([np.nan, 1.0, 1.0]))
    assert s.count == 1 and (s.acc == 1).all() and (x == 1).all()


@pytest.mark.parametrize("rule", [no.Adam(1e-2), no.chain(no.ClipNorm(1.0), no.Momentum(0.05))])
def test_mixed_precision_float16_tracks_float32(rule):
    x0 = np.linspace(-2, 2, 64).astype(np.float16)
    gs = [(np.sin(np.arange(64) * 0.1 + k)).astype(np.float16) for k in range(30)]
    s, x = no.setup(no.MixedPrecision(np.float32, rule), x0), x0.copy()
    ref_s, ref = no.setup(rule, x0.astype(np.float32)), x0.astype(np.float32)
    for g in gs:
        s, x = no.update_(s, x, g)
        ref_s, ref = no.update_(ref_s, ref, g.astype(np.float32))
        assert x.dtype == np.float16
        assert s.master.tobytes() == ref.tobytes()  # the master copy IS the float32 trajectory
        assert x.tobytes() == ref.astype(np.float16).tobytes()  # written back rounded
    assert all(a.dtype == np.float32 for a in s.inner.arrays)  # moments in float32


def test_mixed_precision_pure_update_and_validation():
    x = np.ones(3, dtype=np.float16)
    s = no.setup(no.MixedPrecision(np.float32, no.Descent(0.5)), x)
    s2, x2 = no.update(s, x, np.ones(3, dtype=np.float16))
    assert (x == 1).all() and (s.master == 1).all() and s.t == 0
    assert x2.dtype == np.float16 and (x2 == 0.5).all() and s2.t == 1
    with pytest.raises(ValueError, match="shape|state was set up"):
        no.update_(s, np.ones(4, dtype=np.float16), np.ones(4, dtype=np.float16))
    with pytest.raises(TypeError, match="float32 or float64"):
        no.MixedPrecision(np.float16, no.Adam())
    with pytest.raises(TypeError, match="MixedPrecision"):
        no.setup(no.Adam(), x)  # float16 without the wrapper points to it


@pytest.mark.parametrize("eps", [1e-8, 1e-12])
def test_float16_adam_with_tiny_eps_stays_finite(eps):
    # eps far below float16's smallest subnormal (6e-8) and gradients whose squares underflow in float16:
    # with the float32 master state neither produces Inf/NaN
    x = np.full(8, 0.5, dtype=np.float16)
    s = no.setup(no.MixedPrecision(np.float32, no.Adam(1e-3, eps=eps)), x)
    for k in range(25):
        g = np.full(8, 1e-4 if k % 2 else 0.0, dtype=np.float16)
        g[0] = 0.0
        s, x = no.update_(s, x, g)
        assert np.isfinite(x).all() and all(np.isfinite(a).all() for a in s.inner.arrays)
    assert x[1] < 0.5 and x[0] == np.float16(0.5)


def test_wrappers_compose():
    x0 = np.linspace(0, 1, 5).astype(np.float16)
    s, x = no.setup(no.MixedPrecision(np.float32, no.AccumGrad(2, no.Descent(1.0))), x0), x0.copy()
    s, x = no.update_(s, x, np.ones(5, dtype=np.float16))
    assert (x == x0).all()
    s, x = no.update_(s, x, np.full(5, 3, dtype=np.float16))
    assert np.array_equal(x, (x0.astype(np.float32) - 2).astype(np.float16))


def test_wrappers_in_a_tree():
    model = {"a": np.ones(3), "b": np.ones(2, dtype=np.float16)}

    def choose(path, x):
        return no.AccumGrad(2, no.Descent(1.0)) if x.dtype == np.float64 else \
            no.MixedPrecision(np.float32, no.Descent(0.5))
    s = no.setup(choose, model)
    s, model = no.update_(s, model, {"a": np.ones(3), "b": np.ones(2, dtype=np.float16)})
    assert (model["a"] == 1).all() and (model["b"] == 0.5).all()
    s2, m2 = no.update(s, model, {"a": np.full(3, 3.0), "b": np.ones(2, dtype=np.float16)})
    assert (m2["a"] == -1).all() and (m2["b"] == 0).all() and m2["b"].dtype == np.float16
    assert (model["a"] == 1).all() and (model["b"] == 0.5).all()  # the pure update left them alone


def test_adjust_reaches_the_inner_rule():
    x = np.ones(3, dtype=np.float16)
    s = no.setup(no.MixedPrecision(np.float32, no.AccumGrad(1, no.Descent(0.5))), x)
    s2 = no.adjust(s, lr=0.25)
    assert s.rule == no.Descent(0.5) and s2.rule == no.Descent(0.25)
    s2, x2 = no.update(s2, x, np.ones(3, dtype=np.float16))
    assert (x2 == 0.75).all() and (x == 1).all()
    no.adjust_(s, lr=0.125)
    s, x = no.update_(s, x, np.ones(3, dtype=np.float16))
    assert (x == 0.875).all()
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        no.adjust(s, beta=0.1)
    tree = no.setup(no.AccumGrad(2, no.Adam()), {"w": np.ones(2)})
    tree = no.adjust(tree, lr=0.5)
    assert "lr=0.5" in repr(tree)
