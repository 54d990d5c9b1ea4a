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
from jax_mtp.request import cache_bytes, device_free_bytes

# One chunk's per-query intermediates per device: larger chunks keep the experts' and attention's matmuls on the
# tensor cores (benchmarks/RESULTS.md, issue 27: the 32K prompt's chunks of 2,048 / 4,096 / 8,192 tokens)
PREFILL_CHUNK_BYTES = 8 * 2**30
# The radix top-k's per-slot words (jax_mtp.topk.topk_selection_radix): scores, visibility, keys, the
# above / tied masks and their two prefix sums, the ranks, the slot ids it scatters
TOPK_WORDS_PER_SLOT = 9
# The share of the memory left after the weights, the caches and the prompt's hidden states that a chunk's
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


def prefill_budget(cfg: MtpConfig, batch: int, capacity: int, prompt_len: int, devices) -> int:
  """The bytes `auto_prefill_chunk` may size a chunk's intermediates to: PREFILL_CHUNK_BYTES, or less on an
  accelerator whose allocator reports its limit (GPU, TPU), once the weights are placed and before the caches
  are: PREFILL_SHARE_OF_FREE of what its memory has left after the caches and the prompt's hidden states (the
  target's, which the MTP layer's catch-up reads: [B, T, D] in the compute dtype). A power of two, so that a few
  bytes more or less in use compile no other program. Without it an 80 GB H100 holding a 2-layer full-width V3.2
  target and its MTP layer (51 GiB) ran out of memory at B = 8 × 4K prompts in the 8 GiB budget's chunk of 2,048,
  where a chunk of 1,024 ran (benchmarks/RESULTS.md, 2026-12-07). A CPU keeps the fixed budget: its memory is the
  host's, which pages."""
  device = next((d for d in devices if d.process_index == jax.process_index()), None)
  if device is None or device.platform == "cpu" or cfg.prefill_chunk:
    return PREFILL_CHUNK_BYTES
  free = device_free_bytes(device)
  if free is None:
    return PREFILL_CHUNK_BYTES
  hidden = batch * prompt_len * cfg.hidden_size * jnp.dtype(cfg.dtype).itemsize
  left = int((free - cache_bytes(cfg, batch, capacity) - hidden) * PREFILL_SHARE_OF_FREE)
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


def apply_in_chunks(apply_chunk, inputs, caches, chunk: int, *, whole_chunks: bool = False):
  """Runs `apply_chunk(inputs_chunk, positions_BC, caches) -> (outputs, caches)` over `inputs` (a
  pytree of [B, ≤ T, ...] arrays at positions 0..T−1, T the longest) `chunk` tokens at a time, in one loop.

  Each chunk's inputs are sliced out of `inputs` (zero-padded once to whole chunks) and its outputs written into
  one [B, T, ...] buffer the loop carries, so the prompt-wide arrays are held once each: splitting them into a
  [n, B, chunk, ...] stack and joining the outputs back were two more copies of the prompt's hidden states (4 of
  them in the speculator's prefill, 15 GB at B = 64 × 4K on V3.2's width, more than an 80 GB GPU holding a 2-layer
  target and its MTP layer had left).

  Returns (outputs [B, T, ...] — with `whole_chunks`, [B, whole chunks' tokens ≥ T, ...], its tail padding, which
  another call's inputs take as they are instead of a sliced and re-padded copy — and the caches)."""
  b, t = jax.tree.leaves(inputs)[0].shape[0], max(x.shape[1] for x in jax.tree.leaves(inputs))
  if t <= chunk:
    return apply_chunk(inputs, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), caches)
  n = -(-t // chunk)
  padded = jax.tree.map(lambda x: x if x.shape[1] == n * chunk else
                        jnp.pad(x, [(0, 0), (0, n * chunk - x.shape[1])] + [(0, 0)] * (x.ndim - 2)), inputs)

  def positions(i):
    return jnp.broadcast_to(i * chunk + jnp.arange(chunk, dtype=jnp.int32), (b, chunk))

  def chunk_of(i):
    return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i * chunk, chunk, axis=1), padded)

  out_types = jax.eval_shape(lambda x, c: apply_chunk(x, positions(0), c)[0], chunk_of(0), caches)
  outputs = jax.tree.map(lambda s: jnp.zeros((b, n * chunk, *s.shape[2:]), s.dtype), out_types)

  def body(i, carry):
    caches, outputs = carry
    out_chunk, caches = apply_chunk(chunk_of(i), positions(i), caches)
    return caches, jax.tree.map(lambda o, y: jax.lax.dynamic_update_slice_in_dim(o, y, i * chunk, axis=1), outputs,
                                out_chunk)

  caches, outputs = jax.lax.fori_loop(0, n, body, (caches, outputs))
  return (outputs if whole_chunks else jax.tree.map(lambda y: y[:, :t], outputs)), caches


def target_prefill(target: TargetModel, t_vars: dict, prompt_BT, lengths_B, capacity: int, *,
                   budget: int = PREFILL_CHUNK_BYTES, whole_chunks: bool = False):
  """Runs the padded prompts at positions 0..T−1 into fresh caches, in chunks of `prefill_plan`'s size for
  `budget`.

  Returns (hidden [B, T, D] — with `whole_chunks`, padded to whole chunks as `apply_in_chunks` leaves it —,
  hidden of each row's last prompt token [B, 1, D], caches).
  """
  cfg, b = target.cfg, prompt_BT.shape[0]
  chunk, absorb = prefill_plan(cfg, b, capacity, target.tp, budget)

  def run(ids_BC, positions_BC, caches):
    out = target.apply(t_vars, ids_BC, positions_BC, caches, absorb=absorb)
    return out.hidden_BTD, out.caches

  hidden_BTD, caches = apply_in_chunks(run, prompt_BT, init_target_caches(cfg, b, capacity), chunk,
                                       whole_chunks=whole_chunks)
  last_B1D = jnp.take_along_axis(hidden_BTD, (lengths_B - 1)[:, None, None], axis=1)
  return hidden_BTD, last_B1D, caches
