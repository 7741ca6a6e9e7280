"""Distributed steps (numbaopt.mpi) against the plain single-process step, and where their time goes.

    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/mpi_step.py [--json PATH] [--sizes 1M 16M] [--quick]
    .venv/bin/mpiexec -n 1 .venv/bin/python benchmarks/mpi_step.py

The model is a dict of four float32 arrays (3/8, 3/8, 1/4 - 1024 and 1024 of the N elements), so that
with ``balance="elements"`` the cut between two ranks falls inside ``w1``: one array is split between
ranks. Each rank has its own gradients (the distributed step averages them). Timed per step, for
N = 1M and 16M float32 parameters (``NUMBA_NUM_THREADS=1`` unless set):

* ``update_`` Adam and clip + Adam: the plain single-process step of the whole model (the 1-rank
  baseline; under ``-n p`` every rank runs it at once, so it sees the same memory-bandwidth contention);
* ``update_`` Adam on N/p elements: the compute a rank's shard needs;
* replicated (``shard=False``) Adam; sharded ZeRO-1 (``shard=True``) Adam; sharded
  ``chain(ClipGlobalNorm, Adam)`` (adds one cross-rank reduction: one small Allgather);
* the communication alone: the ``Allreduce`` of the N-element gradient buffer (replicated), the
  ``Reduce_scatter`` and the ``Allgatherv`` of the same buffer with the sharded layout's counts (sharded),
  and one N-element float32 copy (the step packs the gradients into the buffer and, sharded, writes the
  gathered parameters back into the model: one or two such copies per step); run alone, their buffers
  stay hot in cache, so at 1M they are lower bounds;
* inside each distributed step: the time its rank spent in collectives (a communicator subclass times
  them, waiting for the other ranks included) and the rest (packing, averaging, kernels, copies).

A time is the median over rounds (after warm-up) of the slowest rank's time of one step. On one machine the
ranks share its cores and memory bandwidth: the numbers show the overheads of the distributed path, not
how it scales on a cluster. Rank 0 prints markdown tables;
``--json PATH`` also writes every number.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # before Numba is imported

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numbaopt as no  # noqa: E402
from numbaopt import mpi as nm  # noqa: E402
from numbaopt.mpi.comm import require_mpi  # noqa: E402

SIZES = {"1M": 1 << 20, "16M": 1 << 24}
F32 = np.float32


def make_model(n: int) -> dict:
    """Four float32 arrays adding up to ``n`` (a multiple of 4096): w1 spans [3n/8, 6n/8), so the cut
    between two ranks (at n/2) falls inside it."""
    rng = np.random.default_rng(0)
    cols = 256
    shapes = {"embed": (3 * n // 8 // cols, cols), "w1": (3 * n // 8 // cols, cols),
              "w2": ((n // 4 - 1024) // cols, cols), "bias": (1024,)}
    model = {k: rng.standard_normal(s, dtype=F32) for k, s in shapes.items()}
    assert sum(a.size for a in model.values()) == n
    return model


def make_grads(model: dict, rank: int) -> dict:
    rng = np.random.default_rng(1 + rank)
    return {k: (rng.standard_normal(a.shape, dtype=F32) * F32(1e-3)) for k, a in model.items()}


def adam():
    return no.Adam(1e-4)


def clip_adam():
    return no.chain(no.ClipGlobalNorm(1.0), no.Adam(1e-4))


def timed_comm(MPI):
    """A communicator class that adds the seconds its rank spends in the collectives a step calls
    (``spent``), waiting for the other ranks included: the step's communication, measured inside it."""
    class TimedComm(MPI.Intracomm):
        spent = 0.0

        def _timed(self, name, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return getattr(super(), name)(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - t0

    for name in ("Allgather", "Allgatherv", "Allreduce", "Reduce_scatter"):
        setattr(TimedComm, name, lambda self, *a, _n=name, **k: self._timed(_n, *a, **k))
    return TimedComm


def timed(comm, MPI, fn, rounds: int, warmup: int, probe=None) -> tuple[float, float | None]:
    """``(step, collectives)``: the median over ``rounds`` of the slowest rank's time of one call of ``fn``
    (seconds), and that rank's time in ``probe``'s collectives in the same round (None without a probe)."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(rounds):
        comm.Barrier()
        if probe is not None:
            probe.spent = 0.0
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        runs.append(max(comm.allgather((dt, None if probe is None else probe.spent)), key=lambda r: r[0]))
    runs.sort(key=lambda r: r[0])
    return runs[len(runs) // 2]


def state_nbytes(state) -> int:
    """Bytes of a single-process state tree's state arrays."""
    return int(sum(a.nbytes for _, leaf in state.leaves() for a in leaf.arrays))


def bench_size(comm, MPI, n: int, rounds: int, warmup: int) -> dict:
    """Every number for ``n`` parameters: ``times`` (row: seconds per step), ``collectives`` (distributed row:
    seconds of it spent in collectives) and ``memory`` (config: state and buffer bytes per rank)."""
    p = comm.Get_size()
    model = make_model(n)
    grads = make_grads(model, comm.Get_rank())
    times, inside, mem = {}, {}, {}

    def time_step(state, x, g, probe=None):
        box = [state]

        def one():
            box[0], _ = no.update_(box[0], x, g)
        return timed(comm, MPI, one, rounds, warmup, probe)

    for label, rule in (("update_ Adam (single process, whole model)", adam),
                        ("update_ clip + Adam (single process, whole model)", clip_adam)):
        st = no.setup(rule(), model)
        times[label] = time_step(st, model, grads)[0]
        mem.setdefault("single process", {"state_bytes": state_nbytes(st), "buffer_bytes": 0})
    shard_n = -(-n // p)
    x_shard = np.random.default_rng(5).standard_normal(shard_n, dtype=F32)
    g_shard = np.random.default_rng(6).standard_normal(shard_n, dtype=F32) * F32(1e-3)
    times["update_ Adam on N/p elements (a shard's compute)"] = time_step(no.setup(adam(), x_shard), x_shard,
                                                                         g_shard)[0]
    del x_shard, g_shard

    probe = timed_comm(MPI)(comm)  # the same communicator, its collectives timed
    for label, rule, shard, key in (("replicated (shard=False) Adam", adam, False, "replicated"),
                                    ("sharded ZeRO-1 (shard=True) Adam", adam, True, "sharded"),
                                    ("sharded clip + Adam", clip_adam, True, None)):
        st = nm.setup(rule(), model, probe, shard=shard)
        if key:
            mem[key] = {"state_bytes": st.state_bytes, "buffer_bytes": st.buffer_bytes}
        if shard:
            layout = st.layout  # the sharded layout's counts, for the communication-only timing
        times[label], inside[label] = time_step(st, model, grads, probe)
        del st

    # the communication alone, on buffers like the step's own (hot in cache: a lower bound at 1M)
    buf = np.concatenate([g.reshape(-1) for g in grads.values()])
    times["comm alone: Allreduce of the N-element gradient buffer"] = timed(
        comm, MPI, lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), rounds, warmup)[0]
    counts, displs = layout.counts[np.dtype(F32)].tolist(), layout.displs[np.dtype(F32)].tolist()
    recv = np.empty(counts[comm.Get_rank()], dtype=F32)
    xbuf = np.concatenate([x.reshape(-1) for x in model.values()])

    times["comm alone: Reduce_scatter of it (sharded layout)"] = timed(
        comm, MPI, lambda: comm.Reduce_scatter(buf, recv, recvcounts=counts, op=MPI.SUM), rounds, warmup)[0]
    times["comm alone: Allgatherv of the N parameters (sharded layout)"] = timed(
        comm, MPI, lambda: comm.Allgatherv(MPI.IN_PLACE, [xbuf, (counts, displs)]), rounds, warmup)[0]
    dst = np.empty_like(buf)
    times["one copy of N float32 (packing: 1 a step; sharded write-back: +1)"] = timed(
        comm, MPI, lambda: np.copyto(dst, buf), rounds, warmup)[0]
    return {"n": n, "rounds": rounds, "times": times, "collectives": inside, "memory": mem}


def mib(b: int) -> str:
    return f"{b / 2**20:.1f} MiB"


def report(results: dict, p: int) -> str:
    names = list(results)
    rows = list(results[names[0]]["times"])
    base = "update_ Adam (single process, whole model)"
    out = ["| step (per rank, slowest rank) | " + " | ".join(f"{k}: ms | x update_" for k in names) + " |",
           "|---|" + "---:|---:|" * len(names)]
    for r in rows:
        cells = []
        for k in names:
            t = results[k]["times"][r]
            cells.append(f"{1e3 * t:.2f} | {t / results[k]['times'][base]:.2f}")
        out.append(f"| {r} | " + " | ".join(cells) + " |")
    out += ["", "| inside a distributed step (slowest rank) | " + " | ".join(
        f"{k}: step ms | collectives ms | rest ms" for k in names) + " |", "|---|" + "---:|---:|---:|" * len(names)]
    for r in results[names[0]]["collectives"]:
        cells = [f"{1e3 * results[k]['times'][r]:.2f} | {1e3 * results[k]['collectives'][r]:.2f} | "
                 f"{1e3 * (results[k]['times'][r] - results[k]['collectives'][r]):.2f}" for k in names]
        out.append(f"| {r} | " + " | ".join(cells) + " |")
    out += ["", f"| memory per rank ({p} ranks) | " + " | ".join(f"{k}: state | {k}: buffers" for k in names) + " |",
            "|---|" + "---:|---:|" * len(names)]
    for cfg in ("single process", "replicated", "sharded"):
        cells = [f"{mib(results[k]['memory'][cfg]['state_bytes'])} | {mib(results[k]['memory'][cfg]['buffer_bytes'])}"
                 for k in names]
        out.append(f"| {cfg} | " + " | ".join(cells) + " |")
    out += ["", "state: Adam's two moments (state.state_bytes); buffers: state.buffer_bytes, the reused flat buffers "
            "(replicated: the N-element gradient buffer; sharded: one N-element buffer, the gradients and then "
            "the gathered parameters, and the N/p-element reduced shard). Not counted: the model and the "
            "gradients, N each on every rank."]
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the numbers to this file (rank 0)")
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    args = ap.parse_args(argv)
    MPI = require_mpi()
    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    t_start, load = time.perf_counter(), os.getloadavg()[0]
    results = {}
    for name in args.sizes:
        n = SIZES[name]
        # many rounds: on a small shared machine other processes make single steps noisy
        rounds = (5 if args.quick else 41) if n <= 1 << 20 else (3 if args.quick else 15)
        results[name] = bench_size(comm, MPI, n, rounds, warmup=2)
    if rank != 0:
        return
    cores = os.cpu_count()
    note = (f"{p} rank(s) on one machine with {cores} cores ({platform.processor() or platform.machine()}), "
            f"NUMBA_NUM_THREADS={os.environ['NUMBA_NUM_THREADS']}, {' '.join(MPI.Get_library_version().split()[:3])}, "
            f"load average {load:.2f} at the start. "
            "The ranks share the machine's cores and memory bandwidth: the numbers show the overheads of the "
            "distributed path, not cluster scaling. Times: median over rounds (after 2 warm-up steps) of the "
            "slowest rank's time of one step.")
    print(f"numbaopt.mpi step benchmark: {note}\n")
    print(report(results, p))
    print(f"\n(total {time.perf_counter() - t_start:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": p, "cores": cores, "load_average": load, "note": note, "command": " ".join(sys.argv),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
