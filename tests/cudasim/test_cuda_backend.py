"""The CUDA backend, run by Numba's CUDA simulator: every rule against its float64 reference and the CPU
path, in-place against out-of-place, many leaves in one launch, reductions, bad input, save/load.

Arrays are tiny: the simulator runs every GPU thread as a Python thread.
"""
import math
import os
import pickle
import sys

import numpy as np
import pytest

from numba import cuda

import numbaopt as no
from numbaopt.backends import cuda as nc
from numbaopt.backends.cuda import runtime as cc
from numbaopt.compiler import cuda as cuda_emit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import test_rules_reference as R  # noqa: E402  (the CPU suite's float64 references, not copied)

STEPS = 3


def test_the_simulator_is_what_runs():
    assert cc.SIM and nc.cuda_available()
    assert type(cuda.to_device(np.zeros(2))).__name__ == "FakeCUDAArray"


def _dev(a):
    return cuda.to_device(np.require(a, requirements='C'))  # keeps 0-d arrays 0-d


def _host(a):
    return a.copy_to_host()


def _run_device(rule, x0, grads, inplace=True):
    xd = _dev(x0.copy())
    s = no.setup(rule, xd)
    assert type(s) is nc.DeviceLeaf
    for g in grads:
        s, xd = (no.update_ if inplace else no.update)(s, xd, _dev(g))
    return s, _host(xd)


def _run_cpu(rule, x0, grads):
    s, x = no.setup(rule, x0.copy()), x0.copy()
    for g in grads:
        s, x = no.update_(s, x, g)
    return s, x


@pytest.mark.parametrize("case", R.CASES, ids=[R._id(c) for c in R.CASES])
def test_rule_on_device_matches_reference_cpu_and_out_of_place(case):
    rule, make_ref, _ = case
    x0, grads = R.data(np.float32, n=23, steps=STEPS)
    s1, x1 = _run_device(rule, x0, grads, inplace=True)
    s2, x2 = _run_device(rule, x0, grads, inplace=False)
    assert x1.dtype == np.float32 and s1.t == s2.t == STEPS
    assert x1.tobytes() == x2.tobytes()  # in-place and functional paths: bitwise equal
    for a, b in zip(s1.arrays, s2.arrays):
        assert _host(a).tobytes() == _host(b).tobytes()
    _, xc = _run_cpu(rule, x0, grads)
    np.testing.assert_allclose(x1, xc, rtol=2e-6, atol=2e-7)  # reductions sum in another order
    expect = R.run_reference(make_ref(rule), x0, grads)
    close = np.isclose(x1, expect, rtol=5e-4, atol=5e-4)
    assert close.mean() >= 0.95, (x1[~close], expect[~close])
    assert np.abs(x1 - x0).max() > 0


@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("rule", [no.Adam(0.01), no.RMSProp(0.01, centred=True), no.ClipNorm(2.0),
                                  no.LAMB(0.01, weight_decay=0.1)], ids=repr)
def test_other_dtypes(rule, dtype):
    case = next(c for c in R.CASES if c[0] == rule)
    x0, grads = R.data(dtype, n=11, steps=STEPS)
    s1, x1 = _run_device(rule, x0, grads)
    s2, x2 = _run_device(rule, x0, grads, inplace=False)
    assert x1.dtype == np.dtype(dtype) and x1.tobytes() == x2.tobytes()
    for (_, decl), a in zip(s1.layout.state_decls, s1.arrays):
        assert a.dtype == (np.dtype(dtype).type(0).real.dtype if decl.real else np.dtype(dtype))
    expect = R.run_reference(case[1](rule), x0, grads)
    tol = 5e-4 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-10
    np.testing.assert_allclose(x1, expect, rtol=tol, atol=tol)


