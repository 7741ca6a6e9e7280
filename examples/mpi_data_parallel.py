"""Data-parallel least squares with numbaopt.mpi: sharded Adam (ZeRO-1) behind a global-norm clip.

    mpiexec -n 2 python examples/mpi_data_parallel.py      # or -n 1, or plain `python` (one rank)

Every rank holds the whole model (a weight matrix and a bias) and a share of the data rows. Each step, a
rank computes the gradient of the mean squared error on its own rows only; ``numbaopt.update_`` of the
distributed state then averages the ranks' gradients (``Reduce_scatter``), steps this rank's shard of the
optimiser state (``shard=True``: each rank keeps Adam's moments for its part of the parameters only; the
global-norm clip combines its norm across the ranks), and gathers the new parameters into every rank's
model (``Allgatherv``). Every rank has the same number of rows, so the mean of the ranks' mean gradients is
the gradient of the mean over all rows: the run is the single-process run on the full data. Rank 0 checks
that by repeating it in one process with ``numbaopt.update_``.
"""
from __future__ import annotations

import sys

import numpy as np

import numbaopt as no
from numbaopt import mpi as nm

ROWS, N_IN, N_OUT = 240, 8, 3  # 240 rows: an equal share for 1, 2, 3, 4, 5, 6, 8, ... ranks
STEPS = 300


def make_data(seed: int = 0):
    """Rows ``X`` and targets ``Y = X W* + b* + noise``. Every rank makes the same data here and keeps its
    rows; a real run would load only its own rows."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((ROWS, N_IN))
    Y = X @ rng.standard_normal((N_IN, N_OUT)) + rng.standard_normal(N_OUT) + 0.01 * rng.standard_normal((ROWS, N_OUT))
    return X, Y


def rows_of(rank: int, size: int) -> slice:
    """This rank's rows: contiguous and equally many on every rank (so the mean of means is the mean)."""
    if ROWS % size:
        raise ValueError(f"{ROWS} rows do not split equally over {size} ranks; weight each rank's gradient by "
                         "its share of the rows (average=False, and divide by the total row count) instead")
    k = ROWS // size
    return slice(rank * k, (rank + 1) * k)


def initial_model() -> dict:
    return {"W": np.zeros((N_IN, N_OUT)), "b": np.zeros(N_OUT)}


def loss_and_grad(model: dict, X, Y):
    """``0.5 * mean over rows of |x W + b - y|^2`` and its gradient (a dict shaped like the model)."""
    R = X @ model["W"] + model["b"] - Y
    m = X.shape[0]
    return 0.5 * float(np.sum(R * R)) / m, {"W": X.T @ R / m, "b": R.sum(axis=0) / m}


def make_rule(steps: int):
    """Clip the global norm of the (averaged) gradient to 1, then Adam with a cosine-decayed learning rate:
    at a constant rate Adam keeps hopping around the minimum by about the rate, which also amplifies
    last-bit differences (here: the cut array's norm summed in two pieces) from step to step."""
    return no.chain(no.ClipGlobalNorm(1.0), no.Adam(no.schedules.cosine(0.05, steps)))


def main(comm, steps: int = STEPS, verbose: bool = True) -> dict:
    """Train on every rank of ``comm``; returns (on every rank) the final loss, the initial loss, the
    largest difference from the single-process reference, whether it is bitwise, and whether every rank
    ends with bitwise the same model."""
    rank, size = comm.Get_rank(), comm.Get_size()
    X, Y = make_data()
    mine = rows_of(rank, size)
    model = initial_model()
    state = nm.setup(make_rule(steps), model, comm, shard=True)  # every rank calls setup and every step together
    for _ in range(steps):
        _, grads = loss_and_grad(model, X[mine], Y[mine])  # this rank's rows only
        state, model = no.update_(state, model, grads)  # averaged over the ranks, then the sharded step

    # every rank must end with the same parameters (they were gathered from the shards)
    flat = np.concatenate([model["W"].ravel(), model["b"]])
    identical = all(np.array_equal(flat, other) for other in comm.allgather(flat))

    result = None
    if rank == 0:  # the single-process reference: the full data, plain update_, the same rule
        ref = initial_model()
        ref_state = no.setup(make_rule(steps), ref)
        shares = [rows_of(r, size) for r in range(size)]
        for _ in range(steps):
            local = [loss_and_grad(ref, X[s], Y[s])[1] for s in shares]  # each rank's gradient, as it computed it
            mean = {k: np.sum([g[k] for g in local], axis=0) / size for k in ref}  # summed in rank order
            ref_state, ref = no.update_(ref_state, ref, mean)
        diff = max(float(np.max(np.abs(model[k] - ref[k]))) for k in ref)
        result = {"ranks": size, "steps": steps, "loss": loss_and_grad(model, X, Y)[0],
                  "initial_loss": loss_and_grad(initial_model(), X, Y)[0], "max_abs_diff": diff,
                  "bitwise": all(np.array_equal(model[k], ref[k]) for k in ref), "identical_on_ranks": identical}
        if verbose:
            print(f"{size} rank(s), {steps} steps of sharded {make_rule(steps)!r} on {ROWS} rows "
                  f"({ROWS // size} per rank): loss {result['initial_loss']:.4g} -> {result['loss']:.4g}")
            how = "bitwise identical" if result["bitwise"] else (
                "not bitwise, within rounding: W is cut between ranks, so its part of the global norm is "
                "summed in pieces; with 3+ ranks MPI may also add the gradients in another order")
            print(f"single-process reference (full data, numbaopt.update_): max |difference| = {diff:.3g} ({how}); "
                  f"every rank holds the same model: {identical}")
    return comm.bcast(result, root=0)


if __name__ == "__main__":
    try:
        from mpi4py import MPI
    except ImportError:
        sys.exit("this example needs mpi4py and an MPI library: pip install 'numbaopt[mpi]' mpich")
    main(MPI.COMM_WORLD)
