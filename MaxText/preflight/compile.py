# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""maxtext's train step (traced as its trainer builds it: MaxText.integration.train_step) compiled by XLA's GPU
compiler for N described GPUs.

Why not maxtext's own `train_compile`: for GPUs it compiles for the GPUs the machine has (it needs them); here the
devices come from `jax.experimental.topologies.get_topology_desc("", "cuda", target_config=...)`, compile-only
devices of a GPU described in MaxText.preflight.targets. Needs the CUDA jax plugin (`.venv-gpu`); no driver, no GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import topologies

from MaxText.integration.train_step import traced_train_step
from MaxText.preflight.targets import TARGETS


def hosts_and_devices(target: str, count: int) -> tuple[int, int]:
  """(hosts, GPUs per host) for `count` GPUs of `target`: whole nodes of 4 (Grace-Blackwell: GB200/GB300) or 8
  (HGX: B200, H100) where `count` fills them, else one host with `count` GPUs."""
  per_host = TARGETS[target].gpus_per_node
  if count > per_host and count % per_host == 0:
    return count // per_host, per_host
  return 1, count


def target_devices(target: str, count: int) -> list[Any]:
  """`count` compile-only devices of `target` (XLA's GPU compiler, no GPU), in whole nodes where they fill them."""
  # maxtext's config turns jax's persistent compilation cache on; an executable for compile-only devices cannot be
  # read back from it (every lookup warns), and nothing here runs one.
  jax.config.update("jax_enable_compilation_cache", False)
  hosts, per_host = hosts_and_devices(target, count)
  return list(topologies.get_topology_desc("", "cuda", topology=f"1x{hosts}x{per_host}",
                                           target_config=TARGETS[target].target_config()).devices)


def compile_train_step(config: Any, target: str, count: int, log: Callable[[str], None] = print) -> Any:
  """maxtext's train step for `config` compiled by XLA's GPU compiler for `count` `target` GPUs; the executable.

  TE's custom partitioners read TE's global MeshResource, so the compile runs inside maxtext's
  `transformer_engine_context()`, as the lowering does in maxtext's trainer."""
  from maxtext.utils import max_utils  # pylint: disable=import-outside-toplevel  # maxtext: as above

  start = time.perf_counter()
  traced, mesh = traced_train_step(config, target_devices(target, count))
  with jax.set_mesh(mesh), max_utils.transformer_engine_context():
    compiled = traced.lower().compile()
  log(f"compiled the train step for {count} x {TARGETS[target].name} in {time.perf_counter() - start:.1f} s")
  return compiled
