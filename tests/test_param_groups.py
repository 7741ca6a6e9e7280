"""Parameter groups as torch and optax users write them: a tree-scope reduction spans every leaf holding the same
one at the same place, whatever the rest of each leaf's chain (``numbaopt.tree.scopes``); adjusting one subtree;
masks; the trainable arrays with their paths.

Anchors (float64, 50 steps, relative 1e-12): torch ``AdamW`` with two param groups after ``clip_grad_norm_`` (one
group's lr changed mid-run), optax ``chain(clip_by_global_norm, partition(...))`` and
``chain(clip_by_global_norm, contrib.muon(...))``. The compositions (pure and in place, the fast path, AccumGrad,
MixedPrecision, frozen leaves, None gradients, schedules per group, a refused step, checkpoints) are checked
against an independent NumPy reference in tests/test_param_groups_compose.py.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import numbaopt as no
from numbaopt.tree.state import core

STEPS = 50
RNG = np.random.default_rng(0)
A = RNG.standard_normal((20, 6))
Y = 10 * RNG.standard_normal((20, 3))  # far from the fit: the clip is active on every step
W0, B0 = RNG.standard_normal((6, 3)), RNG.standard_normal(3)


def model():
    return {"W": W0.copy(), "b": B0.copy()}


def grads(m):
    """The gradient of the mean squared error of ``A @ W + b`` against ``Y``."""
    r = A @ m["W"] + m["b"] - Y
    return {"W": 2 * A.T @ r / len(A), "b": 2 * r.sum(0) / len(A)}


def close(a, b, rtol=1e-12):
    for k in a:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=rtol, atol=rtol * np.abs(b[k]).max(),
                                   err_msg=k)


def adamw_groups(path, x):
    """Weight decay and a larger lr for the matrix, a smaller lr for the bias: torch's two param groups."""
    wd, lr = (0.01, 0.05) if x.ndim == 2 else (0.0, 0.02)
    return no.chain(no.ClipGlobalNorm(1.0, eps=1e-6), no.AdamW(lr=lr, weight_decay=wd))


# -- the defect: one norm, not one per group -------------------------------------------------------------
def test_one_norm_over_groups_of_different_learning_rates():
    """Norms 3 and 4 (5 in all): the global clip scales both by 1/5; per group each would be clipped to 1."""
    m = {"a": np.zeros(1), "b": np.zeros(2)}
    state = no.setup(lambda p, x: no.chain(no.ClipGlobalNorm(1.0), no.Descent(0.5 if x.size == 1 else 0.25)), m)
    state, m = no.update_(state, m, {"a": np.array([3.0]), "b": np.array([0.0, 4.0])})
    np.testing.assert_allclose(m["a"], [-0.3])
    np.testing.assert_allclose(m["b"], [0.0, -0.2])


# -- anchors -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inplace", [True, False])
def test_torch_adamw_param_groups_after_clip_grad_norm(inplace):
    torch = pytest.importorskip("torch")
    tw = torch.tensor(W0.copy(), requires_grad=True)
    tb = torch.tensor(B0.copy(), requires_grad=True)
    opt = torch.optim.AdamW([{"params": [tw], "lr": 0.05, "weight_decay": 0.01},
                             {"params": [tb], "lr": 0.02, "weight_decay": 0.0}])
    m = model()
    state = no.setup(adamw_groups, m)
    for k in range(STEPS):
        if k == STEPS // 2:  # one group's lr changed mid-run: torch's param_groups[1]["lr"] = ...
            opt.param_groups[1]["lr"] = 0.004
            if inplace:
                no.adjust_(state["b"], lr=0.004)
            else:
                state = no.adjust(state["b"], lr=0.004)  # the whole tree, that part adjusted
        g = grads(m)
        state, m = (no.update_ if inplace else no.update)(state, m, g)
        g = grads({"W": tw.detach().numpy(), "b": tb.detach().numpy()})
        tw.grad, tb.grad = torch.tensor(g["W"]), torch.tensor(g["b"])
        torch.nn.utils.clip_grad_norm_([tw, tb], 1.0)
        opt.step()
    close(m, {"W": tw.detach().numpy(), "b": tb.detach().numpy()})
    assert state["b"].rule.rules[1].lr == 0.004 and state["W"].rule.rules[1].lr == 0.05
    if inplace:
        assert core(state).fast is not None  # the two groups ran on the fast path


def _optax():
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    jax.config.update("jax_enable_x64", True)
    return jax.numpy, optax


def run_optax(tx, steps=STEPS):
    jnp, optax = _optax()
    p = {k: jnp.asarray(v) for k, v in model().items()}
    s = tx.init(p)
    import jax
    update = jax.jit(tx.update)  # one compile; eagerly, muon's loops and clip's cond compile at every step
    for _ in range(steps):
        u, s = update({k: jnp.asarray(v) for k, v in grads({k: np.asarray(x) for k, x in p.items()}).items()}, s, p)
        p = optax.apply_updates(p, u)
    return {k: np.asarray(v) for k, v in p.items()}


