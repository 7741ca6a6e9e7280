"""MPI through mpi4py: the lazy import, and the agreements that make every rank raise the same error.

A distributed step must never hang: a rank that refuses alone would leave the others waiting in a
collective. So everything that can fail differently on different ranks (a rank's gradient of the wrong
shape, a model that differs) is checked locally first, without communicating, and then ONE small collective
(:func:`agree`) tells every rank whether any rank failed; if one did, every rank raises the same error,
naming the rank, before any data moves and before anything is written.
"""
from __future__ import annotations

import zlib

import numpy as np

__all__ = ["require_mpi", "world", "agree", "agree_signature", "DistributedError", "pattern_token"]

_INSTALL = ("numbaopt.mpi needs mpi4py and an MPI library: pip install 'numbaopt[mpi]' mpich "
            "(or mpi4py built against your cluster's MPI)")


class DistributedError(RuntimeError):
    """A collective refusal whose cause is not a ``TypeError``/``ValueError`` on any rank."""


def require_mpi():
    """``mpi4py.MPI``, or an ``ImportError`` saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as e:  # mpi4py absent, or its MPI library missing
        raise ImportError(f"{_INSTALL} ({e})") from None
    return MPI


def world(comm=None):
    """``comm``, or ``MPI.COMM_WORLD``; anything else is a ``TypeError``."""
    MPI = require_mpi()
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm: expected an mpi4py communicator (mpi4py.MPI.Comm), got {type(comm).__name__}")
    return comm


def pattern_token(active) -> int:
    """A 31-bit checksum of which leaves have a gradient (every rank must step the same leaves)."""
    return zlib.crc32(np.packbits(np.asarray(active, dtype=np.bool_)).tobytes()) & 0x7FFFFFFF


def _raise_collective(comm, local: BaseException | None, what: str):
    """Every rank is here and at least one failed: exchange the messages (one object allgather) and raise
    the same error everywhere: the first failing rank's type, every failing rank's message."""
    msgs = comm.allgather(None if local is None else (type(local).__name__, str(local)))
    failed = [(r, m) for r, m in enumerate(msgs) if m is not None]
    kind = failed[0][1][0]
    cls = {"TypeError": TypeError, "ValueError": ValueError, "NotImplementedError": NotImplementedError,
           "StateInUseError": RuntimeError}.get(kind, DistributedError)
    text = "; ".join(f"rank {r}: {m[1]}" for r, m in failed)
    err = cls(f"{what} refused on every rank ({len(failed)} of {comm.Get_size()} failed), nothing was "
              f"written: {text}")
    if local is not None and type(local) is cls:
        raise err from local
    raise err


def agree(comm, local: BaseException | None, token: int, what: str, buf: np.ndarray | None = None) -> None:
    """One ``Allgather`` of two int64 per rank: whether the rank failed, and ``token`` (which leaves it steps).
    Raises the same error on every rank when any failed or the tokens differ."""
    size = comm.Get_size()
    mine = np.array([0 if local is None else 1, token], dtype=np.int64)
    out = np.empty((size, 2), dtype=np.int64) if buf is None else buf
    comm.Allgather(mine, out)
    if out[:, 0].any():
        _raise_collective(comm, local, what)
    if (out[:, 1] != out[0, 1]).any():
        ranks = [r for r in range(size) if out[r, 1] != out[0, 1]]
        raise ValueError(f"{what} refused on every rank, nothing was written: ranks {ranks} pass gradients for "
                         "other leaves than rank 0 (a None gradient, or a frozen leaf, on some ranks only); every "
                         "rank must step the same leaves")


def agree_signature(comm, local: BaseException | None, signature: list, what: str) -> None:
    """At setup: one object ``allgather`` of each rank's error and signature (a list of lines saying what it
    set up: leaves, shapes, dtypes, rule, options). Every rank raises the same error when a rank failed or
    differs from rank 0, naming the first line that differs."""
    got = comm.allgather((None if local is None else (type(local).__name__, str(local)), signature))
    if any(e is not None for e, _ in got):
        _raise_collective(comm, local, what)
    ref = got[0][1]
    for r, (_, sig) in enumerate(got[1:], 1):
        if sig == ref:
            continue
        for a, b in zip(sig, ref):
            if a != b:
                raise ValueError(f"{what} refused on every rank: the ranks disagree: rank {r} has {a}, rank 0 has "
                                 f"{b}; every rank must set up the same model structure, sizes, dtypes and rule")
        raise ValueError(f"{what} refused on every rank: the ranks disagree: rank {r} has {len(sig)} entries "
                         f"(leaves and options), rank 0 has {len(ref)}; every rank must set up the same model "
                         "structure, sizes, dtypes and rule")
