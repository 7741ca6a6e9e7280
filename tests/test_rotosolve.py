"""Rotosolve (numbaopt.quantum.rotosolve): iterates against PennyLane's RotosolveOptimizer (one and two
frequencies per angle), the univariate minimiser against a dense grid, compiled against interpreted bit for bit,
the stopping tests, bad inputs, and a fresh process that compiles nothing."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

import numbaopt as no
from numbaopt.quantum.rotosolve import min_analytic, min_trig, rotosolve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))  # Numba's cache re-imports the module by name
import vqe  # noqa: E402

J, H_FIELD = 1.0, 0.7


@njit(cache=True, error_model="numpy")
def tied_energy(phi, idx, nq, layers, J, h):
    """The example's energy with angle k of the ansatz set to ``phi[idx[k]]``: a parameter feeding two gates
    enters with frequencies 1 and 2."""
    return vqe.energy(phi[idx], nq, layers, J, h)


@njit(cache=True, error_model="numpy")
def nan_beyond(x, limit):
    """Finite while every |x_i| <= limit, NaN outside: a cost that fails in the middle of a sweep."""
    s = 0.0
    for i in range(x.shape[0]):
        if abs(x[i]) > limit:
            return np.nan
        s += np.cos(x[i]) + 0.5 * np.sin(x[i])
    return s


def pennylane_circuit(nq, layers, idx=None):
    """examples/vqe.py's ansatz and TFIM Hamiltonian as a QNode on default.qubit (angles ``phi[idx]``)."""
    qml = pytest.importorskip("pennylane", reason="the reference optimiser is PennyLane's RotosolveOptimizer")
    return qml, vqe.pennylane_tfim(nq, layers, "default.qubit", J=J, h=H_FIELD, index=idx)


def pennylane_sweeps(qml, circuit, x0, nums, sweeps, **opt_kwargs):
    """PennyLane's iterates after each of ``sweeps`` steps, and its cost before each step."""
    from pennylane import numpy as pnp
    opt = qml.RotosolveOptimizer(**opt_kwargs)
    p = pnp.array(x0, requires_grad=True)
    nf = {"phi": {(i,): int(r) for i, r in enumerate(nums)}}
    xs, costs = [], []
    for _ in range(sweeps):
        p, c = opt.step_and_cost(circuit, p, nums_frequency=nf)
        xs.append(np.array(p))
        costs.append(float(c))
    return xs, costs


def test_one_frequency_matches_pennylane_qnode_and_njit_energy():
    nq, layers = 3, 1
    qml, circuit = pennylane_circuit(nq, layers)
    x0 = vqe.initial_angles(nq, layers, seed=3, scale=1.0)
    xs, costs = pennylane_sweeps(qml, circuit, x0, np.ones(x0.size), 3)
    args = (nq, layers, J, H_FIELD)
    for k in range(3):
        res = rotosolve(vqe.energy, x0, args=args, maxiter=k + 1)
        np.testing.assert_allclose(res.x, xs[k], rtol=0, atol=1e-10)
        np.testing.assert_allclose(res.history[:k + 1], costs[:k + 1], rtol=0, atol=1e-10)
        assert res.nit == k + 1 and res.nfev == 1 + (k + 1) * (2 * x0.size + 1)
    assert res.history[-1] < res.history[0] - 0.5  # it optimised
    # the QNode itself, on the interpreted loop: PennyLane's cost, numbaopt's sweeps
    res_q = rotosolve(circuit, x0, maxiter=3)
    np.testing.assert_allclose(res_q.x, xs[2], rtol=0, atol=1e-10)


def _precise_substep(fn, bounds, **_):
    """A univariate minimiser for PennyLane's ``substep_optimizer`` precise to rounding (PennyLane's default
    brute force stops at Nelder-Mead's ~1e-8): a grid, then a root of the derivative of PennyLane's own
    reconstruction, taken by the complex step ``Im f(x + i eps) / eps``, by Brent's method."""
    from scipy.optimize import brentq
    lo, hi = bounds[0]
    grid = np.linspace(lo, hi, 241)
    i = int(np.argmin([float(fn(x)) for x in grid]))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]

    def deriv(x):
        return float(np.imag(fn(x + 1e-30j))) / 1e-30

    x = brentq(deriv, a, b, xtol=1e-15, rtol=8.9e-16) if deriv(a) < 0 < deriv(b) else grid[i]
    return x, float(fn(x))


