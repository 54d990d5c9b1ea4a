"""Multi-head latent attention (MLA) with the DSA indexer and a latent KV cache.

    qr      = q_a_layernorm(q_a_proj(x))                       [T, Q]   (also feeds the indexer)
    q       = q_b_proj(qr) → N heads × [q_nope (P) | q_pe (R)];  q_pe rotated (interleaved)
    c, k_pe = kv_a_proj_with_mqa(x) → [C | R];  c = kv_a_layernorm(c);  k_pe rotated, shared by heads
    cache   ← (c, k_pe) at the tokens' positions
    kv_b_proj: C → N heads × [W_UK (P) | W_UV (H)]
    naive    (prefill): k_h = [W_UK_h c ; k_pe], v_h = W_UV_h c,  o_h = softmax(q_h·k_h · scale) v_h
    absorbed (decode) : q~_h = W_UK_hᵀ q_nope_h, s = q~_h·c + q_pe_h·k_pe, o_h = W_UV_h (softmax(s·scale) c)
    out     = o_proj(concat_h o_h)

Both forms give the same numbers up to rounding; prefill expands keys once per token, decode never
expands the cache. Every decode-time call uses the absorbed form — draft steps (T = 1), the MTP
catch-up and the target's verification (T = k + 1 window tokens) — so verification rounds as plain
decoding does; the naive form is for the prefill chunks of dense caches only (its cost O(S·C·N·(P+H))
per row per chunk, where the dense absorbed form's O(T·S·N·C) would grow with the prompt's T); past
`mla_blocked.KEY_BLOCK` slots it expands and scores a block at a time into a running softmax. Prefill
chunks over a DSA cache use the sparse absorbed form (jax_mtp.prefill), as vLLM's sparse prefill does.

With a bf16 model the sparse form's dots take bf16 inputs with fp32 accumulation and fp32 softmax (the
gathered entries are read in the cache's dtype); fp32 models, and the dense absorbed form, compute in fp32. A DSA
model's absorbed calls over a cache within index_topk (the top-k would be every visible slot) run the sparse form's
kernel over every visible slot where the sparse attention resolves to it (under "auto" from 8 queries a call:
`attends_every_slot_by_kernel`).

Scores are masked to slots ≤ the query's position and, with DSA (cache longer than index_topk), to
the indexer's top-k: the naive form masks the dense scores; the absorbed form gathers the K selected
latent / rope entries per query and attends over those only (`_absorbed_sparse`), reading B·T·K
entries instead of the whole cache. scale = qk_head_dim^-0.5 · mscale² (config.softmax_scale).

An fp8 MLA cache (`kv_cache_dtype="fp8"`, jax_mtp.cache) stores e4m3 latent codes with one fp32 scale per group of
`kv_scale_group` values (amax → 448, `quantize_latent`), written wherever the latent is (`write_latent`: prefill
chunks, decode steps, verification, target and MTP layers). The naive and dense absorbed forms dequantise the cache
they read (`read_latent`); the sparse form gathers the selected codes and their scales and dequantises only those,
so it moves ~57 % of the bf16 cache's bytes (656 of 1,152 a token at V3.2's widths). The Mosaic GPU sparse-MLA
kernel ("mosaic_gpu") dequantises the codes in its gather warpgroup (`resolve_sparse_attention_impl`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_mtp.cache import LayerCache, causal_mask, write_at_positions
from jax_mtp.config import MtpConfig
from jax_mtp.indexer import INDEXER_TRAINING, Indexer, Selection, quantize_keys, selects_all
from jax_mtp.kernels import sparse_mla_mgpu
from jax_mtp.kernels.sparse_mla import dequantize_latent
from jax_mtp.kernels.sparse_mla import reference as sparse_mla_reference
from jax_mtp.layers import RMSNorm, Rotary, apply_rope, linear
from jax_mtp.mla_blocked import KEY_BLOCK, blocked_naive_attention, naive_scores
from jax_mtp.sharding import TensorParallel
from jax_mtp.platform import NOT_HOPPER, lowering_gpu_is_hopper, lowering_platform

_HIGHEST = jax.lax.Precision.HIGHEST


class MLAttention(nn.Module):
  """MLA (+ DSA indexer when the config has one). Output is o_proj's, before the residual add,
  reduced over the tp axis (heads are split over tp; the latent path and caches are replicated)."""

  cfg: MtpConfig
  tp: TensorParallel = TensorParallel()

  @property
  def num_local_heads(self) -> int:
    return self.tp.local(self.cfg.num_attention_heads, "num_attention_heads")

  def setup(self):
    cfg = self.cfg
    n, d = self.num_local_heads, cfg.hidden_size
    self.q_a_proj = linear(d, cfg.q_lora_rank, cfg)
    self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.latent_norm_eps, cfg.dtype, cfg.param_dtype)
    self.q_b_proj = linear(cfg.q_lora_rank, n * cfg.qk_head_dim, cfg)
    self.kv_a_proj_with_mqa = linear(d, cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg)
    self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.latent_norm_eps, cfg.dtype, cfg.param_dtype)
    self.kv_b_proj = linear(cfg.kv_lora_rank, n * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg)
    self.o_proj = linear(n * cfg.v_head_dim, d, cfg)
    if cfg.has_indexer:
      self.indexer = Indexer(cfg)

  def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array, rotary: Rotary, cache: LayerCache, *,
               absorb: bool, selection: Selection | None = None) -> tuple[jax.Array, LayerCache]:
    """x [B, T, D] (after input_layernorm) → (o_proj output [B, T, D], updated cache).

    `selection`: with a DSA cache, attend over these slots instead of running the indexer (the
    drafter's shared top-k; this call's indexer keys are then not written — the next round's
    catch-up rewrites those slots). The indexer's own selection is sown as ("dsa", "selection")."""
    cfg = self.cfg
    qr_BTQ = self.q_a_layernorm(self.q_a_proj(x_BTD))
    q_BTNK = self.q_b_proj(qr_BTQ).reshape(*x_BTD.shape[:2], self.num_local_heads, cfg.qk_head_dim)
    q_nope_BTNP = q_BTNK[..., :cfg.qk_nope_head_dim]
    q_pe_BTNR = apply_rope(q_BTNK[..., cfg.qk_nope_head_dim:], rotary, interleaved=cfg.rope_interleave)

    kv_BTL = self.kv_a_proj_with_mqa(x_BTD)
    latent_BTC = self.kv_a_layernorm(kv_BTL[..., :cfg.kv_lora_rank])
    k_pe_BTR = apply_rope(kv_BTL[..., cfg.kv_lora_rank:], rotary, interleaved=cfg.rope_interleave)
    cache = write_latent(cache, latent_BTC, k_pe_BTR, positions_BT)

    if selects_all(cfg, cache.capacity):
      visible_BTS = causal_mask(positions_BT, cache.capacity)
      if cfg.has_indexer and self.is_mutable_collection(INDEXER_TRAINING):  # the indexer learns in dense training too
        self.indexer(x_BTD, qr_BTQ, positions_BT, rotary, cache)
        self.sow(INDEXER_TRAINING, "visible_BTS", visible_BTS)
      # the top-k would be every visible slot: the kernel's way, as over a selection
      if absorb and attends_every_slot_by_kernel(cfg, queries=x_BTD.shape[0] * x_BTD.shape[1]):
        o_BTNH = self._absorbed_sparse(q_nope_BTNP, q_pe_BTNR, cache, every_visible_slot(visible_BTS))
      else:
        o_BTNH = (self._absorbed if absorb else self._naive)(q_nope_BTNP, q_pe_BTNR, cache, visible_BTS)
    else:
      if selection is None:
        selection, cache = self.indexer(x_BTD, qr_BTQ, positions_BT, rotary, cache)
        self.sow("dsa", "selection", selection)
      if self.is_mutable_collection(INDEXER_TRAINING):
        self.sow(INDEXER_TRAINING, "visible_BTS", selection.mask(cache.capacity))
      if absorb:  # DSA's point: read the index_topk selected entries, not the cache
        o_BTNH = self._absorbed_sparse(q_nope_BTNP, q_pe_BTNR, cache, selection)
      else:
        o_BTNH = self._naive(q_nope_BTNP, q_pe_BTNR, cache, selection.mask(cache.capacity))
    out_BTD = self.o_proj(o_BTNH.reshape(*x_BTD.shape[:2], -1).astype(x_BTD.dtype))
    if self.tp.axis is not None:  # row-parallel o_proj: each device holds a partial sum
      out_BTD = jax.lax.psum(out_BTD, self.tp.axis)
    return out_BTD, cache

  def _kv_b_weights(self) -> tuple[jax.Array, jax.Array]:
    """kv_b_proj's kernel [C, N·(P+H)] split into W_UK [C, N, P] and W_UV [C, N, H]."""
    cfg = self.cfg
    kernel_CNK = self.kv_b_proj.weight().reshape(cfg.kv_lora_rank, self.num_local_heads, -1)
    return kernel_CNK[..., :cfg.qk_nope_head_dim], kernel_CNK[..., cfg.qk_nope_head_dim:]

  def _naive(self, q_nope_BTNP, q_pe_BTNR, cache: LayerCache, visible_BTS) -> jax.Array:
    cfg = self.cfg
    sows = self.is_mutable_collection(INDEXER_TRAINING)  # the indexer's target needs every probability at once
    if cache.capacity > KEY_BLOCK and not sows:  # a long cache a block of slots at a time (jax_mtp.mla_blocked)
      w_kv_CNK = self.kv_b_proj.weight().reshape(cfg.kv_lora_rank, self.num_local_heads, -1)
      return blocked_naive_attention(q_nope_BTNP, q_pe_BTNR, cache, w_kv_CNK, visible_BTS, cfg.softmax_scale,
                                     cfg.dtype)
    kv_BSNK = self.kv_b_proj(read_latent(cache, cfg.dtype)).reshape(*cache.latent_BSC.shape[:2],
                                                                    self.num_local_heads, -1)
    k_nope_BSNP, v_BSNH = kv_BSNK[..., :cfg.qk_nope_head_dim], kv_BSNK[..., cfg.qk_nope_head_dim:]
    o_BTNH, probs_BNTS = naive_attention(q_nope_BTNP, q_pe_BTNR, k_nope_BSNP, cache.k_pe_BSR, v_BSNH, visible_BTS,
                                         cfg.softmax_scale)
    if sows:  # the indexer's target: the heads' mean attention
      self.sow(INDEXER_TRAINING, "attention_BTS", jax.lax.stop_gradient(probs_BNTS.mean(axis=1)))
    return o_BTNH

  def _latent_query(self, q_nope_BTNP) -> tuple[jax.Array, jax.Array]:
    """The absorbed query q~_h = W_UK_hᵀ q_nope_h, fp32 [B, T, N, C], and W_UV [C, N, H]."""
    w_uk_CNP, w_uv_CNH = self._kv_b_weights()
    q_lat_BTNC = jnp.einsum("btnp,cnp->btnc", q_nope_BTNP, w_uk_CNP.astype(q_nope_BTNP.dtype),
                            precision=_HIGHEST, preferred_element_type=jnp.float32)
    return q_lat_BTNC, w_uv_CNH

  def _absorbed(self, q_nope_BTNP, q_pe_BTNR, cache: LayerCache, visible_BTS) -> jax.Array:
    """The absorbed form over the whole cache under a mask (dense caches): `dense_latent_attention`."""
    cfg = self.cfg
    q_lat_BTNC, w_uv_CNH = self._latent_query(q_nope_BTNP)
    o_lat_BTNC = dense_latent_attention(q_lat_BTNC, q_pe_BTNR, read_latent(cache, cfg.dtype), cache.k_pe_BSR,
                                        visible_BTS, cfg.softmax_scale)
    return _heads_from_latent(o_lat_BTNC, w_uv_CNH)

  def _absorbed_sparse(self, q_nope_BTNP, q_pe_BTNR, cache: LayerCache, selection: Selection) -> jax.Array:
    """The absorbed form over the K = index_topk selected entries only (gathered per query): the
    same softmax as `_absorbed` with the selection mask, reading B·T·K entries instead of B·S."""
    cfg = self.cfg
    q_lat_BTNC, w_uv_CNH = self._latent_query(q_nope_BTNP)
    impl = resolve_sparse_attention_impl(cfg, lowering_platform(), hopper=lowering_gpu_is_hopper())
    with jax.named_scope("sparse_attention"):  # its kernels' part in a device profile (benchmarks.step_profile)
      if impl == "xla":
        o_lat_BTNC = sparse_mla_reference(q_lat_BTNC, q_pe_BTNR, cache.latent_BSC, cache.k_pe_BSR,
                                          selection.slots_BTK, selection.valid_BTK, cfg.softmax_scale,
                                          dot_dtype=cfg.dtype, latent_scale_BSG=cache.latent_scale_BSG)
      else:
        o_lat_BTNC = attend_selected_by_kernel(q_lat_BTNC, q_pe_BTNR, cache.latent_BSC, cache.k_pe_BSR, selection,
                                               cfg.softmax_scale, latent_scale_BSG=cache.latent_scale_BSG)
    return _heads_from_latent(o_lat_BTNC, w_uv_CNH, dot_dtype=cfg.dtype)


