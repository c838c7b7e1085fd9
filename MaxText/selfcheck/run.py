# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The self-check's two runs: on this node (the checks, with TE where it runs NVFP4), and compile-only for a Blackwell
GPU that is not here. Each returns (rows, facts): the report's rows and the lines that say what ran where."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from MaxText.backends import environment, table
from MaxText.integration.settings import backend_of, settings_of
from MaxText.integration.shapes import gemm_dims
from MaxText.nvfp4.gemm import MATMUL_DIMS, GemmRecipe, nvfp4_dot_general
from MaxText.nvfp4.operands import gemm_operands
from MaxText.precision.modes import Backend
from MaxText.preflight import kernels as kernels_lib
from MaxText.preflight import library
from MaxText.preflight.classify import Math
from MaxText.selfcheck import PROG, checks
from MaxText.selfcheck.candidates import Candidate, Emulator, Fault, Fused, OrderVariant, TransformerEngine

__all__ = ["BadInput", "compile_only", "on_this_node", "shapes_of"]

#: Keys the self-check's configs get unless the run's overrides set them (maxtext wants both; nothing is written).
_DEFAULTS = {"run_name": "selfcheck", "base_output_directory": "/tmp/maxtext-selfcheck"}


class BadInput(ValueError):
  """A config or an option the self-check cannot check (the entry point prints it in one line, exit 2)."""


def _fail(line: str) -> None:
  raise BadInput(line)


def shapes_of(config: Any) -> tuple[list[checks.Shape], Any]:
  """The run's distinct per-device NVFP4 GEMM shapes (train phase: the MLP's, and the attention projections' under
  nvfp4_attention_precision=nvfp4) and its settings; bad input is one line, exit 2."""
  settings = settings_of(config)
  if not settings.nvfp4:
    _fail(f"quantization={settings.quantization or 'none'}: the self-check needs an NVFP4 mode (te_nvfp4 or "
          "te_nvfp4_no_rht)")
  by_shape: dict[tuple[int, int, int], list[str]] = collections.defaultdict(list)
  for d in gemm_dims(config, settings):
    if d.phase == "train":
      by_shape[(d.m, d.k, d.n)].append(d.module)
  if not by_shape:
    _fail(f"nvfp4_mlp_precision=bf16 and nvfp4_attention_precision={settings.attention.value}: no GEMM runs in NVFP4, "
          "so there is nothing to check")
  return [checks.Shape(m, k, n, tuple(modules)) for (m, k, n), modules in by_shape.items()], settings


def _fp4_gemm_runs(found: list[kernels_lib.Kernel]) -> int:
  return sum(k.runs for k in found if k.work.math is Math.FP4_GEMM)


def _step_result(found: list[kernels_lib.Kernel], shapes: Sequence[checks.Shape], settings: Any, where: str
                 ) -> checks.Result:
  """The compiled step has FP4 GEMMs in every NVFP4 layer: per step at least 3 (fprop, dgrad, wgrad) per NVFP4 MLP
  GEMM module per NVFP4 decoder layer (kernels in the layer loop run once per layer)."""
  switches = settings.switches
  nvfp4_layers = sum(not switches.bf16_layer(i) for i in range(switches.num_layers))
  modules = sum(len(s.modules) for s in shapes)
  expected = 3 * modules * nvfp4_layers
  runs = _fp4_gemm_runs(found)
  detail = (f"{runs} FP4 GEMM runs per step in the program compiled {where}; the run's NVFP4 MLP GEMMs need "
            f"{expected} (3 x {modules} GEMMs x {nvfp4_layers} NVFP4 layers)")
  return checks.Result("step", "train step", runs >= expected and runs > 0, detail,
                       {"fp4_gemm_runs": runs, "expected_at_least": expected})


