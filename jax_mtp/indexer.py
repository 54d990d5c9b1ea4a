"""DSA lightning indexer (DeepSeek-V3.2): picks, per query, the top-k cached positions to attend.

    q[t, i]  = wq_b(qr[t]) split into I heads of J dims; RoPE on the first R dims
    k[s]     = LayerNorm(wk(x[s])); RoPE on the first R dims; one key per token, shared by all heads
    w[t, i]  = weights_proj(x[t]) · I^-0.5            (fp32)
    I[t, s]  = Σ_i w[t, i] · ReLU(q[t, i] · k[s]) · J^-0.5        for s ≤ pos(t)
    keep     = top-min(index_topk, S)(I[t, :])                    one selection shared by all MLA heads
             (a radix select of the k-th score, `topk_selection_radix`, not a sort)

Math is fp32 with the compute dtype's keys (the Hugging Face `DeepseekV32Indexer` numerics). With an fp8 key
cache (`index_cache_dtype="fp8"`, vLLM's storage) q is rounded to the keys' float8 as well, one scale per
(token, head) folded into w, as the official kernel (`act_quant` of q and k, `fp8_index`) and vLLM's DeepGEMM
logits do (the Mosaic GPU kernel can then dot float8 × float8: `FLOAT8_SCORES_DOT`). The official kernel's
Hadamard rotation before that rounding is not modelled (it is orthogonal: in exact arithmetic it changes
nothing). When the cache holds no more positions than index_topk every visible position is kept, so DSA equals
dense MLA; the caller skips the indexer then (`selects_all`).

The selection is returned as slot indices [B, T, K] (K = min(index_topk, S)) with a validity mask
(a query with fewer than K visible slots gets some invisible, invalid ones): MLA's decode form
gathers those K entries and attends over them only. The scores are computed in chunks of slots so
the [B, T, I, S] logits never exist whole (peak [B, T, I, chunk], `score_chunk`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from typing import NamedTuple

from jax_mtp.cache import LayerCache, causal_mask, write_at_positions
from jax_mtp.config import MtpConfig
from jax_mtp.kernels import index_scores as scores_kernel
from jax_mtp.kernels import index_scores_mgpu as scores_mgpu
from jax_mtp.layers import LayerNorm, Rotary, apply_rope, linear
from jax_mtp.platform import NOT_HOPPER, lowering_gpu_is_hopper, lowering_platform


# A mutable collection that only training asks for (jax_mtp.training): the naive MLA form then sows
# each call's mean attention over heads and the slots it could see, the indexer its scores, for
# DeepSeek-V3.2's indexer loss KL(attention ‖ softmax(indexer scores)).
INDEXER_TRAINING = "indexer_training"

# Elements of one chunk's fp32 logits [B, T, I, chunk] (256 MiB): decode-sized calls take the whole
# cache in a few chunks; a long prefill's T shrinks its chunks to whole multiples of 128 slots.
SCORE_CHUNK_ELEMENTS = 2**26


class Selection(NamedTuple):
  """The indexer's choice per query: slot ids int32 [B, T, K] and whether each is visible."""

  slots_BTK: jax.Array
  valid_BTK: jax.Array

  def mask(self, capacity: int) -> jax.Array:
    """bool [B, T, S]: the selected visible slots."""
    b, t, _ = self.slots_BTK.shape
    chosen = jnp.zeros((b, t, capacity), bool)
    bi, ti = jnp.indices((b, t))
    return chosen.at[bi[..., None], ti[..., None], self.slots_BTK].set(self.valid_BTK)  # slots are distinct


def selects_all(cfg: MtpConfig, capacity: int) -> bool:
  """True when top-k keeps every visible slot, so the sparse mask is the causal mask."""
  return not cfg.has_indexer or capacity <= cfg.index_topk


