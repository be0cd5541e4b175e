# Mnemo's entry points. `make up` and `make test` work on a fresh Linux machine
# with Python 3.11 and no GPU: each creates .venv when missing and installs.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mnemo-installed
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k chunker -x"`.
PYTEST_ARGS ?=

.PHONY: install up test lint bench clean

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

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Quick plan on CPU (about 10.5 min on 2 cores, 4 of them the quality suite); e.g. `make bench BENCH_ARGS="--suite gateway --full"`.
BENCH_ARGS ?=
bench: install
	$(BIN)/mnemo bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
