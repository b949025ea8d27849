# Quick start: `make demo` (install + run the demo), `make test` (the test suite).
#
# torch is installed first, pinned, on its own: a loose `torch` requirement
# with nothing installed makes pip fetch the newest CUDA build (several GB).
# Set TORCH_SPEC to choose another build, e.g. TORCH_SPEC="torch==2.13.0" with
# PIP_INDEX_URL pointing at the CPU or CUDA wheel index your site uses.
#
# Every other dependency is installed at the exact version requirements.lock
# holds (a pip constraints file); `make lock` refreshes it after a change to
# pyproject.toml, `make lock-check` fails when the two disagree (CI runs it).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
LOCK := requirements.lock
export HF_HUB_OFFLINE ?= 1

# The lock: every extra, for Python 3.11 and later on any platform, torch and
# what only torch needs left out (each build pins its own torch: TORCH_SPEC
# here, TORCH_VERSION in docker/). Versions already in the output file are
# kept, so a refresh changes only what pyproject.toml asks to change.
UV_COMPILE = echo torch | UV_CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/uv pip compile \
	pyproject.toml --extra all --extra dev --universal --python-version 3.11 \
	--excludes - --quiet

.PHONY: install demo test test-all lint lock lock-check bench clean

$(BIN)/serving-fairness: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --constraint $(LOCK) -e ".[all,dev]"
	@touch $@

install: $(BIN)/serving-fairness

# uv comes with the dev extra; this rule only bootstraps it where the lock
# cannot be installed yet (a requirement raised past its locked version).
$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv>=0.8"

# LOCK_FLAGS: e.g. "--upgrade-package aiohttp" to move one package to its
# newest allowed version, "--upgrade" for all of them.
lock: $(BIN)/uv
	$(UV_COMPILE) $(LOCK_FLAGS) --output-file $(LOCK)

lock-check: $(BIN)/uv
	@tmp=$$(mktemp -d) && cp $(LOCK) $$tmp/lock && \
	$(UV_COMPILE) --output-file $$tmp/lock && \
	if diff -u $(LOCK) $$tmp/lock; then echo "$(LOCK) matches pyproject.toml"; rm -r $$tmp; \
	else echo "$(LOCK) does not match pyproject.toml: run make lock and commit both" >&2; \
	rm -r $$tmp; exit 1; fi

demo: install
	$(BIN)/serving-fairness demo

test: install
	$(BIN)/python -m pytest -q

test-all: install
	$(BIN)/python -m pytest -q -m "" 

# mypy's files and levels: [tool.mypy] in pyproject.toml.
lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/core.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