def test_two_frequencies_match_pennylane():
    nq, layers = 2, 1
    idx = np.array([0, 0, 1, 2, 3, 3, 4, 5])  # parameters 0 and 3 feed two gates: two frequencies
    nums = np.array([2, 1, 1, 2, 1, 1])
    qml, circuit = pennylane_circuit(nq, layers, idx)
    x0 = np.random.default_rng(4).normal(size=nums.size)
    args = (idx, nq, layers, J, H_FIELD)
    assert abs(float(circuit(x0)) - tied_energy(x0, *args)) < 1e-12
    xs, _ = pennylane_sweeps(qml, circuit, x0, nums, 3, substep_optimizer=_precise_substep)
    for k in range(3):
        res = rotosolve(tied_energy, x0, args=args, num_freqs=nums, maxiter=k + 1)
        np.testing.assert_allclose(res.x, xs[k], rtol=0, atol=1e-10)
    assert res.nfev == 1 + 3 * (2 * int(nums.sum()) + 1)
    assert np.all(np.abs(res.x[nums == 2]) <= np.pi)  # R > 1: absolute angles in [-pi, pi], as PennyLane's
    # PennyLane's default substep optimiser (brute force + Nelder-Mead) agrees to its own precision
    xb, _ = pennylane_sweeps(qml, circuit, x0, nums, 1)
    res = rotosolve(tied_energy, x0, args=args, num_freqs=nums, maxiter=1)
    np.testing.assert_allclose(res.x, xb[0], rtol=0, atol=1e-6)


def test_more_frequencies_than_present_reach_the_same_points():
    """num_freqs=2 on one-frequency angles: the reconstruction's extra coefficients vanish and the numeric
    minimiser lands on the closed form's minimiser (modulo 2 pi: R > 1 returns absolute angles)."""
    nq, layers = 3, 1
    x0 = vqe.initial_angles(nq, layers, seed=2, scale=1.0)
    args = (nq, layers, J, H_FIELD)
    r1 = rotosolve(vqe.energy, x0, args=args, maxiter=2)
    r2 = rotosolve(vqe.energy, x0, args=args, maxiter=2, num_freqs=2)
    wrapped = np.angle(np.exp(1j * (r2.x - r1.x)))
    np.testing.assert_allclose(wrapped, 0.0, atol=1e-9)
    np.testing.assert_allclose(r2.history, r1.history, rtol=0, atol=1e-11)
    assert r2.nfev == 1 + 2 * (4 * x0.size + 1)


def test_min_trig_finds_the_global_minimum_of_random_polynomials():
    rng = np.random.default_rng(7)
    s_dense = np.linspace(0, 2 * np.pi, 200001)
    for r in (1, 2, 3, 5):
        k = np.arange(1, r + 1)[:, None]
        for _ in range(10):
            C = rng.normal(size=2 * r + 1)
            g = C[0] + C[1:r + 1] @ np.cos(k * s_dense) + C[r + 1:] @ np.sin(k * s_dense)
            s, gs = min_trig(C, r, 64 * r)
            assert gs <= g.min() + 1e-14 * (1 + abs(g.min()))
            kk = np.arange(1, r + 1)
            slope = kk @ (C[r + 1:] * np.cos(kk * s) - C[1:r + 1] * np.sin(kk * s))
            assert abs(slope) < 1e-12 * np.abs(C).sum() * r
    assert min_trig(np.array([2.5, 0.0, 0.0, 0.0, 0.0]), 2, 128) == (0.0, 2.5)  # constant: stay put


