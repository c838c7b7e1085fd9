# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The precision policy: GEMM classes from maxtext's kernel axes, precision per class."""

import pytest

from MaxText.precision.policy import GemmClass, Precision, PrecisionPolicy, classify

_AXES = {
    "wi_0/wi_1": (("embed", "mlp"), GemmClass.MLP),
    "fused wi": (("embed", "num_activations", "mlp"), GemmClass.MLP),
    "wo": (("mlp", "embed"), GemmClass.MLP),
    "query": (("embed_attn", "q_heads", "kv"), GemmClass.ATTENTION),
    "key/value": (("embed_attn", "kv_heads", "kv_head_dim"), GemmClass.ATTENTION),
    "qkv": (("embed_attn", "heads", "kv"), GemmClass.ATTENTION),
    "out": (("heads", "kv", "embed_attn"), GemmClass.ATTENTION),
    "qwen3-hybrid out": (("mlp", "embed_attn"), GemmClass.ATTENTION),
    "logits": (("embed_vocab", "vocab"), GemmClass.OTHER),
    "context-parallel axes": ((None, None, None), GemmClass.OTHER),
}


@pytest.mark.parametrize("name", sorted(_AXES))
def test_classify_maxtext_kernel_axes(name):
  axes, want = _AXES[name]
  assert classify(axes) is want


@pytest.mark.parametrize("attention", [Precision.BF16, Precision.FP8])
def test_policy_precision_per_class(attention):
  policy = PrecisionPolicy(attention=attention)
  assert policy.precision_for(("embed", "mlp")) is Precision.NVFP4
  assert policy.precision_for(("heads", "kv", "embed_attn")) is attention
  assert policy.precision_for(("embed_vocab", "vocab")) is Precision.BF16


def test_policy_takes_nvfp4_attention_and_rejects_fp8_mlp():
  """Attention projections in NVFP4 are the opt-in (nvfp4_attention_precision=nvfp4); an FP8 MLP is no choice."""
  policy = PrecisionPolicy(attention=Precision.NVFP4)
  assert policy.precision_for(("embed_attn", "q_heads", "kv")) is Precision.NVFP4
  assert policy.nvfp4_classes == (GemmClass.MLP, GemmClass.ATTENTION)
  assert PrecisionPolicy(mlp=Precision.BF16).nvfp4_classes == ()
  with pytest.raises(ValueError, match="'nvfp4' or 'bf16'"):
    PrecisionPolicy(mlp=Precision.FP8)
