# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.corelens-installed
# Modules whose `Examples:` docstrings run as doctests in `make test`.
DOCTESTS := src/corelens/runs src/corelens/registered.py src/corelens/experiments/ablate.py src/corelens/data/paths.py src/corelens/data/jsonfile.py src/corelens/models/hub.py src/corelens/models/loaded.py src/corelens/attention/schema.py src/corelens/experiments/rank.py src/corelens/experiments/scorers \
	src/corelens/experiments/evaluate.py src/corelens/attention/dispatch.py src/corelens/attention/interventions.py \
	src/corelens/attention/streaming.py src/corelens/heads/artifact.py src/corelens/metrics \
	src/corelens/data/sample.py src/corelens/models/prepare.py src/corelens/policies/__init__.py \
	src/corelens/report/curves.py src/corelens/report/heatmap.py src/corelens/report/summary.py src/corelens/commands/preflight.py src/corelens/experiments/hybrid.py \
	src/corelens/policies/graded_budget.py src/corelens/policies/hybrid_attention.py src/corelens/experiments/frontier.py src/corelens/experiments/graded_cells.py \
	src/corelens/attention/kernels/crossover.py src/corelens/attention/kernels/flashstream.py \
	src/corelens/attention/gating.py src/corelens/experiments/gates.py src/corelens/experiments/greedy.py \
	src/corelens/deprecation.py src/corelens/organism/__init__.py src/corelens/lazy.py src/corelens/capture/omega.py \
	src/corelens/experiment_registry.py

.PHONY: demo test check lint format bench clean venv lock

venv: $(STAMP)

# One line per phase, and pip's own progress for the big one (6.4 GB, most of it the CUDA build of torch).
$(STAMP): requirements.lock requirements-extras.lock pyproject.toml
	@echo "[install 1/4] creating $(VENV) and upgrading pip"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	@echo "[install 2/4] the pinned environment of requirements.lock: about 6.4 GB to download and unpack (minutes)"
	$(BIN)/python -m pip install --progress-bar on -r requirements.lock
	@echo "[install 3/4] kvpress and lmms-eval (requirements-extras.lock, without dependencies)"
	$(BIN)/python -m pip install -q --no-deps -r requirements-extras.lock  # kvpress, lmms-eval: see that file
	@echo "[install 4/4] corelens itself, editable"
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

# requirements.lock, generated: pyproject.toml's dependencies (with the dev and multi extras) and requirements.in,
# resolved by uv for Linux x86_64 and Python 3.11 with every wheel's sha256. The pins already in the file are kept;
# `make lock LOCK_FLAGS=--upgrade` moves them to the newest allowed. uv: `pip install uv` in any environment.
UV ?= uv
LOCK_FLAGS ?=
lock:
	$(UV) pip compile pyproject.toml requirements.in --extra dev --extra multi --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --generate-hashes --custom-compile-command "make lock" \
		-o requirements.lock $(LOCK_FLAGS)

demo: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/corelens demo --out runs/demo

# One pytest worker per core (pytest-xdist), each on one thread: most tests are small tensors and
# subprocesses, where a second thread per worker buys less than a second worker.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -p no:cacheprovider -n auto tests \
		--doctest-modules $(DOCTESTS)

# The inner loop: ruff and every test but the end-to-end ones (marker `e2e`); `make test` runs them all, as CI does.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -p no:cacheprovider -n auto -m "not e2e" tests

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/corelens bench ram --tokens 8192 --json benchmarks/results/ram-8192.json

clean:
	rm -rf $(VENV) runs .pytest_cache
