"""examples/mpi_data_parallel.py under mpiexec (driven by tests/test_mpi.py): the data-parallel, sharded
training it shows equals its single-process reference, on every rank, and it actually trains."""
from __future__ import annotations

import os
import sys

from harness import case, main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
import mpi_data_parallel as example  # noqa: E402


@case("example_matches_single_process")
def _(comm):
    got = example.main(comm, verbose=False)
    assert got["ranks"] == comm.size, got
    assert got["max_abs_diff"] <= 1e-12, got
    assert got["identical_on_ranks"], got
    # the noise is 0.01, so the optimum's loss is about 0.5 * 3 * 1e-4; from the zero model it is far above
    assert got["loss"] < 1e-3 * got["initial_loss"], got


@case("example_refuses_an_unequal_row_split")
def _(comm):
    try:
        example.rows_of(0, 7)
    except ValueError as e:
        assert "equally" in str(e)
    else:
        raise AssertionError("240 rows over 7 ranks were split unequally without a word")


if __name__ == "__main__":
    main()
