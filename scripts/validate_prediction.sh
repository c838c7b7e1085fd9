#!/usr/bin/env bash
# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
# On one Hopper GPU: times maxtext's real train step in BF16 and FP8 (configs/validate.yml, 25 steps each, the median
# after 5 of warm-up) and prints it beside the pre-flight's calibrated prediction for the same GPU (docs/prediction.md,
# "Measured on a GPU"). About 5 minutes of GPU time on an H100 (two training runs; the pre-flight compiles on the CPU).
#
# Usage: scripts/validate_prediction.sh [h100|h200] [more scripts/validate_prediction.py options]
# Environment: PYTHON (default .venv-gpu/bin/python, built by ./setup.sh --gpu; any Python with jax[cuda12],
# TransformerEngine and this project installed will do, e.g. a JAX-Toolbox maxtext container's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${1:-h100}"
[[ $# -gt 0 ]] && shift
python="${PYTHON:-.venv-gpu/bin/python}"
[[ -x "$python" ]] || { echo "validate_prediction.sh: $python not found; run ./setup.sh --gpu or set PYTHON" >&2; exit 2; }
exec "$python" scripts/validate_prediction.py --target "$target" --json results/validate_prediction/"$target".json "$@"
