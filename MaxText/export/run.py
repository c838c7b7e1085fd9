# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""One export: the plan (which tensor is written how, checked before anything is read), then the checkpoint one
parameter at a time through maxtext's conversion, each NVFP4 weight (MLP, and attention projections that trained in
NVFP4) quantized as the training forward did, in its layout, then moved where the conversion moves it (moves.py)."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from MaxText.export import layouts, mapping, moves, source
from MaxText.export.calibrate import Calibration
from MaxText.export.layouts import Format
from MaxText.export.mapping import ExportError
from MaxText.export.writer import ExportDir, check_destination
from MaxText.integration.run_keys import run_keys
from MaxText.integration.settings import settings_of
from MaxText.nvfp4.formats import BLOCK_SIZE
from MaxText.precision.policy import Precision

__all__ = ["Summary", "export", "METADATA_FILE"]

METADATA_FILE = "nvfp4_export.json"


@dataclasses.dataclass(frozen=True)
class Summary:
  """What an export wrote, for the command line's report and for tests."""

  out: pathlib.Path
  step: int | None
  exact: bool
  line: str
  nvfp4: tuple[str, ...]
  ignore: tuple[str, ...]
  tokenizer: str
  source: str = ""  # the checkpoint exported, and how it was found (source.find_checkpoint)


def key_str(key: str | tuple[str, ...]) -> str:
  """A checkpoint parameter key as one string (maxtext's mapping keys a parameter split in several by a tuple)."""
  return key[0] if isinstance(key, tuple) else key


def _names(targets: Any) -> list[str]:
  """The HF names a parameter maps to, flattened (maxtext nests them by layer and expert)."""
  if isinstance(targets, str):
    return [targets]
  return [n for t in targets for n in _names(t)]  # a list (layers, experts) or a tuple (one parameter split in several)


def _linear(name: str, shape: tuple[int, ...]) -> bool:
  """A Hugging Face nn.Linear weight (what the formats' `Linear` target matches): 2D, not the embedding table."""
  return name.endswith(".weight") and len(shape) == 2 and "embed_tokens" not in name


def _plan(config: Any, model: mapping.Model, keys: list[Any], fmt: Format) -> dict[str, Precision]:
  """Every HF tensor's precision in the export; an NVFP4 weight whose dimensions NVFP4 cannot block is refused
  here, before the checkpoint is read."""
  two_d = settings_of(config).recipe.weight_2d
  plan: dict[str, Precision] = {}
  for key in keys:
    for name in _names(model.param_map[key]):
      p = mapping.precision_of(config, key_str(key), name) if layouts.LAYOUTS[fmt].quantized else Precision.BF16
      shape = tuple(model.shapes[name])
      if p is Precision.NVFP4 and isinstance(key, tuple):
        raise ExportError(f"{name}: maxtext's conversion makes it of several parameters ({', '.join(key)}), so it is "
                          "no one trained NVFP4 operand; export with --format bf16")
      if p is Precision.NVFP4:
        out_dim, in_dim = shape
        bad = [f"{what} {dim}" for what, dim in (("input features", in_dim), ("output features", out_dim))
               if dim % BLOCK_SIZE and (what == "input features" or two_d)]
        if bad:
          raise ExportError(f"{name} {list(shape)}: {' and '.join(bad)} not a multiple of {BLOCK_SIZE}, so NVFP4 "
                            "cannot block it (export with --format bf16, or train with dims that are)")
      plan[name] = p
  return plan


def _tokenizer(config: Any, out: ExportDir) -> str:
  """Copies the config's tokenizer when it is a local file or directory; says where it is when it is not."""
  given = run_keys(config).tokenizer_path
  path = pathlib.Path(str(given or ""))
  if given and path.exists():
    return f"tokenizer copied from {path}: {', '.join(out.copy_in(path))}"
  return (f"tokenizer not copied: tokenizer_path={given or '(unset)'} is not a local path "
          "(the export downloads nothing; add the tokenizer files to the directory yourself)")


