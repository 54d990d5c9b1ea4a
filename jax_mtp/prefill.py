"""Prompt prefill in chunks: a long prompt runs through the model `chunk` tokens at a time, each
chunk at its own positions into the same caches, so memory is bounded by the chunk, not the prompt.

A chunk's queries see the slots every earlier chunk wrote (positions < theirs) and their own, as in
one call over the whole prompt (jax_mtp.cache: slot s holds position s). The prompt is padded to a
whole number of chunks; padding tokens sit at positions ≥ its length, which the cache contract
already treats as stale (overwritten before they are read) and writes past the capacity drop.

MLA's form per chunk: with a DSA cache (capacity > index_topk) the sparse absorbed form — each query
attends over its ≤ index_topk selected entries, as vLLM's sparse FlashMLA prefill does — since the
naive form would expand kv_b_proj over every slot and score all of them for every chunk; dense
caches (V3, or capacity ≤ index_topk) keep the naive form. The chunk size comes from
`cfg.prefill_chunk`, or (0) from `auto_prefill_chunk`: the largest power of two ≤ 8192 whose
attention intermediates fit PREFILL_CHUNK_BYTES.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mtp.config import MtpConfig
from jax_mtp.indexer import selects_all
from jax_mtp.mla import resolve_sparse_attention_impl
from jax_mtp.model import TargetModel, init_target_caches
from jax_mtp.platform import lowering_gpu_is_hopper, lowering_platform
from jax_mtp.request import caches_against_free_memory

# One chunk's per-query intermediates per device: larger chunks keep the experts' and attention's matmuls on the
# tensor cores (benchmarks/RESULTS.md, issue 27: the 32K prompt's chunks of 2,048 / 4,096 / 8,192 tokens)
PREFILL_CHUNK_BYTES = 8 * 2**30
# The radix top-k's per-slot words (jax_mtp.topk.topk_selection_radix): scores, visibility, keys, the
# above / tied masks and their two prefix sums, the ranks, the slot ids it scatters
TOPK_WORDS_PER_SLOT = 9
# The share of the memory left after the weights and the caches that a chunk's
# intermediates may count on: the per-query count below is an estimate (XLA's temporaries for a chunk came to
# 0.9–1.4× it on an H100, 2026-12-07), and the allocator needs room to place them
PREFILL_SHARE_OF_FREE = 0.5
_MIN_CHUNK, _MAX_CHUNK = 16, 8192


def prefill_absorb(cfg: MtpConfig, capacity: int) -> bool:
  """MLA's form for prefill chunks: absorbed (sparse) for DSA caches, naive for dense ones."""
  return not selects_all(cfg, capacity)


def auto_prefill_chunk(cfg: MtpConfig, batch: int, capacity: int, local_heads: int,
                       budget: int = PREFILL_CHUNK_BYTES) -> int:
  """Tokens per row per chunk: the largest power of two in [16, 8192] whose per-query intermediates fit
  `budget` bytes for `batch` rows. Per query: with a dense cache (naive form) N × S fp32 scores and
  probabilities; with a DSA cache the indexer's fp32 scores over the S slots and the top-k's temporaries
  (TOPK_WORDS_PER_SLOT words a slot), plus XLA's sparse attention's K gathered [latent; k_pe] entries and
  N × K fp32 scores and probabilities — or, where the fused kernel runs it (it gathers in registers), only
  its [N, C] fp32 output."""
  if not prefill_absorb(cfg, capacity):
    per_token = 2 * local_heads * capacity * 4
  else:
    k, topk_bytes = cfg.index_topk, TOPK_WORDS_PER_SLOT * 4 * capacity
    impl = resolve_sparse_attention_impl(cfg, lowering_platform(), hopper=lowering_gpu_is_hopper())
    per_token = topk_bytes + (k * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4 + 2 * local_heads * k * 4
                              if impl == "xla" else local_heads * cfg.kv_lora_rank * 4)
  chunk = _MAX_CHUNK
  while chunk > _MIN_CHUNK and batch * chunk * per_token > budget:
    chunk //= 2
  return chunk


def prefill_budget(cfg: MtpConfig, batch: int, capacity: int, devices) -> int:
  """The bytes `auto_prefill_chunk` may size a chunk's intermediates to: PREFILL_CHUNK_BYTES, or less on an
  accelerator whose allocator reports its limit (GPU, TPU), once the weights are placed and before the caches
  are: PREFILL_SHARE_OF_FREE of what its memory has left after the caches. A power of two, so that a few bytes
  more or less in use compile no other program. With the fixed budget an 80 GB H100 holding a 2-layer full-width
  V3.2 target and its MTP layer (51 GiB) ran out of memory at B = 8 × 4K prompts in its chunk of 2,048, where a
  chunk of 1,024 ran (benchmarks/RESULTS.md, 2026-12-07). A CPU keeps the fixed budget: its memory is the host's,
  which pages."""
  device, caches, free = caches_against_free_memory(cfg, batch, capacity, devices)
  if free is None or device.platform == "cpu" or cfg.prefill_chunk:
    return PREFILL_CHUNK_BYTES
  left = int((free - caches) * PREFILL_SHARE_OF_FREE)
  return min(PREFILL_CHUNK_BYTES, 1 << max(left, 1).bit_length() - 1)


