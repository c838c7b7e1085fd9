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
here. Memory sizes are what the CUDA driver reports as usable (B200: 178.4 GiB of its 192 GB, GB200: 184.3 GiB of
its 186 GB, GB300: 276.6 GiB of its 288 GB, H100 SXM: 79.1 GiB of its 80 GB). GB200 is XLA's gb200.txtpb.

Each target also carries its datasheet `Peaks` (MaxText.preflight.predict's roofline): dense tensor-core FLOP/s per
math type, HBM bandwidth, NVLink bandwidth per direction and the GPUs one NVLink domain joins, and the scale-out
network per GPU beyond it. NVIDIA's tables list tensor-core rates "with sparsity" (2:4 structured); dense is half
of that, and dense is what training GEMMs run at. Per-GPU figures are the system's divided by its GPUs. Sources,
as cited on each entry (read through the copies named where the vendor page itself was not at hand):
  [HGX]   NVIDIA HGX B200 / GB200 NVL72 specifications, "Individual Blackwell GPU Specifications" (per GPU, with
          sparsity: GB200 FP4 20 PF, FP8 10 PF, BF16 5 PF, 8 TB/s; HGX B200 FP4 18 PF, FP8 9 PF, BF16 4.5 PF,
          7.7 TB/s; NVLink 1.8 TB/s), https://www.nvidia.com/en-us/data-center/hgx/ and
          https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (table copied at
          https://zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html; dense values listed for the
          GB200 (1,200 W) and HGX (1,000 W) variants at https://glennklockwood.com/garden/processors/B200).
  [GB300] NVIDIA GB300 NVL72 specifications, 72 GPUs: FP4 1,440 PF sparse / 1,080 PF dense, FP8/FP6 720 PF and
          FP16/BF16 360 PF with sparsity, HBM 576 TB/s, NVLink 130 TB/s, one ConnectX-8 800 Gb/s per GPU,
          https://www.nvidia.com/en-us/data-center/gb300-nvl72/ (copied at
          https://vendordeep.com/report/nvidia-launches-blackwell-ultra-gb300 and
          https://verda.com/blog/gb300-nvl72-architecture, whose per-GPU dense table gives 15 / 5 / 2.5 PF).
  [H100]  NVIDIA H100 Tensor Core GPU datasheet, SXM: FP8 3,958 TF and BF16 1,979 TF with sparsity, HBM 3.35 TB/s,
          NVLink 900 GB/s, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet.
  [H200]  NVIDIA H200 Tensor Core GPU, SXM: H100's compute (FP8 3,958 TF and BF16 1,979 TF with sparsity), 141 GB
          of HBM3e at 4.8 TB/s, NVLink 900 GB/s, https://www.nvidia.com/en-us/data-center/h200/; nvidia-smi reports
          143,771 MiB; the same SM count, L2 and clock as H100 SXM (the same GH100 die).
  [NVL5]  Fifth-generation NVLink: 1.8 TB/s per GPU in total ([HGX]; [GB300]: 130 TB/s over 72 GPUs), that is
          900 GB/s each way (https://verda.com/blog/gb300-nvl72-architecture: "1.8 TB/s total bandwidth (900 GB/s
          unidirectional)").
  [NIC]   Scale-out per GPU: one ConnectX-7 400 Gb/s (50 GB/s each way) per B200 / GB200 / H100 in the MLPerf
          system descriptions (mlcommons/inference_results_v6.0 closed/Nebius/systems/nebius_b200_n1.json: "8x
          ConnectX-7 IB NDR 400Gb/s"; inference_results_v6.1 closed/Crusoe/systems/
          GB200-NVL72_GB200-186GB_aarch64x16_Dynamo.json: 4 ConnectX-7 per 4-GPU node); ConnectX-8 800 Gb/s
          (100 GB/s) per GB300 ([GB300]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["TARGETS", "Peaks", "Target"]

TERA = 1e12
PETA = 1e15


@dataclasses.dataclass(frozen=True, kw_only=True)
class Peaks:
  """One GPU's datasheet rates, dense (no 2:4 sparsity), per second; what bounds a kernel in the roofline.

  fp4 / fp8 / bf16: tensor-core FLOP/s of GEMMs on NVFP4, FP8 and BF16 (or FP16) operands (fp4 None: the GPU
  has no FP4 tensor cores). hbm: bytes/s of its memory. nvlink: bytes/s one GPU sends (and receives) over NVLink,
  each way. nvlink_domain: how many GPUs one NVLink domain joins (an HGX board, an NVL72 rack); a collective over
  more GPUs goes at `network`, the scale-out bytes/s per GPU each way. sources: where each number comes from.
  """

  fp4: float | None
  fp8: float
  bf16: float
  hbm: float
  nvlink: float
  nvlink_domain: int
  network: float
  sources: str

  def domain_gpus(self, devices: int) -> int:
    """How many of a run's `devices` GPUs share one NVLink domain: all of them when they fit in one; else the largest
    divisor of `devices` a domain holds (128 GPUs of NVL72 racks: 64 in each of two racks), so every domain holds
    the same share and device ids 0.. fill the first domain first (the order maxtext's mesh lays devices out)."""
    if devices <= self.nvlink_domain:
      return devices
    return max(d for d in range(1, self.nvlink_domain + 1) if devices % d == 0)

  def crosses_domains(self, members: Sequence[int], devices: int) -> bool:
    """Whether a collective whose group is the device ids `members` (of a program on `devices` GPUs) spans more than
    one NVLink domain, and so runs at the scale-out network's bandwidth (`domain_gpus`)."""
    per_domain = self.domain_gpus(devices)
    return len({member // per_domain for member in members}) > 1


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
  peaks: Peaks

  @property
  def lane_ops_per_second(self) -> float:
    """Instructions per second over all its SMs at one per lane per clock: 128 lanes per SM (fpus_per_core in the
    description XLA reads; Hopper and Blackwell alike), at the clock above. The rate `classify.Work.lane_ops` is set
    against (scripts/top_kernels.py); the step-time prediction itself prices elementwise kernels by bytes."""
    return self.sm_count * _LANES_PER_SM * self.clock_ghz * 1e9

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
        f"  shared_memory_per_core: 233472 threads_per_core_limit: 2048 fpus_per_core: {_LANES_PER_SM}\n"
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


#: FP32/INT32 lanes per SM (CUDA cores) on Hopper and Blackwell.
_LANES_PER_SM = 128

#: What GB200 and GB300 share: the Grace-Blackwell compute tray of an NVL72 rack (4 GPUs in one 72-GPU NVLink
#: domain; the same SM count, HBM bandwidth and L2 as XLA reads them; cuDNN 9.15), and their FP8/BF16/HBM peaks.
_NVL72_TRAY: dict[str, Any] = {"sm_count": 152, "memory_bandwidth": 7928064000000, "l2_bytes": 135528448,
                               "dnn": (9, 15), "gpus_per_node": 4}
_NVL72_PEAKS: dict[str, Any] = {"fp8": 5 * PETA, "bf16": 2.5 * PETA, "hbm": 8 * TERA, "nvlink": 0.9 * TERA,
                                "nvlink_domain": 72}

TARGETS: dict[str, Target] = {
    "b200": Target(name="NVIDIA B200", capability=(10, 0), sm_count=148, memory_bytes=191514411008,
                   memory_bandwidth=7672320000000, l2_bytes=132644864, clock_ghz=1.965,
                   dnn=(9, 7), gpus_per_node=8,
                   peaks=Peaks(fp4=9 * PETA, fp8=4.5 * PETA, bf16=2.25 * PETA, hbm=7.7 * TERA, nvlink=0.9 * TERA,
                               nvlink_domain=8, network=0.05 * TERA,
                               sources="[HGX] HGX B200 per GPU halved; [NVL5]; [NIC] ConnectX-7")),
    "gb200": Target(name="NVIDIA GB200", capability=(10, 0), memory_bytes=197897748480, clock_ghz=2.062,
                    **_NVL72_TRAY, peaks=Peaks(fp4=10 * PETA, network=0.05 * TERA, **_NVL72_PEAKS,
                                               sources="[HGX] GB200 per GPU halved; [NVL5]; [NIC] ConnectX-7")),
    "gb300": Target(name="NVIDIA GB300", capability=(10, 3), memory_bytes=297021079552, clock_ghz=2.07,
                    **_NVL72_TRAY, peaks=Peaks(fp4=15 * PETA, network=0.1 * TERA, **_NVL72_PEAKS,
                                               sources="[GB300] per GPU (72), sparse halved; [NVL5]; "
                                               "ConnectX-8 [GB300]")),
    "h100": Target(name="NVIDIA H100 80GB HBM3", capability=(9, 0), sm_count=132, memory_bytes=84942979072,
                   memory_bandwidth=3352320000000, l2_bytes=52428800, clock_ghz=1.98,
                   dnn=(8, 9), gpus_per_node=8,
                   peaks=Peaks(fp4=None, fp8=1.979 * PETA, bf16=0.9895 * PETA, hbm=3.35 * TERA, nvlink=0.45 * TERA,
                               nvlink_domain=8, network=0.05 * TERA,
                               sources="[H100] SXM, sparse halved; NVLink 900 GB/s in total; [NIC] ConnectX-7")),
    "h200": Target(name="NVIDIA H200", capability=(9, 0), sm_count=132, memory_bytes=143771 * 2**20,
                   memory_bandwidth=4800000000000, l2_bytes=52428800, clock_ghz=1.98,
                   dnn=(8, 9), gpus_per_node=8,
                   peaks=Peaks(fp4=None, fp8=1.979 * PETA, bf16=0.9895 * PETA, hbm=4.8 * TERA, nvlink=0.45 * TERA,
                               nvlink_domain=8, network=0.05 * TERA,
                               sources="[H200] SXM, sparse halved; NVLink 900 GB/s in total; [NIC] ConnectX-7")),
}
