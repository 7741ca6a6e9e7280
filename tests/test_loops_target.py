"""minimize_batch multi-start: per-row loss targets (f_target), rows on several threads, and a cold start that
compiles nothing (every dispatcher numbaopt calls is loaded from Numba's cache in a second process)."""
import os
import subprocess
import sys
import textwrap
import threading
import time

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


@njit(cache=True)
def quad_raises_far_away(x, g, c):
    if x[0] > 100.0:
        raise ValueError("x[0] > 100")
    return quad(x, g, c)


@njit(cache=True)
def slow_quad(x, g, c):
    """quad, plus about a microsecond of arithmetic per call (for the GIL test)."""
    s = 0.0
    for k in range(200):
        s += np.sin(x[0] + k)
    return quad(x, g, c) + 1e-300 * s


C = np.linspace(-1.0, 2.0, 6)
FIELDS = ("x", "fun", "nit", "nfev", "converged", "status", "grad_norm", "t", "skipped", "history")


def starts(B=5, seed=0):
    X0 = np.random.default_rng(seed).normal(scale=2.0, size=(B, C.size))
    X0[0] = C + 0.01  # already below any target used here: stops at iteration 0
    return X0


def assert_same(a, b):
    """Every field of two BatchResults, bit for bit (NaN padding of the histories included)."""
    for k in FIELDS:
        va, vb = getattr(a, k), getattr(b, k)
        if va is None or vb is None:
            assert va is None and vb is None, k
        else:
            assert np.array_equal(va, vb, equal_nan=True), k
    assert a.message == b.message
    for sa, sb in zip(a.state, b.state):
        assert np.array_equal(sa, sb, equal_nan=True)


# ---------------------------------------------------------------------------------------------
# f_target
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [0.5, np.array([0.5, 0.2, 1e-3, -np.inf, 2.0])],
                         ids=["scalar", "per-row"])
def test_each_row_stops_on_its_target_with_the_iterates_of_minimize(target):
    X0 = starts()
    rb = no.minimize_batch(quad, X0, no.Adam(0.05), args=(C,), maxiter=400, gtol=None, f_target=target)
    ft = np.broadcast_to(target, (5,))
    assert rb.nit[0] == 0 and rb.status[0] == loops.TARGET  # x0 already good enough
    for r in range(5):
        one = no.minimize(quad, X0[r], no.Adam(0.05), args=(C,), maxiter=400, gtol=None, f_target=float(ft[r]))
        assert np.array_equal(one.x, rb.x[r]) and one.nit == rb.nit[r] and one.status == rb.status[r]
        assert np.array_equal(one.history, rb.row(r).history) and one.fun == rb.fun[r]
        if rb.status[r] == loops.TARGET:
            # stopped at the first iterate whose loss is <= the target, not later
            assert rb.fun[r] <= ft[r] and np.all(rb.history[r, :rb.nit[r]] > ft[r])
            assert rb.converged[r] and rb.success[r] and rb.message[r] == "loss <= f_target"
            assert one.converged and one.success and one.message == "loss <= f_target"
        else:  # no target (-inf), or one it could not reach in maxiter steps
            assert rb.status[r] == loops.MAXITER and not rb.converged[r]
    assert len(set(rb.nit.tolist())) > 2  # the rows stopped at different iterations
    py = no.minimize_batch(quad.py_func, X0, no.Adam(0.05), args=(C,), maxiter=400, gtol=None, f_target=target)
    assert_same(py, rb)


def test_target_with_jac_and_spsa_and_status_codes():
    X0 = starts()
    ft = np.array([0.5, 0.2, 0.1, 0.3, 0.05])
    fg = no.minimize_batch(quad, X0, no.Adam(0.05), args=(C,), maxiter=300, f_target=ft)
    jac = no.minimize_batch(quad_f, X0, no.Adam(0.05), jac=quad_j, args=(C,), maxiter=300, f_target=ft)
    assert_same(fg, jac)
    spsa = no.SPSA(c=0.05, a=1.0, alpha=0.0, seed=7)
    sb = no.minimize_batch(quad_f, X0, no.Adam(0.05), jac=spsa, args=(C,), maxiter=300, f_target=ft)
    assert np.all(sb.status == loops.TARGET)
    assert np.array_equal(sb.nfev, 2 * sb.nit + 3)  # the stopping iteration evaluated twice, then fun at x
    # the test is on the mean of the two perturbed evaluations (history[k], k < nit): none met it before nit
    assert all(np.all(sb.history[r, :sb.nit[r]] > ft[r]) for r in range(5)) and len(set(sb.nit.tolist())) > 2
    assert_same(no.minimize_batch(quad_f.py_func, X0, no.Adam(0.05), jac=spsa, args=(C,), maxiter=300, f_target=ft),
                sb)
    # the codes are distinct, and a reduction's error comes after TARGET
    codes = [loops.RUNNING, loops.GTOL, loops.FTOL, loops.NONFINITE, loops.MAXITER, loops.CALLBACK, loops.TARGET]
    assert codes == list(range(7)) and loops.RULE_ERROR == 7


