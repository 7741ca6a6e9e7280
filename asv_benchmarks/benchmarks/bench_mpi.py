"""asv: the cost of numbaopt.mpi's distributed step itself, on one rank (``MPI.COMM_SELF``), next to the
plain ``update_`` of the same model.

On one rank the collectives move no data between processes, so the difference from ``update_`` is the
distributed path's own overhead: the agreement ``Allgather``, packing the gradients into the flat buffer,
and (sharded) copying the shard into the parameter buffer, the ``Allgatherv`` and the write-back into the
model. Adam, float32, a model of two arrays (9/10 and 1/10 of ``n``). ``setup`` raises
``NotImplementedError`` (asv skips the benchmark) when mpi4py is not installed. The multi-rank numbers,
with the communication alone, come from ``benchmarks/mpi_step.py`` under ``mpiexec``.
"""
import numpy as np

import numbaopt as no


class MpiStepSelf:
    params = ([1000, 1_000_000], ["update_", "replicated", "sharded"])
    param_names = ["n", "path"]

    def setup(self, n, path):
        try:
            from mpi4py import MPI
        except ImportError:
            raise NotImplementedError("mpi4py is not installed (pip install 'numbaopt[mpi]' mpich)") from None
        from numbaopt import mpi as nm

        rng = np.random.default_rng(0)
        self.model = {"w": rng.standard_normal((9 * n // 100, 10), dtype=np.float32),
                      "b": rng.standard_normal(n // 10, dtype=np.float32)}
        self.grads = {k: rng.standard_normal(a.shape, dtype=np.float32) * np.float32(1e-3)
                      for k, a in self.model.items()}
        rule = no.Adam(1e-4)
        if path == "update_":
            self.state = no.setup(rule, self.model)
        else:
            self.state = nm.setup(rule, self.model, MPI.COMM_SELF, shard=(path == "sharded"))
        self.time_step()  # compile (or load the kernels from the cache) outside the timing

    def time_step(self, *params):
        self.state, _ = no.update_(self.state, self.model, self.grads)
