# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""A collective's replica group read off XLA's text (MaxText.preflight.classify.group_members, the patterns of
MaxText.preflight.hlo): the transposed iota form, whose permutation decides which GPUs a group joins and so whether
it runs on NVLink or on the network. The other forms: tests/preflight/tune_test.py."""

from __future__ import annotations

import pytest

from MaxText.preflight import hlo, predict
from MaxText.preflight.classify import group_members, work_of
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import TARGETS

#: An all-reduce over 128 GPUs in 8 groups of 16, as XLA prints a group along the outer of two mesh axes (16 x 8):
#: the iota 0..127 reshaped to [16, 8] and transposed, so each group is a column, GPUs 8 apart.
TRANSPOSED = ("  %ar = bf16[1024,1024]{1,0} all-reduce(bf16[1024,1024]{1,0} %p), channel_id=1, "
              "replica_groups=[8,16]<=[16,8]T(1,0), use_global_device_ids=true, to_apply=%add")


def test_a_transposed_iota_group_is_the_iotas_column_and_spans_both_racks():
  """[8,16]<=[16,8]T(1,0) on 128 GPUs: the first group is 0, 8, ..., 120, which lies in both racks of 64 of a
  GB200 or GB300 run (NVL72 domains), so it is timed on the network. Read without the permutation it would be
  0..15, inside the first rack, and timed on NVLink."""
  first = tuple(range(0, 128, 8))
  assert group_members(TRANSPOSED, 128) == first
  assert group_members(TRANSPOSED.replace("T(1,0)", ""), 128) == tuple(range(16))  # the untransposed iota's rows
  (inst,) = hlo.instructions([TRANSPOSED])
  work = work_of(inst, [inst.shape], 2 * 1024 * 1024, 128)
  assert (work.group, work.members, work.devices) == (16, first, 128)
  for target in ("gb200", "gb300"):
    peaks = TARGETS[target].peaks
    assert peaks.domain_gpus(128) == 64 and peaks.crosses_domains(work.members, 128), target
    kernel = Kernel(name="ar", opcode="all-reduce", target="", bytes=0, op_name="", work=work)
    assert predict.kernel_seconds(kernel, peaks) == pytest.approx(work.wire_bytes / peaks.network), target
