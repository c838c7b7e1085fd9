# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""maxtext's quant object for the NVFP4 modes: which module each DenseGeneral gets."""

import flax.linen as nn

from MaxText.backends.emulated import Nvfp4DotGeneral
from MaxText.integration.quant import Nvfp4Quantization
from MaxText.precision.modes import Backend
from MaxText.precision.policy import Precision
from tests.helpers import settings


def test_quant_object_routes_by_kernel_axes():
  quant = Nvfp4Quantization(settings=settings(attention=Precision.FP8), backend=Backend.EMULATED)
  assert isinstance(quant.dot_general_cls(mesh_axes=("embed", "mlp"))(), Nvfp4DotGeneral)
  assert quant.dot_general_cls(mesh_axes=("embed_attn", "q_heads", "kv")) is nn.Fp8DirectDotGeneralOp
  assert quant.get_block_size() % 16 == 0 and quant.quant_mode == "train" and quant.needs_apply_rngs
  assert callable(quant.einsum())  # MoE expert einsums (tests/integration/moe_test.py)
