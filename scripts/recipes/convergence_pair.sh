#!/usr/bin/env bash
# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
#
# The convergence pair on Blackwell: FP8 then NVFP4 for N steps on C4 (maxtext's TFDS pipeline, c4/en:3.0.1),
# same weights, data order and schedule; then `python -m MaxText.compare` (loss gap in nats after warm-up, smoothed
# final gap, step-0 agreement, speedup). NVIDIA's published MaxText Llama 3 8B run: +0.026 nats mean gap over 10,000
# steps. By default the NVFP4 run is the recipe as published, attention projections in BF16, the program whose loss
# the NVFP4 paper reports; not throughput_pair.sh's default. `--attention fp8` runs that one instead (attention
# projections in FP8, as in the FP8 run): its loss at scale has not been measured.
# Cannot run without NVIDIA Blackwell GPUs, TransformerEngine and a prepared C4 TFDS dir.
#
# Usage: scripts/recipes/convergence_pair.sh --data-dir DIR [--model llama3_8b|llama3.1_405b] [--attention bf16|fp8]
#          [--steps N] [--out DIR] [--smooth N] [--eval-batches N] [--nsys] [--dry-run] [--force] [-- key=value ...]
#   --data-dir   TFDS data_dir holding c4/en/3.0.1 (maxtext's dataset_path)
#   --model      llama3_8b (default) or llama3.1_405b
#   --attention  the NVFP4 run's attention projections (default bf16): bf16 runs
#                configs/recipes/<model>_te_nvfp4.yml, fp8 <model>_te_nvfp4_fp8attn.yml, each against <model>_fp8.yml
#   --steps      training steps per run (default 10000)
#   --out        base_output_directory (default results/recipes/<model>_convergence_te_nvfp4, or
#                ..._te_nvfp4_fp8attn: one folder per pair); a run folder that already holds metrics is refused
#                (maxtext would append to them): pass another --out, or remove the folder
#   --smooth     steps in the comparison's trailing means (default 100)
#   --eval-batches  held-out C4 batches per eval (maxtext's eval_steps, default 40), every steps/10 steps
#                (eval_interval); the same batches in both runs, so the report's eval gap gets a paired 95%
#                interval. `-- eval_interval=... eval_steps=...` replace these.
#   --nsys       also profile 5 steps (from step 100, or 1 for runs <= 110 steps) under Nsight Systems
#   --dry-run    print the commands instead of running them
#   --force      run even where the GPU check fails (no Blackwell GPU found): a warning instead of a refusal
#   -- key=value maxtext overrides for both runs
# Environment: PYTHON (default .venv/bin/python, else python3);
#   multi-node: JAX_COORDINATOR_IP, JAX_COORDINATOR_PORT, NNODES, NODE_RANK.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

steps=10000
data_dir=""
smooth=100
eval_batches=40
attention=bf16
script_option() {
  case "$1" in
    --data-dir) data_dir="${2:?--data-dir needs a value}"; taken=2 ;;
    --smooth) smooth="${2:?--smooth needs a value}"; taken=2 ;;
    --eval-batches) eval_batches="${2:?--eval-batches needs a value}"; taken=2 ;;
  esac
}
parse_args "$@"
check_model "$model"
set_candidate "$attention"
check_hardware
check_positive_int --steps "$steps"
check_positive_int --smooth "$smooth"
check_positive_int --eval-batches "$eval_batches"
[[ -n "$data_dir" ]] || die "--data-dir is required: the TFDS data_dir that holds c4/en/3.0.1"
# Absolute before the cd below: a relative --out means relative to where the script was called from. The default is
# the pair's own: both pairs run fp8, and into one folder the second would append to the first's metrics.
out="$(realpath -m "${out:-$REPO_ROOT/results/recipes/${model}_convergence_${candidate}}")"
check_fresh "$out" "$BASELINE_QUANT" "$candidate"
tokenizer="$(maxtext_tokenizer tokenizer_llama3.tiktoken)"
profile_start=$(( steps > 110 ? 100 : 1 ))  # past warm-up when the run is long enough
evals=()  # maxtext refuses a key given twice: the user's own eval keys replace these
[[ " ${extra[*]-} " == *" eval_interval="* ]] || evals+=("eval_interval=$(( steps >= 10 ? steps / 10 : 1 ))")
[[ " ${extra[*]-} " == *" eval_steps="* ]] || evals+=("eval_steps=$eval_batches")

cd "$REPO_ROOT"
for name in "$BASELINE_QUANT" "$candidate"; do
  train_run "$model" "$name" "$out" "$nsys" "$profile_start" "steps=$steps" "dataset_path=$data_dir" \
    "tokenizer_path=$tokenizer" ${evals[@]+"${evals[@]}"} ${extra[@]+"${extra[@]}"}
done
compare_runs "$out" "$candidate" --smooth "$smooth"
