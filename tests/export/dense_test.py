# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""MaxText.export on a tiny Llama (scanned): check 1 in both formats, check 2 (transformers' logits), each
check failing on a planted fault, and what the export says and refuses (tests/export/checks.py has the checks)."""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Callable

import numpy as np
import pytest

from tests import helpers
from tests.export import checks
from tests.export.checks import check_load, check_logits, check_weights, config_of, export, parameters

#: The runs this file trains (tests/export/conftest.py's `trained`).
RUNS = {name: checks.ALL_RUNS[name] for name in ("dense_scanned",)}


@pytest.mark.slow
def test_compressed_tensors_reads_the_forwards_own_nvfp4_operands(trained, tmp_path):
  run = "dense_scanned"
  summary = export(trained[run], tmp_path / run)
  assert summary.exact and summary.step == checks.STEP, summary
  assert check_weights(tmp_path / run, parameters(trained[run]), run, "compressed-tensors", tmp_path) == checks.LAYERS * 3
  # Attention and the head stay BF16, listed in the format's ignore list; no MLP weight is.
  ignore = json.loads((tmp_path / run / "config.json").read_text())["quantization_config"]["ignore"]
  assert "lm_head" in ignore and "model.layers.1.self_attn.q_proj" in ignore, ignore
  assert not any(".mlp." in n for n in ignore), ignore


@pytest.mark.slow
def test_transformers_logits_equal_maxtexts_forward_on_the_same_weights(trained, tmp_path):
  run = "dense_scanned"
  params = parameters(trained[run])
  export(trained[run], tmp_path / "nvfp4")
  check_load(tmp_path / "nvfp4", tmp_path)
  check_logits(tmp_path / "nvfp4", trained[run], params, run, tmp_path)
  export(trained[run], tmp_path / "bf16", "bf16")
  check_logits(tmp_path / "bf16", trained[run], params, run, tmp_path, quantized=False)


@pytest.mark.slow
def test_modelopt_layout_reads_the_same_operands(trained, tmp_path):
  run = "dense_scanned"
  export(trained[run], tmp_path / "mo", "modelopt")
  quant = json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())["quantization"]
  assert quant["quant_algo"] == "W4A16_NVFP4" and quant["group_size"] == 16 and "lm_head" in quant["exclude_modules"]
  assert check_weights(tmp_path / "mo", parameters(trained[run]), run, "modelopt", tmp_path) == checks.LAYERS * 3


# --- each check fails on a planted fault -------------------------------------------------------------------------


def _planted(monkeypatch, fault: Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]) -> None:
  """Every NVFP4 weight's tensors pass through `fault(name, tensors)` on their way to the file."""
  from MaxText.export import layouts  # pylint: disable=import-outside-toplevel

  original = layouts.tensors_of
  monkeypatch.setattr(layouts, "tensors_of", lambda name, q, fmt, *rest: fault(name, original(name, q, fmt, *rest)))


@pytest.mark.slow
def test_swapped_nibbles_fail_check_1(trained, tmp_path, monkeypatch):
  run = "dense_scanned"
  _planted(monkeypatch, lambda name, t: {k: ((v << 4) | (v >> 4)) if k.endswith("weight_packed") else v
                                         for k, v in t.items()})
  export(trained[run], tmp_path / "swapped")
  with pytest.raises(AssertionError, match="packed codes differ"):
    check_weights(tmp_path / "swapped", parameters(trained[run]), run, "compressed-tensors", tmp_path)


@pytest.mark.slow
def test_modelopts_global_scale_in_compressed_tensors_fails_check_2(trained, tmp_path, monkeypatch):
  run = "dense_scanned"
  _planted(monkeypatch, lambda name, t: {k: (1 / v).astype(np.float32) if k.endswith("weight_global_scale") else v
                                         for k, v in t.items()})  # amax/2688 where 2688/amax belongs
  export(trained[run], tmp_path / "global")
  with pytest.raises(AssertionError, match="logits differ"):
    check_logits(tmp_path / "global", trained[run], parameters(trained[run]), run, tmp_path)


@pytest.mark.slow
def test_a_bf16_layer_missing_from_the_ignore_list_fails_the_load_or_check_1(trained, tmp_path, monkeypatch):
  from MaxText.export import layouts  # pylint: disable=import-outside-toplevel

  run = "dense_scanned"
  original = layouts.quantization_config
  monkeypatch.setattr(layouts, "quantization_config", lambda fmt, ignore, *rest: original(
      fmt, [n for n in ignore if n != "model.layers.0.self_attn.q_proj.weight"], *rest))
  export(trained[run], tmp_path / "unlisted")
  with pytest.raises((AssertionError, RuntimeError), match="q_proj"):
    check_weights(tmp_path / "unlisted", parameters(trained[run]), run, "compressed-tensors", tmp_path)
    check_load(tmp_path / "unlisted", tmp_path)


