"""The compiled loops do not claim what they did not see: SPSA's default gtol, a gradient returned instead of
written, non-number losses, the progress bar, and plots that leave the user's matplotlib alone."""
import numpy as np
import pytest
from numba import njit

import numbaopt as no
from numbaopt import loops


@njit(cache=True)
def sumsq(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s


@njit(cache=True)
def sumsq_fg(x, g):
    s = 0.0
    for i in range(x.shape[0]):
        g[i] = 2.0 * x[i]
        s += x[i] * x[i]
    return s


# ---------------------------------------------------------------------------------------------
# SPSA: a zero estimate is not a zero gradient
# ---------------------------------------------------------------------------------------------
def test_spsa_default_gtol_never_stops_on_a_zero_estimate():
    # at x0 = (1, 1) of sum(x^2) the perturbations (+1, -1) and (-1, +1) give f(x + c d) == f(x - c d):
    # the estimate is exactly zero for half of the draws, while the gradient is (2, 2)
    x0 = np.ones(2)
    explicit = [no.minimize(sumsq, x0, no.Descent(1.0), jac=no.SPSA(a=0.2, seed=s), maxiter=100, gtol=1e-6)
                for s in range(20)]
    zero_at_x0 = [s for s, r in enumerate(explicit) if r.nit == 0]
    assert len(zero_at_x0) >= 3  # the situation is real: an explicit gtol does stop there (documented)
    assert all(explicit[s].status == loops.GTOL and explicit[s].fun == 2.0 for s in zero_at_x0)
    for s in range(20):
        r = no.minimize(sumsq, x0, no.Descent(1.0), jac=no.SPSA(a=0.2, seed=s), maxiter=100)
        assert r.status == loops.MAXITER and not r.converged and r.nit == 100, (s, r.message)
        assert r.fun < 1e-3, (s, r.fun)  # and it does reach the minimum
    rb = no.minimize_batch(sumsq, np.ones((20, 2)), no.Descent(1.0), jac=no.SPSA(a=0.2, seed=0), maxiter=100)
    assert np.all(rb.status == loops.MAXITER) and not rb.converged.any()
    # a gradient, not an estimate: the default gtol still applies
    r = no.minimize(sumsq_fg, x0, no.Adam(0.1), maxiter=5000)
    assert r.status == loops.GTOL and r.converged


def test_default_gtol_is_the_number_it_says():
    import inspect

    from numbaopt.loops.problem import DEFAULT_GTOL

    for f in (no.minimize, no.minimize_batch):
        d = inspect.signature(f).parameters["gtol"].default
        assert d == 1e-6 and isinstance(d, float) and repr(d) == "1e-06"
        # the marker SPSA's default relies on: the signatures must say gtol=DEFAULT_GTOL, not gtol=1e-6
        assert d is DEFAULT_GTOL, f"{f.__name__}: gtol's default must be numbaopt.loops.problem.DEFAULT_GTOL"


# ---------------------------------------------------------------------------------------------
# a gradient returned instead of written into grad_out
# ---------------------------------------------------------------------------------------------
def py_f(x):
    return float(np.sum(x * x))


def py_jac_returns(x, g):
    return 2.0 * x


def py_jac_writes_and_returns(x, g):
    g[:] = 2.0 * x
    return g


def py_fg_no_write(x, g):
    return float(np.sum(x * x))


@njit
def nj_jac_returns(x, g):
    return 2.0 * x


@njit
def nj_fg_no_write(x, g):
    return np.sum(x * x)


@njit
def nj_fg_partial(x, g):
    g[0] = 2.0 * x[0]
    return np.sum(x * x)


@pytest.mark.parametrize("fun, jac, match", [
    (py_f, py_jac_returns, r"jac\(x, grad_out, \*args\) did not write.*3 of 3.*returned an array of shape \(3,\)"
                           r".*grad_out\[:\] = "),
    (sumsq, nj_jac_returns, r"jac\(x, grad_out, \*args\) did not write.*returned array\(float64"),
    (py_fg_no_write, None, r"fun\(x, grad_out, \*args\) did not write.*3 of 3.*fill grad_out in place"),
    (nj_fg_no_write, None, r"fun\(x, grad_out, \*args\) did not write.*3 of 3"),
    (nj_fg_partial, None, r"did not write the gradient into grad_out: 2 of 3 entries"),
])
@pytest.mark.parametrize("batch", [False, True])
def test_gradient_not_written_is_a_type_error(fun, jac, match, batch):
    x0 = np.ones(3) if not batch else np.ones((2, 3))
    call = no.minimize_batch if batch else no.minimize
    with pytest.raises(TypeError, match=match) as ei:
        call(fun, x0, no.Adam(0.1), jac=jac, maxiter=50)
    assert ("(row 0)" in str(ei.value)) == batch
    with pytest.raises(TypeError, match="did not write"):  # float32 and the progress/callback paths too
        call(fun, x0.astype(np.float32), no.Adam(0.1), jac=jac, maxiter=50, callback=lambda r: False)


def test_a_jac_that_writes_and_also_returns_is_fine():
    a = no.minimize(py_f, np.ones(3), no.Adam(0.1), jac=py_jac_writes_and_returns, maxiter=30, gtol=None)
    b = no.minimize(sumsq_fg, np.ones(3), no.Adam(0.1), maxiter=30, gtol=None)
    assert np.array_equal(a.x, b.x) and a.nit == 30


def test_complex_gradient_not_written():
    @njit
    def f(x, g):
        return np.sum(np.abs(x) ** 2)

    with pytest.raises(TypeError, match="3 of 3 entries"):
        no.minimize(f, np.ones(3, np.complex128), no.Adam(0.1))


# ---------------------------------------------------------------------------------------------
# non-number losses, on every path that runs a Python objective
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ret, what", [("a", "str 'a'"), (None, "NoneType"),
                                       (np.ones(2), r"an array of shape \(2,\)"), (1j, "complex")])
