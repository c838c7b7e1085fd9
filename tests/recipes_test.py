# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Blackwell recipes, tested without Blackwell: the YAMLs load through maxtext's config system (with our plugin's
config class) on CPU, the scripts print the right command lines with --dry-run, and a run of the scripts with a
stand-in for the trainer (recorded metrics) ends in a real comparison report.
"""

import json
import os
import pathlib
import shlex
import subprocess
import sys
import textwrap

import pytest
import yaml

from MaxText.compare.report import read_report
from tests.helpers import BLACKWELL_SOURCE, REPO_ROOT

RECIPES = sorted((REPO_ROOT / "configs" / "recipes").glob("*.yml"))
SCRIPTS = REPO_ROOT / "scripts" / "recipes"
PAIRS = {"llama3_8b": "llama3-8b", "llama3.1_405b": "llama3.1-405b"}
# Each model's recipes: name -> (quantization, nvfp4_backend, nvfp4_attention_precision). te_nvfp4 is the recipe as
# published (attention projections BF16); te_nvfp4_fp8attn differs from fp8 only in the MLP GEMMs.
VARIANTS = {"fp8": ("fp8", "auto", "bf16"), "te_nvfp4": ("te_nvfp4", "te", "bf16"),
            "te_nvfp4_fp8attn": ("te_nvfp4", "te", "fp8")}

_LOADER = textwrap.dedent(
    """
    import json, sys
    from MaxText import register
    # Validate as on a GB200 node: TE imports and every GPU is Blackwell (nvfp4_backend=te is checked at load).
    BLACKWELL_SOURCE
    register()
    from maxtext.configs import pyconfig
    out = {}
    for path in sys.argv[1:]:
      c = pyconfig.initialize(["", path, "run_name=t", "skip_jax_distributed_system=true"])
      out[path] = {k: str(getattr(v, "value", v)) for k, v in c.get_keys().items()}
    print("RESULT" + json.dumps(out))
    """
).replace("BLACKWELL_SOURCE", BLACKWELL_SOURCE)


def test_six_recipes_exist():
  assert [p.name for p in RECIPES] == sorted(f"{pair}_{variant}.yml" for pair in PAIRS for variant in VARIANTS)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
  """Every recipe through pyconfig.initialize with the plugin's config class, in one subprocess: every key, as str.

  A subprocess because maxtext's config validation writes process-wide state (XLA flags, jax config) that must not
  leak into the other tests. hardware=gpu does not block loading on CPU: only building the mesh would need a GPU.
  """
  cwd = tmp_path_factory.mktemp("load")  # maxtext_output/ lands here, not in the repository
  proc = subprocess.run(
      [sys.executable, "-c", _LOADER, *map(str, RECIPES)],
      cwd=cwd, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO_ROOT)),
      capture_output=True, text=True, timeout=300, check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(out for out in proc.stdout.splitlines() if out.startswith("RESULT"))
  return {pathlib.Path(k).name: v for k, v in json.loads(line[len("RESULT"):]).items()}


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_recipe_loads_with_published_settings(loaded, pair, variant):
  c = loaded[f"{pair}_{variant}.yml"]
  assert c["model_name"] == PAIRS[pair]
  assert (c["quantization"], c["nvfp4_backend"], c["nvfp4_attention_precision"]) == VARIANTS[variant]
  assert c["hardware"] == "gpu"
  assert c["attention"] == "cudnn_flash_te"
  # 405B: the pre-flight found minimal_with_context_and_quantization needs 491 GiB per GB300 on 64 (docs/preflight.md).
  assert c["remat_policy"] == {"llama3_8b": "minimal_with_context_and_quantization", "llama3.1_405b": "full"}[pair]
  assert c["max_target_length"] == "8192"
  # The layout --tune chose: 8B FSDP over the node; 405B FSDP in each of two NVL72 racks, data across them.
  assert (c["ici_data_parallelism"], c["ici_fsdp_parallelism"], c["per_device_batch_size"]) == \
      {"llama3_8b": ("1", "-1", "3"), "llama3.1_405b": ("2", "64", "2")}[pair], c
  assert (c["dataset_type"], c["dataset_name"], c["eval_dataset_name"]) == ("tfds", "c4/en:3.0.1", "c4/en:3.0.1")
  assert c["tokenizer_type"] == "tiktoken" and c["vocab_size"] == "128256"
  assert c["num_decoder_layers"] == {"llama3_8b": "32", "llama3.1_405b": "126"}[pair]
  assert c["steps"] == "10000"


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_pair_differs_only_in_precision(pair):
  """Same weights, data and schedule: only the precision keys (and the run name) may differ within a pair."""
  fp8 = yaml.safe_load((REPO_ROOT / "configs" / "recipes" / f"{pair}_fp8.yml").read_text())
  nvfp4 = yaml.safe_load((REPO_ROOT / "configs" / "recipes" / f"{pair}_te_nvfp4.yml").read_text())
  differing = {k for k in fp8.keys() | nvfp4.keys() if fp8.get(k) != nvfp4.get(k)}
  assert differing == {"run_name", "quantization", "nvfp4_backend"}
  assert fp8["base_config"] == "../base.yml"  # configs/base.yml, which chains to maxtext's


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_fp8_attention_recipe_is_the_nvfp4_recipe_with_fp8_attention(pair):
  """The file itself: the te_nvfp4 recipe by inheritance, so the two cannot drift apart; only the attention key."""
  raw = yaml.safe_load((REPO_ROOT / "configs" / "recipes" / f"{pair}_te_nvfp4_fp8attn.yml").read_text())
  assert raw == {"base_config": f"{pair}_te_nvfp4.yml", "run_name": f"{pair}_te_nvfp4_fp8attn",
                 "nvfp4_attention_precision": "fp8"}


# Set from the process's XLA_FLAGS, which the first config loaded in a process writes: not the recipe's.
_PROCESS_STATE = {"dump_hlo_xla_flags"}


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("te_nvfp4_fp8attn", "te_nvfp4", {"base_config", "nvfp4_attention_precision"}),
        # The like-with-like pair: the MLP GEMMs' precision (quantization, backend) and nothing else. Under fp8 every
        # projection is FP8 whatever nvfp4_attention_precision says (PluginKeys: ignored outside the NVFP4 modes).
        ("te_nvfp4_fp8attn", "fp8", {"base_config", "quantization", "nvfp4_backend", "nvfp4_attention_precision"}),
        ("te_nvfp4", "fp8", {"quantization", "nvfp4_backend"}),
    ],
)  # fmt: skip
def test_loaded_recipes_differ_only_in_the_expected_keys(loaded, pair, a, b, expected):
  """Every key pyconfig resolves (the plugin's too), after inheritance: another key that differs would run differently."""
  ca, cb = loaded[f"{pair}_{a}.yml"], loaded[f"{pair}_{b}.yml"]
  assert ca.keys() == cb.keys()
  assert {k for k in ca if ca[k] != cb[k]} - _PROCESS_STATE == expected


def _script(name, *args, env=None, cwd=REPO_ROOT):
  return subprocess.run(
      ["bash", str(SCRIPTS / name), *args], cwd=cwd, env={**os.environ, "PYTHON": sys.executable, **(env or {})},
      capture_output=True, text=True, timeout=120, check=False,
  )


def _commands(stdout):
  return [shlex.split(line) for line in stdout.splitlines() if line.strip()]


def _kv(cmd):
  return dict(a.split("=", 1) for a in cmd if "=" in a and not a.startswith("-"))


@pytest.mark.parametrize(
    "attention, candidate",
    [([], "te_nvfp4_fp8attn"), (["--attention", "fp8"], "te_nvfp4_fp8attn"), (["--attention", "bf16"], "te_nvfp4")],
)  # fmt: skip
def test_throughput_dry_run(tmp_path, attention, candidate):
  """By default the pair that differs only in the MLP GEMMs; the recipe as published with --attention bf16."""
  proc = _script("throughput_pair.sh", "--dry-run", *attention, "--out", str(tmp_path), "--", "per_device_batch_size=4")
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  assert [c[0] for c in cmds] == ["mkdir", sys.executable, "mkdir", sys.executable, sys.executable]
  for cmd, name in ((cmds[1], "fp8"), (cmds[3], candidate)):
    assert cmd[1:4] == ["-m", "MaxText.train", f"configs/recipes/llama3_8b_{name}.yml"]
    assert (REPO_ROOT / cmd[3]).is_file()
    kv = _kv(cmd)
    assert kv["run_name"] == name and kv["base_output_directory"] == str(tmp_path)
    assert kv["metrics_file"] == str(tmp_path / name / "metrics.jsonl")
    assert kv["steps"] == "50" and kv["dataset_type"] == "synthetic" and kv["per_device_batch_size"] == "4"
  compare = cmds[4]
  assert compare[1:3] == ["-m", "MaxText.compare"]
  assert compare[3:5] == [str(tmp_path / "fp8"), str(tmp_path / candidate)]
  assert compare[compare.index("--baseline") + 1] == "fp8"
  assert compare[compare.index("--perf-start-step") + 1] == "10"
  assert not (tmp_path / "fp8").exists()  # a dry run creates nothing


def test_throughput_nsys_and_405b(tmp_path):
  proc = _script("throughput_pair.sh", "--dry-run", "--nsys", "--model", "llama3.1_405b", "--out", str(tmp_path))
  assert proc.returncode == 0, proc.stderr
  train = [c for c in _commands(proc.stdout) if "MaxText.train" in c]
  assert len(train) == 2
  for cmd in train:
    assert cmd[:2] == ["nsys", "profile"] and "--capture-range=cudaProfilerApi" in cmd
    kv = _kv(cmd)
    assert kv["profiler"] == "nsys" and kv["skip_first_n_steps_for_profiler"] == "10"
  assert [a for cmd in train for a in cmd if a.startswith("configs/")] == [
      "configs/recipes/llama3.1_405b_fp8.yml", "configs/recipes/llama3.1_405b_te_nvfp4_fp8attn.yml"]


@pytest.mark.parametrize(
    "attention, candidate",
    [([], "te_nvfp4"), (["--attention", "bf16"], "te_nvfp4"), (["--attention", "fp8"], "te_nvfp4_fp8attn")],
)  # fmt: skip
def test_convergence_dry_run(tmp_path, attention, candidate):
  """By default the recipe as published (BF16 attention projections), whose loss gap is the published one."""
  proc = _script("convergence_pair.sh", "--dry-run", "--data-dir", "/data/tfds", "--steps", "2000", *attention,
                 "--out", str(tmp_path))
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  train = [c for c in cmds if "MaxText.train" in c]
  assert [c[3] for c in train] == ["configs/recipes/llama3_8b_fp8.yml", f"configs/recipes/llama3_8b_{candidate}.yml"]
  assert cmds[-1][3:5] == [str(tmp_path / "fp8"), str(tmp_path / candidate)]
  for cmd in train:
    kv = _kv(cmd)
    assert kv["steps"] == "2000" and kv["dataset_path"] == "/data/tfds" and "dataset_type" not in kv
    assert pathlib.Path(kv["tokenizer_path"]).is_file() and kv["tokenizer_path"].endswith("tokenizer_llama3.tiktoken")
    assert (kv["eval_interval"], kv["eval_steps"]) == ("200", "40")  # the same eval batches: paired intervals
  assert cmds[-1][1:3] == ["-m", "MaxText.compare"] and cmds[-1][-2:] == ["--smooth", "100"]


def test_convergence_eval_keys_given_by_the_user_replace_the_defaults(tmp_path):
  proc = _script("convergence_pair.sh", "--dry-run", "--data-dir", "/d", "--eval-batches", "8", "--out", str(tmp_path),
                 "--", "eval_interval=500")
  assert proc.returncode == 0, proc.stderr
  for cmd in [c for c in _commands(proc.stdout) if "MaxText.train" in c]:
    assert [a for a in cmd if a.startswith("eval_")] == ["eval_steps=8", "eval_interval=500"]


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("throughput_pair.sh", ["--model", "llama2"], "unknown --model 'llama2'"),
        ("throughput_pair.sh", ["--steps", "0"], "--steps must be a positive integer"),
        ("throughput_pair.sh", ["--steps", "5"], "--perf-start-step (10) must be below --steps (5)"),
        ("throughput_pair.sh", ["--bogus"], "unknown argument '--bogus'"),
        ("throughput_pair.sh", ["--attention", "fp4"], "--attention must be bf16 or fp8, got 'fp4'"),
        ("throughput_pair.sh", ["--attention", "FP8"], "--attention must be bf16 or fp8, got 'FP8'"),
        ("throughput_pair.sh", ["--attention"], "--attention must be bf16 or fp8, got ''"),
        ("convergence_pair.sh", ["--data-dir", "/d", "--attention", "nvfp4"], "--attention must be bf16 or fp8"),
        ("convergence_pair.sh", [], "--data-dir is required"),
    ],
)
def test_scripts_reject_bad_arguments(script, args, message):
  proc = _script(script, "--dry-run", *args)
  assert proc.returncode == 2 and message in proc.stderr
  assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""  # one line, and nothing printed as if to run


