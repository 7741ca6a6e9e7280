"""Crash safety of ``save``: a writer SIGKILLed at any moment leaves the old checkpoint or the new one, complete;
the temporary file it leaves is removed by the next save or load of that target; a live process's temporary
file never is (concurrent saves from several processes all succeed); the rename is made durable."""
import os
import random
import re
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import numbaopt as no
from numbaopt.persist import temps

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL (POSIX)")

#: a process that, per ``go k``, forks a writer saving versions k*1000+1, k*1000+2, ... of one state to the
#: target until it is killed, and per ``reap pid`` reaps it (a zombie still counts as a live process).
#: Forking from one prepared process keeps each round at milliseconds instead of an interpreter start.
WRITER = r"""
import os, sys
import numpy as np
import numbaopt as no
target, n = sys.argv[1], int(sys.argv[2])
state = no.setup(no.Adam(), np.zeros(n))
print("ready", flush=True)
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == "go":
        pid = os.fork()
        if pid == 0:
            version = int(arg) * 1000
            while True:
                version += 1
                for a in state.arrays:
                    a.fill(version)
                state.counters[:2] = version
                no.save(target, state)
        print(pid, flush=True)
    elif cmd == "reap":
        os.waitpid(int(arg), 0)
        print("reaped", flush=True)
"""


def _env():
    # one BLAS thread: the writer forks, and a forked child must not inherit a half-held thread pool
    return dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _leftovers(directory, target):
    return sorted(n for n in os.listdir(directory) if n.startswith(f".{target.name}.numbaopt-"))


def _tell(proc, line):
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def _version(state) -> int:
    """The version a checkpoint holds, checked to be one whole version: every array and counter agree."""
    v = state.t
    assert state.counters.tolist() == [v, v, 0, 0]
    assert all((a == v).all() for a in state.arrays), "arrays of different versions in one file"
    return v


def test_kills_at_random_moments_leave_a_complete_checkpoint(tmp_path):
    target = tmp_path / "ckpt.npz"
    n = 2_500_000  # Adam's two float64 moments: 40 MB a file
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(n)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert writer.stdout.readline().strip() == "ready"
        mine = no.setup(no.Adam(), np.zeros(n))
        rng = random.Random(13)
        previous, killed_mid_write = None, 0
        for round_ in range(1, 9):
            pid = int(_tell(writer, f"go {round_}"))
            time.sleep(rng.uniform(0.03, 0.45))
            os.kill(pid, signal.SIGKILL)
            assert _tell(writer, f"reap {pid}") == "reaped"
            killed_mid_write += bool(_leftovers(tmp_path, target))
            if target.exists():  # the old file (ours, of the last round) or one of the writer's, complete
                v = _version(no.load(target))
                assert v == previous or (v // 1000 == round_ and v % 1000 >= 1), v
            previous = 10 ** 6 + round_
            for a in mine.arrays:
                a.fill(previous)
            mine.counters[:2] = previous
            no.save(target, mine)
            assert _leftovers(tmp_path, target) == []  # the killed writer's temporary file is gone
            assert _version(no.load(target)) == previous
        assert killed_mid_write >= 1, "no kill landed inside a write: the test proved nothing"
    finally:
        writer.kill()
        writer.wait()


def _temp_of(target, pid):
    """The temporary name process ``pid`` on this host would write ``target`` through."""
    return re.sub(r"-\d+-([0-9a-f]+)\.tmp$", rf"-{pid}-\g<1>.tmp", os.path.basename(temps.temp_path(target)))


def test_only_dead_writers_temporary_files_are_removed(tmp_path):
    target = tmp_path / "s.npz"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        names = {"mine": _temp_of(target, os.getpid()), "sleeper": _temp_of(target, sleeper.pid),
                 "gone": _temp_of(target, gone.pid),
                 "other target": _temp_of(tmp_path / "other.npz", gone.pid),
                 "other host": re.sub(r"numbaopt-[0-9a-f]{8}-", "numbaopt-00000000-", _temp_of(target, gone.pid)),
                 "not ours": f".s.npz.numbaopt-{gone.pid}.tmp"}
        for name in names.values():
            (tmp_path / name).write_bytes(b"partial")
        no.save(target, no.setup(no.Descent(0.1), np.ones(3)))
        left = set(os.listdir(tmp_path))
        assert names["gone"] not in left
        assert {names[k] for k in ("mine", "sleeper", "other target", "other host", "not ours")} <= left
        sleeper.kill()
        sleeper.wait()
        assert no.load(target).shape == (3,)  # load removes them too, once the writer is gone
        assert names["sleeper"] not in set(os.listdir(tmp_path)) and names["mine"] in set(os.listdir(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()


CONCURRENT = r"""
import sys
import numpy as np
import numbaopt as no
state = no.setup(no.Adam(), np.full(int(sys.argv[2]), 2.0))
for _ in range(int(sys.argv[3])):
    no.save(sys.argv[1], state)
print("saved", flush=True)
"""


def test_concurrent_saves_from_two_processes_all_succeed(tmp_path):
    """Each save removes stale temporary files of its target: never the other process's file in progress
    (its rename would fail)."""
    target, n, saves = tmp_path / "s.npz", 500_000, 12
    other = subprocess.Popen([sys.executable, "-c", CONCURRENT, str(target), str(n), str(saves)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    mine = no.setup(no.Adam(), np.full(n, 1.0))
    deadline = time.monotonic() + 60
    while not target.exists() and time.monotonic() < deadline:  # overlap with the other's saves
        time.sleep(0.01)
    for _ in range(saves):
        no.save(target, mine)
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0 and out.strip() == "saved", err
    loaded = no.load(target)
    assert loaded.shape == (n,) and _leftovers(tmp_path, target) == []


def test_file_then_rename_then_directory_are_synced(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        fsync(fd)

    def recording_replace(a, b):
        events.append("replace")
        replace(a, b)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    no.save(tmp_path / "s.npz", no.setup(no.Descent(0.1), np.ones(3)))
    assert events == ["fsync file", "replace", "fsync dir"]


def test_a_directory_that_cannot_be_synced_is_no_error(tmp_path, monkeypatch):
    opened = os.open

    def no_directories(path, flags, *a):
        if os.path.isdir(path):
            raise PermissionError("directories cannot be opened here (as on Windows)")
        return opened(path, flags, *a)

    monkeypatch.setattr(os, "open", no_directories)
    no.save(tmp_path / "s.npz", no.setup(no.Descent(0.1), np.ones(3)))
    assert no.load(tmp_path / "s.npz").shape == (3,)