def _speed_gemms(candidate: Candidate, recipe: GemmRecipe, te_imports: bool) -> dict[str, Callable[..., Any]]:
  """Each precision's GEMM y = x W for the speed check: the candidate's NVFP4 (TE's dense, the fused backend's, or the
  emulation), TE's FP8 current scaling where TE imports, and the BF16 GEMM."""
  key = jax.random.key(0)
  if isinstance(candidate, TransformerEngine):
    # pylint: disable-next=import-outside-toplevel  # TE: only where this candidate is chosen
    from MaxText.backends import te_quantize

    nvfp4 = te_quantize.quantizer_set(recipe, key)
    gemms = {"nvfp4": lambda x, w: te_quantize.dense(x, w, nvfp4)}
  else:
    block_gemm = candidate.block_gemm if isinstance(candidate, Fused) else None
    gemms = {"nvfp4": lambda x, w: nvfp4_dot_general(x, w, MATMUL_DIMS, key=key, recipe=recipe,
                                                     block_gemm=block_gemm)}
  if te_imports:
    # pylint: disable-next=import-outside-toplevel  # TE: only where it imports
    from transformer_engine.jax.quantize import QuantizerFactory, ScalingMode

    fp8 = QuantizerFactory.create_set(scaling_mode=ScalingMode.CURRENT_TENSOR_SCALING, fwd_dtype=jnp.float8_e4m3fn,
                                      bwd_dtype=jnp.float8_e5m2)
    from MaxText.backends import te_quantize  # pylint: disable=import-outside-toplevel  # TE, as above

    gemms["fp8"] = lambda x, w: te_quantize.dense(x, w, fp8)
  gemms["bf16"] = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
  return gemms


def _candidate(settings: Any, backend: Backend, te_runs: bool, fault: Fault | None,
               variant: str | None = None) -> Candidate:
  """What this node checks: a fault goes into the emulator, a benign variant replaces it (candidates.VARIANTS); a run
  on the fused backend checks the fused backend (its GEMM is TE's where TE runs NVFP4); otherwise TE's quantizers and
  GEMM where TE runs NVFP4, else the emulator."""
  if fault is not None:
    return Emulator(fault)
  if variant is not None:
    return OrderVariant()
  block_gemm = table.implementation(backend).block_gemm
  if block_gemm is not None:
    return Fused(*block_gemm())  # backend resolved against environment.current(), which the block GEMM's choice reads
  return TransformerEngine(settings.recipe) if te_runs else Emulator()


def on_this_node(config_path: str, overrides: Sequence[str], fault: Fault | None, draws: int, repeats: int,
                 variant: str | None = None) -> tuple[list[checks.Result], list[str]]:
  """Every check on this node's devices: the fused backend where the run uses it, else TE as the candidate where it
  runs NVFP4, else the emulator (a fault always goes into the emulator; a variant, candidates.VARIANTS, replaces
  it)."""
  config = library.load_config(config_path, overrides, prog=PROG, defaults=_DEFAULTS)  # for this node's devices
  shapes, settings = shapes_of(config)
  recipe = settings.recipe
  env = environment.current()
  reason = environment.te_unavailable_reason(env)
  devices = jax.devices()
  te_runs = reason is None and fault is None and variant is None
  candidate = _candidate(settings, backend_of(config, env), te_runs, fault, variant)
  facts = [f"{PROG}: {config_path} {' '.join(overrides)}".rstrip(),
           f"  devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform})",
           f"  candidate: {candidate.name}" + ("" if te_runs else f" (TransformerEngine's NVFP4 not checked here: "
                                               f"{reason or 'a fault was injected into the emulator'})"),
           "  per-device MLP GEMMs (x: M x K, W: K x N): " + "; ".join(
               f"{'/'.join(s.modules)} {s.m}x{s.k}x{s.n}" for s in shapes)]
  rows = checks.quantization(candidate, shapes, recipe, draws=draws)
  rows += checks.gemms(candidate, shapes, recipe)
  if te_runs:
    # pylint: disable-next=import-outside-toplevel  # maxtext's trainer: only where the step compiles for these GPUs
    from MaxText.integration.train_step import traced_train_step

    traced, _ = traced_train_step(config, devices)
    found = kernels_lib.kernels(traced.lower().compile().as_text())
    rows.append(_step_result(found, shapes, settings, f"for these {len(devices)} GPUs"))
  else:
    rows.append(checks.Result("step", "train step", None, f"not run: {reason or 'a fault was injected'}; "
                              f"`python -m {PROG} CONFIG --compile-only --target b200` compiles it for a Blackwell "
                              "GPU here (.venv-gpu)"))
  rows += checks.speed(_speed_gemms(candidate, recipe, env.te_error is None and bool(env.gpu_capabilities)), shapes,
                       repeats=repeats)
  return rows, facts


