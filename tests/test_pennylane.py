"""PennyLane interop: ``pennylane.numpy.tensor`` (an ndarray subclass) on the Leaf fast path, pure steps that
keep the tensor type and ``requires_grad``, trees of tensors, other ndarray subclasses, ``step_and_cost``
against ``qml.AdamOptimizer``, ``qnode_objective`` driving ``numbaopt.minimize``, and the example."""
import os
import subprocess
import sys

import numpy as np
import pytest

qml = pytest.importorskip("pennylane", reason="PennyLane interop (pip install pennylane)")
pnp = pytest.importorskip("pennylane.numpy")

import numbaopt as no  # noqa: E402
import numbaopt.api as api  # noqa: E402
from numbaopt.quantum.pennylane import PennyLaneAdam, qnode_objective, step_and_cost  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 84  # the angles of examples/vqe.py at 6 qubits, 6 layers


def _grads(n=N, steps=4, seed=0):
    return [np.random.default_rng(seed + k).standard_normal(n) for k in range(steps)]


@pytest.fixture(scope="module")
def circuit():
    """A 2-qubit QNode ``cost(theta)`` of 6 angles, and its device."""
    dev = qml.device("default.qubit", wires=2)
    H = qml.dot([-1.0, -0.5, -0.5], [qml.PauliZ(0) @ qml.PauliZ(1), qml.PauliX(0), qml.PauliX(1)])

    @qml.qnode(dev)
    def cost(theta):
        qml.RY(theta[0], wires=0)
        qml.RY(theta[1], wires=1)
        qml.CNOT(wires=[0, 1])
        qml.RZ(theta[2], wires=0)
        qml.RZ(theta[3], wires=1)
        qml.RY(theta[4], wires=0)
        qml.RY(theta[5], wires=1)
        return qml.expval(H)

    return cost


THETA0 = np.array([0.3, -0.2, 0.1, 0.05, -0.4, 0.25])


# ------------------------------------------------------------------------------------------------
# the Leaf and its fast path
# ------------------------------------------------------------------------------------------------
def test_tensor_setup_is_a_leaf_and_update_is_bitwise_the_ndarray_one(monkeypatch):
    x0 = np.linspace(-1, 1, N)
    plain, t = x0.copy(), pnp.array(x0, requires_grad=True)
    sp, st = no.setup(no.Adam(0.01), plain), no.setup(no.Adam(0.01), t)
    assert type(st) is no.Leaf and st.shape == (N,) and st.dtype == np.float64
    ident = id(t)
    no.update_(st, t, _grads()[0])  # the first step binds the kernel and learns the tensor type
    no.update_(sp, plain, _grads()[0])

    def general_path(*a, **k):
        raise AssertionError("update_ left the fast path")

    monkeypatch.setattr(api, "step_array", general_path)  # from here on only the bound kernel may step
    for g in _grads()[1:]:
        st, out = no.update_(st, t, g)
        assert out is t
        sp, _ = no.update_(sp, plain, g)
    assert st.fast is not None
    assert id(t) == ident and type(t) is pnp.tensor and t.requires_grad is True
    np.testing.assert_array_equal(np.asarray(t), plain)
    np.testing.assert_array_equal(st.arrays[0], sp.arrays[0])


def test_tensor_gradient_takes_the_fast_path_after_the_first_step(monkeypatch):
    x = np.zeros(N)
    s = no.setup(no.Adam(0.01), x)
    g = pnp.array(_grads()[0], requires_grad=False)
    no.update_(s, x, g)  # first sight of a tensor gradient: the general path, which registers the type
    monkeypatch.setattr(api, "step_array", lambda *a, **k: pytest.fail("update_ left the fast path"))
    no.update_(s, x, g)
    assert s.t == 2


def test_pure_update_returns_a_tensor_that_qml_grad_differentiates(circuit):
    theta = pnp.array(THETA0, requires_grad=True)
    before = np.array(theta)
    s = no.setup(no.Adam(0.1), theta)
    s2, new = no.update(s, theta, qml.grad(circuit)(theta))
    assert type(new) is pnp.tensor and new.requires_grad is True and new is not theta
    np.testing.assert_array_equal(np.asarray(theta), before)  # the input is untouched
    assert s.t == 0 and s2.t == 1
    ref = np.asarray(no.update(s, before, qml.grad(circuit)(theta))[1])
    np.testing.assert_array_equal(np.asarray(new), ref)
    g = qml.grad(circuit)(new)  # was an empty tuple (and a warning) when the pure step gave a plain ndarray
    assert np.shape(g) == (6,) and np.abs(g).max() > 1e-3
    frozen = pnp.array(THETA0, requires_grad=False)
    assert no.update(no.setup(no.Adam(0.1), frozen), frozen, np.ones(6))[1].requires_grad is False


