# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The backends layer: the Linen modules and expert GEMMs that run a GEMM in the precision the policy chose.

`table` maps each backend (TransformerEngine, emulated, fused) to what implements it and picks one for the machine
(`auto`: TE on Blackwell, else the emulation; the fused backend is asked for by name), from what `environment` finds
there; `emulated` (the emulated and fused backends: our quantizer, with an f32 dot or a block-scaled GEMM, `te_gemm`
TE's) and `te` are the dense GEMM modules, `experts` the routed-expert GEMMs; `sr` and `flags` are the traced
per-call state they share (stochastic-rounding key, BF16 switch flags). Nothing here patches
maxtext: the integration layer above hands these to maxtext's hooks.
"""
