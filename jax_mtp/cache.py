"""Per-layer decode caches: the MLA latent cache and the DSA indexer's key cache.

The MLA cache holds each token's latent and rope key in the compute dtype, in bfloat16, or (`kv_cache_dtype` "fp8",
the layout vLLM calls fp8_ds_mla and FlashMLA reads) as float8_e4m3fn latent codes with one fp32 scale per
`MtpConfig.kv_scale_group` (128) latent values and the rope key in the compute dtype: 512 + 4·4 + 64·2 = 656 bytes a
token at DeepSeek-V3.2's widths against 1,152 in bf16. `jax_mtp.mla` quantises where it writes and dequantises what it
reads.

A cache slot `s` holds the token at position `s`. Tokens are written at their positions and a
query at position p reads slots 0..p, so rolling a sequence back to length L needs no copy: the
next tokens are written from position L on and overwrite the stale slots before anyone reads them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_mtp.config import MtpConfig
from jax_mtp.request import validate_positive


class LayerCache(NamedTuple):
  """Caches of one decoder layer; S = cache capacity in positions.

  latent_BSC: kv_a_layernorm(c) — the normalised MLA latent, [B, S, C] in `cfg.mla_cache_dtype` (float8 codes
              with an fp8 cache: latent = codes · scale, per group of `cfg.kv_scale_group` values).
  k_pe_BSR:   the rotated (interleaved RoPE) shared key part, [B, S, R] (the compute dtype with an fp8 cache).
  index_k_BSJ: the indexer's key (LayerNorm + RoPE), [B, S, J] in `cfg.index_key_dtype`; None
               without an indexer (deepseek_v3). Not a [B, S, 0] array: jaxlib 0.11.2's CPU compiler
               segfaults on a zero-sized array carried through the sharded decode loop.
  index_k_scale_BS: fp32 [B, S], each token's key scale when the keys are stored in float8 (key =
               stored · scale), else None.
  latent_scale_BSG: fp32 [B, S, C / kv_scale_group] (G: the latent's scale groups), the scales of an fp8
               latent cache, else None.
  """

  latent_BSC: jax.Array
  k_pe_BSR: jax.Array
  index_k_BSJ: jax.Array | None
  index_k_scale_BS: jax.Array | None = None
  latent_scale_BSG: jax.Array | None = None

  @property
  def capacity(self) -> int:
    return self.latent_BSC.shape[1]


def init_layer_cache(cfg: MtpConfig, batch: int, capacity: int) -> LayerCache:
  """Zeroed caches for `batch` sequences of up to `capacity` positions."""
  validate_positive("batch", batch)
  validate_positive("capacity", capacity)
  fp8_keys, fp8_latent = cfg.index_key_dtype == "float8_e4m3fn", cfg.kv_cache_dtype == "fp8"
  rope_dtype = cfg.dtype if fp8_latent else cfg.mla_cache_dtype
  groups = cfg.kv_lora_rank // cfg.kv_scale_group
  return LayerCache(
      latent_BSC=jnp.zeros((batch, capacity, cfg.kv_lora_rank), cfg.mla_cache_dtype),
      k_pe_BSR=jnp.zeros((batch, capacity, cfg.qk_rope_head_dim), rope_dtype),
      index_k_BSJ=(jnp.zeros((batch, capacity, cfg.index_head_dim), cfg.index_key_dtype) if cfg.has_indexer
                   else None),
      index_k_scale_BS=jnp.zeros((batch, capacity), jnp.float32) if cfg.has_indexer and fp8_keys else None,
      latent_scale_BSG=jnp.zeros((batch, capacity, groups), jnp.float32) if fp8_latent else None,
  )


def write_at_positions(cache_BS_: jax.Array, new_BT_: jax.Array, positions_BT: jax.Array) -> jax.Array:
  """cache[b, positions[b, t]] = new[b, t] for every (b, t)."""
  batch_idx = jnp.arange(cache_BS_.shape[0])[:, None]
  return cache_BS_.at[batch_idx, positions_BT].set(new_BT_.astype(cache_BS_.dtype))


def causal_mask(positions_BT: jax.Array, capacity: int) -> jax.Array:
  """bool [B, T, S]: slot s is visible to the query at position p iff s ≤ p."""
  return jnp.arange(capacity)[None, None, :] <= positions_BT[:, :, None]
