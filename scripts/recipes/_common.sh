# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
# Shared by throughput_pair.sh and convergence_pair.sh (sourced, not run). Why a shared file: both scripts must
# build the training and comparison command lines the same way, and --dry-run must print exactly what would run.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The project's interpreter when ./setup.sh made one (a bare `python` lacks maxtext and the plugin), else python3.
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
# Blackwell (GB200/GB300, B200) is compute capability 10.x; TransformerEngine runs NVFP4 GEMMs only there.
MIN_COMPUTE_CAP=10.0
MODELS=(llama3_8b llama3.1_405b)
BASELINE_QUANT="fp8"
# maxtext's nsys hook (profiler=nsys) calls cudaProfilerStart/Stop around the profiled steps; nsys records only
# that range. Flags from the comment next to `profiler:` in maxtext's base.yml.
NSYS_FLAGS=(profile -s none --force-overwrite true --capture-range=cudaProfilerApi --capture-range-end=stop)
# Multi-node: maxtext reads JAX_COORDINATOR_IP/JAX_COORDINATOR_PORT/NNODES/NODE_RANK; run this script on every
# node. Only rank 0 writes metrics.jsonl and runs the comparison.
NODE_RANK="${NODE_RANK:-${SLURM_PROCID:-0}}"

dry_run=0
force=0
attention=""  # --attention: each script sets its default after sourcing this file
candidate=""  # set_candidate
model="llama3_8b"
out=""
nsys=0
extra=()

die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# Parses the options both scripts take (--model --attention --steps --out --nsys --dry-run --force --help, and
# `-- key=value` overrides into `extra`). An option it does not know goes to the script's own `script_option NAME
# VALUE`, which sets its variable and `taken` (how many words it used: 2 for an option with a value, 0 when it does
# not know it).
parse_args() {
  while (( $# )); do
    case "$1" in
      --model) model="${2:?--model needs a value}"; shift 2 ;;
      --attention) attention="${2-}"; shift $(( $# > 1 ? 2 : 1 )) ;;  # a missing value fails in set_candidate
      --steps) steps="${2:?--steps needs a value}"; shift 2 ;;
      --out) out="${2:?--out needs a value}"; shift 2 ;;
      --nsys) nsys=1; shift ;;
      --dry-run) dry_run=1; shift ;;
      --force) force=1; shift ;;
      -h|--help) usage; exit 0 ;;
      --) shift; extra=("$@"); break ;;
      *)
        taken=0
        script_option "$1" "${2:-}"
        (( taken )) || die "unknown argument '$1' (see --help)"
        shift "$taken" ;;
    esac
  done
}

# Prints a command line shell-quoted (what --dry-run shows), then runs it unless --dry-run.
run() {
  local quoted
  printf -v quoted '%q ' "$@"
  echo "${quoted% }"
  if (( ! dry_run )); then
    "$@"
  fi
}

# Prints the script's leading comment block (its usage text), without the shebang and copyright lines.
usage() {
  awk 'NR <= 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

# Refuses to start a recipe where it cannot run: every GPU nvidia-smi lists must be Blackwell. --dry-run skips the
# check (it runs nothing); --force turns the refusal into a warning (e.g. a node whose nvidia-smi is not on PATH).
check_hardware() {
  (( dry_run )) && return 0
  local caps problem=""
  caps="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null)" || caps=""
  if [[ -z "${caps//[[:space:]]/}" ]]; then
    problem="no NVIDIA GPU found (nvidia-smi missing or lists none)"
  else
    local cap
    for cap in $caps; do
      if ! awk -v c="$cap" -v m="$MIN_COMPUTE_CAP" 'BEGIN { exit !(c + 0 >= m + 0) }'; then
        problem="GPU compute capabilities $(echo $caps | tr ' ' ',') include one below $MIN_COMPUTE_CAP (not Blackwell)"
        break
      fi
    done
  fi
  [[ -z "$problem" ]] && return 0
  if (( force )); then
    echo "$(basename "$0"): warning: $problem; running anyway (--force)" >&2
    return 0
  fi
  die "$problem: this recipe needs NVIDIA Blackwell GPUs (compute capability >= $MIN_COMPUTE_CAP) with" \
    "TransformerEngine; --dry-run prints the commands, --force runs anyway"
}

check_model() {
  local m
  for m in "${MODELS[@]}"; do
    [[ "$1" == "$m" ]] && return 0
  done
  die "unknown --model '$1' (valid: ${MODELS[*]})"
}

# The NVFP4 run for --attention ATTN: its recipe is configs/recipes/<model>_<name>.yml, and the name is its run name
# and folder. fp8: attention projections in FP8 as in the baseline, so the pair differs only in the MLP GEMMs; bf16:
# the recipe as published (attention projections in BF16), which differs from the baseline there too.
# Sets `candidate`, or fails in one line (not in $(...): die must end the script).
set_candidate() {
  case "$1" in
    fp8) candidate="te_nvfp4_fp8attn" ;;
    bf16) candidate="te_nvfp4" ;;
    *) die "--attention must be bf16 or fp8, got '$1'" ;;
  esac
}