def test_read_only_tensor_gives_a_new_read_only_tensor():
    t = pnp.array(np.linspace(0, 1, 8), requires_grad=True)
    t.flags.writeable = False
    s = no.setup(no.Adam(0.1), t)
    s, out = no.update_(s, t, np.ones(8))
    assert out is not t and type(out) is pnp.tensor and out.requires_grad and not out.flags.writeable
    np.testing.assert_array_equal(np.asarray(t), np.linspace(0, 1, 8))
    np.testing.assert_allclose(np.asarray(out), np.linspace(0, 1, 8) - 0.1)
    s, out2 = no.update(s, out, np.ones(8))
    assert type(out2) is pnp.tensor and not out2.flags.writeable and s.t == 2


def test_2d_tensor_steps_like_a_2d_ndarray():
    x0 = np.arange(12.0).reshape(3, 4)
    t, plain = pnp.array(x0, requires_grad=True), x0.copy()
    st, sp = no.setup(no.Adam(0.1), t), no.setup(no.Adam(0.1), plain)
    g = np.full((3, 4), 0.5)
    st, out = no.update_(st, t, g)
    no.update_(sp, plain, g)
    assert out is t and t.shape == (3, 4)
    np.testing.assert_array_equal(np.asarray(t), plain)


def test_trees_of_tensors_are_leaves_in_place_and_pure():
    def model():
        return {"a": pnp.array([1.0, 2.0], requires_grad=True),
                "b": [pnp.array([3.0], requires_grad=False), np.array([4.0])]}

    grads = {"a": np.ones(2), "b": [np.ones(1), np.ones(1)]}
    m = model()
    s = no.setup(no.Adam(0.1), m)
    a, b0 = m["a"], m["b"][0]
    s, m2 = no.update_(s, m, grads)
    assert m2 is m and m["a"] is a and m["b"][0] is b0 and type(a) is pnp.tensor
    flat = np.array([1.0, 2.0, 3.0, 4.0])
    ref = no.update_(no.setup(no.Adam(0.1), flat), flat, np.ones(4))[1]
    np.testing.assert_array_equal(np.concatenate([a, b0, m["b"][1]]), ref)
    s, m3 = no.update(s, m, grads)
    assert type(m3["a"]) is pnp.tensor and m3["a"].requires_grad is True
    assert type(m3["b"][0]) is pnp.tensor and m3["b"][0].requires_grad is False
    assert type(m3["b"][1]) is np.ndarray and m3["a"] is not m["a"]
    np.testing.assert_array_equal(np.asarray(m["a"]), ref[:2])  # the pure step left the model alone


def test_tree_of_tensors_takes_the_trees_fast_path(monkeypatch):
    import numbaopt.tree.manage as manage

    m = {"a": pnp.array(np.linspace(0, 1, 10), requires_grad=True), "b": pnp.array(np.ones(3))}
    ref = {"a": np.linspace(0, 1, 10), "b": np.ones(3)}
    s, sr = no.setup(no.Adam(0.1), m), no.setup(no.Adam(0.1), ref)
    grads = [{"a": np.full(10, 0.5 + k), "b": np.full(3, -1.0 - k)} for k in range(3)]
    no.update_(s, m, grads[0])  # the general path, which plans the fast one
    no.update_(sr, ref, grads[0])
    monkeypatch.setattr(manage, "step_tree", lambda *a, **k: pytest.fail("update_ left the trees' fast path"))
    for g in grads[1:]:
        s, out = no.update_(s, m, g)
        assert out is m
    monkeypatch.undo()
    for g in grads[1:]:
        no.update_(sr, ref, g)
    for k in m:
        assert type(m[k]) is pnp.tensor and m[k].requires_grad
        np.testing.assert_array_equal(np.asarray(m[k]), ref[k])


def test_memmap_is_a_leaf_written_through_and_pure_gives_an_ndarray(tmp_path):
    mm = np.memmap(tmp_path / "x.dat", dtype=np.float64, mode="w+", shape=(16,))
    mm[:] = 1.0
    s = no.setup(no.Descent(0.5), mm)
    assert type(s) is no.Leaf
    s, out = no.update_(s, mm, np.ones(16))
    assert out is mm
    mm.flush()
    np.testing.assert_array_equal(np.fromfile(tmp_path / "x.dat"), np.full(16, 0.5))
    _, new = no.update(s, mm, np.ones(16))
    assert type(new) is np.ndarray  # as NumPy's own ufuncs: new values are not in the file
    np.testing.assert_array_equal(new, np.zeros(16))


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("make", [lambda: np.matrix([[1.0, 2.0, 3.0]]),
                                  lambda: np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0])])
