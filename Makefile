# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Caches live under ~/.cache (pip, Go modules and builds, control-plane binaries) so warm runs are fast.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS ?= all
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
comma := ,

.PHONY: venv peers tools servers images lint unit crds crds-check test e2e binaries demo demo-down clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

# Peer load generators for the agreement tests, each in its own venv (their pins clash with ours).
AIPERF_VERSION := 0.13.0
AIPERF := .peers/aiperf/bin/aiperf
GUIDELLM_VERSION := 0.8.1
GUIDELLM := .peers/guidellm/bin/guidellm
peers: $(AIPERF) $(GUIDELLM)

$(AIPERF):
	test -x .peers/aiperf/bin/python || $(PYTHON) -m venv .peers/aiperf
	.peers/aiperf/bin/python -m pip install --quiet --upgrade pip
	.peers/aiperf/bin/python -m pip install --quiet 'aiperf==$(AIPERF_VERSION)'

$(GUIDELLM):
	test -x .peers/guidellm/bin/python || $(PYTHON) -m venv .peers/guidellm
	.peers/guidellm/bin/python -m pip install --quiet --upgrade pip
	.peers/guidellm/bin/python -m pip install --quiet 'guidellm==$(GUIDELLM_VERSION)'

# System tools tests run (Debian packages): Icarus Verilog for the pass@k checker tests, as the
# worker images have it; Lua 5.1 for Argo CD's health checks (Argo CD runs a Lua 5.1); buildah,
# podman and debootstrap to build and run the images (no Docker engine here). Under CI=true a test
# that skips for want of a tool fails the run.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_TOOLS := iverilog:iverilog lua5.1:lua5.1 buildah:buildah podman:podman debootstrap:debootstrap
tools:
	@for pair in $(APT_TOOLS); do cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null || $(SUDO) apt-get install -y -q $$pkg >/dev/null || \
	  { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q $$pkg >/dev/null; } || \
	  { echo "install $$pkg (Debian/Ubuntu: apt-get install $$pkg)"; exit 1; }; done

lint: venv
	$(VENV)/bin/ruff check operator tests hack benchmarks
	$(VENV)/bin/ruff format --check operator tests hack benchmarks

unit: venv
	$(VENV)/bin/pytest -q tests/unit

crds: venv
	$(VENV)/bin/accelbench crds --out crds
	cp crds/*.yaml charts/accelbench/crds/

crds-check: venv
	@tmp=$$(mktemp -d) && $(VENV)/bin/accelbench crds --out $$tmp >/dev/null && \
	  diff -ru crds $$tmp && echo "crds/ matches the API models" || \
	  { echo "crds/ is stale: run 'make crds' and commit"; exit 1; }

# Control-plane binaries (kube-apiserver & co. from the Go module proxy), cached in ~/.cache.
binaries:
	hack/build-binaries.sh

# Servers the tests run beside the operator (fake-gcs-server, versitygw), built and cached the same way.
servers:
	hack/build-servers.sh

# Every image under images/, on a Debian base made here (hack/build-images.sh), with sizes and a
# smoke run of each entrypoint; results in images/results.json. `make test` builds the operator and
# bench images only (tests/e2e/test_image_build_and_run.py).
images: tools
	hack/build-images.sh --smoke --out images/results.json

e2e: venv binaries servers
	$(VENV)/bin/pytest -q tests/e2e

# Everything: lint, CRD drift, unit, workers (torch + JAX on CPU), bench client, e2e on the local
# control plane.
test: lint crds-check binaries servers peers tools
	ACCELBENCH_PEER_AIPERF=$(CURDIR)/$(AIPERF) ACCELBENCH_PEER_GUIDELLM=$(CURDIR)/$(GUIDELLM) \
	  $(VENV)/bin/pytest -q -p no:cacheprovider tests

# The main job on this machine: local control plane, operator, quickstart fine-tune and benchmark.
demo: venv binaries
	$(PY) hack/demo.py up

demo-down:
	$(PY) hack/demo.py down

clean:
	rm -rf $(VENV) .peers .pytest_cache .ruff_cache
