"""Trees: bad input names the path and is detected before anything is written."""
import dataclasses

import numpy as np
import pytest

import numbaopt as no
from numbaopt.tree.state import core


@dataclasses.dataclass
class Enc:
    layers: list


def _model():
    return {"encoder": Enc(layers=[{"w": np.ones((4, 3), np.float32)} for _ in range(3)]),
            "head": (np.ones(2, np.float32), 0.5)}


def _grads():
    return {"encoder": Enc(layers=[{"w": np.ones((4, 3), np.float32)} for _ in range(3)]),
            "head": (np.ones(2, np.float32), 1.0)}


def _snapshot(state, model):
    flat, _ = no.destructure(model)
    arenas = [a.copy() for g in core(state).groups for a in (*g.arenas, g.C, g.hp)]
    return flat.copy(), arenas


def _assert_untouched(state, model, snap):
    flat, arenas = snap
    np.testing.assert_array_equal(no.destructure(model)[0], flat)
    for a, b in zip([a for g in core(state).groups for a in (*g.arenas, g.C, g.hp)], arenas):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fast", [False, True])
def test_wrong_shape_names_the_path_and_writes_nothing(fast):
    model = _model()
    state = no.setup(no.Adam(), model)
    if fast:  # one good step builds the fast plan; the bad call must still name the path
        state, model = no.update_(state, model, _grads())
    snap = _snapshot(state, model)
    grads = _grads()
    grads["encoder"].layers[2]["w"] = np.ones((3, 4), np.float32)
    msg = r"^grads\['encoder'\]\.layers\[2\]\['w'\]: shape \(3, 4\), expected \(4, 3\)$"
    with pytest.raises(ValueError, match=msg):
        no.update_(state, model, grads)
    _assert_untouched(state, model, snap)


@pytest.mark.parametrize("mutate, exc, pattern", [
    (lambda g: g["head"].__class__, None, None),
    (lambda g: g.update(head=[g["head"][0], 1.0]), TypeError, r"grads\['head'\]: expected tuple, got list"),
    (lambda g: g.pop("head"), ValueError, r"^grads: keys differ.*missing \['head'\]"),
    (lambda g: g.update(extra=1), ValueError, r"^grads: keys differ.*unexpected \['extra'\]"),
    (lambda g: g["encoder"].layers.pop(), ValueError, r"grads\['encoder'\]\.layers: 2 children, expected 3"),
    (lambda g: g["encoder"].layers[1].update(w="oops"), TypeError,
     r"grads\['encoder'\]\.layers\[1\]\['w'\]: expected a float32 array .*got str"),
    (lambda g: g["encoder"].layers[0].update(w=np.ones((4, 3), np.int64)), TypeError,
     r"grads\['encoder'\]\.layers\[0\]\['w'\]: dtype int64, expected float32"),
    (lambda g: g["encoder"].layers[0].update(w=np.ones((4, 3), np.complex64)), TypeError, r"dtype complex64"),
])
def test_bad_gradients(mutate, exc, pattern):
    model = _model()
    state = no.setup(no.Adam(), model)
    state, model = no.update_(state, model, _grads())
    snap = _snapshot(state, model)
    grads = _grads()
    mutate(grads)
    if exc is None:
        no.update_(state, model, grads)  # the unmodified gradients are fine
        return
    with pytest.raises(exc, match=pattern):
        no.update_(state, model, grads)
    _assert_untouched(state, model, snap)
    with pytest.raises(exc, match=pattern):
        no.update(state, model, grads)


def test_state_of_another_model_and_non_arrays():
    model = _model()
    state = no.setup(no.Adam(), model)
    other = {"encoder": Enc(layers=[{"w": np.ones((4, 3), np.float32)}]), "head": (np.ones(2, np.float32), 0.5)}
    with pytest.raises(ValueError, match=r"model\['encoder'\]\.layers: 1 children, expected 3"):
        no.update_(state, other, _grads())
    bad = _model()
    bad["encoder"].layers[1]["w"] = "not an array"
    with pytest.raises(TypeError, match=r"model\['encoder'\]\.layers\[1\]\['w'\]: expected a float32 parameter"):
        no.update_(state, bad, _grads())
    bad = _model()
    bad["head"] = (np.ones(2, np.float64), 0.5)
    with pytest.raises(TypeError, match=r"model\['head'\]\[0\]: dtype float64, but the state was set up for float32"):
        no.update(state, bad, _grads())
    with pytest.raises(TypeError, match="expected the whole state tree"):
        no.update_(state["encoder"], model["encoder"], _grads()["encoder"])