def test_non_number_loss_names_fun_in_batch_and_spsa(ret, what):
    def fg(x, g):
        g[:] = 0.0
        return ret

    def f(x):
        return ret

    m = f"fun must return the loss, one real number; it returned {what}"
    with pytest.raises(TypeError, match=m):
        no.minimize_batch(fg, np.ones((2, 3)), no.Adam())
    with pytest.raises(TypeError, match=m):
        no.minimize(f, np.ones(3), no.Adam(), jac=no.SPSA(seed=0))
    with pytest.raises(TypeError, match=m):
        no.minimize_batch(f, np.ones((2, 3)), no.Adam(), jac=no.SPSA(seed=0))
    with pytest.raises(TypeError, match=m):
        no.minimize(f, np.ones(3), no.Adam(), jac=py_jac_writes_and_returns)


def test_a_loss_and_gradient_tuple_says_where_the_gradient_goes():
    def fg(x, g):
        return float(np.sum(x * x)), 2.0 * x

    with pytest.raises(TypeError, match=r"returned tuple.*the gradient goes into grad_out"):
        no.minimize(fg, np.ones(3), no.Adam())

    @njit
    def nj(x, g):
        return np.sum(x * x), 2.0 * x

    with pytest.raises(TypeError, match="write the gradient into grad_out and return only the loss"):
        no.minimize(nj, np.ones(3), no.Adam())


# ---------------------------------------------------------------------------------------------
# the progress bar
# ---------------------------------------------------------------------------------------------
def test_progress_bar_stays_with_loss_and_gradient_norm(capsys):
    pytest.importorskip("tqdm")
    r = no.minimize(sumsq_fg, np.ones(4), no.Adam(0.01), maxiter=400, gtol=None, progress=True)
    err = capsys.readouterr().err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "400/400" in last and f"loss={r.fun:.6g}" in last and "|g|=" in last, last
    assert err.endswith("\n")  # left on screen (leave=True), not cleared
    rb = no.minimize_batch(sumsq_fg, np.ones((3, 4)), [no.Adam(lr) for lr in (0.01, 0.1, 1.0)], maxiter=200,
                           gtol=1e-3, progress=True)
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    best = int(np.argmin(rb.fun))
    assert f"loss={rb.fun[best]:.6g}" in last and "running=0/3" in last, last