@pytest.mark.parametrize("script", ["throughput_pair.sh", "convergence_pair.sh"])
@pytest.mark.parametrize("folder", ["fp8", "candidate"])
def test_a_run_folder_that_already_holds_metrics_is_refused_before_anything_runs(tmp_path, script, folder):
  """maxtext appends to metrics_file: the pair run twice into one --out, or both --attention pairs (each runs fp8),
  would mix two runs' steps in one file. Refused in one line naming the folder and what to do, --dry-run included;
  an empty metrics file (a run that died before its first step) is no earlier run."""
  data = ["--data-dir", "/d"] if script == "convergence_pair.sh" else []
  name = "fp8" if folder == "fp8" else "te_nvfp4" if script == "convergence_pair.sh" else "te_nvfp4_fp8attn"
  (tmp_path / name).mkdir()
  (tmp_path / name / "metrics.jsonl").write_text("")
  assert _script(script, "--dry-run", *data, "--out", str(tmp_path)).returncode == 0
  (tmp_path / name / "metrics.jsonl").write_text('{"step": 0}\n')
  proc = _script(script, "--dry-run", *data, "--out", str(tmp_path))
  assert proc.returncode == 2 and proc.stdout == ""
  assert proc.stderr.splitlines() == [
      f"{script}: {tmp_path / name} already holds metrics.jsonl from an earlier run, and maxtext would append this "
      f"run's steps to it: pass another --out, or remove {tmp_path / name}"]
  other_rank = _script(script, "--dry-run", *data, "--out", str(tmp_path), env={"NODE_RANK": "1"})
  assert other_rank.returncode == 0, other_rank.stderr  # rank 1 writes metrics.rank1.jsonl, still absent


