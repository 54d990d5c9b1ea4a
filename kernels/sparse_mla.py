"""DSA's sparse MLA decode attention in one pass: each query's K selected latent entries are gathered,
scored, soft-maxed online and summed in registers — the gathered [B, T, K, C + R] entries, the
[B, N, T, K] scores and the probabilities never reach HBM.

    s[h, k]  = scale · (q~[h] · latent[slot_k] + q_pe[h] · k_pe[slot_k])     (slot_k valid, else −∞)
    out[h]   = Σ_k softmax_k(s[h]) · latent[slot_k]                          fp32 [B, T, N, C]

Why a kernel of ours: XLA runs this as a gather that writes the selected entries to HBM, a score GEMM,
a max / sum / convert chain over the fp32 scores and an output GEMM, each a pass through HBM, where the
floor is one read of the selected entries (benchmarks/RESULTS.md, "Where the FP8 draft step's time
goes"). FlashMLA's sparse decode kernel (vLLM's) does this pass on NVIDIA; JAX has none, so this is it
in Pallas. It beats XLA's form at every measured size but stays well short of its floor (RESULTS.md,
"The sparse MLA in one Pallas pass"): `mma.sync` over 32-head blocks is compute-bound, and a 64-head
block spills its [64, 512] fp32 accumulator with 4 warps. A Mosaic GPU kernel with wgmma and the output
split over two warpgroups (FlashMLA's layout) is what would close the gap.

Grid (N / block_heads head blocks, splits, B·T queries), head blocks fastest. A program keeps its heads'
[q~; q_pe] and an fp32 [block_heads, C] accumulator in registers, and walks its split's share of the
query's K slots in chunks of `block_entries`: gather the chunk's latent [E, C] and k_pe [E, R] rows from the cache (the
slot ids are data: Triton loads rows through pointers, no copy), two score dots on the tensor cores
(bf16 in, fp32 out), the online-softmax update, and one output dot with the probabilities rounded to
the entries' dtype (as FlashMLA and the XLA path do). With more than one split (few queries: B = 1
fills 4 of 132 SMs otherwise) each split writes its normalised partial output and its log-sum-exp,
and `combine_splits` merges them (flash-decoding). Invalid slots (the selection's padding, or slots
past the query's position) are −1 in `slots` and score −∞; a split with none valid has lse −∞ and
weight 0.

The cache is read in its own dtype (bf16 / fp16); Triton computes the gathered offsets in int64 once a
cache exceeds 2^32 bytes. `backend`: "gpu" (Pallas' Triton backend, deprecated by JAX in favour of
Mosaic GPU like our other Triton kernels), "interpret" (any host, for tests), or "auto" (by the
platform the program is lowered for: interpret on CPU, Triton elsewhere). `reference` is the op in XLA (also the
model's "xla" impl, and the only one that reads an fp8 cache yet: `dequantize_latent` is that cache's format);
`MtpConfig.sparse_attention_impl` picks between them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

KERNEL_NAME = "dsa_sparse_mla"
BACKENDS = ("auto", "gpu", "interpret")
MIN_DOT = 16  # Triton's tensor-core dot: every dimension ≥ 16
BUSY_PROGRAMS = 256  # split the K slots until about this many programs run (an H200 has 132 SMs)
# Each split writes an fp32 [N, C] partial, so 16 write more than a query's entries read; still 16 measured fastest
# where one query's programs would otherwise leave the GPU idle (H200, 2026-12-03 21:58, benchmarks/RESULTS.md: B = 1,
# T = 1: 29.7 µs at 16 splits against 39.8 at 8; B = 1, T = 4: 41.5 against 80.1).
MAX_SPLITS = 16
_NEG_INIT = -1e30  # the running max starts finite: exp(−∞ − (−∞)) would be NaN


def splits_for(queries: int, head_blocks: int, entries: int, block_entries: int) -> int:
  """Splits of each query's slots: the fewest (a power of two dividing entries / block_entries, at most
  MAX_SPLITS) that give queries × head_blocks × splits ≥ BUSY_PROGRAMS."""
  chunks = entries // block_entries
  splits = 1
  while queries * head_blocks * splits < BUSY_PROGRAMS and splits < MAX_SPLITS and chunks % (2 * splits) == 0:
    splits *= 2
  return splits


@dataclasses.dataclass(frozen=True)
class Config:
  """The kernel's launch: heads and selected entries a program takes, `splits` of each query's entries over
  separate programs merged by log-sum-exp (None: `splits_for`), Triton's `num_warps` / `num_stages`."""

  block_heads: int = 32
  block_entries: int = 32
  splits: int | None = None
  num_warps: int = 4
  num_stages: int = 2


