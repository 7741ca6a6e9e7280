"""API-level mistakes that are errors, not silent wrong steps: optax's argument order, the model and the
gradients swapped, a model in which setup finds nothing to train. Each refusal leaves everything as it was."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import numbaopt as no
from numbaopt.tree.state import core


@dataclasses.dataclass
class Layer:
    w: np.ndarray
    b: np.ndarray


def _models():
    """(model, grads) pairs of the shapes the fast path generates different accessors for."""
    return [
        ({"a": np.zeros(3), "b": [np.ones(2), np.ones(2)]}, {"a": np.ones(3), "b": [np.ones(2), np.ones(2)]}),
        ([np.zeros(3), np.zeros(4)], [np.ones(3), np.ones(4)]),  # a flat list: the lists themselves
        (Layer(np.zeros((2, 2)), np.zeros(2)), Layer(np.ones((2, 2)), np.ones(2))),
    ]


def _leaves(tree):
    if isinstance(tree, dict):
        return [v for x in tree.values() for v in _leaves(x)]
    if isinstance(tree, list):
        return [v for x in tree for v in _leaves(x)]
    if isinstance(tree, Layer):
        return [tree.w, tree.b]
    return [tree]


# ---------------------------------------------------------------------------------------------
# optax's order: update(grads, state, params)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [no.update, no.update_])
def test_optax_order_names_the_order(fn):
    x, g = np.zeros(4), np.ones(4)
    s = no.setup(no.Adam(0.1), x)
    with pytest.raises(TypeError, match=r"optax's order, update\(grads, state, params\); numbaopt's is update_?"
                                        r"\(state, model, grads\)"):
        fn(g, s, x)
    assert s.t == 0 and not x.any()
    m, gm = _models()[0]
    st = no.setup(no.Adam(0.1), m)
    with pytest.raises(TypeError, match="optax's order"):
        fn(gm, st, m)
    assert not m["a"].any() and st["a"].t == 0


def test_not_a_state_says_the_order():
    with pytest.raises(TypeError, match=r"got dict; the arguments are update_\(state, model, grads\)"):
        no.update_({"a": np.ones(2)}, {"a": np.ones(2)}, None)
    s = no.setup(no.Adam(), {"a": {"w": np.ones(2)}})
    with pytest.raises(TypeError, match="sub-state"):  # core's own message is kept
        no.update_(s["a"], {"w": np.ones(2)}, {"w": np.ones(2)})


# ---------------------------------------------------------------------------------------------
# update_(state, grads, model): the model stepped in place last given as the gradients
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", range(3))
@pytest.mark.parametrize("fn", [no.update_, no.update])
def test_swapped_model_and_grads_are_refused(k, fn):
    m, gm = _models()[k]
    s = no.setup(no.Adam(0.1), m)
    s, m = no.update_(s, m, gm)
    s, m = no.update_(s, m, gm)  # the fast path's plan now holds m's arrays
    assert core(s).fast is not None
    before = [a.copy() for a in _leaves(m)]
    gbefore = [a.copy() for a in _leaves(gm)]
    t = [leaf.t for _, leaf in s.leaves()]
    with pytest.raises(ValueError, match=r"look swapped. The order is update_?\(state, model, grads\)"):
        fn(s, gm, m)
    for a, b in zip(_leaves(m), before):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_leaves(gm), gbefore):
        np.testing.assert_array_equal(a, b)
    assert [leaf.t for _, leaf in s.leaves()] == t
    s, m = no.update_(s, m, gm)  # the right order still takes the fast path
    assert [leaf.t for _, leaf in s.leaves()] == [v + 1 for v in t]


def test_what_is_not_a_swap_is_stepped():
    m, gm = _models()[0]
    s = no.setup(no.Descent(0.5), m)
    s, m = no.update_(s, m, gm)
    s, m = no.update_(s, m, m)  # the model as its own gradient: x <- x - 0.5 x
    np.testing.assert_allclose(m["a"], -0.25)
    s, m = no.update_(s, m, {"a": m["a"].copy(), "b": [b.copy() for b in m["b"]]})  # equal values, not the arrays
    other = {"a": np.zeros(3), "b": [np.ones(2), np.ones(2)]}
    s, other = no.update_(s, other, gm)  # another model with gradients: no relation to the last one
    # a template set up on, then a copy stepped with the template as gradient (setup binds no arrays)
    x = np.ones(8)
    leaf = no.setup(no.Descent(0.5), x)
    leaf, y = no.update_(leaf, x.copy(), x)
    np.testing.assert_allclose(y, 0.5)
    tmpl = {"w": np.ones(3)}
    st = no.setup(no.Descent(0.5), tmpl)
    st, new = no.update_(st, {"w": np.ones(3)}, tmpl)
    np.testing.assert_allclose(new["w"], 0.5)


def test_a_missed_fast_path_costs_one_gather():
    """A correct step the fast path misses every time (a None gradient) is not refused: the swap check reads
    the leaves and finds the model's in the model."""
    m, gm = _models()[0]
    s = no.setup(no.Adam(0.1), m)
    s, m = no.update_(s, m, gm)
    for _ in range(3):
        s, m = no.update_(s, m, {"a": None, "b": gm["b"]})
    assert s["a"].t == 1 and s["b"][0].t == 4


# ---------------------------------------------------------------------------------------------
# nothing to train
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model, says", [
    ({}, r"found no trainable parameter in dict: it holds no leaf at all"),
    ({"n": 3, "idx": np.arange(4), "name": "x"},
     r"3 leaves carried through unchanged: model\['n'\] \(int\), model\['idx'\] \(int64 array\), "
     r"model\['name'\] \(str\)\. .*register_container"),
    ([None] * 7, r"7 leaves carried through unchanged: .*model\[4\] \(None\), and 2 more"),
    (object(), r"in object: 1 leaf carried through unchanged: model \(object\); numbaopt does not know object as a "
               r"container, so it took the whole model as one leaf.*A torch module\? A JAX pytree\?"),
])
def test_nothing_trainable_is_an_error(model, says):
    with pytest.raises(ValueError, match=says):
        no.setup(no.Adam(), model)


def test_torch_module_without_parameters_is_an_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="found no trainable parameter in ReLU"):
        no.setup(no.Adam(), torch.nn.ReLU())


@dataclasses.dataclass
class Frozen:
    w: np.ndarray = no.not_trainable(default=None)
    n: int = 0


@pytest.mark.parametrize("rule, model", [
    (no.Adam(), Frozen(np.ones(3))),
    (lambda path, leaf: None, {"a": np.ones(3), "b": np.ones(2)}),  # the chooser trains nothing
])
def test_everything_excluded_by_choice_is_a_warning(rule, model):
    with pytest.warns(UserWarning, match=r"no leaf of \w+ is trained: .*excluded") as rec:
        s = no.setup(rule, model)
    assert rec[0].filename == __file__  # points at the user's setup call
    s, out = no.update_(s, model, model)  # a valid state: steps leave the model as it is
    assert out is model


def test_a_trainable_model_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        no.setup(no.Adam(), {"a": np.ones(2), "n": 3})
