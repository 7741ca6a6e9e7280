"""What every pytest process of the suite shares (``make test`` runs it on two pytest-xdist workers,
``-n 2 --dist worksteal``; tests/cudasim's process loads this file too).

* One compile of a kernel at a time across processes (:mod:`compile_lock`): two workers, or the simulator suite's
  process beside a worker, that meet the same uncompiled kernel compile it once.
* Under xdist, the longest tests start first, spread over the workers (worksteal hands each worker a contiguous
  run of the collection and lets an idle one steal from the tail of another's): none is left to run alone at the
  end, and tests that share kernels mostly run in one process.
"""
from __future__ import annotations

import compile_lock  # tests/ (this file's folder) is on sys.path

#: the longest tests and groups of tests (a prefix of their node ids: an MPI script's cases share its two runs) and
#: about how long they take on a cold kernel cache (seconds, the 2-core CI machine, one worker beside another)
LONG = {
    "tests/test_cuda_sim.py::test_simulator_suite[test_cuda_axes.py]": 210,
    "tests/test_cuda_sim.py::test_simulator_suite[test_cuda_backend.py]": 100,
    "tests/test_cuda_sim.py::test_simulator_suite[test_cuda_param_groups.py]": 35,
    "tests/test_mpi.py::test_mpi[step-": 100,
    "tests/test_mpi.py::test_mpi[loops-": 80,
    "tests/test_mpi.py::test_mpi[checkpoint-": 25,
    "tests/test_rules_axes_compose.py::test_threaded_kernels_equal_the_serial_ones_bitwise": 100,
    "tests/test_rules_axes_compose.py::test_skip_nonfinite_and_a_refusing_clip_change_nothing": 120,
    "tests/test_rules_axes_compose.py::test_accumgrad_before_axis_and_scalar_state_members_steps_on_the_mean": 100,
    "tests/test_layers.py::test_every_module_imports_alone_and_the_package_needs_no_extras": 50,
    "tests/test_benchmarks_smoke.py::": 40,
    "tests/test_transaction.py::test_a_refused_step_changes_nothing": 30,
}


def pytest_collection_modifyitems(config, items):
    """On an xdist worker (every worker orders the same items the same way): the long groups are dealt to one lane
    per worker, longest first, each to the lane with the least so far, and each lane starts the run of items that
    worksteal hands its worker first (worker i: the next ``remaining // (workers - i)``); the rest keep the file
    order. Without xdist, the file order."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if not workers:
        return
    groups, rest = {p: [] for p in LONG}, []
    for item in items:
        prefix = next((p for p in LONG if item.nodeid.startswith(p)), None)
        (groups[prefix] if prefix else rest).append(item)
    lanes, load = [[] for _ in range(workers)], [0] * workers
    for prefix in sorted(LONG, key=LONG.get, reverse=True):
        if groups[prefix]:
            i = load.index(min(load))
            lanes[i] += groups[prefix]
            load[i] += LONG[prefix]
    out = []
    for i, lane in enumerate(lanes):
        take = max(0, (len(items) - len(out)) // (workers - i) - len(lane))
        out += lane + rest[:take]
        rest = rest[take:]
    items[:] = out + rest


compile_lock.install()
