#!/usr/bin/env bash
# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
#
# The throughput pair on a Blackwell node (GB200 / GB300): FP8 then NVFP4, same recipe otherwise, synthetic data,
# 50 steps each; then `python -m MaxText.compare` (speedup = FP8 median step time / NVFP4 median step time,
# TFLOP/s/device, tokens/s/device). By default the NVFP4 run keeps the attention projections in FP8, as the FP8 run
# does, so the pair differs only in the MLP GEMMs: the speedup is the MLP change's alone. `--attention bf16` runs the
# recipe as published (attention projections in BF16), whose attention projections the pre-flight predicts slower
# than FP8's: that pair charges the MLP change with the attention change (docs/prediction.md, "The trade").
# Cannot run without NVIDIA Blackwell GPUs and TransformerEngine.
#
# Usage: scripts/recipes/throughput_pair.sh [--model llama3_8b|llama3.1_405b] [--attention fp8|bf16] [--steps N]
#          [--out DIR] [--perf-start-step N] [--nsys] [--dry-run] [--force] [-- key=value ...]
#   --model            llama3_8b (default) or llama3.1_405b
#   --attention        the NVFP4 run's attention projections (default fp8):
#                        fp8   configs/recipes/<model>_te_nvfp4_fp8attn.yml against <model>_fp8.yml: only the MLP
#                              GEMMs differ (NVFP4 against FP8)
#                        bf16  configs/recipes/<model>_te_nvfp4.yml against <model>_fp8.yml: the MLP GEMMs and the
#                              attention projections differ (BF16 against FP8)
#   --steps            training steps per run (default 50)
#   --out              base_output_directory; runs land in OUT/fp8 and OUT/te_nvfp4_fp8attn (OUT/te_nvfp4 with
#                      --attention bf16), the report in OUT/report (default
#                      results/recipes/<model>_throughput_te_nvfp4_fp8attn, or ..._te_nvfp4: one folder per pair).
#                      A run folder that already holds metrics is refused (maxtext would append to them): pass
#                      another --out, or remove the folder
#   --perf-start-step  first step in the throughput medians (default 10: compilation and autotuning come first)
#   --nsys             run under Nsight Systems, profiling 5 steps from --perf-start-step (maxtext profiler=nsys)
#   --dry-run          print the commands instead of running them
#   --force            run even where the GPU check fails (no Blackwell GPU found): a warning instead of a refusal
#   -- key=value ...   maxtext overrides for both runs, e.g. per_device_batch_size=4 dcn_fsdp_parallelism=2
# Environment: PYTHON (default .venv/bin/python, else python3);
#   multi-node: JAX_COORDINATOR_IP, JAX_COORDINATOR_PORT, NNODES, NODE_RANK.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

steps=50
perf_start=10
attention=fp8
script_option() {
  case "$1" in
    --perf-start-step) perf_start="${2:?--perf-start-step needs a value}"; taken=2 ;;
  esac
}
parse_args "$@"
check_model "$model"
set_candidate "$attention"
check_hardware
check_positive_int --steps "$steps"
[[ "$perf_start" =~ ^[0-9]+$ ]] || die "--perf-start-step must be a step >= 0, got '$perf_start'"
(( perf_start < steps )) || die "--perf-start-step ($perf_start) must be below --steps ($steps)"
# Absolute before the cd below: a relative --out means relative to where the script was called from. The default is
# the pair's own: both pairs run fp8, and into one folder the second would append to the first's metrics.
out="$(realpath -m "${out:-$REPO_ROOT/results/recipes/${model}_throughput_${candidate}}")"
check_fresh "$out" "$BASELINE_QUANT" "$candidate"

cd "$REPO_ROOT"
for name in "$BASELINE_QUANT" "$candidate"; do
  train_run "$model" "$name" "$out" "$nsys" "$perf_start" "steps=$steps" dataset_type=synthetic \
    enable_checkpointing=false ${extra[@]+"${extra[@]}"}
done
compare_runs "$out" "$candidate" --perf-start-step "$perf_start"
