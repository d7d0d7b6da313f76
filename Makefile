# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test bench clean profile-a100 validate-a100 validate-published profile-h200 profile-h100

venv: $(STAMP)

# torch is installed first and pinned to the local CPU build so nothing pulls CUDA wheels.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m compileall -q vtrain  # bytecode, as pip writes it for a regular install (not for -e)
	touch $(STAMP)

# The main job on shipped traces: ingest a recorded t=2 p=2 d=2 run, show its tables, validate the simulator on it.
demo: venv
	$(VENV)/bin/vtrain ingest traces/t2p2d2 -o profiles/demo --force
	$(VENV)/bin/vtrain tables profiles/demo --top 10
	$(VENV)/bin/vtrain validate traces/t2p2d2 -o reports/demo

# Two workers (pytest-xdist), a test file each: the suite took 17-20 min in one process on CI's 2 cores, 10 min
# so; a file's module fixtures (recordings, ingested profiles) stay in one worker.
test: venv
	$(PY) -m pytest -q --ignore=tests/benchmarks -n 2 --dist loadfile

bench: venv
	$(PY) -m pytest -q tests/benchmarks --benchmark-enable --benchmark-only

# profiles/a100: a device model fitted only to real A100 measurements made by others (tests/data/a100, with
# their licences): nccl-tests all-reduce tables, LLMCompass and vidur kernel timings, vidur collectives, and
# every 20th row of vTrain's measured iteration times. See profiles/a100.README.md. --recompute none: the
# kernels say these runs cannot have recomputed every layer's forward (see profiles/a100.README.md, "Accuracy").
A100 := tests/data/a100
profile-a100: venv
	$(VENV)/bin/vtrain ingest traces/hta-a100-2rank-nccl -o profiles/.hta-a100 --force
	rm -f profiles/a100/README.md  # put there below: --force keeps what vtrain did not write
	$(VENV)/bin/vtrain fit -o profiles/a100 --force --device A100-40GB \
	  --nccl-tests $(A100)/vtrain-a100/nccl-tests-allreduce-a100 --llmcompass $(A100)/llmcompass-a100 \
	  --vidur-compute $(A100)/vidur-a100/compute --vidur-network $(A100)/vidur-a100/network \
	  --profile profiles/.hta-a100 --measurements $(A100)/vtrain-a100/ground_truth_single.csv --fit-every 20 \
	  --recompute none
	rm -rf profiles/.hta-a100
	cp profiles/a100.README.md profiles/a100/README.md

# H200: layer kernels timed on one H200 (validators/gpu/layer_kernels.py); the host's time per operator measured in
# a launch-bound recording on it (traces/gpu/h200-small-eager); no collective measurements
profile-h200: venv
	$(VENV)/bin/vtrain ingest traces/gpu/h200-small-eager -o build/h200-host --force
	rm -f profiles/h200/README.md  # put there below: --force keeps what vtrain did not write
	$(VENV)/bin/vtrain fit -o profiles/h200 --force --device H200 --vidur-compute profiles/h200-kernels \
	  --profile build/h200-host
	cp profiles/h200.README.md profiles/h200/README.md

# H100 (80GB HBM3): the same sweep and the same recording on one H100
profile-h100: venv
	$(VENV)/bin/vtrain ingest traces/gpu/h100-small-eager -o build/h100-host --force
	rm -f profiles/h100/README.md  # put there below: --force keeps what vtrain did not write
	$(VENV)/bin/vtrain fit -o profiles/h100 --force --device H100 --vidur-compute profiles/h100-kernels \
	  --profile build/h100-host
	cp profiles/h100.README.md profiles/h100/README.md

# vtrain's accuracy on vTrain's 1,440 measured single-node A100 runs (rows fitted on are excluded).
validate-a100: venv
	$(VENV)/bin/vtrain validate --measurements $(A100)/vtrain-a100/ground_truth_single.csv \
	  --profile profiles/a100 --recompute none -o reports/a100-ground-truth

# vtrain's accuracy on published A100 runs (validators/published/README.md: sources, and what each table adds)
PUBLISHED := sc21-table1 korthikanti-table5 mtnlg-530b bloom-176b
validate-published: venv
	@for table in $(PUBLISHED); do \
	  echo "vtrain validate --measurements validators/published/$$table.csv --profile profiles/a100"; \
	  $(VENV)/bin/vtrain validate --measurements validators/published/$$table.csv --profile profiles/a100 \
	    -o reports/published-$$table || exit 1; \
	done

clean:
	rm -rf $(VENV) profiles/demo reports/demo
