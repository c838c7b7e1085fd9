#!/usr/bin/env bash
# Creates .venv/ in this repository and installs the pinned set: requirements.txt (CPU, always),
# requirements-tfds.txt (TensorFlow for the TFDS test, always, into .venv/tfds-site: see that file) and,
# with --gpu, requirements-gpu.txt (CUDA jax, TransformerEngine, tensorflow-datasets).
#
# Usage: ./setup.sh [--gpu]
#
# Python: maxtext needs >= 3.12. Tried in order: $PYTHON, python3.13, python3.12, then pyenv's installed
# versions (newest first). A candidate counts only if it actually runs and reports >= 3.12.
# Idempotent: a stamp in .venv records a hash of the requirement files; a second run with nothing changed
# returns in seconds.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
gpu=0
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (valid: --gpu)" >&2; exit 2 ;;
  esac
done

# Prints "major.minor" of a working interpreter, or nothing.
py_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# True when "major.minor" is at least 3.12.
version_ok() {
  local major="${1%%.*}" minor="${1#*.}"
  [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] || return 1
  (( major > 3 || (major == 3 && minor >= 12) ))
}

find_python() {
  local candidates=()
  [[ -n "${PYTHON:-}" ]] && candidates+=("$PYTHON")
  candidates+=(python3.13 python3.12)
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  if [[ -d "$root/versions" ]]; then
    while IFS= read -r v; do candidates+=("$root/versions/$v/bin/python"); done \
      < <(ls "$root/versions" | sort -t. -k1,1nr -k2,2nr -k3,3nr)
  fi
  local c v
  for c in "${candidates[@]}"; do
    command -v "$c" >/dev/null 2>&1 || [[ -x "$c" ]] || continue
    v="$(py_version "$c")"
    if version_ok "$v"; then echo "$c"; return 0; fi
    [[ -n "${PYTHON:-}" && "$c" == "$PYTHON" ]] && echo "setup.sh: \$PYTHON=$PYTHON is Python ${v:-?}, need >= 3.12; looking further" >&2
  done
  return 1
}

reqs=("$here/requirements.txt" "$here/requirements-tfds.txt")
(( gpu )) && reqs+=("$here/requirements-gpu.txt")
stamp_value="$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1) gpu=$gpu"
stamp="$venv/.setup-stamp"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]] \
   && version_ok "$(py_version "$venv/bin/python")"; then
  echo "setup.sh: .venv is up to date ($(py_version "$venv/bin/python"), requirements unchanged)"
  exit 0
fi

if [[ ! -x "$venv/bin/python" ]] || ! version_ok "$(py_version "$venv/bin/python")"; then
  if ! python="$(find_python)"; then
    echo "setup.sh: no Python >= 3.12 found (maxtext needs it). Tried \$PYTHON, python3.13, python3.12 and" \
         "pyenv's versions. Install Python 3.12 (e.g. 'pyenv install 3.12' or your OS package python3.12)," \
         "or point PYTHON=/path/to/python3.12 at one." >&2
    exit 1
  fi
  echo "setup.sh: creating .venv with $python ($(py_version "$python"))"
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check)
echo "setup.sh: installing requirements.txt (CPU set, --no-deps lock)"
"${pip[@]}" install -q --no-deps -r "$here/requirements.txt"
# A folder of its own, emptied first: pip --target does not replace what an older set left there.
echo "setup.sh: installing requirements-tfds.txt into .venv/tfds-site (TensorFlow for the TFDS test only)"
rm -rf "$venv/tfds-site"
"${pip[@]}" install -q --no-deps --target "$venv/tfds-site" -r "$here/requirements-tfds.txt"
if (( gpu )); then
  echo "setup.sh: installing requirements-gpu.txt (CUDA jax, TransformerEngine, tensorflow-datasets)"
  "${pip[@]}" install -q -r "$here/requirements-gpu.txt"
fi
echo "$stamp_value" > "$stamp"
echo "setup.sh: done; use $venv/bin/python"
