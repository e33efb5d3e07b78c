# egpu: the two commands a user needs are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv native demo test unit e2e lint bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> creating the virtual environment in $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "==> installing egpu and its dependencies (pip)"
	$(BIN)/pip install --progress-bar on -q --upgrade pip
	$(BIN)/pip install --progress-bar on -e '.[test,dev]'
	@touch $(STAMP)

native:
	@echo "==> building libinterpose and the fake GPU (gcc)"
	$(MAKE) -C libinterpose
	$(MAKE) -C fakegpu

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

unit: venv native
	$(BIN)/pytest -m "not e2e" tests

e2e: venv native
	$(BIN)/python -m devcluster.build
	$(BIN)/pytest -m e2e tests

test: venv native lint
	$(BIN)/python -m devcluster.build
	$(BIN)/pytest tests

demo: venv native
	$(BIN)/egpu demo

clean:
	rm -rf $(VENV) build .pytest_cache
	$(MAKE) -C libinterpose clean
	$(MAKE) -C fakegpu clean