# --- activations: W4A4 with calibrated input scales ------------------------------------------------------------


def _statistics_input_amax(overrides: list[str], root: pathlib.Path, steps: int, jax_cache_dir) -> dict[str, float]:
  """The oracle: the *statistics* tap's fprop_x amax (MaxText.nvfp4.stats, another measurement than the calibration
  tap's) in this test's own resume of the run's checkpoint for `steps` steps at learning rate 0: `layer_XX/<gemm>` ->
  its largest over the steps."""
  from MaxText.integration.artifacts import parse_stat_name  # pylint: disable=import-outside-toplevel

  given = dict(o.split("=", 1) for o in overrides)
  step_dir = pathlib.Path(given["base_output_directory"]) / given["run_name"] / "checkpoints" / str(checks.STEP)
  (root / "oracle" / "checkpoints").mkdir(parents=True)
  (root / "oracle" / "checkpoints" / str(checks.STEP)).symlink_to(step_dir)
  metrics = root / "oracle.jsonl"
  mine = ["run_name=oracle", f"base_output_directory={root}", f"metrics_file={metrics}",
          f"steps={checks.STEP + 1 + steps}", "learning_rate=0", "enable_checkpointing=true",
          "async_checkpointing=false", "checkpoint_period=1000000", "nvfp4_stats_interval=1"]
  run = helpers.train_cli([*[o for o in overrides if o.split("=", 1)[0] not in {m.split("=")[0] for m in mine}],
                           *mine], jax_cache_dir)
  assert run.returncode == 0, run.stderr[-3000:]
  found: dict[str, float] = {}
  for row in (json.loads(line) for line in metrics.read_text().splitlines() if line.strip()):
    for name, value in row.items():
      if (stat := parse_stat_name(name)) is not None and (stat.operand, stat.stat) == ("fprop_x", "amax"):
        at = f"layer_{stat.layer:02d}/{stat.gemm}"
        found[at] = max(found.get(at, 0.0), float(value))
  return found


@pytest.mark.slow
def test_calibrated_input_scales_are_the_forwards_input_amax_in_both_formats(trained, tmp_path, jax_cache_dir):
  """--activations calibrate: every NVFP4 Linear's input global scale is 2688 / (its input's amax over the
  calibration steps), that amax is the one the statistics tap measures on the same steps, compressed-tensors'
  loader attaches it to the module with NVFP4 (tensor-group 16, local dynamic) inputs, and ModelOpt's file holds
  amax / 2688 under quant_algo NVFP4."""
  from MaxText.export import calibrate, run  # pylint: disable=import-outside-toplevel
  from MaxText.export.layouts import Format  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.quantize import tensor_scales  # pylint: disable=import-outside-toplevel

  name, steps = "dense_scanned", 2
  config = config_of(trained[name])
  measured = []

  def measure(checkpoint):
    # The run's own late switch is on the command line: the calibration clears it, or steps after it measure nothing.
    measured.append(calibrate.calibrate(config, str(helpers.TINY_YML), [*trained[name], "nvfp4_bf16_from_step=1"],
                                        checkpoint.path, steps, tmp_path / "work"))
    return measured[-1]

  run.export(config, tmp_path / "ct", Format.COMPRESSED_TENSORS, progress=False, calibrate=measure)
  run.export(config, tmp_path / "mo", Format.MODELOPT, progress=False, calibrate=lambda _: measured[0])
  amax = json.loads((tmp_path / "ct" / run.METADATA_FILE).read_text())["activations"]["input_amax"]
  assert amax == _statistics_input_amax(trained[name], tmp_path, steps, jax_cache_dir)
  assert set(amax) == {f"layer_{layer:02d}/mlp/{g}" for layer in range(checks.LAYERS) for g in ("wi_0", "wi_1", "wo")}

  out = tmp_path / "inputs.json"
  checks.hf_side("inputs", str(tmp_path / "ct"), str(out))
  held = json.loads(out.read_text())
  hf = {"wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}
  modules = {at: f"model.layers.{int(at[6:8])}.mlp.{hf[at.rsplit('/', 1)[1]]}" for at in amax}
  assert set(held) == set(modules.values()), sorted(held)
  for at, module in modules.items():
    s_enc, s_dec = (np.float32(s) for s in tensor_scales(np.float32(amax[at])))
    assert held[module]["input_global_scale"] == [s_enc], (module, held[module], amax[at])
    assert (held[module]["num_bits"], held[module]["strategy"], held[module]["group_size"],
            held[module]["dynamic"]) == (4, "tensor_group", 16, "local"), held[module]
    assert checks.tensor(tmp_path / "mo", f"{module}.input_scale") == s_dec, module
  quant = json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())["quantization"]
  assert quant["quant_algo"] == "NVFP4", quant