def prefill_chunk(cfg: MtpConfig, batch: int, capacity: int, local_heads: int,
                  budget: int = PREFILL_CHUNK_BYTES) -> int:
  return cfg.prefill_chunk or auto_prefill_chunk(cfg, batch, capacity, local_heads, budget)


def prefill_plan(cfg: MtpConfig, batch: int, capacity: int, tp, budget: int = PREFILL_CHUNK_BYTES) -> tuple[int, bool]:
  """(tokens per chunk, MLA's absorbed form?) of a prompt prefill — the target's and the drafter's
  (the MTP layer has the target's heads) — under the `TensorParallel` `tp`, its intermediates sized to `budget`
  bytes (`prefill_budget`)."""
  heads = tp.local(cfg.num_attention_heads, "num_attention_heads")
  return prefill_chunk(cfg, batch, capacity, heads, budget), prefill_absorb(cfg, capacity)


def apply_in_chunks(apply_chunk, inputs, caches, chunk: int):
  """Runs `apply_chunk(inputs_chunk, positions_BC, caches) -> (outputs, caches)` over `inputs` (a
  pytree of [B, T, ...] arrays at positions 0..T−1) `chunk` tokens at a time, in one scan.

  Returns (outputs concatenated back to [B, T, ...], caches)."""
  b, t = jax.tree.leaves(inputs)[0].shape[:2]
  if t <= chunk:
    return apply_chunk(inputs, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), caches)
  n = -(-t // chunk)

  def split(x):  # [B, T, ...] → [n, B, chunk, ...], zero-padded to n · chunk tokens
    x = jnp.pad(x, [(0, 0), (0, n * chunk - t)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(b, n, chunk, *x.shape[2:]).swapaxes(0, 1)

  def body(caches, xs):
    i, inputs_chunk = xs
    positions_BC = jnp.broadcast_to(i * chunk + jnp.arange(chunk, dtype=jnp.int32), (b, chunk))
    outputs, caches = apply_chunk(inputs_chunk, positions_BC, caches)
    return caches, outputs

  caches, outputs = jax.lax.scan(body, caches, (jnp.arange(n, dtype=jnp.int32), jax.tree.map(split, inputs)))
  join = lambda y: y.swapaxes(0, 1).reshape(b, n * chunk, *y.shape[3:])[:, :t]  # noqa: E731
  return jax.tree.map(join, outputs), caches


def with_last_hidden(hidden_BCD, positions_BC, lengths_B, last_B1D):
  """`last_B1D` with each row's hidden state at its last prompt position (length − 1) taken from this chunk where
  the chunk holds it: a chunked prefill's last hidden states without the prompt-wide ones."""
  offset_B = lengths_B - 1 - positions_BC[:, 0]
  held_B = (offset_B >= 0) & (offset_B < hidden_BCD.shape[1])
  picked_B1D = jnp.take_along_axis(hidden_BCD, jnp.clip(offset_B, 0, hidden_BCD.shape[1] - 1)[:, None, None], axis=1)
  return jnp.where(held_B[:, None, None], picked_B1D, last_B1D)


def target_prefill(target: TargetModel, t_vars: dict, prompt_BT, lengths_B, capacity: int, *,
                   budget: int = PREFILL_CHUNK_BYTES):
  """Runs the padded prompts at positions 0..T−1 into fresh caches, in chunks of `prefill_plan`'s size for
  `budget`.

  Returns (hidden [B, T, D], hidden of each row's last prompt token [B, 1, D], caches).
  """
  cfg, b = target.cfg, prompt_BT.shape[0]
  chunk, absorb = prefill_plan(cfg, b, capacity, target.tp, budget)

  def run(ids_BC, positions_BC, caches):
    out = target.apply(t_vars, ids_BC, positions_BC, caches, absorb=absorb)
    return out.hidden_BTD, out.caches

  hidden_BTD, caches = apply_in_chunks(run, prompt_BT, init_target_caches(cfg, b, capacity), chunk)
  last_B1D = jnp.take_along_axis(hidden_BTD, (lengths_B - 1)[:, None, None], axis=1)
  return hidden_BTD, last_B1D, caches
