# Copyright 2026 The NVFP4-for-MaxText Authors. Licensed under the Apache License, Version 2.0.
"""NVFP4 numerics in pure JAX (no maxtext, no flax): quantize, dequantize and the quantized tensor type."""

from MaxText.nvfp4.quantize import Nvfp4Tensor, Scaling, dequantize, quantize

__all__ = ["Nvfp4Tensor", "Scaling", "dequantize", "quantize"]
