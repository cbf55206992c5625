# The two commands of the README: `make demo` (the main job) and `make test` (lint, then the whole suite);
# `make test-fast` runs the pure tier alone.
# Each creates its own virtualenv and installs what it needs; only Python 3.11 and Java 17 are assumed.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo demo-noop lint test test-fast bench bench-quick clean docker-engine docker-engine-stop image

$(BIN)/.installed: setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (apt-get install python3.11 python3.11-venv)")'
	@command -v java >/dev/null || { echo "java not found: install Java 17 (apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

demo: $(BIN)/.installed
	$(BIN)/zkctl demo

demo-noop: $(BIN)/.installed
	$(BIN)/zkctl demo --runner noop

# Three pytest processes on the two cores CI has; each has its own embedded ZooKeeper. The heavy tests (Spark
# JVMs, containers, timing-sensitive processes) mostly wait: at most two processes run them at a time, heaviest
# file first, while the third runs the light ones, a file at a time (tests/xdist_support.py).
PYTEST_PARALLEL ?= -n 3 --dist loadgroup

# Seconds, and first: CI fails on a lint or type error before the suite starts.
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy controller broker_sim cli

test: lint
	$(BIN)/pytest $(PYTEST_PARALLEL) --durations=20

# The pure tier: no ZooKeeper, no process, no Spark; on both cores, with a tenth of the protocol simulation's
# seeded schedules (`make test` plays all of them).
test-fast: $(BIN)/.installed
	ZKC_PROTOSIM_SHARE=0.1 $(BIN)/pytest -n 2 -q tests/unit

bench: $(BIN)/.installed
	$(BIN)/python -m benchmarks

bench-quick: $(BIN)/.installed
	$(BIN)/python -m benchmarks --quick

# A Docker engine for the container tests (Debian's docker.io; root) and the debootstrapped base image;
# `make docker-engine-stop` stops, by its pid, only a daemon it started.
docker-engine:
	scripts/docker-engine.sh start

docker-engine-stop:
	scripts/docker-engine.sh stop

image: $(BIN)/.installed
	$(BIN)/zkctl cluster build

clean:
	rm -rf $(VENV) .zkc build *.egg-info
