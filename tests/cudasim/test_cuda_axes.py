"""Axis reductions (per row / column / batch state: Adafactor, Centralize, AdaptiveGradClip, NovoGrad,
schedule-free) on the CUDA backend, under the simulator, against the CPU kernels."""
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import cuda

import numbaopt as no
from numbaopt.backends import cuda as nc
from numbaopt.compiler import cuda as cuda_emit


def _dev(a):
    return cuda.to_device(np.require(a, requirements="C"))


def _host(a):
    return a.copy_to_host()


F = dict(min_dim_size_to_factor=2)  # small leaves factored, as a large model's are
RULES = {
    "Adafactor": no.Adafactor(**F),
    "Adafactor-unfactored": no.Adafactor(),
    "Adafactor-torch": no.Adafactor(convention="torch", **F),
    "Centralize+Adam": no.chain(no.Centralize(), no.Adam(0.1)),
    "AGC+ClipNorm+Adam": no.chain(no.AdaptiveGradClip(0.1), no.ClipNorm(1.0), no.Adam(0.1)),
    "ClipGlobalNorm+Adafactor": no.chain(no.ClipGlobalNorm(0.5), no.Adafactor(**F)),
    "NovoGrad": no.NovoGrad(0.1),
    "ScheduleFreeAdamW": no.ScheduleFreeAdamW(0.1),
}
SHAPES = [(6, 5), (3, 4, 2), (2, 3, 4, 5), (7,), (3, 0)]


def _grads(rng, shapes, n=4):
    return [{k: rng.standard_normal(s) for k, s in shapes.items()} for _ in range(n)]


def _state_values(leaf):
    host = leaf.to_host() if hasattr(leaf, "to_host") else leaf
    return {k: np.asarray(v) for k, v in host.state.items()}


@pytest.mark.parametrize("name", list(RULES))
def test_one_device_array_equals_the_cpu(name):
    """Each shape (a matrix, a batch of them, a conv kernel, a vector, an empty one) on its own DeviceLeaf, pure and
    in-place steps alternating: parameters and every state (element and unit) equal the CPU's to rounding."""
    rule = RULES[name]
    rng = np.random.default_rng(1)
    # the simulator runs finish as Python: optax's 1/sqrt(v) of an empty leaf's unit raises there (inf on a device
    # and on the CPU, and read by no element)
    empty_ok = not ("Adafactor" in name and "torch" not in name)
    for shape in SHAPES if empty_ok else SHAPES[:-1]:
        x0 = rng.standard_normal(shape)
        cpu, xc = no.setup(rule, x0.copy()), x0.copy()
        xd = _dev(x0)
        dev = no.setup(rule, xd)
        assert type(dev) is nc.DeviceLeaf
        for k, g in enumerate(_grads(rng, {"g": shape})):
            cpu, xc = no.update_(cpu, xc, g["g"])
            dev, xd = (no.update_ if k % 2 else no.update)(dev, xd, _dev(g["g"]))
        np.testing.assert_allclose(_host(xd), xc, rtol=1e-12, atol=1e-14, err_msg=str(shape))
        want, got = _state_values(cpu), _state_values(dev)
        assert want.keys() == got.keys()
        for k in want:
            assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, (shape, k)
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-14, err_msg=f"{shape} {k}")
        assert dev.t == cpu.t


@pytest.mark.parametrize("name", ["Adafactor", "Adafactor-torch", "Centralize+Adam", "ClipGlobalNorm+Adafactor",
                                  "ScheduleFreeAdamW"])