@pytest.mark.parametrize(
    "script, attention, folder",
    [("throughput_pair.sh", "fp8", "llama3_8b_throughput_te_nvfp4_fp8attn"),
     ("throughput_pair.sh", "bf16", "llama3_8b_throughput_te_nvfp4"),
     ("convergence_pair.sh", "bf16", "llama3_8b_convergence_te_nvfp4"),
     ("convergence_pair.sh", "fp8", "llama3_8b_convergence_te_nvfp4_fp8attn")],
)  # fmt: skip
def test_each_pair_has_a_default_folder_of_its_own(script, attention, folder):
  """Without --out, the two --attention pairs of a script land in two folders, so running both keeps two fp8 runs."""
  out = REPO_ROOT / "results" / "recipes" / folder
  if any(out.glob("*/metrics*.jsonl")):
    pytest.skip(f"{out} holds a real run's metrics: the script refuses it, as it should")
  data = ["--data-dir", "/d"] if script == "convergence_pair.sh" else []
  proc = _script(script, "--dry-run", *data, "--attention", attention)
  assert proc.returncode == 0, proc.stderr
  train = [c for c in _commands(proc.stdout) if "MaxText.train" in c]
  assert {_kv(c)["base_output_directory"] for c in train} == {str(out)}


_FAKE_PYTHON = """#!{python}
# Stands in for `python` in the recipe scripts: `-m MaxText.train` writes the metrics a Blackwell run would record
# (FP8 2.0 s/step, NVFP4 1.0 s/step, NVFP4 loss +0.03 nats); anything else runs in the real interpreter.
import json, os, runpy, sys
if sys.argv[1:3] == ["-m", "MaxText.train"]:
  kv = dict(a.split("=", 1) for a in sys.argv[4:] if "=" in a)
  nvfp4 = kv["run_name"].startswith("te_nvfp4")
  with open(kv["metrics_file"], "w") as f:
    for s in range(int(kv["steps"])):
      t = 1.0 if nvfp4 else 2.0
      f.write(json.dumps({{"learning/loss": 10.0 - 0.1 * s + (0.03 if nvfp4 else 0.0), "step": s,
                          "perf/step_time_seconds": t, "perf/per_device_tflops_per_sec": 1000.0 / t,
                          "perf/per_device_tokens_per_sec": 16384.0 / t, "run_name": kv["run_name"]}}) + "\\n")
  sys.exit(0)
sys.path.insert(0, os.getcwd())
if sys.argv[1] == "-m":
  sys.argv = sys.argv[2:]
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
  os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


def _fake_tools(tmp_path, compute_caps: str | None) -> dict[str, str]:
  """Environment with a stand-in trainer and an `nvidia-smi` that lists `compute_caps` (None: it finds no GPU)."""
  fake = tmp_path / "python"
  fake.write_text(_FAKE_PYTHON.format(python=sys.executable))
  fake.chmod(0o755)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  smi = bin_dir / "nvidia-smi"
  body = "echo 'NVIDIA-SMI has failed' >&2; exit 9" if compute_caps is None else f"printf '{compute_caps}'"
  smi.write_text(f"#!/bin/sh\n{body}\n")
  smi.chmod(0o755)
  return {"PYTHON": str(fake), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_throughput_pair_runs_end_to_end_on_recorded_metrics(tmp_path):
  out = tmp_path / "out"
  proc = _script("throughput_pair.sh", "--out", str(out), env=_fake_tools(tmp_path, "10.0\n10.0\n"))
  assert proc.returncode == 0, proc.stderr
  assert "warning" not in proc.stderr  # two Blackwell GPUs: no complaint
  assert "| te_nvfp4_fp8attn | ok |" in proc.stdout
  report = read_report(out / "report" / "report.json")
  (c,) = report.comparisons
  assert (c.baseline, c.candidate) == ("fp8", "te_nvfp4_fp8attn")
  assert c.speedup == pytest.approx(2.0) and c.loss_gap.mean_nats == pytest.approx(0.03)
  assert (out / "report" / "loss.png").is_file()


def test_non_zero_rank_writes_its_own_metrics_and_skips_compare(tmp_path):
  proc = _script("throughput_pair.sh", "--dry-run", "--out", str(tmp_path), env={"NODE_RANK": "1"})
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  assert not any("MaxText.compare" in c for c in cmds)
  assert _kv(cmds[1])["metrics_file"] == str(tmp_path / "fp8" / "metrics.rank1.jsonl")


@pytest.mark.parametrize("script", ["throughput_pair.sh", "convergence_pair.sh"])
@pytest.mark.parametrize(
    "caps, message",
    [(None, "no NVIDIA GPU found"), ("9.0\n", "compute capabilities 9.0 include one below 10.0"),
     ("10.0\n9.0\n", "compute capabilities 10.0,9.0 include one below 10.0")],
)  # fmt: skip
def test_scripts_refuse_hardware_that_cannot_run_the_recipe(tmp_path, script, caps, message):
  out = tmp_path / "out"
  data = ["--data-dir", "/data"] if script == "convergence_pair.sh" else []
  proc = _script(script, *data, "--out", str(out), env=_fake_tools(tmp_path, caps))
  assert proc.returncode == 2 and message in proc.stderr and "--force runs anyway" in proc.stderr
  assert proc.stdout == "" and not out.exists()  # refused before anything ran


def test_force_runs_anyway_with_a_warning(tmp_path):
  out = tmp_path / "out"
  proc = _script("throughput_pair.sh", "--force", "--out", str(out), env=_fake_tools(tmp_path, "9.0\n"))
  assert proc.returncode == 0, proc.stderr
  assert "warning: GPU compute capabilities 9.0 include one below 10.0" in proc.stderr
  assert (out / "report" / "report.json").is_file()


@pytest.mark.parametrize("script", ["throughput_pair.sh", "convergence_pair.sh"])
def test_help_prints_the_usage_block_only(script):
  proc = _script(script, "--help")
  assert proc.returncode == 0
  lines = proc.stdout.splitlines()
  assert lines[0].startswith("The ") and "Usage: scripts/recipes/" in proc.stdout and "--force" in proc.stdout
  assert lines[-1].strip().startswith("multi-node:")
  assert not any(line.startswith(("set -", "source ", "#")) or "Copyright" in line for line in lines)


def test_default_python_is_the_project_venv(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
  proc = subprocess.run(
      ["bash", str(SCRIPTS / "throughput_pair.sh"), "--dry-run", "--out", str(tmp_path)], cwd=REPO_ROOT, env=env,
      capture_output=True, text=True, timeout=120, check=False,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  venv = REPO_ROOT / ".venv" / "bin" / "python"
  expected = str(venv) if os.access(venv, os.X_OK) else "python3"
  assert _commands(proc.stdout)[1][0] == expected
