# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""amax is the global amax when x is sharded over 8 simulated CPU devices; results equal the unsharded ones.

Runs in a subprocess because the device count is fixed when jax initializes its CPU backend.
"""

import os
import subprocess
import sys
import textwrap

from tests.helpers import subprocess_env

_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from MaxText.nvfp4 import quantize
    assert jax.device_count() == 8, jax.devices()
    # Auto axis types, as maxtext builds its mesh (shard_mode=auto).
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jax.random.normal(jax.random.key(0), (64, 128), jnp.float32)
    x = x.at[63, 127].set(1000.0)  # the global amax lives on one shard only
    xs = jax.device_put(x, NamedSharding(mesh, P("data", "model")))
    for kw in [dict(scaling="1d"), dict(scaling="2d"), dict(rht=True),
               dict(stochastic_rounding=True, key=jax.random.key(1))]:
      f = jax.jit(lambda x: quantize(x, **kw))
      a, b = f(xs), f(x)
      assert float(a.amax) == float(b.amax), (kw, a.amax, b.amax)
      assert np.array_equal(np.asarray(a.data).astype(np.float32), np.asarray(b.data).astype(np.float32)), kw
      assert np.array_equal(np.asarray(a.scale).view(np.uint8), np.asarray(b.scale).view(np.uint8)), kw
    assert float(jax.jit(quantize)(xs).amax) == 1000.0
    print("OK")
""")


def test_sharded_amax_is_global():
  env = subprocess_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
