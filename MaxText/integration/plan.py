# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The precision plan: what each GEMM of the built model actually runs, written and printed at startup.

A known complaint about NVFP4 elsewhere is that it is silently not used. The plan is read off the model maxtext
built, not off the config: every DenseGeneral (and the MoE router, maxtext's GateLogit) with the dot_general
module it really holds, and every routed-expert weight stack (wi_0/wi_1 or the fused wi, wo) of every RoutedMoE
with the precision its grouped GEMMs run in. It lands in `<base_output_directory>/<run_name>/precision_plan.json`
plus a short table on stdout. A plan that leaves NVFP4 unused where the config asked for it is an error (`check`),
never a table of zeros.
"""

from collections.abc import Iterable
from typing import Any

from etils import epath
from flax import nnx

from MaxText.backends.table import implementation_name
from MaxText.integration import artifacts
from MaxText.integration.quant import Nvfp4Quantization
from MaxText.precision import switches
from MaxText.precision.policy import GemmClass, Precision, classify

PLAN_FILE = artifacts.PLAN_FILE
_reported: set[tuple[str, str]] = set()  # plans already written/printed in this process (maxtext builds models repeatedly)

#: Routed-expert weight stacks of maxtext's RoutedMoE (layers/moe.py): separate gate/up or fused, then down.
_EXPERT_WEIGHTS = (("wi_0", "wi_kernel_axes"), ("wi_1", "wi_kernel_axes"), ("wi", "wi_kernel_axes"),
                   ("wo", "wo_kernel_axes"))


class PlanError(ValueError):
  """The built model would not run the precision the config asked for (e.g. NVFP4 nowhere, or experts in BF16)."""


#: One GEMM of the plan (the model tools read back: MaxText.integration.artifacts).
PlanEntry = artifacts.GemmEntry


def _expert_entries(path: str, node: Any, quant: Nvfp4Quantization) -> list[PlanEntry]:
  """One entry per routed-expert weight stack of a RoutedMoE, with the precision its GEMMs run in.

  `quant.expert_plan()` (precision, implementation) where the quant object implements expert GEMMs; otherwise
  the experts run maxtext's own unquantized matmuls.
  """
  expert_plan = getattr(quant, "expert_plan", None)
  precision, impl = expert_plan() if expert_plan else (Precision.BF16, "maxtext RoutedMoE matmuls (unquantized)")
  entries = []
  for weight, axes_attr in _EXPERT_WEIGHTS:
    if isinstance(getattr(node, weight, None), nnx.Param):
      entries.append(PlanEntry(
          module=f"{path}/{weight}", kernel_axes=tuple(getattr(node, axes_attr)), precision=precision.value,
          backend="-" if precision is Precision.BF16 else quant.backend.value, implementation=impl, kind="experts"))
  return entries


def collect(model: Any) -> tuple[Nvfp4Quantization | None, list[PlanEntry]]:
  """(the NVFP4 quant object, one entry per GEMM holding it); the logits projection holds none.

  GEMMs: every module holding a quant dot_general (DenseGeneral, the MoE router GateLogit) and every
  routed-expert weight stack of a RoutedMoE (their GEMMs are grouped matmuls or einsums, not DenseGenerals).
  """
  quant, entries = None, []
  for path, node in nnx.iter_graph(model):
    node_quant = getattr(node, "quant", None)
    if not isinstance(node_quant, Nvfp4Quantization):
      continue
    name = "/".join(str(p) for p in path)
    if type(node).__name__ == "RoutedMoE":
      quant = node_quant
      entries += _expert_entries(name, node, node_quant)
      continue
    held_name = getattr(node, "_quant_dot_general_name", None)
    if held_name is None or not hasattr(node, "kernel_axes"):
      continue
    quant = node_quant
    axes = tuple(node.kernel_axes)
    precision = quant.policy.precision_for(axes)
    held = type(getattr(node, held_name).to_nnx__module).__name__
    impl = implementation_name(precision, quant.backend)
    entries.append(PlanEntry(
        module=name, kernel_axes=axes, precision=precision.value,
        backend="-" if precision.value == "bf16" else quant.backend.value, implementation=f"{impl} [{held}]",
        kind="router" if type(node).__name__ == "GateLogit" else "dense"))
  return quant, entries


def check(quant: Nvfp4Quantization, entries: list[PlanEntry]) -> None:
  """Raises PlanError where the plan leaves NVFP4 unused although the config asked for it.

  Asked for: the MLP precision is nvfp4 (the recipe), or the attention precision is (the opt-in). Then (a) at
  least one GEMM must be NVFP4, (b) no routed-expert stack may run unquantized unless the quant object says experts
  were opted out (MoE experts are MLPs; training them in BF16 without being told is exactly the silent fallback this
  plan exists to prevent), and (c) with nvfp4_attention_precision=nvfp4 at least one attention projection must be
  NVFP4: a model whose attention maxtext builds without a DenseGeneral of the attention axes that takes the quant
  object would otherwise keep its attention in BF16 unsaid. With nvfp4_mlp_precision=bf16 and attention in BF16 or
  FP8 (the baselines) a plan without NVFP4 is what was asked for.
  """
  if not quant.settings.nvfp4_gemms:
    return
  if quant.policy.attention is Precision.NVFP4 and not any(
      e.precision == "nvfp4" and classify(e.kernel_axes) is GemmClass.ATTENTION for e in entries):
    attention = [e.module for e in entries if classify(e.kernel_axes) is GemmClass.ATTENTION]
    raise PlanError("nvfp4_attention_precision=nvfp4 built no attention projection in NVFP4: "
                    + (f"{', '.join(attention)} stay BF16" if attention else
                       "this model's attention has no DenseGeneral with attention axes that takes the quant object, "
                       "so its projections stay BF16")
                    + ". Use nvfp4_attention_precision=bf16 (or fp8) for this model.")
  if quant.policy.mlp is not Precision.NVFP4:
    return
  experts_opted_out = quant.settings.experts_opted_out
  silent = [e.module for e in entries if e.kind == "experts" and e.precision != "nvfp4" and not experts_opted_out]
  if silent:
    raise PlanError(f"quantization=te_nvfp4 builds routed experts that would train unquantized ({', '.join(silent)})"
                    " although nvfp4_moe_experts=nvfp4. Set nvfp4_moe_experts=bf16 to train them in BF16 knowingly.")
  if not any(e.precision == "nvfp4" for e in entries):
    opted = " and nvfp4_moe_experts=bf16 (experts opted out)" if experts_opted_out else ""
    raise PlanError(f"quantization=te_nvfp4 with nvfp4_mlp_precision=nvfp4{opted} built a model in which no GEMM "
                    f"runs in NVFP4 ({len(entries)} GEMMs, none an MLP DenseGeneral or expert stack). Use a model "
                    "with MLP DenseGenerals or NVFP4 experts, or nvfp4_mlp_precision=bf16 for a BF16 baseline.")


def format_table(entries: Iterable[PlanEntry]) -> str:
  rows = [("module", "kernel axes", "precision", "backend")]
  rows += [(e.module, ",".join(str(a) for a in e.kernel_axes), e.precision, e.backend) for e in entries]
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def report(model: Any, output_dir: str, flops: dict[str, float] | None = None) -> list[PlanEntry]:
  """Checks the plan, then writes PLAN_FILE under output_dir and prints the table, once per distinct plan.

  Does nothing for a model without an NVFP4 quant object. `flops` (MaxText/integration/flops.py: the MLP GEMMs'
  share of the training FLOPs) goes into the file as is, for the comparison report.

  Raises:
    PlanError: see `check`.
  """
  quant, entries = collect(model)
  if quant is None:
    return entries
  check(quant, entries)
  mlp = quant.policy.mlp.value
  # The recipe's switches (its block format is NVFP4 in every run: GemmRecipe refuses another).
  recipe = {name: getattr(quant.policy.recipe, name) for name in artifacts.RecipeRecord.model_fields}
  plan = artifacts.Plan(backend=quant.backend.value, recipe=recipe,
                        switches=quant.settings.switches.describe(),
                        decoder_layers_mlp=switches.layer_precisions(quant.settings.switches, mlp), gemms=entries,
                        flops=flops)
  payload = plan.model_dump_json(indent=2)
  if (output_dir, payload) in _reported:
    return entries
  _reported.add((output_dir, payload))
  path = epath.Path(output_dir) / PLAN_FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(payload + "\n")
  counts = {p: sum(e.precision == p for e in entries) for p in ("nvfp4", "fp8", "bf16")}
  print(f"NVFP4 precision plan ({quant.backend.value} backend; {counts['nvfp4']} nvfp4, {counts['fp8']} fp8, "
        f"{counts['bf16']} bf16 GEMM modules; written to {path}):\n{format_table(entries)}\n"
        f"{switches.summary(quant.settings.switches, mlp, quant.policy.attention.value)}", flush=True)
  return entries
