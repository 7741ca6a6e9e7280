"""Trees: port-style exact cases (setup/update/update_ over nested models), checked against NumPy."""
import copy
import dataclasses
from collections import namedtuple

import numpy as np
import pytest

import numbaopt as no
from numbaopt.tree import step as tree_step
from numbaopt.tree.state import core


def adam_ref(x, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """Adam's published formula in float64 NumPy (independent of the generated kernels)."""
    x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return x - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps), m, v


def test_descent_on_tuple_model():
    model = (np.array([1.0, 2.0]), np.array([[3.0]]))
    grads = (np.array([0.5, -1.0]), np.array([[2.0]]))
    state = no.setup(no.Descent(0.1), model)
    state, out = no.update(state, model, grads)
    assert type(out) is tuple
    np.testing.assert_array_equal(out[0], model[0] - 0.1 * grads[0])
    np.testing.assert_array_equal(out[1], model[1] - 0.1 * grads[1])
    assert state[0].t == 1 and state[1].t == 1


def test_momentum_state_update_vs_update_():
    model = {"w": np.array([1.0, -2.0, 3.0]), "b": np.array(0.5)}
    grads = {"w": np.array([0.1, 0.2, -0.3]), "b": np.array(1.0)}
    rule = no.Momentum(lr=0.01, momentum=0.9)
    s1, m1 = no.update(no.setup(rule, model), model, grads)
    s2 = no.setup(rule, model)
    model2 = copy.deepcopy(model)
    s2, m2 = no.update_(s2, model2, grads)
    for k in model:
        np.testing.assert_array_equal(s1[k].state["v"], 0.01 * grads[k])
        np.testing.assert_array_equal(s2[k].state["v"], s1[k].state["v"])
        np.testing.assert_array_equal(m1[k], m2[k])
        np.testing.assert_array_equal(m1[k], model[k] - 0.01 * grads[k])
    assert m2 is model2 and m2["w"] is model2["w"]  # mutable dict, writeable arrays: identity kept


def test_tied_arrays_sum_gradients_and_keep_identity():
    w = np.array([1.0, 2.0])
    model = {"enc": w, "dec": w, "other": np.array([5.0])}
    grads = {"enc": np.array([1.0, 1.0]), "dec": np.array([0.5, -2.0]), "other": np.array([1.0])}
    state = no.setup(no.Descent(0.1), model)
    assert state["enc"] is state["dec"]
    before = w.copy()
    s1, m1 = no.update(state, model, grads)
    assert m1["enc"] is m1["dec"] and m1["enc"] is not w
    np.testing.assert_array_equal(w, before)
    np.testing.assert_array_equal(m1["enc"], before - 0.1 * (grads["enc"] + grads["dec"]))
    s2, m2 = no.update_(state, model, grads)
    assert m2["enc"] is w and m2["dec"] is w
    np.testing.assert_array_equal(w, m1["enc"])
    assert s2["enc"].t == 1


def test_tied_occurrence_without_gradient_uses_the_others():
    w = np.array([1.0, 2.0])
    model = [w, w]
    state = no.setup(no.Descent(1.0), model)
    _, out = no.update(state, model, [None, np.array([1.0, 1.0])])
    assert out[0] is out[1]
    np.testing.assert_array_equal(out[0], [0.0, 1.0])


def test_none_gradient_skips_state():
    model = {"a": np.ones(3), "b": {"c": np.ones(2), "d": np.ones(2)}}
    state = no.setup(no.Adam(lr=0.1), model)
    grads = {"a": None, "b": None}
    state, out = no.update_(state, model, {"a": np.ones(3), "b": {"c": np.ones(2), "d": None}})
    assert state["a"].t == 1 and state["b"]["c"].t == 1 and state["b"]["d"].t == 0
    np.testing.assert_array_equal(state["b"]["d"].state["m"], 0)
    np.testing.assert_array_equal(out["b"]["d"], 1.0)
    state, out = no.update_(state, model, grads)  # a whole branch of None
    assert state["a"].t == 1 and state["b"]["c"].t == 1


