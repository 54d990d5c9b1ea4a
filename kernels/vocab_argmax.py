"""Opt-2: greedy tokens from a vocab-parallel head without gathering the logits.

Each of the tp devices holds `head_shard` [Vs, D], rows `shard·Vs … (shard+1)·Vs − 1` of the
(padded) head. Per device:

    logits = h @ head_shardᵀ            fp32 accumulate, [T, Vs]; padded rows (id ≥ vocab) → −inf
    i      = argmax(logits)             first maximum, or first NaN (jnp.argmax semantics)
    pair   = (bits(logits[i]), shard·Vs + i)          int32 [T, 2]

then ONE all-gather of the pairs (tp·T·2·4 bytes, independent of the vocab) and a local select:
if any shard's value is NaN the lowest NaN index wins (jnp.argmax returns the first NaN), else the
largest value with ties to the lowest global index (±0 compare equal, as in jnp.argmax). Because
each shard already returns its first maximum and shards are ordered, this equals `jnp.argmax` over
the gathered row bit for bit. pmax-then-pmin would need two all-reduces and mishandles NaN.

`reference` is the spec: all-gather the logits, `jnp.argmax`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

IMPLS = ("xla",)
_INT32_MAX = jnp.iinfo(jnp.int32).max


def shard_logits(h_TD: jax.Array, head_shard_VD: jax.Array, vocab_size: int, axis_name: str) -> jax.Array:
  """This device's logits [T, Vs] in fp32, padded vocab rows set to −inf."""
  vs = head_shard_VD.shape[0]
  logits = jnp.einsum("td,vd->tv", h_TD, head_shard_VD.astype(h_TD.dtype), precision=lax.Precision.HIGHEST,
                      preferred_element_type=jnp.float32)
  global_ids = lax.axis_index(axis_name) * vs + jnp.arange(vs)
  return jnp.where(global_ids < vocab_size, logits, -jnp.inf)


def reference(h_TD, head_shard_VD, *, vocab_size: int, axis_name: str) -> jax.Array:
  """The spec: gather the full logits row, `jnp.argmax`. int32 [T], replicated."""
  logits = lax.all_gather(shard_logits(h_TD, head_shard_VD, vocab_size, axis_name), axis_name, axis=1,
                          tiled=True)
  return jnp.argmax(logits[:, :vocab_size], axis=-1).astype(jnp.int32)


def argmax_over_shards(local_logits_TV: jax.Array, *, axis_name: str) -> jax.Array:
  """Global argmax of logits sharded along V over `axis_name`, via one all-gather of (value, index)."""
  vs = local_logits_TV.shape[-1]
  local_idx = jnp.argmax(local_logits_TV, axis=-1)
  value = jnp.take_along_axis(local_logits_TV, local_idx[:, None], axis=-1)[:, 0].astype(jnp.float32)
  global_idx = (lax.axis_index(axis_name) * vs + local_idx).astype(jnp.int32)
  pairs_T2 = jnp.stack([lax.bitcast_convert_type(value, jnp.int32), global_idx], axis=-1)
  gathered_PT2 = lax.all_gather(pairs_T2, axis_name)  # P = tp shards
  return select_winner(lax.bitcast_convert_type(gathered_PT2[..., 0], jnp.float32), gathered_PT2[..., 1])


def select_winner(values_PT: jax.Array, indices_PT: jax.Array) -> jax.Array:
  """jnp.argmax semantics over candidates: first NaN, else max value, ties → lowest index."""
  is_nan = jnp.isnan(values_PT)
  best = jnp.max(jnp.where(is_nan, -jnp.inf, values_PT), axis=0)
  candidates = jnp.where(jnp.any(is_nan, axis=0), is_nan, values_PT == best)
  return jnp.min(jnp.where(candidates, indices_PT, _INT32_MAX), axis=0).astype(jnp.int32)


def check_operands(h_TD: jax.Array, head_shard_VD: jax.Array, vocab_size: int) -> None:
  if h_TD.ndim != 2 or head_shard_VD.ndim != 2:
    raise ValueError(f"h must be [T, D] and head_shard [Vs, D], got {h_TD.shape} and {head_shard_VD.shape}")
  if h_TD.shape[1] != head_shard_VD.shape[1]:
    raise ValueError(f"h has D={h_TD.shape[1]} but head_shard has D={head_shard_VD.shape[1]}")
  if vocab_size < 1:
    raise ValueError(f"vocab_size={vocab_size} must be ≥ 1")


def vocab_parallel_argmax(h_TD, head_shard_VD, *, vocab_size: int, axis_name: str, impl: str = "xla"):
  """Greedy token ids int32 [T] (replicated) from a vocab-sharded head. Call inside `shard_map`."""
  check_operands(h_TD, head_shard_VD, vocab_size)
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
  shards = lax.axis_size(axis_name)
  if vocab_size > shards * head_shard_VD.shape[0]:
    raise ValueError(f"vocab_size={vocab_size} exceeds the {shards} x {head_shard_VD.shape[0]} head rows")
  return argmax_over_shards(shard_logits(h_TD, head_shard_VD, vocab_size, axis_name), axis_name=axis_name)
