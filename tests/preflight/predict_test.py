# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The step-time roofline (MaxText.preflight.predict), the bound, on hand-built kernels, against arithmetic done here
from the datasheet numbers (so a wrong peak, bandwidth or classification changes a result and fails a test); the
comparison table (MaxText.preflight.programs, .comparisons) and the command line's refusals before maxtext imports;
and the scoped switch to maxtext's own quantization (MaxText.integration.hooks.maxtext_quantization) the nvfp4_all
comparison compiles under."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from MaxText.integration import hooks
from MaxText.preflight import calibration, predict, programs
from MaxText.preflight.classify import Math, Work
from MaxText.preflight.kernels import Kernel
from MaxText.preflight.targets import TARGETS
from tests.helpers import REPO_ROOT
from tests.helpers import settings as nvfp4_settings

#: Datasheet figures, dense, per GPU, as the tests expect them (MaxText/preflight/targets.py cites the sources).
GB300_FP4, GB300_FP8, GB300_BF16, GB300_HBM, NVLINK5 = 15e15, 5e15, 2.5e15, 8e12, 0.9e12
GB200_FP4 = 10e15
MLP = frozenset({14336})
M, N, K = 16384, 14336, 4096  # Llama 3 8B's wi_0 forward: 2 x 8192 tokens, hidden 4096, MLP width 14336


def _kernel(math: Math, flops: int = 0, nbytes: int = 0, runs: int = 1, wire: int = 0, group: int = 1,
            dims: tuple[int, int, int] | None = None, name: str = "k") -> Kernel:
  return Kernel(name=name, opcode="custom-call", target="", bytes=nbytes, op_name="", runs=runs,
                work=Work(math=math, flops=flops, wire_bytes=wire, group=group, gemm_dims=dims))


def _gemm(math: Math, runs: int = 32, dims: tuple[int, int, int] = (M, N, K)) -> Kernel:
  m, n, k = dims
  operands = {Math.FP4_GEMM: 0.5, Math.FP8_GEMM: 1, Math.BF16_GEMM: 2}[math]
  return _kernel(math, flops=2 * m * n * k, nbytes=int(operands * (m * k + k * n)) + 2 * m * n, runs=runs, dims=dims)


def test_a_gemm_bound_step_takes_flops_over_the_peak_of_its_math_type():
  """The MLP GEMM of 32 layers: compute-bound in every precision (at most 1.1 GB against 1.9 TFLOP)."""
  flops = 2 * M * N * K * 32
  for math, peak in ((Math.FP4_GEMM, GB300_FP4), (Math.FP8_GEMM, GB300_FP8), (Math.BF16_GEMM, GB300_BF16)):
    prediction = predict.predict([_gemm(math)], TARGETS["gb300"], MLP)
    assert prediction.roofline_seconds == pytest.approx(flops / peak, rel=1e-12), math
    assert prediction.bound[predict.Group.MLP_GEMMS] == prediction.roofline_seconds
    assert prediction.flops[math] == flops
  fp4_on_gb200 = predict.predict([_gemm(Math.FP4_GEMM)], TARGETS["gb200"], MLP)
  assert fp4_on_gb200.roofline_seconds == pytest.approx(flops / GB200_FP4, rel=1e-12)


def test_a_bandwidth_bound_step_takes_bytes_over_hbm_whatever_its_flops():
  """A GEMM with M = 16 (its bytes dominate: 2 x 16 x 14336 x 4096 FLOPs against 117 MB of weights) and an
  elementwise kernel are both bound by HBM."""
  thin = _gemm(Math.BF16_GEMM, runs=1, dims=(16, N, K))
  elementwise = _kernel(Math.ELEMENTWISE, nbytes=3 * 2 * M * N, runs=32)
  prediction = predict.predict([thin, elementwise], TARGETS["gb300"], MLP)
  assert thin.bytes / GB300_HBM > thin.work.flops / GB300_BF16
  assert prediction.bound[predict.Group.MLP_GEMMS] == pytest.approx(thin.bytes / GB300_HBM, rel=1e-12)
  assert prediction.bound[predict.Group.ELEMENTWISE] == pytest.approx(32 * 3 * 2 * M * N / GB300_HBM, rel=1e-12)


