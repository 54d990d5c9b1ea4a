"""What the two Hopper Opt-1 kernels share: the standalone call (`fused_allreduce_rmsnorm_gpu.py`) and
the chained one (`fused_allreduce_rmsnorm_gpu_chained.py`) differ only in how peers are ordered; the
inputs they take, their grid, phase 2 (push by bulk copies) and phase 4 (reduce + add + RMSNorm) are
here. The phases are numbered as in `fused_allreduce_rmsnorm_gpu.py`'s docstring.

A grid of G CTAs, one warpgroup (128 threads) each; CTA g owns the rows g, g+G, g+2G, ... A CTA that
spin-waits on peers must never wait on a CTA that was not scheduled, so a communicating kernel runs
G = min(T, resident CTAs) (`communicating_grid`). A row lives in registers in phase 4 (D/128 fp32
values per thread, in the `WG_STRIDED` layout: thread i holds the 16-byte vectors i, i+128, ...).
D that is not a multiple of 128 is zero-padded (`pad_lanes`: zeros add nothing to Σh²; the mean
divides by the true D).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

KERNEL_NAME = "fused_allreduce_rmsnorm_gpu"  # the standalone kernel; the chained ones add a suffix
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
MAX_D = 16384  # a row is kept in registers: D/128 fp32 values per thread
SXM_SMS = 132  # SMs on an H100/H200 SXM: the grid bound when the mesh does not say
LANES = 128  # threads in a warpgroup
CHUNK = 1024  # columns per register chunk
STAGE_BYTES = 160 * 1024  # SMEM for the staged rows of `push_rows_tma` (227 KiB per SM)


def validate_gpu_inputs(x_partial_TD, residual_TD, weight_D) -> None:
  """What the GPU kernels support beyond `check_operands`: bf16/fp32, 1 ≤ T, 1 ≤ D ≤ MAX_D."""
  t, d = x_partial_TD.shape
  if jnp.dtype(x_partial_TD.dtype) not in DTYPES:
    raise ValueError(f"dtype {x_partial_TD.dtype} is not supported by {KERNEL_NAME}; use one of "
                     f"{[str(dt) for dt in DTYPES]}")
  if weight_D.dtype != x_partial_TD.dtype:
    raise ValueError(f"weight dtype {weight_D.dtype} != activation dtype {x_partial_TD.dtype}")
  if t < 1 or not 1 <= d <= MAX_D:
    raise ValueError(f"shape (T={t}, D={d}) is not supported by {KERNEL_NAME}: need T ≥ 1 and "
                     f"1 ≤ D ≤ {MAX_D} (a row is held in registers)")


def resident_ctas() -> int:
  """CTAs that can all be resident at once (one per SM: SMEM use allows no more), so spin-waiting
  CTAs never wait on one that is not scheduled: the SM count of the mesh's devices (`num_cores`,
  e.g. 114 on an H100 PCIe), or SXM_SMS where it is not known (an abstract mesh without it)."""
  cores = jax.sharding.get_abstract_mesh().abstract_device
  cores = None if cores is None else cores.num_cores
  return SXM_SMS if cores is None else int(cores)


def communicating_grid(t: int) -> int:
  """CTAs of a kernel whose CTAs spin-wait on peers: one per row up to `resident_ctas()`, so all
  are resident."""
  return min(t, resident_ctas())


def pad_lanes(x_partial_TD, residual_TD, weight_D):
  """Zero-pads D to a multiple of 128 (zeros add nothing to Σh²; the mean divides by the true D)."""
  pad = -x_partial_TD.shape[1] % LANES
  if not pad:
    return x_partial_TD, residual_TD, weight_D
  x_partial_TD, residual_TD = (jnp.pad(a, ((0, 0), (0, pad))) for a in (x_partial_TD, residual_TD))
  return x_partial_TD, residual_TD, jnp.pad(weight_D, (0, pad))


def chunks(d: int) -> tuple[tuple[int, int], ...]:
  """(start, width) column chunks of a D that is a multiple of 128."""
  width = next(c for c in (CHUNK, 512, 256, LANES) if d % c == 0)
  return tuple((c0, width) for c0 in range(0, d, width))


def load(ref, itemsize: int):
  """A 1-D GMEM slice into registers, 16-byte vectors per thread where the width allows."""
  (width,) = ref.shape
  vec = min(width // LANES, 16 // itemsize)
  return plgpu.load(ref, layout=plgpu.Layout.WG_STRIDED((width,), vec))


def stage_scratch(t: int, d: int, grid: int, dtype) -> tuple:
  """`push_rows_tma`'s SMEM: B row slots (B·D·itemsize ≤ STAGE_BYTES) and their TMA barriers."""
  slots = max(1, min(pl.cdiv(t, grid), STAGE_BYTES // (d * dtype.itemsize)))
  return plgpu.SMEM((slots, d), dtype), plgpu.Barrier(num_barriers=slots)


def push_rows_tma(x_ref, recv_ref, stage, bars, me, n: int, axis: str, t: int, grid: int, lead=()) -> None:
  """Phase 2 by bulk copies: B = len(stage) of my rows at a time GMEM → SMEM (TMA), then SMEM →
  slot `me` of every device's receive buffer (peers first, mine last), one elected thread.
  `lead`: indices before (slot, row) in the receive buffer (the chained workspace's call parity).
  Returns once the writes are complete (not only read), so phase 3 may signal."""
  slots, cta = stage.shape[0], lax.axis_index("cta")

  @pl.loop(0, pl.cdiv(t, grid), step=slots)
  def _(i0):
    batch = [(s, cta + (i0 + s) * grid) for s in range(slots)]
    for s, row in batch:
      @pl.when(row < t)
      def _():
        plgpu.copy_gmem_to_smem(x_ref.at[row], stage.at[s], bars.at[s],
                                oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
    for s, row in batch:
      @pl.when(row < t)
      def _():
        plgpu.barrier_wait(bars.at[s])
        for k in (*range(1, n), 0):
          dst = recv_ref if k == 0 else plgpu.remote_ref(recv_ref, {axis: lax.rem(me + k, n)})
          plgpu.copy_smem_to_gmem(stage.at[s], dst.at[(*lead, me, row)])
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the slots may be refilled
  plgpu.wait_smem_to_gmem(0)  # the writes are complete: phase 3 may signal


def add_rmsnorm_rows(slots, res_ref, w_ref, normed_ref, new_res_ref, rows, row_chunks, d_true, eps) -> None:
  """Phase 4: h = residual + Σ_j slots[j] (fixed order j = 0..n−1, fp32, so every device gets
  bit-identical results) → new_residual; rmsnorm(h)·w → normed. `rows` is the CTA's row loop,
  `row_chunks` the `chunks` of the padded D, `d_true` the D the mean divides by. Every load of a row
  is issued before its first store (stores may alias loads for the compiler)."""
  itemsize = res_ref.dtype.itemsize

  @rows
  def _(row):
    hs = []
    for c0, width in row_chunks:
      cols = pl.ds(c0, width)
      acc = load(slots[0].at[row, cols], itemsize).astype(jnp.float32)
      for slot in slots[1:]:
        acc = acc + load(slot.at[row, cols], itemsize).astype(jnp.float32)
      hs.append(load(res_ref.at[row, cols], itemsize).astype(jnp.float32) + acc)
    ws = [load(w_ref.at[pl.ds(c0, width)], itemsize) for c0, width in row_chunks]
    sq = hs[0] * hs[0]
    for h in hs[1:]:  # chunks share one layout: sum them elementwise, then one 128-thread reduction
      sq = sq + h * h
    inv_rms = lax.rsqrt(jnp.sum(sq) * (1.0 / d_true) + eps)
    for (c0, width), h, w in zip(row_chunks, hs, ws):
      cols = pl.ds(c0, width)
      new_res_ref.at[row, cols][...] = h.astype(new_res_ref.dtype)
      normed_ref.at[row, cols][...] = (h * inv_rms * w.astype(jnp.float32)).astype(normed_ref.dtype)