def export(config: Any, out: pathlib.Path, fmt: Format, force: bool = False, progress: bool = True,
           calibrate: Callable[[source.Checkpoint], Calibration] | None = None) -> Summary:
  """Writes the run's checkpoint to `out` in `fmt`; returns what was written. Bad input raises ExportError before
  anything is written (and nothing is left half-written: writer.ExportDir).

  calibrate: W4A4 (`--activations calibrate`): measures the NVFP4 GEMMs' input amax from the checkpoint
  (MaxText.export.calibrate), each NVFP4 Linear then also gets its input's global scale; None: weight-only (W4A16).
  """
  model = mapping.model_of(config)
  check_destination(out, force)
  checkpoint = source.find_checkpoint(config)
  if calibrate is not None and not layouts.LAYOUTS[fmt].quantized:
    quantized = " or ".join(f.value for f, layout in layouts.LAYOUTS.items() if layout.quantized)
    raise ExportError(f"--activations calibrate with --format {fmt.value}: an unquantized export has no input "
                      f"scales; use --format {quantized}")
  calibration = calibrate(checkpoint) if calibrate is not None else None
  exact, line = mapping.exact(config, checkpoint.step)
  state = source.read_parameters(config, checkpoint)
  pairs = {p.gate: p for p in mapping.split_fused(state)}  # fused_mlp: gate and up quantized as one operand
  # pylint: disable-next=import-outside-toplevel  # import cost: maxtext, transformers and tqdm load when exporting
  from maxtext.checkpoint_conversion.utils.utils import validate_and_filter_param_map_keys
  params = set(mapping.params_only(state))
  try:
    keys = validate_and_filter_param_map_keys(list(model.param_map), params)
  except ValueError as e:
    missing = sorted(params - {k for key in model.param_map for k in (key if isinstance(key, tuple) else (key,))})
    shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
    raise ExportError(f"model_name={model.name} (scan_layers={run_keys(config).scan_layers}): maxtext's mapping "
                      f"does not cover the checkpoint's {shown}") from e
  plan = _plan(config, model, keys, fmt)
  two_d = settings_of(config).recipe.weight_2d
  dtype = run_keys(config).dtype
  # pylint: disable-next=import-outside-toplevel  # import cost: maxtext, transformers and tqdm load when exporting
  from tqdm import tqdm
  ups = {p.up for p in pairs.values()}

  def nvfp4(name: str, q: layouts.QuantizedWeight, gemm_key: str) -> dict[str, np.ndarray]:
    amax = calibration.input_amax(gemm_key, name) if calibration is not None else None
    return layouts.tensors_of(name, q, fmt, amax)

  with ExportDir(out, force, shards=sum(mapping.pieces(model, key) for key in keys)) as d:
    for key in tqdm(keys, desc="export", unit="param", disable=not progress, file=sys.stderr):
      if key_str(key) in ups:
        continue  # written with its gate
      if (pair := pairs.get(key_str(key))) is not None:
        gate, up = state.pop(pair.gate), state.pop(pair.up)
        for gate_piece, up_piece in zip(mapping.converted(model, pair.gate, gate, config),
                                        mapping.converted(model, pair.up, up, config)):
          for tensors in _fused_pieces(gate_piece.tensors, up_piece.tensors, plan, dtype, two_d,
                                       lambda n, q: nvfp4(n, q, pair.fused)):
            d.write_shard(tensors)
        del gate, up
        continue
      weight = [state.pop(k) for k in key] if isinstance(key, tuple) else state.pop(key)
      found: list[moves.Move] | None = None  # where the conversion puts the elements: one key's pieces share it
      for piece in mapping.converted(model, key, weight, config):  # one layer or expert at a time where stacked
        written: dict[str, np.ndarray] = {}
        for i, (name, array) in enumerate(piece.tensors):
          if plan[name] is not Precision.NVFP4:
            written[name] = array
            continue
          found = found or moves.moves(piece.probe, tuple(np.shape(piece.weight)))
          q = layouts.quantize_weight(found[i].operand(piece.weight), dtype, two_d)
          written.update(nvfp4(name, moves.apply(found[i], q), key_str(key)))
        d.write_shard(written)
      del weight
    nvfp4 = tuple(sorted(n for n, p in plan.items() if p is Precision.NVFP4))
    ignore = tuple(sorted(n for n, p in plan.items() if p is Precision.BF16 and _linear(n, tuple(model.shapes[n]))))
    _write_configs(d, model, fmt, list(ignore), jnp.dtype(dtype).name, calibration is not None)
    tokenizer = _tokenizer(config, d)
    d.write_index()
    d.write_json(METADATA_FILE, _metadata(config, checkpoint, fmt, exact, line, nvfp4, ignore, tokenizer,
                                          d.checksums(), calibration))
  return Summary(out, checkpoint.step, exact, line, nvfp4, ignore, tokenizer,
                 f"{checkpoint.path} ({checkpoint.source})")


