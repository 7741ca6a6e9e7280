"""save/load of tree states: bitwise continuation, atomic writes, clear errors on bad files; files of real
stepped states (skips, AccumGrad cycles, counters at their limit, classes of your own) load. Crafted and damaged
files: tests/test_checkpoint_hostile.py; killed writers: tests/test_checkpoint_kill.py."""
import dataclasses
import json
import os

import numpy as np
import pytest

import numbaopt as no
from numbaopt.tree.state import core


@dataclasses.dataclass
class Net:
    layers: list
    scale: float


def _model():
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    return Net(layers=[{"w": w, "b": np.zeros(3, np.float32)}, {"w": w, "b": np.ones(3)}], scale=0.5)


def _grads(rng):
    f32 = np.float32
    return Net(layers=[{"w": rng.standard_normal((2, 3)).astype(f32), "b": rng.standard_normal(3).astype(f32)},
                       {"w": rng.standard_normal((2, 3)).astype(f32), "b": None}], scale=float(rng.standard_normal()))


def test_round_trip_continues_bitwise(tmp_path):
    rule = lambda path, x: no.Momentum(lr=0.1) if path[-1].key == "b" else no.Adam(lr=0.01)  # noqa: E731
    rng = np.random.default_rng(0)
    grads = [_grads(rng) for _ in range(4)]
    m1 = _model()
    s1 = no.setup(rule, m1)
    for g in grads:
        s1, m1 = no.update_(s1, m1, g)

    m2 = _model()
    s2 = no.setup(rule, m2)
    for g in grads[:2]:
        s2, m2 = no.update_(s2, m2, g)
    no.freeze_(s2.layers[1].b)
    no.thaw_(s2.layers[1].b)
    path = tmp_path / "opt.npz"
    no.save(path, s2)
    s3 = no.load(path)
    assert repr(s3) == repr(s2)
    assert s3.layers[0].w is s3.layers[1].w  # the tie survives
    for g in grads[2:]:
        s3, m2 = no.update_(s3, m2, g)
    np.testing.assert_array_equal(no.destructure(m1)[0], no.destructure(m2)[0])
    assert m2.layers[0]["w"] is m2.layers[1]["w"]
    assert s3.layers[0].w.t == 4 and s3.layers[1].b.t == 0
    np.testing.assert_array_equal(s3.layers[0].w.state["v"], s1.layers[0].w.state["v"])


def test_frozen_flags_and_hyperparameters_survive(tmp_path):
    model = {"a": np.ones(2), "b": np.ones(2)}
    state = no.adjust(no.setup(no.Adam(), model), lr=0.25)
    no.freeze_(state.a)
    no.save(tmp_path / "s.npz", state)
    back = no.load(tmp_path / "s.npz")
    assert back.b.rule.lr == 0.25 and core(back).frozen.tolist() == [True, False]


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "s.npz"
    state = no.setup(no.Descent(), {"w": np.ones(3)})
    no.save(path, state)
    old = path.read_bytes()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        no.save(path, state)
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["s.npz"]  # no temporary file left behind