def test_ties_must_stay_ties():
    w = np.ones(2)
    state = no.setup(no.Descent(0.1), [w, w])
    with pytest.raises(ValueError, match=r"model\[1\]: .*tied"):
        no.update_(state, [w, w.copy()], [np.ones(2), np.ones(2)])
    state = no.setup(no.Descent(0.1), [w, w.copy()])
    with pytest.raises(ValueError, match=r"model\[1\]: the same array as model\[0\]"):
        no.update_(state, [w, w], [np.ones(2), np.ones(2)])


def test_failed_update_in_a_later_group_leaves_earlier_groups_untouched():
    model = {"a": np.ones(3, np.float64), "b": np.ones(2, np.float32), "c": np.ones(2, np.float64)}
    state = no.setup(no.Adam(), model)
    snap = _snapshot(state, model)
    with pytest.raises(ValueError, match=r"grads\['c'\]: shape"):
        no.update_(state, model, {"a": np.ones(3), "b": np.ones(2, np.float32), "c": np.ones(3)})
    _assert_untouched(state, model, snap)


def test_a_rule_refusing_in_a_later_group_leaves_the_earlier_groups_untouched():
    """ClipNorm refuses a non-finite norm from inside its kernel: groups that ran before are restored."""
    model = {"a": np.ones(3, np.float64), "b": np.ones(2, np.float32), "c": (np.ones(2, np.float64), 2.0)}
    state = no.setup(no.chain(no.ClipNorm(1.0), no.Adam(0.1)), model)
    ok = {"a": np.ones(3), "b": np.ones(2, np.float32), "c": (np.ones(2), 1.0)}
    state, model = no.update_(state, model, ok)  # moments and step counts that must survive
    snap = _snapshot(state, model)
    bad = {"a": np.ones(3), "b": np.array([np.nan, 1.0], np.float32), "c": (np.ones(2), 1.0)}
    with pytest.raises(ValueError, match="ClipNorm: the gradient norm is not finite"):
        no.update_(state, model, bad)
    _assert_untouched(state, model, snap)
    state, model = no.update_(state, model, ok)  # and it goes on from there
    assert state["a"].t == 2 and state["b"].t == 2


def test_a_wrapped_leaf_refusing_after_the_groups_restores_them():
    inner = no.chain(no.ClipNorm(1.0), no.Descent(0.1))
    model = {"w": np.ones(3), "h": np.ones(2, np.float16)}
    state = no.setup(lambda path, x: no.MixedPrecision(np.float32, inner) if x.dtype == np.float16
                     else no.Adam(0.1), model)
    snap = _snapshot(state, model)
    h_before = model["h"].copy()
    with pytest.raises(ValueError, match="ClipNorm"):
        no.update_(state, model, {"w": np.ones(3), "h": np.array([np.inf, 1], np.float16)})
    _assert_untouched(state, model, snap)
    assert model["h"].tobytes() == h_before.tobytes()


def test_setup_errors():
    with pytest.raises(TypeError, match="use Adam()"):
        no.setup(no.Adam, {"w": np.ones(2)})
    with pytest.raises(TypeError, match=r"model\['w'\]: .*int64 is not a parameter dtype|expected a rule"):
        no.setup(lambda p, x: "adam", {"w": np.ones(2)})
    w = np.ones(2)
    with pytest.raises(ValueError, match="tied"):
        no.setup(lambda p, x: no.Adam(lr=0.1 if p[-1].key == 0 else 0.2), [w, w])
    with pytest.raises(ValueError, match="unknown hyperparameter 'rate'"):
        no.adjust(no.setup(no.Adam(), [w]), rate=1.0)
    with pytest.raises(ValueError, match="centred is a compile-time option"):
        no.adjust_(no.setup(no.RMSProp(), [w]), centred=True)
    with pytest.raises(TypeError, match="freeze_: expected a state tree"):
        no.freeze_(w)
