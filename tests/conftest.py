"""What every pytest process of the suite shares (``make test`` runs it on two pytest-xdist workers,
``-n 2 --dist worksteal``; tests/cudasim's process loads this file too).

* One compile of a kernel at a time across processes (:mod:`compile_lock`): two workers, or the simulator suite's
  process beside a worker, that meet the same uncompiled kernel compile it once.
* Under xdist, the longest tests start first (a worker takes a contiguous run of the collection and the other
  steals from its tail), so none of them is left to run alone at the end.
"""
from __future__ import annotations

import compile_lock  # tests/ (this file's folder) is on sys.path

#: the longest tests on a cold kernel cache (CI, 2 cores: the simulator suite ~400 s, the MPI scripts 10-90 s
#: each, the threaded-kernel property ~190 s, ...), in the order they start; a prefix of a node id matches
FIRST = (
    "tests/test_cuda_sim.py::test_simulator_suite",
    "tests/test_mpi.py::",
    "tests/test_rules_axes_compose.py::test_threaded_kernels_equal_the_serial_ones_bitwise",
    "tests/test_layers.py::test_every_module_imports_alone_and_the_package_needs_no_extras",
    "tests/test_rules_axes_compose.py::test_accumgrad_before_axis_and_scalar_state_members_steps_on_the_mean",
    "tests/test_rules_axes_compose.py::test_skip_nonfinite_and_a_refusing_clip_change_nothing",
    "tests/test_benchmarks_smoke.py::",
    "tests/test_transaction.py::test_a_refused_step_changes_nothing",
)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # not an xdist worker: the file order
        return

    def rank(item):
        for i, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(FIRST)

    items[:] = sorted(items, key=rank)  # stable: the file order otherwise, the same on every worker


compile_lock.install()
