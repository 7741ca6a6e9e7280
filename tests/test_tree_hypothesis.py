"""Random trees: ``update`` equals ``update_`` bitwise, and ``update`` modifies nothing passed in."""
import copy
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numbaopt as no

leaf = st.one_of(
    st.tuples(st.just("arr"), st.sampled_from(["float32", "float64", "complex128"]),
              st.lists(st.integers(1, 3), max_size=2).map(tuple), st.sampled_from(["w", "ro", "nc"])),
    st.just(("float",)), st.just(("str",)), st.just(("int",)), st.just(("tie",)), st.just(("none",)),
)


@dataclasses.dataclass(frozen=True)
class FrozenPair:
    left: object
    right: object


@dataclasses.dataclass
class Box:
    item: object


def containers(kids):
    return st.one_of(
        st.lists(kids, min_size=1, max_size=3).map(lambda v: ("list", v)),
        st.lists(kids, min_size=1, max_size=3).map(lambda v: ("tuple", v)),
        st.dictionaries(st.sampled_from("abcd"), kids, min_size=1, max_size=3).map(lambda d: ("dict", d)),
        st.tuples(kids, kids).map(lambda v: ("frozen", v)),
        kids.map(lambda v: ("box", v)))


spec = containers(st.recursive(leaf, containers, max_leaves=6))  # the root is a container


def build(sp, rng, pool):
    kind = sp[0]
    if kind == "list":
        return [build(s, rng, pool) for s in sp[1]]
    if kind == "tuple":
        return tuple(build(s, rng, pool) for s in sp[1])
    if kind == "dict":
        return {k: build(s, rng, pool) for k, s in sp[1].items()}
    if kind == "frozen":
        return FrozenPair(build(sp[1][0], rng, pool), build(sp[1][1], rng, pool))
    if kind == "box":
        return Box(build(sp[1], rng, pool))
    if kind == "arr":
        _, dt, shape, flag = sp
        a = rng.standard_normal(shape + (2,)) + (1j * rng.standard_normal(shape + (2,)) if dt == "complex128" else 0)
        a = a.astype(dt)[..., 0] if flag == "nc" else np.ascontiguousarray(a.astype(dt)[..., 0])
        if flag == "ro":
            a.flags.writeable = False
        pool.append(a)
        return a
    if kind == "tie":
        return pool[0] if pool else 0.75
    if kind == "float":
        return float(rng.standard_normal())
    return {"str": "text", "int": 3, "none": None}[kind]


def grads_like(m, rng, drop):
    if isinstance(m, FrozenPair):
        return FrozenPair(grads_like(m.left, rng, drop), grads_like(m.right, rng, drop))
    if isinstance(m, Box):
        return Box(grads_like(m.item, rng, drop))
    if isinstance(m, list):
        return [grads_like(v, rng, drop) for v in m]
    if isinstance(m, tuple):
        return tuple(grads_like(v, rng, drop) for v in m)
    if isinstance(m, dict):
        return {k: grads_like(v, rng, drop) for k, v in m.items()}
    if drop and rng.random() < 0.2:
        return None
    if isinstance(m, np.ndarray):
        g = rng.standard_normal(m.shape) + (1j * rng.standard_normal(m.shape) if m.dtype.kind == "c" else 0)
        return g.astype(m.dtype)
    if isinstance(m, float):
        return float(rng.standard_normal())
    return None


def flat(m):
    return no.destructure(m)[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp=spec, seed=st.integers(0, 2 ** 16), drop=st.booleans(), freeze=st.booleans(), which=st.integers(0, 2))
def test_random_trees_update_equals_update_(sp, seed, drop, freeze, which):
    rng = np.random.default_rng(seed)
    model = build(sp, rng, [])
    m_inpl = copy.deepcopy(model)  # deepcopy keeps ties (memo) and read-only flags
    # elementwise; a tree-wide estimate kept as scalar state; a global clip before one
    rule = [no.AdamW(lr=0.05, weight_decay=0.01), no.Prodigy(d0=1e-2),
            no.chain(no.ClipGlobalNorm(1.0), no.DAdaptAdamW(d0=1e-2))][which]
    if flat(model).size == 0:  # nothing to train (only strings, ints, None): setup refuses it
        with pytest.raises(ValueError, match="found no trainable parameter"):
            no.setup(rule, model)
        return
    s_pure = no.setup(rule, model)
    s_inpl = no.setup(rule, m_inpl)
    if freeze:  # the same random leaves frozen in both
        for (_, a), (_, b) in zip(s_pure.leaves(), s_inpl.leaves()):
            if rng.random() < 0.3:
                no.freeze_(a)
                no.freeze_(b)
    for _ in range(3):
        g = grads_like(model, rng, drop)
        before, g_before = copy.deepcopy(model), copy.deepcopy(g)
        s_pure, new = no.update(s_pure, model, g)
        np.testing.assert_array_equal(flat(model), flat(before))
        np.testing.assert_array_equal(flat(g) if g is not None else 0, flat(g_before) if g is not None else 0)
        s_inpl, m_inpl = no.update_(s_inpl, m_inpl, g)
        a, b = flat(new), flat(m_inpl)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
        model = new
    ta = [leaf.t for _, leaf in s_pure.leaves()]
    tb = [leaf.t for _, leaf in s_inpl.leaves()]
    assert ta == tb
