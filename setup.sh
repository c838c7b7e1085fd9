#!/usr/bin/env bash
# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
# Creates a virtual environment (default .venv/ in this repository) with the pinned set, then installs this
# project into it, editable (`pip install --no-deps -e .`), so `python -m MaxText.train` works from any directory.
#
# Usage: ./setup.sh [--gpu | --export] [--venv DIR]   (or VENV=DIR ./setup.sh ...; DIR relative to the current directory)
#   DIR defaults to .venv (with --gpu too: the CPU set plus the GPU one), and to .venv-export with --export (another
#   Python). An existing environment of a Python version the build cannot use is refused, never replaced.
#
#   always:  requirements.txt, the CPU lock, with --no-deps.
#   CPU:     requirements-tfds.txt (TensorFlow, for the TFDS test only) into DIR/tfds-site, off the training path;
#            requirements-maxtext-0.2.4.txt (the oldest supported maxtext) into DIR/maxtext-0.2.4-site, likewise.
#   --gpu:   requirements-tfds.txt into the venv itself (the cluster recipes read C4 through TFDS), then
#            requirements-gpu.txt: CUDA 12 jax and TransformerEngine from wheels, and TE's JAX extension built from
#            source against those wheels (no CUDA toolkit needed; ~11 min on 2 cores the first time, pip caches it).
#   --export: only requirements-export.txt (torch CPU, compressed-tensors, transformers, ModelOpt), with Python 3.11
#            ($PYTHON_EXPORT, python3.11, pyenv's 3.11.x): the serving formats' own code for the export tests
#            (tests/export). Not this project: the tests run those libraries in a subprocess.
# Python: maxtext needs >= 3.12. Tried in order: $PYTHON, python3.13, python3.12, then pyenv's installed
# versions (newest first). A candidate counts only if it actually runs and reports >= 3.12.
# Idempotent: a stamp in the venv records a hash of the requirement files and pyproject.toml; a second run with
# nothing changed returns in seconds.
# Installs pass --no-compile; the installed modules are then byte-compiled on every core (compileall -j 0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${VENV:-}"  # empty: the mode's default, after the arguments
gpu=0
export_env=0
while (( $# )); do
  case "$1" in
    --gpu) gpu=1 ;;
    --export) export_env=1 ;;
    --venv)
      [[ $# -ge 2 && -n "$2" ]] || { echo "setup.sh: --venv needs a directory, e.g. --venv .venv-gpu" >&2; exit 2; }
      venv="$2"; shift ;;
    --venv=*) venv="${1#--venv=}" ;;
    -h|--help) sed -n '3,23p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (valid: --gpu, --export, --venv DIR)" >&2; exit 2 ;;
  esac
  shift
