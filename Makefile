# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates its own virtualenv and installs what it needs; only Python 3.11 and Java 17 are assumed.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo demo-noop test bench bench-quick clean

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

test: $(BIN)/.installed
	$(BIN)/pytest

bench: $(BIN)/.installed
	$(BIN)/python -m benchmarks

bench-quick: $(BIN)/.installed
	$(BIN)/python -m benchmarks --quick

clean:
	rm -rf $(VENV) .zkc build *.egg-info
