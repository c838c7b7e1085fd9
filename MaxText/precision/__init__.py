# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The precision layer: which GEMM runs in which precision, and what a config may ask for.

Below it sits only the numerics (`MaxText.nvfp4`); nothing here imports maxtext, flax or a backend. It holds the
mode names and choice enums (`modes`), the plugin's config keys declared once (`keys`), the one settings object read
off a config (`settings`), the per-GEMM policy (`policy`), the BF16 switches as plain data (`switches`), the
registry of periodic measurements of the GEMMs (`taps`, jax-free) and what they compute (`measures`), and the shape
rules checked at config load (`gemm_shapes` for NVFP4's blocks, `te_rules` for what TransformerEngine refuses).
"""
