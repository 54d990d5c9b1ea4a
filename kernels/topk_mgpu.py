"""The DSA indexer's k-th largest score per query on Pallas's Mosaic GPU backend: the radix select of
`jax_mtp.topk.topk_selection_radix` in one kernel, where XLA's form is ~90 small kernels a layer (issue 27).

    kth[b, t] = the k-th largest of order_key(scores[b, t, s]) over s ≤ positions[b, t] (invisible slots: −inf's key)

`order_key` maps fp32 scores to uint32 keys whose unsigned order is the scores' order (`topk.order_keys`). A CTA
takes one query's row: its scores are read once from HBM into shared memory as keys, then 16 passes of 2-bit digits
each count, for the three candidates of the next digit, the keys at or above them (per-thread partial counts in
registers, one warpgroup reduction each), and keep the largest digit whose count still reaches k. Each pass reads
the keys from shared memory, not HBM: XLA's form reads the row from L2 / HBM in each of its 16 passes and launches
~5 kernels a pass. The compaction (the slots above the k-th key, ties to the lowest) stays in XLA
(`topk.select_from_kth`).

Why: on an H100 at verification's 256 queries over a 32K cache, XLA's radix select took 345 µs a layer, 5 % of the
verification forward at B = 64 (274 kernels a step over 3 layers). How far this got, and why not further (a row runs
on one warpgroup): benchmarks/RESULTS.md and docs/mosaic_gpu_notes.md, 2026-12-06.

Keys are held as signed int32: the unsigned key with its top bit flipped has the same order, and int32 arrays are
what the kernel was written and checked with (Pallas's GPU interpreter, both jax versions' CUDA lowering, the H100).
The row lives in shared memory, so a row of S slots takes 4·S bytes of it: S ≤ MAX_SLOTS.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mtp.kernels.mosaic_gpu_common import interpret_params

KERNEL_NAME = "dsa_topk_kth_mgpu"
MAX_SLOTS = 49152  # 192 KiB of keys in shared memory (a Hopper CTA holds up to 227 KiB)
_FLIP = np.int32(np.uint32(0x80000000).view(np.int32))  # unsigned → signed order: x ^ 0x80000000
_NEG_INF_KEY = np.int32(np.uint32(0xFF800000 ^ 0x7FFFFFFF).view(np.int32))  # −inf's key, signed (order_keys's ^ flip)


# Keys a warpgroup holds in registers at once (32 … 1 a thread), widest first: a pass's loop step. A CTA runs one
# warpgroup (its row's keys fill shared memory), so its latency is hidden only by the independent work within a
# thread: wider steps put more loads and compares in flight.
CHUNKS = (4096, 2048, 1024, 512, 256, 128)


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch parameters. `chunk` = 0: `config_for` picks it."""

  chunk: int = 0  # keys a pass's loop step holds in registers (a multiple of 128 dividing S, ≤ 4,096)


def config_for(slots: int, config: Config | None = None) -> Config:
  """The widest of CHUNKS dividing `slots` (the fewest loop steps a pass), unless `config` names one."""
  config = config or Config()
  if config.chunk:
    return config
  return dataclasses.replace(config, chunk=next((c for c in CHUNKS if slots % c == 0), CHUNKS[-1]))


def takes(slots: int) -> list[str]:
  """Why the kernel cannot take a row of `slots` (empty: it can)."""
  problems = []
  if slots % CHUNKS[-1]:
    problems.append(f"{slots} slots are not a multiple of {CHUNKS[-1]}")
  if slots > MAX_SLOTS:
    problems.append(f"{slots} slots exceed MAX_SLOTS={MAX_SLOTS} (a row's keys stay in shared memory)")
  return problems


def reference(scores_BTS: jax.Array, positions_BT: jax.Array, k: int) -> jax.Array:
  """uint32 [B, T]: each query's k-th largest key, by a sort (independent of the radix select)."""
  bits = lax.bitcast_convert_type(scores_BTS.astype(jnp.float32), jnp.uint32)
  keys = jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))
  visible = jnp.arange(scores_BTS.shape[-1]) <= positions_BT[..., None]
  keys = jnp.where(visible, keys, jnp.uint32(0x007FFFFF))  # −inf's key
  return jnp.sort(keys, axis=-1)[..., scores_BTS.shape[-1] - k]


