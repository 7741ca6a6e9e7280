"""Gradients that share memory with what a step writes: ``update_`` steps on a copy of them, so it gives the
numbers of ``update`` and of a step with a fresh gradient, on every path (one array, the fast and the general
tree path, strided views, state arrays)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numbaopt as no
from numbaopt.tree.state import core

RULES = [no.Descent(0.1), no.Adam(0.1), no.chain(no.ClipNorm(1.0), no.Momentum(0.1)),
         no.chain(no.AccumGrad(2), no.ClipGlobalNorm(1.0), no.Adam(0.05))]


def test_the_reported_case():
    b = np.arange(8.0)
    s = no.setup(no.Descent(0.1), b[1:7])
    no.update_(s, b[1:7], b[0:6])
    np.testing.assert_array_equal(b[2:4], [2.0 - 0.1 * 1.0, 3.0 - 0.1 * 2.0])


@pytest.mark.parametrize("rule", RULES, ids=repr)
@pytest.mark.parametrize("shift", [-3, -1, 1, 2])
def test_shifted_view_of_its_own_parameter(rule, shift):
    n = 12
    base_a, base_b = np.linspace(-1, 1, n + 6), np.linspace(-1, 1, n + 6)
    sa, sb = no.setup(rule, base_a[3:3 + n]), no.setup(rule, base_b[3:3 + n])
    for _ in range(3):
        g_fresh = base_b[3 + shift:3 + shift + n].copy()
        sa, _ = no.update_(sa, base_a[3:3 + n], base_a[3 + shift:3 + shift + n])
        sb, _ = no.update_(sb, base_b[3:3 + n], g_fresh)
    np.testing.assert_array_equal(base_a, base_b)
    for a, b in zip(sa.arrays, sb.arrays):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rule", RULES[:3], ids=repr)
def test_gradient_that_is_the_parameter_is_stepped_directly(rule):
    x, y = np.linspace(-1, 1, 9), np.linspace(-1, 1, 9)
    sx, sy = no.setup(rule, x), no.setup(rule, y)
    for _ in range(3):
        sx, _ = no.update_(sx, x, x)  # g is x: safe, elementwise
        sy, _ = no.update_(sy, y, y.copy())
    np.testing.assert_array_equal(x, y)


def test_gradient_overlapping_the_state():
    # a single array's state has the parameter's size: a gradient overlapping it is a strided view (stepped
    # through a contiguous copy) or a state array itself (read at i before i is written: safe)
    x, y = np.linspace(-1, 1, 6), np.linspace(-1, 1, 6)
    sx, sy = no.setup(no.Adam(0.1), x), no.setup(no.Adam(0.1), y)
    for s, p in ((sx, x), (sy, y)):
        no.update_(s, p, np.full(6, 0.5))
    no.update_(sx, x, sx.state["m"][::-1])
    no.update_(sy, y, sy.state["m"][::-1].copy())
    no.update_(sx, x, sx.arrays[1])
    no.update_(sy, y, sy.arrays[1].copy())
    np.testing.assert_array_equal(x, y)
    for a, b in zip(sx.arrays, sy.arrays):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_tree_gradients_swapped_between_leaves(rule):
    def run(step, fresh):
        m = [np.linspace(-1, 1, 5), np.linspace(2, 3, 5)]
        s = no.setup(rule, m)
        for _ in range(4):  # the first step goes the general way, the next ones through the fast plan
            g = [m[1], m[0]]
            s, m2 = step(s, m, [a.copy() for a in g] if fresh else g)
            m = m2
        return m, s

    ref, sref = run(no.update_, True)
    for step in (no.update_, no.update):
        got, sgot = run(step, False)
        for a, b in zip(got, ref):
            np.testing.assert_array_equal(a, b)
        for ga, gb in zip(core(sgot).groups, core(sref).groups):
            for a, b in zip(ga.arenas, gb.arenas):
                np.testing.assert_array_equal(a, b)


def test_tree_fast_path_sees_aliasing_after_a_clean_step():
    m = {"a": np.linspace(-1, 1, 8), "b": np.linspace(1, 2, 8)}
    s = no.setup(no.Descent(0.5), m)
    s, _ = no.update_(s, m, {"a": np.ones(8), "b": np.ones(8)})
    assert core(s).fast is not None  # the fast plan exists now
    a0, b0 = m["a"].copy(), m["b"].copy()
    s, _ = no.update_(s, m, {"a": m["b"], "b": m["a"]})
    np.testing.assert_array_equal(m["a"], a0 - 0.5 * b0)
    np.testing.assert_array_equal(m["b"], b0 - 0.5 * a0)


def test_tree_gradient_overlapping_its_own_parameter_and_the_state():
    base = np.linspace(-1, 1, 20)
    m = {"w": base[2:12]}
    ref_base = base.copy()
    s = no.setup(no.Adam(0.1), m)
    sr = no.setup(no.Adam(0.1), {"w": ref_base[2:12]})
    for shift in (1, -2, 3):
        no.update_(s, m, {"w": base[2 + shift:12 + shift]})
        no.update_(sr, {"w": ref_base[2:12]}, {"w": ref_base[2 + shift:12 + shift].copy()})
    np.testing.assert_array_equal(base, ref_base)
    # a gradient that is a view of the state arena
    arena = core(s).groups[0].arenas[0]
    no.update_(s, m, {"w": arena[::-1][:10]})
    no.update_(sr, {"w": ref_base[2:12]}, {"w": core(sr).groups[0].arenas[0][::-1][:10].copy()})
    np.testing.assert_array_equal(base, ref_base)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), off=st.integers(0, 40), goff=st.integers(0, 40), step=st.sampled_from([1, -1]),
       rule=st.sampled_from(RULES), tree=st.booleans())
def test_any_overlap_equals_a_fresh_gradient(n, off, goff, step, rule, tree):
    size = 90
    a, b = np.sin(np.arange(size) * 0.37), np.sin(np.arange(size) * 0.37)
    g_of = (lambda base: base[goff:goff + n]) if step == 1 else (lambda base: base[goff + n - 1::-1][:n] if
                                                                  goff + n - 1 >= 0 else base[:n])
    xa, xb = a[off:off + n], b[off:off + n]
    if tree:
        sa, sb = no.setup(rule, {"x": xa}), no.setup(rule, {"x": xb})
        for _ in range(2):
            no.update_(sa, {"x": xa}, {"x": g_of(a)})
            no.update_(sb, {"x": xb}, {"x": g_of(b).copy()})
    else:
        sa, sb = no.setup(rule, xa), no.setup(rule, xb)
        for _ in range(2):
            no.update_(sa, xa, g_of(a))
            no.update_(sb, xb, g_of(b).copy())
    np.testing.assert_array_equal(a, b)
