# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What the in-training audit does with a mismatch (nvfp4_audit_action): warn in one line, or stop the run.

The counts reach the host as the step's `nvfp4/audit/...` metrics (MaxText.integration.telemetry), in maxtext's
MetricLogger, which writes a step's metrics after that step's checkpoint policy has run (maxtext's
training_loop_iteration saves, evaluates, then writes). `warn` logs one line naming the first mismatch. `stop`
records the finding and raises `AuditMismatch` at the start of the next training-loop iteration, after waiting for
any checkpoint still being written, or when the training loop returns (a mismatch on the last step): the metrics and
the checkpoint of the step are kept, nothing is lost. One module-level finding per process, as maxtext runs one
training loop per process.
"""

from __future__ import annotations

import logging
from typing import Any

from MaxText.integration import telemetry
from MaxText.precision.modes import AuditAction
from MaxText.precision.settings import Settings
from MaxText.precision.taps import AUDIT

__all__ = ["AuditMismatch", "act", "raise_pending"]

_LOG = logging.getLogger(__name__)
_pending: list[str] = []  # the finding a `stop` run ends with, once it may


class AuditMismatch(RuntimeError):
  """TE's quantized operands differed from the plugin's bit-exact quantizer (nvfp4_audit_action=stop)."""


def describe(step: int, counts: dict[str, Any]) -> str | None:
  """One line naming the first mismatching cell (layer order) and how many cells mismatched, or None."""
  found = sorted((name, float(value)) for name, value in counts.items() if float(value) > 0)
  if not found:
    return None
  name, value = found[0]
  what = name.rsplit("/", 1)[1]
  return (f"NVFP4 audit at step {step}: {int(value)} mismatching {what} in {name.rsplit('/', 1)[0]} (and "
          f"{len(found) - 1} more cells): the backend's quantized operands differ from the bit-exact reference; see "
          "docs/blackwell.md")


def act(settings: Settings, step: int, counts: dict[str, Any]) -> None:
  """Warns about, or records to stop on, the audit counts of training step `step` (host side)."""
  line = describe(step, counts)
  if line is None:
    return
  if settings.audit_action is AuditAction.STOP:
    if not _pending:
      _pending.append(line)
    _LOG.error("%s; nvfp4_audit_action=stop: the run ends once the step's checkpoint is written", line)
  else:
    _LOG.warning("%s (nvfp4_audit_action=warn: training goes on)", line)


def raise_pending(checkpoint_manager: Any = None) -> None:
  """Raises AuditMismatch for a recorded `stop` finding, after any checkpoint still being written is done."""
  if not _pending:
    return
  if checkpoint_manager is not None and hasattr(checkpoint_manager, "wait_until_finished"):
    checkpoint_manager.wait_until_finished()
  raise AuditMismatch(_pending.pop())


telemetry.on_written(AUDIT, act)  # every audit step's written counts, on the host