def attend_selected_by_kernel(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, selection: Selection, scale, *,
                              latent_scale_BSG=None) -> jax.Array:
  """The sparse-MLA kernel (kernels/sparse_mla_mgpu.py; on a CPU in its interpreter) over `selection`, its output
  in the cache's 16-bit dtype, which `_heads_from_latent`'s dot takes (the XLA path's fp32 is rounded there); an fp8
  cache's codes (`latent_scale_BSG` beside them) are dequantised inside it."""
  dtype = k_pe_BSR.dtype  # the cache's 16-bit dtype (an fp8 cache keeps its rope part in it)
  attended_BTK = jnp.where(selection.valid_BTK, selection.slots_BTK, -1)
  b, t, n, c = q_lat_BTNC.shape
  width = sparse_mla_mgpu.padded_entries(b * t, n, attended_BTK.shape[-1], c)
  return sparse_mla_mgpu.sparse_mla_mgpu(
      q_lat_BTNC.astype(dtype), q_pe_BTNR.astype(dtype), latent_BSC, k_pe_BSR,
      pad_slots(attended_BTK, width), scale, latent_scale_BSG=latent_scale_BSG, config=sparse_mla_mgpu.Config(),
      out_dtype=dtype, interpret=lowering_platform() == "cpu")


def resolve_sparse_attention_impl(cfg: MtpConfig, platform: str, *, hopper: bool = True) -> str:
  """"xla" or "mosaic_gpu" (the fused kernel, kernels/sparse_mla_mgpu.py on Pallas Mosaic GPU) for
  `cfg.sparse_attention_impl`, whatever a call's query and head counts (the kernel pads heads to its 64-head blocks
  and the selection to its 64-entry steps). `hopper`: the GPU is a Hopper (`platform.lowering_gpu_is_hopper`; the
  model passes it): the kernel's wgmma and TMA are sm_90's.

  "auto": mosaic_gpu on a Hopper GPU where it takes the model (`_mosaic_sparse_problems`), with a bf16 / fp16 or an
  fp8 MLA cache, at every query count; elsewhere xla (other GPUs: nothing else fused there since the Pallas Triton
  kernel went on 2026-12-04; TPUs: Mosaic TPU has no row gather from HBM by data-dependent ids in a block). The
  kernel keeps the gathered entries and the scores out of HBM (why: RESULTS, "The sparse MLA in one Pallas pass").
  An explicit "mosaic_gpu" runs as asked — on a CPU in Pallas's interpreter (tests), compiled on a Hopper — unless
  it cannot take the model or the GPU is not a Hopper: then a ValueError names why. "pallas_gpu" (the removed Triton
  kernel) is refused when the config is built (`MtpConfig`'s validation), naming its replacement."""
  impl = cfg.sparse_attention_impl
  if impl == "xla":
    return "xla"
  if impl == "auto":
    return "mosaic_gpu" if platform == "gpu" and hopper and not _mosaic_sparse_problems(cfg) else "xla"
  problems = _mosaic_sparse_problems(cfg)
  if platform == "gpu" and not hopper:  # elsewhere it runs in Pallas's interpreter
    problems.append(NOT_HOPPER)
  if problems:
    raise ValueError(f"sparse_attention_impl={impl!r} cannot run here: {'; '.join(problems)} (use 'xla' or 'auto')")
  return impl


