"""benchmarks/vqe_vs_pennylane.py at its smallest size (6 qubits, 1 layer, a loose target, a tiny budget).

It runs as a subprocess, as a user runs it: the benchmark pins NUMBA_NUM_THREADS=1 before numba is imported,
which an already-imported numba in this process would refuse. What must hold for the comparison to mean
anything: both sides agree at the start (checked inside, to 1e-12), take the same iterations to the same
error (the same optimiser), reach the target, and the JSON, the markdown table and the plot come out.
"""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "vqe_vs_pennylane.py")


def test_vqe_vs_pennylane_smallest(tmp_path):
    pytest.importorskip("pennylane", reason="the benchmark compares with PennyLane")
    pytest.importorskip("matplotlib", reason="the benchmark's --plot needs matplotlib")
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    cmd = [sys.executable, SCRIPT, "--qubits", "6", "--layers", "1", "--target", "0.05", "--budget", "20",
           "--repeat", "1", "--check-steps", "3", "--maxiter", "2000", "--pl-device", "lightning.qubit:adjoint",
           "--json", str(out_json), "--plot", str(out_png)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| qubits | row | side |" in proc.stdout and "NUMBA_NUM_THREADS=1" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["meta"]["NUMBA_NUM_THREADS"] == "1" and data["meta"]["OMP_NUM_THREADS"] == "1"
    rows = {r["row"]: r for r in data["results"]}
    assert set(rows) == {"adam", "qng", "rotosolve"} and rows["adam"]["available"]
    for name, r in rows.items():
        if not r["available"]:
            assert f"not available ({r['why']})" in proc.stdout
            continue
        ours, theirs = r["numbaopt"], r["pennylane"]
        assert r["agreement_at_x0"]["energy"] <= 1e-12 and r["agreement_at_x0"]["gradient"] <= 1e-12
        assert r["max_dtheta_after_check"] < 1e-8, name
        assert ours["reached"] and theirs["reached"], name
        assert ours["iterations"] == theirs["iterations"], name
        assert abs(ours["final_error"] - theirs["final_error"]) < 1e-9, name
        assert 0 < ours["final_error"] <= 0.05 and r["ratio"] > 0 and r["ratio_is"] == "exact"
        assert len(ours["trace"]) >= 2 and len(theirs["trace"]) >= 1
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_vqe_vs_pennylane_full_metric_row_projects_pennylanes_time(tmp_path):
    """The qng-full row (the configuration that reaches 1e-3 at 12 qubits): the full metrics agree at x0, both
    sides take the same iterates, and where PennyLane's run stops at the budget its time to the target is
    projected from its seconds per step and numbaopt's step count."""
    pytest.importorskip("pennylane", reason="the benchmark compares with PennyLane")
    out_json = tmp_path / "bench.json"
    cmd = [sys.executable, SCRIPT, "--qubits", "4", "--layers", "2", "--rows", "qng-full", "--target", "1e-3",
           "--budget", "0.3", "--repeat", "1", "--probe-qubits", "3", "--json", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # every full-metric configuration is probed at 3 qubits, and the fastest of them is the one kept (which one
    # that is depends on the machine's load: the test does not say)
    probes = {(m[1], m[2]): float(m[3]) for m in
              re.finditer(r"full metric on PennyLane, 3 qubits: (\S+) (\S+) ([0-9.]+) s", proc.stdout)}
    assert set(probes) == {("lightning.qubit", "hadamard"), ("default.qubit", "hadamard"),
                           ("default.qubit", "adjoint_metric_tensor")}
    (r,) = json.loads(out_json.read_text())["results"]
    dev, method = re.fullmatch(r"(\S+):adjoint, metric (\S+)", r["pennylane_config"]).groups()
    assert r["row"] == "qng-full" and probes[(dev, method)] == min(probes.values())
    assert r["agreement_at_x0"]["metric"] <= 1e-12 and r["max_dtheta_after_check"] < 1e-8
    ours, theirs = r["numbaopt"], r["pennylane"]
    assert ours["reached"] and not theirs["reached"] and r["ratio_is"] == "lower bound"
    assert theirs["projected_seconds"] == pytest.approx(theirs["seconds_per_step"] * (ours["iterations"] + 1))
    assert f"projected {theirs['projected_seconds']:.0f} s" in proc.stdout


def test_suite_compiles_counts_a_compile_in_a_pytest_run(tmp_path):
    """benchmarks/suite_compiles.py as a plugin of a pytest run of one test that compiles one function (and loads
    nothing from a cache): the run leaves a file, and the summary counts that function once."""
    test = tmp_path / "test_one.py"
    test.write_text("from numba import njit\n\n\ndef test_compiles():\n    assert njit(lambda a: a + 1)(1) == 2\n")
    out = tmp_path / "counts"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "benchmarks"), PYTEST_ADDOPTS="-p suite_compiles",
               NUMBAOPT_SUITE_COMPILES=str(out))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    s = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "suite_compiles.py"), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stderr
    assert s.stdout.startswith("1 processes; outermost compiles: 1,"), s.stdout
    assert "| `test_one:test_compiles.<locals>.<lambda>` | 1 |" in s.stdout, s.stdout
    assert "| `test_one.py::test_compiles` | 1 |" in s.stdout, s.stdout
