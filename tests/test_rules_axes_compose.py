"""Axis reductions and per-leaf state composed with the rest: wrappers (SkipNonFinite, a refusing global clip after
them, MixedPrecision), schedules and adjust, trees with None gradients and frozen leaves, pickling mid-run, for
Adafactor, schedule-free SGD, NovoGrad and a Centralize/AdaptiveGradClip/Adam chain.

The reference for each composition is the same rule stepped on each leaf alone, or the unwrapped rule where the
wrapper is neutral (a finite gradient through SkipNonFinite, a float32 run beside MixedPrecision's float32
master): bitwise equal. A refused or skipped step changes nothing.
"""
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import numbaopt as no

RULES = {
    "adafactor": lambda lr: no.Adafactor(lr=lr, min_dim_size_to_factor=3, momentum=0.5),
    "sf_sgd": lambda lr: no.ScheduleFreeSGD(lr, weight_decay=0.01),
    "novograd": lambda lr: no.NovoGrad(lr),
    "centralize_agc_adam": lambda lr: no.chain(no.Centralize(), no.AdaptiveGradClip(0.05), no.Adam(lr)),
}
SHAPES = {"w": (5, 4), "k": (3, 2, 4), "b": (4,)}


def model_of(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}


def grads_of(seed, n, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()} for _ in range(n)]


def copy(m):
    return {k: v.copy() for k, v in m.items()}


def state_arrays(st, k):
    return {n: np.array(a) for n, a in st[k].state.items()}


@pytest.mark.parametrize("name", list(RULES))
def test_skip_nonfinite_and_a_refusing_clip_change_nothing(name):
    make = RULES[name]
    model, grads = model_of(), grads_of(1, 4)
    plain, wrapped = no.setup(make(0.05), model), no.setup(no.SkipNonFinite(make(0.05)), model)
    refusing = no.setup(no.chain(make(0.05), no.ClipGlobalNorm(1e6)), model)
    mp, mw, mr = copy(model), copy(model), copy(model)
    for i, gs in enumerate(grads):
        plain, mp = no.update_(plain, mp, gs)
        wrapped, mw = no.update_(wrapped, mw, gs)
        refusing, mr = no.update_(refusing, mr, gs)
        if i == 1:  # a non-finite gradient: skipped by the wrapper, refused by the clip; nothing written
            bad = copy(gs)
            bad["k"][0, 0, 0] = np.nan
            before = (copy(mw), {k: state_arrays(wrapped, k) for k in SHAPES})
            wrapped, mw = no.update_(wrapped, mw, bad)
            snap = (copy(mr), {k: state_arrays(refusing, k) for k in SHAPES}, refusing["w"].t)
            with pytest.raises(ValueError, match="ClipGlobalNorm"):
                no.update_(refusing, mr, bad)
            for k in SHAPES:
                assert np.array_equal(mw[k], before[0][k]) and np.array_equal(mr[k], snap[0][k]), k
                for n, a in state_arrays(wrapped, k).items():
                    assert np.array_equal(a, before[1][k][n], equal_nan=True), (k, n)
                for n, a in state_arrays(refusing, k).items():
                    assert np.array_equal(a, snap[1][k][n], equal_nan=True), (k, n)
            assert refusing["w"].t == snap[2] and wrapped["w"].skipped == 1
    for k in SHAPES:
        assert np.array_equal(mp[k], mw[k]) and np.array_equal(mp[k], mr[k]), k


@pytest.mark.parametrize("name", list(RULES))
def test_none_gradients_frozen_leaves_and_singles(name):
    make = RULES[name]
    model, grads = model_of(seed=2), grads_of(3, 5)
    st, m = no.setup(make(0.05), model), copy(model)
    no.freeze_(st["b"])
    singles = {k: [no.setup(make(0.05), model[k]), model[k].copy()] for k in ("w", "k")}
    for i, gs in enumerate(grads):
        gs = dict(gs, k=None) if i == 2 else gs
        st, m = no.update_(st, m, gs)
        for k in singles:
            if gs[k] is not None:
                singles[k] = list(no.update_(singles[k][0], singles[k][1], gs[k]))
    assert np.array_equal(m["b"], model["b"])  # frozen
    for k in singles:
        assert np.array_equal(m[k], singles[k][1]), k
        for n, a in state_arrays(st, k).items():
            assert np.array_equal(a, singles[k][0].state[n]), (k, n)


@pytest.mark.parametrize("name", list(RULES))
def test_schedules_adjust_and_pickle(name):
    """lr as a schedule equals the same values set with adjust_ before each step; a state pickled mid-run
    continues bitwise."""
    make = RULES[name]
    sched = no.exponential(0.05, 0.8)
    model, grads = model_of(seed=4), grads_of(5, 6)
    s1, m1 = no.setup(make(sched), model), copy(model)
    s2, m2 = no.setup(make(0.05), model), copy(model)
    for t, gs in enumerate(grads, start=1):
        s1, m1 = no.update_(s1, m1, gs)
        s2 = no.adjust_(s2, lr=sched(t))
        s2, m2 = no.update_(s2, m2, gs)
        if t == 3:
            s2 = pickle.loads(pickle.dumps(s2))
    for k in SHAPES:
        assert np.array_equal(m1[k], m2[k]), k


