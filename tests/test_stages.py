"""Stages as chain members: AccumGrad and MixedPrecision, alone, chained, in trees, pure and in place."""
import numpy as np
import pytest

import numbaopt as no


def grads(n, size=6, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(dtype) for _ in range(n)]


def test_shorthands_are_the_chains():
    assert no.AccumGrad(4, no.Adam()) == no.chain(no.AccumGrad(4), no.Adam())
    assert no.MixedPrecision(np.float32, no.Adam()) == no.chain(no.MixedPrecision(np.float32), no.Adam())
    # Optimisers.jl's OptimiserChain(AccumGrad(4), ClipNorm(1), Adam()) has this spelling
    c = no.chain(no.AccumGrad(4), no.ClipNorm(1.0), no.Adam())
    assert [type(r).__name__ for r in c.rules] == ["AccumGrad", "ClipNorm", "Adam"]
    with pytest.raises(ValueError, match="first member"):
        no.chain(no.AccumGrad(2), no.MixedPrecision(np.float32), no.Adam())
    with pytest.raises(ValueError, match="one"):
        no.chain(no.AccumGrad(2), no.AccumGrad(3), no.Adam())
    with pytest.raises(ValueError, match="integer"):
        no.AccumGrad(0)
    with pytest.raises(ValueError, match="integer"):
        no.AccumGrad(2.5)
    with pytest.raises(TypeError, match="float32 or float64"):
        no.MixedPrecision(np.float16)
    with pytest.raises(TypeError, match="stage"):
        no.jit_step(no.AccumGrad(2, no.Adam()), np.ones(3))


@pytest.mark.parametrize("inplace", [True, False])
def test_accumgrad_applies_the_mean_every_nth_call(inplace):
    n = 3
    x0 = np.linspace(-1, 1, 6).astype(np.float32)
    gs = grads(2 * n)
    s, x = no.setup(no.chain(no.AccumGrad(n), no.Adam(0.1)), x0.copy()), x0.copy()
    ref_s, ref_x = no.setup(no.Adam(0.1), x0.copy()), x0.copy()
    upd = no.update_ if inplace else no.update
    for cycle in range(2):
        block = gs[cycle * n:(cycle + 1) * n]
        for k, g in enumerate(block):
            before_x = x.copy()
            before = {k2: v.copy() for k2, v in s.state.items() if k2 != "acc"}
            s, x = upd(s, x, g)
            if k < n - 1:  # calls 1..n-1: neither the parameter nor Adam's state moves
                assert x.tobytes() == before_x.tobytes() and s.count == k + 1
                assert all(s.state[k2].tobytes() == v.tobytes() for k2, v in before.items())
        acc = block[0].copy()
        for g in block[1:]:
            acc = acc + g
        ref_s, ref_x = no.update_(ref_s, ref_x, acc / np.float32(n))
        assert x.tobytes() == ref_x.tobytes()
        assert s.t == cycle + 1 and s.count == 0 and not s.state["acc"].any()
        assert s.state["m"].tobytes() == ref_s.state["m"].tobytes()


def test_accumgrad_refusal_at_the_end_of_a_cycle_changes_nothing():
    x = np.ones(3)
    s = no.setup(no.chain(no.AccumGrad(2), no.ClipNorm(1.0), no.Descent(1.0)), x)
    s, x = no.update_(s, x, np.ones(3))
    with pytest.raises(ValueError, match="not finite"):
        no.update_(s, x, np.array([np.nan, 1.0, 1.0]))
    assert s.count == 1 and (s.state["acc"] == 1).all() and (x == 1).all() and s.t == 0
    s, x = no.update_(s, x, np.ones(3))
    np.testing.assert_allclose(x, 1 - 1 / np.sqrt(3))


def test_accumgrad_skip_drops_the_cycle_as_optax():
    """A SkipNonFinite after AccumGrad skips the step at the end of a poisoned cycle and drops its sum
    (optax's MultiSteps(apply_if_finite(...))); one before it skips the single call."""
    x = np.ones(2)
    s = no.setup(no.chain(no.AccumGrad(2), no.SkipNonFinite(no.Descent(1.0))), x)
    s, x = no.update_(s, x, np.array([np.nan, 1.0]))
    s, x = no.update_(s, x, np.ones(2))
    assert (x == 1).all() and s.skipped == 1 and s.t == 0 and s.count == 0 and not s.state["acc"].any()
    s, x = no.update_(s, x, np.full(2, 2.0))
    s, x = no.update_(s, x, np.full(2, 4.0))
    assert (x == -2).all() and s.t == 1
    s = no.setup(no.SkipNonFinite(no.chain(no.AccumGrad(2), no.Descent(1.0))), np.ones(2))
    s, x = no.update_(s, np.ones(2), np.array([np.nan, 1.0]))
    assert s.count == 0 and s.skipped == 1


