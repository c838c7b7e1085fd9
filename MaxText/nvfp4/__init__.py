# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""NVFP4 numerics in pure JAX (no maxtext, no flax): quantize, dequantize, the quantized tensor type, and the
statistics of what one quantization loses."""

from MaxText.nvfp4.quantize import Nvfp4Tensor, Scaling, dequantize, quantize
from MaxText.nvfp4.stats import quantization_stats

__all__ = ["Nvfp4Tensor", "Scaling", "dequantize", "quantization_stats", "quantize"]
