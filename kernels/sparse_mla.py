"""DSA's sparse MLA decode attention, the op: each query's K selected latent entries scored, soft-maxed and summed.

    s[h, k]  = scale · (q~[h] · latent[slot_k] + q_pe[h] · k_pe[slot_k])     (slot_k valid, else −∞)
    out[h]   = Σ_k softmax_k(s[h]) · latent[slot_k]                          fp32 [B, T, N, C]

This module holds what every implementation of the op shares: `reference` (the op in XLA: the model's "xla" impl,
and what the kernel's tests compare with), an fp8 MLA cache's format (`dequantize_latent`) and the merge of split
partial outputs (`combine_splits`, flash-decoding). The fused kernel is `sparse_mla_mgpu.py` on Pallas's Mosaic GPU
backend (Hopper): it keeps the gathered [B, T, K, C + R] entries, the [B, N, T, K] scores and the probabilities out
of HBM, where XLA's form writes each to HBM between a gather, two GEMMs and a softmax (benchmarks/RESULTS.md, "Where
the FP8 draft step's time goes").

The Pallas Triton kernel that lived here was removed on 2026-12-04 (issue 28: Pallas's Triton backend is deprecated
since JAX 0.11.0 and will be removed). On the H200, in one run each, the Mosaic kernel matched or beat it on the
user's path at every batch measured: the round at B = 1 took 5.72 ms against 5.63 ms, and at B = 8 13.35 against
13.41 ms. The Mosaic kernel was also faster in the kernel's own table from B = 1, T = 4 up (benchmarks/RESULTS.md,
"The Triton sparse-MLA kernel removed").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def reference(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, valid_BTK, scale: float, *,
              dot_dtype=jnp.float32, latent_scale_BSG: jax.Array | None = None) -> jax.Array:
  """softmax(q~·c + q_pe·k_pe) over each query's selected entries (`slots_BTK` where `valid_BTK`), times those
  latents: fp32 [B, T, N, C], by XLA. Gathers the K selected entries per query and reads them in the cache's dtype;
  `latent_scale_BSG` (an fp8 cache's scales): the gathered codes and their scales are dequantised, only those K
  entries a query, never the cache.

  The two dots take their inputs in `dot_dtype` and accumulate in fp32: float32 is exact (HIGHEST); bfloat16 (a
  bf16 model's) rounds the query and the probabilities to bf16 as FlashMLA does, and runs on the matrix units. The
  softmax is fp32 either way."""
  check_shapes(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, valid_BTK)
  dot_dtype = jnp.dtype(dot_dtype)
  precision = jax.lax.Precision.HIGHEST if dot_dtype == jnp.float32 else jax.lax.Precision.DEFAULT
  c = latent_BSC.shape[-1]

  def gather(cache_BS_):  # cache[b, slots[b, t, k]] → [B, T, K, ...]
    return cache_BS_[jnp.arange(cache_BS_.shape[0])[:, None, None], slots_BTK]

  # One gathered [latent; k_pe] entry per selected slot, and one query [q~; q_pe]: the two score terms are one dot
  # (no second [B, N, T, K] fp32 score array to add), and the output dot reads the same entries whole, its k_pe
  # columns dropped from the output (the operand is not sliced).
  latent_BTKC = gather(latent_BSC)
  if latent_scale_BSG is not None:
    latent_BTKC = dequantize_latent(latent_BTKC, gather(latent_scale_BSG), dot_dtype)
  entries_BTKX = jnp.concatenate([latent_BTKC.astype(dot_dtype), gather(k_pe_BSR).astype(dot_dtype)], axis=-1)
  q_BTNX = jnp.concatenate([q_lat_BTNC.astype(dot_dtype), q_pe_BTNR.astype(dot_dtype)], axis=-1)
  scores_BNTK = jnp.einsum("btnx,btkx->bntk", q_BTNX, entries_BTKX, precision=precision,
                           preferred_element_type=jnp.float32)
  masked_BNTK = jnp.where(valid_BTK[:, None], scores_BNTK * scale, -jnp.inf)
  probs_BNTK = jax.nn.softmax(masked_BNTK, axis=-1)
  out_BTNX = jnp.einsum("bntk,btkx->btnx", probs_BNTK.astype(dot_dtype), entries_BTKX, precision=precision,
                        preferred_element_type=jnp.float32)
  return out_BTNX[..., :c]


def check_shapes(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, valid_BTK=None) -> None:
  """A ValueError naming the shapes where the op's operands do not agree (XLA would broadcast a batch of one over
  another, or fail in an einsum naming no operand): the reference's and the kernel's first check (the kernel takes
  no `valid`: slot −1 pads). Slot values are not checked: they are traced."""
  b, t, n, c = q_lat_BTNC.shape
  s, r, k = latent_BSC.shape[1], q_pe_BTNR.shape[-1], slots_BTK.shape[-1]
  if (q_pe_BTNR.shape != (b, t, n, r) or latent_BSC.shape != (b, s, c) or k_pe_BSR.shape != (b, s, r)
      or slots_BTK.shape != (b, t, k) or (valid_BTK is not None and valid_BTK.shape != (b, t, k))):
    raise ValueError(f"shapes q_lat {q_lat_BTNC.shape}, q_pe {q_pe_BTNR.shape}, latent {latent_BSC.shape}, k_pe "
                     f"{k_pe_BSR.shape}, slots {slots_BTK.shape}, valid {getattr(valid_BTK, 'shape', None)} do "
                     f"not agree (q_lat [B, T, N, C], q_pe [B, T, N, R], latent [B, S, C], k_pe [B, S, R], slots / "
                     f"valid [B, T, K])")


def dequantize_latent(codes__C: jax.Array, scale__G: jax.Array, dtype) -> jax.Array:
  """An fp8 MLA cache's values: codes · scale per group ([..., C] e4m3 codes, [..., G] fp32 scales, C / G values a
  group), in fp32, cast to `dtype` (the writer: `jax_mtp.mla.quantize_latent`)."""
  g = scale__G.shape[-1]
  grouped = codes__C.astype(jnp.float32).reshape(*codes__C.shape[:-1], g, -1) * scale__G[..., None]
  return grouped.reshape(codes__C.shape).astype(dtype)


def combine_splits(out_QPNC: jax.Array, lse_QPN: jax.Array) -> jax.Array:
  """The splits' normalised partial outputs weighted by their share of the softmax mass: fp32 [Q, N, C]."""
  if out_QPNC.shape[1] == 1:
    return out_QPNC[:, 0]
  weights_QPN = jax.nn.softmax(lse_QPN, axis=1)  # exp(lse_p − logsumexp over p); a split of lse −∞ weighs 0
  return jnp.einsum("qpn,qpnc->qnc", weights_QPN, out_QPNC, precision=jax.lax.Precision.HIGHEST)
