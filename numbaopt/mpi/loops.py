"""The compiled loops over MPI: :func:`minimize` data-parallel, :func:`minimize_batch` with its rows split.

``minimize(fun, x0, rule, comm=comm)``: every rank passes the same ``x0`` and rule and its own objective
(its share of the data, through ``args``). At every evaluation the ranks' losses and gradients are combined
(averaged, or summed with ``average=False``) INSIDE the compiled loop: the objective is wrapped in a
generated ``@njit`` function that calls ``MPI_Allgather`` through ctypes (:mod:`.native`) and sums the
gathered values in rank order. No round trip to Python per step; every rank holds the same combined values,
so every rank takes the same steps and stops at the same iteration (a stopping test on values that differed
by one ulp would leave a rank waiting in a collective: this is why the sum is done locally in a fixed order
rather than by ``Allreduce``, whose order MPI leaves to the implementation). The price: each rank receives
``p * (n + 2)`` doubles per evaluation instead of about ``2n``; the loops are meant for objectives that cost
far more than their ``n`` parameters (circuits, simulations), where that is negligible.

``minimize_batch(fun, X0, rule, comm=comm)``: the B independent rows are split into contiguous blocks, one per
rank; each rank runs its rows with the single-process driver (no communication at all while it runs) and one
gather at the end gives every rank the whole :class:`~numbaopt.loops.BatchResult`, bitwise equal to the
single-process one (rows are independent; SPSA streams are drawn for the global row numbers).

Errors never hang: options, ``x0`` and argument types are agreed at the start (one collective; a difference is
the same ``ValueError`` on every rank); an exception in ``fun``/``jac`` on one rank makes that evaluation's
combined loss NaN on every rank, so every rank stops at the same iteration and then raises the same error
naming the rank (compiled code cannot keep the exception: ``compiled=False`` shows its message).
"""
from __future__ import annotations

import hashlib

import numba
import numpy as np

from ..loops.minimize import batch_result, finish, minimize as _minimize, run
from ..loops.problem import DEFAULT_GTOL, Problem, count, is_njit
from ..loops.results import BatchResult
from ..loops.spsa import SPSA
from .comm import DistributedError, agree_signature, require_mpi, world
from .native import allgather, handles

__all__ = ["minimize", "minimize_batch"]

_NJ = dict(error_model="numpy")

_COMBINE = '''
def _combine(ok, f, g, send, recv, flag):
    n = g.shape[0]
    send[0] = ok
    send[1] = f
{pack}
    W = send.shape[0]
    _ag(send.ctypes.data, W, DT, recv.ctypes.data, W, DT, COMM)
    failed = False
    for r in range(P):
        if recv[r, 0] == 0.0:
            failed = True
            if flag[0] == 0:
                flag[1 + r] = 1
    if failed:
        flag[0] = 1
        for i in range(n):
            g[i] = np.nan
        return np.nan
    s = 0.0
    for r in range(P):
        s += recv[r, 1]
{unpack}
    return s / P if AVG else s
'''
_PACK = {"r": "    for i in range(n):\n        send[2 + i] = g[i]",
         "c": "    for i in range(n):\n        send[2 + 2 * i] = g[i].real\n        send[3 + 2 * i] = g[i].imag",
         "none": ""}
_UNPACK = {"r": '''    for i in range(n):
        a = 0.0
        for r in range(P):
            a += recv[r, 2 + i]
        g[i] = a / P if AVG else a''',
           "c": '''    for i in range(n):
        a = 0.0
        b = 0.0
        for r in range(P):
            a += recv[r, 2 + 2 * i]
            b += recv[r, 3 + 2 * i]
        g[i] = complex(a / P, b / P) if AVG else complex(a, b)''',
           "none": ""}
_CALL = '''
def {name}(x, {g}sf, rf, sg, rg, flag{a}):
    ok = 1.0
    f = np.nan
    try:
        {body}
    except Exception{keep}
        ok = 0.0
    return {combine}(ok, f, {gg}, {s}, {r}, flag)
'''


#: the combining functions, one pair per (kind, communicator and datatype handles, size, average, compiled):
#: every later wrapper on the same communicator reuses their compiled code (0.3 s a wrapper otherwise)
_COMBINERS: dict = {}