def model_config(local_heads: int, topk: int) -> Config:
  """The launch a model's calls start from: 32 heads × 64 entries a program, 4 warps, 3 stages — the fastest of
  the launch-config sweep at V3.2's widths (benchmarks/RESULTS.md, "The sparse MLA in one Pallas pass") — narrowed
  to what divides the model's heads and top-k."""
  return Config(block_heads=32 if local_heads % 32 == 0 else 16,
                block_entries=next(e for e in (64, 32, 16) if topk % e == 0), num_warps=4, num_stages=3)


def config_for(queries: int, heads: int, entries: int, config: Config | None = None) -> Config:
  """`config` (default: Config()) for a call of `queries` queries × `heads` heads over `entries` selected slots:
  blocks no larger than the call, `splits` by `splits_for` where it is left open."""
  config = config or Config()
  block_heads, block_entries = min(config.block_heads, heads), min(config.block_entries, entries)
  splits = splits_for(queries, heads // block_heads, entries, block_entries) if config.splits is None else config.splits
  return dataclasses.replace(config, block_heads=block_heads, block_entries=block_entries, splits=splits)


def check_operands(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, config: Config) -> None:
  """One clear error for operands (and a completed launch `config`) the kernel does not take."""
  block_heads, block_entries, splits = config.block_heads, config.block_entries, config.splits
  b, t, n, c = q_lat_BTNC.shape
  r = q_pe_BTNR.shape[-1]
  s = latent_BSC.shape[1]
  k = slots_BTK.shape[-1]
  if q_pe_BTNR.shape != (b, t, n, r) or latent_BSC.shape != (b, s, c) or k_pe_BSR.shape != (b, s, r) \
      or slots_BTK.shape != (b, t, k):
    raise ValueError(f"shapes q~ {q_lat_BTNC.shape}, q_pe {q_pe_BTNR.shape}, latent {latent_BSC.shape}, "
                     f"k_pe {k_pe_BSR.shape}, slots {slots_BTK.shape} do not agree")
  dtypes = {q_lat_BTNC.dtype, q_pe_BTNR.dtype, latent_BSC.dtype, k_pe_BSR.dtype}
  if len(dtypes) != 1 or next(iter(dtypes)) not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"the kernel takes one 16-bit float dtype for queries and cache, got {sorted(map(str, dtypes))}")
  if n % block_heads:
    raise ValueError(f"{n} heads are not a multiple of block_heads={block_heads}")
  if splits < 1 or k % (splits * block_entries):
    raise ValueError(f"{k} selected slots are not a multiple of splits={splits} × block_entries={block_entries}")


