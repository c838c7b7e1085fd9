# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).

"""The suite's forked training runs (tests/warm_cli.py) are the CLI's runs: the same losses as a new interpreter's,
bit for bit, with the run's XLA_FLAGS reaching the child. Why a test: most training checks of the suite rest on it."""

from __future__ import annotations

import pathlib

import pytest

from tests import helpers, warm_cli

#: Two simulated devices: XLA reads XLA_FLAGS when the child starts its backend, after the fork.
_ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


@pytest.mark.slow
def test_a_forked_run_is_a_new_interpreters_run(tmp_path: pathlib.Path, jax_cache_dir: pathlib.Path) -> None:
  losses = {}
  for how in ("fresh", "forked"):
    metrics = tmp_path / f"{how}.jsonl"
    args = [str(helpers.TINY_YML.relative_to(helpers.REPO_ROOT)), f"jax_cache_dir={jax_cache_dir}", f"run_name={how}",
            f"base_output_directory={tmp_path}", f"metrics_file={metrics}", "quantization=te_nvfp4", "steps=3",
            "ici_fsdp_parallelism=2"]
    if how == "fresh":
      run = helpers.train_cli(args[2:], jax_cache_dir, env=_ENV, fresh=True)
      code, stderr = run.returncode, run.stderr
    else:
      env = helpers.subprocess_env(_ENV)
      warm_cli.start(helpers.subprocess_env())  # unless a run of this process started it already
      # The devices must travel as a change from the warm process's start (it never starts a backend itself).
      assert warm_cli.start_environment().get("XLA_FLAGS") != env["XLA_FLAGS"]
      code, _, stderr = warm_cli.run("MaxText.train", args, env, helpers.REPO_ROOT, 300)
    assert code == 0, f"{how}: {stderr[-3000:]}"
    assert "Num_devices: 2," in stderr, f"{how}: {stderr[-3000:]}"
    losses[how] = helpers.read_losses(metrics)
  assert len(losses["forked"]) == 3 and losses["forked"] == losses["fresh"], losses
