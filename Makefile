# Quick start: `make demo` (local end-to-end recovery against an embedded AWS emulator)
# and `make test` (the quick tier of the tests, offline; `make test-all` runs every test). Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed
CDK := npx --no-install cdk
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
# jsii's banner for a Node.js past its support (this Node's major; app.py sets it too): the
# tests that synthesize print it otherwise, as Python bytes (b'!! ...').
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION ?= $(shell node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/')
export PYTHONPATH := $(CURDIR)/lambdas:$(CURDIR)
# Bytecode caches written (empty: off is any non-empty value): where the environment sets
# PYTHONDONTWRITEBYTECODE, every test worker and every process the tests start (playground,
# CLIs, synth) compiled botocore, moto and the stack from source again (~15 s each).
export PYTHONDONTWRITEBYTECODE :=
# Tests and local mode must never reach AWS: fake credentials, fixed region.
LOCAL_ENV := AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_SESSION_TOKEN=testing \
	AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null

.PHONY: install install-cdk demo test test-all test-slow test-faults test-campaigns test-deep lint typecheck bench synth deploy \
	clean local-api fuzz config-docs doctor playground soak contract-grants

# --no-compile: byte-compiling every installed module (aws-cdk-lib's are huge) took half the
# install's CPU; Python compiles what a process imports (docs/testing.md: measured both ways).
$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --upgrade pip
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-compile -r requirements-dev.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

$(NPM_STAMP): package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $(NPM_STAMP)

install-cdk: $(NPM_STAMP)

demo: $(STAMP)
	$(LOCAL_ENV) $(PY) -m local_mode.demo

# A local GPU cluster behind the local REST API: submit, watch, fault and recover jobs with the
# CLIs (docs/playground.md). PLAYGROUND_ARGS="--nodes 8 --speed 10" and the like.
PLAYGROUND_ARGS ?=
playground local-api: $(STAMP)
	$(LOCAL_ENV) $(PY) -m local_mode.playground $(PLAYGROUND_ARGS)

# The quick tier (docs/testing.md): everything but the slow tier (tests/conftest.py).
# Prints its wall time and the 10 slowest tests, so a slower suite is seen when it lands.
# Three workers on the 2-core machine: the playground and documentation tests wait on their
# subprocesses and the clock, a third worker fills those waits (measured: 364 s, not ~400).
# mypy runs beside the tests, its report printed after theirs: on a fresh clone (no cache) it
# took ~24 s of one core while the other waited (docs/testing.md).
TEST_WORKERS ?= 3
test: $(STAMP) install-cdk
	@start=$$(date +%s); \
	$(VENV)/bin/ruff check . || exit 1; \
	types=$$(mktemp); $(VENV)/bin/mypy > $$types 2>&1 & mypy_pid=$$!; \
	$(LOCAL_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --quick --durations=10 $(PYTEST_ARGS); \
	status=$$?; wait $$mypy_pid || status=1; cat $$types; rm -f $$types; \
	echo "make test: $$(( $$(date +%s) - start )) s of wall time (exit $$status)"; exit $$status

# Everything: both tiers, every call of every crash campaign broken, the long fuzz.
test-all: $(STAMP) install-cdk
	@start=$$(date +%s); \
	$(VENV)/bin/ruff check . && $(VENV)/bin/mypy && \
	$(LOCAL_ENV) GPU_RECOVERY_FAULTS=all FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -n auto --dist loadgroup \
		--durations=10 $(PYTEST_ARGS); \
	status=$$?; echo "make test-all: $$(( $$(date +%s) - start )) s of wall time (exit $$status)"; exit $$status

# Only the slow tier, its crash campaigns sampled as make test samples the GPU-fault one.
test-slow: $(STAMP) install-cdk
	@start=$$(date +%s); \
	$(LOCAL_ENV) $(PY) -m pytest -q -n auto --dist loadgroup -m slow --durations=10 $(PYTEST_ARGS); \
	status=$$?; echo "make test-slow: $$(( $$(date +%s) - start )) s of wall time (exit $$status)"; exit $$status

# Every AWS call of every crash campaign broken in turn, both ways (make test breaks the first
# call of each stage of the GPU-fault recovery); .ci/run runs it. Prints its wall time.
test-campaigns test-faults: $(STAMP)
	@start=$$(date +%s); \
	$(LOCAL_ENV) GPU_RECOVERY_FAULTS=all $(PY) -m pytest -q -n auto --dist loadgroup tests/crash_consistency \
		$(PYTEST_ARGS); \
	status=$$?; echo "make test-campaigns: $$(( $$(date +%s) - start )) s of wall time (exit $$status)"; exit $$status

# What .ci/run runs after make test, in one pytest run: the slow tier and every call of every
# crash campaign broken (make test-slow + make test-campaigns, ~1.5 cores busy one after the
# other: the 8,192-task recovery alone for minutes). The groups with a test marked `long` are
# handed out first (tests/conftest.py; --no-loadscope-reorder keeps that order), the
# campaigns' groups fill the other worker meanwhile. Prints its wall time.
test-deep: $(STAMP) install-cdk
	@start=$$(date +%s); \
	$(LOCAL_ENV) GPU_RECOVERY_FAULTS=all $(PY) -m pytest -q -n auto --dist loadgroup --no-loadscope-reorder \
		-m "slow or campaign" --durations=10 $(PYTEST_ARGS); \
	status=$$?; echo "make test-deep: $$(( $$(date +%s) - start )) s of wall time (exit $$status)"; exit $$status

# Hours of a busy cluster with a share of every AWS call failing at random (local_mode/soak.py):
# every job must end, every failure be e-mailed, nothing forgotten. SOAK_ARGS="--seeds 5 --rate 0.01".
SOAK_ARGS ?=
soak: $(STAMP)
	$(LOCAL_ENV) $(PY) -m local_mode.soak $(SOAK_ARGS)

# Longer schemathesis run of both APIs against the local API (make test runs 25 examples
# per operation; FUZZ_EXAMPLES=... to change).
FUZZ_EXAMPLES ?= 400
fuzz: $(STAMP)
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(LOCAL_ENV) $(PY) -m pytest -q tests/fuzz

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(LOCAL_ENV) $(PY) -m bench.run $(BENCH)

synth: $(STAMP) install-cdk
	$(CDK) synth --app "$(PY) app.py" $(CDK_ARGS)

deploy: $(STAMP) install-cdk
	$(CDK) deploy --app "$(PY) app.py" $(CDK_ARGS)

# Is the deployed account ready for a GPU fault? Read-only (DOCTOR_ARGS="--stack-name ...").
doctor: $(STAMP)
	$(VENV)/bin/gpu-recovery-admin doctor $(DOCTOR_ARGS)

# Regenerate the configuration tables (docs/configuration.md: every key; README.md: the
# common ones) from infra/config/ (a test checks both).
config-docs: $(STAMP)
	$(PY) -m infra.config --write-docs

# The deployed functions' grants the simulated runs are held to (local_mode/sim/contract/
# grants.json, ~40 s: two syntheses); tests/infra/test_infra_grants.py fails when it is stale.
# GRANTS_USAGE_DIR=<dir> make test ... then `$(PY) -m local_mode.sim.contract grants --unused <dir>`
# lists the grants no run used (--operations <dir>: what each function calls).
contract-grants: $(STAMP) install-cdk
	$(LOCAL_ENV) $(PY) -m local_mode.sim.contract grants --write

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache .ruff_cache .mypy_cache
