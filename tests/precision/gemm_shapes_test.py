# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The NVFP4 MLP GEMMs of a model shape: global and per-shard M, K, N, the columns the RHT sees, the keys that set each
dimension, and the block rule's one-line messages."""

from __future__ import annotations

from MaxText.precision.gemm_shapes import AttentionShape, ModelShape, Sized, block_errors, nvfp4_gemm_dims
from MaxText.precision.policy import Precision
from tests.helpers import settings

_NONE = Sized(1, "")


def _shape(**overrides) -> ModelShape:
  values = dict(emb=Sized(4096, "emb_dim=4096"), mlp=Sized(14336, "mlp_dim=14336"), num_activations=2, fused=False,
                tokens={"train": Sized(8 * 8192, "per_device_batch_size=2 max_target_length=8192 on 4 devices")},
                row_shards=Sized(4, "fsdp=4"), mlp_shards=_NONE, embed_shards=_NONE)
  return ModelShape(**{**values, **overrides})


def test_swiglu_mlp_on_fsdp():
  dims = nvfp4_gemm_dims(_shape(), settings())
  assert [(d.module, d.m, d.k, d.n) for d in dims] == [("mlp/wi_0", 16384, 4096, 14336),
                                                       ("mlp/wi_1", 16384, 4096, 14336),
                                                       ("mlp/wo", 16384, 14336, 4096)]
  assert all(d.m_global == 65536 and d.phase == "train" for d in dims)
  assert dims[0].m_keys.endswith("split by fsdp=4") and dims[2].k_keys == "mlp_dim=14336"


def test_tensor_parallelism_splits_mlp_and_the_activations_embed():
  shape = _shape(mlp_shards=Sized(2, "tensor=2"), embed_shards=Sized(2, "tensor=2"),
                 tokens={"train": Sized(4096, "t"), "eval": Sized(2048, "e")}, row_shards=_NONE)
  dims = nvfp4_gemm_dims(shape, settings())
  wi, wo = dims[0], dims[2]
  assert (wi.n, wi.n_global, wi.x_cols, wi.dy_cols) == (7168, 14336, 2048, 7168)  # x's embed split over tensor
  assert (wo.k, wo.x_cols, wo.dy_cols) == (7168, 7168, 2048) and "split by tensor=2" in wo.dy_cols_keys
  assert [d.phase for d in dims] == ["train"] * 3 + ["eval"] * 3 and dims[3].m == 2048


def test_fused_up_projection_and_a_bf16_mlp():
  (wi, wo) = nvfp4_gemm_dims(_shape(fused=True), settings())
  assert (wi.module, wi.n, wi.n_keys) == ("mlp/wi", 2 * 14336, "2 mlp_activations x mlp_dim=14336")
  assert wo.module == "mlp/wo"
  assert nvfp4_gemm_dims(_shape(), settings(mlp=Precision.BF16)) == []


def test_a_dimension_nvfp4_cannot_block_names_its_keys_and_a_fix():
  shape = _shape(emb=Sized(4100, "emb_dim=4100 (base_emb_dim=4100)"), row_shards=_NONE)
  k_of_wi, n_of_wo = block_errors(nvfp4_gemm_dims(shape, settings()), 16, "te_nvfp4")  # once per axis, not per GEMM
  assert "mlp/wi_0 has K = 4100 from emb_dim=4100 (base_emb_dim=4100)" in k_of_wi and "e.g. 4112" in k_of_wi
  assert "mlp/wo has N = 4100" in n_of_wo and "nvfp4_mlp_precision=bf16" in n_of_wo


def _attention(**overrides) -> AttentionShape:
  values = dict(query=Sized(4096, "num_query_heads=32 x head_dim=128"), kv=Sized(1024, "num_kv_heads=8 x head_dim=128"),
                fused_qkv=False, heads_shards=Sized(2, "tensor=2"))
  return AttentionShape(**{**values, **overrides})


def test_attention_projections_in_nvfp4_are_listed_with_their_keys():
  """nvfp4_attention_precision=nvfp4: query, key, value and out after the MLP's GEMMs, heads split over tensor; none
  without the opt-in, and the MLP's alone stay out with nvfp4_mlp_precision=bf16."""
  shape = _shape(attention=_attention())
  assert [d.module for d in nvfp4_gemm_dims(shape, settings())] == ["mlp/wi_0", "mlp/wi_1", "mlp/wo"]
  dims = nvfp4_gemm_dims(shape, settings(mlp=Precision.BF16, attention=Precision.NVFP4))
  assert [(d.module, d.m, d.k, d.n) for d in dims] == [("self_attention/query", 16384, 4096, 2048),
                                                       ("self_attention/key", 16384, 4096, 512),
                                                       ("self_attention/value", 16384, 4096, 512),
                                                       ("self_attention/out", 16384, 2048, 4096)]
  out = dims[-1]
  assert (out.k_global, out.x_cols, out.k_keys) == (4096, 2048, "num_query_heads=32 x head_dim=128 split by tensor=2")
  (qkv, _) = nvfp4_gemm_dims(_shape(attention=_attention(fused_qkv=True)),
                             settings(mlp=Precision.BF16, attention=Precision.NVFP4))
  assert (qkv.module, qkv.n_global, qkv.n) == ("self_attention/qkv_proj", 6144, 3072)


def test_an_attention_dimension_nvfp4_cannot_block_names_the_attention_key():
  shape = _shape(attention=_attention(kv=Sized(8, "num_kv_heads=1 x head_dim=8"), heads_shards=_NONE))
  (error,) = block_errors(nvfp4_gemm_dims(shape, settings(attention=Precision.NVFP4)), 16, "te_nvfp4")
  assert "self_attention/key has N = 8 from num_kv_heads=1 x head_dim=8" in error, error
  assert error.endswith("or set nvfp4_attention_precision=bf16"), error