@dataclasses.dataclass
class Layer:
    w: np.ndarray
    b: np.ndarray
    running_mean: np.ndarray = no.not_trainable(default=None)
    name: str = "layer"


def test_trainable_subset_by_metadata_and_by_chooser():
    layer = Layer(np.ones(2), np.ones(1), np.zeros(2))
    state = no.setup(no.Descent(0.5), layer)
    assert state.running_mean is None and state.w is not None
    grads = Layer(np.ones(2), np.ones(1), np.ones(2))
    _, out = no.update(state, layer, grads)
    np.testing.assert_array_equal(out.running_mean, 0.0)
    np.testing.assert_array_equal(out.w, 0.5)
    assert out.name == "layer"

    def choose(path, leaf):
        return None if path[-1].key == "b" else no.Descent(0.5)

    state = no.setup(choose, layer)
    assert state.b is None
    _, out = no.update(state, layer, grads)
    np.testing.assert_array_equal(out.b, 1.0)
    np.testing.assert_array_equal(out.w, 0.5)


def test_dict_model_with_adam_matches_reference():
    rng = np.random.default_rng(1)
    model = {"w": rng.standard_normal((3, 2)), "v": rng.standard_normal(4)}
    ref = {k: (v.copy(), 0.0, 0.0) for k, v in model.items()}
    state = no.setup(no.Adam(lr=0.01), model)
    for t in range(1, 4):
        grads = {k: rng.standard_normal(v.shape) for k, v in model.items()}
        state, model = no.update_(state, model, grads)
        for k in model:
            x, m, v = ref[k]
            ref[k] = adam_ref(x, grads[k], m, v, t, lr=0.01)
            np.testing.assert_allclose(model[k], ref[k][0], rtol=1e-13, atol=1e-15)
    assert state.w.t == 3


def test_freeze_thaw_sequence():
    model = {"enc": {"w": np.ones(2)}, "dec": np.ones(2)}
    grads = {"enc": {"w": np.ones(2)}, "dec": np.ones(2)}
    state = no.setup(no.Adam(lr=0.1), model)
    no.freeze_(state.enc)
    state, model = no.update_(state, model, grads)
    np.testing.assert_array_equal(model["enc"]["w"], 1.0)
    assert state["enc"]["w"].t == 0 and state["dec"].t == 1
    no.thaw_(state["enc"])
    state, model = no.update_(state, model, grads)
    assert state["enc"]["w"].t == 1 and state["dec"].t == 2
    assert model["enc"]["w"][0] < 1.0
    no.freeze_(state["dec"])  # a single leaf
    state, model = no.update_(state, model, grads)
    assert state["dec"].t == 2 and state["enc"]["w"].t == 2


def test_adjust_keeps_moments_and_never_recompiles():
    model = [np.ones(3, np.float32), np.ones(2, np.float32)]
    grads = [np.full(3, 0.5, np.float32), np.full(2, 2.0, np.float32)]
    state = no.setup(no.Adam(lr=0.1), model)
    state, model = no.update_(state, model, grads)
    kern = core(state).groups[0].mod
    nsig = len(kern.apply.signatures)
    new = no.adjust(state, lr=0.01, beta1=0.8)
    assert new[0].rule.lr == 0.01 and state[0].rule.lr == 0.1
    np.testing.assert_array_equal(new[0].state["m"], state[0].state["m"])
    assert new[0].t == state[0].t == 1
    new, model = no.update_(new, model, grads)
    no.adjust_(state, lr=0.5)
    assert state[1].rule.lr == 0.5 and state[1].hp[0] == 0.5
    with pytest.raises(ValueError, match="valid:.*'lr'"):
        no.adjust(state, learning_rate=1.0)
    assert nsig and core(new).groups[0].mod is kern and len(kern.apply.signatures) == nsig


