# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The export group's checks, shared by its test files: tiny Llama (dense) and Mixtral (routed experts) models trained
3 steps with te_nvfp4 (tests/export/conftest.py), exported and read back by the formats' own code (hf_side.py).

Check 1: every NVFP4 weight, unpacked and dequantized by compressed-tensors (and ModelOpt), is the emulator's 2D
quantization of the bf16 weight the forward used, computed here from maxtext's own layout ([in, out], per layer and
expert), code for code and scale for scale. Check 2: transformers' logits on the export equal maxtext's forward of
the same checkpoint with those weights. Each check is shown to fail on a planted fault.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from MaxText.integration.cli import not_overridden
from tests import helpers
from tests.export.conftest import EXPORT_PYTHON

HF_SIDE = pathlib.Path(__file__).with_name("hf_side.py")
_SHAPES = ["override_model_config=true", "base_emb_dim=64", "base_num_query_heads=4", "base_num_kv_heads=4",
           "head_dim=16", "base_num_decoder_layers=2", "vocab_size=256"]
DENSE = ["model_name=llama3.1-8b", *_SHAPES, "base_mlp_dim=256"]
MOE = ["model_name=mixtral-8x7b", *_SHAPES, "base_mlp_dim=128", "base_moe_mlp_dim=128", "num_experts=4",
       "num_experts_per_tok=2", "sparse_matmul=true", "megablox=false"]
#: Every run a test file may ask for (its module's RUNS names them): overrides of configs/tiny.yml.
ALL_RUNS = {"dense_scanned": [*DENSE, "scan_layers=true"], "moe_scanned": [*MOE, "scan_layers=true"],
            "moe_unscanned": [*MOE, "scan_layers=false"],
            # A learning rate that moves gate's and up's amax apart in 3 steps (at tiny.yml's, both stay at their
            # init's largest |w| in bf16): else one scale each and one shared scale would be the same numbers.
            "fused_scanned": [*DENSE, "scan_layers=true", "fused_mlp=true", "learning_rate=0.05"],
            "fused_unscanned": [*DENSE, "scan_layers=false", "fused_mlp=true", "learning_rate=0.05"],
            # Attention projections in NVFP4, with a head_dim whose square root (the query's scale in maxtext's
            # conversion) is not a power of two, and whose RoPE row order moves rows across 16-row tiles.
            "attention_scanned": [*DENSE, "head_dim=32", "scan_layers=true", "nvfp4_attention_precision=nvfp4"]}
LAYERS, EXPERTS, STEP = 2, 4, 2
#: Logits of transformers and maxtext on the same float32 weights: only the order of float32 operations differs
#: (measured 2.0e-6 on the NVFP4 export, 1.9e-6 on the bf16 one; NVFP4 itself moves these logits by 0.67).
LOGITS_ATOL = 1e-4


def config_of(overrides: list[str], *more: str) -> Any:
  return helpers.load_config(helpers.TINY_YML, *not_overridden(overrides, more), *more)


def export(overrides: list[str], out: pathlib.Path, fmt: str = "compressed-tensors", *more: str) -> Any:
  from MaxText.export import run  # pylint: disable=import-outside-toplevel
  from MaxText.export.layouts import Format  # pylint: disable=import-outside-toplevel

  return run.export(config_of(overrides, *more), out, Format(fmt), progress=False)


def hf_side(*args: str) -> None:
  proc = subprocess.run([str(EXPORT_PYTHON), str(HF_SIDE), *args], capture_output=True, text=True, check=False,
                        env=helpers.subprocess_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}))
  if proc.returncode:
    raise RuntimeError(f"hf_side.py {args[0]} failed: {proc.stderr[-3000:]}")


def tensor(export: pathlib.Path, name: str) -> np.ndarray:
  """One tensor of an export, read from its safetensors files."""
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel

  for f in sorted(export.glob("*.safetensors")):
    with safe_open(str(f), "numpy") as st:
      if name in st.keys():
        return st.get_tensor(name)
  raise KeyError(f"{name} is in no file of {export}")


