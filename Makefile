# The README's commands: `make demo`, `make check` (the edit loop) and `make test` (CI). Each sets up
# .venv and node_modules on first use and reuses them afterwards (stamp files: nothing is reinstalled
# unless its inputs changed).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# node_modules/.bin first: its `node` is the Node LTS pinned in package.json (`npm ci` installs it),
# which npx, the CDK CLI and jsii (under aws-cdk-lib and cdk8s) all start from PATH.
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo check test lint format bench bench-checkpoint gpu-check observe-check image-check synth render setup clean

# NVRx at the image's pin (constraints.txt agrees with kitcore/pins.py): its only published wheel is cp312,
# tools/nvrx-wheel.sh makes the Python-only wheel this machine installs (see there).
NVRX_VERSION := $(shell sed -n 's/^nvidia-resiliency-ext==//p' constraints.txt)
NVRX_WHEEL := build/wheels/nvidia_resiliency_ext-$(NVRX_VERSION)-py3-none-any.whl
# The one torch release of the kit (kitcore/pins.py TORCH_VERSION; the images install the same).
TORCH_VERSION := $(shell sed -n 's/^TORCH_VERSION = "\(.*\)"$$/\1/p' kitcore/pins.py)

$(VENV)/.installed: pyproject.toml constraints.txt tools/nvrx-wheel.sh kitcore/pins.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel
	# The CPU build of torch from this machine's disk, first, so nothing later pulls a CUDA build.
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	test -f $(NVRX_WHEEL) || tools/nvrx-wheel.sh $(PY) $(NVRX_VERSION) build/wheels
	$(PY) -m pip install --quiet --find-links build/wheels -c constraints.txt -e '.[dev]'
	$(PY) -m pip check
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(VENV)/.installed node_modules/.installed

# The edit loop, about 2 minutes on 2 cores: lint, the import contracts, the type check (mypy, a few
# seconds once its cache is warm), and every package's tests not marked slow or gpu, one worker per core (a file's tests stay on one worker, so its module fixtures, such
# as a synthesized stack, are built once).
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/lint_imports.py
	$(PY) tools/typecheck.py
	$(PY) -m pytest -m "not slow and not gpu" -n auto --dist loadfile --no-loadscope-reorder -q

# CI: every test, the slow end-to-end ones included: the fast ones, and the slow ones that run no job
# (`shareable`); then the other slow ones, which start jobs. One worker more than the cores in both
# phases: the tests wait on processes (a job's heartbeats, restart rounds, a Pending replacement; a
# CLI's start), and one worker per core kept 1.7 of 2 cores busy, one more keeps both. Each file stays
# on one worker, where its fault-free reference is computed once. Their bounds hold on a loaded
# machine. The workers take the files with tests marked `long` first (tests/conftest.py), so none ends
# a phase alone.
TEST_WORKERS := $(shell echo $$(( $$(nproc) + 1 )))
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -m "not slow or shareable" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -q
	$(PY) -m pytest -m "slow and not shareable" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -q

demo: setup
	$(VENV)/bin/nvrx-eks demo

bench: setup
	$(VENV)/bin/nvrx-eks bench peer

bench-checkpoint: setup
	$(VENV)/bin/nvrx-eks bench checkpoint

# The GPU-only paths on a machine with one GPU, under 5 minutes (bench/gpu_check.py); elsewhere it
# prints "no CUDA: skipped" and exits 0.
gpu-check: setup
	$(PY) -m nvrx_eks.bench.gpu_check

# The dashboard and the alert rules against a real Prometheus (Debian's `prometheus`, which .ci/run
# installs): the local job with faults scraped through the PodMonitor's relabeling, every dashboard
# query evaluated, promtool's unit tests of the rules (bench/observe.py). Under 5 minutes.
observe-check: setup
	$(PY) -m nvrx_eks.bench.observe

# The shipped images built here with podman (Debian's podman, runc and mmdebstrap, which .ci/run
# installs) and run as the rendered pods run them: the pod's user, read-only root, no capabilities, its
# mounts and environment (bench/image_check.py). Built images are cached: a rerun builds nothing new.
image-check: setup
	$(PY) -m nvrx_eks.bench.image_check

synth: setup
	npx cdk synth --quiet

render: setup
	$(VENV)/bin/nvrx-eks job render -f k8s/values/local-cpu.yaml -o dist/

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf cdk.out dist runs .pytest_cache .ruff_cache
