# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 numerics in pure JAX (no maxtext, no flax): quantize, dequantize and the quantized tensor type."""

from MaxText.nvfp4.quantize import Nvfp4Tensor, Scaling, dequantize, quantize

__all__ = ["Nvfp4Tensor", "Scaling", "dequantize", "quantize"]
