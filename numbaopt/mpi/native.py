"""``MPI_Allgather`` callable from ``@njit`` code, through ctypes on the MPI library mpi4py loaded.

The compiled loops (:mod:`numbaopt.mpi.loops`) reduce the objective's loss and gradient across ranks at every
evaluation without returning to Python: the generated objective wrapper calls the C function directly.
Numba calls a ctypes function with declared ``argtypes`` from nopython code; the communicator and datatype
are passed as their C handles (``MPI._handleof``), which are ``int`` in MPICH's ABI and pointers in Open
MPI's and the MPI 5 ABI (the handle's size tells which).

Why not numba-mpi (the PyPI package that wraps MPI for Numba): it is GPL-3.0 (numbaopt is MIT), and its
collectives are bound to ``COMM_WORLD``, while numbaopt takes any communicator. What we need is one
function, a dozen lines.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["allgather", "handles"]


def _loaded_library() -> str | None:
    """The path of the MPI library in this process (mpi4py loaded it), from the memory map."""
    try:
        with open("/proc/self/maps") as f:
            paths = [line.split()[-1] for line in f if "/libmpi" in line or "/libmpich" in line]
    except OSError:  # not Linux
        paths = []
    return paths[0] if paths else ctypes.util.find_library("mpi")


@functools.cache
def allgather():
    """The ctypes function ``MPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm)``,
    or an ``ImportError`` saying why it cannot be had."""
    from .comm import require_mpi
    MPI = require_mpi()
    path = _loaded_library()
    if path is None:
        raise ImportError("numbaopt.mpi: cannot find the MPI library mpi4py uses (looked for libmpi in this "
                          "process); pass compiled=False to reduce through mpi4py in Python instead")
    lib = ctypes.CDLL(path)
    handle = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
    fn = lib.MPI_Allgather
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, handle, ctypes.c_void_p, ctypes.c_int, handle, handle]
    return fn


def handles(comm) -> tuple[int, int]:
    """``(communicator, MPI_DOUBLE)`` as the C handles the compiled wrapper passes."""
    from .comm import require_mpi
    MPI = require_mpi()
    return int(MPI._handleof(comm)), int(MPI._handleof(MPI.DOUBLE))
