# The project's entry points. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE_DIR ?= $(HOME)/.cache/appwrapper-dispatcher
export APPWRAPPER_CACHE_DIR := $(CACHE_DIR)
# The release, written once: setup.cfg `version` (dispatcher.__version__ reads it back from the
# installed package); the image is tagged with it.
VERSION ?= $(shell sed -n 's/^version *= *//p' setup.cfg)
IMAGE ?= appwrapper-dispatcher:$(VERSION)

.PHONY: all venv testenv lint typecheck unit test demo demo-multi bench conformance image clean plugin

all: test

# Python environment: rebuilt when setup.cfg changes.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# `kubectl aw` as one file for machines without this package: dist/kubectl-aw, a zipapp that
# runs on any python3 >= 3.11 with nothing installed (the plugin and PyYAML's pure-Python
# parser inside), and dist/kubectl_complete-aw beside it (dispatcher/plugin/bundle.py).
plugin: venv
	$(PY) -m dispatcher.plugin.bundle --version $(VERSION) --out dist

# Local control plane (etcd, kube-apiserver, controller-manager, scheduler, kubectl,
# KWOK, KubeRay), built from Go modules into $(CACHE_DIR); only what is missing.
testenv:
	bash testenv/build.sh

lint: venv
	$(VENV)/bin/ruff check dispatcher testenv tests benchmarks
	$(VENV)/bin/ruff format --check dispatcher testenv tests benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/vulture

typecheck: venv
	$(VENV)/bin/mypy

unit: venv
	$(VENV)/bin/pytest tests/unit -q

# Everything: static checks, the control plane, then the whole suite against it, in
# TEST_WORKERS processes at once, each with a control plane of its own (tests of one module
# stay in one process). Against one existing cluster (APPWRAPPER_KUBECONFIG) tests run one at a
# time: some change what is cluster-wide. pytest exit 5 (no tests collected) is a failure.
# The chart's tests run with a real helm (built once into the cache, testenv/build-helm.sh)
# after `helm lint`; the web view's in Chromium where /usr/bin/chromium is (`make test-deps`
# installs it); under CI a tier whose tool is missing fails (the `tier` mark).
TEST_WORKERS ?= $(if $(APPWRAPPER_KUBECONFIG),0,2)
test: lint typecheck testenv
	helm="$$(bash testenv/build-helm.sh)" && "$$helm" lint --strict charts/appwrapper-dispatcher && \
	APPWRAPPER_HELM="$$helm" $(VENV)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) \
	  --dist loadscope; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; exit $$rc

# What the tiers users consume need from Debian's packages, where missing (root and apt):
# Chromium for the web view's test; buildah and debootstrap for the image.
.PHONY: test-deps
test-deps:
	@missing=""; \
	test -x /usr/bin/chromium || missing="$$missing chromium"; \
	command -v buildah >/dev/null || missing="$$missing buildah"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing from Debian's packages"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null \
	    || { echo "make test-deps: apt-get install$$missing failed (root and apt are needed)" >&2; exit 1; }; \
	fi

# The main job: a local control plane with fake GPU nodes and KubeRay, the dispatcher
# running on it, the samples applied, their conditions shown.
demo: venv testenv
	$(PY) -m testenv.demo

demo-multi: venv testenv
	$(PY) -m testenv.demo --members 2

# The peer benchmark needs `make peers` first. Two runs of 3 alternated pairs each: ours, MCAD
# and Kueue at the full sizes (1,000 workloads; 2,000 for 100 slots; 200 gangs for 20; about
# 80 min on 2 cores, MCAD's runs cut at 45 s, their rates recorded), then ours and Kueue
# with the AppWrapper v1beta2 controller at smaller sizes (about 30 min; its runs cut at
# 60 s: its client is fixed at 20 QPS and it dispatched about one AppWrapper a second here, so
# a full-size run would only measure that limit for longer).
bench: venv testenv
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m benchmarks.controlplane_bench --out benchmarks/results/controlplane.json
	$(PY) -m benchmarks.core_bench --out benchmarks/results/core.json
	$(PY) -m benchmarks.e2e_bench --count 1000 --churn 10000 --out benchmarks/results/e2e.json
	$(PY) -m benchmarks.e2e_bench --count 1000 --queued 3 --out benchmarks/results/e2e-queued.json
	$(PY) -m benchmarks.hops_bench --out benchmarks/results/hops.json
	$(PY) -m benchmarks.peer_bench --pairs 3 --systems ours,mcad,kueue --cap 300 --cap mcad=45 \
	  --out benchmarks/results/peers.json
	$(PY) -m benchmarks.peer_bench --pairs 3 --systems ours,appwrapper --count 400 \
	  --contention 300/50 --gangs 60/10 --gang-hold 3 --cap 300 --cap appwrapper=60 \
	  --out benchmarks/results/peers-appwrapper.json
	$(PY) -m benchmarks.plot benchmarks/results

