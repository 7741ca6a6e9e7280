"""Compiled optimisation loops: minimize, minimize_batch, SPSA, schedules, callbacks, bad input."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

import numbaopt as no
from numbaopt import loops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@njit(cache=True)
def quad(x, g, c):
    """sum (x - c)^2 with its gradient."""
    s = 0.0
    for i in range(x.shape[0]):
        d = x[i] - c[i]
        g[i] = 2.0 * d
        s += d * d
    return s


@njit(cache=True)
def quad_f(x, c):
    s = 0.0
    for i in range(x.shape[0]):
        d = x[i] - c[i]
        s += d * d
    return s


@njit(cache=True)
def quad_j(x, g, c):
    for i in range(x.shape[0]):
        g[i] = 2.0 * (x[i] - c[i])


C = np.linspace(-1.0, 2.0, 6)


def numpy_adam(x0, c, lrs, b1=0.9, b2=0.999, eps=1e-8):
    """Independent float64 reference: Adam's published formula on sum (x - c)^2; lrs[k] at step k+1."""
    x = np.array(x0, dtype=np.float64)
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    losses = []
    for k, lr in enumerate(lrs):
        t = k + 1
        g = 2.0 * (x - c)
        losses.append(np.sum((x - c) ** 2))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        x = x - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return x, np.array(losses)


# ---------------------------------------------------------------------------------------------
# minimize
# ---------------------------------------------------------------------------------------------
def test_minimize_matches_numpy_reference_and_python_loop():
    x0 = np.zeros(6)
    res = no.minimize(quad, x0, no.Adam(0.05), args=(C,), maxiter=40, gtol=None)
    ref_x, ref_loss = numpy_adam(x0, C, [0.05] * 40)
    np.testing.assert_allclose(res.x, ref_x, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(res.history[:40], ref_loss, rtol=1e-12)
    assert res.nit == 40 and res.t == 40 and res.nfev == 41 and res.history.shape == (41,)
    assert res.status == loops.MAXITER and not res.converged
    assert res.fun == quad_f(res.x, C) and res.history[-1] == res.fun
    # the interpreted loop (plain Python fun) is the same loop: bitwise equal
    py = no.minimize(quad.py_func, x0, no.Adam(0.05), args=(C,), maxiter=40, gtol=None)
    assert np.array_equal(py.x, res.x) and np.array_equal(py.history, res.history)
    assert np.array_equal(x0, np.zeros(6))  # x0 is not written


def test_minimize_same_as_update_loop_and_converges_on_gtol():
    x0 = np.zeros(6)
    res = no.minimize(quad, x0, no.Adam(0.1), args=(C,), maxiter=5000, gtol=1e-7)
    assert res.converged and res.status == loops.GTOL and res.grad_norm <= 1e-7
    np.testing.assert_allclose(res.x, C, atol=1e-7)
    x, g = x0.copy(), np.empty(6)
    state = no.setup(no.Adam(0.1), x)
    for _ in range(res.nit):
        quad(x, g, C)
        state, x = no.update_(state, x, g)
    assert np.array_equal(x, res.x)


def test_without_history():
    a = no.minimize(quad, np.zeros(6), no.Adam(0.05), args=(C,), maxiter=40, gtol=None)
    b = no.minimize(quad, np.zeros(6), no.Adam(0.05), args=(C,), maxiter=40, gtol=None, history=False)
    assert b.history is None and np.array_equal(a.x, b.x) and a.fun == b.fun
    rb = no.minimize_batch(quad, np.zeros((2, 6)), no.Adam(0.05), args=(C,), maxiter=40, history=False)
    assert rb.history is None and rb.row(1).history is None and np.array_equal(rb.x[0], a.x)


def test_jac_pair_gives_the_same_iterates():
    a = no.minimize(quad, np.ones(6), no.Momentum(0.05), args=(C,), maxiter=60, gtol=None)
    b = no.minimize(quad_f, np.ones(6), no.Momentum(0.05), jac=quad_j, args=(C,), maxiter=60, gtol=None)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.history, b.history)


def test_float32_stays_float32_and_chain():
    rule = no.chain(no.WeightDecay(1e-3), no.Adam(0.05))
    x0 = np.zeros(6, dtype=np.float32)
    res = no.minimize(quad, x0, rule, args=(C.astype(np.float32),), maxiter=30, gtol=None)
    assert res.x.dtype == np.float32 and all(s.dtype == np.float32 for s in res.state)
    x, g = x0.copy(), np.empty(6, np.float32)
    state = no.setup(rule, x)
    for _ in range(30):
        quad(x, g, C.astype(np.float32))
        state, x = no.update_(state, x, g)
    assert np.array_equal(x, res.x)