def test_the_calibration_keeps_each_inputs_largest_amax_over_the_steps(tmp_path):
  """Batches differ from step to step in a real run (tiny.yml's synthetic data repeats one batch, so the runs above
  cannot tell the largest from the last): the amax is the largest over the steps, and the steps that measured are
  counted."""
  from MaxText.export import calibrate  # pylint: disable=import-outside-toplevel

  name = "nvfp4/calibration/layer_01/mlp/wi_0/fprop_x/amax"
  rows = [{"step": 0, name: 3.0, "learning/loss": 5.0}, {"step": 1, name: 5.0}, {"step": 2, name: 4.0},
          {"step": 3, "learning/loss": 4.5}]
  (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert calibrate.read_input_amax(tmp_path / "m.jsonl") == ({(1, "mlp/wi_0"): 5.0}, 3)


@pytest.mark.slow
def test_an_export_through_load_parameters_path_knows_its_step_and_ships_a_tokenizer_directory(trained, tmp_path):
  """maxtext's usual form, `load_parameters_path=<run>/checkpoints/<step>/items`: the step is read from it (here it
  decides that a switch at step 3 made the export post-training), and a local tokenizer directory is copied."""
  from MaxText.export.run import METADATA_FILE  # pylint: disable=import-outside-toplevel

  given = dict(o.split("=", 1) for o in trained["dense_scanned"])
  items = pathlib.Path(given["base_output_directory"]) / given["run_name"] / "checkpoints" / str(checks.STEP) / "items"
  tokenizer = tmp_path / "tokenizer"
  tokenizer.mkdir()
  for f in ("tokenizer.json", "tokenizer_config.json"):
    (tokenizer / f).write_text("{}")
  # Another run_name, one that saved nothing: a run's own checkpoints come first, as maxtext resumes them.
  summary = export(trained["dense_scanned"], tmp_path / "ct", "compressed-tensors", f"load_parameters_path={items}",
                   "run_name=elsewhere", "nvfp4_bf16_from_step=3", f"tokenizer_path={tokenizer}")
  assert summary.step == checks.STEP and not summary.exact and "switched to BF16" in summary.line, summary
  meta = json.loads((tmp_path / "ct" / METADATA_FILE).read_text())
  assert (meta["source"]["step"], meta["source"]["found_by"]) == (checks.STEP, "load_parameters_path"), meta["source"]
  assert summary.source == f"{items} (load_parameters_path)", summary.source
  assert summary.tokenizer.startswith(f"tokenizer copied from {tokenizer}"), summary.tokenizer
  assert all((tmp_path / "ct" / f).read_text() == "{}" for f in ("tokenizer.json", "tokenizer_config.json"))


# --- what the export says and refuses -----------------------------------------------------------------------------


def _sha256(path: pathlib.Path) -> str:
  import hashlib  # pylint: disable=import-outside-toplevel

  return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_metadata_names_the_source_the_nvfp4_tensors_and_each_files_checksum(trained, tmp_path):
  from MaxText.export.run import METADATA_FILE  # pylint: disable=import-outside-toplevel

  export(trained["dense_scanned"], tmp_path / "ct")
  meta = json.loads((tmp_path / "ct" / METADATA_FILE).read_text())
  assert meta["source"]["step"] == checks.STEP and meta["source"]["run_name"] == "dense_scanned", meta["source"]
  assert meta["nvfp4"]["exact"] is True and meta["nvfp4"]["weight_scaling"] == "2d"
  assert len(meta["nvfp4"]["tensors"]) == checks.LAYERS * 3 and meta["recipe"]["quantization"] == "te_nvfp4"
  files = {p.name for p in (tmp_path / "ct").iterdir()} - {METADATA_FILE}
  assert set(meta["files_sha256"]) == files
  assert all(_sha256(tmp_path / "ct" / name) == digest for name, digest in meta["files_sha256"].items())
  assert "not copied" in meta["tokenizer"]  # the catalogue's tokenizer is a hub id: nothing is downloaded


@pytest.mark.slow
@pytest.mark.parametrize("more, exact, says", [
    (["nvfp4_bf16_from_step=4"], True, "the MLP forward ran in NVFP4"),
    (["nvfp4_bf16_from_step=3"], False, "switched to BF16"),  # checkpoint 2 feeds step 3's forward
    (["nvfp4_bf16_forward_from_step=1"], False, "switched to BF16"),
    (["quantization="], False, "trained without NVFP4"),
])
def test_the_forward_precision_at_the_step_decides_exact_or_post_training(more, exact, says, trained, tmp_path):
  summary = export(trained["dense_scanned"], tmp_path / "ct", "compressed-tensors", *more)
  assert summary.exact is exact and says in summary.line, summary
  assert len(summary.nvfp4) == checks.LAYERS * 3  # the same recipe either way


@pytest.mark.slow
def test_bf16_layers_stay_unquantized_and_listed(trained, tmp_path):
  summary = export(trained["dense_scanned"], tmp_path / "first", "compressed-tensors", "nvfp4_bf16_first_layers=1")
  assert all(n.startswith("model.layers.1.") for n in summary.nvfp4) and len(summary.nvfp4) == 3, summary.nvfp4
  assert {f"model.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")} <= set(summary.ignore)