def run_ours(rule, steps=STEPS, inplace=True):
    m = model()
    state = no.setup(rule, m)
    for _ in range(steps):
        state, m = (no.update_ if inplace else no.update)(state, m, grads(m))
    return m, state


@pytest.mark.parametrize("inplace", [True, False])
def test_optax_clip_then_partition(inplace):
    _, optax = _optax()
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.partition({"mat": optax.adamw(0.05, weight_decay=0.01), "vec": optax.adam(0.02)},
                                     {"W": "mat", "b": "vec"}))
    ours = no.chain(no.ClipGlobalNorm(1.0),
                    lambda path, x: no.AdamW(0.05, weight_decay=0.01) if x.ndim == 2 else no.Adam(0.02))
    m, _ = run_ours(ours, inplace=inplace)
    close(m, run_optax(tx))


def test_optax_clip_then_muon():
    _, optax = _optax()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.contrib.muon(0.05, beta=0.9, eps=1e-8, weight_decay=0.01))
    ours = no.chain(no.ClipGlobalNorm(1.0), no.muon(0.05, 0.9, 1e-8, 0.01, convention="optax",
                                                    fallback=no.NAdam(0.05, 0.9, 0.999, 1e-8, b2_factor=False)))
    m, state = run_ours(ours)
    close(m, run_optax(tx))
    assert type(state["W"].rule.rules[1]).__name__ == "Muon" and type(state["b"].rule.rules[1]).__name__ == "NAdam"


# -- the scope rule: errors and spans --------------------------------------------------------------------
def test_reductions_that_cannot_be_one_are_refused_at_setup():
    m = {"W": np.ones((2, 2)), "b": np.ones(2)}
    with pytest.raises(ValueError, match=r"model\['W'\] and model\['b'\] hold ClipGlobalNorm.*max_norm 1\.0 vs 2\.0"):
        no.setup(lambda p, x: no.chain(no.ClipGlobalNorm(1.0 if x.ndim == 2 else 2.0), no.Adam()), m)
    with pytest.raises(ValueError, match=r"different places.*\(after Adam\)"):  # the gradient's norm vs the step's
        no.setup(lambda p, x: no.chain(no.ClipGlobalNorm(1.0), no.Adam()) if x.ndim == 2
                 else no.chain(no.Adam(), no.ClipGlobalNorm(1.0)), m)
    with pytest.raises(ValueError, match=r"1 vs 2 ClipGlobalNorm members"):
        no.setup(lambda p, x: no.chain(no.ClipGlobalNorm(1.0), no.Adam()) if x.ndim == 2
                 else no.chain(no.ClipGlobalNorm(1.0), no.Adam(), no.ClipGlobalNorm(1.0)), m)
    with pytest.raises(ValueError, match=r"different settings \(beta2 0\.999 vs 0\.99\)"):  # what finish reads
        no.setup(lambda p, x: no.Prodigy(beta2=0.999 if x.ndim == 2 else 0.99), m)
    with pytest.raises(TypeError, match="span.*ClipNorm is not one"):
        no.ClipNorm(1.0, span="enc")
    with pytest.raises(TypeError, match="non-empty string"):
        no.ClipGlobalNorm(1.0, span=3)


def test_what_may_differ_and_explicit_spans():
    m = {"W": np.zeros((1, 2)), "b": np.zeros(1)}
    g = {"W": np.array([[3.0, 0.0]]), "b": np.array([4.0])}
    # stateless members before the clip and every member after it may differ: one norm (5)
    one = no.setup(lambda p, x: no.chain(no.WeightDecay(0.0), no.ClipGlobalNorm(1.0), no.Descent(1.0)) if x.ndim == 2
                   else no.chain(no.ClipGlobalNorm(1.0), no.Momentum(1.0, 0.5)), m)
    _, out = no.update(one, m, g)
    np.testing.assert_allclose(out["W"], [[-0.6, 0.0]])
    np.testing.assert_allclose(out["b"], [-0.8])
    # span names: a norm per name, on purpose (here each leaf is clipped to 1 on its own)
    apart = no.setup(lambda p, x: no.chain(no.ClipGlobalNorm(1.0, span=p[0].key), no.Descent(1.0)), m)
    _, out = no.update(apart, m, g)
    np.testing.assert_allclose(out["W"], [[-1.0, 0.0]])
    np.testing.assert_allclose(out["b"], [-1.0])
    # Prodigy's lr and weight decay per group, one estimate (torch's param groups): its finish reads neither
    ds = []
    for span in (None, "own"):
        prod = no.setup(lambda p, x, span=span: no.Prodigy(lr=1.0 if x.ndim == 2 else 0.5, d0=1e-3,
                                                           weight_decay=0.1 if x.ndim == 2 else 0.0,
                                                           span=None if span is None else f"{span}{x.ndim}"), m)
        x = {"W": np.ones((1, 2)), "b": np.ones(1)}
        for _ in range(30):
            prod, x = no.update_(prod, x, {k: 2 * v for k, v in x.items()})
        ds.append((float(prod["W"].state["d"]), float(prod["b"].state["d"])))
    assert ds[0][0] == ds[0][1] > 1e-3 and ds[1][0] != ds[1][1]  # one estimate; two with two spans