def test_complex_parameters():
    @njit
    def cquad(x, g):
        s = 0.0
        for i in range(x.shape[0]):
            d = x[i] - (1.0 + 2.0j)
            g[i] = 2.0 * d
            s += d.real * d.real + d.imag * d.imag
        return s

    res = no.minimize(cquad, np.zeros(3, np.complex128), no.Adam(0.1), maxiter=3000, gtol=1e-6)
    assert res.converged and res.x.dtype == np.complex128
    np.testing.assert_allclose(res.x, 1 + 2j, atol=1e-6)


def test_schedule_inside_the_compiled_loop():
    lrs = [0.1 / (1 + c / 10) for c in range(30)]  # a function gets the count of steps taken: 0 first
    sched = lambda c: 0.1 / (1 + c / 10)  # noqa: E731
    res = no.minimize(quad, np.zeros(6), no.Adam(0.1), args=(C,), maxiter=30, gtol=None, schedule=sched)
    ref_x, _ = numpy_adam(np.zeros(6), C, lrs)
    np.testing.assert_allclose(res.x, ref_x, rtol=1e-12, atol=1e-14)
    d = no.minimize(quad, np.zeros(6), no.Adam(0.1), args=(C,), maxiter=30, gtol=None, schedule={"lr": sched})
    assert np.array_equal(d.x, res.x)
    py = no.minimize(quad.py_func, np.zeros(6), no.Adam(0.1), args=(C,), maxiter=30, gtol=None, schedule=sched)
    assert np.array_equal(py.x, res.x)


def test_schedule_values_are_validated_before_running():
    calls = []

    def fun(x, g, c):
        calls.append(1)
        return quad(x, g, c)

    with pytest.raises(ValueError, match="step 7: Adam: hyperparameter lr"):
        no.minimize(fun, np.zeros(6), no.Adam(0.1), args=(C,), maxiter=20, schedule=lambda t: 0.1 - 0.02 * t)
    assert not calls
    with pytest.raises(ValueError, match="unknown hyperparameter 'rate'"):
        no.minimize(quad, np.zeros(6), no.Adam(), args=(C,), schedule={"rate": lambda t: 0.1})


def test_ftol_and_nonfinite_stops():
    res = no.minimize(quad, np.zeros(6), no.Descent(0.5), args=(C,), maxiter=100, gtol=None, ftol=1e-10)
    # Descent(0.5) on (x-c)^2 jumps to c in one step: the loss change then is 0
    assert res.status == loops.FTOL and res.converged and res.nit == 2

    @njit
    def blows_up(x, g):
        g[:] = -1.0
        return 1.0 / (3.0 - x[0]) if x[0] < 3.0 else np.nan

    r = no.minimize(blows_up, np.zeros(1), no.Descent(1.0), maxiter=10)
    assert r.status == loops.NONFINITE and not r.converged and r.nit == 3 and np.isnan(r.fun)


def test_callback_every_k_and_stop():
    seen = []

    def cb(res):
        seen.append((res.nit, res.fun))
        return res.nit >= 30

    res = no.minimize(quad, np.zeros(6), no.Adam(0.01), args=(C,), maxiter=1000, gtol=None, callback=cb,
                      callback_every=10)
    assert [s[0] for s in seen] == [10, 20, 30]
    assert res.status == loops.CALLBACK and res.nit == 30 and res.message == "stopped by the callback"
    assert res.fun == quad_f(res.x, C) and res.history.shape == (31,) and res.history[-1] == res.fun
    assert seen[-1][1] == res.history[29]  # a snapshot's fun is the last evaluated loss

    def stop(res):
        raise StopIteration

    assert no.minimize(quad, np.zeros(6), no.Adam(0.01), args=(C,), callback=stop).nit == 1


def test_progress_bar_changes_nothing():
    pytest.importorskip("tqdm")
    a = no.minimize(quad, np.zeros(6), no.Adam(0.01), args=(C,), maxiter=300, gtol=None)
    b = no.minimize(quad, np.zeros(6), no.Adam(0.01), args=(C,), maxiter=300, gtol=None, progress=True)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.history, b.history)


# ---------------------------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------------------------
def test_batch_rows_are_independent_problems():
    X0 = np.random.default_rng(1).normal(size=(4, 6))
    lrs = [0.003, 0.03, 0.1, 0.3]
    rb = no.minimize_batch(quad, X0, [no.Adam(lr) for lr in lrs], args=(C,), maxiter=400, gtol=1e-6)
    assert rb.x.shape == (4, 6) and rb.history.shape[0] == 4
    assert len(set(rb.nit.tolist())) > 1  # each row stops on its own
    assert rb.status[0] == loops.MAXITER and all(rb.status[1:] == loops.GTOL)
    for r, lr in enumerate(lrs):
        one = no.minimize(quad, X0[r], no.Adam(lr), args=(C,), maxiter=400, gtol=1e-6)
        assert np.array_equal(one.x, rb.x[r]) and one.nit == rb.nit[r]
        row = rb.row(r)
        assert np.array_equal(row.history, one.history) and row.message == one.message
        assert np.all(np.isnan(rb.history[r, one.nit + 1:]))
    py = no.minimize_batch(quad.py_func, X0[:2], no.Adam(0.03), args=(C,), maxiter=50, gtol=None)
    cp = no.minimize_batch(quad, X0[:2], no.Adam(0.03), args=(C,), maxiter=50, gtol=None)
    assert np.array_equal(py.x, cp.x)