@pytest.mark.slow
def test_an_interrupted_export_leaves_nothing_behind(trained, tmp_path, monkeypatch):
  from MaxText.export import writer  # pylint: disable=import-outside-toplevel

  calls = []
  original = writer.ExportDir.write_shard

  def fail_second(self, tensors):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    original(self, tensors)

  monkeypatch.setattr(writer.ExportDir, "write_shard", fail_second)
  with pytest.raises(KeyboardInterrupt):
    export(trained["dense_scanned"], tmp_path / "out")
  assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


@pytest.mark.slow
def test_bad_input_raises_before_anything_is_written(trained, tmp_path):
  from MaxText.export.mapping import ExportError  # pylint: disable=import-outside-toplevel

  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("x")
  with pytest.raises(ExportError, match="not empty.*--force"):
    export(trained["dense_scanned"], tmp_path / "full")
  with pytest.raises(ExportError, match="no checkpoint found"):
    export(trained["dense_scanned"], tmp_path / "a", "compressed-tensors", "run_name=never_trained")
  with pytest.raises(ExportError, match="model_name=default.*maps: .*llama3.1-8b"):
    export([o for o in trained["dense_scanned"] if not o.startswith("model_name")], tmp_path / "b")
  # --activations calibrate: an unquantized export has no input scales; a run without NVFP4 GEMMs nothing to measure.
  from MaxText.export import calibrate, run  # pylint: disable=import-outside-toplevel
  from MaxText.export.layouts import Format  # pylint: disable=import-outside-toplevel
  config = config_of(trained["dense_scanned"])
  with pytest.raises(ExportError, match="--activations calibrate with --format bf16"):
    run.export(config, tmp_path / "c", Format.BF16, progress=False, calibrate=lambda _: pytest.fail("measured"))
  fp8 = config_of(trained["dense_scanned"], "quantization=fp8")
  with pytest.raises(ExportError, match="quantization=fp8, nvfp4_mlp_precision=nvfp4 and nvfp4_attention_precision="
                                        "bf16: the calibration measures"):
    calibrate.calibrate(fp8, str(helpers.TINY_YML), [], tmp_path / "ckpt", 2, tmp_path / "work")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_a_weight_nvfp4_cannot_block_is_refused_with_its_dims():
  from MaxText.export import mapping, run  # pylint: disable=import-outside-toplevel
  from MaxText.export.layouts import Format  # pylint: disable=import-outside-toplevel
  from MaxText.export.mapping import ExportError  # pylint: disable=import-outside-toplevel

  config = config_of([*checks.DENSE, "base_mlp_dim=200", "quantization="])  # a bf16 run: post-training quantization
  model = mapping.model_of(config)
  with pytest.raises(ExportError, match=r"model.layers.0.mlp.gate_proj.weight \[200, 64\]: output features 200"):
    run._plan(config, model, list(model.param_map), Format.COMPRESSED_TENSORS)  # pylint: disable=protected-access
  run._plan(config, model, list(model.param_map), Format.BF16)  # pylint: disable=protected-access  # bf16 exports it


@pytest.mark.slow
def test_the_command_line_says_what_it_wrote_and_refuses_in_one_line(trained, tmp_path, jax_cache_dir):
  import sys  # pylint: disable=import-outside-toplevel

  def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "MaxText.export", str(helpers.TINY_YML), *args,
                           f"jax_cache_dir={jax_cache_dir}"], cwd=helpers.REPO_ROOT, capture_output=True, text=True,
                          env=helpers.subprocess_env(), check=False)

  done = cli(*trained["dense_scanned"], "--out", str(tmp_path / "ok"), "--format", "modelopt")
  assert done.returncode == 0, done.stderr[-3000:]
  assert "step 2: the MLP forward ran in NVFP4" in done.stdout and "6 NVFP4 weights" in done.stdout, done.stdout
  missing = cli(*trained["dense_scanned"], "run_name=nothing_here", "--out", str(tmp_path / "no"))
  assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].startswith(
      "MaxText.export: no checkpoint found"), missing.stderr[-2000:]
  fmt = cli(*trained["dense_scanned"], "--out", str(tmp_path / "no"), "--format", "gguf")
  assert fmt.returncode == 2 and "invalid choice: 'gguf'" in fmt.stderr.strip().splitlines()[-1], fmt.stderr[-2000:]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ok"]
