# egpu: the two commands a user needs are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv native system-deps k8s image clients demo test unit e2e lint bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> creating the virtual environment in $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "==> installing egpu and its dependencies (pip)"
	$(BIN)/pip install --progress-bar on -q --upgrade pip
	$(BIN)/pip install --progress-bar on -e '.[test,dev]'
	@# the repository's development tools (demo/, devcluster/, testbed/), which the egpu
	@# package does not ship, are importable in this venv from the clone
	echo '$(CURDIR)' > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/egpu-dev-tree.pth"
	@touch $(STAMP)

# Debian packages the tests and the demo use: runc (the runtime hook's runc containers, the
# real node), the real node's network (iptables/nftables for kube-proxy, CNI plugins), and
# the image tools (skopeo, umoci, debootstrap; libc6-dev for the static pause binary).
DEBIAN_PACKAGES := runc iptables nftables conntrack containernetworking-plugins \
	skopeo umoci debootstrap libc6-dev
system-deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "==> installing$$missing (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "==> missing Debian packages:$$missing (not root: runc and real-node tests are skipped)"; fi; fi

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, and the real
# node's kubelet, kube-proxy, containerd (+ shim, ctr), crictl and helm, built from their Go
# modules once and cached in ~/.cache/egpu (see docs/devcluster.md).
k8s: venv
	$(BIN)/python -m devcluster.build

# The dev cluster's images (egpu.local/egpu:dev, egpu.local/pause:3.10, the kube-scheduler) as
# OCI archives for `ctr images import`, built without Docker and cached in ~/.cache/egpu/images
# (see docs/devcluster.md, Images). The kube-scheduler image holds the binary `make k8s` built.
image: venv system-deps k8s
	$(BIN)/python -m devcluster.images

native:
	@echo "==> building libinterpose and the fake GPU (gcc)"
	$(MAKE) -C libinterpose
	$(MAKE) -C fakegpu

# ruff, the import contracts and the strict type check (pyproject.toml, [tool.mypy])
lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python bench/summary.py --check

# The real-client tier's environments (NVIDIA's driver bindings, pinned; testbed/clients.py),
# cached in ~/.cache/egpu/clients/
clients: venv
	$(BIN)/python -m testbed.clients

# parallel pytest workers of `make test` and `make e2e` (lanes: tests/lanes.py); 0: none
TEST_WORKERS ?= 0

unit: venv native system-deps k8s clients
	$(BIN)/pytest -m "not e2e" tests

e2e: venv native system-deps k8s image
	$(BIN)/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope) -m e2e tests

# `make test`: every test, one after another (28 min on 2 cores, 41 on a slower hour of the host). `make test TEST_WORKERS=6`:
# the real-time suites (compute caps and hostile tenants against the fake GPU's timeline)
# first, on a machine nothing else loads; then the rest on TEST_WORKERS parallel workers, each
# e2e lane (tests/lanes.py) on one worker, so that one lane's waits overlap the others' work
# (18 to 20 min; not the default yet: failures on 2 cores were each fixed at their cause, the
# last on 2026-12-05 at 18:10; docs/devcluster.md "pytest").
REALTIME_TESTS := tests/compute tests/security
test: venv native system-deps lint k8s image clients
ifeq ($(TEST_WORKERS),0)
	$(BIN)/pytest tests
else
	$(BIN)/pytest $(REALTIME_TESTS)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadscope $(addprefix --ignore=,$(REALTIME_TESTS)) tests
endif

# Options of `egpu demo`, e.g. `make demo DEMO_ARGS=--dra` (shares as ResourceClaims,
# docs/dra.md); none by default.
DEMO_ARGS ?=
demo: venv native system-deps k8s image
	$(BIN)/egpu demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build .pytest_cache
	$(MAKE) -C libinterpose clean
	$(MAKE) -C fakegpu clean
