# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The self-check: `python -m MaxText.selfcheck CONFIG.yml [key=value ...]` holds the node's NVFP4 quantizer and GEMMs
(TransformerEngine's on Blackwell) against the plugin's bit-exact emulator at the run's own shapes.

  tensors     the test tensors: the run's per-device GEMM shapes, with hard distributions;
  candidates  the quantizer under test: TE's (on Blackwell), else the emulator, with the faults `--with-fault` injects;
  checks      quantization bit for bit (stochastic rounding by its definition), GEMMs within f32-accumulation bounds,
              the compiled step's FP4 GEMMs, and the speed of NVFP4, FP8 and BF16 GEMMs.
"""

#: The command line's name, in its messages and as argv[0] of the config it loads.
PROG = "MaxText.selfcheck"
