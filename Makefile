# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test bench clean

venv: $(STAMP)

# torch is installed first and pinned to the local CPU build so nothing pulls CUDA wheels.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The main job on shipped traces: ingest a recorded t=2 p=2 d=2 run, show its tables, validate the simulator on it.
demo: venv
	$(VENV)/bin/vtrain ingest traces/t2p2d2 -o profiles/demo --force
	$(VENV)/bin/vtrain tables profiles/demo --top 10
	$(VENV)/bin/vtrain validate traces/t2p2d2 -o reports/demo

test: venv
	$(PY) -m pytest -q

bench: venv
	$(PY) -m pytest -q tests/benchmarks --benchmark-enable --benchmark-only

clean:
	rm -rf $(VENV) profiles/demo reports/demo
