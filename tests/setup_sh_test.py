# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""setup.sh on a copy in a temp dir with fake interpreters (the real .venv is never touched).

Its interpreter search and arguments; and, with a fake Python whose `-m venv` and `-m pip` only record what they
were asked, the order and flags of the installs (`--gpu`'s two TE stages, `--venv`, the editable project) and that
a second run with nothing changed installs nothing. The real installs are exercised by `make test-te`, which builds
.venv-gpu with `./setup.sh --gpu --venv .venv-gpu`.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from tests.helpers import REPO_ROOT

# What setup.sh needs from PATH before it gives up on finding Python; nothing else is visible to it, so no real
# interpreter on this machine can be found.
_TOOLS = ("dirname", "cat", "sha256sum", "cut", "ls", "sort", "sed", "rm")


def _fake_python(path: pathlib.Path, body: str) -> pathlib.Path:
  path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
  path.chmod(0o755)
  return path


@pytest.fixture()
def sandbox(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
  """A copy of setup.sh and its requirement files, a PATH of basic tools plus fake interpreters, an empty pyenv."""
  repo = tmp_path / "repo"
  repo.mkdir()
  for name in ("setup.sh", "requirements.txt", "requirements-tfds.txt", "requirements-gpu.txt",
               "requirements-maxtext-0.2.4.txt", "requirements-export.txt", "pyproject.toml"):
    shutil.copy2(REPO_ROOT / name, repo / name)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in _TOOLS:
    found = shutil.which(tool)
    assert found, f"test needs {tool} on PATH"
    (bin_dir / tool).symlink_to(found)
  # Interpreters that run but are too old, and one that does not run at all.
  _fake_python(bin_dir / "python3", 'echo "3.11"')
  _fake_python(bin_dir / "python3.13", 'echo "3.11"')
  _fake_python(bin_dir / "python3.12", "exit 1")
  pyenv = tmp_path / "pyenv"
  (pyenv / "versions").mkdir(parents=True)
  return {"repo": repo, "bin": bin_dir, "pyenv": pyenv, "home": tmp_path}


def _run_setup(sandbox: dict[str, pathlib.Path], *args: str) -> subprocess.CompletedProcess[str]:
  env = {
      "PATH": str(sandbox["bin"]),
      "PYTHON": str(sandbox["bin"] / "python3"),
      "PYENV_ROOT": str(sandbox["pyenv"]),
      "HOME": str(sandbox["home"]),
  }
  bash = shutil.which("bash")
  assert bash
  return subprocess.run(
      [bash, str(sandbox["repo"] / "setup.sh"), *args], env=env, capture_output=True, text=True, timeout=60, check=False
  )


def test_refuses_python_older_than_3_12(sandbox: dict[str, pathlib.Path]) -> None:
  real_venv = REPO_ROOT / ".venv"
  before = real_venv.stat().st_mtime_ns if real_venv.exists() else None
  proc = _run_setup(sandbox)
  assert proc.returncode != 0, proc.stdout + proc.stderr
  assert "no Python >= 3.12 found" in proc.stderr, proc.stderr
  assert "PYTHON=" in proc.stderr and "Python 3.11" in proc.stderr, proc.stderr  # Says why $PYTHON was skipped.
  assert "Install Python 3.12" in proc.stderr, proc.stderr  # Says what to do.
  assert not (sandbox["repo"] / ".venv").exists()
  assert (real_venv.stat().st_mtime_ns if real_venv.exists() else None) == before


def test_rejects_unknown_arguments(sandbox: dict[str, pathlib.Path]) -> None:
  proc = _run_setup(sandbox, "--cpu")
  assert proc.returncode == 2
  assert "unknown argument '--cpu' (valid: --gpu, --export, --venv DIR)" in proc.stderr
  proc = _run_setup(sandbox, "--venv")
  assert proc.returncode == 2
  assert "--venv needs a directory" in proc.stderr


def test_export_wants_python_3_11_and_not_beside_gpu(sandbox: dict[str, pathlib.Path]) -> None:
  proc = _run_setup(sandbox, "--export", "--gpu")
  assert proc.returncode == 2 and "--export and --gpu build different environments" in proc.stderr, proc.stderr
  for name in ("python3", "python3.13"):  # the sandbox's interpreters, none of them a Python 3.11 that runs
    _fake_python(sandbox["bin"] / name, 'echo "3.12"')
  proc = _run_setup(sandbox, "--export")
  assert proc.returncode == 1 and "--export needs Python 3.11" in proc.stderr, proc.stderr
  assert not (sandbox["repo"] / ".venv").exists()


# A Python 3.12 that creates venvs by copying itself and logs every pip and compileall call (pip's with the TE build
# variable) to $FAKE_LOG; it answers setup.sh's other one-line questions like a fresh venv without TE would.
_RECORDING_PYTHON = r"""#!/bin/sh
case "$1" in
  -m)
    case "$2" in
      venv) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0 ;;
      pip) shift 2; echo "pip NVTE=${NVTE_BUILD_USE_NVIDIA_WHEELS:-} $*" >> "$FAKE_LOG"; exit 0 ;;
      compileall) shift 2; echo "compileall $*" >> "$FAKE_LOG"; exit 0 ;;
    esac ;;
  -c)
    case "$2" in
      *version_info*) echo "3.12"; exit 0 ;;
      *sysconfig*) echo "$FAKE_SITE"; exit 0 ;;
      *importlib.metadata*) exit 1 ;;
      *transformer_engine*) echo "OSError: libcuda.so.1: cannot open shared object file" >&2; exit 1 ;;
    esac ;;
esac
echo "recording python: unexpected arguments: $*" >&2
exit 3
"""


@pytest.fixture()
def recording(sandbox: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
  """The sandbox plus the recording Python as $PYTHON, the tools setup.sh's install path uses, and a fake
  site-packages with the CUDA 12 runtime wheel's folder (nvidia/cuda_runtime)."""
  for tool in ("mkdir", "cp", "grep", "mktemp", "tail", "ln", "sha256sum"):
    link = sandbox["bin"] / tool
    if not link.exists():
      found = shutil.which(tool)
      assert found, f"test needs {tool} on PATH"
      link.symlink_to(found)
  python = _fake_python(sandbox["bin"] / "python3.12", _RECORDING_PYTHON.split("\n", 1)[1])
  site = sandbox["home"] / "site"
  (site / "nvidia" / "cuda_runtime" / "lib").mkdir(parents=True)
  return {**sandbox, "python": python, "log": sandbox["home"] / "pip.log", "site": site}


def _run_recorded(rec: dict[str, pathlib.Path], *args: str, venv_env: str | None = None) -> tuple[int, str, list[str]]:
  env = {"PATH": str(rec["bin"]), "PYTHON": str(rec["python"]), "PYENV_ROOT": str(rec["pyenv"]),
         "HOME": str(rec["home"]), "FAKE_LOG": str(rec["log"]), "FAKE_SITE": str(rec["site"])}
  if venv_env is not None:
    env["VENV"] = venv_env
  rec["log"].unlink(missing_ok=True)
  proc = subprocess.run([shutil.which("bash") or "bash", str(rec["repo"] / "setup.sh"), *args], env=env,
                        cwd=rec["home"], capture_output=True, text=True, timeout=60, check=False)
  calls = rec["log"].read_text(encoding="utf-8").splitlines() if rec["log"].exists() else []
  return proc.returncode, proc.stdout + proc.stderr, calls


def test_gpu_install_order_and_flags(recording: dict[str, pathlib.Path]) -> None:
  rc, out, calls = _run_recorded(recording, "--gpu", "--venv", "gpu-env")
  assert rc == 0, out
  venv = recording["home"] / "gpu-env"  # relative to the current directory
  assert (venv / "bin" / "python").exists() and (venv / ".setup-stamp").exists(), out
  repo = recording["repo"]
  assert len(calls) == 6, calls
  assert calls[0].endswith(f"install -q --no-compile --no-deps -r {repo}/requirements.txt"), calls[0]
  assert calls[1].endswith(f"install -q --no-compile --no-deps -r {repo}/requirements-tfds.txt"), calls[1]  # the venv
  assert calls[2].startswith("pip NVTE= ") and "install -q --no-compile -r " in calls[2], calls[2]  # stage 1: wheels
  stage1 = pathlib.Path(calls[2].rsplit(" ", 1)[1])
  assert not stage1.exists()  # a temp file, removed on exit
  assert calls[3] == "pip NVTE=1 --disable-pip-version-check install -q --no-compile --no-build-isolation --no-deps " \
                     "transformer-engine-jax==2.20.2", calls[3]
  assert calls[4].endswith(f"install -q --no-compile --no-deps -e {repo}"), calls[4]
  assert calls[5] == f"compileall -qq -j 0 {recording['site']}", calls[5]  # what pip no longer compiles, last
  assert (recording["site"] / "nvidia" / "cudart").resolve() == recording["site"] / "nvidia" / "cuda_runtime"
  assert "import transformer_engine.jax fails here" in out and "libcuda.so.1" in out, out
  assert not (venv / "tfds-site").exists()  # --gpu puts TensorFlow in the venv itself

  rc, out, calls = _run_recorded(recording, "--gpu", venv_env="gpu-env")  # VENV= names the same venv
  assert rc == 0 and calls == [] and "is up to date" in out, (out, calls)


@pytest.mark.parametrize("free_kib, said", [(3 * 1024 * 1024, True), (64 * 1024 * 1024, False)])
def test_a_disk_too_small_for_the_gpu_environment_is_said_before_the_install(recording, free_kib, said) -> None:
  """A `df` that reports `free_kib` free on the disk of `--venv DIR` (a folder of its own, standing for another disk)
  and the opposite on every other path, the repository's included: below the --gpu environment's 10 GiB there, one
  line naming the free space and the need comes before pip runs (pip's own "No space left on device" comes minutes in
  and names no size). A check of the repository's disk instead says the opposite, and fails both cases."""
  awk = shutil.which("awk")
  assert awk, "test needs awk on PATH"
  (recording["bin"] / "awk").symlink_to(awk)
  disk = recording["home"] / "other-disk"
  disk.mkdir()
  other_kib = 64 * 1024 * 1024 + 3 * 1024 * 1024 - free_kib
  _fake_python(recording["bin"] / "df", 'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
                                        'for last; do :; done\n'  # the path df is asked about
                                        f'case "$last" in {disk}*) free={free_kib} ;; *) free={other_kib} ;; esac\n'
                                        'echo "/dev/vdb 264241152 1 $free 99% /"')
  rc, out, calls = _run_recorded(recording, "--gpu", "--venv", str(disk / "gpu-env"))
  assert rc == 0 and calls, out
  venv = disk / "gpu-env"
  line = f"setup.sh: 3 GiB free on the disk of {venv}, and a new {venv} takes about 10 GiB"
  assert (line in out) == said and ("No space" in out) == said, out


def test_cpu_install_targets_venv_tfds_site_and_maxtext_024_site(recording: dict[str, pathlib.Path]) -> None:
  rc, out, calls = _run_recorded(recording, venv_env=str(recording["home"] / "cpu-env"))
  assert rc == 0, out
  repo, venv = recording["repo"], recording["home"] / "cpu-env"
  assert [c.split(" install ", 1)[1] for c in calls[:-1]] == [
      f"-q --no-compile --no-deps -r {repo}/requirements.txt",
      f"-q --no-compile --no-deps --target {venv}/tfds-site -r {repo}/requirements-tfds.txt",
      f"-q --no-compile --no-deps --target {venv}/maxtext-0.2.4-site -r {repo}/requirements-maxtext-0.2.4.txt",
      f"-q --no-compile --no-deps -e {repo}",
  ], calls
  # What pip no longer compiles, compiled last on every core: the venv and the two folders beside it.
  assert calls[-1] == f"compileall -qq -j 0 {recording['site']} {venv}/tfds-site {venv}/maxtext-0.2.4-site", calls
  rc, out, calls = _run_recorded(recording, "--venv", str(venv))
  assert rc == 0 and calls == [] and "is up to date" in out, (out, calls)
  (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() + "\n# changed\n")
  rc, out, calls = _run_recorded(recording, "--venv", str(venv))  # the project changed: lock + project only
  assert rc == 0 and len(calls) == 3 and calls[1].endswith(f"-e {repo}"), (out, calls)
  assert calls[2].startswith("compileall "), calls


def _fake_venv(path: pathlib.Path, version: str) -> pathlib.Path:
  """An existing environment whose interpreter runs and reports `version`, with a file standing for its installs."""
  (path / "bin").mkdir(parents=True)
  _fake_python(path / "bin" / "python", f'echo "{version}"')
  (path / "installed").write_text("maxtext, jax, ...", encoding="utf-8")
  return path


@pytest.fixture()
def exporting(recording: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
  """The recording sandbox plus a recording Python 3.11 on PATH (python3.11) that imports the export libraries."""
  body = _RECORDING_PYTHON.split("\n", 1)[1].replace('echo "3.12"', 'echo "3.11"')
  body = body.replace("      *sysconfig*)", "      *compressed_tensors*) exit 0 ;;\n      *sysconfig*)")
  _fake_python(recording["bin"] / "python3.11", body)
  return recording


def test_export_builds_its_own_environment_by_default_and_leaves_dot_venv_alone(exporting) -> None:
  """./setup.sh --export without --venv: .venv-export, a Python 3.11 environment beside the main one (Python 3.13,
  maxtext, jax in .venv), which it used to delete and rebuild as the export one without a word."""
  main = _fake_venv(exporting["repo"] / ".venv", "3.13")
  rc, out, calls = _run_recorded(exporting, "--export")
  assert rc == 0, out
  export = exporting["repo"] / ".venv-export"
  assert (export / ".setup-stamp").read_text(encoding="utf-8").endswith(" export\n"), out
  assert "creating .venv-export with python3.11 (3.11)" in out, out
  assert calls[0].endswith(f"install -q --no-compile --no-deps -r {exporting['repo']}/requirements-export.txt"), calls
  assert (main / "installed").is_file() and (main / "bin" / "python").is_file()  # the main environment, untouched


@pytest.mark.parametrize(
    "args, existing, wanted",
    [(["--export", "--venv", ".venv"], "3.13", "3.11"),  # the main environment, named for the export one
     (["--venv", ".venv"], "3.11", ">= 3.12"),  # the export environment, named for the main one
     (["--gpu", "--venv", ".venv"], "3.11", ">= 3.12")],
)  # fmt: skip
def test_an_environment_of_another_python_is_refused_not_replaced(exporting, args, existing, wanted) -> None:
  """One line, exit 2, nothing installed and the environment as it was: replacing it would silently cost its
  installs (the main environment's maxtext and jax, or the export one's torch)."""
  venv = _fake_venv(exporting["home"] / ".venv", existing)
  rc, out, calls = _run_recorded(exporting, *args)
  assert rc == 2 and calls == [], (out, calls)
  assert out.splitlines() == [
      f"setup.sh: {venv} is a Python {existing} environment and this build needs Python {wanted}: it would replace "
      "it; give another --venv DIR (--export's default is .venv-export), or remove " + f"{venv} first"], out
  assert (venv / "installed").is_file()