def test_state_is_on_the_device_and_hyperparameters_are_runtime():
    x0, grads = R.data(np.float32, n=9, steps=2)
    xd = _dev(x0.copy())
    s = no.setup(no.Adam(0.01), xd)
    assert all(type(a).__name__ == "FakeCUDAArray" for a in s.arrays)
    assert set(s.state) == {"m", "v"} and s.state["m"].shape == (9,)
    mod = s.kernels()
    s, xd = no.update_(s, xd, _dev(grads[0]))
    no.adjust_(s, lr=0.5)
    s, xd = no.update_(s, xd, _dev(grads[1]))
    assert s.kernels() is mod
    h = no.setup(no.Adam(0.01), x0.copy())
    h, xh = no.update_(h, x0.copy(), grads[0])
    no.adjust_(h, lr=0.5)
    h, xh = no.update_(h, xh, grads[1])
    np.testing.assert_allclose(_host(xd), xh, rtol=1e-6)
    s2 = no.adjust(s, lr=0.1)
    assert s2.rule.lr == 0.1 and s.rule.lr == 0.5 and s2.t == s.t
    before = [_host(a).tobytes() for a in s.arrays] + [_host(xd).tobytes()]
    s3, x3 = no.update(s, xd, _dev(grads[0]))  # pure: the old state and parameter are untouched
    assert [_host(a).tobytes() for a in s.arrays] + [_host(xd).tobytes()] == before
    assert s3.t == s.t + 1 and all(a is not b for a, b in zip(s3.arrays, s.arrays))


def test_source_is_generated_from_the_same_definition():
    src = cuda_emit.generate_source(no.Adam(), np.float32, cc.SIM, cc.TPB, cc.CHUNK)
    assert "def step_0(g, x, m, v, lr, beta1, beta2, eps, bc1, bc2):" in src
    assert "_R(1) - beta1" in src and "@cuda.jit" in src  # literals rewritten as for the CPU kernels
    k = cc.kernels(no.Adam(), np.float32)
    assert os.path.dirname(k.source_path) == no.compiler.cache_dir()


def test_bad_input_is_refused_before_anything_is_written():
    x0 = np.arange(6, dtype=np.float32)
    xd = _dev(x0)
    s = no.setup(no.Adam(0.1), xd)
    with pytest.raises(TypeError, match="host .*GPU"):
        no.update_(s, xd, np.ones(6, np.float32))  # host gradient for a device parameter
    with pytest.raises(TypeError, match="host numpy array"):
        no.update_(s, x0.copy(), _dev(np.ones(6, np.float32)))
    with pytest.raises(TypeError, match="dtype float64"):
        no.update_(s, xd, _dev(np.ones(6)))
    with pytest.raises(ValueError, match="shape"):
        no.update_(s, xd, _dev(np.ones(5, np.float32)))
    assert _host(xd).tobytes() == x0.tobytes() and s.t == 0
    assert not np.any(_host(s.arrays[0]))
    h = no.setup(no.Adam(0.1), x0.copy())
    with pytest.raises(TypeError, match="GPU for a host parameter"):
        no.update_(h, x0.copy(), _dev(np.ones(6, np.float32)))
    with pytest.raises(TypeError, match="float16|unsupported|expected float32"):
        no.setup(no.Adam(), _dev(np.ones(3, np.int32)))
    with pytest.raises(TypeError, match="complex"):
        no.setup(no.ClipGrad(), _dev(np.ones(3, np.complex64)))


def test_nonfinite_gradient_skips_or_raises_without_writing():
    x0, grads = R.data(np.float32, n=10, steps=1)
    bad = grads[0].copy()
    bad[3] = np.nan
    xd = _dev(x0.copy())
    s = no.setup(no.SkipNonFinite(no.Adam(0.1)), xd)
    s, xd = no.update_(s, xd, _dev(bad))
    assert s.skipped == 1 and s.t == 0 and _host(xd).tobytes() == x0.tobytes()
    s, xd = no.update_(s, xd, _dev(grads[0]))
    assert s.t == 1 and not np.array_equal(_host(xd), x0)
    xd = _dev(x0.copy())
    s = no.setup(no.ClipNorm(1.0), xd)
    with pytest.raises(ValueError, match="not finite"):
        no.update_(s, xd, _dev(bad))
    assert _host(xd).tobytes() == x0.tobytes() and s.t == 0
    s2, xo = no.update(no.setup(no.SkipNonFinite(no.Adam(0.1)), xd), xd, _dev(bad))
    assert s2.skipped == 1 and _host(xo).tobytes() == x0.tobytes()


SHAPES = [(3,), (40,), (2, 5), ()]  # 40 > CHUNK in the simulator: several blocks per leaf


def _leaves(dtype=np.float32, steps=2, seed=1):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    gs = [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(steps)]
    return xs, gs


