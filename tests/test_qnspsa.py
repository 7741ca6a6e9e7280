"""QN-SPSA (numbaopt.quantum.qnspsa): the iterates of PennyLane's QNSPSAOptimizer fed the same directions, the
compiled loop bitwise equal to the interpreted one, the Jacobi eigensolver against LAPACK, the stopping rules and
the counters, bad input, and the compiled loop loaded from Numba's cache in a new process."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from numba import njit

from numbaopt.quantum.qnspsa import TARGET, jacobi_eigh, minimize_qnspsa, pennylane_directions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))  # Numba's cache re-imports the module by name
import vqe  # noqa: E402


fidelity = vqe.fidelity


NQ, LAYERS = 3, 1
ARGS = (NQ, LAYERS, 1.0, 1.0)
X0 = vqe.initial_angles(NQ, LAYERS, seed=1, scale=0.5)


def _pennylane_iterates(qml, pnp, lr, steps, seed, blocking, resamplings):
    """PennyLane's QNSPSA on the same TFIM ansatz (wire q = the simulator's qubit q) and its metric."""
    cost = vqe.pennylane_tfim(NQ, LAYERS, "default.qubit")
    assert abs(float(cost(pnp.array(X0))) - vqe.energy(X0, *ARGS)) < 1e-13  # the same circuit
    opt = qml.QNSPSAOptimizer(stepsize=lr, seed=seed, blocking=blocking, resamplings=resamplings)
    p = pnp.array(X0, requires_grad=True)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            p, _ = opt.step_and_cost(cost, p)
            out.append(np.array(p))
    return out, np.array(opt.metric_tensor)


@pytest.mark.parametrize("lr, blocking, resamplings", [(0.05, True, 1), (0.01, False, 2)])
def test_iterates_match_pennylane(lr, blocking, resamplings):
    qml = pytest.importorskip("pennylane", reason="the reference is PennyLane's QNSPSAOptimizer")
    from pennylane import numpy as pnp
    steps, seed = 5, 7
    ref, ref_metric = _pennylane_iterates(qml, pnp, lr, steps, seed, blocking, resamplings)
    ours = []
    res = minimize_qnspsa(vqe.energy, fidelity, X0, lr=lr, blocking=blocking, resamplings=resamplings, args=ARGS,
                          maxiter=steps, directions=pennylane_directions(seed, X0.size, steps, resamplings),
                          callback=lambda r: ours.append(r.x.copy()))
    ours.append(res.x)
    assert len(ours) == steps and res.nit == steps
    for k, (a, b) in enumerate(zip(ref, ours)):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10, err_msg=f"step {k + 1}")
    np.testing.assert_allclose(res.metric, ref_metric, rtol=0, atol=1e-10)
    moved = [np.max(np.abs(ref[k] - (ref[k - 1] if k else X0))) for k in range(steps)]
    assert min(moved) > 1e-3 or blocking  # every step moved (a non-trivial comparison) ...
    if blocking:  # ... or, with blocking, at least one was rejected by PennyLane and by us
        assert min(moved) == 0.0 and res.rejected == sum(m == 0.0 for m in moved) >= 1


def test_pennylane_directions_are_its_draws():
    qml = pytest.importorskip("pennylane", reason="the reference is PennyLane's random generator")
    rng = qml.numpy.random.default_rng(3)
    D = pennylane_directions(3, 4, steps=2, resamplings=2)
    flat = [rng.choice([-1, 1], size=4) for _ in range(2 * 2 * 3)]
    np.testing.assert_array_equal(D.reshape(-1, 4), np.array(flat))


@pytest.mark.parametrize("blocking, resamplings", [(True, 1), (False, 2)])
def test_compiled_equals_interpreted_bitwise(blocking, resamplings):
    kw = dict(lr=0.02, blocking=blocking, resamplings=resamplings, args=ARGS, maxiter=40, seed=11)
    a = minimize_qnspsa(vqe.energy, fidelity, X0, **kw)
    b = minimize_qnspsa(vqe.energy, fidelity, X0, compiled=False, **kw)
    for field in ("x", "history", "metric"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert (a.nfev, a.n_overlap, a.rejected, a.status) == (b.nfev, b.n_overlap, b.rejected, b.status)
    # the default generator is seeded: the same seed repeats, another seed draws other directions
    assert np.array_equal(minimize_qnspsa(vqe.energy, fidelity, X0, **kw).x, a.x)
    assert not np.array_equal(minimize_qnspsa(vqe.energy, fidelity, X0, **dict(kw, seed=12)).x, a.x)


def test_counters_history_and_energy_decreases():
    R, n = 2, 30
    res = minimize_qnspsa(vqe.energy, fidelity, X0, lr=0.02, resamplings=R, args=ARGS, maxiter=n, seed=0)
    assert res.nit == n and res.status == 4 and not res.converged
    assert res.nfev == 1 + n * (2 * R + 1) and res.n_overlap == 4 * R * n
    assert res.history.shape == (n + 1,) and res.history[0] == vqe.energy(X0, *ARGS)
    assert res.fun == res.history[-1] == vqe.energy(res.x, *ARGS)
    # blocking (PennyLane's rule): a step that raises the loss by more than twice the standard deviation of the
    # losses of the last history_length (5) iterates is rejected, x stays
    h = res.history
    for k in range(n):
        assert h[k + 1] <= h[k] + 2 * np.std(h[max(0, k - 4):k + 1]), k
    assert res.rejected == int(np.sum(h[1:] == h[:-1])) >= 1 and h[-1] < h[0] - 0.3
    w = np.linalg.eigvalsh(res.metric)
    assert np.allclose(res.metric, res.metric.T, atol=1e-14) and w.min() >= 1e-3 / (1 + 1e-3) - 1e-14


def test_f_target_and_callback_stop():
    target = vqe.energy(X0, *ARGS) - 0.2
    res = minimize_qnspsa(vqe.energy, fidelity, X0, lr=0.02, args=ARGS, maxiter=500, seed=0, f_target=target)
    assert res.converged and res.status == TARGET and res.fun <= target < res.history[-2]
    seen = []
    res = minimize_qnspsa(vqe.energy, fidelity, X0, lr=0.02, args=ARGS, maxiter=500, seed=0, callback_every=3,
                          callback=lambda r: seen.append(r.nit) or r.nit >= 9)
    assert seen == [3, 6, 9] and res.nit == 9 and res.status == 5 and not res.converged
    assert minimize_qnspsa(vqe.energy, fidelity, X0, args=ARGS, maxiter=0).nfev == 1


def test_python_objective_and_the_two_averages():
    """Product state of RX(x_i): fidelity prod cos^2((a_i - b_i) / 2), Fubini-Study metric I / 4 everywhere."""
    def f(x):
        return float(np.sum(np.sin(x) ** 2))

    def ov(a, b):
        return float(np.prod(np.cos(0.5 * (a - b)) ** 2))

    x0 = np.full(4, 0.7)
    res = {av: minimize_qnspsa(f, ov, x0, lr=0.05, maxiter=2000, seed=1, average=av) for av in ("pennylane", "raw")}
    for r in res.values():
        assert r.fun < 1e-12, r.fun
    # the raw running average of the estimates (Gacon et al.) converges to the metric, regularised ...
    raw = res["raw"].metric
    assert np.abs(np.diag(raw) - (0.25 + 1e-3) / (1 + 1e-3)).max() < 0.03
    assert np.abs(raw - np.diag(np.diag(raw))).max() < 0.04
    # ... PennyLane's average of the regularised G drifts to the fixed point of G -> (G + reg) / (1 + reg), I
    assert np.diag(res["pennylane"].metric).min() > 0.5


def test_jacobi_eigh_matches_lapack():
    rng = np.random.default_rng(0)
    n = 40
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    lam = rng.normal(size=n) * np.logspace(-8, 0, n)
    lam[:5] = 0.25  # a cluster of equal eigenvalues
    A = (Q * lam) @ Q.T
    A = 0.5 * (A + A.T)
    B, W = A.copy(), np.eye(n)
    sweeps = jacobi_eigh(B, W, 100)
    assert 1 <= sweeps <= 100
    w, V = np.linalg.eigh(A)
    np.testing.assert_allclose(np.sort(np.diag(B)), w, rtol=0, atol=1e-14)
    np.testing.assert_allclose(W @ W.T, np.eye(n), rtol=0, atol=1e-14)
    np.testing.assert_allclose((W.T * np.abs(np.diag(B))) @ W, (V * np.abs(w)) @ V.T, rtol=0, atol=1e-14)


@njit
def pair(a, b, nq, layers, J, h):
    return a[0], b[0]


def test_bad_input():
    def run(**kw):
        opts = dict(args=ARGS, maxiter=3)
        opts.update(kw)
        x0 = opts.pop("x0", X0)
        return minimize_qnspsa(opts.pop("fun", vqe.energy), opts.pop("overlap", fidelity), x0, **opts)

    for kw, err, match in [(dict(overlap=3), TypeError, "overlap must be callable"),
                           (dict(lr=-1.0), ValueError, "lr="), (dict(finite_diff_step=0), ValueError, "finite_diff"),
                           (dict(regularization="a"), TypeError, "regularization"),
                           (dict(resamplings=0), ValueError, "resamplings"), (dict(args=[1]), TypeError, "tuple"),
                           (dict(x0=X0 + 0j), TypeError, "real array"), (dict(x0=[np.nan]), ValueError, "NaN"),
                           (dict(seed=-1), TypeError, "seed"), (dict(blocking=1), TypeError, "blocking"),
                           (dict(directions=np.ones((2, 1, 3, X0.size))), ValueError, "steps >= maxiter=3"),
                           (dict(directions=np.zeros((3, 1, 3, X0.size))), ValueError, "only \\+1 and -1"),
                           (dict(fun=vqe.energy.py_func, compiled=True), TypeError, "compiled=True needs"),
                           (dict(overlap=pair), TypeError, "overlap must return a real scalar")]:
        with pytest.raises(err, match=match):
            run(**kw)


@pytest.mark.slow
def test_compiled_loop_is_cached_across_processes(tmp_path):
    (tmp_path / "userqn.py").write_text(textwrap.dedent('''
        import numpy as np
        from numba import njit
        @njit(cache=True)
        def f(x):
            return np.sum(np.sin(x) ** 2)
        @njit(cache=True)
        def ov(a, b):
            return np.prod(np.cos(0.5 * (a - b)) ** 2)
    '''))
    script = textwrap.dedent('''
        import numpy as np, userqn
        from numbaopt.quantum import qnspsa
        qnspsa.minimize_qnspsa(userqn.f, userqn.ov, np.ones(3), maxiter=5, seed=0)
        print(sum(qnspsa._run.stats.cache_hits.values()), sum(qnspsa._run.stats.cache_misses.values()))
    ''')
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{ROOT}")

    def run():
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              cwd=tmp_path, check=True).stdout.split()

    run()  # compiles (or loads) once
    assert run() == ["1", "0"]  # a new process loads the driver from the cache and compiles nothing


def test_blocking_tolerance_is_numpys_std_bitwise():
    from numbaopt.quantum.qnspsa import _std
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 7, 8, 9, 16, 17, 64, 128):  # sequential below 8, eight partial sums up to 128
        a = rng.normal(size=m) * 10.0 ** rng.uniform(-3, 3, size=m)
        assert _std(a, m, np.empty(m)) == np.std(a), m