check_positive_int() {
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
}

# Absolute path of a tokenizer shipped in the installed maxtext wheel (the wheel resolves bare names against a
# folder that exists only in a source checkout).
maxtext_tokenizer() {
  "$PYTHON" - "$1" <<'EOF'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("maxtext")
if spec is None:
  sys.exit("maxtext is not installed for this python; set PYTHON=/path/to/venv/bin/python")
path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "assets" / "tokenizers" / sys.argv[1]
if not path.is_file():
  sys.exit(f"{path} is missing")
print(path)
EOF
}

# metrics_path OUT NAME: the metrics file this node's run NAME writes (rank 0: metrics.jsonl, the one compared).
metrics_path() {
  if (( NODE_RANK == 0 )); then echo "$1/$2/metrics.jsonl"; else echo "$1/$2/metrics.rank${NODE_RANK}.jsonl"; fi
}

# check_fresh OUT NAME...: refuses, in one line and before anything runs (--dry-run included: it only reads), a run
# folder OUT/NAME that already holds this node's metrics. Why: maxtext appends to metrics_file, so a second run into
# the folder (the pair run twice, or both --attention pairs into one --out) would mix two runs' steps in one file,
# and the comparison would read them as one run.
check_fresh() {
  local out="$1" name metrics
  shift
  for name in "$@"; do
    metrics="$(metrics_path "$out" "$name")"
    if [[ -s "$metrics" ]]; then
      die "$out/$name already holds $(basename "$metrics") from an earlier run, and maxtext would append this" \
        "run's steps to it: pass another --out, or remove $out/$name"
    fi
  done
}

# train_run MODEL NAME OUT NSYS PROFILE_START [key=value ...]: one `python -m MaxText.train` run of the recipe
# configs/recipes/MODEL_NAME.yml, named NAME (its folder in OUT and the report's name for it).
train_run() {
  local model="$1" name="$2" out="$3" nsys="$4" profile_start="$5"
  shift 5
  local recipe="configs/recipes/${model}_${name}.yml"
  [[ -f "$REPO_ROOT/$recipe" ]] || die "missing recipe $recipe"
  local metrics
  metrics="$(metrics_path "$out" "$name")"
  local cmd=("$PYTHON" -m MaxText.train "$recipe" "run_name=$name" "base_output_directory=$out" "metrics_file=$metrics")
  if (( nsys )); then
    cmd=(nsys "${NSYS_FLAGS[@]}" -o "$out/$name/profile.rank${NODE_RANK}" "${cmd[@]}" profiler=nsys
      "skip_first_n_steps_for_profiler=$profile_start" profiler_steps=5)
  fi
  run mkdir -p "$out/$name"  # maxtext appends to metrics_file but does not create its folder
  run "${cmd[@]}" "$@"
}

# compare_runs OUT CANDIDATE [compare flags ...]: the FP8-vs-NVFP4 report in OUT/report (rank 0 only).
compare_runs() {
  local out="$1" candidate="$2"
  shift 2
  (( NODE_RANK == 0 )) || return 0
  run "$PYTHON" -m MaxText.compare "$out/$BASELINE_QUANT" "$out/$candidate" --baseline "$BASELINE_QUANT" \
    --out "$out/report" "$@"
}
