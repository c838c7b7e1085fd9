# Entry points of the MaxText NVFP4 plugin. `make help` lists them.

PY := .venv/bin/python
QUICKSTART_DIR := results/quickstart
QUICKSTART_STEPS := 20

.DEFAULT_GOAL := help
.PHONY: help setup test quickstart

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

setup: ## Create/refresh .venv with ./setup.sh (seconds when nothing changed).
	./setup.sh

test: setup ## Run the test suite (CPU).
	$(PY) -m pytest -q tests

quickstart: setup ## Train the tiny Llama on CPU for a few steps; metrics in results/quickstart/.
	mkdir -p $(QUICKSTART_DIR)
	$(PY) -m MaxText.train configs/tiny.yml run_name=tiny_bf16 base_output_directory=$(QUICKSTART_DIR) \
	  steps=$(QUICKSTART_STEPS) metrics_file=$(QUICKSTART_DIR)/tiny_bf16.jsonl
	@echo "quickstart: per-step metrics in $(QUICKSTART_DIR)/tiny_bf16.jsonl"
