# The commands people run; CI runs `make test` (see .ci/run).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test-setup run test test-fast lint bench gpu-check gpu-wheels
# `setup` is what running needs; `test-setup` adds the browser the console's tests drive.
setup: $(VENV)/.installed
test-setup: setup /usr/bin/chromium

# torch is pinned first: 2.13.0 is the CPU build on these machines; any CUDA build works on a GPU box.
# The first install takes a few minutes and about 2.4 GB; pip shows what it fetches as it goes.
$(VENV)/.installed: pyproject.toml
	@echo "== creating $(VENV) (first run only: a few minutes, about 2.4 GB)"
	python3 -m venv $(VENV)
	$(PY) -m pip install --progress-bar on --upgrade pip
	@echo "== installing torch"
	$(PY) -m pip install --progress-bar on torch==2.13.0
	@echo "== installing pagedq and its dependencies"
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	touch $@

# The console's browser tests drive Debian's Chromium through Playwright (no browser download). Without
# it they skip on a laptop and fail under CI=true. Only the tests need it, never `make run`.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
/usr/bin/chromium:
	@echo "== installing Debian's chromium (the console's browser tests)"
	$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -q chromium \
		|| echo "!! chromium not installed: tests/api/test_console.py will skip (and fail under CI=true)"

# `make run PORT=8001 HOST=0.0.0.0`: where the API listens (the clients read the same PAGEDQ_PORT/HOST).
run: setup
	$(if $(PORT),PAGEDQ_PORT=$(PORT)) $(if $(HOST),PAGEDQ_HOST=$(HOST)) $(VENV)/bin/pagedq up

lint: setup
	$(VENV)/bin/ruff check .

test: lint test-setup
	$(PY) -m pytest -q

# The tests marked `fast` (pyproject.toml): the contract, the engine core, the kernels' torch references
# and API validation, in under 3 minutes; `make test` (what CI runs) is the whole suite.
test-fast: lint test-setup
	$(PY) -m pytest -q -m fast

bench: $(VENV)/.bench-installed
	$(PY) bench/engine_throughput.py

# The `bench` extra (ONNX Runtime for bench/embeddings.py), on top of `setup`; CI never installs it.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --progress-bar on -e '.[bench]'
	touch $@

# The GPU runbook (README, "On a GPU"): `make gpu-check STEPS=1-4`, `make gpu-check ARGS=--dry-run`.
# A bare GPU machine has no venv: the python on PATH runs it there.
GPU_PY = $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PY) -m bench.gpu_check $(if $(STEPS),--steps $(STEPS)) $(ARGS)

# What the GPU machines lack, as CPython 3.12 wheels in .gpu-wheels/ (ignored), to carry with the tree.
gpu-wheels: setup
	$(PY) bench/gpu_wheels.py