def test_span_survives_pickle_save_and_load(tmp_path):
    rule = no.chain(no.ClipGlobalNorm(1.0, span="enc"), no.Adam(0.1))
    assert pickle.loads(pickle.dumps(rule)) == rule and "span='enc'" in repr(rule)
    assert rule != no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.1))
    assert rule.replace(lr=0.2).rules[0].span == "enc"
    m = {"a": np.zeros(1), "b": np.zeros(1)}
    state = no.setup(lambda p, x: no.chain(no.ClipGlobalNorm(1.0, span=p[0].key), no.Descent(1.0)), m)
    no.save(tmp_path / "s.npz", state)
    loaded = no.load(tmp_path / "s.npz")
    assert loaded["a"].rule.rules[0].span == "a" and loaded["b"].rule.rules[0].span == "b"
    _, out = no.update(loaded, m, {"a": np.array([3.0]), "b": np.array([4.0])})
    np.testing.assert_allclose([out["a"][0], out["b"][0]], [-1.0, -1.0])  # still two norms


# -- adjusting a part of the tree --------------------------------------------------------------------------
def test_adjust_a_subtree_splits_its_group_and_keeps_the_rest():
    m = {"enc": {"w": np.ones(3), "v": np.ones(2)}, "dec": {"w": np.ones(4)}}
    g = {"enc": {"w": np.full(3, 0.5), "v": np.full(2, 0.5)}, "dec": {"w": np.full(4, 0.5)}}
    state = no.setup(no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.1)), m)
    state, m = no.update_(state, m, g)
    moments = state["enc"]["w"].state["m"].copy()
    ref = no.adjust(state, lr=0.01)  # the whole tree
    pure = no.adjust(state["enc"], lr=0.01)  # a new whole tree, only enc adjusted
    assert state["enc"]["w"].rule.rules[1].lr == 0.1  # the pure form leaves its input alone
    no.adjust_(state["enc"], lr=0.01)
    for s in (state, pure):
        assert s["enc"]["w"].rule.rules[1].lr == s["enc"]["v"].rule.rules[1].lr == 0.01
        assert s["dec"]["w"].rule.rules[1].lr == 0.1
        np.testing.assert_array_equal(s["enc"]["w"].state["m"], moments)
        assert s["enc"]["w"].t == 1
    no.adjust_(state["dec"]["w"], lr=0.01)  # a leaf view
    a, _ = no.update(state, m, g)
    b, _ = no.update(ref, m, g)
    for (p, x), (_, y) in zip(a.leaves(), b.leaves()):
        np.testing.assert_array_equal(x.state["m"], y.state["m"])
        assert x.rule == y.rule, p


def test_adjust_of_a_part_is_checked_before_anything_changes():
    m = {"enc": {"w": np.ones(3)}, "dec": {"w": np.ones(4)}}
    state = no.setup(no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.1)), m)
    before = repr(state)
    with pytest.raises(ValueError, match="would change which leaves a tree-scope reduction spans.*max_norm"):
        no.adjust_(state["enc"], max_norm=2.0)  # a global clip's setting on part of the tree only
    with pytest.raises(ValueError, match=r"unknown hyperparameter 'rho' in state\['enc'\]"):
        no.adjust_(state["enc"], rho=0.5)
    with pytest.raises(ValueError, match="outside"):
        no.adjust_(state["enc"], lr=-1.0)
    assert repr(state) == before
    no.adjust_(state, max_norm=2.0)  # the whole tree: one scope still
    assert state["dec"]["w"].rule.rules[0].max_norm == 2.0


def test_adjust_of_a_part_compiles_nothing():
    from numba.core import event
    m = {"enc": {"w": np.ones(3)}, "dec": {"w": np.ones(4)}}
    g = {"enc": {"w": np.ones(3)}, "dec": {"w": np.ones(4)}}
    state = no.setup(no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.1)), m)
    state, m = no.update_(state, m, g)
    state, m = no.update_(state, m, g)

    class Count(event.Listener):
        n = 0

        def on_start(self, ev):
            Count.n += 1

        def on_end(self, ev):
            pass
    with event.install_listener("numba:compile", Count()):
        no.adjust_(state["enc"], lr=0.01)
        for _ in range(2):
            state, m = no.update_(state, m, g)
        state, _ = no.update(state, m, g)
    assert Count.n == 0