def _combiners(kind, comm, average, compiled) -> dict:
    """``{"_combine": ..., "_combine_f": ...}`` for these settings, made (and compiled on first use) once."""
    ch, dh = handles(comm)
    p = comm.Get_size()
    key = (kind, ch, dh, p, bool(average), bool(compiled))
    got = _COMBINERS.get(key)
    if got is None:
        ns = {"np": np, "_ag": allgather(), "COMM": ch, "DT": dh, "P": p, "AVG": bool(average)}
        src = _COMBINE.format(pack=_PACK[kind], unpack=_UNPACK[kind]) + \
            _COMBINE.replace("def _combine", "def _combine_f").format(pack="", unpack="")
        exec(compile(src, "<numbaopt.mpi.loops combine>", "exec"), ns)  # noqa: S102 - our own template
        got = _COMBINERS[key] = {k: numba.njit(**_NJ)(ns[k]) if compiled else ns[k]
                                 for k in ("_combine", "_combine_f")}
    return got


def _wrappers(mode, fun, jac, nargs, kind, comm, average, compiled, seen):
    """The objective (and ``jac``) wrapped: each evaluates the user's function, then combines across ranks."""
    ns = {"np": np, "fun": fun, "jac": jac, "_seen": seen, **_combiners(kind, comm, average, compiled)}
    a = "".join(f", a{i}" for i in range(nargs))
    keep = ":" if compiled else " as e:\n        _seen.append((type(e).__name__, str(e)))"
    if mode == "fg":
        src = _CALL.format(name="w_fun", g="g, ", a=a, body=f"f = np.float64(fun(x, g{a}))", keep=keep,
                            combine="_combine", gg="g", s="sg", r="rg")
    else:  # the loss alone: its own small buffers (2 doubles a rank)
        src = _CALL.format(name="w_fun", g="", a=a, body=f"f = np.float64(fun(x{a}))", keep=keep,
                            combine="_combine_f", gg="sf[:0]", s="sf", r="rf")
    if mode == "jac":
        src += _CALL.format(name="w_jac", g="g, ", a=a, body=f"jac(x, g{a})\n        f = 0.0", keep=keep,
                            combine="_combine", gg="g", s="sg", r="rg").replace("return _combine(", "_combine(")
    exec(compile(src, "<numbaopt.mpi.loops objective wrapper>", "exec"), ns)  # noqa: S102 - our own template
    if compiled:
        for k in ("w_fun", "w_jac"):
            if k in ns:
                ns[k] = numba.njit(**_NJ)(ns[k])
    return ns["w_fun"], ns.get("w_jac")


def _typeof(a) -> str:
    try:
        return str(numba.typeof(a))
    except (ValueError, TypeError):
        return type(a).__name__


def _signature(what, x0, rule, jac, args, options) -> list:
    x = np.ascontiguousarray(np.asarray(x0))
    rules = rule if isinstance(rule, (list, tuple)) else [rule]
    lines = [f"{what}: x0 shape {x.shape} dtype {x.dtype} sha256 {hashlib.sha256(x.tobytes()).hexdigest()[:16]}",
             f"rule {[repr(r) for r in rules]}",
             f"jac {'SPSA ' + repr(jac).split(', seed=')[0] if isinstance(jac, SPSA) else type(jac).__name__}",
             f"{len(args)} args of types {[_typeof(a) for a in args]}"]
    return lines + [f"option {k}={v}" for k, v in options.items()]


def _seeded(jac, comm):
    """An SPSA with the same seed on every rank (rank 0 draws one when it has none)."""
    if not isinstance(jac, SPSA):
        return jac
    seed = jac.seed if jac.seed is not None else comm.bcast(
        int(np.random.SeedSequence().entropy) if comm.Get_rank() == 0 else None)
    return SPSA(jac.c, jac.gamma, jac.a, jac.A, jac.alpha, seed=seed)


def _schedule_token(schedule) -> str:
    if isinstance(schedule, dict):
        return f"dict{sorted(schedule)}"
    return type(schedule).__name__


