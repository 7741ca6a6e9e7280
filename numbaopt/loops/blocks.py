"""The rows of a batch advanced on several threads: ``minimize_batch(..., threads=k)``.

The rows are independent problems, and the compiled driver is ``nogil=True``: it releases the GIL while it
runs. So the rows are split into ``k`` contiguous blocks, and each chunk of iterations is one driver call per
block, the first on the calling thread, the others on a thread pool, all on *views* of the batch's arrays
(parameters, gradients, rule state, counters, history, SPSA streams: everything is indexed by row, so a block
is a slice, and row ``r`` of a block is row ``lo + r`` of the batch; the one row of hyperparameters that rows
sharing a rule share is copied per block when a schedule writes it: ``Problem.block``). Each row sees exactly
the operations it would see with one thread, in the same order, so the result is bitwise the serial one.
Python (callbacks, the progress bar, the gradient check) runs between chunks, after every block has finished.

What it cannot do: speed up an interpreted objective (a Python function holds the GIL; ``minimize_batch``
then runs serially and warns), or balance the load when rows stop at different times (a block whose rows
have all stopped leaves its thread idle; the blocks are fixed, as for ``numbaopt.mpi.minimize_batch``).
The objective must be thread-safe: ``args`` are shared by every row, so a scratch array passed in ``args``
and written by ``fun`` would be written by two threads at once.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["row_blocks", "BlockRunner"]


def row_blocks(B: int, k: int) -> list[tuple[int, int]]:
    """``min(k, B)`` contiguous ``(lo, hi)`` blocks covering ``range(B)``, sizes differing by at most one."""
    k = min(k, B)
    sizes = [B // k + (i < B % k) for i in range(k)]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


class BlockRunner:
    """``advance(nsteps)`` over blocks of rows, one thread per block; ``close()`` ends the pool.

    ``call(args, nsteps)`` runs the driver on one block's arrays (``args``); ``I`` is the batch's counter
    array (column 3: the stopping reason, 0 while a row runs), read to skip blocks that have finished.
    One block (the default, ``threads=1``) is one direct call per chunk: no pool, no extra cost.
    """

    def __init__(self, call, blocks, block_args, I):
        self.call, self.blocks, self.block_args, self.I = call, blocks, block_args, I
        self.pool = None
        if len(blocks) > 1:
            self.pool = ThreadPoolExecutor(max_workers=len(blocks) - 1, thread_name_prefix="numbaopt-rows")

    def __call__(self, nsteps):
        if self.pool is None:
            return self.call(self.block_args[0], nsteps)
        live = [a for (lo, hi), a in zip(self.blocks, self.block_args) if (self.I[lo:hi, 3] == 0).any()]
        if not live:
            return
        futures = [self.pool.submit(self.call, a, nsteps) for a in live[1:]]
        error = None
        try:
            self.call(live[0], nsteps)
        except BaseException as e:  # noqa: BLE001 - raised below, once every block has stopped writing
            error = e
        for f in futures:  # every block finishes its chunk before anything reads the arrays
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 - the first failing block in row order is raised
                error = error if error is not None else e
        if error is not None:
            raise error

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True)
