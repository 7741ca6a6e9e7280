"""The compiled loops over MPI (run under mpiexec by tests/test_mpi.py): data-parallel ``minimize`` against a
single-process ``minimize`` of the rank-order average, ``minimize_batch`` with its rows split against the
single-process batch, and the errors every rank must raise alike."""
from __future__ import annotations

import numba
import numpy as np
from harness import case, main
from mpi4py import MPI

import numbaopt as no
from numbaopt import mpi as nm
from numbaopt.loops import CALLBACK, NONFINITE


# cache=True: each rank (and the n=3 run after the n=2 one) loads what the first compiled, the loops' drivers too
@numba.njit(cache=True)
def fg(x, g, A, b):
    r = A @ x - b
    g[:] = A.T @ r
    return 0.5 * (r @ r)


@numba.njit(cache=True)
def loss(x, A, b):
    r = A @ x - b
    return 0.5 * (r @ r)


@numba.njit(cache=True)
def grad(x, g, A, b):
    g[:] = A.T @ (A @ x - b)


def data(P, dtype=np.float64):
    rng = np.random.default_rng(3)
    return ([rng.standard_normal((7, 4)).astype(dtype) for _ in range(P)],
            [rng.standard_normal(7).astype(dtype) for _ in range(P)])


def reference(P, average=True):
    """fun for the single-process run: every rank's loss and gradient, summed in rank order in float64."""
    def ref(x, g, As, bs):
        f, acc = 0.0, np.zeros(x.shape, np.float64)
        for k in range(P):
            gk = np.empty_like(x)
            f += float(fg(x, gk, As[k], bs[k]))
            acc += gk.astype(np.float64)
        g[:] = acc / P if average else acc
        return f / P if average else f
    return ref


def same_result(a, b, what):
    assert a.nit == b.nit and a.status == b.status, (what, a.nit, b.nit, a.status, b.status)
    assert a.x.dtype == b.x.dtype and np.array_equal(a.x, b.x), (what, a.x, b.x)
    assert np.array_equal(a.history, b.history, equal_nan=True), what
    assert a.fun == b.fun or (np.isnan(a.fun) and np.isnan(b.fun)), (what, a.fun, b.fun)


def same_everywhere(comm, x):
    xs = comm.allgather(np.asarray(x))
    assert all(np.array_equal(xs[0], y, equal_nan=True) for y in xs), xs


@case("data_parallel_minimize_equals_the_single_process_average")
def _(comm):
    P, r = comm.size, comm.rank
    for dtype in (np.float64, np.float32):
        As, bs = data(P, dtype)
        x0 = np.zeros(4, dtype)
        for rule in (no.Adam(0.1), no.chain(no.ClipGlobalNorm(1.0), no.Momentum(0.02))):
            for average in (True, False):
                ref = no.minimize(reference(P, average), x0, rule, args=(As, bs), maxiter=150, gtol=1e-9)
                for compiled in (True, False):
                    what = f"{dtype.__name__} {rule!r} average={average} compiled={compiled}"
                    res = nm.minimize(fg, x0, rule, comm=comm, average=average, args=(As[r], bs[r]), maxiter=150,
                                      gtol=1e-9, compiled=compiled)
                    same_result(res, ref, what)
                    same_everywhere(comm, res.x)


@case("loss_and_jac_and_spsa_modes")
def _(comm):
    P, r = comm.size, comm.rank
    As, bs = data(P)
    ref = no.minimize(reference(P), np.zeros(4), no.Adam(0.1), args=(As, bs), maxiter=80)
    res = nm.minimize(loss, np.zeros(4), no.Adam(0.1), grad, comm=comm, args=(As[r], bs[r]), maxiter=80)
    same_result(res, ref, "jac mode")

    def ref_loss(x, As, bs):
        return sum(float(loss(x, As[k], bs[k])) for k in range(P)) / P
    sp = no.SPSA(c=0.05, a=0.5, seed=11)
    ref = no.minimize(ref_loss, np.zeros(4), no.Descent(0.1), sp, args=(As, bs), maxiter=60)
    res = nm.minimize(loss, np.zeros(4), no.Descent(0.1), sp, comm=comm, args=(As[r], bs[r]), maxiter=60)
    assert np.allclose(res.x, ref.x, rtol=0, atol=1e-12) and res.nit == ref.nit, (res.x, ref.x)
    unseeded = nm.minimize(loss, np.zeros(4), no.Descent(0.1), no.SPSA(c=0.05, a=0.5), comm=comm,
                           args=(As[r], bs[r]), maxiter=30)
    same_everywhere(comm, unseeded.x)  # rank 0's seed, on every rank
    assert not np.array_equal(unseeded.x, np.zeros(4))


