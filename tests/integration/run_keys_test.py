# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The run's location and model keys, read once from a loaded config (MaxText.integration.run_keys)."""

import jax.numpy as jnp

from tests.helpers import TINY_YML, load_config


def test_run_keys_are_the_configs_values():
  from MaxText.integration.run_keys import run_keys  # pylint: disable=import-outside-toplevel  # after load_config

  keys = run_keys(load_config(TINY_YML, "run_name=r", "model_name=llama3.1-8b", "override_model_config=true",
                              "base_emb_dim=64", "base_num_query_heads=4", "base_num_kv_heads=4", "head_dim=16",
                              "base_mlp_dim=256", "base_num_decoder_layers=2", "vocab_size=256"))
  assert (keys.model_name, keys.run_name, keys.scan_layers, keys.load_parameters_path) == ("llama3.1-8b", "r", True, "")
  assert jnp.dtype(keys.dtype) == jnp.bfloat16 and jnp.dtype(keys.weight_dtype) == jnp.float32