def minimize(fun, x0, rule, jac=None, *, comm=None, average: bool = True, args: tuple = (), maxiter: int = 1000,
             gtol=DEFAULT_GTOL, ftol=None, schedule=None, callback=None, callback_every: int = 1,
             progress: bool = False, compiled: bool | None = None, history: bool = True):
    """:func:`numbaopt.minimize` data-parallel over ``comm`` (default ``COMM_WORLD``); collective.

    Every rank passes the same ``x0``, rule and options, and its own ``fun`` data through ``args``; the loop
    minimises the average (``average=False``: the sum) of the ranks' objectives: at every evaluation the
    losses and gradients are combined inside the compiled loop (see the module's description), so every rank
    returns the same result, bitwise equal to a single-process ``minimize`` of an objective that sums the
    ranks' values in rank order. ``callback`` runs on every rank with the same snapshot; the loop stops when
    it says so on any rank. ``progress`` shows a bar on rank 0 only. ``jac=SPSA()`` without a seed gets rank
    0's. An exception in ``fun``/``jac`` on any rank, or options that differ between ranks, raise the same
    error on every rank."""
    require_mpi()
    comm, what = world(comm), "numbaopt.mpi.minimize"
    err, lines, nargs = None, [], 0
    try:
        if not isinstance(args, tuple):
            raise TypeError(f"args must be a tuple, got {type(args).__name__}")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        nargs = len(args)
        if compiled is None:
            compiled = is_njit(fun) and (jac is None or isinstance(jac, SPSA) or is_njit(jac))
        lines = _signature(what, x0, rule, jac, args, dict(
            average=bool(average), maxiter=maxiter, gtol=gtol, ftol=ftol, schedule=_schedule_token(schedule),
            callback=callback is not None, callback_every=callback_every, compiled=bool(compiled),
            history=bool(history)))
    except (TypeError, ValueError) as e:
        err = e
    agree_signature(comm, err, lines, what)
    jac = _seeded(jac, comm)
    x = np.asarray(x0)
    kind = "c" if x.dtype.kind == "c" else "r"
    n = int(x.size)
    mode = "spsa" if isinstance(jac, SPSA) else ("jac" if jac is not None else "fg")
    width = 2 + (2 * n if kind == "c" else n)
    p = comm.Get_size()
    bufs = (np.zeros(2), np.zeros((p, 2)), np.zeros(width), np.zeros((p, width)), np.zeros(1 + p, np.int64))
    seen: list = []
    w_fun, w_jac = _wrappers(mode, fun, None if mode != "jac" else jac, nargs, kind, comm, average, compiled, seen)
    cb = None if callback is None else _agreed_callback(comm, callback)
    res, local = None, None
    try:
        res = _minimize(w_fun, x0, rule, w_jac if mode == "jac" else jac, args=bufs + args, maxiter=maxiter,
                        gtol=gtol, ftol=ftol, schedule=schedule, callback=cb, callback_every=callback_every,
                        progress=bool(progress) and comm.Get_rank() == 0, compiled=compiled, history=history)
    except _Collective:
        raise
    except Exception as e:  # noqa: BLE001 - raised again, on every rank, below
        local = e
    _after(comm, what, local, bufs[-1], seen)
    return res


class _Collective(DistributedError):
    """A failure every rank raises at once (already agreed): passed through untouched."""


def _agreed_callback(comm, callback):
    """The user's callback, its decision (and any exception) agreed across the ranks: one small allgather."""
    def cb(snapshot):
        err, stop = None, False
        try:
            stop = bool(callback(snapshot))
        except StopIteration:
            stop = True
        except Exception as e:  # noqa: BLE001 - raised on every rank
            err = (type(e).__name__, str(e))
        got = comm.allgather((err, stop))
        failed = [(r, e) for r, (e, _) in enumerate(got) if e is not None]
        if failed:
            raise _Collective("numbaopt.mpi.minimize: the callback raised on every rank's behalf: " +
                              "; ".join(f"rank {r}: {k}: {m}" for r, (k, m) in failed))
        return any(s for _, s in got)
    return cb


def _after(comm, what, local, flag, seen):
    """After the loop, one allgather: every rank raises the same error when any rank's objective raised
    (``flag``, the same on every rank, says which) or a rank failed outside the collectives."""
    mine = None if local is None else (type(local).__name__, str(local))
    got = comm.allgather((mine, seen[:1]))
    if flag[0] == 0 and all(m is None for m, _ in got):
        return
    ranks = [r for r in range(comm.Get_size()) if flag[1 + r]]
    parts = [f"rank {r}: {k}: {m}" for r, (_, s) in enumerate(got) for k, m in s]
    parts += [f"rank {r}: {m[0]}: {m[1]}" for r, (m, _) in enumerate(got) if m is not None]
    detail = "; ".join(parts) if parts else "(raised inside compiled code: pass compiled=False to see the message)"
    who = f"the objective raised on ranks {ranks}, so every rank stopped at the same evaluation" if ranks else \
        "a rank failed"
    cls = TypeError if any(m is not None and m[0] == "TypeError" for m, _ in got) else DistributedError
    raise cls(f"{what} refused on every rank: {who}: {detail}") from local


