"""``state_dict`` / ``load_state_dict`` / ``load(sd)``: plain content keyed by the model's paths, the same state
as ``save`` + ``load``, every check of ``load`` (naming the path), and nothing written on a refusal."""
import copy
import io
import json

import numpy as np
import pytest

import numbaopt as no
from numbaopt.tree.state import core
from test_pickle import CASES, contents, grads_like, model_bytes, setup_case, step_both


def _plain(v, where="sd"):
    """Every value is a NumPy array or a plain Python value (dicts keyed by str)."""
    if isinstance(v, dict):
        assert all(type(k) is str for k in v), where
        for k, x in v.items():
            _plain(x, f"{where}[{k!r}]")
    elif isinstance(v, list):
        for k, x in enumerate(v):
            _plain(x, f"{where}[{k}]")
    else:
        assert v is None or type(v) in (np.ndarray, str, int, float, bool), (where, type(v))


@pytest.mark.parametrize("case", list(CASES))
def test_state_dict_loads_as_save_and_load(case, tmp_path):
    state, _ = setup_case(case, 4, frozen=True)
    sd = no.state_dict(state)
    _plain(sd)
    no.save(tmp_path / "s.npz", state)
    via_file, via_dict = no.load(tmp_path / "s.npz"), no.load(sd)
    assert type(via_dict) is type(via_file) is type(state)
    assert contents(via_dict) == contents(via_file)
    assert contents(via_dict, hp=False) == contents(state, hp=False)
    if isinstance(state, no.StateTree):
        a, b = core(via_dict).structure, core(via_file).structure
        assert [str(p) for p in a.paths] == [str(p) for p in b.paths] and a.u_positions == b.u_positions
        assert a.pos_u == b.pos_u and a.u_shape == b.u_shape and a.u_dtype == b.u_dtype


def test_entries_are_keyed_by_the_paths_messages_name():
    state, model = setup_case("tree", 3, frozen=True)
    sd = no.state_dict(state)
    assert list(sd["leaves"]) == ["['enc'].w", "['enc'].b", "['dec'][0]", "['f'].w", "['f'].scale"]  # tie: once
    e = sd["leaves"]["['enc'].w"]
    leaf = state["enc"].w
    assert e["rule"] == repr(leaf.rule) and e["shape"] == [2, 3] and e["frozen"] is False
    assert (e["t"], e["tp"], e["count"], e["skipped"]) == (3, 3, 0, 0)
    assert sd["leaves"]["['enc'].b"]["frozen"] is True and sd["leaves"]["['enc'].b"]["t"] == 0
    assert set(e["state"]) == {"m", "v"} and e["state"]["m"].shape == (2, 3)
    assert e["state"]["m"].tobytes() == leaf.state["m"].tobytes() and e["master"] is None
    # copies: the state steps on, the dict does not change
    before = e["state"]["m"].copy()
    no.update_(state, model, grads_like(model, np.random.default_rng(2)))
    assert e["state"]["m"].tobytes() == before.tobytes()
    one = no.state_dict(setup_case("leaf-mixed-precision", 2)[0])
    assert list(one["leaves"]) == [""] and one["kind"] == "leaf"
    assert one["leaves"][""]["master"].dtype == np.float32


def test_json_plus_npz_and_torch_hold_it():
    state, _ = setup_case("tree-accum-clip-scheduled", 3, frozen=True)
    sd = no.state_dict(state)
    arrays = {}

    def split(v, key):
        if isinstance(v, np.ndarray):
            arrays[key] = v
            return {"npz": key}
        if isinstance(v, dict):
            return {k: split(x, f"{key}/{k}") for k, x in v.items()}
        return v

    def join(v):
        if isinstance(v, dict):
            return npz[v["npz"]] if set(v) == {"npz"} else {k: join(x) for k, x in v.items()}
        return v

    text = json.dumps(split(sd, "sd"))
    buf = io.BytesIO()
    np.savez(buf, **{f"a{k}": a for k, a in enumerate(arrays.values())})
    buf.seek(0)
    with np.load(buf) as f:
        npz = {key: f[f"a{k}"] for k, key in enumerate(arrays)}
    assert contents(no.load(join(json.loads(text))), hp=False) == contents(state, hp=False)
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"opt": sd}, buf)
    buf.seek(0)
    # weights_only: NumPy's array reconstruction allowed, nothing of numbaopt's
    allowed = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.float64)),
               type(np.dtype(np.float32))]
    with torch.serialization.safe_globals(allowed):
        back = torch.load(buf, weights_only=True)["opt"]
    assert contents(no.load(back), hp=False) == contents(state, hp=False)