def test_device_tree_is_one_group_and_equals_the_cpu(name):
    """A tree of device leaves of several shapes is one DeviceGroup (every leaf's units in one table per axis): a
    None gradient leaves its leaf out, pickling crosses the bus, pure and in-place steps; against the CPU tree."""
    rule = RULES[name]
    rng = np.random.default_rng(2)
    shapes = {"a": (6, 5), "b": (3, 4, 2), "c": (7,), "d": (2, 3, 4, 5)}
    x0 = {k: rng.standard_normal(s) for k, s in shapes.items()}
    cpu, xc = no.setup(rule, {k: v.copy() for k, v in x0.items()}), {k: v.copy() for k, v in x0.items()}
    xd = {k: _dev(v) for k, v in x0.items()}
    dev = no.setup(rule, xd)
    assert len({id(dev[k].group) for k in shapes}) == 1
    for k, g in enumerate(_grads(rng, shapes, 5)):
        if k == 2 and "Global" not in name:  # (a tree-scope reduction needs its leaves at one step count)
            g["b"] = None
        cpu, xc = no.update_(cpu, xc, g)
        dev, xd = (no.update_ if k % 2 == 0 else no.update)(dev, xd, {n: None if v is None else _dev(v)
                                                                      for n, v in g.items()})
        if k == 1:
            dev = pickle.loads(pickle.dumps(dev))
    for n in shapes:
        np.testing.assert_allclose(_host(xd[n]), xc[n], rtol=1e-12, atol=1e-14, err_msg=n)
        assert dev[n].t == cpu[n].t
        want, got = _state_values(cpu[n]), _state_values(dev[n])
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-14, err_msg=f"{n} {k}")
        shown = dev[n].state  # device views shaped as the CPU leaf shows them
        assert {k: tuple(v.shape) for k, v in shown.items()} == {k: v.shape for k, v in want.items()}


def test_float32_stays_float32_and_follows_the_cpu():
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((5, 6)).astype(np.float32)
    rule = RULES["Adafactor-torch"]
    cpu, xc = no.setup(rule, x0.copy()), x0.copy()
    xd = _dev(x0)
    dev = no.setup(rule, xd)
    for _ in range(3):
        g = rng.standard_normal(x0.shape).astype(np.float32)
        cpu, xc = no.update_(cpu, xc, g)
        dev, xd = no.update_(dev, xd, _dev(g))
    out = _host(xd)
    assert out.dtype == np.float32 and all(a.dtype == np.float32 for a in dev.arrays[:-1])
    np.testing.assert_allclose(out, xc, rtol=2e-6, atol=1e-7)


def _snapshot(state, x):
    arrays = state.arrays if isinstance(state, nc.DeviceLeaf) else state["w"].group.arenas
    return [_host(a).tobytes() for a in arrays] + [_host(x if isinstance(state, nc.DeviceLeaf) else x["w"]).tobytes()]


@pytest.mark.parametrize("tree", [False, True])
def test_a_refusal_after_an_axis_member_writes_nothing(tree):
    """The unit states are written only after every reduction of the chain agreed: a non-finite gradient refused
    by ClipNorm (after Adafactor's pass) or skipped by SkipNonFinite leaves parameters and state as they were."""
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((6, 5))
    for rule, refuses in ((no.chain(no.Adafactor(**F), no.ClipNorm(1.0)), True),
                          (no.SkipNonFinite(no.Adafactor(**F)), False)):
        x = {"w": _dev(x0), "b": _dev(x0[0])} if tree else _dev(x0)
        state = no.setup(rule, x)
        good = rng.standard_normal(x0.shape)
        state, x = no.update_(state, x, {"w": _dev(good), "b": _dev(good[0])} if tree else _dev(good))
        bad = good.copy()
        bad[2, 3] = np.nan
        before = _snapshot(state, x)
        gb = {"w": _dev(bad), "b": _dev(good[0])} if tree else _dev(bad)
        if refuses:
            with pytest.raises(ValueError, match="not finite"):
                no.update_(state, x, gb)
        else:
            state, x = no.update_(state, x, gb)
            assert (state["w"] if tree else state).skipped == 1
        assert _snapshot(state, x) == before


