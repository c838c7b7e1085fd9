# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The precision policy: which GEMM runs in which precision, decided from the kernel's logical axes.

NVIDIA's recipe puts only the MLP (feed-forward) GEMMs in NVFP4; attention projections stay BF16 (or FP8, or
NVFP4 when the user opts in), and everything else (embeddings, logits, norms, the attention core) is not a
DenseGeneral GEMM that gets a quant object at all. The rules are an ordered tuple, first match wins, so a kernel
carrying both attention and MLP axes (qwen3-hybrid's out projection: ("mlp", "embed_attn")) is attention. No maxtext
import here.
"""

import dataclasses
import enum

from MaxText.nvfp4.gemm import GemmRecipe


class GemmClass(str, enum.Enum):
  MLP = "mlp"
  ATTENTION = "attention"
  OTHER = "other"


class Precision(str, enum.Enum):
  NVFP4 = "nvfp4"
  FP8 = "fp8"
  BF16 = "bf16"  # the model's compute dtype, unquantized (named bf16 as in the recipe; it is cfg.dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AxesRule:
  """A kernel whose logical axes contain any of `any_of` belongs to `gemm_class`."""

  any_of: frozenset[str]
  gemm_class: GemmClass


#: Kernel logical axes of maxtext 0.2.5 (docs/backends.md#what-the-integration-relies-on-in-maxtext): attention
#: query ("embed_attn","q_heads","kv"), key/value ("embed_attn","kv_heads","kv_head_dim"), qkv
#: ("embed_attn","heads","kv"), out ("heads","kv","embed_attn"); MLP wi/wi_0/wi_1 ("embed","mlp"), fused
#: ("embed","num_activations","mlp"), wo ("mlp","embed").
RULES: tuple[AxesRule, ...] = (
    AxesRule(any_of=frozenset({"embed_attn", "q_heads", "kv_heads", "heads", "kv", "kv_head_dim"}),
             gemm_class=GemmClass.ATTENTION),
    AxesRule(any_of=frozenset({"mlp"}), gemm_class=GemmClass.MLP),
)


def classify(kernel_axes: tuple[str | None, ...]) -> GemmClass:
  """The GemmClass of a DenseGeneral from its kernel's logical axes (first matching rule)."""
  axes = {a for a in kernel_axes if a}
  for rule in RULES:
    if axes & rule.any_of:
      return rule.gemm_class
  return GemmClass.OTHER


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionPolicy:
  """Precision per GEMM class plus the NVFP4 recipe switches; hashable, so Linen modules can hold it."""

  mlp: Precision = Precision.NVFP4
  attention: Precision = Precision.BF16
  recipe: GemmRecipe = GemmRecipe()

  def __post_init__(self):
    if self.mlp not in (Precision.NVFP4, Precision.BF16):
      raise ValueError(f"PrecisionPolicy: mlp={self.mlp.value!r}; the MLP GEMMs run in 'nvfp4' or 'bf16'.")
    if self.attention not in (Precision.BF16, Precision.FP8, Precision.NVFP4):
      raise ValueError(f"PrecisionPolicy: attention={self.attention.value!r}; attention runs in 'bf16', 'fp8' or "
                       "'nvfp4'.")

  @property
  def nvfp4_classes(self) -> tuple[GemmClass, ...]:
    """The GEMM classes that run in NVFP4 (empty for an all-BF16 baseline)."""
    return tuple(c for c, p in ((GemmClass.MLP, self.mlp), (GemmClass.ATTENTION, self.attention))
                 if p is Precision.NVFP4)

  def precision_for(self, kernel_axes: tuple[str | None, ...]) -> Precision:
    gemm_class = classify(kernel_axes)
    if gemm_class is GemmClass.MLP:
      return self.mlp
    if gemm_class is GemmClass.ATTENTION:
      return self.attention
    return Precision.BF16
