"""A tiny harness for tests that run under ``mpiexec -n N`` (driven by tests/test_mpi.py).

A script registers cases with ``@case("name")`` and calls :func:`main`. Every rank runs every case in
order (collectives need every rank); a case passes when it returns on every rank without raising. Rank 0
writes ``{name: {"ok": bool, "ranks": {rank: message}}}`` as JSON to the file in ``$NUMBAOPT_MPI_RESULTS``.
``N`` limits: ``@case("name", sizes=(2,))`` runs only at those communicator sizes.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

try:  # tests/compile_lock.py (tests/test_mpi.py puts tests/ on the path): the ranks compile each kernel once
    import compile_lock
except ImportError:
    pass
else:
    compile_lock.install()

_CASES: list = []


def case(name: str, sizes: tuple | None = None):
    def deco(fn):
        _CASES.append((name, fn, sizes))
        return fn
    return deco


def main() -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    results = {}
    for name, fn, sizes in _CASES:
        if sizes is not None and comm.size not in sizes:
            continue
        try:
            fn(comm)
            msg = None
        except BaseException as e:  # noqa: BLE001 - reported, then the next case
            msg = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        msgs = comm.gather(msg, root=0)
        if comm.rank == 0:
            results[name] = {"ok": all(m is None for m in msgs),
                             "ranks": {r: m for r, m in enumerate(msgs) if m is not None}}
            sys.stdout.write(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'}\n")
            sys.stdout.flush()
    if comm.rank == 0:
        out = os.environ.get("NUMBAOPT_MPI_RESULTS")
        if out:
            with open(out, "w") as f:
                json.dump(results, f)