@case("an_objective_that_raises_on_one_rank_stops_every_rank_with_the_same_error")
def _(comm):
    P, r = comm.size, comm.rank
    As, bs = data(P)

    @numba.njit
    def flaky(x, g, A, b, calls, fail):
        calls[0] += 1
        if fail and calls[0] == 5:
            raise ValueError("bad shard")
        return fg(x, g, A, b)

    for compiled in (True, False):
        fun = flaky if compiled else flaky.py_func
        try:
            nm.minimize(fun, np.zeros(4), no.Adam(0.1), comm=comm, maxiter=50, compiled=compiled,
                        args=(As[r], bs[r], np.zeros(1, np.int64), r == P - 1))
        except no.mpi.DistributedError as e:
            msg = str(e)
        else:
            raise AssertionError("no error")
        assert f"ranks [{P - 1}]" in msg, msg
        assert ("bad shard" in msg) == (not compiled), msg
        assert len(set(comm.allgather(msg))) == 1


@case("different_x0_or_options_are_the_same_value_error_on_every_rank")
def _(comm):
    As, bs = data(comm.size)
    x0 = np.zeros(4)
    x0[0] = 1.0 if comm.rank == comm.size - 1 else 0.0
    for kw in ({"x0": x0}, {"x0": np.zeros(4), "maxiter": 10 + (comm.rank == 1)}):
        x = kw.pop("x0")
        try:
            nm.minimize(fg, x, no.Adam(0.1), comm=comm, args=(As[comm.rank], bs[comm.rank]), **kw)
        except ValueError as e:
            msg = str(e)
        else:
            raise AssertionError("no error")
        assert "disagree" in msg and len(set(comm.allgather(msg))) == 1, msg


@case("a_callback_that_stops_on_one_rank_stops_all")
def _(comm):
    As, bs = data(comm.size)
    res = nm.minimize(fg, np.zeros(4), no.Adam(0.1), comm=comm, args=(As[comm.rank], bs[comm.rank]), maxiter=100,
                      callback=lambda s: comm.rank == 0 and s.nit >= 7)
    assert res.status == CALLBACK and res.nit == 7, (res.status, res.nit)
    same_everywhere(comm, res.x)


@case("minimize_batch_rows_split_equal_the_single_process_batch")
def _(comm):
    As, bs = data(1)
    rng = np.random.default_rng(5)
    for B in (1, comm.size + 2):
        X0 = rng.standard_normal((B, 4))
        cases = [(fg, None, no.Adam(0.1)), (fg, None, [no.Adam(0.02 * (k + 1)) for k in range(B)]),
                 (loss, no.SPSA(c=0.05, a=0.5, seed=4), no.Descent(0.05))]
        for fun, jac, rule in cases:
            ref = no.minimize_batch(fun, X0, rule, jac, args=(As[0], bs[0]), maxiter=60)
            got = nm.minimize_batch(fun, X0, rule, jac, comm=comm, args=(As[0], bs[0]), maxiter=60)
            for k in ("x", "fun", "nit", "nfev", "status", "grad_norm", "t", "skipped"):
                assert np.array_equal(getattr(got, k), getattr(ref, k), equal_nan=True), (k, B, rule)
            assert np.array_equal(got.history, ref.history, equal_nan=True) and got.message == ref.message
            for a, b in zip(got.state, ref.state, strict=True):
                assert np.array_equal(a, b)
    got = nm.minimize_batch(loss, np.zeros((3, 4)), no.Descent(0.05), no.SPSA(c=0.05, a=0.5), comm=comm,
                            args=(As[0], bs[0]), maxiter=20)
    same_everywhere(comm, got.x)


@case("minimize_batch_a_row_that_fails_is_the_same_error_on_every_rank")
def _(comm):
    As, bs = data(1)

    def picky(x, g, A, b):
        if x[0] == 123.0:
            raise ValueError("row with the marker")
        return fg(x, g, A, b)

    X0 = np.zeros((comm.size + 1, 4))
    X0[-1, 0] = 123.0
    try:
        nm.minimize_batch(picky, X0, no.Adam(0.1), comm=comm, args=(As[0], bs[0]), maxiter=5)
    except ValueError as e:
        msg = str(e)
    else:
        raise AssertionError("no error")
    assert f"rank {comm.size - 1}: row with the marker" in msg, msg
    assert len(set(comm.allgather(msg))) == 1


@case("a_non_finite_loss_on_one_rank_stops_every_rank")
def _(comm):
    As, bs = data(comm.size)
    b = bs[comm.rank].copy()
    if comm.rank == 0:
        b[0] = np.inf
    res = nm.minimize(fg, np.zeros(4), no.Adam(0.1), comm=comm, args=(As[comm.rank], b), maxiter=20)
    assert res.status == NONFINITE and res.nit == 0, (res.status, res.nit)


@case("a_sub_communicator")
def _(comm):
    sub = comm.Split(comm.rank % 2, comm.rank)
    As, bs = data(sub.size)
    ref = no.minimize(reference(sub.size), np.zeros(4), no.Adam(0.1), args=(As, bs), maxiter=40)
    res = nm.minimize(fg, np.zeros(4), no.Adam(0.1), comm=sub, args=(As[sub.rank], bs[sub.rank]), maxiter=40)
    same_result(res, ref, f"sub-communicator of {sub.size}")
    sub.Free()
    assert MPI.COMM_WORLD.size == comm.size


if __name__ == "__main__":
    main()