def check_operands(scores_BTS: jax.Array, positions_BT: jax.Array, k: int, config: Config) -> None:
  """A ValueError naming the offending value where the kernel cannot take these operands."""
  b, t, s = scores_BTS.shape
  if scores_BTS.dtype != jnp.float32:
    raise ValueError(f"scores {scores_BTS.dtype}: the kernel takes float32 scores")
  if positions_BT.shape != (b, t):
    raise ValueError(f"positions_BT of shape {positions_BT.shape} does not match the scores' queries {(b, t)}")
  if takes(s) or config.chunk % 128 or s % config.chunk or config.chunk > CHUNKS[0]:
    raise ValueError(f"{s} slots with chunk={config.chunk}: {'; '.join(takes(s)) or f'chunk must be a multiple of 128 dividing them, ≤ {CHUNKS[0]}'}")
  if not 1 <= k <= s:
    raise ValueError(f"k={k} must be in [1, {s}]")


def kth_key_mgpu(scores_BTS: jax.Array, positions_BT: jax.Array, k: int, *, config: Config | None = None,
                 interpret=False) -> jax.Array:
  """uint32 [B, T]: each query's k-th largest order key over its visible slots (slot ≤ its position), as
  `reference`. `interpret`: Pallas's GPU interpreter (any host: the tests)."""
  from jax.experimental import pallas as pl  # noqa: PLC0415
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  config = config_for(scores_BTS.shape[-1], config)
  check_operands(scores_BTS, positions_BT, k, config)
  b, t, s = scores_BTS.shape
  ch = config.chunk
  chunks = s // ch
  scores = scores_BTS.reshape(b * t, s)
  positions = positions_BT.reshape(b * t).astype(jnp.int32)

  def body(scores_gmem, positions_gmem, kth_gmem, keys_smem, out_smem):
    row = lax.axis_index("q")
    position = positions_gmem[row]

    @pl.loop(0, chunks)
    def _(c):  # the row's scores → signed keys, invisible slots at −inf's
      bits = lax.bitcast_convert_type(scores_gmem[row, pl.ds(c * ch, ch)], jnp.int32)
      keys = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
      slots = lax.broadcasted_iota(jnp.int32, (ch,), 0) + c * ch
      keys_smem[pl.ds(c * ch, ch)] = jnp.where(slots <= position, keys, _NEG_INF_KEY)

    plgpu.commit_smem()
    kth = jnp.int32(0)  # the k-th key so far, unsigned domain (as int32 bits)
    for shift in range(30, -1, -2):
      candidates = [(kth | np.int32(np.uint32(d << shift).view(np.int32))) ^ _FLIP for d in (1, 2, 3)]

      def count(c, counts, candidates=candidates):
        keys = keys_smem[pl.ds(c * ch, ch)]
        return tuple(n + jnp.where(keys >= cand, 1, 0) for n, cand in zip(counts, candidates, strict=True))

      zeros = jnp.zeros((ch,), jnp.int32)
      counts = lax.fori_loop(0, chunks, count, (zeros, zeros, zeros))
      digit = sum(jnp.where(jnp.sum(n) >= k, 1, 0) for n in counts)
      kth = kth | (jnp.int32(digit) << shift)
    out_smem[...] = jnp.broadcast_to(kth, out_smem.shape)  # a scalar is not stored to GMEM: a 512-byte row is copied
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, kth_gmem.at[row])
    plgpu.wait_smem_to_gmem(0)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((b * t, 128), jnp.int32),
      scratch_types=[plgpu.SMEM((s,), jnp.int32), plgpu.SMEM((128,), jnp.int32)],
      grid=(b * t,),
      grid_names=("q",),
      kernel_name=KERNEL_NAME,
      interpret=interpret_params(plgpu, interpret),
  )
  kth = kernel(scores, positions)[:, 0]
  return lax.bitcast_convert_type(kth, jnp.uint32).reshape(b, t)