def parameters(overrides: list[str]) -> dict[str, np.ndarray]:
  from MaxText.export import source  # pylint: disable=import-outside-toplevel

  config = config_of(overrides)
  return {k: np.asarray(v) for k, v in source.read_parameters(config, source.find_checkpoint(config)).items()}


def _maxtext_weights(params: dict[str, np.ndarray], run: str
                     ) -> Iterator[tuple[str, np.ndarray, str, Any, np.float32]]:
  """(HF module, the [in, out] kernel one NVFP4 GEMM multiplied, its maxtext parameter, the module's rows of it in HF
  layout [out, in], the factor HF's weight carries) for every NVFP4 GEMM, read from maxtext's layout here (layer
  axis 1 when scanned; experts first; a fused gate/up kernel [in, 2, out] is one GEMM of [in, 2 x out], gate its
  first half), not through the export's mapping."""
  scanned = run.endswith("_scanned")
  every, one = slice(None), np.float32(1)

  def kernel(name: str, layer: int) -> tuple[str, np.ndarray]:
    key = f"params-decoder-layers-{name}" if scanned else f"params-decoder-layers_{layer}-{name}"
    return key, params[key][:, layer] if scanned else params[key]

  for layer in range(LAYERS):
    if run.startswith("fused"):
      key, w = kernel("mlp-wi-kernel", layer)
      half = w.shape[-1]
      for i, hf in enumerate(("gate_proj", "up_proj")):
        yield f"model.layers.{layer}.mlp.{hf}", w.reshape(w.shape[0], -1), key, slice(i * half, (i + 1) * half), one
      key, w = kernel("mlp-wo-kernel", layer)
      yield f"model.layers.{layer}.mlp.down_proj", w, key, every, one
    elif run.startswith(("dense", "attention")):
      for mt, hf in (("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")):
        key, w = kernel(f"mlp-{mt}-kernel", layer)
        yield f"model.layers.{layer}.mlp.{hf}", w, key, every, one
      if run.startswith("attention"):
        yield from _attention_weights(kernel, layer)
    else:
      for mt, hf in (("wi_0", "w1"), ("wi_1", "w3"), ("wo", "w2")):
        key = f"params-decoder-layers-MoeBlock_0-{mt}" if scanned else f"params-decoder-layers_{layer}-MoeBlock_0-{mt}"
        for e in range(EXPERTS):
          w = params[key][e, layer] if scanned else params[key][e]
          yield f"model.layers.{layer}.block_sparse_moe.experts.{e}.{hf}", w, key, every, one


def _attention_weights(kernel: Callable[[str, int], tuple[str, np.ndarray]], layer: int
                       ) -> Iterator[tuple[str, np.ndarray, str, Any, np.float32]]:
  """The attention projections of one layer, as _maxtext_weights yields them. Hugging Face's Llama holds each head's
  query and key rows with RoPE's pairs split into halves (maxtext interleaves them: dims 0, 2, 4, ... then 1, 3, ...)
  and its query times sqrt(head_dim) (maxtext folds 1/sqrt(head_dim) into the query kernel)."""
  for mt, hf in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"), ("out", "o_proj")):
    key, w = kernel(f"self_attention-{mt}-kernel", layer)
    heads, head_dim = (w.shape[1], w.shape[2]) if mt != "out" else w.shape[:2]
    matrix = w.reshape(-1, w.shape[-1]) if mt == "out" else w.reshape(w.shape[0], -1)
    halves = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    rope = (np.arange(heads)[:, None] * head_dim + halves[None, :]).reshape(-1)
    rows = rope if mt in ("query", "key") else slice(None)
    factor = np.float32(np.sqrt(head_dim)) if mt == "query" else np.float32(1)
    yield f"model.layers.{layer}.self_attn.{hf}", matrix, key, rows, factor