# Queries a call (B · T) from which `auto` attends a cache within index_topk through the sparse-MLA kernel: on an H100
# over 1,283 slots it was 3.5–3.8× XLA's dense form at 64 and 256 queries, 1.09× at 8, but 0.92× at 4 and 0.41× at 1,
# where its fixed latency is the whole call (benchmarks/RESULTS.md, 2026-12-05)
EVERY_SLOT_KERNEL_MIN_QUERIES = 8


def attends_every_slot_by_kernel(cfg: MtpConfig, queries: int) -> bool:
  """Whether a DSA model's absorbed call of `queries` (B · T) queries over a cache of at most index_topk slots (where
  the top-k would be every visible slot) runs the sparse-MLA kernel over all of them, as vLLM's V3.2 runs FlashMLA's
  sparse kernel over a top-k padded with −1, rather than `dense_latent_attention`: where the sparse attention
  resolves to the kernel — explicitly at any query count, under "auto" from EVERY_SLOT_KERNEL_MIN_QUERIES. Why: at
  B = 64 over a 1K prompt's 1,283 slots XLA's dense form took 378 µs a layer at T = 1 and 1,391 µs at T = 4 (0.08 of
  its floor), the kernel 109 and 363 (an H100, benchmarks/RESULTS.md 2026-12-05). V3 models (no indexer) keep the
  dense form: their attention is not a selection, and `sparse_attention_impl` names the sparse attention's kernel."""
  if not cfg.has_indexer:
    return False
  impl = resolve_sparse_attention_impl(cfg, lowering_platform(), hopper=lowering_gpu_is_hopper())
  return impl != "xla" and (cfg.sparse_attention_impl != "auto" or queries >= EVERY_SLOT_KERNEL_MIN_QUERIES)