done
# The export environment is another Python (3.11) than the main one (>= 3.12, maxtext and jax): by default a folder of
# its own, so that `./setup.sh --export` does not build over .venv.
if (( export_env )); then venv="${venv:-$here/.venv-export}"; else venv="${venv:-$here/.venv}"; fi
[[ "$venv" == /* ]] || venv="$PWD/$venv"
name="${venv/#$here\//}"  # short name for messages

# Prints "major.minor" of a working interpreter, or nothing.
py_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# refuse_other_python WANTED OK: exits 2 with one line when $venv holds a working environment whose Python version
# the build cannot use (`OK VERSION` fails), instead of deleting it to build the WANTED one there. Why: the main
# environment and the export one differ in Python, and one `rm -rf` would silently cost the other's install. An
# interpreter that no longer runs (a removed base Python) is no environment to keep: it is rebuilt, as before.
refuse_other_python() {
  local wanted="$1" ok="$2" v
  [[ -x "$venv/bin/python" ]] || return 0
  v="$(py_version "$venv/bin/python")"
  [[ -z "$v" ]] && return 0
  "$ok" "$v" && return 0
  echo "setup.sh: $name is a Python $v environment and this build needs Python $wanted: it would replace it;" \
       "give another --venv DIR (--export's default is .venv-export), or remove $name first" >&2
  exit 2
}

# True when "major.minor" is 3.11, the export environment's Python.
version_export() {
  [[ "$1" == "3.11" ]]
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
    [[ -n "${PYTHON:-}" && "$c" == "$PYTHON" ]] \
      && echo "setup.sh: \$PYTHON=$PYTHON is Python ${v:-?}, need >= 3.12; looking further" >&2
  done
  return 1
}

# The venv's site-packages, as its interpreter ($1) says.
purelib() {
  "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'
}

# Byte-compiles the installed modules on every core, for the installs below that pass --no-compile: pip compiles one
# file at a time, which was 49 of the 82 s that requirements.txt took to install on 2 cores (and its share of the
# GPU and export sets). Compiled here rather than left to the first import: with PYTHONDONTWRITEBYTECODE set (as on
# CI), a module without a .pyc is compiled again in every process. compileall skips files whose .pyc is current.
# A file that does not compile is what pip also passes over (it ignores its compile errors): said, not fatal.
byte_compile() {
  local python="$1" name="$2"
  shift 2
  "$python" -m compileall -qq -j 0 "$@" >/dev/null \
    || echo "setup.sh: some files in $name did not byte-compile (pip would pass over them too); they compile on import"
}

# say_disk GIB: one line on stderr before an install when the disk that holds $venv has less than GIB free. Why:
# pip's own failure there ("[Errno 28] No space left on device") comes minutes into the install and names no size
# (stop 62's CI ended so, 19 min in, building .venv-gpu). Measured on 2026-11-29: .venv 3.0 GiB,
# .venv-gpu 9.6 GiB (the CPU set, TensorFlow, the CUDA wheels, TE), .venv-export 1.4 GiB. Not fatal: an environment
# being refreshed needs less than a new one. Says nothing where df or awk is missing.
say_disk() {
  local need="$1" dir="$venv" free
  command -v df >/dev/null 2>&1 && command -v awk >/dev/null 2>&1 || return 0
  while [[ ! -d "$dir" ]]; do dir="$(dirname "$dir")"; done
  free="$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')" || return 0
  [[ "$free" =~ ^[0-9]+$ ]] && (( free < need * 1024 * 1024 )) || return 0
  echo "setup.sh: $(( free / 1024 / 1024 )) GiB free on the disk of $name, and a new $name takes about $need GiB:" \
       "pip may stop with 'No space left on device'" >&2
}

if (( export_env )); then
  (( gpu )) && { echo "setup.sh: --export and --gpu build different environments; give one" >&2; exit 2; }
  stamp_value="$(sha256sum < "$here/requirements-export.txt" | cut -d' ' -f1) export"
  if [[ -x "$venv/bin/python" && -f "$venv/.setup-stamp" && "$(cat "$venv/.setup-stamp")" == "$stamp_value" ]]; then
    echo "setup.sh: $name is up to date (requirements-export.txt unchanged)"
    exit 0
  fi
  refuse_other_python 3.11 version_export
  python=""
  for c in "${PYTHON_EXPORT:-}" python3.11 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11*/bin/python; do
    [[ -n "$c" ]] && { command -v "$c" >/dev/null 2>&1 || [[ -x "$c" ]]; } || continue
    [[ "$(py_version "$c")" == "3.11" ]] && { python="$c"; break; }
  done
  [[ -n "$python" ]] || { echo "setup.sh: --export needs Python 3.11 (pip takes the CPU build of torch for it); " \
                                "set PYTHON_EXPORT=/path/to/python3.11" >&2; exit 1; }
  say_disk 2
  echo "setup.sh: creating $name with $python (3.11), installing requirements-export.txt (--no-deps lock)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip --disable-pip-version-check install -q --no-compile --no-deps \
    -r "$here/requirements-export.txt"
  byte_compile "$venv/bin/python" "$name" "$(purelib "$venv/bin/python")"
  "$venv/bin/python" -c 'import torch, compressed_tensors, transformers, modelopt.torch.quantization.qtensor' \
    || { echo "setup.sh: $name does not import the export group's libraries" >&2; exit 1; }
  echo "$stamp_value" > "$venv/.setup-stamp"
  echo "setup.sh: done; use $venv/bin/python"
  exit 0
fi

reqs=("$here/requirements.txt" "$here/requirements-tfds.txt" "$here/requirements-maxtext-0.2.4.txt"
      "$here/pyproject.toml")
(( gpu )) && reqs+=("$here/requirements-gpu.txt")
stamp_value="$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1) gpu=$gpu"
stamp="$venv/.setup-stamp"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]] \
   && version_ok "$(py_version "$venv/bin/python")"; then
  echo "setup.sh: $name is up to date ($(py_version "$venv/bin/python"), requirements unchanged)"
  exit 0
fi

refuse_other_python ">= 3.12" version_ok
if (( gpu )); then say_disk 10; else say_disk 3; fi
if [[ ! -x "$venv/bin/python" ]] || ! version_ok "$(py_version "$venv/bin/python")"; then
  if ! python="$(find_python)"; then
    echo "setup.sh: no Python >= 3.12 found (maxtext needs it). Tried \$PYTHON, python3.13, python3.12 and" \
         "pyenv's versions. Install Python 3.12 (e.g. 'pyenv install 3.12' or your OS package python3.12)," \
         "or point PYTHON=/path/to/python3.12 at one." >&2
    exit 1
  fi
  echo "setup.sh: creating $name with $python ($(py_version "$python"))"
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check)
echo "setup.sh: installing requirements.txt (CPU set, --no-deps lock)"
"${pip[@]}" install -q --no-compile --no-deps -r "$here/requirements.txt"

