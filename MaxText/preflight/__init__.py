# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Pre-flight: maxtext's train step compiled by XLA's GPU compiler for GPUs this machine does not have.

`python -m MaxText.preflight CONFIG.yml [key=value ...] --target b200|gb300|h100 --devices N` (in `.venv-gpu`, no GPU
needed) reports per-device memory against the target's, the NVFP4 GEMMs and TE kernels in the program, and the
kernels and bytes the plugin adds around TE's. The parts:
  deviceless  importing TransformerEngine without a driver, answering TE's device queries for the target;
  compile     the train step traced as maxtext's trainer builds it and compiled for N described GPUs;
  kernels     the compiled program read as kernels with the bytes each reads and writes.
"""