def _forward_operand(w: np.ndarray) -> dict[str, np.ndarray]:
  """The training forward's NVFP4 operand of kernel w [in, out] (emulator = TE bit for bit), in HF layout [out, in]."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from MaxText.nvfp4.block_scaled import quantize_block_scaled  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.e2m1 import e2m1_codes  # pylint: disable=import-outside-toplevel
  from MaxText.nvfp4.quantize import dequantize, quantize, tensor_scales  # pylint: disable=import-outside-toplevel

  wb = jnp.asarray(w).astype(jnp.bfloat16)
  t = quantize(wb, "2d")
  values = np.asarray(t.data.astype(jnp.float32)).T
  codes = np.asarray(e2m1_codes(jnp.asarray(values)))
  tiles = np.asarray(t.scale.astype(jnp.float32))[::16]  # [in/16, out/16]: one scale per 16x16 tile
  s_enc, s_dec = (np.float32(s) for s in tensor_scales(t.amax))
  return {"packed": codes[:, 0::2] | (codes[:, 1::2] << 4), "values": values, "scale": np.repeat(tiles, 16, 1).T,
          "s_enc": s_enc, "s_dec": s_dec, "dequantized": np.asarray(dequantize(t)).T,
          "operand": np.asarray(quantize_block_scaled(wb, "2d")[0].astype(jnp.float32)).T}


def _ulps(a: np.ndarray, b: np.ndarray) -> float:
  return float(np.max(np.abs(a - b) / np.spacing(np.abs(b).astype(np.float32))))


def check_weights(export: pathlib.Path, params: dict[str, np.ndarray], run: str, fmt: str, work: pathlib.Path) -> int:
  """Check 1: the format's library reads exactly the forward's operands. Returns how many weights it checked."""
  npz = work / f"{export.name}.npz"
  hf_side("weights", str(export), str(npz))
  got = np.load(npz)
  modules = {k.split("|")[0] for k in got.files}
  expected = list(_maxtext_weights(params, run))
  assert modules == {m for m, *_ in expected}, sorted(modules ^ {m for m, *_ in expected})
  for module, w, _, rows, factor in expected:
    want = {k: v[rows] if isinstance(v, np.ndarray) else v for k, v in _forward_operand(w).items()}
    # maxtext's conversion scales the weight by `factor`: codes and block scales stay, the tensor scale takes it.
    want.update(s_enc=np.float32(want["s_enc"] / factor), s_dec=np.float32(want["s_dec"] * factor),
                dequantized=want["dequantized"] * factor)
    assert np.array_equal(got[f"{module}|packed"], want["packed"]), f"{module}: packed codes differ"
    assert np.array_equal(got[f"{module}|scale"], want["scale"]), f"{module}: block scales differ"
    deq = got[f"{module}|dequantized"]
    if fmt == "compressed-tensors":
      values = got[f"{module}|values"]
      assert np.array_equal(values, want["values"]), f"{module}: unpacked values differ"
      blocks = values.reshape(*values.shape[:-1], -1, 16) * got[f"{module}|scale"][..., None]
      assert np.array_equal(blocks.reshape(values.shape), want["operand"]), f"{module}: not the GEMM's operand"
      assert got[f"{module}|global"].tolist() == [want["s_enc"]], f"{module}: global scale is not 2688/amax"
      bf16 = got[f"{module}|decompressed"]
      assert np.array_equal(bf16, want["dequantized"].astype("bfloat16").astype(np.float32)) or \
          _ulps(bf16, want["dequantized"]) <= 2 ** 16, f"{module}: bf16 decompression differs"
    else:
      assert got[f"{module}|global"].tolist() == want["s_dec"], f"{module}: weight_scale_2 is not amax/2688"
    # The library's dequantization divides by (or multiplies by) the tensor scale where the emulator multiplies by
    # amax/2688: equal up to the last float32 rounding of the scale product.
    off = _ulps(deq, want["dequantized"])
    assert off <= 2, f"{module}: dequantized weight off by {off} ulp"
  return len(expected)


def check_load(export: pathlib.Path, work: pathlib.Path) -> None:
  """transformers' default load (compressed, decompressed on the first forward) finds every tensor it expects and
  uses every tensor in the files, and its logits are finite."""
  out = work / f"{export.name}-load.json"
  hf_side("load", str(export), str(out))
  info = json.loads(out.read_text())
  problems = {k: v for k, v in info.items() if k != "finite" and v}
  assert not problems and info["finite"], f"{export.name}: transformers' load: {problems or 'non-finite logits'}"


def _maxtext_logits(overrides: list[str], params: dict[str, np.ndarray], run: str, tokens: np.ndarray,
                    replace: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
  """maxtext's forward of the checkpoint in float32, unquantized GEMMs, each MLP kernel replaced by `replace` of it."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from maxtext.checkpoint_conversion.utils.utils import load_orbax_checkpoint  # pylint: disable=import-outside-toplevel
  from maxtext.utils import model_creation_utils  # pylint: disable=import-outside-toplevel

  from MaxText.export import source  # pylint: disable=import-outside-toplevel

  config = config_of(overrides, "quantization=", "dtype=float32", "weight_dtype=float32", "matmul_precision=highest")
  checkpoint = source.find_checkpoint(config)
  tree = load_orbax_checkpoint(source.reader_config(config, checkpoint))["params"]["params"]
  if replace is not None:
    for key in dict.fromkeys(key for _, _, key, *_ in _maxtext_weights(params, run)):
      node = tree
      parts = key.removeprefix("params-").split("-")
      for part in parts[:-1]:
        node = node[part]
      kernel = np.asarray(node[parts[-1]])
      fused = key.endswith("-mlp-wi-kernel")  # [in, (layer,) 2, out]: one GEMM of [in, 2 x out]
      one = (lambda m: replace(m.reshape(m.shape[0], -1)).reshape(m.shape)) if fused else replace
      if key.endswith("-kernel") and "-layers-" in key:  # a scanned dense kernel: [in, layer, out]
        node[parts[-1]] = np.moveaxis(_replaced(np.moveaxis(kernel, 1, 0), one, 3 if fused else 2), 0, 1)
      else:
        node[parts[-1]] = _replaced(kernel, one, 3 if fused else 2)
  model = model_creation_utils.from_config(config)
  ids = jnp.asarray(tokens)
  logits = model.apply({"params": tree}, ids, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape),
                       decoder_segment_ids=jnp.ones_like(ids), enable_dropout=False)
  return np.asarray(logits, np.float32)