def every_visible_slot(visible_BTS: jax.Array) -> Selection:
  """The selection of every slot a query sees: ids 0 … S − 1, visible ones first (slots ≤ the query's position)."""
  b, t, s = visible_BTS.shape
  return Selection(jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, t, s)), visible_BTS)


def pad_slots(slots_BTK: jax.Array, width: int) -> jax.Array:
  """The selection's slot ids padded with −1 (not attended) to `width` entries (`sparse_mla_mgpu.padded_entries`):
  the kernel takes whole blocks of entries and splits them evenly, and a selection need not come in them
  (index_share_for_mtp_iteration's reused top-k holds index_topk + the drafts written since step 0; a short
  request's every visible slot, its capacity)."""
  return jnp.pad(slots_BTK, [(0, 0), (0, 0), (0, width - slots_BTK.shape[-1])], constant_values=-1)


def _mosaic_sparse_problems(cfg: MtpConfig) -> list[str]:
  """Why the Mosaic GPU sparse-MLA kernel cannot take this model (none: it can). Any head count (padded to its
  64-head blocks), any top-k (padded to its 64-entry steps), a bf16 / fp16 or fp8 MLA cache."""
  problems = []
  if jnp.dtype(cfg.dtype) == jnp.float32:
    problems.append("the model computes in float32 (the kernel's dots are bf16/fp16)")
  if cfg.kv_cache_dtype == "fp8" and cfg.kv_scale_group % 64:
    problems.append(f"kv_cache_dtype='fp8' with scale groups of {cfg.kv_scale_group} values (the kernel's are ≥ 64)")
  if cfg.kv_lora_rank % 128 or cfg.kv_lora_rank > 512:
    problems.append(f"kv_lora_rank={cfg.kv_lora_rank} is not a multiple of 128 up to 512")
  if cfg.qk_rope_head_dim % 64:
    problems.append(f"qk_rope_head_dim={cfg.qk_rope_head_dim} is not a multiple of 64")
  return problems


