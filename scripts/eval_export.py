#!/usr/bin/env python3
# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0.
"""Eval loss of exported models on the run's held-out batches: what serving in NVFP4 costs, and what training in
NVFP4 buys (docs/export.md#what-serving-in-nvfp4-costs). Prints a table and writes JSON. Not a test.

  .venv/bin/python scripts/eval_export.py RUN_DIR [RUN_DIR ...] [--work DIR] [--json results/eval_export.json]

Each RUN_DIR is a quickstart run (`scripts/quickstart.py`) that saved a checkpoint (enable_checkpointing=true) of a
model maxtext's conversion maps (a dense Llama: model_name=llama3.1-8b override_model_config=true and the
quickstart's shapes); its train.log's first line is the training command, whose config and overrides are reused.
For each run:
  1. `MaxText.export` writes its latest checkpoint in compressed-tensors format. A run whose MLP did not train in
     NVFP4 (the quickstart's bf16 baseline) is exported with quantization= : the recipe applied post-training.
  2. Each NVFP4 MLP weight is read back from the export's safetensors and dequantized by compressed-tensors'
     definition, fp4 * (weight_scale / weight_global_scale).
  3. maxtext's forward (the run's bf16 compute, unquantized GEMMs) evaluates the run's eval batches, the
     `eval_steps` batches of maxtext's own eval pass, once with the checkpoint's weights (what the bf16 export
     holds) and once with the NVFP4 export's MLP weights: per batch, loss sum and target tokens.
The paired gaps use the compare tool's statistics (MaxText.compare.analysis.paired_gap): each run's NVFP4 export
against its bf16 export, and the first run's NVFP4 export against each other run's.

What this is: W4A16 serving (weights NVFP4, activations bf16), evaluated by maxtext's forward. That the served model
computes the same is held by tests/export (check 1: compressed-tensors' own decompression equals these weights;
check 2: transformers' logits on an export equal maxtext's forward with them). The first run's baseline check:
its bf16 evaluation equals its own last eval pass in metrics.jsonl when that run trained in bf16.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shlex
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

# pylint: disable=wrong-import-position
from MaxText import register  # noqa: E402
from MaxText.compare.analysis import paired_gap  # noqa: E402
from MaxText.compare.metrics import load_run  # noqa: E402

#: HF module of each MLP GEMM of a dense Llama -> maxtext's parameter under the decoder layer.
_DENSE_MLP = {"gate_proj": "wi_0", "up_proj": "wi_1", "down_proj": "wo"}


def training_command(run_dir: pathlib.Path) -> tuple[str, list[str]]:
  """(config path, overrides) of the run, from the first line of its train.log (the quickstart writes it there)."""
  words = shlex.split((run_dir / "train.log").read_text().splitlines()[0])
  start = words.index("MaxText.train") + 1
  return words[start], words[start + 1:]


def _config(config_path: str, overrides: list[str], *more: str, plugin_keys: bool = True) -> Any:
  """maxtext's config of the run, `more` overriding its overrides; without the run's nvfp4_* overrides when
  `plugin_keys` is False (a run read as bf16, or exported with the recipe's defaults)."""
  from MaxText.export import source  # pylint: disable=import-outside-toplevel
  keys = {m.split("=", 1)[0] for m in more}
  kept = [o for o in overrides if o.split("=", 1)[0] not in keys and (plugin_keys or not o.startswith("nvfp4_"))]
  return source.load_config(config_path, kept + list(more))


def _read_safetensors(path: pathlib.Path, containing: str) -> dict[str, np.ndarray]:
  """The tensors of one .safetensors file whose names contain `containing`, read by the format's layout (an 8-byte
  little-endian header size, a JSON header of dtype, shape and byte offsets, then the data): safetensors' NumPy
  reader has no float8 dtype."""
  import ml_dtypes  # pylint: disable=import-outside-toplevel

  dtypes = {"U8": np.uint8, "F32": np.float32, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn}
  raw = path.read_bytes()
  size = int.from_bytes(raw[:8], "little")
  header = json.loads(raw[8:8 + size])
  out = {}
  for name, info in header.items():
    if name == "__metadata__" or containing not in name:
      continue
    begin, end = info["data_offsets"]
    data = raw[8 + size + begin:8 + size + end]
    out[name] = np.frombuffer(data, dtypes[info["dtype"]]).reshape(info["shape"])
  return out


def _nvfp4_weights(export_dir: pathlib.Path) -> dict[str, np.ndarray]:
  """HF module -> the dequantized [out, in] float32 weight of every NVFP4 Linear in a compressed-tensors export."""
  from MaxText.nvfp4.e2m1 import e2m1_values  # pylint: disable=import-outside-toplevel

  tensors: dict[str, np.ndarray] = {}
  for f in sorted(export_dir.glob("*.safetensors")):
    tensors.update(_read_safetensors(f, ".weight_"))
  out = {}
  for name in tensors:
    if not name.endswith(".weight_packed"):
      continue
    module = name.removesuffix(".weight_packed")
    packed = tensors[name]
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[0], -1)  # even element: low nibble
    scale = tensors[f"{module}.weight_scale"].astype(np.float32)
    global_scale = tensors[f"{module}.weight_global_scale"].astype(np.float32).reshape(())
    out[module] = np.asarray(e2m1_values(codes)) * np.repeat(scale / global_scale, 16, axis=1)
  return out