# MCAD v1.40.0's own e2e suite (built from the Go module proxy into $(CACHE_DIR)/mcad) run
# against this dispatcher, each test alone; SYSTEM=mcad runs it against MCAD itself. Writes
# benchmarks/results/conformance-$(SYSTEM).{json,md}. Not part of `make test` (~30 min).
# SUITE=appwrapper: the AppWrapper project's v1.1.2 e2e suite (built into
# $(CACHE_DIR)/appwrapper; needs `make peers`) against this dispatcher with Kueue's CRDs and no
# Kueue, or SYSTEM=appwrapper against the AppWrapper controller with Kueue. Writes
# benchmarks/results/conformance-appwrapper-$(SYSTEM).{json,md} (see
# docs/appwrapper-compatibility.md). KUEUE_QUOTAS=beside|instead passes the dispatcher's
# Kueue quota setting; OUR_QUEUES=1 also writes the suite's Kueue objects as this
# dispatcher's own quota kinds (results as ours-our-queues).
SUITE ?= mcad
SYSTEM ?= ours
KUEUE_QUOTAS ?=
OUR_QUEUES ?=
conformance: venv testenv
	$(PY) -m benchmarks.conformance --suite $(SUITE) --system $(SYSTEM) \
	  $(if $(KUEUE_QUOTAS),--kueue-quotas $(KUEUE_QUOTAS)) $(if $(OUR_QUEUES),--our-queues)

# The peers of the side-by-side benchmark (benchmarks/peer_bench.py): MCAD v1.40.0
# (kar-controllers), Kueue v0.15.0 (cmd/kueue) and the AppWrapper v1beta2 controller v1.1.2
# (cmd), from the Go module proxy, built into $(CACHE_DIR)/{mcad,kueue,appwrapper}; only what
# is missing. Not part of `make test`.
.PHONY: peers
peers: venv
	$(PY) -m benchmarks.peers build

# The Helm chart with the real helm (v3, built from the Go module proxy into
# $(CACHE_DIR)/helm by testenv/build-helm.sh, only when missing): `helm lint`, then
# tests/e2e/test_chart*.py: `helm template` against manifests/, the switches, and `helm
# install`, upgrade and uninstall in the local control plane with the dispatcher run from the
# checkout. `make test` runs the same, with everything else.
.PHONY: chart-test browser-test
chart-test: venv testenv
	helm="$$(bash testenv/build-helm.sh)" && \
	  "$$helm" lint --strict charts/appwrapper-dispatcher && \
	  APPWRAPPER_HELM="$$helm" $(VENV)/bin/pytest -q -p no:cacheprovider tests/e2e/test_chart.py \
	    tests/e2e/test_chart_values.py tests/e2e/test_chart_install.py

# The web view in a real browser: Debian's Chromium (installed here if absent; needs root and
# apt), then the browser test against a local control plane; the screenshot in the docs.
browser-test: venv testenv test-deps
	APPWRAPPER_SCREENSHOT=$(CURDIR)/docs/images/webview.png \
	  $(VENV)/bin/pytest -q -p no:cacheprovider tests/e2e/test_webview_browser.py

