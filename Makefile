# Quick start: `make demo` (install + run the demo), `make test` (the test suite).
#
# torch is installed first, pinned, on its own: a loose `torch` requirement
# with nothing installed makes pip fetch the newest CUDA build (several GB).
# Set TORCH_SPEC to choose another build, e.g. TORCH_SPEC="torch==2.13.0" with
# PIP_INDEX_URL pointing at the CPU or CUDA wheel index your site uses.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1

.PHONY: install demo test test-all lint bench clean

$(BIN)/serving-fairness: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $@

install: $(BIN)/serving-fairness

demo: install
	$(BIN)/serving-fairness demo

test: install
	$(BIN)/python -m pytest -q

test-all: install
	$(BIN)/python -m pytest -q -m "" 

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: install
	$(BIN)/python bench/core.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
