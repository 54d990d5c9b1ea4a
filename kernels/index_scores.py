"""The DSA indexer's scores: the op, its XLA reference and one Pallas kernel that keeps the [B, T, I, S] logits out
of HBM (q·k on the matrix units, ReLU and the weighted sum over the indexer heads in registers).

    I[b, t, s] = scale · Σ_i w[b, t, i] · ReLU(q[b, t, i] · k[b, s] · k_scale[b, s])

`reference` is XLA's formulation (a dot that writes fp32 logits, then a fusion that reads them back: 64 heads × 4
bytes per (query, slot) against the 2 bytes of key a step must read), in slot chunks so the logits never exist
whole; it is also the model's "xla" impl. `index_scores_pallas` is the kernel for TPUs (and Pallas's interpreter):
each program reads one block of `Config.block_slots` keys once and writes its query block's scores over them. On
GPUs the op runs in `kernels/index_scores_mgpu.py` (Pallas Mosaic GPU); this kernel's form on Pallas's Triton
backend, which JAX has deprecated, was removed once the Mosaic one measured 1.2–2× faster on the H200 (issue 28).

Grid (B, T / block_tokens, S / block_slots); a query block's q [tb·I, J] and w [tb·I, 1] stay resident while the
row's keys stream past them. With the queries' positions (`positions_BT`, the interpret backend) a program
whose slot block starts past its query block's last position writes zeros without reading keys: those slots are
invisible to every query of the block (slot s holds position s), so a prefill chunk scores only the causal part of
the cache (half of it on average over a prompt) and an early decode step only the slots written so far.
Keys enter the dot in q's dtype (bf16 in a bf16 model; float8 keys are widened through fp32 first) with fp32
accumulation; per-key fp8 scales multiply the fp32 logits.
`backend`: "tpu" (Mosaic TPU) or "interpret" (any host, for tests). `MtpConfig.index_scores_impl` picks the kernel or the
reference (`jax_mtp.indexer.resolve_index_scores_impl`); measurements: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

KERNEL_NAME = "dsa_index_scores"
BACKENDS = ("tpu", "interpret")


@dataclasses.dataclass(frozen=True)
class Config:
  """The kernel's launch parameters. `block_tokens` is an upper bound: `config_for` sets what a call runs."""

  block_slots: int = 256  # slots per program; the cache capacity must be a multiple (indexer.kernel_capacity)
  block_tokens: int = 4  # queries per program (RESULTS, issue 27: 4 beat 8 and 16 at a 2,048-token chunk)


def config_for(tokens: int, backend: str, config: Config | None = None) -> Config:
  """The launch of a `tokens`-query call: on TPUs the whole T is one block (Mosaic blocks are 8-row multiples or
  the whole dimension); in the interpreter the largest power of two ≤ min(T, block_tokens)."""
  config = config or Config()
  block = tokens if backend == "tpu" else 1 << (min(tokens, config.block_tokens).bit_length() - 1)
  return dataclasses.replace(config, block_tokens=block)


def check_operands(q_BTIJ, k_BSJ, w_BTI, *, k_scale_BS, positions_BT, config: Config, backend: str) -> None:
  """A ValueError naming the offending value where the kernel cannot take these operands."""
  b, t, _, _ = q_BTIJ.shape
  s = k_BSJ.shape[1]
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
  if s % config.block_slots:
    raise ValueError(f"cache capacity {s} is not a multiple of block_slots={config.block_slots}")
  check_shapes(q_BTIJ, k_BSJ, w_BTI, k_scale_BS)
  if config.block_tokens < 1:
    raise ValueError(f"block_tokens={config.block_tokens} must be ≥ 1")
  if positions_BT is not None and (backend == "tpu" or positions_BT.shape != (b, t)):
    raise ValueError(f"positions_BT of shape {positions_BT.shape} cannot bound the slots on backend={backend!r} "
                     f"(it needs shape {(b, t)} and the gpu or interpret backend)")


def check_shapes(q_BTIJ, k_BSJ, w_BTI, k_scale_BS=None) -> None:
  """A ValueError naming the shapes where the op's operands do not agree (q [B, T, I, J], k [B, S, J], w [B, T, I],
  k_scale [B, S]): the reference's and every kernel's first check."""
  b, t, i, j = q_BTIJ.shape
  s = k_BSJ.shape[1]
  if k_BSJ.shape != (b, s, j) or w_BTI.shape != (b, t, i):
    raise ValueError(f"shapes q {q_BTIJ.shape}, k {k_BSJ.shape}, w {w_BTI.shape} do not agree")
  if k_scale_BS is not None and k_scale_BS.shape != (b, s):
    raise ValueError(f"k_scale_BS of shape {k_scale_BS.shape} does not match the keys' {(b, s)}")