def _with_weights(params: dict, weights: dict[str, np.ndarray], scanned: bool) -> dict:
  """A copy of maxtext's parameter tree with each dense MLP kernel [in, out] replaced by the export's weight."""
  import copy  # pylint: disable=import-outside-toplevel
  tree = copy.deepcopy(params)
  for module, w in weights.items():
    parts = module.split(".")  # model.layers.<l>.mlp.<proj>
    if len(parts) != 5 or parts[3] != "mlp" or parts[4] not in _DENSE_MLP:
      raise SystemExit(f"eval_export: {module}: only dense Llama MLPs are mapped back here")
    layer, name = int(parts[2]), _DENSE_MLP[parts[4]]
    if scanned:
      kernel = np.array(tree["decoder"]["layers"]["mlp"][name]["kernel"])
      kernel[:, layer] = w.T
      tree["decoder"]["layers"]["mlp"][name]["kernel"] = kernel
    else:
      tree["decoder"][f"layers_{layer}"]["mlp"][name]["kernel"] = w.T
  return tree


def _eval_batches(config: Any) -> list[dict[str, np.ndarray]]:
  """The `eval_steps` batches of maxtext's own eval pass (its eval iterator, as the trainer builds it)."""
  # pylint: disable=import-outside-toplevel
  from maxtext.input_pipeline.input_pipeline_interface import create_data_iterator
  from maxtext.utils import maxtext_utils

  _, eval_iter = create_data_iterator(config, maxtext_utils.get_mesh_from_config(config))
  return [{k: np.asarray(v) for k, v in next(eval_iter).items()} for _ in range(config.eval_steps)]