def test_min_analytic_closed_form():
    a, b, c = 0.3, -1.2, 0.7  # f(s) = a + b cos s + c sin s: minimum a - |(b, c)| at s = atan2(-c, -b)
    f = lambda s: a + b * np.cos(s) + c * np.sin(s)
    step, low = min_analytic(f(0.0), f(np.pi / 2), f(-np.pi / 2))
    assert abs(low - (a - np.hypot(b, c))) < 1e-15 and abs(f(step) - low) < 1e-15
    assert -np.pi < step <= np.pi and abs(step - np.arctan2(-c, -b)) < 1e-15


def test_compiled_and_interpreted_loops_are_bitwise_identical():
    idx = np.array([0, 0, 1, 2, 3, 3, 4, 5])
    nums = np.array([2, 1, 1, 2, 1, 1])
    x0 = np.random.default_rng(5).normal(size=nums.size)
    args = (idx, 2, 1, J, H_FIELD)
    a = rotosolve(tied_energy, x0, args=args, num_freqs=nums, maxiter=6)
    b = rotosolve(tied_energy, x0, args=args, num_freqs=nums, maxiter=6, compiled=False)
    c = rotosolve(tied_energy.py_func, x0, args=args, num_freqs=nums, maxiter=6)  # NumPy arithmetic in fun
    assert np.array_equal(a.x, b.x) and np.array_equal(a.history, b.history) and a.nfev == b.nfev
    np.testing.assert_allclose(c.x, a.x, rtol=0, atol=1e-12)
    seen = []  # chunks between callbacks change nothing either
    d = rotosolve(tied_energy, x0, args=args, num_freqs=nums, maxiter=6, callback=lambda r: seen.append(r.nit),
                  callback_every=2)
    assert np.array_equal(d.x, a.x) and np.array_equal(d.history, a.history) and seen == [2, 4]


def test_stopping_rules():
    nq, layers = 3, 1
    x0 = vqe.initial_angles(nq, layers, seed=1, scale=1.0)
    args = (nq, layers, J, H_FIELD)
    full = rotosolve(vqe.energy, x0, args=args, maxiter=15)
    assert full.status == no.loops.MAXITER and not full.converged and full.nit == 15
    assert full.history.shape == (16,) and np.all(np.diff(full.history) <= 1e-12)  # never worse after a sweep
    assert abs(full.fun - vqe.energy(full.x, *args)) == 0.0  # fun: a fresh evaluation at x
    target = full.history[4]
    res = rotosolve(vqe.energy, x0, args=args, maxiter=15, f_target=target)
    assert res.status == no.loops.TARGET and res.converged and res.nit == 4
    np.testing.assert_array_equal(res.history, full.history[:5])
    h = full.history
    rel = np.abs(np.diff(h)) / np.maximum(np.maximum(np.abs(h[1:]), np.abs(h[:-1])), 1.0)
    ftol = float(rel[6]) * 1.0000001
    k = int(np.argmax(rel <= ftol)) + 1
    res = rotosolve(vqe.energy, x0, args=args, maxiter=15, ftol=ftol)
    assert res.status == no.loops.FTOL and res.converged and res.nit == k
    res = rotosolve(vqe.energy, x0, args=args, maxiter=15, callback=lambda r: r.nit >= 3)
    assert res.status == no.loops.CALLBACK and res.nit == 3 and np.array_equal(res.x, rotosolve(
        vqe.energy, x0, args=args, maxiter=3).x)

    def stop(r):
        raise StopIteration

    assert rotosolve(vqe.energy, x0, args=args, callback=stop).nit == 1
    res = rotosolve(vqe.energy, x0, args=args, maxiter=0)
    assert res.nit == 0 and res.nfev == 1 and np.array_equal(res.x, x0) and res.status == no.loops.MAXITER
    # a NaN in the middle of a sweep: the angle that met it stays, the loop stops
    x1 = np.array([0.1, 0.2, 0.3])
    for compiled in (True, False):
        res = rotosolve(nan_beyond, x1, args=(1.65,), compiled=compiled)
        assert res.status == no.loops.NONFINITE and res.nit == 0 and np.array_equal(res.x, x1)
        assert res.message == "non-finite loss"


