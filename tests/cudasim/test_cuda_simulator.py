"""The simulator itself, as this suite runs it (``conftest.py``): a block's threads share one shared array per
call site even when a thread is switched out while the array is created."""
import time

import numpy as np
from numba import cuda

TPB = 16


@cuda.jit
def _block_sum(out):
    tid = cuda.threadIdx.x
    sh = cuda.shared.array(TPB, np.float64)
    sh[tid] = tid + 1.0
    cuda.syncthreads()
    s = TPB // 2
    while s > 0:
        if tid < s:
            sh[tid] = sh[tid] + sh[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        out[0] = sh[0]


def test_shared_arrays_are_one_per_block_when_threads_switch_while_creating_them(monkeypatch):
    empty = np.empty

    def yielding_empty(*args, **kwargs):  # hands the GIL to the block's other threads mid-creation
        time.sleep(1e-3)
        return empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", yielding_empty)
    sums = []
    for _ in range(8):
        out = np.zeros(1)
        _block_sum[1, TPB](out)
        sums.append(out[0])
    assert sums == [TPB * (TPB + 1) / 2] * 8
