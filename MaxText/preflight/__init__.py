# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Pre-flight: maxtext's train step compiled by XLA's GPU compiler for GPUs this machine does not have.

`python -m MaxText.preflight CONFIG.yml [key=value ...] --target b200|gb300|h100 --devices N` (in `.venv-gpu`, no GPU
needed) reports per-device memory against the target's, the NVFP4 GEMMs and TE kernels in the program, and the
kernels and bytes the plugin adds around TE's. The parts:
  targets     the GPUs described for XLA's GPU compiler, with their datasheet peaks;
  deviceless  importing TransformerEngine without a driver, answering TE's device queries for the target;
  compile     the train step traced as maxtext's trainer builds it and compiled for N described GPUs;
  library     what the command line, the self-check and the scripts share: a run's config, the target's
              environment, the step compiled for it, whether the run is NVFP4 on TE;
  kernels     the compiled program read as kernels with the bytes each reads and writes;
  sass        the machine code of each kernel (ptxas's cubins, disassembled) and the threads XLA launches it with;
  comparisons the programs a prediction can compare with (maxtext's fp8, bf16, upstream te_nvfp4); no maxtext, no jax;
  programs    the taps a pre-flight compiles the run without, and the prediction loop;
  run         one pre-flight: the programs it compiles and the report's lines and JSON (`__main__` parses and prints).
"""

#: The command line's name, in its messages (the scripts' and the self-check's compile errors too) and as argv[0] of
#: the configs it loads.
PROG = "MaxText.preflight"