def test_destructure_round_trip_with_ties():
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    model = {"a": w, "b": (w, 2.5), "c": np.array([1 + 2j], np.complex64), "n": np.arange(3), "s": "x"}
    flat, restructure = no.destructure(model)
    assert flat.shape == (4 + 1 + 1,) and flat.dtype == np.complex128
    out = restructure(flat * 2)
    assert out["a"] is out["b"][0] and out["a"] is not w
    assert out["a"].dtype == np.float32 and out["a"].shape == (2, 2)
    np.testing.assert_array_equal(out["a"], w * 2)
    assert type(out["b"][1]) is float and out["b"][1] == 5.0
    assert out["c"].dtype == np.complex64 and out["c"][0] == 2 + 4j
    assert out["n"] is model["n"] and out["s"] == "x"
    with pytest.raises(ValueError, match="length 6"):
        restructure(flat[:-1])


@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    pair: tuple
    scale: float


@dataclasses.dataclass
class Mutable:
    w: np.ndarray
    items: list


Point = namedtuple("Point", "x y")


def _mixed_model():
    ro = np.array([1.0, -1.0, 0.5])
    ro.flags.writeable = False
    nc = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]  # writeable, not contiguous
    return {
        "f": Frozen(pair=(np.ones(4, np.float32), ro, 0.25), scale=2.0),
        "m": Mutable(w=np.full((2, 2), 3.0), items=[np.array(1.5), Point(np.ones(2), 7)]),
        "nc": nc,
        "z": np.array([1 + 1j, 2 - 1j]),
        "meta": ("label", np.arange(3)),
    }


def _mixed_grads(rng, model, scale=1.0):
    def g(x):
        if isinstance(x, float):
            return float(rng.standard_normal()) * scale
        if x.dtype.kind == "c":
            return (rng.standard_normal(x.shape) + 1j * rng.standard_normal(x.shape)) * scale
        return (rng.standard_normal(x.shape) * scale).astype(x.dtype)
    return {
        "f": Frozen(pair=(g(model["f"].pair[0]), g(model["f"].pair[1]), g(0.0)), scale=g(0.0)),
        "m": Mutable(w=g(model["m"].w), items=[g(model["m"].items[0]), Point(g(np.ones(2)), None)]),
        "nc": g(model["nc"]), "z": g(model["z"]), "meta": None,
    }


def test_mixed_mutability_update_equals_update_bitwise():
    rng = np.random.default_rng(3)
    m_pure = _mixed_model()
    m_inpl = _mixed_model()
    s_pure = no.setup(no.Adam(lr=0.05), m_pure)
    s_inpl = no.setup(no.Adam(lr=0.05), m_inpl)
    keep_ro, keep_nc, keep_mut, keep_list = m_inpl["f"].pair[1], m_inpl["nc"], m_inpl["m"], m_inpl["m"].items
    for _ in range(3):
        grads = _mixed_grads(rng, m_pure)
        snapshot = copy.deepcopy(m_pure)
        s_pure, new_pure = no.update(s_pure, m_pure, grads)
        # pure: nothing passed in changed
        np.testing.assert_array_equal(no.destructure(m_pure)[0], no.destructure(snapshot)[0])
        s_inpl, m_inpl = no.update_(s_inpl, m_inpl, grads)
        np.testing.assert_array_equal(no.destructure(new_pure)[0], no.destructure(m_inpl)[0])
        assert new_pure["f"].scale == m_inpl["f"].scale and type(m_inpl["f"].scale) is float
        m_pure = new_pure
    # identities after update_: mutable containers and writeable arrays kept, immutable ones rebuilt
    assert m_inpl["m"] is keep_mut and m_inpl["m"].items is keep_list and m_inpl["nc"] is keep_nc
    assert m_inpl["f"].pair[1] is not keep_ro and not m_inpl["f"].pair[1].flags.writeable
    assert type(m_inpl["m"].items[1]) is Point and m_inpl["m"].items[1].y == 7
    assert m_inpl["meta"][0] == "label"
    # the float64 leaves follow the published formula
    x, mm, vv = np.full((2, 2), 3.0), 0.0, 0.0
    rng = np.random.default_rng(3)
    m_ref = _mixed_model()
    for t in range(1, 4):
        gw = _mixed_grads(rng, m_ref)["m"].w
        x, mm, vv = adam_ref(x, gw, mm, vv, t, lr=0.05)
    np.testing.assert_allclose(m_inpl["m"].w, x, rtol=1e-13)


