"""The vocab-parallel embedding lookup and head, shared by the target model and the MTP predictor.

Both models hold an `embed_tokens` and an `lm_head` of [Vp, D] (Vp = vocab padded to a multiple of
tp); under tp each device holds Vp/tp consecutive rows (jax_mtp.sharding). The speculator passes the
target's two arrays into the predictor's params, so one copy serves both (as vLLM shares them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mtp.kernels.vocab_argmax import vocab_parallel_argmax
from jax_mtp.sharding import TensorParallel

_HIGHEST = jax.lax.Precision.HIGHEST


def embed_lookup(table_VD: jax.Array, ids_BT: jax.Array, tp: TensorParallel, dtype) -> jax.Array:
  """Rows of `table` at `ids`, [B, T, D] in `dtype`; under tp each device looks up its own rows
  (others' ids give 0) and a psum assembles them."""
  if tp.axis is None:
    return jnp.take(table_VD, ids_BT, axis=0).astype(dtype)
  rows = table_VD.shape[0]
  local_BT = ids_BT - jax.lax.axis_index(tp.axis) * rows
  mine_BT = (local_BT >= 0) & (local_BT < rows)
  embeds_BTD = jnp.take(table_VD, jnp.clip(local_BT, 0, rows - 1), axis=0).astype(dtype)
  return jax.lax.psum(jnp.where(mine_BT[..., None], embeds_BTD, 0), tp.axis)


def head_logits(hidden_BTD: jax.Array, head_VD: jax.Array, tp: TensorParallel, vocab_size: int) -> jax.Array:
  """Full-vocab logits fp32 [B, T, V]; under tp the shards' logits are all-gathered over the vocab."""
  logits_BTV = jnp.einsum("btd,vd->btv", hidden_BTD, head_VD.astype(hidden_BTD.dtype), precision=_HIGHEST,
                          preferred_element_type=jnp.float32)
  if tp.axis is not None:
    logits_BTV = jax.lax.all_gather(logits_BTV, tp.axis, axis=2, tiled=True)
  return logits_BTV[..., :vocab_size]


def head_top_tokens(hidden_BTD: jax.Array, head_VD: jax.Array, tp: TensorParallel, vocab_size: int) -> jax.Array:
  """Greedy tokens int32 [B, T] = argmax(head_logits) (ties → lowest id); under tp the shards
  reduce (value, index) pairs and never gather the logits (Opt-2)."""
  if tp.axis is None:
    return jnp.argmax(head_logits(hidden_BTD, head_VD, tp, vocab_size), axis=-1).astype(jnp.int32)
  b, t, d = hidden_BTD.shape
  tokens_T = vocab_parallel_argmax(hidden_BTD.reshape(b * t, d), head_VD, vocab_size=vocab_size, axis_name=tp.axis)
  return tokens_T.reshape(b, t)
