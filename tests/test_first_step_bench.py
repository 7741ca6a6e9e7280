"""benchmarks/first_step.py at its smallest: the floor and one-array cases, one cold/warm pair each, as a user
runs it (a subprocess, which spawns the measured fresh processes). What must hold: every case runs in its own
process with its own empty cache, reports the import and each phase, and a warm process compiles nothing."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "first_step.py")


def test_first_step_benchmark_smallest(tmp_path):
    out = tmp_path / "first.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--runs", "1", "--cases", "import_numba,adam_array",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert set(data) == {"import_numba", "adam_array"}
    (cold,), (warm,) = data["adam_array"]["cold"], data["adam_array"]["warm"]
    assert [p[0] for p in cold["phases"]] == ["update_"]
    assert cold["phases"][0][2] > 0, "an empty cache must compile"
    assert warm["phases"][0][2] == 0, "a warm cache must compile nothing"
    assert "adam_array" in proc.stdout and "warm" in proc.stdout


def test_first_step_benchmark_refuses_an_unknown_case():
    proc = subprocess.run([sys.executable, SCRIPT, "--cases", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown case" in proc.stderr