class Indexer(nn.Module):
  """Scores cached positions and returns the top-k mask; updates the indexer key cache."""

  cfg: MtpConfig

  def setup(self):
    cfg = self.cfg
    self.wq_b = linear(cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim, cfg)
    self.wk = linear(cfg.hidden_size, cfg.index_head_dim, cfg)
    self.k_norm = LayerNorm(cfg.indexer_norm_eps, dtype="float32")
    # Kept in fp32 as in the official code and HF (`_keep_in_fp32_modules`).
    self.weights_proj = linear(cfg.hidden_size, cfg.index_n_heads, cfg, fp32=True)

  def __call__(self, x_BTD: jax.Array, qr_BTQ: jax.Array, positions_BT: jax.Array, rotary: Rotary,
               cache: LayerCache) -> tuple[Selection, LayerCache]:
    """Returns (the top-k selection among visible slots, updated cache)."""
    cfg = self.cfg
    # The indexer learns only from its own loss (DeepSeek-V3.2 detaches its inputs); the top-k
    # passes no gradient either, so this changes nothing at inference.
    x_BTD, qr_BTQ = jax.lax.stop_gradient(x_BTD), jax.lax.stop_gradient(qr_BTQ)
    k_BTJ = self._rope_first(self.k_norm(self.wk(x_BTD)), rotary)
    if cache.index_k_scale_BS is None:
      cache = cache._replace(index_k_BSJ=write_at_positions(cache.index_k_BSJ, k_BTJ, positions_BT))
    else:
      k8_BTJ, scale_BT = quantize_keys(k_BTJ, cache.index_k_BSJ.dtype)
      cache = cache._replace(index_k_BSJ=write_at_positions(cache.index_k_BSJ, k8_BTJ, positions_BT),
                             index_k_scale_BS=write_at_positions(cache.index_k_scale_BS, scale_BT, positions_BT))

    q_BTIJ = self.wq_b(qr_BTQ).reshape(*qr_BTQ.shape[:2], cfg.index_n_heads, cfg.index_head_dim)
    q_BTIJ = self._rope_first(q_BTIJ.astype(jnp.float32), rotary)
    w_BTI = self.weights_proj(x_BTD.astype(jnp.float32)) * cfg.index_n_heads**-0.5
    if cache.index_k_scale_BS is not None:  # float8 keys: q in their float8 too (the official FP8 indexer)
      q_BTIJ, w_BTI = quantize_queries(q_BTIJ, w_BTI, cache.index_k_BSJ.dtype)
    impl = resolve_index_scores_impl(cfg, lowering_platform(), cache.capacity, hopper=lowering_gpu_is_hopper())
    with jax.named_scope("index_scores"):  # the parts' names in a device profile (benchmarks.step_profile)
      scores_BTS = self._scores(q_BTIJ, w_BTI, positions_BT, cache, impl)
    if self.is_mutable_collection(INDEXER_TRAINING):
      self.sow(INDEXER_TRAINING, "scores_BTS", scores_BTS)
    with jax.named_scope("topk"):
      return topk_selection_radix(scores_BTS, causal_mask(positions_BT, cache.capacity), cfg.index_topk), cache

  def _scores(self, q_BTIJ, w_BTI, positions_BT, cache: LayerCache, impl: str) -> jax.Array:
    cfg = self.cfg
    if impl == "xla":
      return scores_kernel.reference(q_BTIJ, cache.index_k_BSJ, w_BTI, cfg.index_head_dim**-0.5,
                                     chunk=score_chunk(*q_BTIJ.shape[:3], cache.capacity),
                                     k_scale_BS=cache.index_k_scale_BS, dot_dtype=cfg.dtype)
    if impl == "mosaic_gpu":  # on a CPU (tests) the same kernel in Pallas's GPU interpreter; picked at trace time
      # (lax.platform_dependent would lower the interpreter's ordered callbacks into a CUDA program's cond)
      # float8 q beside float8 keys: the kernel's float8 × float8 wgmma where FLOAT8_SCORES_DOT, else q's float8
      # values in the model's dtype (exact), the keys widened to it: the same products
      float8_dot = FLOAT8_SCORES_DOT and q_BTIJ.dtype == cache.index_k_BSJ.dtype
      q = q_BTIJ if float8_dot else q_BTIJ.astype(cfg.dtype)
      return scores_mgpu.index_scores_mgpu(q, cache.index_k_BSJ, w_BTI,
                                           cfg.index_head_dim**-0.5, k_scale_BS=cache.index_k_scale_BS,
                                           positions_BT=positions_BT, interpret=lowering_platform() == "cpu")
    return scores_kernel.index_scores_pallas(  # pallas_tpu (every slot block scored: the TPU form takes no bound)
        q_BTIJ.astype(cfg.dtype), cache.index_k_BSJ, w_BTI, cfg.index_head_dim**-0.5,
        k_scale_BS=cache.index_k_scale_BS, backend="tpu")

  def _rope_first(self, x: jax.Array, rotary: Rotary) -> jax.Array:
    """RoPE on the first R dims (the indexer puts the rotary part first; MLA puts it last)."""
    r = self.cfg.qk_rope_head_dim
    rotated = apply_rope(x[..., :r], rotary, interleaved=self.cfg.indexer_rope_interleave)
    return jnp.concatenate([rotated, x[..., r:]], axis=-1)


