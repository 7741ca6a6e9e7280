# numbaopt: `make demo` runs the main example, `make test` the test suite. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-cudasim lint bench bench-compare bench-pipeline docs clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch's CPU wheel, pinned: an open range would fetch a multi-GB CUDA build
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev,progress,ref,plot,torch,jax,docs,typing]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

test-cudasim: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 $(BIN)/python -m pytest -q tests/cudasim

lint: $(STAMP)
	$(BIN)/ruff check numbaopt tests benchmarks examples asv_benchmarks

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

bench: $(STAMP)
	cd asv_benchmarks && ../$(BIN)/asv machine --yes >/dev/null && ../$(BIN)/asv run --quick --show-stderr --environment existing:../$(BIN)/python

bench-compare: $(STAMP)
	NUMBA_NUM_THREADS=1 $(BIN)/python benchmarks/compare.py

bench-pipeline: $(STAMP)
	NUMBA_NUM_THREADS=1 $(BIN)/python benchmarks/pipeline.py

docs: $(STAMP)
	$(BIN)/python -m numbaopt.docs > docs/rules.md

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