def compile_only(config_path: str, overrides: Sequence[str], target: str, devices: int
                 ) -> tuple[list[checks.Result], list[str]]:
  """The candidate's quantize and GEMM programs at the run's shapes and the run's train step, compiled by XLA's GPU
  compiler for `devices` `target` GPUs on this machine (the pre-flight's machinery; .venv-gpu, no GPU). The candidate
  is TE's (nvfp4_backend te, or auto) or the fused backend's (our quantizer as XLA fusions, TE's NVFP4 GEMM)."""
  # pylint: disable-next=import-outside-toplevel  # the pre-flight's compile machinery: CUDA jax and TE's modules
  from MaxText.preflight.compile import target_devices

  with environment.answering(library.target_environment(target, devices)):
    config = library.load_config(config_path, overrides, devices)
    shapes, settings = shapes_of(config)
    parts = table.implementation(backend_of(config))
    if not parts.te_kernels and parts.block_gemm is None:
      _fail(f"{config_path}: the run uses neither the TE nor the fused backend on {target} (nvfp4_backend="
            f"{settings.backend.value}); --compile-only compiles their programs (nvfp4_backend=te or fused)")
    (device,) = target_devices(target, 1)
    on = jax.sharding.SingleDeviceSharding(device)
    candidate: Candidate = (TransformerEngine(settings.recipe) if parts.te_kernels
                            else Fused(*parts.block_gemm()))
    rows = []
    for shape in shapes:
      spec = {s: jax.ShapeDtypeStruct(shape.of(s), jnp.bfloat16, sharding=on) for s in ("x", "w", "dy")}
      calls = collections.Counter()
      for operand in gemm_operands(settings.recipe):
        compiled = jax.jit(lambda t, op=operand: candidate.quantize(t, op, jax.random.key(0))).lower(
            spec[operand.source]).compile()
        calls.update(k.kind for k in kernels_lib.kernels(compiled.as_text()) if k.te)
      gemms = jax.jit(lambda x, w, dy: candidate.gemms(x, w, dy, settings.recipe)).lower(
          spec["x"], spec["w"], spec["dy"]).compile()
      fp4 = [k for k in kernels_lib.kernels(gemms.as_text()) if k.work.math is Math.FP4_GEMM]
      # TE's quantizers are TE kernels; the fused backend's are XLA fusions, with no TE kernel at all.
      ok = (bool(calls) if parts.te_kernels else not calls) and len(fp4) == 3
      quantizers = dict(calls) if parts.te_kernels else "our quantizer: XLA fusions, no TE kernel"
      rows.append(checks.Result("compile", f"{shape.m}x{shape.k}x{shape.n}", ok,
                                f"the 5 operands' quantize programs ({quantizers}) and fprop/dgrad/wgrad "
                                f"({len(fp4)} FP4 GEMMs) compiled for {target}", {"te_calls": dict(calls),
                                                                                 "fp4_gemms": len(fp4)}))
    found = kernels_lib.kernels(library.compile_step(config, target, devices, "the run's train step").as_text())
    rows.append(_step_result(found, shapes, settings, f"for {devices} x {target}"))
  facts = [f"{PROG}: {config_path} {' '.join(overrides)} --compile-only --target {target} --devices {devices}",
           "  compiled by XLA's GPU compiler on this machine; nothing ran (no GPU): numerics and speed need the node"]
  return rows, facts
