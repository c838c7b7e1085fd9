# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""`python -m MaxText.export`: a trained maxtext checkpoint as a Hugging Face model whose MLP weights are the exact
NVFP4 operands the training forward multiplied (compressed-tensors or ModelOpt layout), or unquantized (bf16).

`source` finds and reads the checkpoint, `mapping` names every tensor through maxtext's own conversion tables and
says which ran in NVFP4, `layouts` turns one weight into each format's tensors, `writer` writes the directory.
docs/export.md says what is written and why it is exact.
"""

PROG = "MaxText.export"
