"""Prompt prefill in chunks: a long prompt runs through the model `chunk` tokens at a time, each
chunk at its own positions into the same caches, so memory is bounded by the chunk, not the prompt.

A chunk's queries see the slots every earlier chunk wrote (positions < theirs) and their own, as in
one call over the whole prompt (jax_mtp.cache: slot s holds position s). The prompt is padded to a
whole number of chunks; padding tokens sit at positions ≥ its length, which the cache contract
already treats as stale (overwritten before they are read) and writes past the capacity drop.

MLA's form per chunk (`prefill_plan`): with a DSA cache (capacity > index_topk) the sparse absorbed form — each
query attends over its ≤ index_topk selected entries, as vLLM's sparse FlashMLA prefill does — since the naive form
would expand kv_b_proj over every slot and score all of them for every chunk; dense caches (V3, or capacity ≤
index_topk) take the naive form unless its expansion does not fit or costs more than the absorbed form
(`dense_cache_plan`). The chunk size comes from `cfg.prefill_chunk`, or (0) from `auto_prefill_chunk`: the largest
power of two ≤ 8192 whose attention intermediates fit the budget (PREFILL_CHUNK_BYTES, or `prefill_budget`'s).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mtp.config import MtpConfig
from jax_mtp.distributed import smallest_over_devices
from jax_mtp.indexer import selects_all
from jax_mtp.mla import attends_every_slot_by_kernel, resolve_sparse_attention_impl
from jax_mtp.mla_blocked import KEY_BLOCK
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


def auto_prefill_chunk(cfg: MtpConfig, batch: int, capacity: int, local_heads: int,
                       budget: int = PREFILL_CHUNK_BYTES, tokens: int | None = None) -> int:
  """Tokens per row per chunk: the largest power of two in [16, 8192] whose per-query intermediates (and, in the
  naive form, its expansion of the cache) fit `budget` bytes for `batch` rows. Per query: over a DSA cache the
  indexer's fp32 scores over the S slots and the top-k's temporaries (TOPK_WORDS_PER_SLOT words a slot), plus XLA's
  sparse attention's K gathered [latent; k_pe] entries and N × K fp32 scores and probabilities — or, where the fused
  kernel runs it (it gathers in registers), only its [N, C] fp32 output. Over a dense cache: `dense_cache_plan`."""
  if selects_all(cfg, capacity):
    return dense_cache_plan(cfg, batch, capacity, local_heads, tokens, budget)[0]
  k, topk_bytes = cfg.index_topk, TOPK_WORDS_PER_SLOT * 4 * capacity
  impl = resolve_sparse_attention_impl(cfg, lowering_platform(), hopper=lowering_gpu_is_hopper())
  per_token = topk_bytes + (k * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4 + 2 * local_heads * k * 4
                            if impl == "xla" else local_heads * cfg.kv_lora_rank * 4)
  return _largest_chunk(batch * per_token, budget)


def dense_cache_plan(cfg: MtpConfig, batch: int, capacity: int, heads: int, tokens: int | None = None,
                     budget: int = PREFILL_CHUNK_BYTES) -> tuple[int, bool]:
  """(tokens per row per chunk, absorbed?) of a prefill over a dense cache (no selection: every visible slot is
  attended) of `capacity` slots for a `tokens`-token prompt (None: as long as the cache), each form's chunk the
  largest that fits `budget` bytes:
    naive     kv_b_proj expands the whole cache each chunk, [B, S, N, P + H] in the model's dtype (at B = 64 over a
              1K prompt's 1,283 slots, 5.0 GiB a layer: an 80 GB H100 holding a 2-layer V3.2 in bf16 ran out of
              memory in it on 2026-12-07, when this budget counted only the N × S fp32 scores and probabilities a
              query); then those N × S scores and probabilities a query. Past KEY_BLOCK slots (V3 models' long
              prompts) a block of slots at a time (`jax_mtp.mla_blocked`): one block's expansion, N × KEY_BLOCK
              scores a query, and only the blocks up to the chunk's last position, so its chunks grow to thousands
              of tokens where whole they were 128 (a 32K cache's 32 MiB of scores a query) and each expanded it all;
    absorbed  the sparse-MLA kernel over every visible slot where it runs the model's absorbed calls
              (`mla.attends_every_slot_by_kernel`): q~ [N, C] in fp32 and in the kernel's 16-bit dtype, its 16-bit
              output, and the [S] selection (ids, their padded copy, the mask) a query; else XLA's
              `dense_latent_attention`: N × S fp32 scores and probabilities and the probabilities' two 16-bit parts.
  The naive form, unless it does not fit at its smallest chunk (then the absorbed form, whatever it costs) or the
  prompt takes several of its chunks and the absorbed form counts fewer multiply-adds (`_attention_macs`): the naive
  form pays its expansion once a chunk, so it loses where the memory leaves it chunks much shorter than the prompt
  (at B = 64 over 1,283 slots, 32 expansions for 1,024 tokens). In one chunk it stays whatever the count says: that
  is the form's purpose (prefill expands keys once a token), and at a small model's proportions (P + R + H = 2C + R)
  the count would take the absorbed form at any S > T. Counted, not timed: both forms run on the tensor cores
  (cuBLAS's GEMMs, the kernel's wgmma)."""
  tokens = capacity if tokens is None else tokens
  itemsize = jnp.dtype(cfg.dtype).itemsize
  dequantised = batch * capacity * cfg.kv_lora_rank * itemsize if cfg.mla_cache_dtype != cfg.dtype else 0
  # past KEY_BLOCK slots the naive form expands and scores a block at a time (jax_mtp.mla_blocked): one block's
  # expansion, N × KEY_BLOCK scores a query and its running output, fp32 [N, H] and the block's [N, H] products
  keys = min(capacity, KEY_BLOCK)
  expansion = (batch * keys * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * itemsize
               + (dequantised * keys // capacity))
  naive_token = 2 * heads * keys * 4 + (2 * heads * cfg.v_head_dim * 4 if capacity > KEY_BLOCK else 0)
  by_kernel = attends_every_slot_by_kernel(cfg, queries=batch * (cfg.prefill_chunk or _MIN_CHUNK))
  absorbed_token = (heads * cfg.kv_lora_rank * (4 + 2 * itemsize) + capacity * 9 if by_kernel
                    else 2 * heads * capacity * (4 + itemsize))
  absorbed_fixed = 0 if by_kernel else dequantised
  naive = cfg.prefill_chunk or _largest_chunk(batch * naive_token, budget - expansion)
  absorbed = cfg.prefill_chunk or _largest_chunk(batch * absorbed_token, budget - absorbed_fixed)
  if expansion + batch * naive * naive_token > budget:  # not even the smallest chunk fits
    return absorbed, True
  passes = 1 if by_kernel or jnp.dtype(cfg.dtype) == jnp.float32 else 2  # split16's two parts a dot
  if tokens > naive and (_attention_macs(cfg, capacity, tokens, absorbed, passes)
                         < _attention_macs(cfg, capacity, tokens, naive)):
    return absorbed, True
  return naive, False


def _attention_macs(cfg: MtpConfig, capacity: int, tokens: int, chunk: int, passes: int | None = None) -> int:
  """A head's multiply-adds over a `tokens`-token prompt in chunks of `chunk` over a dense `capacity`-slot cache:
  naive (`passes` None): each chunk expands the slots it reads, K · C · (P + H), and scores them, K · (P + R + H) a
  query — K every slot of a cache up to KEY_BLOCK slots, else the KEY_BLOCK blocks up to the chunk's last position
  (`mla_blocked` skips the rest); absorbed: C · (P + H) a query (q~ and the output's W_UV) and S · (2C + R) — each of
  the two latent dots `passes` times."""
  c, p, r, h = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
  if passes is None:
    macs = 0
    for start in range(0, tokens, chunk):
      queries = min(chunk, tokens - start)
      keys = capacity if capacity <= KEY_BLOCK else min(capacity, -(-(start + chunk) // KEY_BLOCK) * KEY_BLOCK)
      macs += keys * c * (p + h) + queries * keys * (p + r + h)
    return macs
  return tokens * (c * (p + h) + capacity * (2 * c * passes + r))


def _largest_chunk(bytes_per_token: int, budget: int) -> int:
  """The largest power of two in [_MIN_CHUNK, _MAX_CHUNK] with chunk · bytes_per_token ≤ budget (_MIN_CHUNK if
  none)."""
  chunk = _MAX_CHUNK
  while chunk > _MIN_CHUNK and chunk * bytes_per_token > budget:
    chunk //= 2
  return chunk


def prefill_budget(cfg: MtpConfig, batch: int, capacity: int, devices) -> int:
  """The bytes `auto_prefill_chunk` may size a chunk's intermediates to: PREFILL_CHUNK_BYTES, or less on an
  accelerator whose allocator reports its limit (GPU, TPU), once the weights are placed and before the caches
  are: PREFILL_SHARE_OF_FREE of what its memory has left after the caches. A power of two, so that a few bytes
  more or less in use compile no other program. With the fixed budget an 80 GB H100 holding a 2-layer full-width
  V3.2 target and its MTP layer (51 GiB) ran out of memory at B = 8 × 4K prompts in its chunk of 2,048, where a
  chunk of 1,024 ran (benchmarks/RESULTS.md, 2026-12-07). A CPU keeps the fixed budget: its memory is the host's,
  which pages. Where the mesh spans several processes (one per host), the smallest of theirs: each reads only its
  own devices, and hosts whose free memory falls on either side of a power of two would otherwise compile prefills
  of different chunks, whose collectives would not match. Every process of the mesh must call it (a collective)."""
  devices = list(devices)  # read twice (a mesh's `devices.flat` is an iterator that keeps its place)
  device, caches, free = caches_against_free_memory(cfg, batch, capacity, devices)
  if free is None or device.platform == "cpu" or cfg.prefill_chunk:
    budget = PREFILL_CHUNK_BYTES
  else:
    left = int((free - caches) * PREFILL_SHARE_OF_FREE)
    budget = min(PREFILL_CHUNK_BYTES, 1 << max(left, 1).bit_length() - 1)
  # every process of the mesh compiles the same prefill (its chunk and form come from this budget): the smallest one's
  return smallest_over_devices(budget, devices)


def prefill_chunk(cfg: MtpConfig, batch: int, capacity: int, local_heads: int,
                  budget: int = PREFILL_CHUNK_BYTES) -> int:
  return cfg.prefill_chunk or auto_prefill_chunk(cfg, batch, capacity, local_heads, budget)


def prefill_plan(cfg: MtpConfig, batch: int, capacity: int, tp, budget: int = PREFILL_CHUNK_BYTES,
                 tokens: int | None = None) -> tuple[int, bool]:
  """(tokens per chunk, MLA's absorbed form?) of a `tokens`-token prompt's prefill (None: as long as the cache) —
  the target's and the drafter's (the MTP layer has the target's heads) — under the `TensorParallel` `tp`, its
  intermediates sized to `budget` bytes (`prefill_budget`)."""
  heads = tp.local(cfg.num_attention_heads, "num_attention_heads")
  if selects_all(cfg, capacity):
    return dense_cache_plan(cfg, batch, capacity, heads, tokens, budget)
  return prefill_chunk(cfg, batch, capacity, heads, budget), True


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
  chunk, absorb = prefill_plan(cfg, b, capacity, target.tp, budget, tokens=prompt_BT.shape[1])

  def run(ids_BC, positions_BC, caches):
    out = target.apply(t_vars, ids_BC, positions_BC, caches, absorb=absorb)
    return out.hidden_BTD, out.caches

  hidden_BTD, caches = apply_in_chunks(run, prompt_BT, init_target_caches(cfg, b, capacity), chunk)
  last_B1D = jnp.take_along_axis(hidden_BTD, (lengths_B - 1)[:, None, None], axis=1)
  return hidden_BTD, last_B1D, caches
