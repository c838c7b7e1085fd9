# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""What a training run records in its run directory, and what it says when a resume changes precision.

Why: maxtext resumes a checkpoint under another `quantization` (or other nvfp4_* keys) without a word, filling
the state leaves the checkpoint lacks from a fresh init. That resume is useful (the recipe's late switch to BF16
relies on it) but must never be silent. Each training run under an NVFP4 mode writes `nvfp4_run.json` (the
quantization and the nvfp4_* keys it ran with) into `<base_output_directory>/<run_name>/`; a run that finds a
checkpoint and a different record there logs one line naming old and new and what was re-initialized, and
appends it to `precision_changes.jsonl` beside the record (so a resume from te_nvfp4 to fp8 is reported too). A
run that neither uses an NVFP4 mode nor resumes one writes nothing of ours (its output directory may be
read-only, as maxtext allows).

`training_run()` also tells the rest of the plugin that a training run (maxtext's `train_loop`) is under way, so
the precision plan is written by training runs only, not by abstract builds, tools or tests.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
from collections.abc import Iterator
from typing import Any

from etils import epath

from MaxText.integration import artifacts, audit
from MaxText.integration.run_keys import maxtext_keys
from MaxText.integration.settings import settings_of
from MaxText.precision.modes import NVFP4_MODES
from MaxText.precision.taps import TAPS, Tap

_LOG = logging.getLogger(__name__)
RECORD_FILE = artifacts.RECORD_FILE
CHANGES_FILE = artifacts.CHANGES_FILE

_run_dir: contextvars.ContextVar[str | None] = contextvars.ContextVar("nvfp4_training_run", default=None)


def run_dir(config: Any) -> str:
  return f"{config.base_output_directory}/{config.run_name}"


def current_training_run() -> str | None:
  """The run directory of the maxtext training loop under way in this context, or None outside one."""
  return _run_dir.get()


def _reinitialized(old: str, new: str, started: tuple[Tap, ...] = ()) -> str:
  """What maxtext fills from a fresh init when a checkpoint written under `old` resumes under `new`, with the taps
  `started` on now and off then."""
  parts = []
  if started:
    variables = ", ".join(v for tap in started for v in tap.variables)
    whats = " and ".join(tap.what for tap in started)
    parts.append(f"the per-GEMM tap variables ({variables}) start at zero until the next step of {whats}")
  if new in NVFP4_MODES and old not in NVFP4_MODES:
    parts.append("the NVFP4 stochastic-rounding counters (nvfp4_sr_count) and layer indices start fresh")
  if new.startswith("fp8") and not old.startswith("fp8"):
    parts.append("the fp8 scale and amax-history state starts fresh")
  if not parts:
    parts.append("no model state: the checkpoint has every leaf this mode uses")
  return "; ".join(parts)


def _started(before: dict[str, Any], now: dict[str, Any]) -> tuple[Tap, ...]:
  """The taps (MaxText.precision.taps) on in record `now` and off in record `before`: their variables are new."""
  return tuple(tap for tap in TAPS if int(now.get(tap.key) or 0) and not int(before.get(tap.key) or 0))


def _has_checkpoint(directory: epath.Path) -> bool:
  checkpoints = directory / "checkpoints"
  return checkpoints.exists() and any(p.name.isdigit() for p in checkpoints.iterdir())


def _change(before: dict[str, Any], now: dict[str, Any], changed: dict[str, Any], **more: Any) -> dict[str, Any]:
  """One entry of precision_changes.jsonl: when, what changed (`changed`, from record `before` to `now`), `more`,
  and what starts fresh."""
  old_mode, new_mode = str(before.get("quantization") or ""), str(now["quantization"] or "")
  return {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **more,
          "changed": changed, "reinitialized": _reinitialized(old_mode, new_mode, _started(before, now))}


def _append(directory: epath.Path, change: dict[str, Any]) -> None:
  """Appends `change` to the run directory's precision_changes.jsonl."""
  directory.mkdir(parents=True, exist_ok=True)
  with (directory / CHANGES_FILE).open("a") as f:
    f.write(json.dumps(change) + "\n")


def note_resume(config: Any) -> dict[str, Any] | None:
  """Compares this run's settings with the run directory's record; logs and records a change. Returns the change."""
  directory = epath.Path(run_dir(config))
  settings = settings_of(config)
  now = artifacts.RunRecord.model_validate(dict(settings.record)).model_dump(mode="json")
  record = directory / RECORD_FILE
  recorded = record.exists()
  change = None
  if not settings.nvfp4 and not recorded:  # neither an NVFP4 run nor the resume of one: nothing of ours
    return None
  if recorded and _has_checkpoint(directory):
    before = json.loads(record.read_text())  # as written, whatever its version: compared key by key, not validated
    changed = {k: {"old": before.get(k), "new": v} for k, v in now.items() if before.get(k) != v}
    changed.update({k: {"old": v, "new": None} for k, v in before.items() if k not in now})
    if changed:
      change = _change(before, now, changed)
      keys = ", ".join(f"{k}: {v['old']!r} -> {v['new']!r}" for k, v in changed.items())
      _LOG.warning("NVFP4: resuming %s with changed precision settings (%s); %s. Recorded in %s", directory, keys,
                   change["reinitialized"], directory / CHANGES_FILE)
      _append(directory, change)
  directory.mkdir(parents=True, exist_ok=True)
  record.write_text(json.dumps(now, indent=2) + "\n")
  return change


def source_run_dir(checkpoint: str) -> epath.Path:
  """The run directory of a checkpoint path in maxtext's layout, `<run>/checkpoints/<step>[/items]`."""
  path = epath.Path(checkpoint.rstrip("/"))
  if path.name == "items":
    path = path.parent
  return path.parent.parent


def note_full_state_load(config: Any) -> dict[str, Any] | None:
  """`load_full_state_path` into an NVFP4 run from a checkpoint of other precision settings: one line, and the change
  recorded in this run's `precision_changes.jsonl` (never in the source run's directory).

  maxtext's full-state load fills the state leaves the checkpoint lacks from a fresh init, as a resume does; the
  source's settings are read from the record its run wrote (`nvfp4_run.json`), and a run without one (bf16, fp8)
  had no NVFP4 settings. A load that is not from a local maxtext run directory is not compared.
  """
  path = maxtext_keys(config).load_full_state_path
  settings = settings_of(config)
  if not path or not settings.nvfp4 or "://" in path:
    return None
  source = source_run_dir(path)
  record = source / RECORD_FILE
  before = json.loads(record.read_text()) if record.exists() else {"quantization": None}
  now = artifacts.RunRecord.model_validate(dict(settings.record)).model_dump(mode="json")
  changed = {k: {"old": before.get(k), "new": v} for k, v in now.items() if before.get(k) != v}
  if not changed:
    return None
  change = _change(before, now, changed, source=path)
  old_mode = before.get("quantization") or ""
  what = f"a {old_mode} run" if record.exists() else f"a run without {RECORD_FILE} (not an NVFP4 run)"
  keys = ", ".join(f"{k}: {v['old']!r} -> {v['new']!r}" for k, v in changed.items() if k == "quantization"
                   or record.exists())
  directory = epath.Path(run_dir(config))
  _LOG.warning("NVFP4: load_full_state_path=%s is the state of %s, loaded with changed precision settings (%s); %s. "
               "Recorded in %s", path, what, keys, change["reinitialized"], directory / CHANGES_FILE)
  _append(directory, change)
  return change


@contextlib.contextmanager
def training_run(config: Any) -> Iterator[None]:
  """Marks a maxtext training loop under way (the plan is written only then) after checking its resume record and
  the precision of a full state it loads."""
  note_resume(config)
  if not _has_checkpoint(epath.Path(run_dir(config))):  # maxtext loads load_full_state_path only into a new run
    note_full_state_load(config)
  token = _run_dir.set(run_dir(config))
  try:
    yield
  finally:
    _run_dir.reset(token)
  audit.raise_pending()  # nvfp4_audit_action=stop on the last step: the loop has returned, its checkpoints are written
