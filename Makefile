# One command runner for the usual tasks. `make test` is what CI runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test lint typecheck unit fast bench demo clean

PLUGIN := examples/plugins/tideflow-example-plugin
# Records the dev install. Not $(BIN)/tideflow: the README's first command
# (`pip install -e .`, no dev tools) creates that too, and make would then
# think the dev tools were installed.
STAMP := $(VENV)/.installed-dev
CHROMIUM ?= /usr/bin/chromium

$(STAMP): pyproject.toml constraints.txt $(PLUGIN)/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/pip install -q -c constraints.txt -e $(PLUGIN)
	touch $(STAMP)

install: $(STAMP) $(CHROMIUM)

# The web UI's tests drive Debian's chromium through Playwright (executable_path; no
# `playwright install`, no browser download). Installed when missing, as root with apt;
# otherwise they skip and say how (under CI's TIDEFLOW_REQUIRE_SERVICES they fail). A
# file target: once the browser is there, `make -q install` says install is done.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium (the web UI tests' browser)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
	  echo "no $@: the web UI tests skip (as root: apt-get install -y chromium)"; \
	fi

lint: install
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typecheck: install
	$(BIN)/mypy

# The suite runs on every core (pytest-xdist; TEST_WORKERS=0 runs it in one process).
# worksteal: the long real-process tests do not leave one worker with a queue.
TEST_WORKERS ?= auto
XDIST = -n $(TEST_WORKERS) --dist worksteal

unit: install
	$(BIN)/pytest -q $(XDIST)

# Everything CI runs: lint, types, the whole test suite.
test: lint typecheck unit

# The local loop: skips the slow soak/kill tests.
fast: install
	$(BIN)/pytest -q $(XDIST) -m 'not slow'

bench: install
	$(BIN)/python bench/run.py

demo: install
	$(BIN)/tideflow run examples/etl.yaml

clean:
	rm -rf $(VENV) .tideflow .mypy_cache .pytest_cache .ruff_cache