def _fused_pieces(gate: list[tuple[str, np.ndarray]], up: list[tuple[str, np.ndarray]], plan: dict[str, Precision],
                  dtype: Any, two_d: bool, nvfp4: Callable[[str, layouts.QuantizedWeight], dict[str, np.ndarray]]
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """The tensors of one layer's gate_proj and up_proj from a fused gate/up kernel (mapping.FusedPair).

  NVFP4: the two [out, in] weights stacked along `out` are the transpose of the fused [in, 2 x out] operand the
  training forward multiplied; quantized as one weight (one amax, one tensor scale, 16x16 tiles that never straddle
  the two: out is a multiple of 16), then split by rows. Each half carries the shared tensor scale, which is what
  vLLM's fused gate/up layer assumes."""
  ((gate_name, gate_w),), ((up_name, up_w),) = gate, up
  if plan[gate_name] is not Precision.NVFP4:
    return {gate_name: gate_w}, {up_name: up_w}
  q = layouts.quantize_weight(np.concatenate([np.asarray(gate_w), np.asarray(up_w)], axis=0), dtype, two_d)
  rows = np.shape(gate_w)[0]
  halves = [dataclasses.replace(q, packed=q.packed[part], scale=q.scale[part])
            for part in (np.s_[:rows], np.s_[rows:])]
  return nvfp4(gate_name, halves[0]), nvfp4(up_name, halves[1])


def _write_configs(d: ExportDir, model: mapping.Model, fmt: Format, ignore: list[str], compute_dtype: str,
                   activations: bool) -> None:
  """config.json (maxtext's HF config, sized from the run) with the format's quantization config, and the format's
  own files beside it (ModelOpt's hf_quant_config.json)."""
  # pylint: disable-next=import-outside-toplevel  # import cost: maxtext, transformers and tqdm load when exporting
  from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
  hf = model.hf_config.to_dict()
  if hf.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
    hf["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[hf["model_type"]]]
  layout = layouts.LAYOUTS[fmt]
  if layout.quantized:
    # The libraries decompress NVFP4 weights to bf16 (compressed-tensors on the first forward), so the model must load
    # in the run's compute dtype: with none named, transformers loads float32 and that forward fails.
    hf["dtype"] = compute_dtype
    quant = layouts.quantization_config(fmt, ignore, activations)
    for name, content in layout.files(quant).items():
      d.write_json(name, content)
    hf["quantization_config"] = layout.config_json(quant)
  d.write_json("config.json", hf)


def _metadata(config: Any, checkpoint: source.Checkpoint, fmt: Format, exact: bool, line: str,
              nvfp4: tuple[str, ...], ignore: tuple[str, ...], tokenizer: str, files: dict[str, str],
              calibration: Calibration | None) -> dict:
  settings, keys = settings_of(config), run_keys(config)
  if not layouts.LAYOUTS[fmt].quantized:
    activations: Any = "none (unquantized)"
  elif calibration is None:
    activations = "none (weight-only: W4A16)"
  else:
    activations = {"scheme": "W4A4: NVFP4 inputs, global scale from the calibrated amax",
                   "calibration_steps": calibration.steps,
                   "input_amax": {f"layer_{layer:02d}/{gemm}": amax
                                  for (layer, gemm), amax in sorted(calibration.amax.items())}}
  return {
      "source": {"run_name": keys.run_name, "checkpoint": str(checkpoint.path), "found_by": checkpoint.source,
                 "step": checkpoint.step, "model_name": keys.model_name, "scan_layers": bool(keys.scan_layers)},
      "recipe": dict(settings.record),
      "format": fmt.value,
      "activations": activations,
      "nvfp4": {"exact": exact if layouts.LAYOUTS[fmt].quantized else None, "why": line, "weight_scaling":
                "2d" if settings.recipe.weight_2d else "1d", "tensors": list(nvfp4)},
      "unquantized_linears": list(ignore),
      "tokenizer": tokenizer,
      "files_sha256": files,
  }
