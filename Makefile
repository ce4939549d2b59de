# The two commands: `make synth` and `make test`. Each sets up what it needs on a fresh machine
# (Python 3.11, Node 20, make) and then runs; set-up steps rerun only when their inputs change.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip --disable-pip-version-check
CHECKOV_VENV := .tools/checkov
XLA_VENV := .tools/xla
CDK := node_modules/.bin/cdk
PYTEST_WORKERS ?= 2

# Offline and quiet: no CDK notices, version checks or telemetry, no instance-metadata probe,
# no Node 20 end-of-life banner on every jsii call.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_VERSION_CHECK := true
export CDK_DISABLE_CLI_TELEMETRY := true
export AWS_EC2_METADATA_DISABLED := true
# Bytecode caches on, even where the machine turns them off: the ~100 Python processes a test run
# starts then compile each module once, and pytest keeps its rewritten test modules. Templates do
# not move with them (tests/security/test_gate.py::test_synth_is_deterministic).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: synth test test-isa test-xla lint typecheck check bench train-local diagram clean setup browser

synth: $(VENV)/.runtime $(CDK)
	$(CDK) synth --no-notices --quiet --output cdk.out

test: $(VENV)/.dev $(CHECKOV_VENV)/.ready $(CDK) browser
	TRN_REQUIRE_CHROMIUM=1 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The compare report's test opens the page in headless Chromium (tests/browser.py): Debian's
# chromium and chromium-driver (about 80 MB to download, once per machine).
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends chromium chromium-driver)

# The trainer's tests under each set of ATen CPU kernels this CPU runs, from the portable default
# up to the widest, which `make test` gets: floats that two different kernels compute must agree
# on every x86-64 CPU, not on this one alone (tests/tolerance.py). ATen takes a set the CPU
# lacks and then dies of an illegal instruction, hence the list stops at the widest.
ISA_TESTS := tests/trainer tests/bench tests/examples
ISA_LIST := import torch; x86 = ["default", "avx2", "avx512"]; \
	own = torch.backends.cpu.get_cpu_capability().lower(); \
	print(*(x86[: x86.index(own) + 1] if own in x86 else ["default", own]))
test-isa: $(VENV)/.dev
	for cap in $$(env -u ATEN_CPU_CAPABILITY $(PY) -c '$(ISA_LIST)'); do \
		ATEN_CPU_CAPABILITY=$$cap $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup \
			--no-loadscope-reorder $(ISA_TESTS) || exit 1; \
	done

# The trn1 stack's PyTorch/XLA path on PyTorch/XLA's CPU device, in its own environment (torch_xla
# 2.9 and the torch 2.9 it needs: a 3.9 GB download, 7 GB on disk), too heavy for every `make test`.
test-xla: $(XLA_VENV)/.ready
	PJRT_DEVICE=CPU TRN_REQUIRE_XLA=1 PYTHONPATH=$(CURDIR)/training_image:$(CURDIR) $(XLA_VENV)/bin/python -m pytest -p no:cacheprovider -m xla tests/trainer/test_xla.py

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.dev
	$(VENV)/bin/mypy app.py trn_catalog platform_config constructs_lib stacks trnctl training_image/trainer training_image/entrypoint.py bench ops/hatch_build.py tests/conformance/chart_values.py
	# Each example is a standalone script (two named train.py): one mypy run each.
	for script in examples/*/*.py; do $(VENV)/bin/mypy $$script || exit 1; done

check: lint typecheck test

bench: $(VENV)/.dev $(CDK)
	$(PY) bench/run.py

# The architecture picture in the README, drawn from the synthesized templates. Graphviz comes
# from Debian's packages.
diagram: synth
	command -v dot >/dev/null || (apt-get update -qq && apt-get install -y -qq graphviz)
	$(PY) docs/diagram.py cdk.out > docs/architecture.dot
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg

train-local: $(VENV)/.dev
	bash training_image/demo.sh

setup: $(VENV)/.dev $(CHECKOV_VENV)/.ready $(CDK) browser

# The library (pyproject.toml) and the ops tools (ops/pyproject.toml: trnctl, trn-train), both
# editable; hatchling writes nothing into the checkout. Two runs: the second puts the commands on
# the PATH after the first has removed an older install's.
$(VENV)/.runtime: requirements.txt pyproject.toml ops/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PIP) install -q --no-deps --no-build-isolation -e ./ops
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt
	touch $@

$(CHECKOV_VENV)/.ready: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-checkov.txt
	touch $@

$(XLA_VENV)/.ready: requirements-xla.txt
	test -x $(XLA_VENV)/bin/python || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-xla.txt
	touch $@

$(CDK): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