@pytest.mark.parametrize("rule", [no.Adam(0.1), no.chain(no.WeightDecay(0.1), no.ClipGrad(0.5), no.Nesterov(0.1)),
                                  no.ClipNorm(1.0)], ids=repr)
def test_group_one_launch_matches_per_leaf_cpu(rule):
    assert max(int(np.prod(s)) for s in SHAPES) > cc.CHUNK
    xs, gs = _leaves()
    xd = [_dev(x.copy()) for x in xs]
    grp = no.setup_device_group(rule, xd)
    hs = [no.setup(rule, x.copy()) for x in xs]
    xh = [x.copy() for x in xs]
    for step in gs:
        grp, xd = no.update_(grp, xd, [_dev(g) for g in step])
        for i, g in enumerate(step):
            hs[i], xh[i] = no.update_(hs[i], xh[i], g)
    for a, b in zip(xd, xh):
        np.testing.assert_allclose(_host(a), b, rtol=2e-6, atol=2e-7)
    assert grp.t == len(gs)
    for i, h in enumerate(hs):  # the arenas hold each leaf's state where state(i) says
        for name, arr in grp.state(i).items():
            np.testing.assert_allclose(_host(arr), h.state[name], rtol=2e-6, atol=1e-7)
    new, xo = no.update(grp, xd, [_dev(g) for g in gs[0]])
    grp, xd = no.update_(grp, xd, [_dev(g) for g in gs[0]])
    assert new.t == grp.t
    assert all(_host(a).tobytes() == _host(b).tobytes() for a, b in zip(xo, xd))


def test_group_global_norm_and_skip_span_every_leaf():
    xs, gs = _leaves(steps=1)
    g = gs[0]
    xd = [_dev(x.copy()) for x in xs]
    grp = no.setup_device_group(no.ClipGlobalNorm(0.5), xd)
    grp, xd = no.update_(grp, xd, [_dev(a) for a in g])
    n = np.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in g))
    for x, a, y in zip(xs, g, xd):
        np.testing.assert_allclose(_host(y), x - a * min(0.5 / n, 1.0), rtol=1e-6, atol=1e-7)
    bad = [a.copy() for a in g]
    bad[2].flat[1] = np.inf
    xd = [_dev(x.copy()) for x in xs]
    grp = no.setup_device_group(no.SkipNonFinite(no.Adam(0.1)), xd)
    grp, xd = no.update_(grp, xd, [_dev(a) for a in bad])
    assert grp.skipped == 1 and grp.t == 0
    assert all(_host(y).tobytes() == x.tobytes() for x, y in zip(xs, xd))
    grp = no.setup_device_group(no.ClipNorm(1.0), xd)
    with pytest.raises(ValueError, match="leaf 2: ClipNorm"):
        no.update_(grp, xd, [_dev(a) for a in bad])


def test_group_bad_input():
    xs, gs = _leaves(steps=1)
    xd = [_dev(x.copy()) for x in xs]
    with pytest.raises(TypeError, match=r"params\[1\]: dtype float64"):
        no.setup_device_group(no.Adam(), [xd[0], _dev(np.ones(3))])
    grp = no.setup_device_group(no.Adam(), xd)
    with pytest.raises(TypeError, match=r"grads\[0\]: a host ndarray"):
        no.update_(grp, xd, gs[0])
    with pytest.raises(ValueError, match=r"grads\[1\]: shape"):
        no.update_(grp, xd, [_dev(gs[0][0])] * len(xd))
    with pytest.raises(ValueError, match="3 arrays for a group of 4"):
        no.update_(grp, xd, [_dev(a) for a in gs[0]][:3])
    assert grp.t == 0 and all(_host(y).tobytes() == x.tobytes() for x, y in zip(xs, xd))


def _continue_both_bitwise(s, xd, s2, grads):
    """Step a state and its restored copy (on a copy of the parameter) with the same gradients."""
    xd2 = _dev(_host(xd))
    for g in grads:
        s, xd = no.update_(s, xd, _dev(g))
        s2, xd2 = no.update_(s2, xd2, _dev(g))
    assert _host(xd).tobytes() == _host(xd2).tobytes()


