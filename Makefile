# `make test` and `make demo` set everything up from a fresh clone (torch pinned to the local CPU wheel).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
# CPU training: keep freed memory in glibc's heap instead of unmapping and faulting it back every step
# (see ablate.workers.cpu_training_env; a third of a smoke run's time otherwise goes to the kernel).
export MALLOC_MMAP_THRESHOLD_ ?= 1073741824
export MALLOC_TRIM_THRESHOLD_ ?= 1073741824

.PHONY: install test test-fast demo cluster cluster-stop bench clean-demo

BASE := $(VENV)/.installed-base

install: $(STAMP)

# The demo needs the package and TensorBoard (`--logger tensorboard`, `tensorboard --logdir`: docs/run-options.md); the
# tests add pytest, import-linter and lm-evaluation-harness (the `eval` extra, large: the README names it for
# `ablate eval`).
# The installs go through uv (astral-sh/uv, put into the venv by pip): the demo's install takes ~30 s instead of pip's
# ~85 s here. uv reads no pip configuration, so pip's find-links (PIP_FIND_LINKS and `pip config`: where a machine
# keeps its CPU build of torch, which the pin `torch==2.13.0` then takes) are handed to it. Modules are compiled to
# bytecode at install, as pip does: every process of the demo and the suite imports torch and Lightning Fabric from it,
# also where PYTHONDONTWRITEBYTECODE is set (~8 s more per process otherwise).
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
comma := ,
empty :=
space := $(empty) $(empty)
UV = VIRTUAL_ENV=$(VENV) UV_COMPILE_BYTECODE=1 UV_FIND_LINKS='$(subst $(space),$(comma),$(FIND_LINKS))' $(BIN)/uv

$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check uv
	$(UV) pip install -q -e '.[tensorboard]'
	touch $(BASE)

$(STAMP): $(BASE)
	$(UV) pip install -q -e '.[test,tensorboard,eval]'
	touch $(STAMP)

cluster:
	bash slurm/local-cluster.sh start

cluster-stop:
	bash slurm/local-cluster.sh stop

# Two workers: the suite is CPU-bound and single-threaded per test, and the machine has two cores. Each worker
# takes a whole test file at a time (a file's module fixtures are built once), in the collected order, which
# puts the system tier's files first (tests/conftest.py), so that a long file never starts last. Every tier
# (unit, run, system) and mark runs: slow, slurm and benchmark. One tier: `pytest -m unit` (or run, or system).
PYTEST_WORKERS := -n 2 --dist loadfile --no-loadscope-reorder

test: install cluster
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) --durations=20

test-fast: install
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) -m "not slurm"

demo: $(BASE)
	$(BIN)/ablate data prepare --source sample --out data/sample
	$(BIN)/ablate submit demo --executor local
	$(BIN)/ablate report demo
	$(BIN)/ablate table demo --kind paired
	$(BIN)/ablate submit testbed --tier abstain-stream --arms baseline sink-logit --executor local
	$(BIN)/ablate report testbed
	$(BIN)/ablate table testbed --kind declared --ran

# What `make demo` made: the demo's and the testbed's results and the prepared sample data (the venv stays).
clean-demo:
	@for path in results/demo results/testbed data/sample; do \
		if [ -e "$$path" ]; then echo "removing $$path ($$(du -sh "$$path" | cut -f1))"; rm -rf -- "$$path"; \
		else echo "$$path: not there"; fi; \
	done

bench: install
	$(BIN)/python benchmarks/arms.py
