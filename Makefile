# Entry points of the MaxText NVFP4 plugin. `make help` lists them.

PY := .venv/bin/python
QUICKSTART_DIR := results/quickstart
QUICKSTART_ARGS :=

.DEFAULT_GOAL := help
.PHONY: help setup test quickstart

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

setup: ## Create/refresh .venv with ./setup.sh (seconds when nothing changed).
	./setup.sh

test: setup ## Run the test suite (CPU).
	$(PY) -m pytest -q tests

quickstart: setup ## bf16/fp8/te_nvfp4/te_nvfp4_no_rht on the local corpus (~6 min, CPU), compared in results/quickstart/.
	$(PY) scripts/quickstart.py --out $(QUICKSTART_DIR) $(QUICKSTART_ARGS)
