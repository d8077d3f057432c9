# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.corelens-installed
# Modules whose `Examples:` docstrings run as doctests in `make test`.
DOCTESTS := src/corelens/runs src/corelens/data/paths.py src/corelens/models/hub.py src/corelens/models/loaded.py src/corelens/attention/schema.py src/corelens/experiments/rank.py \
	src/corelens/experiments/evaluate.py src/corelens/attention/dispatch.py src/corelens/attention/interventions.py \
	src/corelens/attention/streaming.py src/corelens/heads/artifact.py src/corelens/metrics \
	src/corelens/data/sample.py src/corelens/models/prepare.py src/corelens/policies/__init__.py \
	src/corelens/deprecation.py

.PHONY: demo test lint format bench clean venv

venv: $(STAMP)

$(STAMP): requirements.lock requirements-extras.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -r requirements-extras.lock  # kvpress, lmms-eval: see that file
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/corelens demo --out runs/demo

# One pytest worker per core (pytest-xdist), each on one thread: most tests are small tensors and
# subprocesses, where a second thread per worker buys less than a second worker.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -p no:cacheprovider -n auto tests \
		--doctest-modules $(DOCTESTS)

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/corelens bench ram --tokens 8192 --json benchmarks/results/ram-8192.json

clean:
	rm -rf $(VENV) runs .pytest_cache