def test_save_and_load_copy_the_state_across_the_bus():
    x0, grads = R.data(np.float32, n=12, steps=3)
    xd = _dev(x0.copy())
    s = no.setup(no.AdamW(0.01, weight_decay=0.1), xd)
    s, xd = no.update_(s, xd, _dev(grads[0]))
    host = s.to_host()
    assert type(host) is no.Leaf and host.t == 1 and isinstance(host.arrays[0], np.ndarray)
    s2 = pickle.loads(pickle.dumps(s))
    assert type(s2) is nc.DeviceLeaf and s2.t == 1
    _continue_both_bitwise(s, xd, s2, grads[1:])
    back = nc.DeviceLeaf.from_host(host)
    assert _host(back.arrays[1]).tobytes() == host.arrays[1].tobytes()

    xs, gs = _leaves(steps=1)
    xd = [_dev(x.copy()) for x in xs]
    grp = no.setup_device_group(no.Adam(0.1), xd)
    grp, xd = no.update_(grp, xd, [_dev(a) for a in gs[0]])
    leaves = grp.to_host()
    assert [lf.shape for lf in leaves] == SHAPES and all(lf.t == 1 for lf in leaves)
    g2 = nc.DeviceGroup.from_host(leaves, xd)
    for i in range(len(SHAPES)):
        assert all(_host(a).tobytes() == _host(b).tobytes() for a, b in zip(grp.state(i).values(),
                                                                            g2.state(i).values()))


def test_numbaopt_save_and_load_of_gpu_state(tmp_path):
    """``numbaopt.save`` copies device state to the host; ``load`` puts it back on the device, and the
    trajectory continues bitwise: one device array, and a tree mixing host and device leaves."""
    x0, grads = R.data(np.float32, n=12, steps=4)
    xd = _dev(x0.copy())
    s = no.setup(no.Adam(0.01), xd)
    s, xd = no.update_(s, xd, _dev(grads[0]))
    no.save(tmp_path / "leaf.npz", s)
    s2 = no.load(tmp_path / "leaf.npz")
    assert type(s2) is nc.DeviceLeaf and s2.t == 1
    _continue_both_bitwise(s, xd, s2, grads[1:])

    model = {"cpu": x0.copy(), "gpu": [_dev(x0.copy()), (_dev(x0[:5].copy()),)]}

    def grads_at(k):
        return {"cpu": grads[k], "gpu": [_dev(grads[k]), (_dev(grads[k][:5].copy()),)]}

    state = no.setup(no.Momentum(0.1), model)
    state, model = no.update_(state, model, grads_at(0))
    no.freeze_(state["gpu"][1])
    no.save(tmp_path / "tree.npz", state)
    loaded = no.load(tmp_path / "tree.npz")
    assert type(loaded["gpu"][0]) is nc.DeviceMember and loaded["gpu"][0].t == 1
    other = {"cpu": model["cpu"].copy(), "gpu": [_dev(_host(model["gpu"][0])), (_dev(_host(model["gpu"][1][0])),)]}
    for k in (1, 2):
        state, model = no.update_(state, model, grads_at(k))
        loaded, other = no.update_(loaded, other, grads_at(k))
    assert model["cpu"].tobytes() == other["cpu"].tobytes()
    assert _host(model["gpu"][0]).tobytes() == _host(other["gpu"][0]).tobytes()
    assert _host(model["gpu"][1][0]).tobytes() == _host(other["gpu"][1][0]).tobytes()
    assert loaded["gpu"][1][0].t == 1 and loaded["gpu"][0].t == 3  # the frozen flag came back too


