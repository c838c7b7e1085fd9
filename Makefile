# Entry points of the MaxText NVFP4 plugin. `make help` lists them.

PY := .venv/bin/python
GPU_VENV := .venv-gpu
EXPORT_VENV := .venv-export
QUICKSTART_DIR := results/quickstart
QUICKSTART_ARGS :=
STUDY_DIR := results/study
STUDY_ARGS :=
DEVICE := cpu

.DEFAULT_GOAL := help
.PHONY: help setup test test-cpu test-fast test-te test-export quickstart study study-attention

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

setup: ## Create/refresh .venv with ./setup.sh (seconds when nothing changed).
	./setup.sh

test: test-cpu test-te test-export ## The CPU suite, then the TE group, then the export group (what CI runs).

# Both cores: pytest-xdist, a test file per worker (module fixtures such as a file's training runs stay on one), in
# the order tests/conftest.py gives (files with the most `slow` tests first; xdist would reorder by test count).
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test-cpu: setup ## The CPU suite in .venv (everything but tests/te and tests/export).
	$(PYTEST) tests --ignore=tests/te --ignore=tests/export

test-fast: setup ## The inner loop: the CPU suite without the training subprocesses (`slow`), fewer hypothesis examples.
	$(PYTEST) -m "not slow" --hypothesis-profile=fast tests --ignore=tests/te --ignore=tests/export

test-te: ## Build .venv-gpu (./setup.sh --gpu; ~25 min once) and lower the TE backend to CUDA on CPU.
	./setup.sh --gpu --venv $(GPU_VENV)
	MAXTEXT_TE_TESTS=required $(GPU_VENV)/bin/python -m pytest -q -n 2 --dist worksteal -p no:cacheprovider tests/te

test-export: setup ## Build .venv-export (./setup.sh --export: torch CPU, compressed-tensors, transformers, ModelOpt) and read exports with the formats' own code.
	./setup.sh --export --venv $(EXPORT_VENV)
	./setup.sh --gpu --venv $(GPU_VENV)  # TE's reference quantizer (tests/export/reference_test.py); seconds once built
	MAXTEXT_EXPORT_TESTS=required MAXTEXT_EXPORT_PYTHON=$(EXPORT_VENV)/bin/python $(PYTEST) tests/export

quickstart: setup ## bf16/fp8/te_nvfp4/te_nvfp4_no_rht on the local corpus (6-9 min on 2 quiet CPU cores), compared in results/quickstart/
	$(PY) -m MaxText.quickstart --out $(QUICKSTART_DIR) $(QUICKSTART_ARGS)

# DEVICE=gpu trains in .venv-gpu (built by ./setup.sh --gpu), on configs/study_gpu.yml.
STUDY_PY := $(if $(filter gpu,$(DEVICE)),$(GPU_VENV)/bin/python,$(PY))

study-attention: ## bf16, fp8, the MLP-only recipe, FP8 and NVFP4 attention projections x 3 seeds (about 25 min on 2 CPU cores), in results/study-attention/
	./setup.sh
	$(PY) -m MaxText.quickstart --study --precisions bf16 fp8 te_nvfp4 te_nvfp4_fp8attn te_nvfp4_all --out results/study-attention $(STUDY_ARGS)

study: ## The quickstart model in 6 precisions x 3 seeds, one report with intervals (24 min on 2 CPU cores; DEVICE=gpu: larger, on a GPU), in results/study/
	$(if $(filter gpu,$(DEVICE)),./setup.sh --gpu --venv $(GPU_VENV),./setup.sh)
	$(STUDY_PY) -m MaxText.quickstart --study --device $(DEVICE) --out $(STUDY_DIR) $(STUDY_ARGS)
