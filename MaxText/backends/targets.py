# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Descriptions of the GPUs the plugin claims, for compiling with XLA's GPU compiler on a machine without them.

Why: lowering to CUDA StableHLO proves the API calls; compiling proves what XLA's GPU compiler makes of them, and
gives per-device memory. XLA compiles for a GPU it only has a description of (a `GpuTargetConfigProto`, passed as
`target_config` to `jax.experimental.topologies.get_topology_desc`), with the CUDA jax plugin installed
(`.venv-gpu`) and no driver. Each description here holds the facts XLA's GPU compiler reads: compute capability,
SM count and limits, memory size, bandwidth, L2, clock.

Sources: the device descriptions that openxla/xla keeps for these GPUs
(xla/backends/gpu/target_config/specs/{b200,gb300,h100_sxm}.txtpb, read off real devices by XLA's
`compute_capability`/`DeviceDescription` query); the numbers were copied as facts and the text format is written
here. Memory sizes are what the CUDA driver reports as usable (B200: 178.4 GiB of its 192 GB, GB300: 276.6 GiB of
its 288 GB, H100 SXM: 79.1 GiB of its 80 GB).
"""

from __future__ import annotations

import dataclasses

__all__ = ["TARGETS", "Target"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
  """One GPU model as XLA's GPU compiler sees it."""

  name: str
  capability: tuple[int, int]
  sm_count: int
  memory_bytes: int
  memory_bandwidth: int  # bytes/s
  l2_bytes: int
  clock_ghz: float
  dnn: tuple[int, int]  # cuDNN major, minor the description was read with
  gpus_per_node: int  # HGX boards: 8; Grace-Blackwell compute trays (GB200/GB300 NVL72): 4

  @property
  def nvfp4(self) -> bool:
    """Whether TransformerEngine runs NVFP4 GEMMs on it (Blackwell: compute capability 10.x)."""
    return self.capability[0] >= 10

  def target_config(self) -> str:
    """The GpuTargetConfigProto in protobuf text format."""
    major, minor = self.capability
    return (
        "gpu_device_info {\n"
        "  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152\n"
        "  shared_memory_per_core: 233472 threads_per_core_limit: 2048 fpus_per_core: 128\n"
        "  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535\n"
        "  shared_memory_per_block_optin: 232448 registers_per_core_limit: 65536 registers_per_block_limit: 65536\n"
        f"  core_count: {self.sm_count} memory_bandwidth: {self.memory_bandwidth} l2_cache_size: {self.l2_bytes}\n"
        f"  clock_rate_ghz: {self.clock_ghz} device_memory_size: {self.memory_bytes}\n"
        f"  cuda_compute_capability {{ major: {major} minor: {minor} }}\n"
        "}\n"
        'platform_name: "CUDA"\n'
        f"dnn_version_info {{ major: {self.dnn[0]} minor: {self.dnn[1]} }}\n"
        f'device_description_str: "{self.name}"\n'
    )


TARGETS: dict[str, Target] = {
    "b200": Target(name="NVIDIA B200", capability=(10, 0), sm_count=148, memory_bytes=191514411008,
                   memory_bandwidth=7672320000000, l2_bytes=132644864, clock_ghz=1.965,
                   dnn=(9, 7), gpus_per_node=8),
    "gb300": Target(name="NVIDIA GB300", capability=(10, 3), sm_count=152, memory_bytes=297021079552,
                    memory_bandwidth=7928064000000, l2_bytes=135528448, clock_ghz=2.07,
                    dnn=(9, 15), gpus_per_node=4),
    "h100": Target(name="NVIDIA H100 80GB HBM3", capability=(9, 0), sm_count=132, memory_bytes=84942979072,
                   memory_bandwidth=3352320000000, l2_bytes=52428800, clock_ghz=1.98,
                   dnn=(8, 9), gpus_per_node=8),
}