def test_gpu_check_script_runs_end_to_end_in_simulator_mode(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    import gpu_check
    out = tmp_path / "gpu.json"
    report = gpu_check.main(["--sim", "--max-rules", "3", "--sizes", "64", "--json", str(out)])
    assert out.exists() and report["rules_failed"] == [] and report["simulator"]
    assert report["rules_checked"] == 5  # 3 float32 + 2 complex64
    assert len(gpu_check.catalog()) >= 35  # the full run checks every rule
    kinds = {r["case"] for r in report["timings"]}
    assert {"copy", "adam"} <= kinds and any(r["leaves"] > 1 for r in report["timings"])


def test_group_address_tables_follow_the_arrays_passed():
    xs, gs = _leaves(steps=2)
    xd = [_dev(x.copy()) for x in xs]
    gd = [_dev(g) for g in gs[0]]
    grp = no.setup_device_group(no.Descent(0.5), xd)
    grp, xd = no.update_(grp, xd, gd)
    for buf, g in zip(gd, gs[1]):  # the same gradient objects with new contents: the table is reused
        buf.copy_to_device(np.require(g, requirements="C"))
    other = [_dev(_host(a)) for a in xd]  # other parameter objects: their addresses are used now
    grp, other = no.update_(grp, other, gd)
    for x, g0, g1, a, b in zip(xs, gs[0], gs[1], xd, other):
        np.testing.assert_allclose(_host(a), x - 0.5 * g0, rtol=1e-6)
        np.testing.assert_allclose(_host(b), x - 0.5 * g0 - 0.5 * g1, rtol=1e-6, atol=1e-7)


def test_mixed_host_and_device_tree():
    rng = np.random.default_rng(3)
    host_w = rng.standard_normal(5).astype(np.float32)
    dev_w = rng.standard_normal((2, 3)).astype(np.float32)
    g_host = [rng.standard_normal(5).astype(np.float32) for _ in range(2)]
    g_dev = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    model = {"cpu": host_w.copy(), "gpu": {"w": _dev(dev_w)}}
    state = no.setup(no.Adam(0.1), model)
    assert type(state["gpu"]["w"]) is nc.DeviceMember
    ref = {"cpu": no.setup(no.Adam(0.1), host_w.copy()), "gpu": no.setup(no.Adam(0.1), dev_w.copy())}
    xc, xg = host_w.copy(), dev_w.copy()
    state, model = no.update_(state, model, {"cpu": g_host[0], "gpu": {"w": _dev(g_dev[0])}})
    ref["cpu"], xc = no.update_(ref["cpu"], xc, g_host[0])
    ref["gpu"], xg = no.update_(ref["gpu"], xg, g_dev[0])
    assert model["cpu"].tobytes() == xc.tobytes()
    np.testing.assert_allclose(_host(model["gpu"]["w"]), xg, rtol=1e-6)
    before = _host(model["gpu"]["w"])
    new_state, new_model = no.update(state, model, {"cpu": g_host[1], "gpu": {"w": _dev(g_dev[1])}})
    assert type(new_model["gpu"]["w"]).__name__ == "FakeCUDAArray" and new_model["gpu"]["w"] is not model["gpu"]["w"]
    assert _host(model["gpu"]["w"]).tobytes() == before.tobytes()  # the pure step wrote nothing
    ref["gpu"], xg = no.update_(ref["gpu"], xg, g_dev[1])
    np.testing.assert_allclose(_host(new_model["gpu"]["w"]), xg, rtol=1e-6)
    # gradients on the wrong side of the bus: TypeErrors naming the path, before anything is written
    cpu_before = model["cpu"].copy()
    with pytest.raises(TypeError, match=r"grads\['gpu'\]\['w'\]: a host ndarray"):
        no.update_(state, model, {"cpu": g_host[0], "gpu": {"w": g_dev[0]}})
    with pytest.raises(TypeError, match=r"grads\['cpu'\]: a device array"):
        no.update_(state, model, {"cpu": _dev(g_host[0]), "gpu": {"w": _dev(g_dev[0])}})
    assert model["cpu"].tobytes() == cpu_before.tobytes()
    assert _host(model["gpu"]["w"]).tobytes() == before.tobytes()
    no.adjust_(state, lr=0.0)
    state, model = no.update_(state, model, {"cpu": g_host[0], "gpu": {"w": _dev(g_dev[0])}})
    assert _host(model["gpu"]["w"]).tobytes() == before.tobytes()  # lr 0 reached the device leaf
    with pytest.raises(NotImplementedError, match="on the GPU and elsewhere"):
        no.setup(no.chain(no.ClipGlobalNorm(1.0), no.Descent(0.1)), {"a": _dev(dev_w), "b": host_w})


class _LaunchCounter:
    """Counts launches of a generated kernel (``kernel[grid, block](...)``)."""

    def __init__(self, kernel):
        self.kernel, self.n = kernel, 0

    def __getitem__(self, cfg):
        self.n += 1
        return self.kernel[cfg]


def test_tree_device_leaves_are_one_group_and_one_launch(monkeypatch):
    rng = np.random.default_rng(11)
    shapes = [(3,), (2, 2), (), (0,), (5,), (1, 3)]
    xs = [rng.standard_normal(sh).astype(np.float32) for sh in shapes]
    gs = [[rng.standard_normal(sh).astype(np.float32) for sh in shapes] for _ in range(3)]
    model = {"gpu": [_dev(x.copy()) for x in xs], "cpu": np.ones(4, np.float32)}
    state = no.setup(no.Adam(0.05), model)
    grp = state["gpu"][0].group
    assert all(state["gpu"][i].group is grp for i in range(len(shapes))) and len(grp) == len(shapes)
    assert "GPU group" in repr(state)
    counter = _LaunchCounter(grp.mod.multi)
    monkeypatch.setattr(grp.mod, "multi", counter)
    refs = [no.setup(no.Adam(0.05), _dev(x.copy())) for x in xs]
    ref_x = [_dev(x.copy()) for x in xs]

    def step_refs(k, skip=()):
        for i in range(len(shapes)):
            if i not in skip:
                refs[i], ref_x[i] = no.update_(refs[i], ref_x[i], _dev(gs[k][i]))

    def grads(k, skip=()):
        return {"gpu": [None if i in skip else _dev(g) for i, g in enumerate(gs[k])], "cpu": np.ones(4, np.float32)}

    state, model = no.update_(state, model, grads(0))
    step_refs(0)
    assert counter.n == 1  # six device leaves, one launch
    state, model = no.update_(state, model, grads(1, skip=(1,)))  # a None gradient: leaf 1 keeps its t
    step_refs(1, skip=(1,))
    assert counter.n == 2 and state["gpu"][1].t == 1 and state["gpu"][0].t == 2
    # leaves at two step counts now: one launch per count, the same numbers as one array at a time
    before = [_host(a) for a in model["gpu"]]
    new_state, new_model = no.update(state, model, grads(2))
    assert counter.n == 4 and [_host(a).tobytes() for a in model["gpu"]] == [b.tobytes() for b in before]
    assert state["gpu"][0].t == 2 and new_state["gpu"][0].t == 3 and new_state["gpu"][1].t == 2
    step_refs(2)
    for a, b in zip(new_model["gpu"], ref_x):
        assert _host(a).tobytes() == _host(b).tobytes()
    for i in range(len(shapes)):
        for k, v in refs[i].state.items():
            assert _host(new_state["gpu"][i].state[k]).tobytes() == _host(v).tobytes()
    # adjust reaches the group once; a deep copy is independent
    copy = no.adjust(new_state, lr=0.0)
    assert copy["gpu"][0].group is not new_state["gpu"][0].group and copy["gpu"][0].rule.lr == 0.0
    assert new_state["gpu"][0].rule.lr == 0.05


def test_tree_global_norm_clip_over_device_leaves():
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal(n).astype(np.float32) for n in (4, 7, 3)]
    gs = [3 * rng.standard_normal(n).astype(np.float32) for n in (4, 7, 3)]
    rule = no.chain(no.ClipGlobalNorm(1.0), no.Descent(0.5))
    model = {"a": _dev(xs[0].copy()), "b": [_dev(xs[1].copy()), _dev(xs[2].copy())]}
    state = no.setup(rule, model)
    state, model = no.update_(state, model, {"a": _dev(gs[0]), "b": [_dev(gs[1]), _dev(gs[2])]})
    grp = no.setup_device_group(rule, [_dev(x.copy()) for x in xs])
    grp, ref = no.update_(grp, [_dev(x.copy()) for x in xs], [_dev(g) for g in gs])
    got = [model["a"], *model["b"]]
    for a, b in zip(got, ref):
        assert _host(a).tobytes() == _host(b).tobytes()
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in gs))
    np.testing.assert_allclose(np.concatenate([_host(a) for a in got]),
                               np.concatenate(xs) - 0.5 * np.concatenate(gs) / norm, rtol=1e-5)
    # one leaf without a gradient: the others step; then the leaves sit at two step counts, which a
    # reduction over the whole group cannot span: refused before anything is written
    state, model = no.update_(state, model, {"a": None, "b": [_dev(gs[1]), _dev(gs[2])]})
    before = [_host(a) for a in [model["a"], *model["b"]]]
    with pytest.raises(NotImplementedError, match="one step count"):
        no.update_(state, model, {"a": _dev(gs[0]), "b": [_dev(gs[1]), _dev(gs[2])]})
    assert [_host(a).tobytes() for a in [model["a"], *model["b"]]] == [b.tobytes() for b in before]