# The image (Dockerfile) tagged $(IMAGE), with the first builder found: CONTAINER_BUILDER if
# set, else docker (if its daemon answers), buildah, podman. None: says so and fails. Push it
# where the nodes pull from and name it in the manifests (manifests/README.md, "The image").
# buildah and podman use STORAGE_DRIVER and ISOLATION (vfs and chroot: they need no overlay
# mount and no user namespace, so they work in a VM or a container; empty: the builder's own).
# BASE=local: the base built from Debian's packages (testenv/build-base-image.sh, for where no
# registry answers; buildah or podman only), else PYTHON_IMAGE (python:3.11-slim) is pulled.
# BUILD_CA: a CA bundle pip trusts during the build (a proxy that re-signs TLS; buildah and
# podman only), by default the host pip's PIP_CERT. Prints the image's size and build time.
CONTAINER_BUILDER ?=
STORAGE_DRIVER ?= vfs
ISOLATION ?= chroot
BUILD_CA ?= $(PIP_CERT)
image:
	@builder='$(CONTAINER_BUILDER)'; \
	if [ -z "$$builder" ]; then \
	  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then builder=docker; \
	  elif command -v buildah >/dev/null; then builder=buildah; \
	  elif command -v podman >/dev/null; then builder=podman; \
	  elif command -v docker >/dev/null; then \
	    echo "make image: docker is installed but its daemon does not answer (docker info failed)," \
	      "and neither podman nor buildah is installed: start the daemon, or install podman" \
	      "or buildah (CONTAINER_BUILDER=podman|buildah to choose one)" >&2; exit 1; \
	  else \
	    echo "make image: no container builder: install docker, podman or buildah" \
	      "(CONTAINER_BUILDER=docker|podman|buildah to choose one); the dispatcher itself" \
	      "runs without an image: .venv/bin/appwrapper-dispatcher run (README.md)" >&2; exit 1; \
	  fi; \
	fi; \
	case "$$builder" in \
	  docker) cli=docker; build="docker build" ;; \
	  podman|buildah) cli="$$builder$(if $(STORAGE_DRIVER), --storage-driver $(STORAGE_DRIVER))"; \
	    build="$$cli build$(if $(ISOLATION), --isolation $(ISOLATION)) --network host$(if \
	      $(BUILD_CA), -v $(abspath $(BUILD_CA)):/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt)" ;; \
	  *) echo "make image: CONTAINER_BUILDER=$$builder: not docker, podman or buildah" >&2; exit 1 ;; \
	esac; \
	command -v "$$builder" >/dev/null || { echo "make image: $$builder is not installed" >&2; exit 1; }; \
	base=; \
	case '$(BASE)' in \
	  '') ;; \
	  local) [ "$$builder" != docker ] || { echo "make image: BASE=local needs buildah or podman" \
	      "(the base is imported into their storage)" >&2; exit 1; }; \
	    base="--build-arg PYTHON_IMAGE=$$(STORAGE_DRIVER='$(STORAGE_DRIVER)' \
	      bash testenv/build-base-image.sh)" || exit 1 ;; \
	  *) echo "make image: BASE=$(BASE): empty (PYTHON_IMAGE) or local" >&2; exit 1 ;; \
	esac; \
	start=$$(date +%s); \
	echo "$$build $$base --build-arg VERSION=$(VERSION) -t $(IMAGE) ."; \
	$$build $$base --build-arg VERSION=$(VERSION) -t $(IMAGE) . || exit 1; \
	echo "built $(IMAGE) in $$(( $$(date +%s) - start ))s:" \
	  "$$($$cli images --format '{{.Size}}' $(IMAGE) | head -n 1)"

# The image run as a container on this machine against the local control plane
# (tests/e2e/test_image.py): `make image` from the local base with buildah (BASE= to pull
# python:3.11-slim instead), then the dispatcher in it, `buildah run` on the host's network,
# takes the sample job-completion AppWrapper to Completed. Not part of `make test`.
.PHONY: image-test
IMAGE_TEST ?= localhost/appwrapper-dispatcher:$(VERSION)
image-test: BASE ?= local
image-test: venv testenv
	$(MAKE) --no-print-directory image IMAGE=$(IMAGE_TEST) BASE=$(BASE) CONTAINER_BUILDER=buildah
	APPWRAPPER_IMAGE=$(IMAGE_TEST) APPWRAPPER_STORAGE_DRIVER=$(STORAGE_DRIVER) \
	  $(VENV)/bin/pytest -q -p no:cacheprovider tests/e2e/test_image.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
