# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""Whether a collective crosses NVLink domains (MaxText.preflight.targets.Peaks.crosses_domains) and the link the
prediction times it on (MaxText.preflight.predict.kernel_seconds): decided by where its members sit, not by how many
they are."""

from __future__ import annotations

import pytest

from MaxText.preflight import predict
from MaxText.preflight.classify import Math, Work
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import TARGETS

WIRE = 10**9


def _seconds(members: tuple[int, ...], target: str = "gb300") -> float:
  """One all-reduce's seconds on `target` for a group of `members` of a 128-GPU program."""
  work = Work(math=Math.COLLECTIVE, wire_bytes=WIRE, group=len(members), members=members, devices=128)
  return predict.kernel_seconds(Kernel(name="c", opcode="all-reduce", target="", bytes=0, op_name="", work=work),
                                TARGETS[target].peaks)


def test_a_strided_group_inside_one_rack_is_timed_on_nvlink_and_one_of_the_same_size_across_racks_on_the_network():
  """128 GB300s are two NVL72 racks of 64. GPUs 0, 2, ..., 62 (32 of them, strided as a group along an outer mesh
  axis is) all lie in the first rack: NVLink. GPUs 0, 4, ..., 124 are as many, strided too, but half lie in the
  second rack: the network. Neither the group's size nor its stride tells the two apart."""
  peaks = TARGETS["gb300"].peaks
  inside, across = tuple(range(0, 64, 2)), tuple(range(0, 128, 4))
  assert len(inside) == len(across) == 32
  assert not peaks.crosses_domains(inside, 128) and peaks.crosses_domains(across, 128)
  assert _seconds(inside) == pytest.approx(WIRE / peaks.nvlink)
  assert _seconds(across) == pytest.approx(WIRE / peaks.network)
  assert _seconds(tuple(range(65, 128, 2))) == pytest.approx(WIRE / peaks.nvlink)  # the second rack's odd GPUs
