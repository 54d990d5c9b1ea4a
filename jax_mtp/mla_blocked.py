"""MLA's naive form over a long dense cache, a block of slots at a time (`MLAttention._naive` past KEY_BLOCK slots).

The naive form expands the latent cache by kv_b_proj into per-head keys and values and attends over them. Whole,
that is [B, S, N, P + H] expanded and N × S fp32 scores and probabilities a query: over a V3 model's 32K-slot cache
2 GiB of expansion a row and 32 MiB a query, which left a prompt's prefill chunks of 128 tokens, each expanding the
whole cache again (`prefill.dense_cache_plan`: by count ~3× the attention's own multiply-adds). Here the slots go
KEY_BLOCK at a time (vLLM's MLA prefill up-projects its cached context in chunks the same way): each block is
expanded, scored and folded into a running softmax (its max, its sum, the fp32 output: flash attention's
recurrence), so a chunk holds one block's expansion and N × KEY_BLOCK scores a query, whatever S, and blocks past
the chunk's last visible slot are skipped. The same products as the whole form, in the model's dtype with fp32 sums;
the softmax's sums fall in another order, and the probabilities meet the values unnormalised (≤ 1, divided by the
sum at the end) where the whole form rounds the normalised ones: within rounding of it (tests/test_mla_blocked.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mtp.cache import LayerCache
from jax_mtp.kernels.sparse_mla import dequantize_latent

KEY_BLOCK = 2048  # slots a block: the naive form of a cache up to this size runs whole (V3.2's are ≤ index_topk)
_HIGHEST = jax.lax.Precision.HIGHEST


def naive_scores(q_nope_BTNP, q_pe_BTNR, k_nope_BSNP, k_pe_BSR) -> jax.Array:
  """fp32 [B, N, T, S] unscaled: q_nope · k_nope + q_pe · k_pe, the rope key shared by the heads (the naive form's
  scores, whole in `mla.naive_attention` or a block at a time here)."""
  return (jnp.einsum("btnp,bsnp->bnts", q_nope_BTNP, k_nope_BSNP, precision=_HIGHEST, preferred_element_type=jnp.float32)
          + jnp.einsum("btnr,bsr->bnts", q_pe_BTNR, k_pe_BSR, precision=_HIGHEST, preferred_element_type=jnp.float32))


def blocked_naive_attention(q_nope_BTNP, q_pe_BTNR, cache: LayerCache, w_kv_CNK: jax.Array, visible_BTS, scale,
                            dtype, block: int = KEY_BLOCK) -> jax.Array:
  """fp32 [B, T, N, H]: softmax(scale · (q_nope · k_nope + q_pe · k_pe)) over the visible slots, times the values,
  with k_nope and v = the latent expanded by `w_kv_CNK` (kv_b_proj's kernel [C, N, P + H]) in `dtype`, `block`
  slots at a time. Every query sees at least one slot (its own). The cache's capacity S ≥ block; a last block short
  of `block` slots is read as the cache's last `block` slots, the ones before it masked out. Inside the loop S and K
  name a block's slots and the expanded width P + H, as `MLAttention._naive` names the whole cache's."""
  b, s, _ = cache.latent_BSC.shape
  p, n = q_nope_BTNP.shape[-1], q_nope_BTNP.shape[2]
  h = w_kv_CNK.shape[-1] - p
  t = q_nope_BTNP.shape[1]
  blocks = -(-s // block)
  last_visible = jnp.max(jnp.where(visible_BTS, jnp.arange(s), -1))  # the furthest slot any query of the chunk sees
  w_kv_CNK = w_kv_CNK.astype(dtype)

  def attend_block(i, carry):
    max_BNT, sum_BNT, out_BTNH = carry
    start = jnp.minimum(i * block, s - block)  # a short last block overlaps its predecessor's slots, masked here
    slots_S = start + jnp.arange(block)
    latent_BSC = jax.lax.dynamic_slice_in_dim(cache.latent_BSC, start, block, axis=1)
    if cache.latent_scale_BSG is not None:
      scale_BSG = jax.lax.dynamic_slice_in_dim(cache.latent_scale_BSG, start, block, axis=1)
      latent_BSC = dequantize_latent(latent_BSC, scale_BSG, dtype)
    kv_BSNK = jnp.einsum("bsc,cnk->bsnk", latent_BSC.astype(dtype), w_kv_CNK, precision=_HIGHEST,
                         preferred_element_type=jnp.float32).astype(dtype)  # as kv_b_proj's Linear computes it
    k_pe_BSR = jax.lax.dynamic_slice_in_dim(cache.k_pe_BSR, start, block, axis=1)
    block_visible_BTS = (jax.lax.dynamic_slice_in_dim(visible_BTS, start, block, axis=2)
                         & (slots_S >= i * block)[None, None])
    scores_BNTS = naive_scores(q_nope_BTNP, q_pe_BTNR, kv_BSNK[..., :p], k_pe_BSR) * scale
    scores_BNTS = jnp.where(block_visible_BTS[:, None], scores_BNTS, -jnp.inf)
    new_max_BNT = jnp.maximum(max_BNT, jnp.max(scores_BNTS, axis=-1))
    shift_BNT = jnp.where(jnp.isneginf(new_max_BNT), 0.0, new_max_BNT)  # nothing visible yet: no shift
    probs_BNTS = jnp.exp(scores_BNTS - shift_BNT[..., None])
    rescale_BNT = jnp.exp(max_BNT - shift_BNT)  # 0 where nothing was visible before
    pv_BTNH = jnp.einsum("bnts,bsnh->btnh", probs_BNTS.astype(dtype), kv_BSNK[..., p:], precision=_HIGHEST,
                         preferred_element_type=jnp.float32)
    return (new_max_BNT, sum_BNT * rescale_BNT + jnp.sum(probs_BNTS, axis=-1),
            out_BTNH * rescale_BNT.transpose(0, 2, 1)[..., None] + pv_BTNH)

  def maybe_attend(i, carry):  # blocks past every visible slot cost nothing (a static loop: differentiable)
    return jax.lax.cond(i * block <= last_visible, attend_block, lambda _, c: c, i, carry)

  init = (jnp.full((b, n, t), -jnp.inf, jnp.float32), jnp.zeros((b, n, t), jnp.float32),
          jnp.zeros((b, t, n, h), jnp.float32))
  _, sum_BNT, out_BTNH = jax.lax.fori_loop(0, blocks, maybe_attend, init)
  return out_BTNH / sum_BNT.transpose(0, 2, 1)[..., None]
