# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The MLP GEMMs' share of the training FLOPs, checked against the share worked out by hand."""

import pytest

from MaxText.integration import flops
from tests.helpers import REPO_ROOT

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
