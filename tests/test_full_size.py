"""Full-size shapes without allocating: `jax.eval_shape` of the real DeepSeek-V3.2 and GLM-5 MTP layers.

The expected numbers come from the checkpoint's own tensor list (shared/reference/deepseek_v32.md
§2.2: `model.layers.61.*`, shapes [out, in]), not from our code: DeepSeek's "11.5B unique params
without the shared embedding/head" (README_WEIGHTS) predates V3.2's indexer and rounds, so we
assert the exact sum of the tensor table and that it rounds to that figure.
"""

import math

import jax
import pytest

import jax_mtp


def _checkpoint_tensor_shapes(cfg: jax_mtp.MtpConfig) -> dict[str, tuple[int, ...]]:
  """`model.layers.{L}.*` of a HF checkpoint, per-expert tensors summed into one entry each."""
  d, n, e, f = cfg.hidden_size, cfg.num_attention_heads, cfg.n_routed_experts, cfg.moe_intermediate_size
  return {
      "enorm": (d,), "hnorm": (d,), "shared_head.norm": (d,), "eh_proj": (d, 2 * d),
      "input_layernorm": (d,), "post_attention_layernorm": (d,),
      "q_a_proj": (cfg.q_lora_rank, d), "q_a_layernorm": (cfg.q_lora_rank,),
      "q_b_proj": (n * cfg.qk_head_dim, cfg.q_lora_rank),
      "kv_a_proj_with_mqa": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d), "kv_a_layernorm": (cfg.kv_lora_rank,),
      "kv_b_proj": (n * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
      "o_proj": (d, n * cfg.v_head_dim),
      "indexer.wq_b": (cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank),
      "indexer.wk": (cfg.index_head_dim, d), "indexer.k_norm.weight+bias": (2, cfg.index_head_dim),
      "indexer.weights_proj": (cfg.index_n_heads, d),
      "gate.weight": (e, d), "gate.e_score_correction_bias": (e,),
      "experts.*.{gate,up,down}_proj": (e, 3, f, d),
      "shared_experts.{gate,up,down}_proj": (3, f * cfg.n_shared_experts, d),
  }


# Tensors HF and the official code keep in fp32 (our params too); every other one is bf16.
_FP32 = ("indexer.k_norm.weight+bias", "indexer.weights_proj", "gate.weight", "gate.e_score_correction_bias")


@pytest.mark.parametrize("preset, billions", [(jax_mtp.deepseek_v32, 11.6), (jax_mtp.glm5, 10.0)])
def test_full_size_mtp_layer_parameter_count_and_bytes(preset, billions):
  cfg = preset()
  shapes = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  layer = jax.tree.leaves(shapes["layers_0"])
  expected = _checkpoint_tensor_shapes(cfg)
  expected_count = sum(math.prod(s) for s in expected.values())
  expected_bytes = sum(math.prod(s) * (4 if k in _FP32 else 2) for k, s in expected.items())

  assert sum(x.size for x in layer) == expected_count
  assert sum(x.size * x.dtype.itemsize for x in layer) == expected_bytes
  assert round(expected_count / 1e9, 1) == billions
  for name in ("embed_tokens", "lm_head"):  # shared with the target model, not in the count above
    assert shapes[name].shape == (cfg.vocab_size, cfg.hidden_size)


def test_deepseek_v32_mtp_layer_is_the_documented_11_5b_plus_the_indexer():
  """DeepSeek's 11.5B (V3, no indexer) ≈ our V3.2 count minus the indexer tensors."""
  cfg = jax_mtp.deepseek_v32()
  shapes = _checkpoint_tensor_shapes(cfg)
  without_indexer = sum(math.prod(s) for k, s in shapes.items() if not k.startswith("indexer"))
  assert abs(without_indexer / 11.5e9 - 1) < 0.01
  embed = cfg.vocab_size * cfg.hidden_size
  assert round(embed / 1e9, 1) == 0.9  # "0.9B embedding and 0.9B head"


def test_full_size_draft_step_traces_with_a_long_cache():
  """One draft step of the real V3.2 layer traces (shapes only) with a cache past index_topk."""
  cfg = jax_mtp.deepseek_v32()
  model = jax_mtp.MtpPredictor(cfg)
  params = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, 4, 4096))
  ids = jax.ShapeDtypeStruct((4, 1), "int32")
  hidden = jax.ShapeDtypeStruct((4, 1, cfg.hidden_size), "bfloat16")
  out = jax.eval_shape(lambda p, i, h, c: model.apply({"params": p}, i, i, h, c), params, ids, hidden, caches)
  assert out.hidden_BTD.shape == (4, 1, cfg.hidden_size) and out.hidden_BTD.dtype == "bfloat16"
  assert out.caches[0].latent_BSC.shape == (4, 4096, cfg.kv_lora_rank)
