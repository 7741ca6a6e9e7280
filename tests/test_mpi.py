"""The MPI tests: every script in tests/mpi runs under ``mpiexec -n 2`` and ``-n 3`` (uneven shards), once
each, and each of its cases is one test here. Skipped, saying why, where mpi4py or mpiexec is missing
(``make test`` installs mpich and mpi4py from PyPI into .venv, so CI runs them)."""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "tests", "mpi")
SIZES = (2, 3)
#: a hang (a collective some rank never reached) fails the script's cases instead of stalling the suite
TIMEOUT_S = 600


def _mpiexec():
    cand = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return cand if os.path.exists(cand) else shutil.which("mpiexec")


def _why_not():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'numbaopt[mpi]' mpich; make test installs both)"
    if _mpiexec() is None:
        return "no mpiexec found (pip install mpich puts one beside the Python interpreter)"
    return None


WHY = _why_not()


def _scripts():
    return sorted(f for f in os.listdir(HERE) if f.startswith("case_") and f.endswith(".py"))


def _cases(script):
    text = open(os.path.join(HERE, script)).read()
    out = []
    for m in re.finditer(r'@case\("([^"]+)"(?:,\s*sizes=\(([\d, ]+)\))?\)', text):
        sizes = tuple(int(v) for v in m.group(2).replace(" ", "").split(",") if v) if m.group(2) else SIZES
        out += [(m.group(1), n) for n in SIZES if n in sizes]
    return out


@pytest.fixture(scope="session")
def shared_dir(request, tmp_path_factory):
    """Where a script's run is kept for every process of this test run: on a pytest-xdist worker the folder above
    the worker's own (one per run), so a script runs once whichever workers its cases land on."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@functools.cache
def _shared_run(shared_dir, script, n):
    """``_run(script, n)``, once per test run: the first process to ask runs it, holding a lock that the others
    wait on, and leaves the outcome for them."""
    import fcntl

    out = os.path.join(shared_dir, f"mpi-{script[:-3]}-n{n}.json")
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(out):
            with open(out) as f:
                return tuple(json.load(f))
        got = _run(script, n)
        with open(out + ".tmp", "w") as f:
            json.dump(got, f)
        os.replace(out + ".tmp", out)
        return got


def _run(script, n):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    # tests/ on the path too: the harness serialises the ranks' compiles (tests/compile_lock.py)
    env = dict(os.environ, NUMBAOPT_MPI_RESULTS=path, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.path.dirname(HERE)]),
               OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    cmd = [_mpiexec(), "-n", str(n), sys.executable, os.path.join(HERE, script)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=TIMEOUT_S)
        log = r.stdout[-4000:] + r.stderr[-4000:]
        try:
            with open(path) as f:
                return json.load(f), log
        except (OSError, ValueError):
            return None, f"exit {r.returncode}: {log}"
    except subprocess.TimeoutExpired as e:
        return None, f"timed out after {TIMEOUT_S} s (a hang?): {(e.stdout or '')[-3000:]}"
    finally:
        os.unlink(path)


PARAMS = [pytest.param(s, name, n, id=f"{s[5:-3]}-{name}-n{n}") for s in _scripts() for name, n in _cases(s)]


@pytest.mark.skipif(WHY is not None, reason=str(WHY))
@pytest.mark.parametrize("script,name,n", PARAMS)
def test_mpi(script, name, n, shared_dir):
    results, log = _shared_run(str(shared_dir), script, n)
    assert results is not None, log
    assert name in results, f"case {name!r} did not run at n={n}: {log}"
    got = results[name]
    assert got["ok"], "\n".join(f"rank {r}: {m}" for r, m in got["ranks"].items())
