# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""maxtext's train step as its trainer builds it, traced for a given set of devices: the program the pre-flight
compiles for GPUs that are not here and the self-check compiles for the node's own.

Why here: it reads maxtext's config (mesh axes, logical axis rules) and calls maxtext's trainer internals
(`train_compile.get_shaped_inputs`, `get_functional_train_with_signature`), so the inputs and shardings are maxtext's
own and the program is the one its trainer jits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax.linen import partitioning as nn_partitioning
from jax.sharding import AxisType, Mesh

__all__ = ["traced_train_step"]


def traced_train_step(config: Any, devices: Sequence[Any]) -> tuple[Any, Any]:
  """(traced train step, mesh): maxtext's train step for `config` on a mesh of `devices`, traced with abstract
  inputs (train_compile.get_shaped_inputs) and maxtext's shardings, nothing allocated."""
  # pylint: disable-next=import-outside-toplevel  # maxtext: after the plugin's register(), which patches it
  from maxtext.trainers.pre_train import train, train_compile

  # pylint: disable-next=import-outside-toplevel  # maxtext: as above
  from maxtext.utils import maxtext_utils, sharding

  mesh = Mesh(maxtext_utils.create_device_mesh(config, devices), config.mesh_axes,
              axis_types=(AxisType.Auto,) * len(config.mesh_axes))
  shaped_args, shaped_kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
  params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
  input_state_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
  data_sharding = sharding.get_input_data_sharding(config, mesh)
  func, in_shard, out_shard, static_argnums, donate_argnums = maxtext_utils.get_functional_train_with_signature(
      train.train_step, data_sharding, input_state_shardings, model, config, params_shardings)
  with jax.set_mesh(mesh), nn_partitioning.axis_rules(config.logical_axis_rules):
    jitted = jax.jit(func, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static_argnums,
                     donate_argnums=donate_argnums)
    return jitted.trace(*shaped_args, **shaped_kwargs), mesh