def sparse_mla(q_lat_BTNC: jax.Array, q_pe_BTNR: jax.Array, latent_BSC: jax.Array, k_pe_BSR: jax.Array,
               slots_BTK: jax.Array, scale: float, *, config: Config | None = None, out_dtype=jnp.float32,
               backend: str = "auto") -> jax.Array:
  """[B, T, N, C] in `out_dtype`: each query's heads attending over its selected slots (`slots_BTK`
  int32, −1 = not attended). Queries and cache in one 16-bit dtype; launched as `config_for` completes `config`
  (see the module docstring). One split writes `out_dtype` straight from its fp32 accumulator; splits write fp32
  partials, combined in fp32, then cast."""
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
  b, t, n, c = q_lat_BTNC.shape
  k = slots_BTK.shape[-1]
  config = config_for(b * t, n, k, config)
  check_operands(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, config)
  block_heads, block_entries, splits = config.block_heads, config.block_entries, config.splits
  if backend == "auto":
    call = functools.partial(sparse_mla, scale=scale, config=config, out_dtype=out_dtype)
    return jax.lax.platform_dependent(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK,
                                      cpu=functools.partial(call, backend="interpret"),
                                      default=functools.partial(call, backend="gpu"))
  r = q_pe_BTNR.shape[-1]
  s = latent_BSC.shape[1]
  per_split = k // splits
  kernel = functools.partial(_kernel, chunks=per_split // block_entries, block_entries=block_entries,
                             scale=scale)
  out, lse = pl.pallas_call(
      kernel,
      # head blocks fastest: a query's programs run side by side and read its gathered rows through L2 once
      grid=(n // block_heads, splits, b * t),
      in_specs=[pl.BlockSpec((None, block_heads, c), lambda h, p, q: (q, h, 0)),
                pl.BlockSpec((None, block_heads, r), lambda h, p, q: (q, h, 0)),
                pl.BlockSpec((None, s, c), lambda h, p, q: (q // t, 0, 0)),  # the row's whole cache:
                pl.BlockSpec((None, s, r), lambda h, p, q: (q // t, 0, 0)),  # rows are gathered by slot
                pl.BlockSpec((None, per_split), lambda h, p, q: (q, p))],
      out_specs=[pl.BlockSpec((None, None, block_heads, c), lambda h, p, q: (q, p, h, 0)),
                 pl.BlockSpec((None, None, block_heads), lambda h, p, q: (q, p, h))],
      out_shape=[jax.ShapeDtypeStruct((b * t, splits, n, c), out_dtype if splits == 1 else jnp.float32),
                 jax.ShapeDtypeStruct((b * t, splits, n), jnp.float32)],
      compiler_params=_compiler_params(backend, config),
      interpret=backend == "interpret",
      name=KERNEL_NAME,
  )(q_lat_BTNC.reshape(b * t, n, c), q_pe_BTNR.reshape(b * t, n, r), latent_BSC, k_pe_BSR,
    slots_BTK.astype(jnp.int32).reshape(b * t, k))
  return combine_splits(out, lse).astype(out_dtype).reshape(b, t, n, c)


def reference(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, valid_BTK, scale: float, *,
              dot_dtype=jnp.float32, latent_scale_BSG: jax.Array | None = None) -> jax.Array:
  """softmax(q~·c + q_pe·k_pe) over each query's selected entries (`slots_BTK` where `valid_BTK`), times those
  latents: fp32 [B, T, N, C], by XLA. Gathers the K selected entries per query and reads them in the cache's dtype;
  `latent_scale_BSG` (an fp8 cache's scales): the gathered codes and their scales are dequantised, only those K
  entries a query, never the cache.

  The two dots take their inputs in `dot_dtype` and accumulate in fp32: float32 is exact (HIGHEST); bfloat16 (a
  bf16 model's) rounds the query and the probabilities to bf16 as FlashMLA does, and runs on the matrix units. The
  softmax is fp32 either way."""
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


def _kernel(q_lat_ref, q_pe_ref, latent_ref, k_pe_ref, slots_ref, out_ref, lse_ref, *, chunks: int,
            block_entries: int, scale: float):
  q_lat = q_lat_ref[...]  # [H, C]
  q_pe = q_pe_ref[...]  # [H, R]
  heads, c = q_lat.shape
  contract_last = (((1,), (1,)), ((), ()))

  def chunk(i, carry):
    acc, row_max, row_sum = carry
    slots = slots_ref[pl.ds(i * block_entries, block_entries)]  # [E]
    valid = slots >= 0
    rows = jnp.where(valid, slots, 0)  # invalid slots read row 0 and score −∞
    latent = latent_ref[rows, :]  # [E, C] gathered
    k_pe = k_pe_ref[rows, :]  # [E, R]
    scores = (jax.lax.dot_general(q_lat, latent, contract_last, preferred_element_type=jnp.float32)
              + jax.lax.dot_general(q_pe, k_pe, contract_last, preferred_element_type=jnp.float32)) * scale
    scores = jnp.where(valid[None, :], scores, -jnp.inf)  # [H, E]
    new_max = jnp.maximum(row_max, jnp.max(scores, axis=1))
    rescale = jnp.exp(row_max - new_max)
    probs = jnp.exp(scores - new_max[:, None])
    row_sum = row_sum * rescale + jnp.sum(probs, axis=1)
    acc = acc * rescale[:, None] + jnp.dot(probs.astype(latent.dtype), latent, preferred_element_type=jnp.float32)
    return acc, new_max, row_sum

  init = (jnp.zeros((heads, c), jnp.float32), jnp.full((heads,), _NEG_INIT, jnp.float32),
          jnp.zeros((heads,), jnp.float32))
  acc, row_max, row_sum = jax.lax.fori_loop(0, chunks, chunk, init)
  seen = row_sum > 0
  out_ref[...] = (acc / jnp.where(seen, row_sum, 1.0)[:, None]).astype(out_ref.dtype)
  lse_ref[...] = jnp.where(seen, row_max + jnp.log(jnp.where(seen, row_sum, 1.0)), -jnp.inf)


def _compiler_params(backend: str, config: Config):
  if backend == "gpu":
    from jax.experimental.pallas import triton as pl_triton  # noqa: PLC0415 (GPU-only module)
    return pl_triton.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)
  return None