def test_matrix_and_masked_arrays_keep_the_tree_path(make):
    x = make()
    s = no.setup(no.Descent(0.1), x)
    assert type(s) is no.StateTree  # not viewable as a flat vector / a mask a kernel would ignore
    s, out = no.update_(s, x, np.ones(x.shape))
    assert out is x
    np.testing.assert_allclose(np.asarray(x.data if np.ma.isMaskedArray(x) else x).ravel(), [0.9, 1.9, 2.9])


# ------------------------------------------------------------------------------------------------
# step_and_cost and PennyLaneAdam against qml.AdamOptimizer
# ------------------------------------------------------------------------------------------------
def _pennylane_adam(cost, steps, **hyper):
    opt = qml.AdamOptimizer(**hyper)
    theta = pnp.array(THETA0, requires_grad=True)
    xs, fs = [], []
    for _ in range(steps):
        theta, f = opt.step_and_cost(cost, theta)
        xs.append(np.array(theta))
        fs.append(float(f))
    return np.array(xs), np.array(fs)


def _ours(cost, steps, rule, grad_fn=None):
    theta = pnp.array(THETA0, requires_grad=True)
    s = no.setup(rule, theta)
    xs, fs = [], []
    for _ in range(steps):
        s, out, f = step_and_cost(s, theta, cost, grad_fn=grad_fn)
        assert out is theta
        xs.append(np.array(theta))
        fs.append(f)
    return np.array(xs), np.array(fs)


@pytest.mark.parametrize("hyper", [dict(stepsize=0.1, beta1=0.9, beta2=0.999, eps=1e-8),
                                   dict(stepsize=0.05, beta1=0.8, beta2=0.99, eps=1e-3)])
def test_step_and_cost_with_pennylane_adam_gives_pennylanes_iterates(circuit, hyper):
    xr, fr = _pennylane_adam(circuit, 6, **hyper)
    rule = PennyLaneAdam(hyper["stepsize"], beta1=hyper["beta1"], beta2=hyper["beta2"], eps=hyper["eps"])
    x, f = _ours(circuit, 6, rule)
    np.testing.assert_allclose(x, xr, rtol=0, atol=1e-12)
    np.testing.assert_allclose(f, fr, rtol=0, atol=1e-12)  # the loss before each step, as PennyLane's


def test_numbaopt_adam_differs_from_pennylanes_by_its_eps_convention(circuit):
    """numbaopt.Adam adds eps after the bias correction (Kingma-Ba Algorithm 1); qml.AdamOptimizer before it.
    With eps 0 the two formulas are the same; with a large eps the iterates visibly differ."""
    xr, _ = _pennylane_adam(circuit, 4, stepsize=0.1, beta1=0.9, beta2=0.999, eps=0.0)
    x, _ = _ours(circuit, 4, no.Adam(0.1, beta1=0.9, beta2=0.999, eps=0.0))
    np.testing.assert_allclose(x, xr, rtol=0, atol=1e-12)
    xr, _ = _pennylane_adam(circuit, 4, stepsize=0.1, beta1=0.9, beta2=0.999, eps=1e-3)
    x, _ = _ours(circuit, 4, no.Adam(0.1, beta1=0.9, beta2=0.999, eps=1e-3))
    assert np.abs(x - xr).max() > 1e-4


def test_step_and_cost_with_a_gradient_function_and_args(circuit):
    calls = []

    def cost(theta, scale, shift=0.0):
        return scale * circuit(theta) + shift

    def grad_fn(theta, scale, shift=0.0):
        calls.append(1)
        return scale * qml.grad(circuit)(theta)

    theta = pnp.array(THETA0, requires_grad=True)
    s = no.setup(no.Descent(0.1), theta)
    g = 2.0 * qml.grad(circuit)(theta)
    f0 = 2.0 * float(circuit(theta)) + 1.0
    s, out, f = step_and_cost(s, theta, cost, 2.0, grad_fn=grad_fn, shift=1.0)
    assert calls == [1] and f == pytest.approx(f0, abs=1e-14)
    np.testing.assert_allclose(np.asarray(out), THETA0 - 0.1 * g, rtol=0, atol=1e-15)


def test_step_and_cost_of_a_dict_of_tensors(circuit):
    def cost(p):
        return circuit(p["angles"]) + p["bias"][0] ** 2

    p = {"angles": pnp.array(THETA0, requires_grad=True), "bias": pnp.array([0.5], requires_grad=True)}
    s = no.setup(no.Descent(0.1), p)
    g = qml.grad(circuit)(p["angles"])
    s, out, f = step_and_cost(s, p, cost)
    assert out is p and f == pytest.approx(float(circuit(pnp.array(THETA0))) + 0.25, abs=1e-14)
    np.testing.assert_allclose(np.asarray(p["angles"]), THETA0 - 0.1 * g, rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.asarray(p["bias"]), [0.5 - 0.1 * 1.0], rtol=0, atol=1e-15)