def test_matrix_rules_are_refused_on_the_gpu():
    """Muon (a matrix rule: Newton-Schulz on each 2-D leaf) runs on the CPU only: a clear TypeError at setup."""
    pytest.importorskip("scipy")  # Muon itself needs SciPy's BLAS (absent from the oldest-dependencies job)
    with pytest.raises(TypeError, match="matrix rule"):
        no.setup(no.Muon(), _dev(np.ones((4, 3))))
    with pytest.raises(TypeError, match="matrix rule"):
        no.setup(no.Muon(), {"a": _dev(np.ones((4, 3))), "b": _dev(np.ones((3, 2)))})


def test_save_and_load_of_a_device_tree_with_unit_states(tmp_path):
    rng = np.random.default_rng(5)
    shapes = {"a": (6, 5), "b": (3, 4, 2)}
    x = {k: _dev(rng.standard_normal(s)) for k, s in shapes.items()}
    state = no.setup(RULES["Adafactor"], x)
    grads = _grads(rng, shapes, 4)
    for g in grads[:2]:
        state, x = no.update_(state, x, {n: _dev(v) for n, v in g.items()})
    no.save(tmp_path / "af.npz", state)
    back = no.load(tmp_path / "af.npz")
    assert np.asarray(no.state_dict(state)["leaves"]["['a']"]["state"]["v_row"]).shape == (6,)
    x2 = {k: _dev(_host(v)) for k, v in x.items()}
    for g in grads[2:]:
        state, x = no.update_(state, x, {n: _dev(v) for n, v in g.items()})
        back, x2 = no.update_(back, x2, {n: _dev(v) for n, v in g.items()})
    for n in shapes:
        np.testing.assert_allclose(_host(x2[n]), _host(x[n]), rtol=1e-13, atol=1e-15)


def test_generated_source_sums_per_unit_with_atomics():
    src = cuda_emit.generate_source(RULES["Adafactor"], np.float32, True, 16, 64)
    for name in ("def axred_k", "def maxred_k", "def axfin_k0_rows", "def axfin_k0_cols", "def axfin_k0_batch",
                 "cuda.atomic.add(T0_rows_0"):
        assert name in src


_BEFORE = [None, no.ClipNorm(1.0), no.WeightDecay(0.01)]
_AXIS = [no.Centralize(), no.AdaptiveGradClip(0.05), no.ScaleByFactoredRMS(min_dim_size_to_factor=2),
         no.ScaleByFactoredRMS(min_dim_size_to_factor=2, convention="torch"), no.NovoGrad(0.1)]
_AFTER = [None, no.Adam(0.1), no.ClipGlobalNorm(0.3)]


@settings(max_examples=8, deadline=None)
@given(before=st.sampled_from(_BEFORE), axis=st.sampled_from(_AXIS), after=st.sampled_from(_AFTER),
       shapes=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple), min_size=1, max_size=3),
       pure=st.booleans(), seed=st.integers(0, 2**16))
def test_composed_chains_on_device_trees_equal_the_cpu(before, axis, after, shapes, pure, seed):
    """Any chain of (an elementwise or reduction member, an axis member, a later member or tree-wide reduction) on a
    tree of device leaves of any shapes, pure or in place, equals the CPU tree."""
    rule = no.chain(*[m for m in (before, axis, after) if m is not None])
    rng = np.random.default_rng(seed)
    x0 = {f"l{k}": rng.standard_normal(s) for k, s in enumerate(shapes)}
    cpu, xc = no.setup(rule, {k: v.copy() for k, v in x0.items()}), {k: v.copy() for k, v in x0.items()}
    xd = {k: _dev(v) for k, v in x0.items()}
    dev = no.setup(rule, xd)
    for _ in range(3):
        g = {k: rng.standard_normal(v.shape) for k, v in x0.items()}
        cpu, xc = no.update_(cpu, xc, g)
        dev, xd = (no.update if pure else no.update_)(dev, xd, {k: _dev(v) for k, v in g.items()})
    for k in x0:
        np.testing.assert_allclose(_host(xd[k]), xc[k], rtol=1e-11, atol=1e-13, err_msg=k)