def _replaced(kernel: np.ndarray, replace: Callable[[np.ndarray], np.ndarray], rank: int = 2) -> np.ndarray:
  """`replace` applied to every [in, out] matrix (`rank` 3: fused [in, 2, out]) of a kernel stacked on its leading
  axes (experts, layers)."""
  if kernel.ndim == rank:
    return replace(kernel)
  return np.stack([_replaced(k, replace, rank) for k in kernel])


def _bf16_dequantized(w: np.ndarray) -> np.ndarray:
  """The NVFP4 weight as transformers holds it after compressed-tensors decompresses it (bf16), in [in, out]."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from MaxText.nvfp4.quantize import dequantize, quantize  # pylint: disable=import-outside-toplevel

  # Only the dequantized weight: the codes, scales and GEMM operand that _forward_operand also builds are not needed.
  return np.asarray(dequantize(quantize(jnp.asarray(w).astype(jnp.bfloat16), "2d"))).astype("bfloat16").astype(np.float32)


def check_logits(export: pathlib.Path, overrides: list[str], params: dict[str, np.ndarray], run: str,
                 work: pathlib.Path, quantized: bool = True) -> float:
  """Check 2: transformers' float32 logits on the export (NVFP4 weights decompressed by the library) equal maxtext's
  forward with each MLP kernel replaced by the same decompressed weight; returns the largest difference."""
  tokens = (np.arange(2 * 64).reshape(2, 64) * 37 + 11) % 256
  np.save(work / "tokens.npy", tokens)
  out = work / f"{export.name}-logits.npy"
  hf_side("logits", str(export), str(work / "tokens.npy"), str(out), *(["--dequantize"] if quantized else []))
  hf = np.load(out)
  ours = _maxtext_logits(overrides, params, run, tokens, _bf16_dequantized if quantized else None)
  diff = float(np.max(np.abs(hf - ours)))
  assert diff <= LOGITS_ATOL, f"{export.name}: transformers' logits differ from maxtext's by {diff}"
  return diff


