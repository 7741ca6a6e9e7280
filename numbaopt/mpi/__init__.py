"""Beyond one machine: data-parallel steps and ZeRO-1 sharded optimiser state over MPI (``numbaopt[mpi]``).

>>> from mpi4py import MPI                                          # doctest: +SKIP
>>> state = numbaopt.mpi.setup(numbaopt.Adam(1e-3), model, MPI.COMM_WORLD, shard=True)   # doctest: +SKIP
>>> state, model = numbaopt.update_(state, model, local_grads)      # doctest: +SKIP

Every rank calls the same functions in the same order with its own gradients. ``shard=False``: every rank
holds the whole optimiser state and the gradients are averaged by one ``Allreduce`` per dtype;
``shard=True`` (ZeRO-1): each rank holds the state of its contiguous shard of the flattened parameters
only, and the step is ``Reduce_scatter`` + a step of the shard + ``Allgatherv``. Reductions across the
tree (global-norm clip, non-finite skip, trust ratios) are combined across the ranks (see
:mod:`numbaopt.mpi.reduce` for when they are bitwise). A rank whose input is wrong makes every rank raise
the same error, with nothing written anywhere. See docs/mpi.md.

mpi4py is imported by :func:`setup`, never by ``import numbaopt``.
"""
from .checkpoint import load, save
from .loops import minimize, minimize_batch
from .comm import DistributedError
from .shards import FlatLayout, Piece
from .state import DistributedState, setup_distributed as setup


def update_(state, model, grads):
    """:func:`numbaopt.update_` of a :class:`DistributedState` (the same function)."""
    from ..api import update_ as _update_
    return _update_(state, model, grads)


def update(state, model, grads):
    """:func:`numbaopt.update` of a :class:`DistributedState` (the same function)."""
    from ..api import update as _update
    return _update(state, model, grads)


__all__ = ["setup", "update", "update_", "save", "load", "minimize", "minimize_batch",
           "DistributedState", "DistributedError", "FlatLayout", "Piece"]
