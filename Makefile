# The commands people run; CI runs `make test` (see .ci/run).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run test lint bench
setup: $(VENV)/.installed

# torch is pinned first: 2.13.0 is the CPU build on these machines; any CUDA build works on a GPU box.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

run: setup
	$(VENV)/bin/pagedq up

lint: setup
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/engine_throughput.py