def minimize_batch(fun, X0, rule, jac=None, *, comm=None, args: tuple = (), maxiter: int = 1000, gtol=DEFAULT_GTOL,
                   ftol=None, schedule=None, progress: bool = False, compiled: bool | None = None,
                   history: bool = True) -> BatchResult:
    """:func:`numbaopt.minimize_batch` with the rows of ``X0`` split across the ranks of ``comm``; collective.

    Rank ``r`` runs a contiguous block of rows (sizes differ by at most one; a rank with none waits), with
    no communication while it runs; one gather at the end gives every rank the whole result, bitwise equal
    to the single-process ``minimize_batch``. Every rank passes the same arguments (checked). ``callback`` is
    not offered: it would stop every rank's rows, a collective at every chunk; stop rows with ``gtol``,
    ``ftol`` or ``maxiter``. ``progress`` shows rank 0's rows."""
    require_mpi()
    comm, what = world(comm), "numbaopt.mpi.minimize_batch"
    size, rank = comm.Get_size(), comm.Get_rank()
    err, lines, block = None, [], (0, 0)
    try:
        X = np.asarray(X0)
        if X.ndim != 2:
            raise ValueError(f"X0: shape {X.shape}; expected (B, n): one row of parameters per problem")
        B = X.shape[0]
        counts = [B // size + (r < B % size) for r in range(size)]
        lo = sum(counts[:rank])
        block = (lo, lo + counts[rank])
        if isinstance(rule, (list, tuple)) and len(rule) != B:
            raise ValueError(f"rule: {len(rule)} rules for {B} rows; expected one rule or {B}")
        count("maxiter", maxiter, 0)
        lines = _signature(what, X, rule, jac, args, dict(maxiter=maxiter, gtol=gtol, ftol=ftol, history=history,
                                                          schedule=_schedule_token(schedule), compiled=compiled))
    except (TypeError, ValueError) as e:
        err = e
    agree_signature(comm, err, lines, what)
    jac = _seeded(jac, comm)
    lo, hi = block
    local, out = None, None
    try:
        if hi > lo:
            rules = rule[lo:hi] if isinstance(rule, (list, tuple)) else rule
            p = Problem(fun, X[lo:hi], rules, jac, args, maxiter, gtol, ftol, schedule, "X0", True, history)
            if p.spsa is not None:  # the streams of the global rows: as the single-process run draws them
                p.rng = p.spsa.streams(X.shape[0])[lo:hi]
            run(p, compiled, None, 1, bool(progress) and rank == 0, None)
            finish(p)
            out = batch_result(p, live=False)
    except Exception as e:  # noqa: BLE001 - raised again, on every rank
        local = e
    got = comm.allgather((None if local is None else (type(local).__name__, str(local)), out))
    failed = [(r, e) for r, (e, _) in enumerate(got) if e is not None]
    if failed:
        cls = {"TypeError": TypeError, "ValueError": ValueError}.get(failed[0][1][0], DistributedError)
        raise cls(f"{what} refused on every rank ({len(failed)} of {size} failed): " +
                  "; ".join(f"rank {r}: {m}" for r, (_, m) in failed)) from local
    return _joined([o for _, o in got if o is not None], X.shape[0])


def _joined(parts, B) -> BatchResult:
    """One :class:`BatchResult` of the ranks' blocks, in row order (histories padded with NaN)."""
    width = max(r.history.shape[1] for r in parts) if parts[0].history is not None else 0

    def pad(h):
        return np.concatenate([h, np.full((h.shape[0], width - h.shape[1]), np.nan)], axis=1)

    cat = {k: np.concatenate([getattr(r, k) for r in parts]) for k in
           ("x", "fun", "nit", "nfev", "converged", "status", "grad_norm", "t", "skipped")}
    state = tuple(np.concatenate([r.state[k] for r in parts]) for k in range(len(parts[0].state)))
    res = BatchResult(**cat, message=[m for r in parts for m in r.message], state=state,
                      history=None if parts[0].history is None else np.concatenate([pad(r.history) for r in parts]))
    assert res.x.shape[0] == B
    return res