def test_step_and_cost_refuses_what_it_cannot_train(circuit):
    frozen = pnp.array(THETA0, requires_grad=False)
    s = no.setup(no.Adam(), frozen)
    with pytest.raises(ValueError, match="requires_grad=False"):
        step_and_cost(s, frozen, circuit)
    assert s.t == 0
    with pytest.raises(TypeError, match="cost must be callable"):
        step_and_cost(s, frozen, "circuit")
    with pytest.raises(TypeError, match="grad_fn must be callable"):
        step_and_cost(s, pnp.array(THETA0), circuit, grad_fn=3)


# ------------------------------------------------------------------------------------------------
# qnode_objective: numbaopt.minimize driving a QNode
# ------------------------------------------------------------------------------------------------
def test_minimize_drives_a_qnode_with_pennylanes_iterates(circuit):
    xr, fr = _pennylane_adam(circuit, 5, stepsize=0.1, beta1=0.9, beta2=0.999, eps=1e-8)
    xs = []
    res = no.minimize(qnode_objective(circuit), THETA0, PennyLaneAdam(0.1, beta2=0.999), maxiter=5, gtol=None,
                      callback=lambda r: xs.append(np.array(r.x)) is None and False)
    assert res.nit == 5 and res.nfev == 6
    np.testing.assert_allclose(np.array(xs), xr, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.history[:5], fr, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.x, xr[-1], rtol=0, atol=1e-12)


def test_minimize_a_qnode_of_shaped_parameters_to_its_minimum():
    dev = qml.device("default.qubit", wires=2)

    @qml.qnode(dev)
    def zz(w):  # w: (2, 2); the minimum of -zz is -1 at w[0, 0] = 0, w[0, 1] = 0, any w[1, :]
        qml.RX(w[0, 0], wires=0)
        qml.RY(w[0, 1], wires=1)
        qml.RZ(w[1, 0], wires=0)
        qml.RZ(w[1, 1], wires=1)
        return qml.expval(qml.PauliZ(0) @ qml.PauliZ(1))

    def cost(w, target):  # a Python cost around the QNode, with an argument passed by minimize(args=...)
        return target * zz(w)

    fun = qnode_objective(cost, (2, 2))
    res = no.minimize(fun, np.full(4, 0.4), no.Adam(0.1), args=(-1.0,), maxiter=400, gtol=1e-7)
    assert res.fun == pytest.approx(-1.0, abs=1e-9) and res.x.shape == (4,)
    with pytest.raises(ValueError, match="shape given is"):
        no.minimize(fun, np.zeros(3), no.Adam(0.1), args=(1.0,), maxiter=2)
    with pytest.raises(TypeError, match="cost must be callable"):
        qnode_objective(None)


def test_qnode_objective_with_a_gradient_function(circuit):
    seen = []

    def shift_rule(theta):  # the parameter-shift rule, exact for these rotations
        seen.append(type(theta))
        g = np.empty(theta.shape)
        for k in range(theta.size):
            e = np.zeros(theta.size)
            e[k] = np.pi / 2
            g[k] = 0.5 * (float(circuit(theta + e)) - float(circuit(theta - e)))
        return g

    fun = qnode_objective(circuit, grad_fn=shift_rule)
    out = np.empty(6)
    f = fun(THETA0.copy(), out)
    assert seen == [pnp.tensor] and f == pytest.approx(float(circuit(pnp.array(THETA0))), abs=1e-14)
    np.testing.assert_allclose(out, qml.grad(circuit)(pnp.array(THETA0, requires_grad=True)), atol=1e-12)


# ------------------------------------------------------------------------------------------------
# the package without PennyLane, and the example
# ------------------------------------------------------------------------------------------------
def test_module_imports_without_pennylane():
    code = ("import sys; sys.modules['pennylane'] = None\n"
            "import numpy as np, numbaopt as no\n"
            "from numbaopt.quantum.pennylane import PennyLaneAdam, step_and_cost\n"
            "x = np.ones(3); s = no.setup(PennyLaneAdam(0.1), x)\n"
            "try:\n    step_and_cost(s, x, lambda x: 0.0)\n"
            "except ImportError as e:\n    print('ImportError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "pip install pennylane" in out.stdout


def test_example_runs_and_agrees_with_pennylane():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "pennylane_interop.py"), "--qubits", "2",
                          "--layers", "1", "--steps", "4", "--device", "default.qubit"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "coincide with qml.AdamOptimizer's" in out.stdout
