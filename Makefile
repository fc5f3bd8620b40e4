# tritonops.shm developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell .ci/find-python)
VENV ?= $(CURDIR)/.venv
BUILD ?= $(CURDIR)/build
VPY := $(VENV)/bin/python
COLL := $(BUILD)/ansible_collections/tritonops/shm
PYVER = $(shell $(VPY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
REQS = $(if $(filter 3.11,$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')),tests/requirements-3.11.txt,tests/requirements.txt)

export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(BUILD)
export ANSIBLE_PYTHON_INTERPRETER := $(VPY)
export TRITONOPS_VENV_PYTHON := $(VPY)
export PYTHONDONTWRITEBYTECODE := 1
# promtool for `promtool test rules` (tests/unit/extensions/prometheus): from Debian's prometheus package
export PROMTOOL ?= $(BUILD)/bin/promtool
# prometheus, node_exporter and alertmanager for the observability tests (tests/integration/observability.py)
export PROMETHEUS_BIN ?= $(BUILD)/bin
PROMETHEUS_BINARIES := $(addprefix $(PROMETHEUS_BIN)/,prometheus prometheus-node-exporter prometheus-alertmanager ../share/prometheus/alertmanager/default.tmpl)

PYTEST_ARGS ?=
# what units / integration run: a file or a directory under tests/ narrows the run (make integration TESTS=tests/integration/test_grpc.py)
UNIT_TESTS ?= $(or $(TESTS),tests/unit)
INTEGRATION_TESTS ?= $(or $(TESTS),tests/integration)

PYTEST = $(VPY) -m pytest -p no:cacheprovider --timeout 600
# pytest exits 5 when it collected nothing: that is a broken test tree, not a pass
PYTEST_RUN = bash -c '$(PYTEST) "$$@"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected" >&2; exit 1; fi; exit $$rc' pytest

.PHONY: deps promtool prometheus help venv collection sanity-collection sanity sanity-2.19 sanity-2.16 units-2.16 changelog-check units integration integration-matrix test test-gpu gpu-bundle test-serial test-lane-sanity test-lane-tests demo bench soak lint docs build clean

help:  ## list the targets
	@grep -E '^[a-z0-9.-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

venv: $(VENV)/.installed  ## create .venv with a suitable Python and the pinned test requirements

$(VENV)/.installed: tests/requirements.txt tests/requirements-3.11.txt
	@mkdir -p $(BUILD)
	@test -n "$(PYTHON)" || { echo "no usable python found" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -r $(REQS)
	.ci/setup-ansible-test $(VPY)
	touch $@

# copy the checkout to $(1); ansible-test lists files with git: give the copy its own repository (build/ is ignored by ours)
copy_collection = rm -rf $(1) && .ci/copy-collection $(1) && { cd $(1) && git init -q . && git add -A >/dev/null 2>&1 || true; }

# KEEP_COLLECTION=1: use the copy as it is (the lanes of `make test`: one lane's step must not replace the copy
# another lane's step runs in)
collection: venv  ## copy the checkout into build/ansible_collections/tritonops/shm
	@$(if $(KEEP_COLLECTION),:,$(call copy_collection,$(COLL)))

# ansible-test sanity runs in a copy of its own (build/sanity/), so that `make test` runs it beside the other steps:
# ansible-test writes tests/output/ into the copy and lists the copy's files (another tool's cache there would be seen)
SANITY_ROOT := $(BUILD)/sanity
SANITY_COLL := $(SANITY_ROOT)/ansible_collections/tritonops/shm
sanity-collection: venv
	@$(call copy_collection,$(SANITY_COLL))

# the target Pythons of tests/config.yml (3.9 and later): sanity's compile and import tests run on each one found on
# PATH; this machine kind has them under pyenv (not on PATH by default), others may have none (then skipped, said)
TARGET_PYTHONS := $(subst $(eval) ,:,$(wildcard $(foreach v,3.9 3.10 3.11 3.13,$(HOME)/.pyenv/versions/$(v).*/bin)))

sanity: sanity-collection  ## ansible-test sanity with ansible-core 2.21 (empty ignore files; compile and import on Python 3.9-3.13)
	cd $(SANITY_COLL) && ANSIBLE_COLLECTIONS_PATH=$(SANITY_ROOT) PATH=$(VENV)/bin:$(TARGET_PYTHONS):$$PATH ansible-test sanity --color no --venv --requirements

VENV219 := $(BUILD)/venv-2.19
$(VENV219)/.installed: tests/requirements-2.19.txt | venv
	$(PYTHON) -m venv $(VENV219)
	$(VENV219)/bin/python -m pip install --quiet -r tests/requirements-2.19.txt
	.ci/setup-ansible-test $(VENV219)/bin/python
	touch $@

sanity-2.19: sanity-collection $(VENV219)/.installed  ## ansible-test sanity with ansible-core 2.19 (the first with data tagging)
	cd $(SANITY_COLL) && ANSIBLE_COLLECTIONS_PATH=$(SANITY_ROOT) PATH=$(VENV219)/bin:$$PATH ansible-test sanity --color no --python $(PYVER) --venv --requirements

changelog-check:  ## lint changelog fragments and dry-run the release of galaxy.yml's version
	VENV_BIN=$(VENV)/bin .ci/release-changelog --check >/dev/null

docs: collection  ## lint the collection docs and build the antsibull-docs docsite into build/docsite
	VENV_BIN=$(VENV)/bin .ci/build-docsite $(BUILD)/docsite

promtool: $(PROMTOOL)  ## put promtool into build/bin (apt-get download prometheus + dpkg-deb -x; no server installed)

$(PROMTOOL):
	.ci/get-promtool $@

prometheus: $(PROMETHEUS_BINARIES)  ## put prometheus, node_exporter and alertmanager into build/bin (apt-get download + dpkg-deb -x; no daemon installed)

$(PROMETHEUS_BINARIES) &:
	.ci/get-prometheus $(PROMETHEUS_BIN) prometheus prometheus-node-exporter prometheus-alertmanager

units: collection $(PROMTOOL)  ## unit tests (pytest, no server needed; the Prometheus rules with promtool)
	cd $(COLL) && $(PYTEST_RUN) $(UNIT_TESTS) $(PYTEST_ARGS)

# the oldest supported controller, ansible-core 2.16, for tests/integration/test_controllers.py (its bin directory)
VENV216 := $(BUILD)/venv-2.16
export TRITONOPS_CORE_216 := $(VENV216)/bin
$(VENV216)/.installed: tests/requirements-2.16.txt | venv
	$(PYTHON) -m venv $(VENV216)
	$(VENV216)/bin/python -m pip install --quiet -r tests/requirements-2.16.txt
	touch $@

# the unit tests on ansible-core 2.16 (ansible 9): a venv of its own (tests/requirements-units-2.16.txt)
VENV216U := $(BUILD)/venv-units-2.16
$(VENV216U)/.installed: tests/requirements-units-2.16.txt | venv
	$(PYTHON) -m venv $(VENV216U)
	$(VENV216U)/bin/python -m pip install --quiet -r tests/requirements-units-2.16.txt
	touch $@

units-2.16: collection $(PROMTOOL) $(VENV216U)/.installed  ## the unit tests with the oldest supported ansible-core (2.16)
	cd $(COLL) && PATH=$(VENV216U)/bin:$$PATH ANSIBLE_PYTHON_INTERPRETER=$(VENV216U)/bin/python \
		$(VENV216U)/bin/python -m pytest -p no:cacheprovider --timeout 600 $(UNIT_TESTS) $(PYTEST_ARGS)

sanity-2.16: sanity-collection $(VENV216)/.installed  ## ansible-test sanity with the oldest supported ansible-core (2.16)
	.ci/setup-ansible-test $(VENV216)/bin/python
	cd $(SANITY_COLL) && ANSIBLE_COLLECTIONS_PATH=$(SANITY_ROOT) PATH=$(VENV216)/bin:$$PATH ansible-test sanity --color no --python $(PYVER) --venv --requirements

# pytest-xdist workers for the integration tests (0: one process); tests/integration/conftest.py groups the tests that
# must share a worker (the container harness's; a module's, when it starts a server once for the module)
INTEGRATION_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(INTEGRATION_WORKERS)),-n $(INTEGRATION_WORKERS) --dist loadgroup)

integration: collection $(PROMETHEUS_BINARIES) $(VENV216)/.installed  ## integration tests against real tritonserver processes (and a real Prometheus, node_exporter, Alertmanager)
	cd $(COLL) && $(PYTEST_RUN) $(INTEGRATION_TESTS) $(XDIST) $(PYTEST_ARGS)

# The GPU suite: needs an NVIDIA GPU and its driver, root; stops at once and exits non-zero without them. Not part of
# make test (CI has no GPU). CUDA clients use CuPy or PyTorch when importable, else the wheel's own CUDA runtime;
# perf_analyzer comes from the tritonclient 2.51 wheel. Under 5 minutes.
test-gpu: collection  ## the CUDA suite (tests/gpu/) on a real NVIDIA GPU: the CUDA rule, its reclaim, NVML's figures
	cd $(COLL) && $(PYTEST_RUN) tests/gpu -p no:xdist -v $(PYTEST_ARGS)

# The GPU suite for a GPU machine with Python 3.12, the driver and no network: one archive of at most 60 MiB
# (build/tritonops-shm-gpu-bundle.tar.xz) with the wheels of ansible-core and pytest, the collection tarball, ansible.posix,
# the wheel's tritonserver and its libraries and perf_analyzer of tritonclient 2.51 (.ci/gpu-bundle says what and why);
# on the GPU machine, as root: tar xJf tritonops-shm-gpu-bundle.tar.xz && tritonops-shm-gpu/run-gpu-suite
gpu-bundle: build  ## pack the GPU suite into one archive (<= 60 MiB) that runs with `run-gpu-suite` on a machine with no network
	.ci/gpu-bundle $(VPY) $$(ls -t $(BUILD)/tritonops-shm-*.tar.gz | head -n 1) $(BUILD)

# The version matrix: the core integration tests against the tritonserver of an older
# nvidia-pytriton (0.5.10 bundles Triton 2.48), installed apart from the venv (see tests/integration/containers/README.md).
PYTRITON_OLD ?= 0.5.10
PYTRITON_OLD_SITE := $(BUILD)/pytriton-$(PYTRITON_OLD)
MATRIX_TESTS ?= tests/integration/test_triton_shm_info.py tests/integration/test_triton_shm_region.py tests/integration/test_triton_versions.py

$(PYTRITON_OLD_SITE)/.installed: | venv
	$(VPY) -m pip install --quiet --no-deps --target $(PYTRITON_OLD_SITE) nvidia-pytriton==$(PYTRITON_OLD)
	touch $@

integration-matrix: collection $(PYTRITON_OLD_SITE)/.installed  ## core integration tests against Triton 2.48 (nvidia-pytriton 0.5.10)
	cd $(COLL) && TRITONRIG_PYTRITON_SITE=$(PYTRITON_OLD_SITE) $(PYTEST_RUN) $(MATRIX_TESTS) $(XDIST) $(PYTEST_ARGS)

lint: collection  ## ruff (ruff.toml: format and checks over plugins, extensions, tests); ansible-lint, production profile (roles, playbooks, rulebooks)
	$(VENV)/bin/ruff format --check --diff plugins extensions tests
	$(VENV)/bin/ruff check plugins extensions tests
	cd $(COLL) && ansible-lint --profile production --offline roles playbooks extensions/eda/rulebooks

deps:  ## install missing Debian packages the tests need (as root), else list them
	@.ci/deps

# `make test` (CI: 2 cores) runs two lanes at once, each one step after the other, its lines prefixed with its name:
#   sanity: sanity (2.21), sanity-2.19, sanity-2.16 (all use ~/.ansible/test: never two at once), units-2.16, lint,
#           changelog-check, docs,
#           integration-matrix (Triton 2.48)
#   tests:  units, integration (Triton 2.51, two pytest-xdist workers)
# The lanes share no files: sanity runs in build/sanity/, docs and changelog-check in temporary copies; the matrix and
# the integration tests start their own servers (tritonrig.free_port never hands a port out twice). `make test-serial`
# runs the same steps one after the other.
TEST_LANE_SANITY := sanity sanity-2.19 sanity-2.16 units-2.16 lint changelog-check docs integration-matrix
TEST_LANE_TESTS := units integration
lane = set -o pipefail; $(MAKE) --no-print-directory -j1 $(2) 2>&1 | sed -u 's/^/[$(1)] /'

test: deps collection  ## every test: sanity (2.21, 2.19, 2.16), units (2.21, 2.16), lint, changelog, docs, units, integration (Triton 2.51), integration-matrix (2.48); in two lanes
	@$(MAKE) --no-print-directory -j2 test-lane-sanity test-lane-tests KEEP_COLLECTION=1

test-lane-sanity:
	+@$(call lane,sanity,$(TEST_LANE_SANITY))

test-lane-tests:
	+@$(call lane,tests,$(TEST_LANE_TESTS))

test-serial: deps sanity sanity-2.19 sanity-2.16 units-2.16 lint changelog-check docs units integration integration-matrix  ## the steps of `make test`, one after the other

# the demo's own venv: ansible-core, the Triton server nvidia-pytriton bundles and tritonclient (tests/requirements-demo.txt),
# a fraction of the test venv; it runs from its own copy of the collection
DEMO_VENV ?= $(BUILD)/venv-demo
DEMO_ROOT := $(BUILD)/demo
# Every package pinned, --no-deps (no resolver), --no-compile (Python compiles what the demo imports as it runs), and
# the venv made without pip of its own, filled by this Python's pip (--python, pip 22.3+; else the venv's own pip):
# 8 s instead of 26 s here (docs/performance.md)
DEMO_PIP := install --quiet --no-deps --no-compile -r tests/requirements-demo.txt
$(DEMO_VENV)/.installed: tests/requirements-demo.txt
	@mkdir -p $(BUILD)
	@test -n "$(PYTHON)" || { echo "no usable python found" >&2; exit 1; }
	rm -rf $(DEMO_VENV)
	if $(PYTHON) -m venv --without-pip $(DEMO_VENV) && $(PYTHON) -m pip --python $(DEMO_VENV)/bin/python $(DEMO_PIP); \
	then :; else rm -rf $(DEMO_VENV) && $(PYTHON) -m venv $(DEMO_VENV) && $(DEMO_VENV)/bin/python -m pip $(DEMO_PIP); fi
	touch $@

demo: $(DEMO_VENV)/.installed  ## the main job on an embedded local Triton with a private 64 MiB /dev/shm (its own small venv)
	@rm -rf $(DEMO_ROOT) && .ci/copy-collection $(DEMO_ROOT)/ansible_collections/tritonops/shm
	cd $(DEMO_ROOT)/ansible_collections/tritonops/shm && PATH=$(DEMO_VENV)/bin:$$PATH ANSIBLE_COLLECTIONS_PATH=$(DEMO_ROOT) \
		ANSIBLE_PYTHON_INTERPRETER=$(DEMO_VENV)/bin/python $(DEMO_VENV)/bin/python tests/rig/demo.py

# which benchmarks `make bench` runs (names of tests/bench/bench_NAME.py, e.g. BENCHES='cost bulk'); default all
BENCHES ?=
bench: collection  ## benchmarks (not tests); print their figures, then the goals next to this run's ratios
	cd $(COLL) && $(VPY) tests/bench/run.py $(BENCHES)

# the model-based safety test's long profile in `make soak` (its short profile runs in `make units`)
MODEL_EXAMPLES ?= 200
MODEL_STEPS ?= 60
soak: collection  ## bounded soak: live traffic while cleanup runs repeatedly; then the model-based safety test's long profile
	cd $(COLL) && $(VPY) tests/bench/soak.py
	cd $(COLL) && TRITONOPS_MODEL_EXAMPLES=$(MODEL_EXAMPLES) TRITONOPS_MODEL_STEPS=$(MODEL_STEPS) $(PYTEST_RUN) \
		tests/unit/plugins/module_utils/test_model_safety.py -s -p no:xdist --timeout 5400 -k every_step $(PYTEST_ARGS)

build: collection  ## build the collection tarball into build/
	cd $(COLL) && ansible-galaxy collection build --force --output-path $(BUILD)

clean:  ## remove build output and the venv
	rm -rf $(BUILD) $(VENV)