# The Mosaic GPU index scores' float8 × float8 dot for an fp8 key cache (q in the keys' float8, `quantize_queries`).
# On: on the H200 (2026-12-05, benchmarks/RESULTS.md) it was 1.3-1.9x faster than widening the keys at T = 4 and
# 1.3-1.9x at T = 1 from B = 8 (B = 1: within 4 %), with its compiled tests passing at the float8 wgmma's tolerance:
# Hopper's tensor cores keep ~14 bits of a float8 dot's running sum (2.5e-4 of the largest score here), as DeepSeek's
# and vLLM's FP8 indexers sum. Off, the kernel widens the keys to bf16 beside q's float8 values in bf16: the same
# products, summed in fp32.
FLOAT8_SCORES_DOT = True

# Slots a cache capacity must be a multiple of for the fused kernels: the TPU kernel's block (256). The Mosaic GPU
# kernel takes any multiple of its 128-slot step: `config_for` picks `splits` dividing S / 128.
SCORE_BLOCK_SLOTS = scores_kernel.Config().block_slots


def resolve_index_scores_impl(cfg: MtpConfig, platform: str, capacity: int, *, hopper: bool = True) -> str:
  """"xla" or a fused kernel ("mosaic_gpu": Pallas Mosaic GPU, "pallas_tpu") for `cfg.index_scores_impl`.
  `hopper`: the GPU is a Hopper (`platform.lowering_gpu_is_hopper`; the model passes it): on other GPUs `auto` is
  xla and an explicit mosaic_gpu is refused (its wgmma and TMA are sm_90's).

  "auto":
    gpu  mosaic_gpu wherever it takes the model (`_kernel_problems` and `_mosaic_problems` empty); else xla (float8
         keys of a head dim not a multiple of 32, keys in a third dtype, more than 256 indexer heads, which only
         the removed Triton kernel took). On the H200 (benchmarks/RESULTS.md, "Index scores: auto on the
         Mosaic GPU kernel"; T = 4, 32K slots, B = 1 / 8 / 64): bf16 keys 40 / 81 / 344 µs against Triton's
         66 / 130 / 694; fp8 keys 57 / 102 / 417 against 36 / 126 / 712 (Triton ahead at B = 1 only); a 2,048-query
         prefill chunk with the causal bound 1,515 µs against 2,630
    tpu, cpu  xla (the TPU kernel is compiled for v5e / v6e through libtpu but not timed on a TPU)
  An explicit kernel runs as asked (it may target another platform than this process's, as an AOT
  compile does) unless it cannot take the model (`_kernel_problems`, and `_mosaic_problems` for mosaic_gpu): then
  a ValueError names why."""
  impl = cfg.index_scores_impl
  if impl == "xla":
    return "xla"
  if impl == "auto":
    if platform != "gpu" or not hopper or _kernel_problems(cfg, capacity):
      return "xla"
    return "xla" if _mosaic_problems(cfg) else "mosaic_gpu"
  problems = _kernel_problems(cfg, capacity) + (_mosaic_problems(cfg) if impl == "mosaic_gpu" else [])
  if impl == "mosaic_gpu" and platform == "gpu" and not hopper:  # elsewhere it runs in Pallas's interpreter
    problems.append(NOT_HOPPER)
  if problems:
    raise ValueError(f"index_scores_impl={impl!r} cannot run here: {'; '.join(problems)} (use 'xla' or 'auto')")
  return impl


