# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The programs a step-time prediction can compare the run with: maxtext's FP8, BF16, and upstream maxtext's
te_nvfp4 (every GEMM in NVFP4), each one change to the run's own config; and `--predict-against`'s parse.

Why a module of its own, apart from the prediction loop (MaxText.preflight.programs): the command line checks
`--target` and `--predict-against` before it imports maxtext, jax or TransformerEngine (seconds), so a mistyped
name is said at once. Nothing here imports them; `Comparison.context` imports maxtext's hooks when it is entered.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import ContextManager

from MaxText.preflight.targets import Target

__all__ = ["COMPARISONS", "Comparison", "against"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
  """One program compared with the run: the overrides that make it from the run's config, whether it is compiled
  with maxtext's own quantization for every mode (MaxText.integration.hooks.maxtext_quantization), what it is."""

  name: str
  overrides: tuple[str, ...]
  upstream: bool = False
  what: str

  def context(self) -> ContextManager[None]:
    """The block its config is loaded and compiled in."""
    from MaxText.integration import hooks  # pylint: disable=import-outside-toplevel  # maxtext: only when compiled

    return hooks.maxtext_quantization() if self.upstream else contextlib.nullcontext()


COMPARISONS: dict[str, Comparison] = {c.name: c for c in (
    Comparison(name="fp8", overrides=("quantization=fp8",),
               what="maxtext's fp8 (XLA's FP8 GEMMs for every dense layer), the published baseline"),
    Comparison(name="bf16", overrides=("quantization=",), what="no quantization: every GEMM in BF16"),
    Comparison(name="nvfp4_all", overrides=("quantization=te_nvfp4",), upstream=True,
               what="upstream maxtext's te_nvfp4: every dense GEMM (attention projections too) NVFP4 through TE"),
)}


def against(text: str | None, target: Target) -> tuple[str, ...]:
  """The comparisons named in `--predict-against` ("fp8,bf16"), in order, each once; None: every comparison that
  can run on `target` (nvfp4_all needs FP4 tensor cores).

  Raises:
    ValueError: a name that is not a comparison (the message lists the valid ones), or nvfp4_all for a GPU without
      FP4 tensor cores.
  """
  if text is None:
    return tuple(name for name, c in COMPARISONS.items() if not c.upstream or target.peaks.fp4 is not None)
  names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
  unknown = [name for name in names if name not in COMPARISONS]
  if unknown or not names:
    raise ValueError(f"--predict-against {text!r}: {', '.join(map(repr, unknown)) or 'nothing'} is not a program "
                     f"to compare with; valid: {', '.join(COMPARISONS)} (comma-separated)")
  if target.peaks.fp4 is None and any(COMPARISONS[name].upstream for name in names):
    raise ValueError(f"--predict-against nvfp4_all: the {target.name} has no FP4 tensor cores to run it on")
  return names
