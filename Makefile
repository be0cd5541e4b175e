# Mnemo's entry points. `make up` and `make test` work on a fresh Linux machine
# with Python 3.11 and no GPU: each creates .venv when missing and installs.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mnemo-installed
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k chunker -x"`.
PYTEST_ARGS ?=
# pytest-xdist workers of `make test`, each with its own PostgreSQL, sidecar and browser (see
# tests/scheduling.py); `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= 2

.PHONY: install up test test-stress browser screenshots lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes. torch/torchvision are pinned in
# pyproject.toml: a mismatched torchvision breaks transformers at import.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

up: install
	$(BIN)/mnemo up

test: install browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The suite with a busy loop taking one core beside it, as on a loaded machine: no test may depend
# on how fast the machine is. The loop stops however the run ends (Ctrl-C included: a background
# job of a non-interactive shell ignores SIGINT, so the traps end it); pytest's status is kept.
test-stress: install browser
	@yes >/dev/null & hog=$$!; \
	trap 'kill $$hog 2>/dev/null' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	echo "make test-stress: a busy loop (pid $$hog) takes one core"; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The console's browser tests drive Debian's chromium through chromedriver. Installed here when
# missing (apt-get, as root); when that cannot happen this says why and carries on, and the browser
# tests then fail with the same reason (they never skip).
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "make browser: not root, cannot apt-get install chromium chromium-driver; the browser tests will fail" >&2; \
	elif ! command -v apt-get >/dev/null; then \
	  echo "make browser: no apt-get here; install chromium and its chromedriver at /usr/bin; the browser tests will fail" >&2; \
	else \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver) >/dev/null \
	  || echo "make browser: apt-get install chromium chromium-driver failed; the browser tests will fail" >&2; \
	fi

# The console's screenshots in docs/screenshots (the README shows two), from its browser tests.
screenshots: install browser
	MNEMO_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest tests/test_console.py -q

# The generated parts of the docs: the architecture picture (from the code's imports) and the
# settings reference; tests/test_docs.py fails when either is stale.
docs: install
	$(BIN)/python docs/architecture_picture.py
	$(BIN)/mnemo settings docs

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Quick plan on CPU (about 30 min on 2 cores, every suite: benchmarks/plan.py has the split); e.g. `make bench BENCH_ARGS="--suite gateway --full"`.
BENCH_ARGS ?=
bench: install
	$(BIN)/mnemo bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
