# egpu: the two commands a user needs are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv native system-deps k8s demo test unit e2e lint bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> creating the virtual environment in $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "==> installing egpu and its dependencies (pip)"
	$(BIN)/pip install --progress-bar on -q --upgrade pip
	$(BIN)/pip install --progress-bar on -e '.[test,dev]'
	@touch $(STAMP)

# runc runs the runtime hook's end-to-end tests and the demo's container (Debian package).
system-deps:
	@command -v runc >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "==> installing runc (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc; \
	  else echo "==> runc not found and cannot install it (not root): runc tests will be skipped"; fi; }

# etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and kwok, built from
# their Go modules once and cached in ~/.cache/egpu (see docs/devcluster.md).
k8s: venv
	$(BIN)/python -m devcluster.build

native:
	@echo "==> building libinterpose and the fake GPU (gcc)"
	$(MAKE) -C libinterpose
	$(MAKE) -C fakegpu

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

unit: venv native system-deps
	$(BIN)/pytest -m "not e2e" tests

e2e: venv native system-deps k8s
	$(BIN)/pytest -m e2e tests

test: venv native system-deps lint k8s
	$(BIN)/pytest tests

demo: venv native system-deps k8s
	$(BIN)/egpu demo

clean:
	rm -rf $(VENV) build .pytest_cache
	$(MAKE) -C libinterpose clean
	$(MAKE) -C fakegpu clean
