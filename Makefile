# The two commands of the README: `make demo` and `make test`.
# Each sets itself up on a fresh machine: a virtualenv in .venv, the system packages
# (Prometheus, Alertmanager) and the Go-built control plane cached under ~/.cache/specdeploy.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo plan test test-long unit lint system-deps cluster-binaries leader-worker-sets real-vllm clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP) system-deps cluster-binaries
	$(BIN)/specdeploy demo $(DEMO_ARGS)

plan: $(STAMP)
	$(BIN)/specdeploy plan --offline examples/llama-70b-fp8-tp2.yaml

system-deps:
	bash scripts/system-deps.sh

cluster-binaries: $(STAMP)
	$(BIN)/specdeploy dev-cluster build

# The LeaderWorkerSet controller the e2e tests' cluster runs, for SDs laid out across nodes (a few minutes the
# first time).
leader-worker-sets: $(STAMP)
	$(BIN)/specdeploy dev-cluster build --leader-worker-sets

# vLLM's CPU build and its stand-in models, cached under ~/.cache/specdeploy (6-15 minutes the first time).
real-vllm: $(STAMP)
	$(BIN)/specdeploy dev-cluster build --engine vllm

lint: $(STAMP)
	$(BIN)/ruff check operator engine-image tests benchmarks
	$(BIN)/mypy operator/specdeploy

unit: $(STAMP)
	$(BIN)/pytest -m "not e2e" tests

test: $(STAMP) system-deps cluster-binaries leader-worker-sets real-vllm lint
	SPECDEPLOY_REAL_VLLM=1 $(BIN)/pytest -m "not long" tests

# The long runs: the operator SIGKILLed at 20 seeded random points of the rollback, 400 hostile
# SpeculativeDeployments against the apiserver, and the ten-minute soak of healthy noisy traffic
# (about 40 minutes).
test-long: $(STAMP) system-deps cluster-binaries leader-worker-sets
	SPECDEPLOY_FAULT_RUNS=20 SPECDEPLOY_HOSTILE_EXAMPLES=400 $(BIN)/pytest tests/e2e/test_faults.py \
		tests/e2e/test_hostile_input.py
	$(BIN)/pytest -m long tests

clean:
	rm -rf $(VENV)
