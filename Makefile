# make demo: set up .venv and run the example job (survives three injected faults).
# make test: set up .venv and run lint, type check and the whole test suite.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the tests start thousands of Python processes (each `python -m trainguard`, each rank, each
# xdist worker): with PYTHONDONTWRITEBYTECODE set, as on the CI machine, every one compiled
# trainguard's modules again and every worker rewrote every test module's asserts; their
# bytecode goes to __pycache__/ (ignored by git) instead
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

.PHONY: demo test test-long lint typecheck unit integration bench torture chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the CPU build of torch lies on this machine's disk; an exact pin takes it offline
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[torch,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks scripts

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(PYTEST) -q tests/unit

integration: $(STAMP)
	$(PYTEST) -q tests/integration

# the files that hold tests marked serial (collected alone: collecting all of tests/ takes
# about 20 s; tests/unit/test_makefile.py checks that the list names every such file)
SERIAL_FILES := tests/browser/test_ui.py \
	tests/integration/test_silent_eval.py tests/integration/test_hang.py

# two pytest-xdist workers, a test file at a time on one (tests/conftest.py), the longest
# files first (tests/file_order.py: xdist's own reorder would queue them last), then the
# tests that must run alone (marked serial)
test: lint typecheck
	$(PYTEST) -q -p no:cacheprovider --durations=30 -n 2 --dist loadfile \
		--no-loadscope-reorder -m "not long and not serial" tests
	$(PYTEST) -q -p no:cacheprovider --durations=10 -m "serial and not long" $(SERIAL_FILES)

# the tests marked long: scenarios make test covers another way (the local-backend twins of
# the Slurm tests, real-process twins of unit-tested decisions)
test-long: $(STAMP)
	$(PYTEST) -q -p no:cacheprovider -m long tests

bench: $(STAMP)
	$(BIN)/python benchmarks/recovery_time.py
	$(BIN)/python benchmarks/launcher_overhead.py
	$(BIN)/python benchmarks/checkpoint_blocking.py
	$(BIN)/python benchmarks/rescheduling.py
	$(BIN)/python benchmarks/recovery_rungs.py
	$(BIN)/python benchmarks/ui_latency.py
	$(BIN)/python benchmarks/hang_detector_scale.py

clean:
	rm -rf $(VENV) trainguard-runs .mypy_cache .ruff_cache .pytest_cache

# the long runs of the kill tests; `make test` runs each with a few kills
torture: $(STAMP)
	TG_CRASH_KILLS=200 $(BIN)/pytest -q -p no:cacheprovider tests/checkpoint/test_crash_consistency.py -k random
	$(BIN)/python -m tests.torture.memory_kills --kills 200

# ten minutes of a 2-node job with a spare under a seeded stream of real faults (needs root);
# `make test` runs a short variant (tests/chaos/test_chaos.py); docs/chaos.md
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run --minutes 10 --seed 1 --fault-rate 1