tfds_hash="$(sha256sum < "$here/requirements-tfds.txt" | cut -d' ' -f1)"
if (( gpu )); then
  echo "setup.sh: installing requirements-tfds.txt into $name (TensorFlow for maxtext's TFDS input pipeline)"
  "${pip[@]}" install -q --no-compile --no-deps -r "$here/requirements-tfds.txt"
  # Stage 1: the wheels, resolved (they bring their own NVIDIA libraries); TE's JAX extension is stage 2.
  gpu_wheels="$(mktemp)"
  trap 'rm -f "$gpu_wheels"' EXIT
  grep -v -i '^transformer-engine-jax==' "$here/requirements-gpu.txt" > "$gpu_wheels"
  te_jax="$(grep -i '^transformer-engine-jax==' "$here/requirements-gpu.txt" | sed 's/[[:space:]]*#.*//')"
  [[ -n "$te_jax" ]] || { echo "setup.sh: requirements-gpu.txt pins no transformer-engine-jax==VERSION" >&2; exit 1; }
  echo "setup.sh: installing requirements-gpu.txt (CUDA 12 jax, TransformerEngine wheels, build tools)"
  "${pip[@]}" install -q --no-compile -r "$gpu_wheels"
  # Stage 2: transformer_engine_jax is published as source only. NVTE_BUILD_USE_NVIDIA_WHEELS=1 builds it against
  # the nvidia-* wheels just installed (headers and libraries) instead of a system CUDA toolkit; no build
  # isolation, so the build sees them; no deps, because stage 1 installed them. pip caches the built wheel.
  installed='import importlib.metadata as m, sys; sys.exit(m.version("transformer-engine-jax") != sys.argv[1])'
  if "$venv/bin/python" -c "$installed" "${te_jax#*==}" 2>/dev/null; then
    echo "setup.sh: $te_jax already installed"
  else
    echo "setup.sh: building $te_jax against the CUDA wheels (first time ~11 min on 2 cores; then pip's cache)"
    NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_FRAMEWORK=jax \
      "${pip[@]}" install -q --no-compile --no-build-isolation --no-deps "$te_jax"
  fi
  # Without a CUDA toolkit, TE 2.20.2's loader (transformer_engine/common/__init__.py) looks for libcudart under
  # site-packages/nvidia/cudart or nvidia/cuda_cudart, but the CUDA 12 runtime wheel installs it under
  # nvidia/cuda_runtime: `import transformer_engine` then fails with "cudart shared object not found". A link
  # under the name TE looks for, inside this venv only.
  nvidia_dir="$(purelib "$venv/bin/python")/nvidia"
  if [[ -d "$nvidia_dir/cuda_runtime" && ! -e "$nvidia_dir/cudart" && ! -e "$nvidia_dir/cuda_cudart" ]]; then
    ln -s cuda_runtime "$nvidia_dir/cudart"
  fi
  if te_check="$("$venv/bin/python" -c 'import transformer_engine.jax' 2>&1)"; then
    echo "setup.sh: import transformer_engine.jax: ok"
  else
    echo "setup.sh: import transformer_engine.jax fails here (expected on a machine without an NVIDIA driver):" \
         "$(tail -n 1 <<< "$te_check")"
  fi
elif [[ ! -f "$venv/tfds-site/.setup-stamp" || "$(cat "$venv/tfds-site/.setup-stamp")" != "$tfds_hash" ]]; then
  # A folder of its own, emptied first: pip --target does not replace what an older set left there.
  echo "setup.sh: installing requirements-tfds.txt into $name/tfds-site (TensorFlow for the TFDS test only)"
  rm -rf "$venv/tfds-site"
  "${pip[@]}" install -q --no-compile --no-deps --target "$venv/tfds-site" -r "$here/requirements-tfds.txt"
  mkdir -p "$venv/tfds-site" && echo "$tfds_hash" > "$venv/tfds-site/.setup-stamp"
fi
if (( ! gpu )); then
  # Beside the lock's maxtext, not over it: the suite reaches this folder through PYTHONPATH only.
  old_site="$venv/maxtext-0.2.4-site"
  old_hash="$(sha256sum < "$here/requirements-maxtext-0.2.4.txt" | cut -d' ' -f1)"
  if [[ ! -f "$old_site/.setup-stamp" || "$(cat "$old_site/.setup-stamp")" != "$old_hash" ]]; then
    echo "setup.sh: installing requirements-maxtext-0.2.4.txt into $name/maxtext-0.2.4-site (the oldest supported maxtext)"
    rm -rf "$old_site"
    "${pip[@]}" install -q --no-compile --no-deps --target "$old_site" -r "$here/requirements-maxtext-0.2.4.txt"
    mkdir -p "$old_site" && echo "$old_hash" > "$old_site/.setup-stamp"
  fi
fi

echo "setup.sh: installing this project into $name (pip install --no-deps -e .)"
"${pip[@]}" install -q --no-compile --no-deps -e "$here"
folders=("$(purelib "$venv/bin/python")")
(( gpu )) || folders+=("$venv/tfds-site" "$venv/maxtext-0.2.4-site")
echo "setup.sh: byte-compiling what was installed (on every core)"
byte_compile "$venv/bin/python" "$name" "${folders[@]}"
echo "$stamp_value" > "$stamp"
echo "setup.sh: done; use $venv/bin/python"
