# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The export's split of maxtext's fused gate/up kernel (MaxText.export.mapping.split_fused) on kernels built here,
scanned and not: no serving library (tests/export/fused_test.py reads a fused model's export with transformers')."""

from __future__ import annotations

import numpy as np
import pytest

from MaxText.export.mapping import split_fused

KEY = "params-decoder-layers-mlp-wi-kernel"


@pytest.mark.parametrize("shape", [(8, 2, 2, 16), (8, 3, 2, 16), (8, 2, 16)], ids=["scanned_2", "scanned_3", "unscanned"])
def test_the_fused_kernel_splits_on_its_activation_axis_not_the_layer_axis(shape):
  """[embed, (layers,) 2, mlp]: gate (wi_0) is index 0 of the second-to-last axis, up (wi_1) index 1. With 2 layers
  the layer axis has the activation axis's length, so a split along it keeps the shapes and only the values tell:
  red when the layer axis is taken."""
  fused = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  state = {KEY: fused, "params-decoder-layers-mlp-wo-kernel": np.zeros(1)}
  (pair,) = split_fused(state)
  assert (pair.fused, pair.gate, pair.up) == (KEY, "params-decoder-layers-mlp-wi_0-kernel",
                                              "params-decoder-layers-mlp-wi_1-kernel")
  assert KEY not in state and "params-decoder-layers-mlp-wo-kernel" in state
  np.testing.assert_array_equal(np.asarray(state[pair.gate]), fused[..., 0, :])
  np.testing.assert_array_equal(np.asarray(state[pair.up]), fused[..., 1, :])
