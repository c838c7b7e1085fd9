# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The SASS reader's counts (MaxText.preflight.sass.SassKernel) on instructions written as nvdisasm prints them: no
compile, so it runs in the CPU suite (tests/te/sass_test.py reads real kernels compiled for a GB300)."""

from __future__ import annotations

import pytest

from MaxText.preflight.sass import SassKernel

#: One instruction of each conversion opcode, with the modifiers and predicates nvdisasm prints; Blackwell's
#: int-to-float conversion is I2FP (Hopper's I2F), the opcode issue 65 saw dropped without a test noticing.
CONVERSIONS = ("I2FP.F32.U32 R4, R4", "I2F.U32 R5, R6", "@P0 F2I.U32.TRUNC.NTZ R7, R8", "F2IP.BF16.F32.PACK_AB R9, R2, R3",
               "FRND.F32.FLOOR R10, R11", "F2F.BF16.F32 R12, R13")


@pytest.mark.parametrize("conversion", CONVERSIONS)
def test_each_int_float_conversion_counts_once_and_other_instructions_do_not(conversion):
  kernel = SassKernel(name="k", instructions=("FMUL R1, R2, R3", "@!P1 LOP3.LUT R1, R1, 0xf, RZ, 0xc0, !PT",
                                              conversion, "NOP", "EXIT"))
  assert kernel.conversions == 1, conversion
  assert kernel.count == 4  # the NOP is padding


def test_a_kernel_without_conversions_counts_none():
  assert SassKernel(name="k", instructions=("FFMA R1, R2, R3, R4", "IMAD.SHL.U32 R5, R6, 0x2, RZ")).conversions == 0