def test_batch_per_row_initial_state_uses_each_rule():
    rb = no.minimize_batch(quad, np.zeros((2, 6)), [no.AdaGrad(0.1, eps=1e-8), no.AdaGrad(0.1, eps=0.5)],
                           args=(C,), maxiter=5, gtol=None)
    for r, eps in enumerate((1e-8, 0.5)):
        one = no.minimize(quad, np.zeros(6), no.AdaGrad(0.1, eps=eps), args=(C,), maxiter=5, gtol=None)
        assert np.array_equal(one.x, rb.x[r])


# ---------------------------------------------------------------------------------------------
# SPSA
# ---------------------------------------------------------------------------------------------
def test_spsa_estimate_gains_and_evaluations():
    calls = []

    def f(x, c):
        calls.append(x.copy())
        return float(np.sum((x - c) ** 2))

    sp = no.SPSA(c=0.2, gamma=0.101, a=0.5, A=3.0, alpha=0.602, seed=7)
    x0 = np.zeros(6)
    res = no.minimize(f, x0, no.Descent(1.0), jac=sp, args=(C,), maxiter=3, gtol=None)
    assert len(calls) == 2 * 3 + 1 == res.nfev
    # replay each step from the recorded evaluations: the perturbation is +-c_k, the step a_k-scaled
    x = x0.copy()
    for k in range(3):
        ak, ck = 0.5 / (3.0 + k + 1) ** 0.602, 0.2 / (k + 1) ** 0.101
        delta = (calls[2 * k] - x) / ck
        np.testing.assert_allclose(np.abs(delta), 1.0)
        np.testing.assert_allclose(calls[2 * k + 1], x - ck * delta)
        fp, fm = f(calls[2 * k], C), f(calls[2 * k + 1], C)
        x = x - ak * (fp - fm) / (2 * ck) * delta
    np.testing.assert_allclose(res.x, x, rtol=1e-12)
    assert sp.gains(2) == (0.5 / 6.0 ** 0.602, 0.2 / 3.0 ** 0.101)


def test_spsa_reproducible_compiled_equals_python_and_converges():
    sp = no.SPSA(c=0.1, a=0.2, A=10, seed=3)
    a = no.minimize(quad_f, np.zeros(6), no.Descent(1.0), jac=sp, args=(C,), maxiter=1500, gtol=None)
    b = no.minimize(quad_f, np.zeros(6), no.Descent(1.0), jac=sp, args=(C,), maxiter=1500, gtol=None)
    assert np.array_equal(a.x, b.x)
    short = no.minimize(quad_f, np.zeros(6), no.Descent(1.0), jac=sp, args=(C,), maxiter=100, gtol=None)
    p = no.minimize(quad_f.py_func, np.zeros(6), no.Descent(1.0), jac=sp, args=(C,), maxiter=100, gtol=None)
    assert np.array_equal(short.x, p.x) and np.array_equal(short.history, p.history)
    assert a.fun < 1e-6 * quad_f(np.zeros(6), C)
    c = no.minimize(quad_f, np.zeros(6), no.Descent(1.0), jac=no.SPSA(c=0.1, a=0.2, A=10, seed=4), args=(C,),
                    maxiter=20, gtol=None)
    assert not np.array_equal(c.x, no.minimize(quad_f, np.zeros(6), no.Descent(1.0), jac=sp, args=(C,),
                                                maxiter=20, gtol=None).x)
    # with a scale-free rule (gain 1)
    d = no.minimize(quad_f, np.zeros(6), no.Adam(0.05), jac=no.SPSA(c=0.05, a=1.0, alpha=0.0, seed=1),
                    args=(C,), maxiter=1500, gtol=None)
    assert d.fun < 1e-2 * quad_f(np.zeros(6), C)


