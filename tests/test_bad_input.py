"""The bad-input corpus: every case asserts the exception type, what the message names, and that the model and
the state are byte-identical afterwards (nothing is written before a refusal)."""
import dataclasses
import math

import numpy as np
import pytest

import numbaopt as no
from numbaopt.backends.state import Leaf
from numbaopt.tree.state import core


@dataclasses.dataclass
class Layer:
    w: np.ndarray
    b: np.ndarray


def _tree():
    return {"enc": Layer(np.linspace(-1, 1, 6).reshape(2, 3), np.arange(3.0)), "head": [np.ones(4), np.zeros(2)]}


def _tree_grads():
    return {"enc": Layer(np.full((2, 3), 0.1), np.full(3, 0.2)), "head": [np.full(4, 0.3), np.full(2, 0.4)]}


def _bytes(obj):
    """Every byte a model or a state holds, in a fixed order."""
    if isinstance(obj, np.ndarray):
        return [obj.tobytes(), str(obj.dtype), obj.shape, obj.flags.writeable]
    if type(obj) is Leaf:
        return [a.tobytes() for a in obj.arrays] + [obj.counters.tobytes(), obj.hp.tobytes(), repr(obj.rule)] + \
            ([] if obj.master is None else [obj.master.tobytes()])
    if isinstance(obj, no.StateTree):
        c = core(obj)
        out = [c.frozen.tobytes()]
        for g in c.groups:
            out += [a.tobytes() for a in g.arenas] + [g.C.tobytes(), g.hp.tobytes(), repr(g.rule)]
            out += [m.tobytes() for m in g.masters if m is not None]
        return out
    if dataclasses.is_dataclass(obj):
        return [_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    if isinstance(obj, dict):
        return [(k, _bytes(v)) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [_bytes(v) for v in obj]
    return [repr(obj)]


def _stepped(rule, model, grads, n=2):
    """A state that has taken ``n`` steps (counters and moments are not at their initial values)."""
    s = no.setup(rule, model)
    for _ in range(n):
        s, model = no.update_(s, model, grads)
    return s, model


# each case: a function returning (state, model, call) where call() must raise; plus (exception, fragments)
def _inf_adjust():
    s, m = _stepped(no.Adam(), np.ones(3), np.full(3, 0.1))
    return s, m, lambda: no.adjust_(s, lr=math.inf)


def _inf_adjust_tree():
    s, m = _stepped(no.Adam(), _tree(), _tree_grads())
    return s, m, lambda: no.adjust_(s, eps=math.inf)


def _huge_int_adjust():
    s, m = _stepped(no.Adam(), np.ones(3), np.full(3, 0.1))
    return s, m, lambda: no.adjust_(s, lr=10 ** 400)


def _schedule_to_inf():
    sched = no.join([no.constant(1e-3), no.linear(1e-3, 1.0, 2)], [2])  # fine at t=1, 2; never inf
    s, m = _stepped(no.Adam(lr=sched), np.ones(3), np.full(3, 0.1), n=1)

    class Blowup(no.Schedule):
        def values(self, ts):
            return np.where(np.asarray(ts) > 1, np.inf, 1e-3)

    s2 = no.setup(no.Adam(lr=Blowup()), m)
    s2, m = no.update_(s2, m, np.full(3, 0.1))
    return s2, m, lambda: no.update_(s2, m, np.full(3, 0.1))


def _schedule_to_inf_tree():
    class Blowup(no.Schedule):
        def values(self, ts):
            return np.where(np.asarray(ts) > 1, np.inf, 1e-3)

    s, m = _stepped(no.chain(no.ClipGlobalNorm(1.0), no.Adam(lr=Blowup())), _tree(), _tree_grads(), n=1)
    return s, m, lambda: no.update_(s, m, _tree_grads())


def _bad_grad_shape_tree():
    s, m = _stepped(no.Adam(), _tree(), _tree_grads())
    g = _tree_grads()
    g["enc"].w = np.ones((3, 2))
    return s, m, lambda: no.update_(s, m, g)


def _bad_grad_dtype_tree():
    s, m = _stepped(no.Adam(), _tree(), _tree_grads())
    g = _tree_grads()
    g["head"][1] = np.ones(2, np.int64)
    return s, m, lambda: no.update_(s, m, g)


def _bad_grad_structure_tree():
    s, m = _stepped(no.Adam(), _tree(), _tree_grads())
    g = _tree_grads()
    del g["head"][1]
    return s, m, lambda: no.update_(s, m, g)


def _nonfinite_tree():
    s, m = _stepped(no.chain(no.ClipGlobalNorm(1.0), no.Adam()), _tree(), _tree_grads())
    g = _tree_grads()
    g["head"][0][2] = np.nan
    return s, m, lambda: no.update_(s, m, g)


def _nonfinite_array():
    s, m = _stepped(no.chain(no.ClipNorm(1.0), no.Adam()), np.ones(5), np.full(5, 0.1))
    g = np.full(5, 0.1)
    g[3] = np.inf
    return s, m, lambda: no.update_(s, m, g)


def _bad_grad_dtype_array():
    s, m = _stepped(no.Adam(), np.ones(5, np.float32), np.full(5, 0.1, np.float32))
    return s, m, lambda: no.update_(s, m, np.ones(5, np.complex64))


def _bad_grad_shape_array():
    s, m = _stepped(no.Adam(), np.ones(5), np.full(5, 0.1))
    return s, m, lambda: no.update_(s, m, np.ones(6))


def _grad_wrong_type_array():
    s, m = _stepped(no.Adam(), np.ones(5), np.full(5, 0.1))
    return s, m, lambda: no.update_(s, m, [0.1] * 5)


def _model_wrong_dtype_array():
    s, m = _stepped(no.Adam(), np.ones(5), np.full(5, 0.1))
    return s, m, lambda: no.update_(s, m.astype(np.float32), np.full(5, 0.1, np.float32))


def _cyclic_grads_tree():
    s, m = _stepped(no.Adam(), _tree(), _tree_grads())
    g = _tree_grads()
    g["head"].append(g)
    return s, m, lambda: no.update_(s, m, g)


def _adjust_unknown_tree():
    s, m = _stepped(no.Adam(), _tree(), _tree_grads())
    return s, m, lambda: no.adjust_(s, betas=(0.9, 0.99))


CASES = {
    "adjust_ lr=inf": (_inf_adjust, ValueError, ["lr", "not finite"]),
    "adjust_ eps=inf on a tree": (_inf_adjust_tree, ValueError, ["eps", "not finite"]),
    "adjust_ lr=10**400": (_huge_int_adjust, ValueError, ["lr", "too large"]),
    "schedule reaching inf": (_schedule_to_inf, ValueError, ["lr", "step 2"]),
    "schedule reaching inf in a tree": (_schedule_to_inf_tree, ValueError, ["lr", "step 2"]),
    "tree gradient of the wrong shape": (_bad_grad_shape_tree, ValueError, ["grads['enc'].w", "shape"]),
    "tree gradient of the wrong dtype": (_bad_grad_dtype_tree, TypeError, ["grads['head'][1]", "int64"]),
    "tree gradient missing a leaf": (_bad_grad_structure_tree, ValueError, ["grads['head']"]),
    "tree gradient containing itself": (_cyclic_grads_tree, ValueError, ["grads['head']"]),
    "non-finite gradient in a clipped tree": (_nonfinite_tree, ValueError, ["grads['head'][0]", "not finite"]),
    "non-finite gradient of one array": (_nonfinite_array, ValueError, ["g", "ClipNorm"]),
    "array gradient of another kind": (_bad_grad_dtype_array, TypeError, ["g", "complex64"]),
    "array gradient of the wrong shape": (_bad_grad_shape_array, ValueError, ["g", "(6,)"]),
    "array gradient that is a list": (_grad_wrong_type_array, TypeError, ["g", "list"]),
    "array parameter of another dtype": (_model_wrong_dtype_array, TypeError, ["x", "float32"]),
    "adjust_ with a torch keyword": (_adjust_unknown_tree, ValueError, ["betas", "valid"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_and_nothing_written(case):
    make, exc, fragments = CASES[case]
    state, model, call = make()
    before = (_bytes(state), _bytes(model))
    with pytest.raises(exc) as info:
        call()
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))
    assert (_bytes(state), _bytes(model)) == before


# --------------------------------------------------------------------------------------------------
# construction: hyperparameters, models, choosers


@pytest.mark.parametrize("make, fragment", [
    (lambda: no.Adam(lr=math.inf), "lr=inf is not finite"),
    (lambda: no.Adam(eps=np.float32(np.inf)), "is not finite"),
    (lambda: no.Adam(lr=-math.inf), "lr=-inf is not finite"),
    (lambda: no.Adam(lr=math.nan), "lr is NaN"),
    (lambda: no.Adam(lr=10 ** 400), "too large"),
    (lambda: no.Adam(lr=no.constant(math.inf)), "finite"),
    (lambda: no.cosine(1e-3, 10 ** 400), "too large"),
    (lambda: no.linear(0.0, math.inf, 10), "finite"),
    (lambda: no.ClipGrad(-math.inf), "outside [0.0, inf]"),
    (lambda: no.Rprop(step_max=-1.0), "outside [0.0, inf]"),
])
def test_hyperparameters_are_finite(make, fragment):
    with pytest.raises(ValueError) as info:
        make()
    assert fragment in str(info.value)


def test_a_domain_that_admits_inf_says_so():
    assert no.Adam._hypers["lr"].domain() == "[0.0, inf)"
    assert no.ClipGrad._hypers["delta"].domain() == "[0.0, inf]"
    x = np.array([-5.0, 0.5, 7.0])
    s = no.setup(no.chain(no.ClipGrad(math.inf), no.Descent(1.0)), x)
    s, x = no.update_(s, x, np.array([1e300, -2.0, 3.0]))
    np.testing.assert_array_equal(x, [-5.0 - 1e300, 2.5, 4.0])
    r = no.Rprop(step_max=math.inf)
    assert r.step_max == math.inf


def test_cyclic_model_is_a_value_error_naming_the_path():
    m = {"a": np.ones(2), "sub": {}}
    m["sub"]["up"] = m
    with pytest.raises(ValueError, match=r"model\['sub'\]\['up'\].*cycle"):
        no.setup(no.Adam(), m)
    lst = [np.ones(2)]
    lst.append(lst)
    with pytest.raises(ValueError, match=r"model\[1\].*cycle"):
        no.setup(no.Adam(), lst)
    shared = {"w": np.ones(2)}  # a shared sub-container is no cycle
    s = no.setup(no.Adam(), [shared, shared])
    assert "1 trained" in repr(s)


def test_model_nested_too_deeply_is_a_value_error():
    deep = [np.ones(2)]
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested too deeply"):
        no.setup(no.Adam(), deep)


@pytest.mark.parametrize("junk", ["adam", 3, no.Adam])
def test_chooser_returning_junk_names_the_path(junk):
    with pytest.raises(TypeError, match=r"model\['enc'\]\.w: the rule chooser returned"):
        no.setup(lambda path, x: junk, _tree())


# --------------------------------------------------------------------------------------------------
# behaviour that used to differ between paths


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_clip_norm_of_an_empty_leaf_steps(p):
    for rule in (no.chain(no.ClipNorm(1.0, p=p), no.Descent(0.1)), no.chain(no.ClipGlobalNorm(1.0, p=p),
                                                                          no.Descent(0.1))):
        s = no.setup(rule, np.ones(0))
        s, x = no.update_(s, np.ones(0), np.ones(0))
        assert s.t == 1
        tree = {"e": np.ones(0), "w": np.ones(2)}
        st = no.setup(rule, tree)
        st, tree = no.update_(st, tree, {"e": np.ones(0), "w": np.full(2, 10.0)})
        scale = 1.0 / np.linalg.norm([10.0, 10.0], ord=p)
        np.testing.assert_allclose(tree["w"], 1.0 - 0.1 * 10.0 * scale, rtol=1e-15)


def test_accumulator_keeps_the_parameter_dtype_and_the_file_loads(tmp_path):
    x = np.ones(3, np.float32)
    s = no.setup(no.AccumGrad(2, no.Adam()), x)
    s, x = no.update_(s, x, np.ones(3))  # a float64 gradient of a float32 parameter: cast, not promoted
    assert all(a.dtype == np.float32 for a in s.arrays) and x.dtype == np.float32
    no.save(tmp_path / "s.npz", s)
    back = no.load(tmp_path / "s.npz")
    assert back.count == 1 and all(a.dtype == np.float32 for a in back.arrays)


@pytest.mark.parametrize("rule", [no.Adam(), no.chain(no.MixedPrecision(np.float64), no.Adam())])
@pytest.mark.parametrize("shape", [(4,), (2, 3)])
def test_read_only_parameter_comes_back_read_only_on_every_path(rule, shape):
    dtype = np.float32
    x = np.ones(shape, dtype)
    x.flags.writeable = False
    g = np.full(shape, 0.5, dtype)
    results = []
    for f in (no.update, no.update_):
        s = no.setup(rule, x)
        _, a = f(s, x, g)
        st = no.setup(rule, {"p": x})
        _, t = f(st, {"p": x}, {"p": g})
        results += [a, t["p"]]
    for r in results:
        assert not r.flags.writeable and r.dtype == dtype and r.shape == shape
        np.testing.assert_array_equal(r, results[0])
    np.testing.assert_array_equal(x, 1.0)


# --------------------------------------------------------------------------------------------------
# minimize with a Python objective


def _jac(x, g):
    g[:] = 2.0 * x


@pytest.mark.parametrize("ret, fragment", [("a", "str"), (None, "NoneType"), (np.ones(3), "shape (3,)"),
                                           (1 + 2j, "complex"), ([1.0], "list")])
def test_minimize_names_fun_when_it_returns_no_loss(ret, fragment):
    x0 = np.ones(3)
    with pytest.raises(TypeError) as info:
        no.minimize(lambda x: ret, x0, no.Adam(), jac=_jac, maxiter=3)
    assert "fun must return the loss" in str(info.value) and fragment in str(info.value)
    np.testing.assert_array_equal(x0, 1.0)


def test_minimize_accepts_a_0d_array_loss():
    res = no.minimize(lambda x: np.array(x @ x), np.ones(3), no.Adam(0.1), jac=_jac, maxiter=5)
    assert res.nit == 5 and np.isfinite(res.fun)


def test_hyperparameter_beyond_float32_is_refused_for_float32_parameters():
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="beyond float32"):
        no.setup(no.Adam(lr=1e39), x)
    with pytest.raises(ValueError, match="beyond float32"):
        no.setup(no.Adam(lr=1e39), {"w": x})
    s, x = _stepped(no.Adam(), x, np.full(3, 0.1, np.float32))
    before = _bytes(s), _bytes(x)
    with pytest.raises(ValueError, match="beyond float32"):
        no.adjust_(s, lr=1e39)
    assert (_bytes(s), _bytes(x)) == before
    assert no.setup(no.Adam(lr=1e39), np.ones(3)).rule.lr == 1e39  # float64 parameters: a finite float64


class _Box:
    def __init__(self, w):
        self.w = w


def test_loaded_state_meeting_an_unregistered_container_names_it(tmp_path):
    from numbaopt.tree import containers
    no.register_container(_Box, lambda b: [("w", b.w)], lambda b, v: _Box(*v))
    try:
        m = {"b": _Box(np.ones(3))}
        s = no.setup(no.Adam(), m)
        s, m = no.update_(s, m, {"b": _Box(np.ones(3))})
        no.save(tmp_path / "s.npz", s)
    finally:
        containers.registry.pop(_Box, None)  # as in a fresh process that did not register it
    back = no.load(tmp_path / "s.npz")
    with pytest.raises(TypeError, match=r"model\['b'\]: a _Box.*not registered in this process"):
        no.update_(back, m, {"b": _Box(np.ones(3))})
