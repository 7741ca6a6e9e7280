"""The small-array fast path of ``update_`` (compiled entry point bound by ``cpu.bind_inplace``).

Every route an array can take (bound entry point, Numba dispatch for a read-only or unaligned array,
the threaded kernel after a threshold change, the general path, pure ``update``) must give the same
bits and advance the state the same way.
"""
import numpy as np
import pytest

import numbaopt as no

N = 16


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(N).astype(np.float32)
    gs = [rng.standard_normal(N).astype(np.float32) for _ in range(3)]
    return x, gs


def _pure(x, gs, rule=None):
    state = no.setup(no.Adam(lr=0.1) if rule is None else rule, x)
    for g in gs:
        state, x = no.update(state, x, g)
    return state, x


def _unaligned(a):
    buf = np.zeros(a.nbytes + 1, dtype=np.uint8)
    out = buf[1:].view(a.dtype)
    out[...] = a
    assert not out.flags.aligned
    return out


# 0, 1, 2, 3 and 4 state arrays: each arity has its own bound call
RULES = [no.Descent(0.1), no.Momentum(0.1), no.Adam(lr=0.1), no.chain(no.Momentum(0.1), no.Adam(lr=0.1)),
         no.chain(no.Adam(lr=0.1), no.AdamW(lr=0.1, weight_decay=0.01))]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: repr(r)[:20])
def test_bound_entry_point_matches_pure_update(rule):
    x0, gs = _data()
    ref_state, ref_x = _pure(x0.copy(), gs, rule)
    x = x0.copy()
    state = no.setup(rule, x)
    for g in gs:
        s2, x2 = no.update_(state, x, g)
        assert s2 is state and x2 is x  # written in place
    assert state.fast is not None  # the fast path was taken
    assert state.t == ref_state.t == len(gs)
    np.testing.assert_array_equal(x, ref_x)
    assert len(state.arrays) == len(ref_state.arrays)
    for a, b in zip(state.arrays, ref_state.arrays):
        np.testing.assert_array_equal(a, b)


def test_read_only_and_unaligned_arrays_take_other_routes_with_the_same_bits():
    x0, gs = _data(1)
    _, ref_x = _pure(x0.copy(), gs)
    # read-only gradient: another compiled type, dispatched by Numba
    x = x0.copy()
    state = no.setup(no.Adam(lr=0.1), x)
    for g in gs:
        g = g.copy()
        g.flags.writeable = False
        state, x = no.update_(state, x, g)
    np.testing.assert_array_equal(x, ref_x)
    # unaligned parameter and gradient, mixed with aligned steps on the same state
    x = _unaligned(x0)
    state = no.setup(no.Adam(lr=0.1), x)
    for k, g in enumerate(gs):
        state, x = no.update_(state, x, _unaligned(g) if k != 1 else g)
    assert state.t == len(gs)
    np.testing.assert_array_equal(x, ref_x)


def test_threshold_change_after_binding_switches_kernels():
    x0, gs = _data(2)
    _, ref_x = _pure(x0.copy(), gs)
    x = x0.copy()
    state = no.setup(no.Adam(lr=0.1), x)
    state, x = no.update_(state, x, gs[0])  # binds the serial entry point
    old = no.set_parallel_threshold(0)
    try:
        state, x = no.update_(state, x, gs[1])  # the threaded kernel, through the same binding
    finally:
        no.set_parallel_threshold(old)
    assert state.kernels().inplace_par.signatures
    state, x = no.update_(state, x, gs[2])
    assert state.t == 3
    np.testing.assert_array_equal(x, ref_x)


def test_lr_change_reaches_the_bound_call():
    x0, gs = _data(3)
    x = x0.copy()
    state = no.setup(no.Adam(lr=0.1), x)
    state, x = no.update_(state, x, gs[0])
    no.adjust_(state, lr=0.0)  # hyperparameters are bound by reference: the next step moves nothing
    before = x.copy()
    state, x = no.update_(state, x, gs[1])
    np.testing.assert_array_equal(x, before)