def test_frozen_device_leaf_in_a_tree_is_not_stepped():
    m = {"cpu": np.ones(3, np.float32), "gpu": {"w": _dev(np.ones(3, np.float32))}}
    s = no.setup(no.Descent(0.5), m)
    no.freeze_(s["gpu"])
    grads = {"cpu": np.ones(3, np.float32), "gpu": {"w": _dev(np.ones(3, np.float32))}}
    s, m = no.update_(s, m, grads)
    assert np.all(m["cpu"] == 0.5) and np.all(_host(m["gpu"]["w"]) == 1.0)
    no.thaw_(s["gpu"])
    s, m = no.update_(s, m, grads)
    assert np.all(m["cpu"] == 0.0) and np.all(_host(m["gpu"]["w"]) == 0.5)


def test_a_missing_gradient_skips_and_a_wrong_one_is_named():
    xd = _dev(np.ones(3, np.float32))
    s = no.setup(no.Adam(), xd)
    s2, x2 = no.update_(s, xd, None)  # a None gradient skips the step, as for host arrays and in trees
    assert s2 is s and x2 is xd and s.t == 0
    with pytest.raises(TypeError, match=r"g: expected a device array for the GPU parameter \(or None\), got list"):
        no.update_(s, xd, [1.0, 2.0, 3.0])