def test_progress_bar_with_a_stopping_callback(capsys):
    pytest.importorskip("tqdm")
    r = no.minimize(sumsq_fg, np.ones(4), no.Adam(0.01), maxiter=400, gtol=None, progress=True,
                    callback=lambda res: res.nit >= 50, callback_every=10)
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert r.nit == 50 and "50/400" in last and "loss=" in last, last


def test_progress_postfix_is_rate_limited(capsys, monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    import time

    calls = []
    real = tqdm.tqdm.set_postfix

    def counting(self, *a, **kw):  # the real method, counted
        calls.append(time.perf_counter())
        return real(self, *a, **kw)

    monkeypatch.setattr(tqdm.tqdm, "set_postfix", counting)
    t0 = time.perf_counter()
    # a chunk per iteration (callback_every=1): thousands of bar updates, few postfix rewrites
    r = no.minimize(sumsq_fg, np.ones(4), no.Adam(0.001), maxiter=3000, gtol=None, progress=True,
                    callback=lambda res: False)
    elapsed = time.perf_counter() - t0
    assert r.nit == 3000
    assert 2 <= len(calls) <= elapsed / 0.1 + 2, (len(calls), elapsed)  # the first, one per 0.1 s, the last
    assert all(b - a >= 0.099 for a, b in zip(calls[:-2], calls[1:-1]))
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------
# plots leave the user's matplotlib alone
# ---------------------------------------------------------------------------------------------
def test_plots_do_not_switch_the_backend(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    try:
        matplotlib.use("svg")  # a backend the user chose (not Agg, which the old plot() forced)
        figs = plt.get_fignums()
        r = no.minimize(sumsq_fg, np.ones(4), no.Adam(0.05), maxiter=100)
        ax = r.plot(path=tmp_path / "loss.png")
        no.schedules.cosine(1e-3, 100).plot(100, path=tmp_path / "sched.png")
        rb = no.minimize_batch(sumsq_fg, np.ones((2, 4)), no.Adam(0.05), maxiter=100)
        rb.plot(path=tmp_path / "batch.png")
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == figs  # saved outside pyplot: no figure left open
        assert ax.get_yscale() == "log" and len(ax.lines) == 1
        for name in ("loss.png", "sched.png", "batch.png"):
            data = (tmp_path / name).read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        # without a path: pyplot's current state, as it is
        ax2 = r.plot()
        assert matplotlib.get_backend() == "svg" and ax2.figure.number in plt.get_fignums()
        plt.close(ax2.figure)
    finally:
        plt.close("all")
        matplotlib.use(before)


def test_plot_without_history_is_a_clear_error():
    pytest.importorskip("matplotlib")
    r = no.minimize(sumsq_fg, np.ones(4), no.Adam(0.05), maxiter=10, history=False)
    with pytest.raises(ValueError, match="history=False"):
        r.plot(path="unused.png")


# ---------------------------------------------------------------------------------------------
# make demo: the convergence plot, and the message without matplotlib
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("with_matplotlib", [True, False])
def test_demo_writes_the_plot_it_names_or_says_how_to_get_it(tmp_path, with_matplotlib):
    import os
    import subprocess
    import sys

    if with_matplotlib:
        pytest.importorskip("matplotlib")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    png = tmp_path / "conv.png"
    block = "" if with_matplotlib else "sys.modules['matplotlib'] = None; "  # as if it were not installed
    code = (f"import sys, runpy; {block}sys.argv = ['demo.py', {str(png)!r}]; "
            f"runpy.run_path({os.path.join(root, 'examples', 'demo.py')!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "relative error" in out.stdout and "(< 1e-4)" in out.stdout
    if with_matplotlib:
        assert f"convergence plot (log-scale error vs iteration and vs time): {png}" in out.stdout
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib is not installed (pip install 'numbaopt[plot]'" in out.stdout and not png.exists()