# ---------------------------------------------------------------------------------------------
# bad input: TypeError/ValueError naming what was expected, before anything runs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, exc, match", [
    (dict(x0=np.array([1.0, np.nan])), ValueError, "x0: contains NaN"),
    (dict(x0=np.zeros(0)), ValueError, "x0: no parameters"),
    (dict(x0=np.array(["a"])), TypeError, "x0: dtype"),
    (dict(x0=np.zeros(2, np.float16)), TypeError, "float16"),
    (dict(maxiter=-1), ValueError, "maxiter=-1"),
    (dict(maxiter=2.5), TypeError, "maxiter must be an integer"),
    (dict(gtol=-1.0), ValueError, "gtol"),
    (dict(ftol="x"), TypeError, "ftol"),
    (dict(callback_every=0), ValueError, "callback_every"),
    (dict(callback=3), TypeError, "callback must be callable"),
    (dict(rule=no.Adam), TypeError, "rule instance"),
    (dict(rule=[no.Adam()]), TypeError, "minimize_batch"),
    (dict(jac=3), TypeError, "jac must be"),
    (dict(args=[C]), TypeError, "args must be a tuple"),
    (dict(fun=3), TypeError, "fun must be callable"),
])
def test_bad_input(kw, exc, match):
    opts = dict(fun=quad, x0=np.zeros(6), rule=no.Adam(), args=(C,))
    opts.update(kw)
    with pytest.raises(exc, match=match):
        no.minimize(opts.pop("fun"), opts.pop("x0"), opts.pop("rule"), **opts)


def test_bad_input_batch_spsa_and_signatures():
    with pytest.raises(ValueError, match=r"X0: shape \(6,\); expected \(B, n\)"):
        no.minimize_batch(quad, np.zeros(6), no.Adam(), args=(C,))
    with pytest.raises(ValueError, match="2 rules for 3 rows"):
        no.minimize_batch(quad, np.zeros((3, 6)), [no.Adam(), no.Adam()], args=(C,))
    with pytest.raises(ValueError, match=r"rule\[1\].*does not share"):
        no.minimize_batch(quad, np.zeros((2, 6)), [no.Adam(), no.Momentum()], args=(C,))
    with pytest.raises(ValueError, match="SPSA: c=0.0"):
        no.SPSA(c=0)
    with pytest.raises(TypeError, match="SPSA: seed"):
        no.SPSA(seed=-1)
    with pytest.raises(TypeError, match="SPSA: complex"):
        no.minimize(quad_f, np.zeros(6, np.complex128), no.Adam(), jac=no.SPSA(), args=(C,))
    with pytest.raises(TypeError, match=r"fun\(x, grad_out, \*args\) could not be compiled"):
        no.minimize(quad, np.zeros(6), no.Adam())  # args missing

    @njit
    def not_scalar(x, g):
        return x

    with pytest.raises(TypeError, match="real scalar loss"):
        no.minimize(not_scalar, np.zeros(3), no.Adam())
    with pytest.raises(TypeError, match="compiled=True needs"):
        no.minimize(quad.py_func, np.zeros(6), no.Adam(), args=(C,), compiled=True)


@pytest.mark.slow
def test_driver_is_cached_across_processes(tmp_path):
    """The compiled loop loads from Numba's cache in a new process and leaves no new cache files."""
    (tmp_path / "userfun.py").write_text(textwrap.dedent('''
        from numba import njit
        @njit(cache=True)
        def f(x, g):
            s = 0.0
            for i in range(x.shape[0]):
                g[i] = 2.0 * x[i]
                s += x[i] * x[i]
            return s
    '''))
    script = textwrap.dedent('''
        import numpy as np, numbaopt as no, userfun
        from numbaopt.loops.drivers import driver_module
        r = no.minimize(userfun.f, np.ones(4), no.Adam(0.1), maxiter=10)
        drv = driver_module(no.Adam(0.1), np.float64).run_fg
        print(sum(drv.stats.cache_hits.values()), sum(drv.stats.cache_misses.values()))
    ''')
    env = dict(os.environ, NUMBAOPT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=f"{tmp_path}:{ROOT}")

    def run():
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             cwd=tmp_path, check=True).stdout.split()
        files = sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())
        return out, files

    first, files1 = run()
    second, files2 = run()
    assert first == ["0", "1"] and second == ["1", "0"]
    assert files1 == files2


def test_exception_in_compiled_objective_propagates():
    @njit
    def raises(x, g):
        g[:] = 1.0
        if x[0] < -0.5:
            raise ValueError("objective left its domain")
        return x[0]

    with pytest.raises(ValueError, match="left its domain"):
        no.minimize(raises, np.zeros(2), no.Descent(0.3), maxiter=10)


def test_schedule_set_in_the_rule_matches_update_():
    from numbaopt import schedules
    if not hasattr(schedules, "linear"):
        pytest.skip("schedules catalog not available")
    rule = no.Adam(lr=schedules.linear(0.1, 0.01, 20))
    res = no.minimize(quad, np.zeros(6), rule, args=(C,), maxiter=30, gtol=None)
    x, g = np.zeros(6), np.empty(6)
    state = no.setup(rule, x)
    for _ in range(30):
        quad(x, g, C)
        state, x = no.update_(state, x, g)
    assert np.array_equal(x, res.x)