def kernel_capacity(cfg: MtpConfig, positions: int) -> int:
  """The cache capacity to allocate for `positions`: rounded up to a multiple of SCORE_BLOCK_SLOTS where the
  cache is a DSA cache (longer than index_topk) and the fused kernels take the model at that capacity, so a
  request of any length gets the kernel `auto` promises (at most SCORE_BLOCK_SLOTS − 1 slots more per row);
  `positions` unchanged otherwise. Platform-independent: a request has the same shapes, and so the same
  numbers, on every platform."""
  rounded = -(-positions // SCORE_BLOCK_SLOTS) * SCORE_BLOCK_SLOTS
  if selects_all(cfg, positions) or _kernel_problems(cfg, rounded):
    return positions
  return rounded


def _mosaic_problems(cfg: MtpConfig) -> list[str]:
  """Why the Mosaic GPU kernel cannot take this model beyond `_kernel_problems` (none: it can)."""
  keys, dtype = jnp.dtype(cfg.index_key_dtype), jnp.dtype(cfg.dtype)
  problems = []
  if keys != dtype and keys not in scores_mgpu.FLOAT8_KEYS:
    problems.append(f"the Mosaic GPU kernel takes keys in the model's dtype ({dtype}) or float8, not {keys}")
  if keys in scores_mgpu.FLOAT8_KEYS and cfg.index_head_dim % 32:
    problems.append(f"the Mosaic GPU kernel takes float8 keys of a head dim that is a multiple of 32, not "
                    f"index_head_dim={cfg.index_head_dim}")
  if cfg.index_n_heads > 256:
    problems.append(f"the Mosaic GPU kernel takes at most 256 indexer heads (wgmma's N), not "
                    f"index_n_heads={cfg.index_n_heads}")
  return problems


def _kernel_problems(cfg: MtpConfig, capacity: int) -> list[str]:
  """Why the fused kernels (Mosaic GPU's and the TPU one) cannot take this model and cache (none: they can)."""
  problems = []
  if jnp.dtype(cfg.dtype) == jnp.float32:
    problems.append("the model computes in float32 (the kernel's dot is bf16/fp16)")
  if capacity % SCORE_BLOCK_SLOTS:
    problems.append(f"cache capacity {capacity} is not a multiple of {SCORE_BLOCK_SLOTS}")
  if cfg.index_n_heads % 16 or cfg.index_head_dim % 16:
    problems.append(f"index_n_heads={cfg.index_n_heads} and index_head_dim={cfg.index_head_dim} must be "
                    f"multiples of 16")
  return problems


def score_chunk(batch: int, tokens: int, heads: int, capacity: int) -> int:
  """Slots per chunk: the whole cache if its logits fit SCORE_CHUNK_ELEMENTS, else a multiple of 128."""
  per_slot = batch * tokens * heads
  if per_slot * capacity <= SCORE_CHUNK_ELEMENTS:
    return capacity
  return max(128, SCORE_CHUNK_ELEMENTS // per_slot // 128 * 128)


FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_keys(k_BTJ: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """(keys in `dtype` (float8), fp32 scale per token) with key ≈ stored · scale: amax → 448."""
  scale_BT = jnp.maximum(jnp.max(jnp.abs(k_BTJ), axis=-1), 1e-12) / FP8_MAX
  return (k_BTJ / scale_BT[..., None]).astype(dtype), scale_BT


def quantize_queries(q_BTIJ: jax.Array, w_BTI: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """(q in `dtype` (float8), w with q's scales folded in): each (token, head) query's amax → 448, as the keys
  (`quantize_keys`), its scale multiplied into that head's weight. Exact in real arithmetic, since a scale is
  positive and commutes with the ReLU: Σ_i w_i · ReLU(q_i · k) = Σ_i (w_i · s_i) · ReLU(q8_i · k)."""
  q8_BTIJ, scale_BTI = quantize_keys(q_BTIJ, dtype)
  return q8_BTIJ, w_BTI * scale_BTI


def topk_selection(scores_BTS: jax.Array, visible_BTS: jax.Array, topk: int) -> Selection:
  """The `topk` highest-scoring visible slots (all visible ones, and invalid fillers, if fewer), by
  `lax.top_k` (a sort): the reference `topk_selection_radix` is tested against and timed beside
  (benchmarks.dsa_parts, benchmarks.prefill_parts; RESULTS.md)."""
  k = min(topk, scores_BTS.shape[-1])
  masked = jnp.where(visible_BTS, scores_BTS, -jnp.inf)
  _, slots_BTK = jax.lax.top_k(masked, k)
  return Selection(slots_BTK.astype(jnp.int32), jnp.take_along_axis(visible_BTS, slots_BTK, axis=-1))


# Queries (B·T) up to which a radix pass counts its candidates as one reduction (benchmarks/RESULTS.md, issue 27's
# prefill): few queries leave sibling reductions too few rows to fill a GPU; many re-read the keys per candidate.
RADIX_ONE_REDUCTION_QUERIES = 32


def topk_selection_radix(scores_BTS: jax.Array, visible_BTS: jax.Array, topk: int) -> Selection:
  """The slots `topk_selection` picks (ties → the lowest slots), listed in slot order, without a sort:
  a radix select finds each query's k-th largest score over order-preserving integer keys, a digit a pass (the
  largest digit whose prefix still has ≥ k keys at or above it), then the slots above it (and enough of those
  equal to it) are compacted in order.

  How a pass counts its candidates depends on the number of queries, never the result: up to
  RADIX_ONE_REDUCTION_QUERIES, 4-bit digits whose 15 counts are one reduction over a [B, T, 15, S] comparison
  (15 rows per query keep the device busy; each re-reads the keys); beyond, 2-bit digits whose 3 counts are
  separate reductions of the same keys, which XLA fuses into one read of them per pass."""
  k = min(topk, scores_BTS.shape[-1])
  keys_BTS = order_keys(scores_BTS, visible_BTS)
  b, t, _ = keys_BTS.shape
  count = kth_key_one_reduction if b * t <= RADIX_ONE_REDUCTION_QUERIES else kth_key_sibling_reductions
  return select_from_kth(keys_BTS, visible_BTS, count(keys_BTS, k), k)


def kth_key_one_reduction(keys_BTS: jax.Array, k: int) -> jax.Array:
  """Each query's k-th largest key, 4 bits a pass, the 15 candidates counted by one reduction."""
  kth_BT = jnp.zeros(keys_BTS.shape[:2], jnp.uint32)
  digits = jnp.arange(1, 16, dtype=jnp.uint32)
  for shift in range(28, -1, -4):
    candidates_BTD = kth_BT[..., None] | (digits << shift)
    at_least_BTD = jnp.sum(keys_BTS[:, :, None, :] >= candidates_BTD[..., None], axis=-1, dtype=jnp.int32)
    kth_BT = kth_BT | (jnp.sum(at_least_BTD >= k, axis=-1, dtype=jnp.uint32) << shift)
  return kth_BT


def kth_key_sibling_reductions(keys_BTS: jax.Array, k: int, digit_bits: int = 2) -> jax.Array:
  """Each query's k-th largest key, `digit_bits` a pass (a divisor of 32), the 2^bits − 1 candidates counted by
  separate reductions of the same keys."""
  kth_BT = jnp.zeros(keys_BTS.shape[:2], jnp.uint32)
  for shift in range(32 - digit_bits, -1, -digit_bits):
    digit_BT = jnp.zeros_like(kth_BT)
    for d in range(1, 2**digit_bits):
      at_least_BT = jnp.sum(keys_BTS >= (kth_BT | jnp.uint32(d << shift))[..., None], axis=-1, dtype=jnp.int32)
      digit_BT = digit_BT + (at_least_BT >= k).astype(jnp.uint32)
    kth_BT = kth_BT | (digit_BT << shift)
  return kth_BT


def kth_key_histograms(keys_BTS: jax.Array, k: int, digit_bits: int = 16) -> jax.Array:
  """Each query's k-th largest key, `digit_bits` a pass (a divisor of 32) counted by one histogram a pass (a
  scatter-add of the keys whose higher digits match the k-th key's so far into 2^bits bins a query), instead of
  2^bits − 1 comparisons: 2 passes at 16 bits where the sibling form takes 16. Memory: a [B·T, 2^bits] int32
  histogram a pass. Not the library's form yet (benchmarks.dsa_parts times it beside the others)."""
  b, t, s = keys_BTS.shape
  keys_QS = keys_BTS.reshape(b * t, s)
  rows_Q1 = jnp.arange(b * t)[:, None]
  kth_Q = jnp.zeros((b * t,), jnp.uint32)
  for shift in range(32 - digit_bits, -1, -digit_bits):
    high = shift + digit_bits  # the bits settled before this pass: keys >> high against the k-th key's
    if high == 32:
      in_prefix_QS, above_Q = jnp.ones_like(keys_QS, jnp.int32), jnp.zeros((b * t,), jnp.int32)
    else:
      prefix_QS, settled_Q1 = keys_QS >> high, (kth_Q >> high)[:, None]
      in_prefix_QS = (prefix_QS == settled_Q1).astype(jnp.int32)
      above_Q = jnp.sum(prefix_QS > settled_Q1, axis=-1, dtype=jnp.int32)
    digit_QS = ((keys_QS >> shift) & jnp.uint32(2**digit_bits - 1)).astype(jnp.int32)
    hist_QD = jnp.zeros((b * t, 2**digit_bits), jnp.int32).at[rows_Q1, digit_QS].add(in_prefix_QS)
    at_least_QD = jnp.cumsum(hist_QD[:, ::-1], axis=-1)[:, ::-1]  # keys in the prefix with this digit or more
    digit_Q = jnp.sum(above_Q[:, None] + at_least_QD >= k, axis=-1, dtype=jnp.int32) - 1  # the largest such digit
    kth_Q = kth_Q | (digit_Q.astype(jnp.uint32) << shift)
  return kth_Q.reshape(b, t)


def order_keys(scores_BTS: jax.Array, visible_BTS: jax.Array) -> jax.Array:
  """uint32 keys whose unsigned order is the scores' float order; invisible slots get −inf's key."""
  bits = jax.lax.bitcast_convert_type(jnp.where(visible_BTS, scores_BTS, -jnp.inf).astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def select_from_kth(keys_BTS: jax.Array, visible_BTS: jax.Array, kth_BT: jax.Array, k: int) -> Selection:
  """The k slots whose keys are above each query's k-th largest key `kth_BT`, and enough of those equal to it
  (the lowest), compacted in slot order."""
  b, t, s = keys_BTS.shape
  above_BTS, tied_BTS = keys_BTS > kth_BT[..., None], keys_BTS == kth_BT[..., None]
  ties_wanted_BT = k - jnp.sum(above_BTS, axis=-1, dtype=jnp.int32)
  chosen_BTS = above_BTS | (tied_BTS & (jnp.cumsum(tied_BTS, axis=-1, dtype=jnp.int32) <= ties_wanted_BT[..., None]))
  rank_BTS = jnp.where(chosen_BTS, jnp.cumsum(chosen_BTS, axis=-1, dtype=jnp.int32) - 1, k)  # k: dropped
  bi, ti = jnp.indices((b, t))
  slots_BTK = jnp.zeros((b, t, k), jnp.int32).at[bi[..., None], ti[..., None], rank_BTS].set(
      jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, t, s)), mode="drop")
  return Selection(slots_BTK, jnp.take_along_axis(visible_BTS, slots_BTK, axis=-1))
