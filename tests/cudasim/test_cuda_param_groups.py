"""Parameter groups on the GPU (simulator): one global clip (and a non-finite guard) over device leaves of several
groups (different learning rates, different dtypes): the groups' totals combined on the host before every group's
finish. Against the same tree on the host (float64: 1e-12; float32: 1e-6, the atomics' order)."""
import numpy as np
import pytest
from numba import cuda

import numbaopt as no

LRS = {"w": 0.05, "b": 0.02, "h": 0.01}


def _dev(a):
    return cuda.to_device(np.require(a, requirements="C"))


def _choose(path, x):
    return no.chain(no.NonFiniteGuard(), no.ClipGlobalNorm(1.0), no.Adam(LRS[path[0].key]))


def _model(dtype_h=np.float64):
    rng = np.random.default_rng(4)
    return {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4), "h": rng.standard_normal(5).astype(dtype_h)}


def _grads(k, m, nan=False):
    rng = np.random.default_rng(50 + k)
    g = {key: 3 * rng.standard_normal(np.shape(x)).astype(x.dtype) for key, x in m.items()}
    if nan:
        g["b"][1] = np.nan
    return g


@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize("dtype_h", [np.float64, np.float32])
def test_one_norm_over_device_groups(inplace, dtype_h):
    host = _model(dtype_h)
    dev = {k: _dev(v.copy()) for k, v in host.items()}
    hs, ds = no.setup(_choose, host), no.setup(_choose, dev)
    assert len(no.tree.state.core(ds).device_groups) == 3
    for k in range(4):
        g = _grads(k, host, nan=k == 2)  # a skipped step: every group, on both sides
        hs, host = no.update_(hs, host, g)
        ds, dev = (no.update_ if inplace else no.update)(ds, dev, {key: _dev(v) for key, v in g.items()})
    for key in host:
        rtol = 1e-6 if host[key].dtype == np.float32 else 1e-12
        np.testing.assert_allclose(dev[key].copy_to_host(), host[key], rtol=rtol, atol=rtol, err_msg=key)
        assert ds[key].t == hs[key].t == 3 and ds[key].skipped == 1


def test_a_refusal_over_device_groups_writes_nothing():
    rule = lambda path, x: no.chain(no.ClipGlobalNorm(1.0), no.Descent(LRS[path[0].key]))
    host = _model()
    dev = {k: _dev(v.copy()) for k, v in host.items()}
    ds = no.setup(rule, dev)
    g = _grads(0, host, nan=True)
    with pytest.raises(ValueError, match="not finite"):
        no.update_(ds, dev, {key: _dev(v) for key, v in g.items()})
    for key in host:
        np.testing.assert_array_equal(dev[key].copy_to_host(), host[key])
    g = _grads(1, host)
    ds, dev = no.update_(ds, dev, {key: _dev(v) for key, v in g.items()})
    n = np.sqrt(sum(float(np.sum(v ** 2)) for v in g.values()))
    for key in host:
        np.testing.assert_allclose(dev[key].copy_to_host(), host[key] - LRS[key] * g[key] * min(1.0, 1.0 / n),
                                   rtol=1e-12)


def test_what_the_gpu_does_not_span_yet_is_refused_at_setup():
    m = {"w": _dev(np.ones(3)), "b": np.ones(3)}
    with pytest.raises(NotImplementedError, match="on the GPU and elsewhere"):
        no.setup(_choose, {"w": m["w"], "b": m["b"], "h": np.ones(2)})
    with pytest.raises(NotImplementedError, match="scalar state"):
        no.setup(lambda p, x: no.Prodigy(lr=1.0 if p[0].key == "w" else 0.5), {"w": _dev(np.ones(3)),
                                                                              "b": _dev(np.ones(2))})


def test_adjust_of_a_device_subtree_splits_its_group(tmp_path):
    """A subtree adjust cuts a device group in two (state moved through the host): the same numbers as a host
    tree adjusted alike, one clip still; the groups and their scope survive save and load."""
    rule = no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.05))
    host = {"enc": {"w": np.ones((2, 3)), "b": np.zeros(3)}, "dec": np.full(4, 0.5)}
    dev = {"enc": {"w": _dev(host["enc"]["w"].copy()), "b": _dev(host["enc"]["b"].copy())},
           "dec": _dev(host["dec"].copy())}
    hs, ds = no.setup(rule, host), no.setup(rule, dev)
    assert len(no.tree.state.core(ds).device_groups) == 1
    rng = np.random.default_rng(9)
    for k in range(4):
        if k == 1:
            no.adjust_(hs["enc"], lr=0.01)
            no.adjust_(ds["enc"], lr=0.01)
            assert len(no.tree.state.core(ds).device_groups) == 2 and ds["enc"]["w"].rule.rules[1].lr == 0.01
        if k == 2:
            no.save(tmp_path / "d.npz", ds)
            ds = no.load(tmp_path / "d.npz")
        g = {"enc": {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}, "dec": rng.standard_normal(4)}
        hs, host = no.update_(hs, host, g)
        ds, dev = no.update_(ds, dev, {"enc": {"w": _dev(g["enc"]["w"]), "b": _dev(g["enc"]["b"])},
                                       "dec": _dev(g["dec"])})
    np.testing.assert_allclose(dev["enc"]["w"].copy_to_host(), host["enc"]["w"], rtol=1e-12)
    np.testing.assert_allclose(dev["enc"]["b"].copy_to_host(), host["enc"]["b"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dev["dec"].copy_to_host(), host["dec"], rtol=1e-12)
    assert ds["dec"].rule.rules[1].lr == 0.05
