"""DSA lightning indexer (DeepSeek-V3.2): picks, per query, the top-k cached positions to attend.

    q[t, i]  = wq_b(qr[t]) split into I heads of J dims; RoPE on the first R dims
    k[s]     = LayerNorm(wk(x[s])); RoPE on the first R dims; one key per token, shared by all heads
    w[t, i]  = weights_proj(x[t]) · I^-0.5            (fp32)
    I[t, s]  = Σ_i w[t, i] · ReLU(q[t, i] · k[s]) · J^-0.5        for s ≤ pos(t)
    keep     = top-min(index_topk, S)(I[t, :])                    one selection shared by all MLA heads
             (a radix select of the k-th score, `jax_mtp.topk`, not a sort)

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

from jax_mtp.cache import LayerCache, write_at_positions
from jax_mtp.config import MtpConfig
from jax_mtp.kernels import index_scores as scores_kernel
from jax_mtp.kernels import index_scores_mgpu as scores_mgpu
from jax_mtp.layers import LayerNorm, Rotary, apply_rope, linear
from jax_mtp.platform import NOT_HOPPER, lowering_gpu_is_hopper, lowering_platform
from jax_mtp.topk import Selection, select_topk


# A mutable collection that only training asks for (jax_mtp.training): the naive MLA form then sows
# each call's mean attention over heads and the slots it could see, the indexer its scores, for
# DeepSeek-V3.2's indexer loss KL(attention ‖ softmax(indexer scores)).
INDEXER_TRAINING = "indexer_training"

# Elements of one chunk's fp32 logits [B, T, I, chunk] (256 MiB): decode-sized calls take the whole
# cache in a few chunks; a long prefill's T shrinks its chunks to whole multiples of 128 slots.
SCORE_CHUNK_ELEMENTS = 2**26


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
      return select_topk(cfg, scores_BTS, positions_BT), cache

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