@pytest.mark.parametrize("case", ["leaf-accum-clip", "leaf-mixed-precision", "tree-groups",
                                  "tree-accum-clip-scheduled", "tree-mixed-precision"])
def test_load_state_dict_restores_and_steps_bitwise(case):
    state, model = setup_case(case, 3, frozen=True)
    sd = no.state_dict(state)
    rule, make = CASES[case]
    fresh = no.setup(rule(), make())
    assert no.load_state_dict(fresh, sd) is fresh
    assert contents(fresh, hp=False) == contents(state, hp=False)
    a, ma, b, mb = step_both(state, model, fresh, copy.deepcopy(model), 5, seed=4)
    assert contents(a) == contents(b) and model_bytes(ma) == model_bytes(mb)


def test_load_state_dict_takes_the_hyperparameters():
    x = np.linspace(0, 1, 4)
    src, _ = no.update_(no.setup(no.Adam(0.05), x.copy()), x.copy(), np.ones(4))
    dst = no.setup(no.Adam(0.001), x.copy())
    no.load_state_dict(dst, no.state_dict(src))
    assert dst.rule == src.rule and dst.hp.tobytes() == src.hp.tobytes() and dst.t == 1
    tree, _ = setup_case("tree", 2)
    other = no.adjust(tree, lr=0.3)
    no.load_state_dict(tree, no.state_dict(other))
    assert core(tree).groups[0].rule.lr == 0.3 and contents(tree) == contents(other)


def _bad(sd, key, field, value):
    sd = copy.deepcopy(sd)
    if field is None:
        sd["leaves"][key] = value
    else:
        sd["leaves"][key][field] = value
    return sd


def _bad_array(sd, key, name, value):
    st = {k: v for k, v in sd["leaves"][key]["state"].items() if k != name or value is not None}
    if value is not None:
        st[name] = value
    return _bad(sd, key, "state", st)


def test_bad_state_dicts_are_refused_naming_the_path_and_nothing_is_written():
    state, model = setup_case("tree-accum-clip-scheduled", 3, frozen=True)
    sd = no.state_dict(state)
    w = "['enc'].w"
    m = sd["leaves"][w]["state"]["m"]
    cases = [
        (_bad_array(sd, w, "m", m.T.copy()), r"state\['enc'\]\.w: state\['m'\] is float64\[3, 2\], "
                                             r"expected float64\[2, 3\]"),
        (_bad_array(sd, w, "m", m.astype(np.float32)), r"state\['enc'\]\.w: state\['m'\] is float32"),
        (_bad_array(sd, w, "m", m.tolist()), r"state\['enc'\]\.w: state\['m'\] is list"),
        (_bad_array(sd, w, "v", None), r"state\['enc'\]\.w: state has fields \['acc', 'm'\]; missing \['v'\]"),
        (_bad_array(sd, w, "extra", m), r"state\['enc'\]\.w: state has fields .*; unknown \['extra'\]"),
        (_bad(sd, w, "t", -1), r"state\['enc'\]\.w: t=-1 is outside"),
        (_bad(sd, w, "t", True), r"state\['enc'\]\.w: t is bool"),
        (_bad(sd, w, "t", 2.0), r"state\['enc'\]\.w: t is float"),
        (_bad(sd, w, "t", 10), r"state\['enc'\]\.w .*t \(steps\) cannot exceed tp"),
        (_bad(sd, w, "count", 7), r"state\['enc'\]\.w .*count"),
        (_bad(sd, w, "shape", [3, 2]), r"state\['enc'\]\.w: shape \[3, 2\], the header's is \[2, 3\]"),
        (_bad(sd, w, "rule", "Adam()"), r"state\['enc'\]\.w: rule 'Adam\(\)' is not the header's"),
        (_bad(sd, w, "master", m), r"state\['enc'\]\.w: .*has no master copy"),
        (_bad(sd, w, "frozen", 1), r"state\['enc'\]\.w: frozen is int"),
        (_bad(sd, w, None, []), r"state\['enc'\]\.w: its entry is list"),
        (_bad(sd, "['nope']", None, sd["leaves"][w]), r"an entry \"\['nope'\]\", which is not a trained leaf"),
        ({**sd, "leaves": {k: v for k, v in sd["leaves"].items() if k != w}},
         r"no entry for the trained leaf state\['enc'\]\.w"),
        ({**sd, "version": 99}, r"version 99"),
        ({**sd, "format": "x"}, r"format 'x'"),
        ({k: v for k, v in sd.items() if k != "kind"}, r"missing \['kind'\]"),
    ]
    target, _ = setup_case("tree-accum-clip-scheduled", 1)
    before = contents(target)
    for bad, pattern in cases:
        with pytest.raises(no.CheckpointError, match=r"^load: state dict: .*" + pattern):
            no.load(bad)
        with pytest.raises(no.CheckpointError, match=pattern):
            no.load_state_dict(target, bad)
        assert contents(target) == before
    header = copy.deepcopy(sd)
    header["header"]["units"][0]["shape"] = [3, 2]  # the header itself is held to load's checks
    with pytest.raises(no.CheckpointError, match=r"state dict"):
        no.load(header)


