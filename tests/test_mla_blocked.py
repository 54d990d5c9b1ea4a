"""MLA's naive form a block of slots at a time (`jax_mtp.mla_blocked`) against the whole form (`mla.naive_attention`
over the cache expanded at once), and the model's naive form past KEY_BLOCK slots against its absorbed form (an
independent formula: the latent never expanded)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.cache import LayerCache, causal_mask
from jax_mtp.kernels.sparse_mla import dequantize_latent
from jax_mtp.mla import naive_attention, quantize_latent
from jax_mtp.mla_blocked import KEY_BLOCK, blocked_naive_attention
from jax_mtp.model import TargetModel, init_target_caches
from tests.tolerances import assert_close

N, P, R, H, C = 4, 16, 8, 12, 32


def _problem(dtype, capacity, chunk, start, fp8=False, seed=0):
  keys = iter(jax.random.split(jax.random.key(seed), 6))
  normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)  # noqa: E731
  latent = normal(2, capacity, C)
  scale = None
  if fp8:
    latent, scale = quantize_latent(latent, 16)
  cache = LayerCache(latent if fp8 else latent.astype(dtype), normal(2, capacity, R).astype(dtype), None,
                     latent_scale_BSG=scale)
  positions = jnp.broadcast_to(start + jnp.arange(chunk), (2, chunk))
  w_kv = (normal(C, N, P + H) / np.sqrt(C)).astype(dtype)
  return normal(2, chunk, N, P).astype(dtype), normal(2, chunk, N, R).astype(dtype), cache, w_kv, positions


def _whole(q_nope, q_pe, cache, w_kv, visible, dtype):
  latent = (cache.latent_BSC if cache.latent_scale_BSG is None
            else dequantize_latent(cache.latent_BSC, cache.latent_scale_BSG, dtype))
  kv = jnp.einsum("bsc,cnx->bsnx", latent.astype(dtype), w_kv, precision=jax.lax.Precision.HIGHEST,
                  preferred_element_type=jnp.float32).astype(dtype)
  return naive_attention(q_nope, q_pe, kv[..., :P], cache.k_pe_BSR, kv[..., P:], visible, 0.3)[0]


@pytest.mark.parametrize("dtype, fp8", [("float32", False), ("bfloat16", False), ("bfloat16", True)])
@pytest.mark.parametrize("capacity, block, chunk, start", [
    (96, 32, 8, 88),    # whole blocks, the chunk at the cache's end
    (100, 32, 8, 40),   # a short last block (read overlapping, masked), blocks past position 47 skipped
    (100, 32, 5, 0),    # the first block only
    (64, 64, 16, 48),   # one block: the whole cache
])
def test_blocks_of_slots_equal_the_whole_form(dtype, fp8, capacity, block, chunk, start):
  q_nope, q_pe, cache, w_kv, positions = _problem(jnp.dtype(dtype), capacity, chunk, start, fp8)
  visible = causal_mask(positions, capacity)
  got = blocked_naive_attention(q_nope, q_pe, cache, w_kv, visible, 0.3, jnp.dtype(dtype), block)
  assert_close(got, _whole(q_nope, q_pe, cache, w_kv, visible, jnp.dtype(dtype)), dtype, f"blocks of {block}")


def test_a_mask_that_hides_whole_blocks_from_some_queries():
  """A selection-like mask: query 0 sees slots in the last block only, query 1 only slot 3 (the first block), the
  rest a scattered third of the slots: each query's running softmax starts wherever its first visible slot is."""
  q_nope, q_pe, cache, w_kv, _ = _problem(jnp.float32, 100, 4, 0, seed=1)
  visible = np.random.default_rng(0).random((2, 4, 100)) < 0.3
  visible[:, 0] = False
  visible[:, 0, 97] = True
  visible[:, 1] = False
  visible[:, 1, 3] = True
  visible = jnp.asarray(visible)
  got = blocked_naive_attention(q_nope, q_pe, cache, w_kv, visible, 0.3, jnp.float32, 32)
  assert_close(got, _whole(q_nope, q_pe, cache, w_kv, visible, jnp.float32), "float32", "scattered mask")


def test_the_models_naive_form_past_key_block_slots_equals_its_absorbed_form():
  """A V3 model (dense cache) with KEY_BLOCK + 300 slots: a 40-token chunk written at positions near the end,
  through the naive form (blocks: two, the second short) and the absorbed form (the latent never expanded), fp32:
  the same hidden states. The naive form's program loops over blocks there (a `cond` a block), and not at
  KEY_BLOCK slots (whole)."""
  cfg = jax_mtp.tiny(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0, dtype="float32",
                     num_hidden_layers=1, first_k_dense_replace=1)
  capacity = KEY_BLOCK + 300
  params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  model = TargetModel(cfg)
  ids = jax.random.randint(jax.random.key(1), (1, 40), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(capacity - 100 + jnp.arange(40), (1, 40))
  caches = init_target_caches(cfg, 1, capacity)
  caches = jax.tree.map(lambda x: jax.random.normal(jax.random.key(2), x.shape, x.dtype) * 0.5, caches)
  naive, absorbed = (model.apply({"params": params}, ids, positions, caches, absorb=a).hidden_BTD for a in (False, True))
  assert_close(naive, absorbed, "float32", "naive (blocks) vs absorbed")

  def naive_jaxpr(capacity):
    return str(jax.make_jaxpr(lambda c: model.apply({"params": params}, ids, positions % capacity, c, absorb=False))(
        init_target_caches(cfg, 1, capacity)))
  assert "cond[" in naive_jaxpr(capacity) and "cond[" not in naive_jaxpr(KEY_BLOCK)


def test_blocks_hold_a_fraction_of_the_whole_forms_temporaries():
  """The point of blocks: over 8,192 slots a 64-token chunk's compiled program asks for a fraction of the whole
  form's temporary memory (which holds the expanded cache and N × S scores a query)."""
  q_nope, q_pe, cache, w_kv, positions = _problem(jnp.float32, 8192, 64, 8128)
  visible = causal_mask(positions, 8192)
  temp = {name: fn.lower(q_nope, q_pe, cache, w_kv, visible).compile().memory_analysis().temp_size_in_bytes
          for name, fn in [("blocks", jax.jit(lambda *a: blocked_naive_attention(*a, 0.3, jnp.float32, 512))),
                           ("whole", jax.jit(lambda *a: _whole(*a, jnp.float32)))]}
  assert temp["blocks"] * 4 < temp["whole"], temp


def test_blocks_differentiate_as_the_whole_form():
  """Training runs the naive form (a V3 model past KEY_BLOCK tokens takes blocks): the gradients with respect to
  the queries and the expansion's weights equal the whole form's (fp32)."""
  q_nope, q_pe, cache, w_kv, positions = _problem(jnp.float32, 100, 6, 60, seed=2)
  visible = causal_mask(positions, 100)
  loss = lambda fn: lambda q, w: jnp.sum(jnp.sin(fn(q, q_pe, cache, w, visible)))  # noqa: E731
  blocks = jax.grad(loss(lambda *a: blocked_naive_attention(*a, 0.3, jnp.float32, 32)), argnums=(0, 1))(q_nope, w_kv)
  whole = jax.grad(loss(lambda *a: _whole(*a, jnp.float32)), argnums=(0, 1))(q_nope, w_kv)
  for got, want, what in zip(blocks, whole, ("d/dq", "d/dW")):
    assert_close(got, want, "float32", what)