# -- masks and trainables ------------------------------------------------------------------------------------
def test_masked_weight_decay_inside_one_clipped_chain():
    _, optax = _optax()
    is_matrix = lambda path, x: x.ndim == 2
    ours = no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.05), no.masked(no.WeightDecay(1e-3), is_matrix))
    # numbaopt's Adam scales by lr before the weight decay is added; optax's scale_by_adam does not
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(0.05),
                     optax.masked(optax.add_decayed_weights(1e-3), {"W": True, "b": False}), optax.scale(-1.0))
    m, state = run_ours(ours, steps=20)
    close(m, run_optax(tx, steps=20))
    assert [type(r).__name__ for r in state["b"].rule.rules] == ["ClipGlobalNorm", "Adam"]
    only = no.setup(no.masked(no.Adam(), is_matrix), model())  # alone: only the masked leaves are trained
    assert only["b"] is None and only["W"] is not None
    with pytest.raises(TypeError, match=r"model\['b'\].*returned 3, not a rule"):
        no.setup(no.chain(no.ClipGlobalNorm(1.0), lambda p, x: no.Adam() if x.ndim == 2 else 3), model())


def test_trainables_lists_what_setup_trains():
    w = np.ones((2, 2))
    m = {"enc": [w, np.zeros(2, np.float32)], "tied": w, "n": 3, "name": "x", "ro": np.arange(3.0)}
    m["ro"].flags.writeable = False
    got = no.trainables(m)
    assert [str(p) for p, _ in got] == ["['enc'][0]", "['enc'][1]", "['ro']"]
    assert got[0][1] is w
    state = no.setup(no.Adam(), m)
    assert [str(p) for p, _ in state.leaves()] == [str(p) for p, _ in got]


@pytest.mark.parametrize("inplace", [True, False])
def test_a_refusal_across_groups_names_its_leaf_and_writes_nothing(inplace):
    m = {"W": np.ones((2, 2)), "b": np.ones(2), "c": np.ones(3)}
    state = no.setup(lambda p, x: no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.1 if x.ndim == 2 else 0.01)), m)
    g = {"W": np.ones((2, 2)), "b": np.ones(2), "c": np.ones(3)}
    state, m = no.update_(state, m, g)
    state, m = no.update_(state, m, g)  # the fast path's plan
    before = {k: v.copy() for k, v in m.items()}
    moments = [leaf.state["m"].copy() for _, leaf in state.leaves()]
    g["c"] = np.array([1.0, np.inf, 1.0])
    with pytest.raises(ValueError, match=r"grads\['c'\]: ClipGlobalNorm"):
        (no.update_ if inplace else no.update)(state, m, g)
    for k in m:
        np.testing.assert_array_equal(m[k], before[k])
    for (_, leaf), mo in zip(state.leaves(), moments):
        np.testing.assert_array_equal(leaf.state["m"], mo)
        assert leaf.t == 2


def test_two_equal_clips_in_one_chain_are_two_reductions_over_the_groups():
    """chain(clip 1, scale 3, clip 1): the second clip sees the first's output times 3, over both groups."""
    m = {"a": np.zeros(1), "b": np.zeros(1)}
    rule = lambda p, x: no.chain(no.ClipGlobalNorm(1.0), no.Descent(3.0), no.ClipGlobalNorm(1.0),
                                 no.Descent(1.0 if p[0].key == "a" else 0.5))
    _, out = no.update(no.setup(rule, m), m, {"a": np.array([3.0]), "b": np.array([4.0])})
    np.testing.assert_allclose([out["a"][0], out["b"][0]], [-0.6, -0.4])  # |(0.6, 0.8) * 3| = 3: clipped to 1


def test_a_file_whose_groups_cannot_share_a_reduction_is_refused_at_load(tmp_path):
    """A crafted file: the second group's clip given another max_norm in the header."""
    import json
    m = {"W": np.ones((2, 2)), "b": np.ones(2)}
    no.save(tmp_path / "s.npz", no.setup(adamw_groups, m))
    with np.load(tmp_path / "s.npz") as f:
        data = {k: f[k] for k in f.files}
    header = json.loads(bytes(data.pop("__header__")).decode())
    header["groups"][1]["rule"]["chain"][0]["values"]["max_norm"] = 2.0
    np.savez(tmp_path / "bad.npz", **data, __header__=np.frombuffer(json.dumps(header).encode(), np.uint8))
    with pytest.raises(no.CheckpointError, match=r"its groups: setup: .*max_norm 1\.0 vs 2\.0"):
        no.load(tmp_path / "bad.npz")
