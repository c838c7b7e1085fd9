# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The MLP GEMMs' share of the training FLOPs, checked against the share worked out by hand."""

import pytest

from MaxText.integration import flops
from tests.helpers import REPO_ROOT, TINY_YML

QUICKSTART = REPO_ROOT / "configs" / "quickstart.yml"


def _by_hand(*, layers, emb, mlp, heads, kv_heads, head_dim, seq, vocab):
  """Forward FLOPs per token of a Llama block stack (x3 for training cancels in the share): MLP (gate, up, down),
  q/k/v/o projections, causal attention (half of QK^T and AV), the output projection."""
  mlp_flops = layers * 3 * 2 * emb * mlp
  projections = layers * (2 * emb * (heads + 2 * kv_heads) * head_dim + 2 * emb * heads * head_dim)
  attention = layers * 4 * seq * heads * head_dim / 2
  return mlp_flops / (mlp_flops + projections + attention + 2 * emb * vocab)


@pytest.mark.parametrize(
    "overrides, shape",
    [
        ((), dict(layers=4, emb=128, mlp=512, vocab=1024)),  # the quickstart: 0.632
        (("base_num_decoder_layers=2", "vocab_size=32000"), dict(layers=2, emb=128, mlp=512, vocab=32000)),  # 0.085
    ],
)
def test_share_matches_the_hand_count(load_config, overrides, shape):
  config = load_config(QUICKSTART, "vocab_size=1024", *overrides)
  got = flops.training_flops(config)
  expected = _by_hand(heads=4, kv_heads=4, head_dim=32, seq=128, **shape)
  assert got["mlp_flop_share"] == pytest.approx(expected, rel=1e-12)
  assert got["mlp_tflops_per_device_step"] == pytest.approx(got["mlp_flop_share"] * got["tflops_per_device_step"])


@pytest.mark.parametrize("yml, share", [("quickstart.yml", 0.632), ("study_gpu.yml", 0.696)])
def test_quickstart_and_study_models_spend_most_flops_in_nvfp4_gemms(load_config, yml, share):
  """The bar the quickstart was sized for: a model in which NVFP4 matters (MLP share >= 0.5), on the CPU and on GPU."""
  got = flops.training_flops(load_config(REPO_ROOT / "configs" / yml, "vocab_size=1024"))["mlp_flop_share"]
  assert got >= 0.5 and got == pytest.approx(share, abs=5e-4)


def test_moe_share_counts_the_routed_experts(load_config):
  """A tiny Mixtral: per token and layer, each of the num_experts_per_tok experts runs gate, up and down at the expert
  width (moe_mlp_dim), and the router (emb x num_experts) stays outside the MLP share."""
  config = load_config(TINY_YML, "decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2",
                       "base_moe_mlp_dim=256")
  layers, emb, moe_mlp, k, experts, heads, head_dim, seq, vocab = 2, 64, 256, 2, 4, 4, 16, 64, 256
  mlp_flops = layers * k * 3 * 2 * emb * moe_mlp
  others = (layers * (2 * emb * 3 * heads * head_dim + 2 * emb * heads * head_dim + 4 * seq * heads * head_dim / 2
                      + 2 * emb * experts)
            + 2 * emb * vocab)
  got = flops.training_flops(config)["mlp_flop_share"]
  assert got == pytest.approx(mlp_flops / (mlp_flops + others), rel=1e-12)
  assert got > 0.5  # the expert GEMMs carry most of this model's FLOPs