def test_corrupt_and_mismatched_files(tmp_path):
    path = tmp_path / "s.npz"
    no.save(path, no.setup(no.Adam(), {"w": np.ones(3)}))
    raw = path.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="not a readable numbaopt state file"):
        no.load(tmp_path / "trunc.npz")
    np.savez(tmp_path / "other.npz", x=np.ones(2))
    with pytest.raises(ValueError, match="load:"):
        no.load(tmp_path / "other.npz")

    def rewrite(name, edit):
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
        header = json.loads(bytes(data["__header__"]).decode())
        edit(header, data)
        data["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
        np.savez(tmp_path / name, **data)
        return tmp_path / name

    with pytest.raises(ValueError, match="format version"):
        no.load(rewrite("v.npz", lambda h, d: h.update(version=99)))
    with pytest.raises(ValueError, match="g0_a0 is float64"):
        no.load(rewrite("a.npz", lambda h, d: d.update(g0_a0=np.ones(5, np.float64))))
    with pytest.raises(ValueError, match="not a numbaopt Rule"):
        no.load(rewrite("r.npz", lambda h, d: h["groups"][0]["rule"].update(rule="os:getcwd")))
    with pytest.raises(ValueError, match="not imported"):
        no.load(rewrite("m.npz", lambda h, d: h["groups"][0]["rule"].update(rule="no_such_module:X")))
    # a file cannot make load import (run) a module: `this` prints when imported
    import sys
    assert "this" not in sys.modules
    with pytest.raises(ValueError, match=r"this:s is in a module that is not imported \(this\)"):
        no.load(rewrite("t.npz", lambda h, d: h["groups"][0]["rule"].update(rule="this:s")))
    assert "this" not in sys.modules
    with pytest.raises(ValueError, match="unknown code"):
        no.load(rewrite("u.npz", lambda h, d: h["groups"][0]["rule"].update(rule="numbaopt.rules:NoSuchRule")))
    with pytest.raises(ValueError, match="hyperparameter lr"):
        no.load(rewrite("h.npz", lambda h, d: h["groups"][0]["rule"]["values"].update(lr=-1.0)))

    # a loaded state still checks the model it is used with
    state = no.load(path)
    with pytest.raises(ValueError, match=r"model\['w'\]: shape \(4,\)"):
        no.update_(state, {"w": np.ones(4)}, {"w": np.ones(4)})
    with pytest.raises(TypeError, match=r"model: expected dict, got list"):
        no.update_(state, [np.ones(3)], [np.ones(3)])


def test_chains_complex_tuple_keys_and_namedtuples(tmp_path):
    from collections import namedtuple
    P = namedtuple("P", "re im")
    rule = no.chain(no.WeightDecay(0.01), no.ClipGlobalNorm(1.0), no.Adam(lr=0.1))
    model = {("a", 1): P(np.ones(2, np.complex128), np.array(0.5 + 0j)), 7: np.ones(3, np.complex128)}
    grads = {("a", 1): P(np.full(2, 1 - 1j), np.array(2j)), 7: np.full(3, 0.5 + 0j)}
    s1 = no.setup(rule, model)
    s1, m1 = no.update(s1, model, grads)
    no.save(tmp_path / "c.npz", s1)
    s2 = no.load(tmp_path / "c.npz")
    assert s2[("a", 1)].re.rule == s1[("a", 1)].re.rule
    s1, out1 = no.update(s1, m1, grads)
    s2, out2 = no.update(s2, m1, grads)
    np.testing.assert_array_equal(no.destructure(out1)[0], no.destructure(out2)[0])
    assert type(out2[("a", 1)]) is P


@pytest.mark.parametrize("make", [lambda s: s.linear(0.1, 0.0, 10), lambda s: s.piecewise_constant([0.1, 0.01], [2])])
def test_scheduled_hyperparameters_round_trip(tmp_path, make):
    sched = make(no.schedules)
    m1 = [np.ones(2)]
    s1 = no.setup(no.Adam(lr=sched), m1)
    s1, m1 = no.update_(s1, m1, [np.ones(2)])
    no.save(tmp_path / "s.npz", s1)
    s2, m2 = no.load(tmp_path / "s.npz"), [m1[0].copy()]
    for _ in range(3):
        s1, m1 = no.update_(s1, m1, [np.ones(2)])
        s2, m2 = no.update_(s2, m2, [np.ones(2)])
    np.testing.assert_array_equal(m1[0], m2[0])


def test_one_array_state_round_trips_bitwise(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(9).astype(np.float32)
    s = no.setup(no.chain(no.ClipNorm(1.0), no.Adam(no.exponential(0.1, 0.9))), x)
    for _ in range(4):
        s, x = no.update_(s, x, rng.standard_normal(9).astype(np.float32))
    s = no.adjust(s, beta1=0.8)
    no.save(tmp_path / "leaf.npz", s)
    s2 = no.load(tmp_path / "leaf.npz")
    assert type(s2) is no.Leaf and s2.t == 4 and s2.rule == s.rule and s2.hp.tobytes() == s.hp.tobytes()
    x2 = x.copy()
    for _ in range(4):
        g = rng.standard_normal(9).astype(np.float32)
        s, x = no.update_(s, x, g)
        s2, x2 = no.update_(s2, x2, g)
    assert x.tobytes() == x2.tobytes() and all(a.tobytes() == b.tobytes() for a, b in zip(s.arrays, s2.arrays))
    # a leaf of a tree's state saves as one array's state (a detached copy)
    tree = no.setup(no.Momentum(0.1), {"w": np.ones(3), "b": np.zeros(2)})
    tree, _ = no.update(tree, {"w": np.ones(3), "b": np.zeros(2)}, {"w": np.ones(3), "b": np.ones(2)})
    no.save(tmp_path / "w.npz", tree["w"])
    w = no.load(tmp_path / "w.npz")
    assert type(w) is no.Leaf and w.t == 1 and np.array_equal(w.state["v"], tree["w"].state["v"])


def test_gpu_state_without_a_gpu_is_a_clear_error(tmp_path):
    """A file holding GPU state (here: a leaf's header marked as such) needs a GPU to load."""
    path = tmp_path / "s.npz"
    no.save(path, no.setup(no.Adam(), np.ones(3)))
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    header = json.loads(bytes(data["__header__"]).decode())
    header["leaf"]["device"] = True
    data["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    np.savez(tmp_path / "d.npz", **data)
    from numbaopt.backends.cuda import cuda_available
    if cuda_available():
        pytest.skip("this process can use CUDA (or its simulator)")
    with pytest.raises(RuntimeError, match=r"the state is GPU state, which goes back to a GPU"):
        no.load(tmp_path / "d.npz")


def test_wrapped_rule_states_round_trip_bitwise(tmp_path):
    """AccumGrad (mid-cycle) and MixedPrecision (float16 parameters, float32 master), alone, chained and in a
    tree, continue bitwise after save/load."""
    rng = np.random.default_rng(8)

    def model():
        return {"w": np.linspace(-1, 1, 5), "h": np.linspace(-1, 1, 4).astype(np.float16),
                "acc": np.ones(3, np.float32)}

    def choose(path, x):
        if x.dtype == np.float16:
            return no.chain(no.MixedPrecision(np.float32), no.AccumGrad(2), no.Adam(0.05))
        if x.dtype == np.float32:
            return no.AccumGrad(3, no.Momentum(0.1))
        return no.Adam(0.05)

    def grads():
        return {"w": rng.standard_normal(5), "h": rng.standard_normal(4).astype(np.float16),
                "acc": rng.standard_normal(3).astype(np.float32)}

    m = model()
    state = no.setup(choose, m)
    for _ in range(4):  # AccumGrad(3) is mid-cycle now
        state, m = no.update_(state, m, grads())
    no.save(tmp_path / "w.npz", state)
    loaded = no.load(tmp_path / "w.npz")
    assert loaded["acc"].count == 1 and loaded["h"].master.dtype == np.float32
    assert loaded["h"].master.tobytes() == state["h"].master.tobytes()
    m2 = {k: v.copy() for k, v in m.items()}
    for _ in range(5):
        g = grads()
        state, m = no.update_(state, m, g)
        loaded, m2 = no.update_(loaded, m2, {k: v.copy() for k, v in g.items()})
    for k in m:
        assert m[k].tobytes() == m2[k].tobytes(), k
    # one array's wrapped state
    x = np.linspace(0, 1, 6).astype(np.float16)
    s = no.setup(no.MixedPrecision(np.float32, no.Adam(0.1)), x)
    s, x = no.update_(s, x, np.ones(6, np.float16))
    no.save(tmp_path / "mp.npz", s)
    s2 = no.load(tmp_path / "mp.npz")
    assert type(s2) is no.Leaf and s2.t == 1 and s2.master.tobytes() == s.master.tobytes()
    with pytest.raises(TypeError, match="expected a state from numbaopt.setup"):
        no.save(tmp_path / "x.npz", {"w": np.ones(3)})
    with np.load(tmp_path / "mp.npz") as z:
        data = {k: z[k] for k in z.files}
    data["leaf_master"] = data["leaf_master"][:3]
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(ValueError, match=r"leaf_master is float32\[3\], expected float32\[6\]"):
        no.load(tmp_path / "bad.npz")


def _fingerprint(state):
    """What a state is: its repr and every array and counter, bitwise."""
    if isinstance(state, no.Leaf):
        return repr(state), [a.tobytes() for a in state.arrays], state.counters.tobytes(), state.hp.tobytes()
    c = core(state)
    return repr(state), [(tuple(a.tobytes() for a in g.arenas), g.C.tobytes(), g.hp.tobytes()) for g in c.groups], \
        c.frozen.tobytes(), [str(p) for p in c.structure.paths]


def test_files_of_real_stepped_states_load(tmp_path):
    """Skips before and after an AccumGrad, cycles cut short by adjusting n, tied and frozen leaves: each
    intermediate state saves and loads, with the same counters."""
    nan = np.full(3, np.nan)
    grads = [np.ones(3), nan, np.ones(3), np.ones(3), nan, np.ones(3), np.ones(3), np.ones(3)]
    for rule in (no.chain(no.NonFiniteGuard(), no.AccumGrad(3), no.Adam(0.1)),
                 no.chain(no.AccumGrad(3), no.NonFiniteGuard(), no.Adam(0.1)), no.SkipNonFinite(no.Adam(0.1))):
        x = np.ones(3)
        s = no.setup(rule, x)
        for k, g in enumerate(grads):
            s, x = no.update_(s, x, g)
            if k == 3 and s.layout.accum is not None:
                s = no.adjust(s, n=1.0)  # a count >= n is a real state
            no.save(tmp_path / "s.npz", s)
            assert no.load(tmp_path / "s.npz").counters.tolist() == s.counters.tolist()
    model = {"w": np.ones(3), "v": [np.ones(2)]}
    model["tied"] = model["w"]
    tree = no.setup(no.chain(no.NonFiniteGuard(), no.AccumGrad(2), no.Adam(0.1)), model)
    no.freeze_(tree["v"][0])
    for g in (1.0, np.nan, 1.0, 1.0):
        tree, model = no.update_(tree, model, {"w": np.full(3, g), "v": [np.full(2, g)], "tied": np.full(3, g)})
        no.save(tmp_path / "t.npz", tree)
        assert _fingerprint(no.load(tmp_path / "t.npz")) == _fingerprint(tree)


def test_rules_schedules_and_keys_of_your_own_load(tmp_path):
    """Classes defined anywhere (here: in a function) are found among the subclasses that exist; a schedule
    without ``_params`` is rebuilt from its attributes; brackets and quotes in keys are not nesting."""

    class Halve(no.Rule):
        lr = no.hyper(0.5, low=0.0)

        @staticmethod
        def step(g, x, lr):
            return lr * g

    class Every(no.schedules.Schedule):
        def __init__(self, value, period):
            self.value, self.period = float(value), int(period)

        def values(self, ts):
            return np.where(np.asarray(ts) % self.period == 0, self.value, 0.0)

    warm = no.schedules.warmup_cosine(0.1, 5, 50)
    model = {'a"[{': np.ones(2), "\\": [np.ones(3)], ("t", 1.5, None, True): np.ones(1)}
    rule = lambda path, x: Halve(Every(0.25, 3)) if x.size == 3 else no.Adam(warm, beta1=0.8)  # noqa: E731
    state = no.setup(rule, model)
    no.save(tmp_path / "s.npz", state)
    back = no.load(tmp_path / "s.npz")
    assert _fingerprint(back) == _fingerprint(state)
    sched = back["\\"][0].rule.lr
    assert type(back["\\"][0].rule) is Halve and type(sched) is Every and vars(sched) == {"value": 0.25, "period": 3}
    assert back['a"[{'].rule.lr == warm


def test_counters_at_their_limit_load_and_step(tmp_path):
    s = no.setup(no.Adam(0.01), np.ones(4))
    s.counters[:2] = 2 ** 53 - 1
    no.save(tmp_path / "s.npz", s)
    s2, x = no.update(no.load(tmp_path / "s.npz"), np.ones(4), np.ones(4))
    assert s2.t == 2 ** 53 and np.isfinite(x).all()
    no.save(tmp_path / "s.npz", s2)
    s3, _ = no.update(s2, x, np.ones(4))
    with pytest.raises(ValueError, match=r"save: the state: step counter t=9007199254740993 is outside"):
        no.save(tmp_path / "s.npz", s3)  # nothing load would refuse is written
    assert no.load(tmp_path / "s.npz").t == 2 ** 53


def test_model_deeper_than_a_checkpoint_holds_is_refused_by_save(tmp_path):
    deep = shallow = np.ones(2)
    for _ in range(300):
        deep = [deep]
    for _ in range(200):
        shallow = {"k": shallow}
    no.save(tmp_path / "ok.npz", no.setup(no.Descent(0.1), shallow))
    assert repr(no.load(tmp_path / "ok.npz")) == repr(no.setup(no.Descent(0.1), shallow))
    with pytest.raises(ValueError, match="save: the state's description nests 60[0-9] levels"):
        no.save(tmp_path / "deep.npz", no.setup(no.Descent(0.1), deep))
    assert sorted(os.listdir(tmp_path)) == ["ok.npz"]