def test_pure_update_touches_nothing_and_returns_new_arrays():
    rng = np.random.default_rng(0)
    model = {"a": [np.ones(3, np.float32), np.ones((2, 2))], "b": 1.0}
    grads = {"a": [np.ones(3, np.float32), np.ones((2, 2))], "b": 0.5}
    state = no.setup(no.Adam(), model)
    st_before = [a.copy() for g in core(state).groups for a in g.arenas]
    model_copy, grads_copy = copy.deepcopy(model), copy.deepcopy(grads)
    ids = [id(x) for x in model["a"]]
    new_state, new = no.update(state, model, grads)
    assert [id(x) for x in model["a"]] == ids
    for a, b in zip(model["a"] + grads["a"], model_copy["a"] + grads_copy["a"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip([a for g in core(state).groups for a in g.arenas], st_before):
        np.testing.assert_array_equal(a, b)
    assert all(n is not o for n, o in zip(new["a"], model["a"])) and new is not model
    assert state["a"][0].t == 0 and new_state["a"][0].t == 1
    assert rng is not None


def test_fast_path_engages_and_falls_back_correctly():
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(8).astype(np.float32) for _ in range(5)]
    ref = [x.copy() for x in xs]
    s_ref = no.setup(no.Adam(lr=0.1), ref)
    state = no.setup(no.Adam(lr=0.1), xs)
    for step in range(4):
        gs = [rng.standard_normal(8).astype(np.float32) for _ in range(5)]
        if step == 2:
            xs[1] = xs[1].copy()  # a replaced leaf: the fast plan must notice
            gs[3] = gs[3].astype(np.float64)  # a gradient of another dtype: general path casts
        state, xs = no.update_(state, xs, gs)
        s_ref, ref = no.update(s_ref, ref, gs)
        assert core(state).fast is not None
        for a, b in zip(xs, ref):
            np.testing.assert_array_equal(a, b)


def test_python_scalar_and_readonly_leaves():
    ro = np.ones(2)
    ro.flags.writeable = False
    model = (2.0, ro, 1 + 1j)
    state = no.setup(no.Descent(0.5), model)
    state, out = no.update_(state, model, (1.0, np.ones(2), 2.0 + 0j))
    assert out[0] == 1.5 and type(out[0]) is float
    assert out[1] is not ro and not out[1].flags.writeable and np.all(ro == 1)
    assert out[2] == 0 + 1j and type(out[2]) is complex


def test_state_prints_rules_steps_and_shapes():
    model = {"enc": Layer(np.ones((2, 3), np.float32), np.ones(3, np.float32))}
    state = no.setup(no.Adam(lr=0.01), model)
    state, _ = no.update_(state, model, {"enc": Layer(np.ones((2, 3), np.float32), np.ones(3, np.float32))})
    text = repr(state)
    assert "Adam(lr=0.01" in text and "t=1" in text and "float32[2×3]" in text and ".running_mean" in text
    assert "['enc']" in text and "Layer" in text
    assert isinstance(state.enc, no.StateNode)
    assert state["enc"].w.state["m"].shape == (2, 3)


def test_registered_container_and_declared_trainable_children():
    class Block:
        __numbaopt_trainable__ = ("w",)

        def __init__(self, w, frozen_w):
            self.w, self.frozen_w = w, frozen_w

    no.register_container(Block, lambda b: [("w", b.w), ("frozen_w", b.frozen_w)],
                          lambda b, vals: Block(*vals), setitem=lambda b, k, v: setattr(b, k, v))
    blk = Block(np.ones(2), np.ones(2))
    state = no.setup(no.Descent(1.0), [blk])
    assert state[0].frozen_w is None
    state, out = no.update_(state, [blk], [Block(np.ones(2), np.ones(2))])
    assert out[0] is blk
    np.testing.assert_array_equal(blk.w, 0.0)
    np.testing.assert_array_equal(blk.frozen_w, 1.0)
    _, out2 = no.update(state, [blk], [Block(np.ones(2), np.ones(2))])
    assert out2[0] is not blk and np.all(out2[0].w == -1.0) and np.all(blk.w == 0.0)


def test_tree_scope_reduction_over_one_group_matches_flat_array():
    rule = no.chain(no.ClipGlobalNorm(max_norm=1.0), no.Descent(0.1))
    a, b = np.array([3.0, 0.0]), np.array([[4.0]])
    ga, gb = np.array([3.0, 0.0]), np.array([[4.0]])
    state = no.setup(rule, [a, b])
    _, out = no.update(state, [a, b], [ga, gb])
    flat = np.array([3.0, 0.0, 4.0])
    _, ref = no.update(no.setup(rule, flat), flat, np.array([3.0, 0.0, 4.0]))
    np.testing.assert_array_equal(np.concatenate([out[0].ravel(), out[1].ravel()]), ref)
    # across dtypes (two groups) the norm still spans both leaves: the partial sums are combined
    b32 = b.astype(np.float32)
    _, out = no.update(no.setup(rule, [a, b32]), [a, b32], [ga, gb.astype(np.float32)])
    assert out[1].dtype == np.float32
    np.testing.assert_allclose(np.concatenate([out[0].ravel(), out[1].ravel()]), ref, rtol=1e-7)


def test_host_wrapper_leaves_and_float16_message():
    model = {"h": np.ones(4, np.float16), "w": np.ones(2)}
    with pytest.raises(TypeError, match=r"model\['h'\].*MixedPrecision"):
        no.setup(no.Descent(0.5), model)
    rule = lambda path, x: no.MixedPrecision(np.float32, no.Descent(0.5)) if x.dtype == np.float16 \
        else no.Descent(0.5)  # noqa: E731
    state = no.setup(rule, model)
    state, out = no.update_(state, model, {"h": np.ones(4, np.float16), "w": np.ones(2)})
    assert out["h"].dtype == np.float16 and np.all(out["h"] == 0.5) and np.all(out["w"] == 0.5)
    assert state["h"].t == 1


def test_device_arrays_point_to_the_cuda_backend():
    class FakeDevice:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(TypeError, match=r"numbaopt\[cuda\]"):
        no.setup(no.Adam(), {"w": FakeDevice()})


def test_scheduled_lr_on_a_tree():
    sched = no.schedules.linear(0.1, 0.0, 10) if hasattr(no.schedules, "linear") else None
    if sched is None:
        pytest.skip("no linear schedule in this build")
    model = [np.ones(2), np.ones(3)]
    state = no.setup(no.Descent(lr=sched), model)
    for t in range(1, 3):
        state, model = no.update_(state, model, [np.ones(2), None if t == 1 else np.ones(3)])
    # leaf 0 took steps 1 and 2; leaf 1 only its step 1 (at the second call)
    np.testing.assert_allclose(model[0], 1 - sched(1) - sched(2))
    np.testing.assert_allclose(model[1], 1 - sched(1))


class Pair:
    """A user container registered below (immutable: no setitem)."""

    def __init__(self, a, b):
        self.a, self.b = a, b


no.register_container(Pair, lambda p: [("a", p.a), ("b", p.b)], lambda p, vals: Pair(*vals))


def test_fast_path_on_nested_containers_matches_general_path(monkeypatch):
    rng = np.random.default_rng(7)

    def make():
        r = np.random.default_rng(1)
        f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
        return {"enc": [Layer(f(2, 3), f(3)), Layer(f(3, 3), f(3))], "pt": Point(f(2), "tag"),
                "pair": Pair(f(4), (f(1), 3)), 5: f(2)}

    def grads_for(m):
        g = lambda x: rng.standard_normal(x.shape).astype(np.float32)  # noqa: E731
        return {"enc": [Layer(g(L.w), g(L.b)) for L in m["enc"]], "pt": Point(g(m["pt"].x), None),
                "pair": Pair(g(m["pair"].a), (g(m["pair"].b[0]), None)), 5: g(m[5])}

    fast_m, ref_m = make(), make()
    s_fast, s_ref = no.setup(no.Adam(lr=0.1), fast_m), no.setup(no.Adam(lr=0.1), ref_m)
    for _ in range(3):
        g = grads_for(fast_m)
        s_fast, out = no.update_(s_fast, fast_m, g)
        assert out is fast_m
        s_ref, ref_m = no.update(s_ref, ref_m, g)
        np.testing.assert_array_equal(no.destructure(fast_m)[0], no.destructure(ref_m)[0])
    assert core(s_fast).fast is not None
    with monkeypatch.context() as mp:  # the next good step must not reach the general path
        mp.setattr(tree_step, "collect", lambda *a: pytest.fail("general path used"))
        no.update_(s_fast, fast_m, grads_for(fast_m))
    g = grads_for(fast_m)
    g["pair"] = (g["pair"].a, g["pair"].b)
    with pytest.raises(TypeError, match=r"grads\['pair'\]: expected .*Pair, got tuple"):
        no.update_(s_fast, fast_m, g)


def test_adjust_reaches_wrapped_leaves():
    model = {"h": np.ones(2, np.float16), "w": np.ones(2)}
    rule = lambda path, x: no.MixedPrecision(np.float32, no.Descent(0.5)) if x.dtype == np.float16 \
        else no.Descent(0.5)  # noqa: E731
    state = no.setup(rule, model)
    new = no.adjust(state, lr=0.25)
    assert new["h"].rule.rules[-1].lr == 0.25 and state["h"].rule.rules[-1].lr == 0.5
    new, out = no.update(new, model, {"h": np.ones(2, np.float16), "w": np.ones(2)})
    assert np.all(out["h"] == 0.75) and np.all(out["w"] == 0.75)


def test_fast_plan_follows_a_new_model(monkeypatch):
    a = [np.ones(3), np.ones(2)]
    state = no.setup(no.Descent(0.5), a)
    state, a = no.update_(state, a, [np.ones(3), np.ones(2)])
    b = copy.deepcopy(a)  # other arrays: the old plan cannot serve them
    state, b = no.update_(state, b, [np.ones(3), np.ones(2)])
    with monkeypatch.context() as mp:
        mp.setattr(tree_step, "collect", lambda *a: pytest.fail("general path used"))
        state, b = no.update_(state, b, [np.ones(3), np.ones(2)])
    np.testing.assert_array_equal(b[0], -0.5)
    np.testing.assert_array_equal(a[0], 0.5)


@pytest.mark.parametrize("pure", [False, True])
def test_skip_non_finite_skips_the_whole_tree(pure):
    ro = np.ones(2)
    ro.flags.writeable = False
    model = {"a": np.ones(3), "b": [np.ones(2), ro, 1.5]}
    state = no.setup(no.SkipNonFinite(no.Adam(lr=0.1)), model)
    good = {"a": np.ones(3), "b": [np.ones(2), np.ones(2), 1.0]}
    state, model = no.update_(state, model, good)
    before = no.destructure(model)[0].copy()
    bad = {"a": np.ones(3), "b": [np.array([1.0, np.nan]), np.ones(2), 1.0]}
    state, model = (no.update if pure else no.update_)(state, model, bad)
    np.testing.assert_array_equal(no.destructure(model)[0], before)
    assert all(leaf.t == 1 and leaf.skipped == 1 for _, leaf in state.leaves())
    state, model = no.update_(state, model, good)
    assert all(leaf.t == 2 for _, leaf in state.leaves())


def test_tied_zero_d_arrays_and_scalar_sums():
    # the sum of two 0-d gradients is a NumPy scalar, which must become an array again
    w = np.array(2.0)
    model = {"a": w, "b": [w, np.array(1.0, np.float32)]}
    grads = {"a": np.array(1.0), "b": [np.array(0.5), np.float32(2.0)]}
    state = no.setup(no.Descent(0.5), model)
    s1, pure = no.update(state, model, grads)
    assert pure["a"] is pure["b"][0] and float(pure["a"]) == 2.0 - 0.5 * 1.5
    state, out = no.update_(state, model, grads)
    assert out["a"] is w and float(w) == 1.25 and float(out["b"][1]) == 0.0


def test_fast_path_with_frozen_leaves(monkeypatch):
    rng = np.random.default_rng(11)
    mk = lambda: {"a": [np.ones(3, np.float32), np.ones(2, np.float32)], "b": np.ones(4)}  # noqa: E731
    steps = [{"a": [rng.standard_normal(3).astype(np.float32), rng.standard_normal(2).astype(np.float32)],
              "b": rng.standard_normal(4)} for _ in range(3)]
    for g in steps[1:]:
        g["a"][1] = np.zeros(5)  # a frozen leaf's gradient is ignored (not even checked)
    ref_m = mk()
    s_ref = no.setup(no.Adam(lr=0.1), ref_m)
    no.freeze_(s_ref["a"][1])
    for g in steps:
        s_ref, ref_m = no.update(s_ref, ref_m, g)
    fast_m = mk()
    s_fast = no.setup(no.Adam(lr=0.1), fast_m)
    no.freeze_(s_fast["a"][1])
    s_fast, fast_m = no.update_(s_fast, fast_m, steps[0])
    with monkeypatch.context() as mp:
        mp.setattr(tree_step, "collect", lambda *a: pytest.fail("general path used"))
        for g in steps[1:]:
            s_fast, fast_m = no.update_(s_fast, fast_m, g)
    np.testing.assert_array_equal(no.destructure(fast_m)[0], no.destructure(ref_m)[0])
    assert s_fast["a"][1].t == 0 and s_fast["a"][0].t == 3 and s_fast.b.t == 3
    np.testing.assert_array_equal(fast_m["a"][1], 1.0)


def test_deepcopy_of_a_state_is_independent():
    model = [np.ones(2), np.ones(3)]
    state = no.setup(no.Momentum(lr=0.1), model)
    no.freeze_(state[1])
    twin = copy.deepcopy(state)
    state, model = no.update_(state, model, [np.ones(2), np.ones(3)])
    assert state[0].t == 1 and twin[0].t == 0 and core(twin).frozen[1]
    np.testing.assert_array_equal(twin[0].state["v"], 0.0)


def test_array_likes_are_immutable_leaves():
    class Frozen1D:  # an __array__ object NumPy cannot write through (like a JAX array)
        def __init__(self, values):
            self._v = np.array(values, dtype=np.float32)

        def __array__(self, dtype=None, copy=None):
            return self._v.copy()

    leaf = Frozen1D([1.0, 2.0])
    model = {"p": leaf}
    state = no.setup(no.Descent(0.5), model)
    state, out = no.update_(state, model, {"p": np.ones(2, np.float32)})
    assert out["p"] is not leaf and type(out["p"]) is np.ndarray and out["p"].dtype == np.float32
    np.testing.assert_array_equal(out["p"], [0.5, 1.5])
    np.testing.assert_array_equal(leaf._v, [1.0, 2.0])