def test_group_adjust():
    xs, gs = _leaves(steps=1)
    xd = [_dev(x.copy()) for x in xs]
    gd = [_dev(g) for g in gs[0]]
    grp = no.setup_device_group(no.Descent(0.5), xd)
    frozen = no.adjust(grp, lr=0.0)
    assert grp.rule.lr == 0.5 and frozen.rule.lr == 0.0
    frozen, xd = no.update_(frozen, xd, gd)
    assert frozen.t == 1 and all(_host(a).tobytes() == x.tobytes() for a, x in zip(xd, xs))
    no.adjust_(grp, lr=0.25)
    grp, xd = no.update_(grp, xd, gd)
    for a, x, g in zip(xd, xs, gs[0]):
        np.testing.assert_allclose(_host(a), x - 0.25 * g, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        no.adjust_(grp, beta=0.1)


@pytest.mark.parametrize("bad", ["cpu", "gpu", "gpu-late"])
def test_a_refusal_on_either_side_of_the_bus_changes_nothing(bad):
    """A tree of host and device leaves under chain(ClipNorm, Adam): one host group, one device group. An
    inf in either side's gradient refuses the step before either side writes; with the device leaves at two
    step counts (one launch per count, reduced during the commit) the device copy is restored."""
    rule = no.chain(no.ClipNorm(1.0), no.Adam(0.1))
    model = {"cpu": np.ones(5, np.float32), "gpu": [_dev(np.ones(4, np.float32)), _dev(np.ones(3, np.float32))]}
    state = no.setup(rule, model)

    def grads(inf_at=None):
        g = {"cpu": np.ones(5, np.float32), "gpu": [_dev(np.ones(4, np.float32)), _dev(np.ones(3, np.float32))]}
        if inf_at == "cpu":
            g["cpu"][2] = np.inf
        elif inf_at == "gpu":
            h = np.ones(3, np.float32)
            h[1] = np.inf
            g["gpu"][1] = _dev(h)
        return g

    state, model = no.update_(state, model, grads())
    if bad == "gpu-late":  # leaf gpu[0] steps once more: the device leaves are at two step counts
        g = grads()
        g["gpu"][1] = None
        state, model = no.update_(state, model, g)
    snap = ([model["cpu"].tobytes()] + [_host(a).tobytes() for a in model["gpu"]]
            + [_host(a).tobytes() for a in state["gpu"][0].group.arenas]
            + [state["gpu"][0].group.ts.tobytes(), state["cpu"].counters.tobytes()])
    with pytest.raises(ValueError, match="not finite"):
        no.update_(state, model, grads("cpu" if bad == "cpu" else "gpu"))
    after = ([model["cpu"].tobytes()] + [_host(a).tobytes() for a in model["gpu"]]
             + [_host(a).tobytes() for a in state["gpu"][0].group.arenas]
             + [state["gpu"][0].group.ts.tobytes(), state["cpu"].counters.tobytes()])
    assert after == snap


PF_RULES = [no.DAdaptAdamW(), no.Prodigy(), no.SkipNonFinite(no.Prodigy(d0=1e-3))]


def _pf_data(rng, n=6, nan=False):
    x0 = {"a": rng.standard_normal((4, 5)), "b": rng.standard_normal(7)}
    base = {k: rng.standard_normal(v.shape) for k, v in x0.items()}  # a steady direction: the estimate grows
    grads = [{k: base[k] + 0.5 * rng.standard_normal(v.shape) for k, v in x0.items()} for _ in range(n)]
    if nan:
        grads[3]["b"][2] = np.nan  # the step is skipped: nothing written, the estimate unchanged
    return x0, grads


@pytest.mark.parametrize("rule", PF_RULES, ids=["DAdaptAdamW", "Prodigy", "SkipNonFinite"])
def test_scalar_state_rules_on_the_gpu_equal_the_cpu(rule):
    """A reduction's scalar state (the tree-wide estimate d of D-Adaptation and Prodigy) on a device array and on
    a tree of them, in place and pure, against the CPU path; it crosses to the host and back (to_host, pickle)."""
    x0, grads = _pf_data(np.random.default_rng(3), nan=isinstance(rule, no.Chain))
    cpu = no.setup(rule, {k: v.copy() for k, v in x0.items()})
    xc = {k: v.copy() for k, v in x0.items()}
    dev = {k: _dev(v) for k, v in x0.items()}
    sd = no.setup(rule, dev)
    dev2 = {k: _dev(v) for k, v in x0.items()}
    sd2 = no.setup(rule, dev2)
    one, sone = _dev(x0["b"]), no.setup(rule, _dev(x0["b"]))
    cone, xone = no.setup(rule, x0["b"].copy()), x0["b"].copy()
    for k, g in enumerate(grads):
        cpu, xc = no.update_(cpu, xc, g)
        sd, dev = no.update_(sd, dev, {n: _dev(v) for n, v in g.items()})
        sd2, dev2 = no.update(sd2, dev2, {n: _dev(v) for n, v in g.items()})
        sone, one = (no.update_ if k % 2 else no.update)(sone, one, _dev(g["b"]))
        cone, xone = no.update_(cone, xone, g["b"])
        if k == 2:
            sd = pickle.loads(pickle.dumps(sd))  # through the host
            sone = pickle.loads(pickle.dumps(sone))
    for n in x0:
        np.testing.assert_allclose(_host(dev[n]), xc[n], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(_host(dev2[n]), xc[n], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_host(one), xone, rtol=1e-12, atol=1e-15)
    d = float(cpu["a"].state["d"])
    assert d > 1e-6
    for leaf in (sd["a"], sd["b"], sd2["a"]):
        assert leaf.state["d"].shape == () and abs(float(_host(leaf.state["d"])) - d) <= 1e-12 * d
        assert abs(float(leaf.to_host().state["d"]) - d) <= 1e-12 * d
    assert abs(float(_host(sone.state["d"])) - float(cone.state["d"])) <= 1e-12 * d


def test_scalar_state_of_a_device_tree_is_saved_and_loaded(tmp_path):
    rng = np.random.default_rng(5)
    x0, grads = _pf_data(rng)
    dev = {k: _dev(v) for k, v in x0.items()}
    state = no.setup(no.Prodigy(), dev)
    for g in grads[:2]:
        state, dev = no.update_(state, dev, {n: _dev(v) for n, v in g.items()})
    no.save(tmp_path / "pf.npz", state)
    back = no.load(tmp_path / "pf.npz")
    sd = no.state_dict(state)
    assert np.asarray(sd["leaves"]["['b']"]["state"]["d"]).shape == ()
    dev2 = {k: _dev(_host(v)) for k, v in dev.items()}
    for g in grads[2:]:
        state, dev = no.update_(state, dev, {n: _dev(v) for n, v in g.items()})
        back, dev2 = no.update_(back, dev2, {n: _dev(v) for n, v in g.items()})
    for n in x0:
        assert _host(dev[n]).tobytes() == _host(dev2[n]).tobytes()
