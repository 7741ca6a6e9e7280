# numbaopt: `make demo` runs the main example, `make test` the test suite. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-cudasim lint bench bench-continuous bench-compare bench-pipeline docs clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch's CPU wheel, pinned: an open range would fetch a multi-GB CUDA build
	$(BIN)/python -m pip install -q "torch==2.13.0"
	# MPI from PyPI (no system MPI assumed): the MPICH library wheel, then mpi4py through the mpi extra
	$(BIN)/python -m pip install -q "mpich>=4.2"
	$(BIN)/python -m pip install -q -e ".[dev,progress,ref,plot,torch,jax,docs,typing,mpi,pennylane,muon]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# the suite on TEST_WORKERS pytest-xdist processes (tests/conftest.py starts the longest tests first; worksteal
# hands each worker a contiguous run of the collection, so tests that share kernels mostly share a process, and
# balances the end); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

# PYTHONDONTWRITEBYTECODE emptied: the suite starts hundreds of Python processes (MPI ranks, the simulator suite,
# a fresh import per module), each of which would otherwise compile numbaopt's sources again (~0.2 s apiece)
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q $(XDIST) --durations=25 tests

test-cudasim: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 $(BIN)/python -m pytest -q tests/cudasim

lint: $(STAMP)
	$(BIN)/ruff check numbaopt tests benchmarks examples asv_benchmarks

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" tests

# asv (docs/performance.md, "Tracking a regression"). `make bench` runs the suites in .venv, i.e. on the
# working tree, and saves the results as the current commit's (asv saves nothing from an existing
# environment without --set-commit-hash) in asv_benchmarks/.asv/results. `make bench-continuous` builds
# BASE and HEAD into asv environments and fails if a benchmark got slower by more than FACTOR.
# ASV_ARGS adds options to both (e.g. ASV_ARGS="--quick -b bench_core").
BASE ?= main
FACTOR ?= 1.2
ASV_ARGS ?=
ASV := cd asv_benchmarks && ../$(BIN)/asv

bench: $(STAMP)
	$(ASV) machine --yes >/dev/null
	$(ASV) run --show-stderr --environment existing:../$(BIN)/python --set-commit-hash "$$(git rev-parse HEAD)" $(ASV_ARGS)

bench-continuous: $(STAMP)
	$(ASV) machine --yes >/dev/null
	$(ASV) continuous --show-stderr --factor $(FACTOR) $(ASV_ARGS) $(BASE) HEAD

bench-compare: $(STAMP)
	NUMBA_NUM_THREADS=1 $(BIN)/python benchmarks/compare.py

bench-pipeline: $(STAMP)
	NUMBA_NUM_THREADS=1 $(BIN)/python benchmarks/pipeline.py

# docs/rules.md from the rule definitions (through a temporary file: a failing generator leaves it intact),
# then the site into site/; --strict: any warning (a broken link, a docstring griffe cannot parse) fails
docs: $(STAMP)
	$(BIN)/python -m numbaopt.docs > docs/rules.md.tmp && mv docs/rules.md.tmp docs/rules.md
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

.PHONY: docs-serve
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
