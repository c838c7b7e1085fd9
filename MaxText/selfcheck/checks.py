# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The self-check's checks, each a list of `Result` rows: quantization bit for bit, the GEMMs, and their speed.

Quantization (per GEMM operand, over the run's shapes and the hard distributions of MaxText.selfcheck.tensors):
  nearest-rounded operands (x for fprop and wgrad, W): codes, E4M3 block scales and the tensor amax equal ours bit for
  bit (MaxText.nvfp4.audit). Stochastically rounded dY (dgrad, wgrad): scales and amax bit for bit; every code one of
  the two E2M1 neighbours of the scaled input; and the deviation of the magnitudes from TE's rule's mean
  (audit.sr_moments), summed over `draws` draws of every test tensor, divided by its standard deviation within
  +-Z_BOUND (3.29): the two-sided SR_CONFIDENCE (99.9%) interval of a standard normal (a sum of many independent
  draws), one test per operand. Its power is in docs/blackwell.md (a bias of 1/64 of a grid step fails at the
  default draws with >= 99% probability; scripts/selfcheck_power.py measures it).
GEMMs (stochastic rounding off, so the operands are the same): fprop, dgrad and wgrad against the float64 products of
  the dequantized operands. Tolerance per element: gamma_K * (|A| |B|)_ij + eps_out * |ref_ij|, with
  gamma_K = K u / (1 - K u), u = 2**-24: the bound on a float32 sum of K products in any order (Higham, Accuracy and
  Stability of Numerical Algorithms, 2nd ed., (3.5)); the products of E2M1 x E4M3 values are exact in float32;
  eps_out = 2**-8 for a bf16 output (half an ulp), 2**-24 for float32; plus 2 u |ref| for alpha's two roundings.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.nvfp4 import audit
from MaxText.nvfp4.e2m1 import e2m1_values
from MaxText.nvfp4.formats import BlockFormat
from MaxText.nvfp4.gemm import GemmRecipe
from MaxText.nvfp4.operands import Operand, gemm_operands
from MaxText.nvfp4.quantize import Scaling
from MaxText.selfcheck import tensors
from MaxText.selfcheck.candidates import Candidate

__all__ = ["Result", "Shape", "gemms", "quantization", "speed"]

#: The confidence of the stochastic-rounding mean test: an unbiased quantizer fails it with probability 1 - this.
SR_CONFIDENCE = 0.999
#: The bound on stochastic rounding's standardized mean deviation: the standard normal's two-sided SR_CONFIDENCE
#: quantile (3.2905 at 99.9%), derived from the confidence so the two cannot disagree.
Z_BOUND = statistics.NormalDist().inv_cdf(1 - (1 - SR_CONFIDENCE) / 2)
_U = 2.0**-24


@dataclasses.dataclass(frozen=True)
class Shape:
  """One GEMM y = x W of the run, per device: x (m, k), W (k, n), dY (m, n); `modules` names the run's NVFP4 GEMMs of
  that shape (MLP, and attention projections under nvfp4_attention_precision=nvfp4)."""

  m: int
  k: int
  n: int
  modules: tuple[str, ...]

  def of(self, source: str) -> tuple[int, int]:
    return {"x": (self.m, self.k), "w": (self.k, self.n), "dy": (self.m, self.n)}[source]


@dataclasses.dataclass
class Result:
  """One row of the report: a check of one thing (an operand, a GEMM, a speed) with what was found."""

  check: str
  subject: str
  ok: bool | None  # None: measured, nothing to hold (speed), or could not run (reason in detail)
  detail: str
  values: dict[str, Any] = dataclasses.field(default_factory=dict)


def _first(mask: np.ndarray) -> tuple[int, ...] | None:
  where = np.argwhere(mask)
  return tuple(int(i) for i in where[0]) if len(where) else None


def _values(codes: np.ndarray) -> np.ndarray:
  """The E2M1 values of codes (sign in bit 3) as a NumPy float32 array, so the float64 sums they enter stay float64
  (a jax array would pull them down to float32)."""
  return np.asarray(e2m1_values(codes))


def _operand_result(operand: Operand, cases: list[dict[str, Any]], draws: int) -> Result:
  """One operand's row from its cases (one per shape and distribution)."""
  codes = sum(c["codes"] for c in cases)
  scales = sum(c["scales"] for c in cases)
  amax = sum(c["amax"] for c in cases)
  values: dict[str, Any] = {"mismatched_codes": codes, "mismatched_scales": scales, "mismatched_amax": amax,
                            "cases": len(cases)}
  parts = []
  first = next((c["first"] for c in cases if c.get("first")), None)
  if operand.stochastic:
    variance = sum(c["variance"] for c in cases)
    z = sum(c["deviation"] for c in cases) / math.sqrt(variance) if variance > 0 else 0.0
    values.update(z=z, draws=draws)
    biased = abs(z) > Z_BOUND
    parts.append(f"codes outside the two E2M1 neighbours {codes}, scales {scales}, amax {amax}; mean deviation of the "
                 f"magnitudes over {draws} draws x {len(cases)} tensors: z = {z:+.2f} (|z| <= {Z_BOUND:.2f} at "
                 f"{SR_CONFIDENCE:.1%})")
    ok = not (codes or scales or amax or biased)
  else:
    parts.append(f"mismatching codes {codes}, scales {scales}, amax {amax}")
    ok = not (codes or scales or amax)
  if _order_matters(operand):  # the count a node where they are many makes visible
    values["accepted_order_differences"] = accepted = sum(c["accepted"] for c in cases)
    parts.append(f"{accepted} order-dependent differences accepted")
  if first:
    parts.append(f"first: {first}")
    values["first"] = first
  return Result("quantization", operand.name, ok, "; ".join(parts), values)


#: Our quantization of an operand (audit.encode), compiled once per operand and shape: op by op, each of its
#: operations would compile a program of its own, which is most of a check's time on a CPU.
_encode = jax.jit(audit.encode, static_argnums=1)


def quantization(candidate: Candidate, shapes: Sequence[Shape], recipe: GemmRecipe, draws: int = 16,
                 seed: int = 0) -> list[Result]:
  """The candidate's quantization of every operand against ours (module docstring), one row per operand."""
  quantize = jax.jit(candidate.quantize, static_argnums=1)
  rows = []
  draws_key = jax.random.key(seed)
  for o, operand in enumerate(gemm_operands(recipe)):
    cases = []
    for s, shape in enumerate(shapes):
      for d, distribution in enumerate(tensors.DISTRIBUTIONS):
        tensor = tensors.tensor(shape.of(operand.source), distribution, seed * 101 + d)
        ours = jax.tree.map(np.asarray, _encode(tensor, operand))
        case = f"{distribution} {shape.of(operand.source)}"
        # Independent draws in every tensor: the operand's z sums their deviations.
        key = jax.random.fold_in(draws_key, (o * len(shapes) + s) * len(tensors.DISTRIBUTIONS) + d)
        cases.append(_case(operand, ours, lambda k, t=tensor: quantize(t, operand, k), draws, case, key,
                           tensor if _order_matters(operand) else None))
    rows.append(_operand_result(operand, cases, draws))
  return rows


def _order_matters(operand: Operand) -> bool:
  """Whether the operand is held order-aware (audit.order_aware): the RHT'd ones, whose bf16 values another float32
  summation order of the transform can round the other way."""
  return operand.rht and operand.scaling is Scaling.ONE_D


#: The order-aware comparison, compiled once per operand and shape (as `_encode`).
_order_aware = jax.jit(audit.order_aware, static_argnums=(1, 5))


def _case(operand: Operand, ours: audit.Encoded, quantize: Callable[[jax.Array], Any], draws: int, case: str,
          key: jax.Array, tensor: jax.Array | None = None) -> dict[str, Any]:
  """Counts of one tensor's mismatches, the first one described, and for SR the summed deviation of the magnitudes
  from the rule's mean with its variance (their ratio over all of an operand's tensors is its z). With `tensor`
  (an RHT'd operand's), differences another summation order of the transform explains are accepted and counted
  apart (`accepted`), and only the rest are mismatches."""
  found = {"codes": 0, "scales": 0, "amax": 0, "accepted": 0, "case": case, "first": None}
  deviation, variance = 0.0, 0.0
  if operand.stochastic:  # the rule's mean and variance per element, the same for every draw
    mean, var = (np.asarray(a, np.float64) for a in audit.sr_moments(jnp.asarray(ours.scaled)))
    finite = np.isfinite(ours.scaled)
    # Folded by the input's sign: the rule rounds magnitudes, so a bias (e.g. away from zero) keeps its sign.
    sign = np.where(np.signbit(ours.scaled), -1.0, 1.0)
  for draw in range(draws if operand.stochastic else 1):
    codes, scales, amax = (np.asarray(a) for a in quantize(jax.random.fold_in(key, draw)))
    if tensor is not None:
      verdict = jax.tree.map(np.asarray, _order_aware(tensor, operand, codes, scales, amax, False))
      bad_scales, bad_codes = ~verdict.scales_ok, ~verdict.codes_ok
      found["amax"] += int(~verdict.amax_ok)
      found["accepted"] += int(np.asarray(verdict.counts())[3:].sum())
    else:
      bad_scales = scales != ours.scales
      found["amax"] += int(np.asarray(amax, np.float32).view(np.uint32) != np.asarray(ours.amax).view(np.uint32))
    found["scales"] += int(bad_scales.sum())
    if operand.stochastic:
      deviation += float(np.sum(np.where(finite, sign * (_values(codes) - mean), 0.0)))
      variance += float(np.sum(np.where(finite, var, 0.0)))
      if tensor is None:
        bad_codes = ~np.asarray(audit.neighbours(jnp.asarray(codes), jnp.asarray(ours.scaled)))
    elif tensor is None:
      bad_codes = codes != ours.codes
    found["codes"] += int(bad_codes.sum())
    if found["first"] is None:
      if (at := _first(bad_codes)) is not None:
        found["first"] = (f"{case}, code at {at}: ours {_values(ours.codes[at])} (scaled input "
                          f"{float(ours.scaled[at]):.4g}), theirs {_values(codes[at])}")
      elif (at := _first(bad_scales)) is not None:
        found["first"] = f"{case}, block scale at {at}: ours 0x{int(ours.scales[at]):02x}, theirs 0x{int(scales[at]):02x}"
      elif found["amax"]:
        found["first"] = f"{case}, amax: ours {float(ours.amax)!r}, theirs {float(amax)!r}"
  found["deviation"], found["variance"] = deviation, variance
  return found


def _dequantized(encoded: audit.Encoded, fmt: BlockFormat) -> np.ndarray:
  """float64 values of an operand in its blocked orientation: e2m1 * e4m3 scale * amax / 2688."""
  scale_values = np.asarray(encoded.scales).view(fmt.scale_dtype).astype(np.float64)
  per_element = np.repeat(scale_values, fmt.block_size, axis=-1)
  return _values(np.asarray(encoded.codes)) * per_element * (float(encoded.amax) / float(fmt.tensor_scale_range))


def gemms(candidate: Candidate, shapes: Sequence[Shape], recipe: GemmRecipe, seed: int = 0) -> list[Result]:
  """fprop, dgrad and wgrad of the candidate against float64 products of the dequantized operands (module
  docstring: the tolerance), stochastic rounding off, on the normal distribution at each shape."""
  recipe = dataclasses.replace(recipe, stochastic_rounding=False)
  operands = {o.name: dataclasses.replace(o, stochastic=False) for o in gemm_operands(recipe)}
  rows = []
  for shape in shapes:
    x = tensors.tensor(shape.of("x"), "normal", seed)
    w = tensors.tensor(shape.of("w"), "normal", seed + 1)
    dy = tensors.tensor(shape.of("dy"), "normal", seed + 2)
    got = jax.jit(lambda a, b, c: candidate.gemms(a, b, c, recipe))(x, w, dy)
    q = {name: _dequantized(_encode({"x": x, "w": w, "dy": dy}[op.source], op), recipe.format)
         for name, op in operands.items()}
    w_kn = q["fprop_w"] if recipe.weight_2d else q["fprop_w"].T  # a 1D W is blocked along K: (n, k) -> (k, n)
    references = {"fprop": (q["fprop_x"], w_kn, shape.k), "dgrad": (q["dgrad_dy"], w_kn.T, shape.n),
                  "wgrad": (q["wgrad_x"], q["wgrad_dy"].T, shape.m)}
    for (name, (a, b, k)), out in zip(references.items(), got):
      rows.append(_gemm_result(name, shape, np.asarray(out, np.float64), a, b, k, out.dtype))
  return rows


def _gemm_result(name: str, shape: Shape, out: np.ndarray, a: np.ndarray, b: np.ndarray, k: int,
                 dtype: Any) -> Result:
  reference = a @ b
  gamma = k * _U / (1 - k * _U)
  eps_out = 2.0**-8 if jnp.dtype(dtype) == jnp.bfloat16 else _U
  tolerance = gamma * (np.abs(a) @ np.abs(b)) + (eps_out + 2 * _U) * np.abs(reference)
  excess = np.abs(out - reference) - tolerance
  bad = excess > 0
  ratio = float(np.max(np.abs(out - reference) / np.maximum(tolerance, np.finfo(np.float64).tiny)))
  detail = f"{int(bad.sum())} of {out.size} outside the f32-accumulation bound (worst |err| / bound {ratio:.3f})"
  if bad.any():
    at = _first(bad)
    detail += f"; first at {at}: got {out[at]:.6g}, float64 reference {reference[at]:.6g}"
  return Result("gemm", f"{name} {shape.m}x{shape.k}x{shape.n}", not bad.any(), detail,
                {"outside": int(bad.sum()), "worst_error_over_bound": ratio})


def time_median(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> float:
  """Median wall seconds of `fn()` (blocked until ready) over `repeats` runs after `warmup` runs."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def speed(gemms_by_precision: dict[str, Callable[..., Any]], shapes: Sequence[Shape], repeats: int = 5,
          seed: int = 0) -> list[Result]:
  """TFLOP/s of forward + backward (6 m k n flops) of each precision's GEMM at each shape, median of `repeats`."""
  rows = []
  for shape in shapes:
    x = tensors.tensor(shape.of("x"), "normal", seed)
    w = tensors.tensor(shape.of("w"), "normal", seed + 1)
    tflops = {}
    for precision, gemm in gemms_by_precision.items():
      step = jax.jit(jax.grad(lambda a, b, f=gemm: jnp.sum(f(a, b).astype(jnp.float32)), argnums=(0, 1)))
      seconds = time_median(lambda s=step: s(x, w), repeats)
      tflops[precision] = 6 * shape.m * shape.k * shape.n / seconds / 1e12
    base = {p: tflops["nvfp4"] / tflops[p] for p in tflops if p != "nvfp4"} if "nvfp4" in tflops else {}
    detail = ", ".join(f"{p} {v:.3f} TFLOP/s" for p, v in tflops.items())
    if base:
      detail += "; nvfp4 / " + ", nvfp4 / ".join(f"{p} {r:.2f}x" for p, r in base.items())
    rows.append(Result("speed", f"{shape.m}x{shape.k}x{shape.n}", None, detail,
                       {"tflops": tflops, "nvfp4_ratios": base, "repeats": repeats}))
  return rows
