"""The DSA indexer's scores in one Pallas kernel: q·k on the matrix units, ReLU, the weighted sum over
the indexer heads in registers — the [B, T, I, S] logits never reach HBM.

    I[b, t, s] = scale · Σ_i w[b, t, i] · ReLU(q[b, t, i] · k[b, s] · k_scale[b, s])

XLA runs this as a dot that writes fp32 logits and a fusion that reads them back: at 64 heads that is
64 × 4 bytes per (query, slot) against the 2 bytes of key the step must read, and the scores sit at
0.12–0.25 of their floor on an H200 at B ≥ 8 (benchmarks/RESULTS.md, "Long-context DSA"). Here each
program reads one block of `block_slots` keys once and writes T scores per slot.

Grid (B, T / block_tokens, S / block_slots); a token block's q [tb·I, J] and w [tb·I, 1] stay resident while
the row's keys stream past them. With the queries' positions (`positions_BT`, GPU and interpret backends) a program
whose slot block starts past its token block's last position writes zeros without reading keys: those slots are
invisible to every query of the block (slot s holds position s), so a prefill chunk scores only the causal part of
the cache (half of it on average over a prompt) and an early decode step only the slots written so far.
Keys enter the dot in q's dtype (bf16 in a bf16 model; float8 keys are widened through fp32 first,
which every ptxas can convert) with fp32 accumulation; per-key fp8 scales multiply the fp32 logits.
`backend`: "gpu" (Pallas' Triton backend, which JAX has deprecated in favour of Mosaic GPU: a port
is due once this kernel is measured), "tpu" (Mosaic) or "interpret" (any host, for tests). The
reference is `jax_mtp.indexer.index_scores` (XLA); `MtpConfig.index_scores_impl` picks it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

KERNEL_NAME = "dsa_index_scores"
BACKENDS = ("gpu", "tpu", "interpret")


def index_scores_pallas(q_BTIJ: jax.Array, k_BSJ: jax.Array, w_BTI: jax.Array, scale: float, *,
                        k_scale_BS: jax.Array | None = None, positions_BT: jax.Array | None = None,
                        block_slots: int = 256, block_tokens: int = 4, backend: str = "gpu") -> jax.Array:
  """fp32 [B, T, S] index scores; S must be a multiple of `block_slots`. Queries go in blocks (a grid axis; T is
  padded to a whole number of blocks) of the largest power of two ≤ min(T, `block_tokens`) (the whole T on TPUs):
  any T compiles to one program body.
  `positions_BT` (int32, optional): each query's position; scores of slots past a token block's last position are
  then 0 (not computed) instead of their q·k values — callers mask those slots as invisible anyway."""
  b, t, i, j = q_BTIJ.shape
  s = k_BSJ.shape[1]
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
  if s % block_slots:
    raise ValueError(f"cache capacity {s} is not a multiple of block_slots={block_slots}")
  if k_BSJ.shape != (b, s, j) or w_BTI.shape != (b, t, i):
    raise ValueError(f"shapes q {q_BTIJ.shape}, k {k_BSJ.shape}, w {w_BTI.shape} do not agree")
  if block_tokens < 1:
    raise ValueError(f"block_tokens={block_tokens} must be ≥ 1")
  if positions_BT is not None and (backend == "tpu" or positions_BT.shape != (b, t)):
    raise ValueError(f"positions_BT of shape {positions_BT.shape} cannot bound the slots on backend={backend!r} "
                     f"(it needs shape {(b, t)} and the gpu or interpret backend)")
  # Mosaic TPU blocks: 8-row multiples or the whole T. Triton's arrays are powers of 2 long: the largest ≤ both.
  tb = t if backend == "tpu" else 1 << (min(t, block_tokens).bit_length() - 1)
  padded = -(-t // tb) * tb  # padding queries have zero weights: their scores are 0 and dropped
  q = jnp.pad(q_BTIJ, [(0, 0), (0, padded - t), (0, 0), (0, 0)]).reshape(b, padded * i, j)
  w = jnp.pad(w_BTI.astype(jnp.float32), [(0, 0), (0, padded - t), (0, 0)]).reshape(b, padded * i, 1)
  inputs = [q, k_BSJ, w]
  # token blocks outside slot blocks: a row's keys (S·J·2 bytes, 8 MiB at 32K) stay in L2 across token blocks
  in_specs = [pl.BlockSpec((None, tb * i, j), lambda bi, ti, si: (bi, ti, 0)),
              pl.BlockSpec((None, block_slots, j), lambda bi, ti, si: (bi, si, 0)),
              pl.BlockSpec((None, tb * i, 1), lambda bi, ti, si: (bi, ti, 0))]
  if k_scale_BS is not None:
    inputs.append(k_scale_BS.astype(jnp.float32).reshape(b, 1, s))
    in_specs.append(pl.BlockSpec((None, 1, block_slots), lambda bi, ti, si: (bi, 0, si)))
  if positions_BT is not None:  # padding queries at −1: they never extend a block's visible slots
    inputs.append(jnp.pad(positions_BT.astype(jnp.int32), [(0, 0), (0, padded - t)], constant_values=-1)[:, None])
    in_specs.append(pl.BlockSpec((None, 1, tb), lambda bi, ti, si: (bi, 0, ti)))
  kernel = functools.partial(_kernel, tokens=tb, heads=i, scale=scale, scaled=k_scale_BS is not None,
                             bounded=positions_BT is not None, block_slots=block_slots)
  out = pl.pallas_call(
      kernel,
      grid=(b, padded // tb, s // block_slots),
      in_specs=in_specs,
      out_specs=pl.BlockSpec((None, tb, block_slots), lambda bi, ti, si: (bi, ti, si)),
      out_shape=jax.ShapeDtypeStruct((b, padded, s), jnp.float32),
      compiler_params=_compiler_params(backend),
      interpret=backend == "interpret",
      name=KERNEL_NAME,
  )(*inputs)
  return out[:, :t]


def _kernel(q_ref, k_ref, w_ref, *refs, tokens: int, heads: int, scale: float, scaled: bool, bounded: bool,
            block_slots: int):
  refs = list(refs)
  o_ref = refs.pop()
  positions_ref = refs.pop() if bounded else None
  k_scale_ref = refs.pop() if scaled else None
  if not bounded:
    _scores(q_ref, k_ref, w_ref, k_scale_ref, o_ref, tokens=tokens, heads=heads, scale=scale)
    return
  seen = pl.program_id(2) * block_slots <= jnp.max(positions_ref[...])

  @pl.when(seen)
  def _():
    _scores(q_ref, k_ref, w_ref, k_scale_ref, o_ref, tokens=tokens, heads=heads, scale=scale)

  @pl.when(jnp.logical_not(seen))
  def _():
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)


def _scores(q_ref, k_ref, w_ref, k_scale_ref, o_ref, *, tokens: int, heads: int, scale: float):
  keys = k_ref[...]
  if jnp.issubdtype(keys.dtype, jnp.floating) and jnp.finfo(keys.dtype).bits == 8:
    keys = keys.astype(jnp.float32)  # e4m3 → f32 → the dot's dtype: no direct e4m3 → bf16 convert needed
  keys = keys.astype(q_ref.dtype)
  precision = jax.lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
  for t in range(tokens):  # the block's queries, unrolled: one [I, J] × [J, block] dot per query
    rows = slice(t * heads, (t + 1) * heads)
    logits = jax.lax.dot_general(q_ref[rows, :], keys, (((1,), (1,)), ((), ())), precision=precision,
                                 preferred_element_type=jnp.float32)  # [I, block]
    if k_scale_ref is not None:
      logits = logits * k_scale_ref[...]
    o_ref[t:t + 1, :] = jnp.sum(jnp.maximum(logits, 0.0) * w_ref[rows, :], axis=0, keepdims=True) * scale


def _compiler_params(backend: str):
  if backend == "gpu":
    from jax.experimental.pallas import triton as pl_triton  # noqa: PLC0415 (GPU-only module)
    return pl_triton.CompilerParams(num_warps=4, num_stages=2)
  if backend == "tpu":
    from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))
  return None