def naive_attention(q_nope_BTNP, q_pe_BTNR, k_nope_BSNP, k_pe_BSR, v_BSNH, visible_BTS,
                    scale) -> tuple[jax.Array, jax.Array]:
  """The naive form's attention over the expanded keys and values (the rope key shared by the heads): (fp32
  [B, T, N, H] output, the fp32 probabilities [B, N, T, S])."""
  probs_BNTS = masked_softmax(naive_scores(q_nope_BTNP, q_pe_BTNR, k_nope_BSNP, k_pe_BSR) * scale, visible_BTS)
  return jnp.einsum("bnts,bsnh->btnh", probs_BNTS.astype(v_BSNH.dtype), v_BSNH, precision=_HIGHEST,
                    preferred_element_type=jnp.float32), probs_BNTS


def dense_latent_attention(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, visible_BTS, scale) -> jax.Array:
  """fp32 [B, T, N, C]: the heads' softmax over the visible slots of the whole latent cache (q~ fp32, the latent in
  the model's dtype), with fp32 products and sums whatever the cache's dtype. Why fp32: with bf16 dots and bf16
  probabilities a V3 model's speculative output left plain greedy decoding's on CPU (a verification call of
  T = k + 1 rounds its reductions differently from T = 1). How: over an fp32 cache, fp32 dots (HIGHEST); over a
  16-bit one, q~ and the probabilities each go in as two 16-bit parts (`split16`: hi + lo, within ~2^-17 of the
  fp32 value) beside the latent in its own dtype (as the cache holds it; an fp8 cache's dequantised into it, as the
  sparse path reads it), so every dot is a 16-bit one on the matrix units with fp32 sums. An fp32 HIGHEST dot runs
  on a GPU's CUDA cores: over a 1,283-slot cache at B = 64 each of this form's two dots took ~290 µs a layer on the
  H200 that way (benchmarks/RESULTS.md, 2026-12-05)."""
  dtype, precision = dot_inputs(latent_BSC.dtype)  # (16-bit products are exact in fp32: HIGHEST adds nothing there)

  def dot(spec, a, b):  # fp32 `a` whole beside an fp32 cache, else as its two 16-bit parts
    parts = (a,) if dtype == jnp.float32 else split16(a, dtype)
    return sum(jnp.einsum(spec, part, b, precision=precision, preferred_element_type=jnp.float32) for part in parts)

  with jax.named_scope("dense_attention"):  # its products in a compiled program (jax_mtp.ran_kernels)
    scores_BNTS = (dot("btnc,bsc->bnts", q_lat_BTNC, latent_BSC)
                   + jnp.einsum("btnr,bsr->bnts", q_pe_BTNR.astype(k_pe_BSR.dtype), k_pe_BSR,
                                precision=precision, preferred_element_type=jnp.float32))
    probs_BNTS = masked_softmax(scores_BNTS * scale, visible_BTS)
    # [B, N, T, C] then transposed: XLA's CPU runtime refuses a bf16 × bf16 → fp32 dot that writes [B, T, N, C]
    # itself ("Unsupported element type for DotThunk", jax 0.12)
    return dot("bnts,bsc->bntc", probs_BNTS, latent_BSC).transpose(0, 2, 1, 3)


