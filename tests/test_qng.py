"""Quantum natural gradient: the compiled solver against NumPy, the VQE example's metric tensors and the QNG
iterates against PennyLane (``qml.metric_tensor``, ``QNGOptimizer``), errors, and the cache across processes."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

import numbaopt as no
from numbaopt.quantum import linalg
from numbaopt.loops import TARGET as TARGET_STATUS
from numbaopt.quantum.qng import minimize_qng, natural_gradient, workspace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))  # Numba's cache re-imports the module by name
import vqe  # noqa: E402

NQ, LAYERS = 3, 2  # 18 angles


def _theta(seed=3):
    return vqe.initial_angles(NQ, LAYERS, seed=seed, scale=1.0)


def _metric(fn, theta):
    G = np.empty((theta.size, theta.size))
    fn(theta, G, NQ, LAYERS)
    return G


# ---------------------------------------------------------------------------------------------
# natural_gradient
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 40])
def test_natural_gradient_matches_numpy_solve_and_pinv(n):
    rng = np.random.default_rng(n)
    B = rng.normal(size=(n, n))
    G = B @ B.T / n
    g = rng.normal(size=n)
    out = np.empty(n)
    assert natural_gradient(g, G, 1e-3, out, workspace(n)) == linalg.CHOLESKY
    np.testing.assert_allclose(out, np.linalg.solve(G + 1e-3 * np.eye(n), g), rtol=1e-10, atol=1e-12)
    inplace = g.copy()
    natural_gradient(inplace, G, 1e-3, inplace)  # out is g; the workspace allocated inside
    np.testing.assert_array_equal(inplace, out)
    # a singular (rank n//2) metric without regularisation: PennyLane's pinv step
    C = rng.normal(size=(n, max(n // 2, 1)))
    S = C @ C.T
    status = natural_gradient(g, S, 0.0, out)
    assert status == (linalg.CHOLESKY if n == 1 else linalg.PINV)
    np.testing.assert_allclose(out, np.linalg.pinv(S) @ g, rtol=1e-9, atol=1e-10)


def test_natural_gradient_zero_metric_and_block_diagonal():
    g = np.array([1.0, -2.0, 3.0])
    out = np.empty(3)
    assert natural_gradient(g, np.zeros((3, 3)), 0.0, out) == linalg.PINV
    np.testing.assert_array_equal(out, np.zeros(3))  # pinv(0) = 0, as NumPy
    blocks = np.zeros((3, 3))
    blocks[:2, :2] = [[2.0, 0.5], [0.5, 1.0]]
    blocks[2, 2] = 4.0
    natural_gradient(g, blocks, 0.0, out)
    np.testing.assert_allclose(out[:2], np.linalg.solve(blocks[:2, :2], g[:2]), rtol=1e-14)
    assert out[2] == 0.75  # the zeros off the blocks stay exact zeros in the factor


def test_natural_gradient_errors_and_nonfinite():
    g, out = np.ones(3), np.empty(3)
    for bad in (np.eye(4), np.ones((3, 4)), np.eye(3)[:, :2]):
        with pytest.raises(ValueError, match=r"shape \(n, n\)"):
            natural_gradient(g, bad, 0.0, out)
    with pytest.raises(ValueError, match="out must have the shape"):
        natural_gradient(g, np.eye(3), 0.0, np.empty(2))
    with pytest.raises(ValueError, match="work must have shape"):
        natural_gradient(g, np.eye(3), 0.0, out, np.empty((3, 3)))
    G = np.eye(3)
    G[1, 2] = np.inf
    assert natural_gradient(g, G, 0.0, out) == linalg.NONFINITE
    assert np.isnan(out).all()
    assert natural_gradient(np.array([1.0, np.nan, 0.0]), np.eye(3), 0.0, out) == linalg.NONFINITE
    assert natural_gradient(g, np.eye(3), np.nan, out) == linalg.NONFINITE


# ---------------------------------------------------------------------------------------------
# the VQE example's metric tensors
# ---------------------------------------------------------------------------------------------
def test_block_diag_is_the_full_metric_on_its_blocks():
    theta = _theta(seed=8)
    full, block = _metric(vqe.metric_tensor, theta), _metric(vqe.metric_tensor_block_diag, theta)
    mask = np.zeros(full.shape, dtype=bool)
    for k in range(0, theta.size, NQ):  # one block per RY layer and per RZ layer
        mask[k:k + NQ, k:k + NQ] = True
    np.testing.assert_allclose(block, np.where(mask, full, 0.0), atol=1e-14)
    assert np.abs(full[~mask]).max() > 1e-2  # the full metric couples the layers
    np.testing.assert_allclose(full, full.T, atol=0)
    assert np.linalg.eigvalsh(full).min() > -1e-14  # positive semidefinite
    np.testing.assert_allclose(np.diag(block)[:NQ], 0.25)  # the RY layer on |0>: Var(Y/2) = 1/4


def _pennylane_circuit(qml, J=1.0, h=1.0):
    # one spare wire: qml.metric_tensor's Hadamard tests
    return vqe.pennylane_tfim(NQ, LAYERS, "default.qubit", J=J, h=h, wires=NQ + 1)


def test_metric_tensors_match_pennylane():
    qml = pytest.importorskip("pennylane", reason="the reference metric tensor is PennyLane's")
    from pennylane import numpy as pnp

    theta = _theta()
    circuit = _pennylane_circuit(qml)
    t = pnp.array(theta, requires_grad=True)
    assert abs(float(circuit(t)) - vqe.energy(theta, NQ, LAYERS, 1.0, 1.0)) < 1e-12
    ref_full = np.asarray(qml.metric_tensor(circuit, approx=None)(t))
    ref_block = np.asarray(qml.metric_tensor(circuit, approx="block-diag")(t))
    np.testing.assert_allclose(_metric(vqe.metric_tensor, theta), ref_full, rtol=0, atol=1e-10)
    np.testing.assert_allclose(_metric(vqe.metric_tensor_block_diag, theta), ref_block, rtol=0, atol=1e-10)


@pytest.mark.parametrize("approx, lam, lr", [(None, 0.0, 0.05), ("block-diag", 1e-3, 0.2), ("block-diag", 0.0, 0.1)])
def test_iterates_match_pennylane_qng_optimizer(approx, lam, lr):
    """Five QNGOptimizer steps against minimize_qng (Descent on the natural gradient). The full metric of this
    circuit is singular (lam = 0: the pseudo-inverse path, as PennyLane's pinv); the full-metric reference uses
    qml.adjoint_metric_tensor, equal to qml.metric_tensor(approx=None) (test above) and ten times faster."""
    qml = pytest.importorskip("pennylane", reason="the reference optimiser is PennyLane's QNGOptimizer")
    from pennylane import numpy as pnp

    theta = _theta()
    circuit = _pennylane_circuit(qml)
    opt = qml.QNGOptimizer(stepsize=lr, approx=approx, lam=lam)
    mt_fn = qml.adjoint_metric_tensor(circuit) if approx is None else None
    t = pnp.array(theta, requires_grad=True)
    ref = []
    for _ in range(5):
        t = opt.step(circuit, t, metric_tensor_fn=mt_fn)
        ref.append(np.array(t))
    metric = vqe.metric_tensor if approx is None else vqe.metric_tensor_block_diag
    seen = []
    res = minimize_qng(vqe.energy_grad, metric, theta, lr=lr, lam=lam, args=(NQ, LAYERS, 1.0, 1.0),
                       metric_args=(NQ, LAYERS), maxiter=5, gtol=None, callback=lambda r: seen.append(r.x.copy()))
    assert res.nit == 5 and len(seen) == 5
    np.testing.assert_allclose(np.array(seen), np.array(ref), rtol=0, atol=1e-10)
    assert (res.pinv_steps > 0) == (approx is None and lam == 0.0)


# ---------------------------------------------------------------------------------------------
# minimize_qng
# ---------------------------------------------------------------------------------------------
def test_compiled_and_interpreted_loops_agree_and_any_rule_steps():
    theta = vqe.initial_angles(NQ, LAYERS)
    kw = dict(lam=1e-3, args=(NQ, LAYERS, 1.0, 1.0), metric_args=(NQ, LAYERS), maxiter=60)
    fast = minimize_qng(vqe.energy_grad, vqe.metric_tensor_block_diag, theta, lr=0.2, **kw)
    slow = minimize_qng(vqe.energy_grad.py_func, vqe.metric_tensor_block_diag, theta, lr=0.2, **kw)
    np.testing.assert_array_equal(fast.x, slow.x)
    assert fast.history[-1] < fast.history[0] - 1.0
    # gtol and grad_norm are the natural gradient's
    g, G, ng = np.empty(theta.size), np.empty((theta.size,) * 2), np.empty(theta.size)
    vqe.energy_grad(fast.x, g, NQ, LAYERS, 1.0, 1.0)
    vqe.metric_tensor_block_diag(fast.x, G, NQ, LAYERS)
    natural_gradient(g, G, 1e-3, ng)
    assert abs(fast.grad_norm - np.linalg.norm(ng)) < 1e-12 * max(1.0, fast.grad_norm)
    adam = minimize_qng(vqe.energy_grad, vqe.metric_tensor_block_diag, theta, rule=no.Adam(0.05), **kw)
    assert adam.fun < adam.history[0] - 1.0 and adam.t == 60


def test_same_as_natural_gradient_with_update_():
    """The documented hand-written loop: natural_gradient, then update_ with Descent."""
    theta = vqe.initial_angles(NQ, LAYERS, seed=2)
    res = minimize_qng(vqe.energy_grad, vqe.metric_tensor_block_diag, theta, lr=0.1, lam=1e-2,
                       args=(NQ, LAYERS, 1.0, 1.0), metric_args=(NQ, LAYERS), maxiter=10, gtol=None)
    x = theta.copy()
    state = no.setup(no.Descent(0.1), x)
    g, G, ng, work = np.empty(x.size), np.empty((x.size, x.size)), np.empty(x.size), workspace(x.size)
    for _ in range(10):
        vqe.energy_grad(x, g, NQ, LAYERS, 1.0, 1.0)
        vqe.metric_tensor_block_diag(x, G, NQ, LAYERS)
        natural_gradient(g, G, 1e-2, ng, work)
        no.update_(state, x, ng)
    np.testing.assert_array_equal(x, res.x)


def test_example_run_qng():
    res, exact, _ = vqe.run_qng(NQ, LAYERS, lr=0.05, lam=1e-3, approx=None, maxiter=100)
    assert exact <= res.fun < res.history[0] - 1.0
    with pytest.raises(ValueError, match="approx='diag'"):
        vqe.run_qng(NQ, LAYERS, approx="diag")


@njit(cache=True)
def _bowl(x, g, c):
    s = 0.0
    for i in range(x.shape[0]):
        g[i] = 2.0 * c * x[i]
        s += c * x[i] * x[i]
    return s


@njit(cache=True)
def _scaled_identity(x, G, c):
    G[:, :] = 0.0
    for i in range(x.shape[0]):
        G[i, i] = 2.0 * c


@njit(cache=True)
def _nan_metric(x, G, c):
    G[:, :] = np.nan


@njit(cache=True)
def _returns_metric(x, G, c):
    return np.eye(x.shape[0])


def test_exact_metric_is_a_newton_step():
    # f = c |x|^2 with G its Hessian: one natural-gradient step of lr = 1 lands on the minimum
    res = minimize_qng(_bowl, _scaled_identity, np.array([1.0, -2.0, 0.5]), lr=1.0, args=(3.0,), maxiter=5)
    assert res.converged and res.nit == 1 and np.abs(res.x).max() < 1e-15  # x - x, to rounding of the solve


def test_errors():
    x0 = np.ones(3)
    with pytest.raises(TypeError, match="metric must be callable"):
        minimize_qng(_bowl, None, x0, args=(1.0,))
    with pytest.raises(TypeError, match=r"must write the metric tensor into G_out and return None; it returns array"):
        minimize_qng(_bowl, _returns_metric, x0, args=(1.0,))

    def py_metric(x, G, c):
        return np.eye(4)

    with pytest.raises(TypeError, match=r"\(3, 3\) metric tensor into G_out and return None; it returned an array "
                                        r"of shape \(4, 4\)"):
        minimize_qng(_bowl, py_metric, x0, args=(1.0,))

    def half_metric(x, G, c):
        G[:2, :2] = np.eye(2)

    with pytest.raises(TypeError, match=r"did not write G_out: 5 of 9 entries"):
        minimize_qng(_bowl, half_metric, x0, args=(1.0,))

    def lazy_fun(x, g, c):
        g[0] = 1.0
        return 0.0

    with pytest.raises(TypeError, match=r"did not write the gradient into grad_out: 2 of 3"):
        minimize_qng(lazy_fun, _scaled_identity, x0, args=(1.0,))
    with pytest.raises(TypeError, match="could not be compiled"):
        minimize_qng(_bowl, _scaled_identity, x0, args=(1.0,), metric_args=("text",))
    with pytest.raises(ValueError, match="lam=-0.1"):
        minimize_qng(_bowl, _scaled_identity, x0, lam=-0.1, args=(1.0,))
    with pytest.raises(TypeError, match="lr sets the default Descent"):
        minimize_qng(_bowl, _scaled_identity, x0, lr=0.1, rule=no.Adam(0.1), args=(1.0,))
    with pytest.raises(TypeError, match="complex parameters"):
        minimize_qng(_bowl, _scaled_identity, x0 + 0j, args=(1.0,))
    with pytest.raises(TypeError, match="jac is not supported"):
        minimize_qng(_bowl, _scaled_identity, x0, args=(1.0,), jac=None)
    with pytest.raises(TypeError, match="compiled=True needs"):
        minimize_qng(_bowl, py_metric, x0, args=(1.0,), compiled=True)
    res = minimize_qng(_bowl, _nan_metric, x0, args=(1.0,))  # a non-finite metric stops the loop at x0
    assert res.status == no.loops.NONFINITE and res.nit == 0 and np.all(res.x == x0)


@pytest.mark.slow
def test_qng_loop_is_cached_across_processes(tmp_path):
    """A fresh process runs minimize_qng on the example's njit functions without compiling anything."""
    script = textwrap.dedent('''
        import gc, warnings
        import numpy as np, vqe
        from numba.core.dispatcher import Dispatcher
        from numbaopt.quantum.qng import minimize_qng
        warnings.simplefilter("ignore")
        x0 = vqe.initial_angles(3, 1)
        minimize_qng(vqe.energy_grad, vqe.metric_tensor, x0, lr=0.1, lam=1e-3, args=(3, 1, 1.0, 1.0),
                     metric_args=(3, 1), maxiter=5)
        print(sum(sum(d._cache_misses.values()) for d in gc.get_objects() if isinstance(d, Dispatcher)))
    ''')
    env = dict(os.environ, NUMBAOPT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=f"{ROOT}/examples:{ROOT}")

    def misses():
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             cwd=tmp_path, check=True).stdout.split()
        return int(out[-1])

    misses()  # the first process may compile (a fresh kernel cache) and fills the caches
    assert misses() == 0


def test_multistart_stops_at_the_first_start_on_target_with_that_starts_own_iterates():
    """examples/vqe.py run_qng_multistart: two starts on two threads; the winner reached the target and its
    iterates are bitwise those of the same start run alone (threads change no arithmetic)."""
    seed, res, exact, seconds, results = vqe.run_qng_multistart(4, 2, seeds=(0, 1, 2), threads=2, maxiter=400,
                                                                every=5)
    assert seed in results and res is results[seed] and seconds > 0
    target = exact + 1e-3 * abs(exact)
    assert res.fun <= target and res.status == TARGET_STATUS
    alone = minimize_qng(vqe.energy_grad, vqe.metric_tensor, vqe.initial_angles(4, 2, seed), lr=0.15, lam=1e-2,
                         args=(4, 2, 1.0, 1.0), metric_args=(4, 2), maxiter=400, gtol=None, f_target=target,
                         schedule=no.schedules.exponential(0.15, 0.05 / 0.15, every=2500))
    assert alone.nit == res.nit and np.array_equal(alone.x, res.x)
    for s, r in results.items():  # the others stopped on their own test or on the winner's flag
        assert s == seed or r.fun > target or r.status == TARGET_STATUS