def test_a_reduction_error_is_rule_error_plus_the_member_index():
    @njit
    def huge(x, g):  # finite in float64, but the float32 norm of the gradient overflows
        for i in range(x.shape[0]):
            g[i] = 1e30
        return 1.0

    rule = no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.1))
    for fun in (huge, huge.py_func):
        res = no.minimize(fun, np.ones(4, np.float32), rule, f_target=0.5)
        assert res.status == loops.RULE_ERROR + 0 and not res.converged and res.nit == 0
        assert res.message.startswith("ClipGlobalNorm: the gradient norm is not finite")


# ---------------------------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------------------------
RULES = {
    "adam": no.Adam(0.05),
    "chain": no.chain(no.ClipGlobalNorm(1.0), no.Momentum(0.02)),
    "per-row": [no.AdaGrad(0.1, eps=e) for e in (1e-8, 1e-4, 1e-2, 0.1, 0.5)],
}


@pytest.mark.parametrize("mode", ["fg", "jac", "spsa"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_threads_give_bitwise_the_serial_result(mode, rule):
    X0 = starts(seed=3)
    fun, jac = {"fg": (quad, None), "jac": (quad_f, quad_j),
                "spsa": (quad_f, no.SPSA(c=0.05, a=1.0, alpha=0.0, seed=11))}[mode]
    opts = dict(args=(C,), maxiter=120, f_target=np.array([0.5, 0.1, -np.inf, 0.3, 1e-2]))
    serial = no.minimize_batch(fun, X0, RULES[rule], jac, **opts)
    for threads in (2, 3, 8):  # 8 > B: one row per thread
        assert_same(no.minimize_batch(fun, X0, RULES[rule], jac, threads=threads, **opts), serial)
    # no history, a schedule, the chunks of a callback: still bitwise
    kw = dict(opts, history=False, schedule=no.schedules.exponential(0.05, 0.5, 50))
    assert_same(no.minimize_batch(fun, X0, RULES[rule], jac, threads=2, **kw),
                no.minimize_batch(fun, X0, RULES[rule], jac, **kw))
    seen = {1: [], 2: []}
    for threads in (1, 2):
        res = no.minimize_batch(fun, X0, RULES[rule], jac, threads=threads, callback_every=7,
                                callback=lambda s, k=threads: seen[k].append(s.nit.copy()) or s.nit.max() >= 70,
                                **opts)
        if threads == 1:
            ref = res
    assert_same(res, ref)
    assert len(seen[1]) == len(seen[2]) > 1 and all(np.array_equal(a, b) for a, b in zip(seen[1], seen[2]))


@pytest.mark.parametrize("mode", ["fg", "spsa"])
def test_no_two_blocks_share_memory_the_driver_writes(mode):
    """Deterministic where a race is not: the arrays each block's driver writes (parameters, gradients, rule
    state, hyperparameters when a schedule writes them, counters, losses, history, SPSA streams and scratch)
    are disjoint across blocks; only read-only inputs (schedule tables, targets, gains) may be shared."""
    from numbaopt.loops.problem import Problem

    jac = no.SPSA(seed=1) if mode == "spsa" else None
    for rule in (no.Adam(0.05), [no.Adam(lr) for lr in (0.01, 0.02, 0.03, 0.04, 0.05)]):
        p = Problem(quad_f if mode == "spsa" else quad, starts(), rule, jac, (C,), 50, None, None,
                    no.schedules.exponential(0.05, 0.5, 10), "X0", True)
        b0, b1 = p.block(0, 3), p.block(3, 5)
        (X, G, S, HP, _, _, I, F, H), (_, _, _, _, _, rng, XP, D) = b0
        written0 = [X, G, *S, HP, I, F, H, rng] + ([XP, D] if mode == "spsa" else [])
        (X, G, S, HP, _, _, I, F, H), (_, _, _, _, _, rng, XP, D) = b1
        written1 = [X, G, *S, HP, I, F, H, rng] + ([XP, D] if mode == "spsa" else [])
        assert not any(np.shares_memory(a, b) for a in written0 for b in written1)
        assert np.array_equal(b0[0][3], b1[0][3]) or isinstance(rule, list)  # a copy, with the same values


def test_the_compiled_loop_releases_the_gil():
    """What threads= rests on: while one thread runs a compiled chunk, Python runs on the others. The main
    thread counts while a worker runs one long chunk; with the GIL held the count would stall for the whole
    chunk (a core count or the machine's load does not matter: this is about the lock, not speed)."""
    X0 = np.ones((1, C.size))
    no.minimize_batch(slow_quad, X0, no.Descent(1e-9), args=(C,), maxiter=5, gtol=None)  # compiled/loaded
    done, stamps = [], []

    def work():
        t0 = time.perf_counter()
        no.minimize_batch(slow_quad, X0, no.Descent(1e-9), args=(C,), maxiter=100_000, gtol=None, history=False)
        done.append(time.perf_counter() - t0)

    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive():
        stamps.append(time.perf_counter())
    worker.join()
    gaps = np.diff(stamps)
    assert done[0] > 0.05 and len(stamps) > 100, (done, len(stamps))
    assert gaps.max() < 0.5 * done[0], (gaps.max(), done[0])  # never blocked for the chunk


def test_threads_with_a_python_objective_warn_and_run_serially():
    X0 = starts()
    ref = no.minimize_batch(quad, X0, no.Adam(0.05), args=(C,), maxiter=60)
    with pytest.warns(RuntimeWarning, match=r"threads=2\).*runs in Python"):
        py = no.minimize_batch(quad.py_func, X0, no.Adam(0.05), args=(C,), maxiter=60, threads=2)
    assert_same(py, ref)
    with pytest.warns(RuntimeWarning, match="one thread"):
        cp = no.minimize_batch(quad, X0, no.Adam(0.05), args=(C,), maxiter=60, threads=2, compiled=False)
    assert_same(cp, ref)


def test_an_exception_in_a_thread_propagates_and_leaves_no_thread_behind():
    X0 = starts(B=4)
    X0[3, 0] = 1000.0  # the last block's row raises
    before = threading.active_count()
    with pytest.raises(ValueError, match="x\\[0\\] > 100"):
        no.minimize_batch(quad_raises_far_away, X0, no.Adam(0.05), args=(C,), maxiter=20, threads=2)
    assert threading.active_count() == before


@pytest.mark.parametrize("kw, exc, match", [
    (dict(f_target=np.zeros(3)), ValueError, r"f_target: shape \(3,\) for 5 rows; expected a real number or an "
                                             r"array of 5 per-row targets"),
    (dict(f_target=np.zeros((5, 1))), ValueError, r"f_target: shape \(5, 1\)"),
    (dict(f_target=np.array([0.1, np.nan, 0, 0, 0])), ValueError, r"f_target\[1\] is NaN"),
    (dict(f_target=float("nan")), ValueError, "f_target is NaN"),
    (dict(f_target="0.1"), TypeError, "f_target must be a real number"),
    (dict(f_target=True), TypeError, "f_target must be"),
    (dict(f_target=1j), TypeError, "f_target must be"),
    (dict(f_target=np.array(["a"] * 5)), TypeError, "dtype <U1"),
    (dict(threads=0), ValueError, "threads=0; expected an integer >= 1"),
    (dict(threads=1.5), TypeError, "threads must be an integer"),
    (dict(threads=True), TypeError, "threads must be an integer"),
    (dict(threads=None), TypeError, "threads must be an integer"),
])
def test_bad_targets_and_threads(kw, exc, match):
    with pytest.raises(exc, match=match):
        no.minimize_batch(quad, starts(), no.Adam(), args=(C,), maxiter=5, **kw)


def test_minimize_takes_one_target():
    with pytest.raises(TypeError, match="one target per row is for minimize_batch"):
        no.minimize(quad, np.zeros(6), no.Adam(), args=(C,), f_target=np.zeros(1))
    with pytest.raises(ValueError, match="f_target is NaN"):
        no.minimize(quad, np.zeros(6), no.Adam(), args=(C,), f_target=np.nan)
    with pytest.raises(TypeError, match="unexpected keyword argument 'threads'"):
        no.minimize(quad, np.zeros(6), no.Adam(), args=(C,), threads=2)
    res = no.minimize(quad, np.zeros(6), no.Adam(), args=(C,), f_target=np.float32(np.inf))
    assert res.status == loops.TARGET and res.nit == 0  # +inf: every loss is <= it
    f0 = quad(np.zeros(6), np.empty(6), C)
    res = no.minimize(quad, np.zeros(6), no.Adam(), args=(C,), f_target=f0)  # <=, not <: equal stops
    assert res.status == loops.TARGET and res.nit == 0 and res.fun == f0
    res = no.minimize(quad, np.zeros(6), no.Adam(), args=(C,), f_target=np.nextafter(f0, -np.inf), maxiter=3)
    assert res.nit == 1 and res.status == loops.TARGET  # the first step lowers the loss below it


# ---------------------------------------------------------------------------------------------
# the cold start: a second process compiles nothing
# ---------------------------------------------------------------------------------------------
_COLD = '''
import gc, os, sys
import numpy as np
import numbaopt as no
sys.path.insert(0, os.path.join({root!r}, "examples"))
import userfun, vqe
from numba.core.caching import NullCache
from numba.core.dispatcher import Dispatcher

# examples/vqe.py's path, then the other paths of the loops
x0 = vqe.initial_angles(3, 1)
no.minimize(vqe.energy_grad, x0, no.Adam(0.05), args=(3, 1, 1.0, 1.0), maxiter=30)
no.minimize(userfun.f, np.ones(4), no.Adam(0.1), callback=lambda r: r.nit >= 3)   # finish() takes a norm
no.minimize(userfun.f0, np.ones(4), no.Adam(0.1), jac=no.SPSA(seed=0), maxiter=5)
no.minimize(userfun.f0, np.ones(4), no.Adam(0.1), jac=userfun.j, maxiter=5)
no.minimize_batch(userfun.f, np.ones((3, 4)), no.Adam(0.1), maxiter=5, f_target=[0.1, 0.2, 0.3], threads=2)
no.minimize(userfun.f.py_func, np.ones(4), no.Adam(0.1), maxiter=5)              # the interpreted driver
no.minimize(userfun.f0.py_func, np.ones(4), no.Adam(0.1), jac=no.SPSA(seed=0), maxiter=5)
no.minimize(userfun.f.py_func, np.ones(4, np.float32), no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.1)), maxiter=5)

ours = (os.path.join({root!r}, "numbaopt"), os.path.join({root!r}, "examples"), os.environ["NUMBAOPT_CACHE_DIR"])
compiled = []
for d in gc.get_objects():
    if isinstance(d, Dispatcher) and d.py_func.__code__.co_filename.startswith(ours):
        cached = not isinstance(d._cache, NullCache)
        n = sum(d.stats.cache_misses.values()) if cached else len(d.overloads)  # uncached: every overload compiled
        compiled += [f"{{d.py_func.__qualname__}}({{'cached' if cached else 'UNCACHED'}})"] * n
print(" ".join(compiled) or "-")
'''


@pytest.mark.slow
def test_a_second_process_compiles_nothing(tmp_path):
    """Counted, not timed: every numbaopt (and example) dispatcher a second process calls is loaded from the
    cache. The first process compiles (a fresh kernel cache), so the count can fail."""
    (tmp_path / "userfun.py").write_text(textwrap.dedent('''
        from numba import njit
        @njit(cache=True)
        def f(x, g):
            s = 0.0
            for i in range(x.shape[0]):
                g[i] = 2.0 * x[i]
                s += x[i] * x[i]
            return s
        @njit(cache=True)
        def f0(x):
            return (x * x).sum()
        @njit(cache=True)
        def j(x, g):
            g[:] = 2.0 * x
    '''))
    env = dict(os.environ, NUMBAOPT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=f"{tmp_path}:{ROOT}")
    script = _COLD.format(root=ROOT)

    def compiled():
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.split()

    first = compiled()
    assert any(name.startswith("run_fg") for name in first), first  # a fresh cache: the drivers compiled
    assert compiled() == ["-"]