def split16(x: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """fp32 `x` as two arrays of the 16-bit `dtype`, hi = x rounded and lo = (x − hi) rounded: hi + lo holds x to
  about twice the 16-bit precision (2^-17 relative in bf16), so a dot of each part with exact 16-bit values, summed
  in fp32, is within that of the fp32 dot."""
  hi = x.astype(dtype)
  return hi, (x - hi.astype(jnp.float32)).astype(dtype)


def dot_inputs(dtype) -> tuple[jnp.dtype, jax.lax.Precision]:
  """(input dtype, precision) of an attention dot in a `dtype` model: fp32 exact (HIGHEST), or
  16-bit inputs on the matrix units (DEFAULT); callers accumulate in fp32 either way."""
  dtype = jnp.dtype(dtype)
  return dtype, (_HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT)


def _heads_from_latent(o_lat_BTNC: jax.Array, w_uv_CNH: jax.Array, dot_dtype=jnp.float32) -> jax.Array:
  """o_h = W_UV_h · (the attention-weighted latent), fp32 [B, T, N, H]; the dot's inputs in `dot_dtype`
  (bf16 in a bf16 model, as FlashMLA's bf16 output enters vLLM's W_UV product; with fp32 inputs it most
  likely was the fp32 SIMT GEMM in the V3.2 step's profile: benchmarks/RESULTS.md, "Where the FP8 draft
  step's time goes")."""
  dot_dtype, precision = dot_inputs(dot_dtype)
  return jnp.einsum("btnc,cnh->btnh", o_lat_BTNC.astype(dot_dtype), w_uv_CNH.astype(dot_dtype), precision=precision,
                    preferred_element_type=jnp.float32)


def quantize_latent(latent_BTC: jax.Array, group: int) -> tuple[jax.Array, jax.Array]:
  """(float8_e4m3fn codes [B, T, C], fp32 scales [B, T, C / group]) with latent ≈ codes · scale per group of
  `group` consecutive values: scale = max(amax, 1e-12) / 448 in fp32 (the indexer's `quantize_keys` per group)."""
  b, t, c = latent_BTC.shape
  codes_BTGc, scale_BTG = quantize_keys(latent_BTC.astype(jnp.float32).reshape(b, t, c // group, group),
                                        jnp.float8_e4m3fn)
  return codes_BTGc.reshape(b, t, c), scale_BTG


def write_latent(cache: LayerCache, latent_BTC: jax.Array, k_pe_BTR: jax.Array, positions_BT: jax.Array) -> LayerCache:
  """The tokens' latent and rope key written at their positions; an fp8 cache stores the latent's codes and scales."""
  k_pe_BSR = write_at_positions(cache.k_pe_BSR, k_pe_BTR, positions_BT)
  if cache.latent_scale_BSG is None:
    return cache._replace(latent_BSC=write_at_positions(cache.latent_BSC, latent_BTC, positions_BT), k_pe_BSR=k_pe_BSR)
  codes_BTC, scale_BTG = quantize_latent(latent_BTC, latent_BTC.shape[-1] // cache.latent_scale_BSG.shape[-1])
  return cache._replace(latent_BSC=write_at_positions(cache.latent_BSC, codes_BTC, positions_BT), k_pe_BSR=k_pe_BSR,
                        latent_scale_BSG=write_at_positions(cache.latent_scale_BSG, scale_BTG, positions_BT))


def read_latent(cache: LayerCache, dtype) -> jax.Array:
  """The whole latent cache [B, S, C] in `dtype` (dequantised where it is fp8): the dense forms read every slot."""
  if cache.latent_scale_BSG is None:
    return cache.latent_BSC.astype(dtype)
  return dequantize_latent(cache.latent_BSC, cache.latent_scale_BSG, dtype)


def masked_softmax(scores_BNTS: jax.Array, visible_BTS: jax.Array) -> jax.Array:
  """fp32 softmax over slots; invisible slots get probability 0 (every query sees its own slot)."""
  masked = jnp.where(visible_BTS[:, None], scores_BNTS.astype(jnp.float32), -jnp.inf)
  return jax.nn.softmax(masked, axis=-1)