def test_bad_inputs():
    x0 = np.zeros(4)
    args = (1, 1, J, H_FIELD)
    with pytest.raises(TypeError, match="fun must be callable"):
        rotosolve("energy", x0)
    with pytest.raises(ValueError, match="num_freqs=0"):
        rotosolve(vqe.energy, x0, args=args, num_freqs=0)
    with pytest.raises(ValueError, match=r"num_freqs\[2\] = 0"):
        rotosolve(vqe.energy, x0, args=args, num_freqs=[1, 1, 0, 1])
    with pytest.raises(ValueError, match=r"shape \(3,\) for 4 angles"):
        rotosolve(vqe.energy, x0, args=args, num_freqs=[1, 1, 1])
    with pytest.raises(TypeError, match="dtype float64; expected integers"):
        rotosolve(vqe.energy, x0, args=args, num_freqs=np.ones(4))
    with pytest.raises(TypeError, match="num_freqs must be a positive integer"):
        rotosolve(vqe.energy, x0, args=args, num_freqs=True)
    with pytest.raises(TypeError, match="expected real angles"):
        rotosolve(vqe.energy, x0 + 0j, args=args)
    with pytest.raises(ValueError, match="NaN or inf"):
        rotosolve(vqe.energy, np.array([0.0, np.nan, 0.0, 0.0]), args=args)
    with pytest.raises(TypeError, match="args must be a tuple"):
        rotosolve(vqe.energy, x0, args=[1, 1, J, H_FIELD])
    with pytest.raises(TypeError, match="callback must be callable"):
        rotosolve(vqe.energy, x0, args=args, callback=3)
    with pytest.raises(ValueError, match="maxiter=-1"):
        rotosolve(vqe.energy, x0, args=args, maxiter=-1)
    with pytest.raises(ValueError, match="ftol"):
        rotosolve(vqe.energy, x0, args=args, ftol=-1.0)
    with pytest.raises(TypeError, match="compiled=True needs fun"):
        rotosolve(vqe.energy.py_func, x0, args=args, compiled=True)
    with pytest.raises(TypeError, match="could not be compiled"):
        rotosolve(vqe.energy, x0, args=("one", 1, J, H_FIELD))
    with pytest.raises(TypeError, match="real scalar loss"):
        rotosolve(njit(lambda x: x), x0)
    with pytest.raises(TypeError, match="one real number"):
        rotosolve(lambda x: x, x0)
    # a (2, 2) x0 takes num_freqs of its own shape; the loop sees it flat
    res = rotosolve(vqe.energy, x0.reshape(2, 2), args=args, num_freqs=np.ones((2, 2), dtype=int), maxiter=1)
    assert res.x.shape == (4,)


@pytest.mark.slow
def test_rotosolve_is_cached_across_processes(tmp_path):
    """A fresh process runs both minimisers, compiled and interpreted, without compiling anything of numbaopt's
    or the example's."""
    script = textwrap.dedent('''
        import gc, os
        import numpy as np, vqe
        from numba.core.dispatcher import Dispatcher
        from numbaopt.quantum.rotosolve import rotosolve
        x0 = vqe.initial_angles(2, 1)
        rotosolve(vqe.energy, x0, args=(2, 1, 1.0, 1.0), maxiter=2, callback=lambda r: None)
        rotosolve(vqe.energy, x0, args=(2, 1, 1.0, 1.0), maxiter=2, num_freqs=2)
        rotosolve(vqe.energy, x0, args=(2, 1, 1.0, 1.0), maxiter=2, num_freqs=2, compiled=False)
        ours = (os.path.realpath(os.path.dirname(vqe.__file__)), os.path.realpath(os.environ["PKG"]))
        print(sum(sum(d._cache_misses.values()) for d in gc.get_objects() if isinstance(d, Dispatcher)
                  and os.path.realpath(d.py_func.__code__.co_filename).startswith(ours)))
    ''')
    env = dict(os.environ, NUMBAOPT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=f"{ROOT}/examples:{ROOT}",
               PKG=os.path.join(ROOT, "numbaopt"))

    def misses():
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             cwd=tmp_path, check=True).stdout.split()
        return int(out[-1])

    misses()  # the first process may compile and fills the caches
    assert misses() == 0