def test_a_communication_bound_step_takes_wire_bytes_over_nvlink_or_the_network_beyond_its_domain():
  """FSDP's all-gather of 32 layers' MLP weights: (n-1) shards per GPU over NVLink within the 72-GPU domain; the
  same over 128 GPUs goes at the 100 GB/s of GB300's ConnectX-8."""
  shard = 14336 * 4096 * 2 // 64
  inside = _kernel(Math.COLLECTIVE, nbytes=shard * 65, wire=shard * 63, group=64, runs=32)
  beyond = _kernel(Math.COLLECTIVE, nbytes=shard * 129, wire=shard * 127, group=128, runs=32)
  gb300 = TARGETS["gb300"]
  assert predict.predict([inside], gb300, MLP).roofline_seconds == pytest.approx(32 * shard * 63 / NVLINK5, rel=1e-12)
  assert predict.predict([beyond], gb300, MLP).roofline_seconds == pytest.approx(32 * shard * 127 / 0.1e12, rel=1e-12)
  overlapped = predict.predict([inside, _gemm(Math.FP8_GEMM)], gb300, MLP)
  assert overlapped.roofline_seconds == pytest.approx(max(32 * shard * 63 / NVLINK5, 2 * M * N * K * 32 / GB300_FP8))


def test_groups_split_mlp_gemms_from_other_gemms_by_the_mlp_width_and_keep_unclassified_apart():
  attention_projection = _gemm(Math.BF16_GEMM, dims=(M, 4096, 4096))
  attention = _kernel(Math.ATTENTION, flops=10**15, nbytes=10**9)
  unknown = _kernel(Math.UNCLASSIFIED, nbytes=8 * 10**9, runs=2)
  prediction = predict.predict([_gemm(Math.FP4_GEMM), attention_projection, attention, unknown],
                               TARGETS["gb300"], MLP)
  assert prediction.bound[predict.Group.OTHER_GEMMS] == pytest.approx(2 * M * 4096 * 4096 * 32 / GB300_BF16)
  assert prediction.bound[predict.Group.ATTENTION] == pytest.approx(10**15 / GB300_BF16)  # at the BF16 peak
  assert prediction.bound[predict.Group.UNCLASSIFIED] == pytest.approx(2 * 8 * 10**9 / GB300_HBM)
  assert prediction.kernels[predict.Group.UNCLASSIFIED] == 1 and prediction.bytes[predict.Group.UNCLASSIFIED] == 16e9
  assert prediction.step_seconds == pytest.approx(sum(prediction.seconds.values()))


#: The calibrated model with its fitted factors neutral (no scale, the full HBM, no launch gap): the cited library
#: shares and the tile quantization remain, and the tests below work them out by hand.
NEUTRAL = calibration.Factors(gemm_scale=1.0, memory_efficiency=1.0, launch_seconds=0.0)
LIB_FP8, LIB_FP4 = 0.763, 0.736  # MaxText/preflight/calibration.py's LIBRARY for Blackwell, cited there
#: The (M, N) tiles of 128 x 256 on GB300's 152 SMs: 128 x 56 tiles = 7,168, 48 waves of 152 (the last 25% full).
TILES_MN = M * N / (48 * 152 * 128 * 256)