@pytest.mark.parametrize("name", list(RULES))
def test_mixed_precision_master_equals_a_float32_run(name):
    make = RULES[name]
    model16 = model_of(np.float16, seed=6)
    grads16 = grads_of(7, 4, np.float16)
    st16, m16 = no.setup(no.MixedPrecision(np.float32, make(0.05)), model16), copy(model16)
    st32 = no.setup(make(0.05), {k: v.astype(np.float32) for k, v in model16.items()})
    m32 = {k: v.astype(np.float32) for k, v in model16.items()}
    for gs in grads16:
        st16, m16 = no.update_(st16, m16, gs)
        st32, m32 = no.update_(st32, m32, {k: v.astype(np.float32) for k, v in gs.items()})
    for k in SHAPES:
        assert m16[k].dtype == np.float16
        assert np.array_equal(st16[k].master.reshape(SHAPES[k]), m32[k]), k
        assert np.array_equal(m16[k], m32[k].astype(np.float16)), k


_THREADED = {**RULES, "adafactor_torch": lambda lr: no.Adafactor(lr=lr, convention="torch", min_dim_size_to_factor=2),
             "muon": lambda lr: no.Muon(lr)}


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(_THREADED)), shape=st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple),
       pure=st.booleans(), seed=st.integers(0, 2**16))
def test_threaded_kernels_equal_the_serial_ones_bitwise(name, shape, pure, seed):
    """One array stepped by the threaded kernels (the element pass on threads; the per-unit sums and ``finish`` stay
    serial) gives the serial kernels' bits: parameters and every state."""
    if name == "muon" and len(shape) != 2:
        shape = shape[:2] if len(shape) > 2 else (shape[0], 3)
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    outs = []
    old = no.set_parallel_threshold(0)
    try:
        for th in (10 ** 12, 0):
            no.set_parallel_threshold(th)
            s, x = no.setup(_THREADED[name](0.1), x0.copy()), x0.copy()
            for g in grads:
                s, x = (no.update if pure else no.update_)(s, x, g)
            outs.append([x.tobytes()] + [np.asarray(v).tobytes() for v in s.state.values()])
    finally:
        no.set_parallel_threshold(old)
    assert outs[0] == outs[1]


# skip_adafactor: RULES' Adafactor, so that its reference is test_skip_nonfinite_and_a_refusing_clip_change_nothing's
# wrapped rule (the same kernels: compiled once)
_ACCUM = {**RULES, "prodigy": lambda lr: no.Prodigy(), "skip_adafactor": lambda lr: no.SkipNonFinite(
    RULES["adafactor"](lr))}


@pytest.mark.parametrize("pure", [False, True], ids=["update_", "update"])
@pytest.mark.parametrize("name", sorted(_ACCUM))
def test_accumgrad_before_axis_and_scalar_state_members_steps_on_the_mean(name, pure, tmp_path):
    """``chain(AccumGrad(3), rule)`` on a tree and on each leaf alone (pure calls keep the unit states of the calls
    that only accumulate) equals ``rule`` stepped on the cycle's mean every third call, bitwise; a checkpoint saved
    mid-cycle resumes the cycle; a non-finite gradient in a cycle is refused or skipped by the members after it."""
    x0, grads = model_of(), grads_of(7, 9)
    acc_rule = no.chain(no.AccumGrad(3), _ACCUM[name](0.05))
    st, x = no.setup(acc_rule, copy(x0)), copy(x0)
    singles = {k: no.setup(acc_rule, x0[k].copy()) for k in SHAPES} if name != "prodigy" else {}
    xs = copy(x0)
    ref, xr = no.setup(_ACCUM[name](0.05), copy(x0)), copy(x0)
    acc = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    step = no.update if pure else no.update_
    for i, g in enumerate(grads):
        st, x = step(st, x, g)
        for k in singles:
            singles[k], xs[k] = step(singles[k], xs[k], g[k])
        if i == 4:  # mid-cycle: through a checkpoint
            no.save(tmp_path / "acc.npz", st)
            st = no.load(tmp_path / "acc.npz")
            assert st[next(iter(SHAPES))].count == 2
        if i % 3 < 2:
            acc = {k: acc[k] + g[k] for k in SHAPES}
        else:
            ref, xr = no.update_(ref, xr, {k: (acc[k] + g[k]) / np.float32(3) for k in SHAPES})
            acc = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    for k in SHAPES:
        assert x[k].tobytes() == xr[k].tobytes(), k
        if singles:
            assert xs[k].tobytes() == xr[k].tobytes(), k
        for n, v in state_arrays(ref, k).items():
            assert np.array_equal(np.asarray(st[k].state[n]), v), (k, n)
    if name == "skip_adafactor":  # a non-finite gradient completing a cycle: skipped, the cycle starts again
        before = {k: np.array(v) for k, v in st["w"].state.items()}
        bad = grads_of(8, 3)
        bad[2]["w"][0, 0] = np.nan
        for g in bad:
            st, x = step(st, x, g)
        assert st["w"].skipped == 1 and st["w"].count == 0
        for n, v in st["w"].state.items():
            if n in before and n != "acc":
                assert np.array_equal(np.asarray(v), before[n]), n