def test_load_state_dict_refuses_another_model_naming_the_path():
    state, model = setup_case("tree-groups", 2)
    sd = no.state_dict(state)
    m = CASES["tree-groups"][1]()
    m["enc"].w = np.ones((3, 2))
    target = no.setup(CASES["tree-groups"][0](), m)
    before = contents(target)
    with pytest.raises(ValueError, match=r"load_state_dict: state\['enc'\]\.w: shape: \(2, 3\) in the state dict, "
                                         r"\(3, 2\) in the state"):
        no.load_state_dict(target, sd)
    assert contents(target) == before
    target = no.setup(no.Adam(0.01), CASES["tree-groups"][1]())  # one group where the dict has two
    with pytest.raises(ValueError, match=r"load_state_dict: state\['dec'\]\[0\]: group"):
        no.load_state_dict(target, sd)
    target = no.setup(lambda p, x: no.RMSProp(0.01) if "dec" in str(p) else no.Adam(0.01), CASES["tree-groups"][1]())
    with pytest.raises(ValueError, match=r"load_state_dict: state\['dec'\]\[0\]: rule: Momentum\(.*\) in the state "
                                         r"dict, RMSProp"):
        no.load_state_dict(target, sd)
    target = no.setup(CASES["tree-groups"][0](), {"other": np.ones(3)})
    with pytest.raises(ValueError, match=r"load_state_dict: the model's leaf 0: state\['enc'\]\.w in the state dict"):
        no.load_state_dict(target, sd)
    leaf = no.setup(no.Adam(), np.ones(3))
    with pytest.raises(ValueError, match="holds a tree's state, the state is one array's"):
        no.load_state_dict(leaf, sd)
    with pytest.raises(ValueError, match="holds one array's state, the state is a tree's"):
        no.load_state_dict(state, no.state_dict(leaf))
    with pytest.raises(ValueError, match=r"load_state_dict: state: shape: \(4,\) in the state dict, \(3,\)"):
        no.load_state_dict(leaf, no.state_dict(no.setup(no.Adam(), np.ones(4))))
    with pytest.raises(TypeError, match="a leaf of a tree"):
        no.load_state_dict(state["enc"].w, sd)
    with pytest.raises(TypeError, match="state_dict: expected a state"):
        no.state_dict({"x": 1})


def test_a_state_in_use_is_refused():
    state, _ = setup_case("tree", 1)
    sd = no.state_dict(state)
    core(state).users = -1
    try:
        with pytest.raises(no.StateInUseError):
            no.state_dict(state)
        with pytest.raises(no.StateInUseError):
            no.load_state_dict(state, sd)
    finally:
        core(state).users = 0