def reference(q_BTIJ: jax.Array, k_BSJ: jax.Array, w_BTI: jax.Array, scale: float, *, chunk: int | None = None,
              k_scale_BS: jax.Array | None = None, dot_dtype=jnp.float32) -> jax.Array:
  """fp32 [B, T, S] index scores by XLA, `chunk` slots at a time (None: all at once). `k_scale_BS`: per-token
  scales of float8 keys.

  q and the keys enter the q·k dot in `dot_dtype` with fp32 accumulation: float32 is exact (HIGHEST); bfloat16 (a
  bf16 model's) rounds q as the keys already are, runs on the matrix units and never writes an up-cast copy of the
  keys (the official kernel rounds both to FP8)."""
  check_shapes(q_BTIJ, k_BSJ, w_BTI, k_scale_BS)
  b, s, j = k_BSJ.shape
  if chunk is not None and chunk < 1:
    raise ValueError(f"chunk={chunk} must be ≥ 1 (None: every slot at once)")
  precision = jax.lax.Precision.HIGHEST if jnp.dtype(dot_dtype) == jnp.float32 else jax.lax.Precision.DEFAULT
  q_BTIJ, w_BTI = q_BTIJ.astype(dot_dtype), w_BTI.astype(jnp.float32)

  def scores(chunk_keys):
    k_BCJ, k_scale_BC = chunk_keys  # k_scale_BC: None for unscaled keys
    logits_BTIC = jnp.einsum("btij,bcj->btic", q_BTIJ, k_BCJ.astype(dot_dtype), precision=precision,
                             preferred_element_type=jnp.float32)
    if k_scale_BC is not None:
      logits_BTIC = logits_BTIC * k_scale_BC[:, None, None, :]  # per-key scale: outside the dot, exact
    return jnp.einsum("btic,bti->btc", jax.nn.relu(logits_BTIC) * scale, w_BTI, precision=jax.lax.Precision.HIGHEST)

  if chunk is None or chunk >= s:
    return scores((k_BSJ, k_scale_BS))

  def chunked(x_BS_):  # [B, S, ...] → [chunks, B, chunk, ...], zero-padded past S
    x_BS_ = jnp.pad(x_BS_, [(0, 0), (0, chunks * chunk - s)] + [(0, 0)] * (x_BS_.ndim - 2))
    return x_BS_.reshape(b, chunks, chunk, *x_BS_.shape[2:]).swapaxes(0, 1)

  chunks = -(-s // chunk)
  scales = None if k_scale_BS is None else chunked(k_scale_BS)
  scores_NBTC = jax.lax.map(scores, (chunked(k_BSJ), scales))
  return jnp.moveaxis(scores_NBTC, 0, 2).reshape(b, q_BTIJ.shape[1], chunks * chunk)[..., :s]


def index_scores_pallas(q_BTIJ: jax.Array, k_BSJ: jax.Array, w_BTI: jax.Array, scale: float, *,
                        k_scale_BS: jax.Array | None = None, positions_BT: jax.Array | None = None,
                        config: Config | None = None, backend: str = "tpu") -> jax.Array:
  """fp32 [B, T, S] index scores by the kernel (S a multiple of `config.block_slots`); queries go in blocks of
  `config_for`'s size (a grid axis; T padded to a whole number of blocks), so any T compiles to one program body.
  `positions_BT` (int32, optional): each query's position; scores of slots past a query block's last position are
  then 0 (not computed) instead of their q·k values — callers mask those slots as invisible anyway."""
  b, t, i, j = q_BTIJ.shape
  s = k_BSJ.shape[1]
  config = config_for(t, backend, config)
  check_operands(q_BTIJ, k_BSJ, w_BTI, k_scale_BS=k_scale_BS, positions_BT=positions_BT, config=config,
                 backend=backend)
  tb, block_slots = config.block_tokens, config.block_slots
  padded = -(-t // tb) * tb  # padding queries have zero weights: their scores are 0 and dropped
  q = jnp.pad(q_BTIJ, [(0, 0), (0, padded - t), (0, 0), (0, 0)]).reshape(b, padded * i, j)
  w = jnp.pad(w_BTI.astype(jnp.float32), [(0, 0), (0, padded - t), (0, 0)]).reshape(b, padded * i, 1)
  inputs = [q, k_BSJ, w]
  # query blocks outside slot blocks: a row's keys (S·J·2 bytes, 8 MiB at 32K) stay in L2 across query blocks
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
      compiler_params=_compiler_params(backend, config),
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


def _compiler_params(backend: str, config: Config):
  del config
  if backend == "tpu":
    from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))
  return None
