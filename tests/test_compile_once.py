"""A call never compiles what an earlier call of the same state already needed (issue 27, "Fast to the first
step"): the second ``update_`` of a tree, every later pure ``update``, a larger array after a small one and the
threaded kernel once it ran, each need no kernel signature that an earlier call did not already make.

Counted where numba adds a compiled signature to a dispatcher (``Dispatcher.add_overload``, whether the
code was compiled or loaded from the disk cache): a call that adds none found every kernel it needed
ready. The kernels are the ones other tests use (Adam, ClipGlobalNorm+AdamW, float64), so this file
compiles little of its own."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from numba.core.dispatcher import Dispatcher

import numbaopt as no


@contextlib.contextmanager
def new_signatures():
    """Yields a list that ends up naming every kernel that got a new compiled signature inside the block,
    compiled or loaded from the disk cache (both add an overload to the dispatcher)."""
    seen = []
    original = Dispatcher.add_overload

    def counting(self, cres):
        seen.append(getattr(self, "__name__", "?"))
        return original(self, cres)

    Dispatcher.add_overload = counting
    try:
        yield seen
    finally:
        Dispatcher.add_overload = original


def _tree(dtype=np.float64):
    m = {"W": np.linspace(-1, 1, 12, dtype=dtype).reshape(4, 3), "b": np.linspace(0, 1, 3, dtype=dtype)}
    g = {"W": np.full((4, 3), 0.25, dtype), "b": np.full(3, -0.5, dtype)}
    return m, g


RULES = {
    "adam": lambda: no.Adam(1e-2),
    "clip_adamw": lambda: no.chain(no.ClipGlobalNorm(1.0), no.AdamW(1e-2, weight_decay=1e-2)),
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_tree_compiles_each_variant_once(name):
    m, g = _tree()
    state = no.setup(RULES[name](), m)
    state, m = no.update_(state, m, g)  # may compile: the first in-place step
    with new_signatures() as seen:
        state, m = no.update_(state, m, g)
        state, m = no.update_(state, m, g)
    assert seen == [], "the second update_ of a tree met a new kernel signature"
    no.update(state, m, g)  # may compile: the first pure step
    with new_signatures() as seen:
        s2, m2 = no.update(state, m, g)
        no.update(s2, m2, g)
        state, m = no.update_(state, m, g)
    assert seen == [], "a pure step after the first, or update_ after update, met a new kernel signature"


def test_a_tree_off_the_fast_path_compiles_once():
    """Tied leaves take the general path every step: its helpers are compiled by the first step only."""
    a = np.linspace(-1, 1, 6)
    m = {"a": a, "b": a, "c": np.ones(3)}
    g = {"a": np.full(6, 0.1), "b": np.full(6, 0.1), "c": np.full(3, 0.2)}
    state = no.setup(no.Adam(1e-2), m)
    state, m = no.update_(state, m, g)
    with new_signatures() as seen:
        for _ in range(3):
            state, m = no.update_(state, m, g)
    assert seen == []


def test_one_array_small_large_and_threaded_compile_once():
    old = no.parallel_threshold()
    try:
        no.set_parallel_threshold(1000)
        small = np.linspace(-1, 1, 16)
        s = no.setup(no.Adam(1e-2), small)
        s, small = no.update_(s, small, np.full(16, 0.5))
        no.update(s, small, np.full(16, 0.5))
        big = np.linspace(-1, 1, 2000)
        with new_signatures() as seen:  # a larger array below the threshold: the same kernels
            s1 = no.setup(no.Adam(1e-2), np.linspace(-1, 1, 500))
            s1, _ = no.update_(s1, np.linspace(-1, 1, 500), np.full(500, 0.5))
            no.update(s1, np.linspace(-1, 1, 500), np.full(500, 0.5))
        assert seen == []
        sb = no.setup(no.Adam(1e-2), big)
        sb, big = no.update_(sb, big, np.full(2000, 0.5))  # may compile: the threaded variant's first use
        no.update(sb, big, np.full(2000, 0.5))
        with new_signatures() as seen:
            for _ in range(2):
                sb, big = no.update_(sb, big, np.full(2000, 0.5))
                no.update(sb, big, np.full(2000, 0.5))
            s, small = no.update_(s, small, np.full(16, 0.5))
        assert seen == []
    finally:
        no.set_parallel_threshold(old)


def test_the_counter_sees_a_new_signature():
    """The check above can fail: a kernel met with a new dtype is a new signature."""
    m, g = _tree(np.float64)
    state = no.setup(no.Adam(1e-2), m)
    state, m = no.update_(state, m, g)
    with new_signatures() as seen:
        x = np.ones(3, np.float32)
        no.update_(no.setup(no.Adam(1e-2), x), x, np.ones(3, np.float32))
        from numba import njit

        @njit
        def fresh(v):
            return v + 1

        fresh(1)
    assert seen, "the counter missed a compilation"