def test_mixed_precision_float16_tracks_float32():
    rule = no.chain(no.ClipNorm(1.0), no.Momentum(0.05))
    x0 = np.linspace(-2, 2, 64).astype(np.float16)
    gs = [(np.sin(np.arange(64) * 0.1 + k)).astype(np.float16) for k in range(30)]
    s, x = no.setup(no.MixedPrecision(np.float32, rule), x0.copy()), x0.copy()
    ref_s, ref = no.setup(rule, x0.astype(np.float32)), x0.astype(np.float32)
    for g in gs:
        s, x = no.update_(s, x, g)
        ref_s, ref = no.update_(ref_s, ref, g.astype(np.float32))
        assert x.dtype == np.float16
        assert s.master.tobytes() == ref.tobytes()  # the master copy IS the float32 trajectory
        assert x.tobytes() == ref.astype(np.float16).tobytes()  # written back rounded
    assert all(a.dtype == np.float32 for a in s.arrays)  # moments in float32


def test_mixed_precision_pure_update_and_validation():
    x = np.ones(3, dtype=np.float16)
    s = no.setup(no.MixedPrecision(np.float32, no.Descent(0.5)), x)
    s2, x2 = no.update(s, x, np.ones(3, dtype=np.float16))
    assert (x == 1).all() and (s.master == 1).all() and s.t == 0
    assert x2.dtype == np.float16 and (x2 == 0.5).all() and s2.t == 1
    with pytest.raises(ValueError, match="state was set up"):
        no.update_(s, np.ones(4, dtype=np.float16), np.ones(4, dtype=np.float16))
    with pytest.raises(TypeError, match="MixedPrecision"):
        no.setup(no.Adam(), x)  # float16 without the stage points to it


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
        assert np.isfinite(x).all() and all(np.isfinite(a).all() for a in s.arrays)
    assert x[1] < 0.5 and x[0] == np.float16(0.5)


def test_stages_compose():
    x0 = np.linspace(0, 1, 5).astype(np.float16)
    s, x = no.setup(no.chain(no.MixedPrecision(np.float32), no.AccumGrad(2), no.Descent(1.0)), x0), x0.copy()
    s, x = no.update_(s, x, np.ones(5, dtype=np.float16))
    assert (x == x0).all() and s.state["acc"].dtype == np.float32  # summed in float32
    s, x = no.update_(s, x, np.full(5, 3, dtype=np.float16))
    assert np.array_equal(x, (x0.astype(np.float32) - 2).astype(np.float16))


def test_stages_in_a_tree():
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
    assert s["a"].count == 1 and s2["a"].count == 0 and s2["a"].t == 1


@pytest.mark.parametrize("rule", [no.Descent(0.5), no.AccumGrad(1, no.Descent(0.5)),
                                  no.chain(no.MixedPrecision(np.float32), no.Descent(0.5)),
                                  no.chain(no.MixedPrecision(np.float64), no.AccumGrad(1), no.Descent(0.5))])
@pytest.mark.parametrize("inplace", [True, False])
def test_read_only_leaves_come_back_read_only_under_every_stage(rule, inplace):
    upd = no.update_ if inplace else no.update
    for dtype in (np.float32, np.float16):
        if dtype == np.float16 and "MixedPrecision" not in repr(rule):
            continue
        ro = np.ones(3, dtype)
        ro.flags.writeable = False
        s, out = upd(no.setup(rule, ro), ro, np.ones(3, dtype))
        assert out is not ro and not out.flags.writeable and (out == 0.5).all() and out.dtype == dtype
        t, tout = upd(no.setup(rule, {"w": ro}), {"w": ro}, {"w": np.ones(3, dtype)})
        assert not tout["w"].flags.writeable and (tout["w"] == 0.5).all() and (ro == 1).all()


def test_none_gradient_skips_a_bare_array_as_in_trees():
    x = np.ones(3)
    s = no.setup(no.Adam(), x)
    s2, x2 = no.update_(s, x, None)
    assert s2 is s and x2 is x and s.t == 0
    s3, x3 = no.update(s, x, None)
    assert s3 is not s and x3 is x and s3.t == 0
    t, m = no.update_(no.setup(no.Adam(), {"w": x}), {"w": x}, {"w": None})
    assert t["w"].t == 0 and m["w"] is x


def test_empty_chain_is_the_identity():
    x = np.array([1.0, 2.0])
    _, y = no.update(no.setup(no.chain(), x), x, np.array([0.5, 0.25]))
    assert y.tolist() == [0.5, 1.75]
    _, m = no.update(no.setup(no.chain(), {"w": x}), {"w": x}, {"w": np.ones(2)})
    assert m["w"].tolist() == [0.0, 1.0]


def test_adjust_reaches_every_member():
    x = np.ones(3, dtype=np.float16)
    s = no.setup(no.chain(no.MixedPrecision(np.float32), no.AccumGrad(1), no.Descent(0.5)), x)
    s2 = no.adjust(s, lr=0.25)
    assert s.rule.rules[-1] == no.Descent(0.5) and s2.rule.rules[-1] == no.Descent(0.25)
    s2, x2 = no.update(s2, x, np.ones(3, dtype=np.float16))
    assert (x2 == 0.75).all() and (x == 1).all()
    no.adjust_(s, lr=0.125)
    s, x = no.update_(s, x, np.ones(3, dtype=np.float16))
    assert (x == 0.875).all()
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        no.adjust(s, beta=0.1)
    tree = no.setup(no.AccumGrad(2, no.Adam()), {"w": np.ones(2)})
    tree = no.adjust(tree, lr=0.5, n=3)
    assert "lr=0.5" in repr(tree) and "AccumGrad(3)" in repr(tree)