def test_speedup_amdahl_ceiling_and_tflops_per_gpu():
  elementwise = _kernel(Math.ELEMENTWISE, nbytes=8 * 10**10)  # 10 ms on GB300
  gb300 = TARGETS["gb300"]
  fp8 = predict.predict([_gemm(Math.FP8_GEMM), elementwise], gb300, MLP, model_flops=2e15, factors=NEUTRAL)
  nvfp4 = predict.predict([_gemm(Math.FP4_GEMM), elementwise], gb300, MLP, model_flops=2e15, factors=NEUTRAL)
  gemm = 2 * M * N * K * 32
  fp8_gemm, fp4_gemm = gemm / (GB300_FP8 * LIB_FP8 * TILES_MN), gemm / (GB300_FP4 * LIB_FP4 * TILES_MN)
  assert predict.speedup(fp8, nvfp4) == pytest.approx((fp8_gemm + 0.01) / (fp4_gemm + 0.01))
  assert predict.amdahl_ceiling(fp8, nvfp4) == pytest.approx((fp8_gemm + 0.01) / 0.01)
  assert nvfp4.tflops_per_gpu == pytest.approx(2e15 / (fp4_gemm + 0.01) / 1e12)


def test_the_amdahl_ceiling_divides_by_this_runs_time_without_its_mlp_gemms():
  """A run whose MLP-free time differs from the baseline's (20 ms of elementwise work against 10 ms): the ceiling is
  the baseline's step over the run's 20 ms, not over the baseline's 10 ms."""
  gb300 = TARGETS["gb300"]
  fp8 = predict.predict([_gemm(Math.FP8_GEMM), _kernel(Math.ELEMENTWISE, nbytes=8 * 10**10)], gb300, MLP,
                        factors=NEUTRAL)
  nvfp4 = predict.predict([_gemm(Math.FP4_GEMM), _kernel(Math.ELEMENTWISE, nbytes=16 * 10**10)], gb300, MLP,
                          factors=NEUTRAL)
  assert nvfp4.mlp_free_seconds == pytest.approx(0.02) and fp8.mlp_free_seconds == pytest.approx(0.01)
  fp8_gemm = 2 * M * N * K * 32 / (GB300_FP8 * LIB_FP8 * TILES_MN)
  assert predict.amdahl_ceiling(fp8, nvfp4) == pytest.approx((fp8_gemm + 0.01) / 0.02)


def test_an_fp4_gemm_on_a_gpu_without_fp4_tensor_cores_is_refused_in_one_line():
  with pytest.raises(ValueError, match="without FP4 tensor cores"):
    predict.predict([_gemm(Math.FP4_GEMM)], TARGETS["h100"], MLP)


def test_every_target_has_dense_peaks_in_the_order_of_its_math_types():
  for name, target in TARGETS.items():
    peaks = target.peaks
    assert peaks.bf16 < peaks.fp8 and (peaks.fp4 is None or peaks.fp8 < peaks.fp4), name
    assert peaks.network < peaks.nvlink < peaks.hbm and peaks.sources, name


def test_predict_against_names_known_programs_once_and_refuses_the_rest():
  gb300, h100 = TARGETS["gb300"], TARGETS["h100"]
  assert programs.against("fp8, bf16,fp8", gb300) == ("fp8", "bf16")
  assert programs.against(None, gb300) == ("fp8", "bf16", "nvfp4_all")
  assert programs.against(None, h100) == ("fp8", "bf16")  # no FP4 tensor cores: no upstream te_nvfp4 by default
  with pytest.raises(ValueError, match=r"'fp4' is not a program to compare with; valid: fp8, bf16, nvfp4_all"):
    programs.against("fp8,fp4", gb300)
  with pytest.raises(ValueError, match="nothing"):
    programs.against(",", gb300)
  with pytest.raises(ValueError, match="NVIDIA H100 80GB HBM3 has no FP4 tensor cores"):
    programs.against("nvfp4_all", h100)


@pytest.mark.parametrize("args", [["--target", "a100", "--devices", "1"],
                                  ["--target", "b200", "--devices", "1", "--predict-against", "fp4"],
                                  ["--target", "b200", "--devices", "0"],
                                  ["--target", "b200", "--devices", "8", "--global-batch", "64"],
                                  ["--target", "b200", "--devices", "8", "--tune", "--global-batch", "0"],
                                  ["--target", "b200", "--devices", "8", "--tune", "--tune-compiles", "0"]],
                         ids=["target", "comparison", "devices", "global_batch_without_tune", "global_batch_0",
                              "no_compiles"])
