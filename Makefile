# Two commands do all the set-up on a fresh machine (Python >= 3.10 with venv):
#   make demo   install paralela (with torch, the sweep, example and serve extras) in .venv and run `paralela demo`
#   make test   install it with the dev tools, start the local Slurm cluster, run lint,
#               types and the tests
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# compat: a path entry instead of an import hook, which would add ~10 ms to every worker start
EDITABLE := --config-settings editable_mode=compat

.PHONY: demo test lint docs install install-dev bench clean gpu-wheels gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[sweep,examples,serve]' $(EDITABLE)

install-dev: $(BIN)/python
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]' $(EDITABLE)

demo: install
	$(BIN)/paralela demo

lint: install-dev
	$(BIN)/ruff check paralela tests examples bench
	$(BIN)/ruff format --check paralela tests examples bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml): the guide, the lessons, and the CLI and API
# references generated from the code. --strict: a broken link or anchor, or a public name
# with no documentation, fails the build (and so make test and CI).
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site/

# The tests need a real Slurm cluster: run-tests.sh starts it (as root) and stops it after.
test: lint docs
	PYTHON=$(BIN)/python bash tools/run-tests.sh

bench:
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install --quiet -r bench/requirements.txt
	.venv-bench/bin/python -m pip install --quiet -e . --no-deps $(EDITABLE)
	.venv-bench/bin/python bench/bench_map.py

# The prepared GPU check (docs/gpu-check.md): gpu-wheels here (network), gpu-check on the
# lent GPU machine with .gpu-wheels carried; GPU_CHECK_OUT is where gpu-check.md goes.
GPU_CHECK_OUT ?= gpu-check-out

gpu-wheels:
	PYTHON=$(PYTHON) bash tools/gpu-check.sh --wheels

gpu-check:
	bash tools/gpu-check.sh $(GPU_CHECK_OUT)

clean:
	rm -rf $(VENV) .venv-bench build site *.egg-info .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