def evaluate(config: Any, params: dict, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
  """[batches, 2]: each batch's mean loss (nats) and target tokens, as maxtext's loss_fn counts them."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  from maxtext.utils import max_utils, model_creation_utils

  model = model_creation_utils.from_config(config)

  @jax.jit
  def batch_loss(params, batch):
    logits = model.apply({"params": params}, batch["inputs"], batch["inputs_position"],
                         decoder_segment_ids=batch["inputs_segmentation"], enable_dropout=False)
    xent, _ = max_utils.cross_entropy_with_logits(logits, jax.nn.one_hot(batch["targets"], config.vocab_size), 0.0)
    mask = batch["targets_segmentation"] != 0
    return jnp.sum(xent * mask), jnp.sum(mask)

  rows = []
  for batch in batches:
    total, tokens = batch_loss(params, {k: jnp.asarray(v) for k, v in batch.items()})
    rows.append((float(total) / (float(tokens) + 1e-8), float(tokens)))  # maxtext's division
  return np.array(rows)


def run_one(run_dir: pathlib.Path, work: pathlib.Path) -> dict[str, Any]:
  """Exports one run in compressed-tensors format and evaluates its bf16 and NVFP4 weights."""
  # pylint: disable=import-outside-toplevel
  from maxtext.checkpoint_conversion.utils.utils import load_orbax_checkpoint

  from MaxText.export import mapping, source
  from MaxText.export.layouts import Format
  from MaxText.export.run import export

  config_path, overrides = training_command(run_dir)
  trained = _config(config_path, overrides)
  forward = _config(config_path, overrides, "quantization=", plugin_keys=False)  # bf16 compute, plain GEMMs
  exact, _ = mapping.exact(trained, source.find_checkpoint(trained).step)
  # A run whose MLP forward was not NVFP4 at that step: the recipe's defaults, applied post-training (the same keys
  # as the bf16 forward).
  exporting = trained if exact else forward
  out = work / f"{run_dir.name}-compressed-tensors"
  start = time.perf_counter()
  summary = export(exporting, out, Format.COMPRESSED_TENSORS, force=True, progress=False)
  export_s = time.perf_counter() - start
  checkpoint = source.find_checkpoint(forward)
  params = load_orbax_checkpoint(source.reader_config(forward, checkpoint))["params"]["params"]
  weights = _nvfp4_weights(out)
  batches = _eval_batches(forward)
  start = time.perf_counter()
  bf16 = evaluate(forward, params, batches)
  nvfp4 = evaluate(forward, _with_weights(params, weights, forward.scan_layers), batches)
  eval_s = time.perf_counter() - start
  logged = load_run(run_dir).eval_batches.get(checkpoint.step)
  return {"run": run_dir.name, "step": checkpoint.step, "exact": summary.exact, "export_line": summary.line,
          "nvfp4_weights": len(weights), "bf16": bf16.tolist(), "nvfp4": nvfp4.tolist(),
          "logged": None if logged is None else np.array(logged).tolist(), "export_s": export_s, "eval_s": eval_s}


def _mean(rows: list[list[float]]) -> float:
  a = np.array(rows)
  return float(np.sum(a[:, 0] * a[:, 1]) / np.sum(a[:, 1]))


def _gap(base: list[list[float]], cand: list[list[float]]) -> dict[str, Any]:
  interval, n, why = paired_gap(np.array(base), np.array(cand))
  return {"gap": _mean(cand) - _mean(base), "interval": interval, "batches": n, "why": why}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", type=pathlib.Path, help="quickstart run dirs (runs/<name>)")
  parser.add_argument("--work", type=pathlib.Path, default=None, help="where the exports go (default: a temp dir)")
  parser.add_argument("--json", type=pathlib.Path, default=pathlib.Path("results/eval_export.json"))
  args = parser.parse_args(argv)
  register()
  work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="eval_export-"))
  results = [run_one(r.resolve(), work) for r in args.runs]
  rows = []
  for r in results:
    r["nvfp4_vs_bf16"] = _gap(r["bf16"], r["nvfp4"])
    if r["logged"] is not None:
      r["bf16_vs_logged"] = _gap(r["logged"], r["bf16"])
  first = results[0]
  cross = {r["run"]: _gap(r["nvfp4"], first["nvfp4"]) for r in results[1:]}
  print(f"eval loss (nats) on {len(first['bf16'])} held-out batches, step {first['step']}; W4A16 exports, maxtext's "
        "bf16 forward")
  print(f"{'run':<12} {'NVFP4 weights':<22} {'bf16 export':>11} {'NVFP4 export':>12} {'gap':>8}  95% interval  "
        f"{'own eval pass':>13}")
  for r in results:
    g = r["nvfp4_vs_bf16"]
    kind = "exact (trained)" if r["exact"] else "post-training"
    logged = "-" if r["logged"] is None else f"{_mean(r['logged']):.4f}"
    lo, hi = g["interval"] or (float("nan"), float("nan"))
    print(f"{r['run']:<12} {kind:<22} {_mean(r['bf16']):>11.4f} {_mean(r['nvfp4']):>12.4f} {g['gap']:>+8.4f}  "
          f"[{lo:+.4f}, {hi:+.4f}]  {logged:>13}")
    rows.append(r)
  for name, g in cross.items():
    lo, hi = g["interval"] or (float("nan"), float("nan"))
    print(f"NVFP4 export of {first['run']} - NVFP4 export of {name}: {g['gap']:+.4f} [{lo:+.4f}, {hi:+.4f}]")
  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps({"machine": platform.node(), "date": time.strftime("%Y-%m-%d"), "runs": rows,
                                   "first_nvfp4_vs_other_nvfp4": cross}, indent=1))
  print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