def test_the_command_line_refuses_its_arguments_before_importing_maxtext_or_jax(args):
  """A mistyped --target, --predict-against or --devices is said in a fraction of a second, not after the 6 s that
  maxtext, jax and TransformerEngine take to import (MaxText.preflight.comparisons). The messages themselves are
  tests/te/preflight_test.py's."""
  code = ("import sys\nfrom MaxText.preflight import __main__ as cli\n"
          f"try:\n  cli.parse_args(['c.yml', *{args!r}])\nexcept SystemExit as e:\n  print(e.code)\n"
          "print(sorted(m for m in ('jax', 'maxtext', 'transformer_engine', 'tensorflow') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["2", "[]"], out.stdout + out.stderr
  assert out.stderr.startswith("MaxText.preflight: "), out.stderr


def test_a_comparison_replaces_the_run_s_own_setting_of_its_keys_and_switches_the_taps_off():
  """maxtext's fp8 and bf16 refuse nvfp4_stats_interval / nvfp4_audit_interval, and a comparison measures a
  precision, not our instruments."""
  fp8 = programs.COMPARISONS["fp8"]
  run = ["quantization=te_nvfp4", "steps=5", "nvfp4_audit_interval=100"]
  assert programs.overrides_for(run, fp8) == ["steps=5", "quantization=fp8", "nvfp4_stats_interval=0",
                                              "nvfp4_audit_interval=0", "nvfp4_calibration_interval=0"]
  assert programs.COMPARISONS["nvfp4_all"].upstream and not fp8.upstream


def test_the_taps_a_run_has_on_are_those_with_an_interval():
  assert [(t.key, t.interval, t.off) for t in programs.taps(nvfp4_settings(audit_interval=100))] == [
      ("nvfp4_audit_interval", 100, "nvfp4_audit_interval=0")]
  assert [t.key for t in programs.taps(nvfp4_settings(audit_interval=100, stats_interval=10))] == [
      "nvfp4_stats_interval", "nvfp4_audit_interval"]
  assert programs.taps(nvfp4_settings()) == []


def test_a_tap_counts_one_step_in_its_interval_in_the_mean_step():
  """The kernel count holds both branches of a tap's conditional: the run with the audit at interval 100 is
  predicted at 0.3 s + 0.2 s / 100, not 0.5 s; bytes and FLOPs likewise; and two taps each take their own share."""
  elementwise = _kernel(Math.ELEMENTWISE, nbytes=int(0.3 * GB300_HBM))
  audit = _kernel(Math.ELEMENTWISE, nbytes=int(0.2 * GB300_HBM))
  stats = _kernel(Math.BF16_GEMM, flops=int(0.1 * GB300_BF16), dims=(16, 16, 16))
  gb300 = TARGETS["gb300"]
  full = predict.predict([elementwise, audit, stats], gb300, MLP)
  without_audit = predict.predict([elementwise, stats], gb300, MLP)
  without_stats = predict.predict([elementwise, audit], gb300, MLP)
  mean = predict.averaged(full, [(without_audit, 100), (without_stats, 10)])
  assert mean.roofline_seconds == pytest.approx(0.3 + 0.2 / 100 + 0.1 / 10, rel=1e-9)
  assert mean.step_seconds == pytest.approx(full.step_seconds - (full.step_seconds - without_audit.step_seconds) * 0.99
                                            - (full.step_seconds - without_stats.step_seconds) * 0.9, rel=1e-9)
  assert mean.bytes[predict.Group.ELEMENTWISE] == pytest.approx(0.3 * GB300_HBM + 0.2 * GB300_HBM / 100, rel=1e-6)
  assert mean.flops[Math.BF16_GEMM] == pytest.approx(0.1 * GB300_BF16 / 10, rel=1e-6)
  assert predict.averaged(full, []) == full


def test_maxtext_quantization_hands_te_nvfp4_to_maxtext_only_inside_the_block(monkeypatch):
  """The switch the nvfp4_all comparison compiles under: inside, maxtext's own factory gets te_nvfp4; outside (and
  after), the plugin's quant object does."""
  monkeypatch.setattr(hooks, "quantization_from_config", lambda config, quant_mode_str: "plugin")
  configure = hooks.wrap_configure_quantization(lambda config, quant_mode_str="train": "maxtext")
  config = types.SimpleNamespace(quantization="te_nvfp4")
  assert configure(config) == "plugin"
  with hooks.maxtext_quantization():
    assert configure(config) == "maxtext"
    assert configure(types.SimpleNamespace(quantization="fp8")) == "maxtext"
  assert configure(config) == "plugin"


def test_a_default_comparison_that_does_not_compile_is_left_out_with_a_line(monkeypatch, capsys):
  """--predict alone (no --predict-against): a default comparison that fails to compile, such as upstream's
  every-GEMM te_nvfp4 for Mixtral, is a `left out` line and no kernels, not exit 2, so the other rows still print;
  predict_all then predicts the rest."""
  from MaxText.preflight import library, run  # pylint: disable=import-outside-toplevel  # as the pre-flight's CLI

  def refuse(config, overrides, devices):
    raise AssertionError("Data shape (4096, 8) should be divisible by block_y 16 in axis -1")

  monkeypatch.setattr(library, "load_config", refuse)
  left_out: list[str] = []
  found = run.comparison_kernels("c.yml", ["quantization=te_nvfp4"], "b200", 8, programs.COMPARISONS["nvfp4_all"],
                                 left_out=left_out)
  assert found is None and not capsys.readouterr().err
  assert left_out == ["left out: the comparison program nvfp4_all (quantization=te_nvfp4) does not compile for 8 x "
                      "b200: AssertionError: Data shape (4096, 8) should be divisible by block_y 16 in axis -1 (not "
                      "named; one named with --predict-against is an error)"]


def test_predict_all_predicts_the_comparisons_that_compiled_and_leaves_out_the_rest(monkeypatch):
  """programs.predict_all with a kernels_of that answers None for one comparison (left out, as above): the others
  are predicted, that one is not in `against`."""
  from MaxText.preflight.targets import TARGETS  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(programs, "mlp_widths", lambda config: {})
  monkeypatch.setattr(programs, "training_flops", lambda config: {"tflops_per_device_step": 1.0})
  monkeypatch.setattr(programs.predict, "predict", lambda found, target, widths, flops: found)
  monkeypatch.setattr(programs.predict, "averaged", lambda full, without: full)
  predicted = programs.predict_all(None, "run's", TARGETS["b200"], ("fp8", "bf16", "nvfp4_all"),
                                   lambda c: None if c.name == "nvfp4_all" else f"{c.name}'s")
  assert predicted.run == "run's" and predicted.against == {"fp8": "fp8's", "bf16": "bf16's"}


def test_a_comparison_program_that_does_not_compile_is_one_line_and_exit_2(monkeypatch, capsys):
  """The pre-flight's handling of a comparison that fails to load or compile: its name, its overrides and the
  error, in one line on stderr, exit 2 (what tests/te/preflight_test.py cannot provoke cheaply with a real one)."""
  from MaxText.preflight import library, run  # pylint: disable=import-outside-toplevel  # as the pre-flight's CLI

  def refuse(config, overrides, devices):
    raise RuntimeError("no such kernel\nfor this shape")

  monkeypatch.setattr(library, "load_config", refuse)
  with pytest.raises(SystemExit) as exit_:
    run.comparison_kernels("c.yml", ["quantization=te_nvfp4", "steps=5"], "gb300", 4, programs.COMPARISONS["fp8"])
  assert exit_.value.code == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line == ("MaxText.preflight: the comparison program fp8 (quantization=fp8) does not compile for 4 x gb300: "
                  "RuntimeError: no such kernel for this shape")
