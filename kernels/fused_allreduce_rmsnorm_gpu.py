"""Opt-1 on NVIDIA Hopper (H100/H200): one Mosaic GPU kernel that all-reduces the tp partials by
peer-to-peer NVLink stores, adds the residual and applies RMSNorm.

A grid of G CTAs, one warpgroup (128 threads) each; CTA g owns the rows g, g+G, g+2G, ...
With n > 1 devices G = min(T, 132): every CTA is resident, so no spin-wait can starve a CTA that
was never scheduled; with n = 1, G = T. Per CTA, on every device (n > 1):

    1. barrier      signal this CTA's `entry` semaphore on every peer, wait for n−1 signals: the
                    peers' CTA g is inside this call, so it no longer reads its receive rows from
                    an earlier call
    2. push         for each of my rows: load my partial row, store it into slot `me` of every
                    peer's receive buffer (`plgpu.remote_ref`, plain st.global over NVLink) and of
                    my own
    3. wait         signal `data` on every peer — the signal lowers to a warpgroup bar.sync then
                    one red.release.sys, so all 128 threads' stores are visible before it lands —
                    and wait for n−1 signals (fence.acquire.sys, then bar.sync)
    4. reduce+norm  per row, in 1024-column chunks: acc = Σ_j slot[j] in the fixed order
                    j = 0..n−1 in fp32, so every device gets bit-identical results;
                    h = residual + acc → new_residual; Σh² over the row → inv_rms;
                    normed = h · inv_rms · weight

A row lives in registers (D/128 fp32 values per thread, in the `WG_STRIDED` layout: thread i holds
the 16-byte vectors i, i+128, ...), so each row is read once and no SMEM staging is needed; the
128-thread sum of squares is Mosaic's warp shuffle + SMEM reduction. `wait` uses `decrement`, so
both semaphores end every call at zero. With n = 1 (axis None or a 1-device axis) phases 1–3 vanish
and the kernel is the fused residual add + RMSNorm; only that path runs in GPU interpret mode
(interpret mode has no semaphores).

D that is not a multiple of 128 is zero-padded by the wrapper (zeros add nothing to Σh²; the mean
divides by the true D) and the outputs are sliced back. Never uses NVLink multicast.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

KERNEL_NAME = "fused_allreduce_rmsnorm_gpu"
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
MAX_D = 16384  # a row is kept in registers: D/128 fp32 values per thread
MAX_CTAS = 132  # SMs on an H100/H200 SXM
_LANES = 128  # threads in a warpgroup
_CHUNK = 1024  # columns per register chunk


def validate_gpu_inputs(x_partial_TD, residual_TD, weight_D) -> None:
  """What the GPU kernel supports beyond `validate_inputs`: bf16/fp32, 1 ≤ T, 1 ≤ D ≤ MAX_D."""
  t, d = x_partial_TD.shape
  if jnp.dtype(x_partial_TD.dtype) not in DTYPES:
    raise ValueError(f"dtype {x_partial_TD.dtype} is not supported by {KERNEL_NAME}; use one of "
                     f"{[str(dt) for dt in DTYPES]}")
  if weight_D.dtype != x_partial_TD.dtype:
    raise ValueError(f"weight dtype {weight_D.dtype} != activation dtype {x_partial_TD.dtype}")
  if t < 1 or not 1 <= d <= MAX_D:
    raise ValueError(f"shape (T={t}, D={d}) is not supported by {KERNEL_NAME}: need T ≥ 1 and "
                     f"1 ≤ D ≤ {MAX_D} (a row is held in registers)")


def check_gpu_runtime(devices) -> None:
  """The runtime this kernel needs, checked before a model is built on `devices`:

  - NVIDIA Hopper or newer (compute capability ≥ 9.0: Mosaic GPU, `plgpu.remote_ref`);
  - one process driving all the mesh's GPUs (XLA exchanges the peers' buffer pointers: "collective
    metadata", no NVSHMEM needed) or one process per GPU (then NVSHMEM: `nvidia-nvshmem-cu13` and
    `XLA_FLAGS=--xla_gpu_experimental_enable_nvshmem`);
  - NVLink multicast off (NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1): this kernel never uses it.
  """
  devices = list(devices)
  not_gpu = [d for d in devices if d.platform != "gpu"]
  if not_gpu:
    raise RuntimeError(f"impl='pallas_gpu' needs NVIDIA GPUs, but the mesh has {not_gpu[0].platform} devices")
  for device in devices:
    capability = getattr(device, "compute_capability", "0.0")
    if tuple(int(v) for v in str(capability).split(".")[:2]) < (9, 0):
      raise RuntimeError(f"impl='pallas_gpu' needs compute capability ≥ 9.0 (Hopper); {device} has {capability}")
  processes = jax.process_count()
  if processes not in (1, len(devices)):
    raise RuntimeError(f"impl='pallas_gpu' needs 1 process for all GPUs or 1 per GPU; got {processes} processes "
                       f"for {len(devices)} GPUs")


def _chunks(d: int) -> tuple[tuple[int, int], ...]:
  """(start, width) column chunks of a D that is a multiple of 128."""
  width = next(c for c in (_CHUNK, 512, 256, _LANES) if d % c == 0)
  return tuple((c0, width) for c0 in range(0, d, width))


def _load(ref, itemsize: int):
  """A 1-D GMEM slice into registers, 16-byte vectors per thread where the width allows."""
  (width,) = ref.shape
  vec = min(width // _LANES, 16 // itemsize)
  return plgpu.load(ref, layout=plgpu.Layout.WG_STRIDED((width,), vec))


def _peer_barrier(sem, me, n: int, axis: str) -> None:
  """Signal this CTA's `sem` on every peer and wait for theirs; `sem` ends at zero."""
  for k in range(1, n):
    pl.semaphore_signal(sem, 1, device_id={axis: lax.rem(me + k, n)})
  pl.semaphore_wait(sem, n - 1)


def _push_rows(x_ref, recv_ref, rows, me, n: int, axis: str, chunks) -> None:
  """Phase 2: my partial rows into slot `me` of every device's receive buffer (mine included)."""
  @rows
  def _(row):
    xs = [_load(x_ref.at[row, pl.ds(c0, width)], x_ref.dtype.itemsize) for c0, width in chunks]
    for k in range(n):  # k = 0: my own slot
      dst = recv_ref if k == 0 else plgpu.remote_ref(recv_ref, {axis: lax.rem(me + k, n)})
      for (c0, width), x in zip(chunks, xs):
        dst.at[me, row, pl.ds(c0, width)][...] = x


def _add_rmsnorm_rows(slots, res_ref, w_ref, normed_ref, new_res_ref, rows, chunks, d_true, eps) -> None:
  """Phase 4: h = residual + Σ_j slots[j] (fixed order, fp32) → new_residual, rmsnorm(h)·w → normed.
  Every load of a row is issued before its first store (stores may alias loads for the compiler)."""
  itemsize = res_ref.dtype.itemsize

  @rows
  def _(row):
    hs = []
    for c0, width in chunks:
      cols = pl.ds(c0, width)
      acc = _load(slots[0].at[row, cols], itemsize).astype(jnp.float32)
      for slot in slots[1:]:
        acc = acc + _load(slot.at[row, cols], itemsize).astype(jnp.float32)
      hs.append(_load(res_ref.at[row, cols], itemsize).astype(jnp.float32) + acc)
    ws = [_load(w_ref.at[pl.ds(c0, width)], itemsize) for c0, width in chunks]
    sq = hs[0] * hs[0]
    for h in hs[1:]:  # chunks share one layout: sum them elementwise, then one 128-thread reduction
      sq = sq + h * h
    inv_rms = lax.rsqrt(jnp.sum(sq) * (1.0 / d_true) + eps)
    for (c0, width), h, w in zip(chunks, hs, ws):
      cols = pl.ds(c0, width)
      new_res_ref.at[row, cols][...] = h.astype(new_res_ref.dtype)
      normed_ref.at[row, cols][...] = (h * inv_rms * w.astype(jnp.float32)).astype(normed_ref.dtype)


def _kernel(x_ref, res_ref, w_ref, normed_ref, new_res_ref, *rest, n: int, axis: str | None, t: int,
            grid: int, d_true: int, eps: float):
  chunks = _chunks(x_ref.shape[1])
  rows = pl.loop(lax.axis_index("cta"), t, step=grid)
  if n == 1:
    slots = [x_ref]
  else:
    recv_ref, sems = rest
    me = lax.axis_index(axis)
    _peer_barrier(sems.at[0], me, n, axis)
    _push_rows(x_ref, recv_ref, rows, me, n, axis, chunks)
    _peer_barrier(sems.at[1], me, n, axis)
    slots = [recv_ref.at[j] for j in range(n)]
  _add_rmsnorm_rows(slots, res_ref, w_ref, normed_ref, new_res_ref, rows, chunks, d_true, eps)


def fused_allreduce_rmsnorm_gpu(x_partial_TD, residual_TD, weight_D, eps: float, *, axis_name: str | None,
                                interpret=None):
  """(normed, new_residual) [T, D] in x's dtype, inside `shard_map` on Hopper GPUs.

  axis_name None or a 1-device axis: no communication, the fused add + RMSNorm only; that path
  also runs in GPU interpret mode (`interpret=plgpu.InterpretGPUParams(...)`; True means the
  default params — the generic `pallas_call` interpreter cannot run `plgpu.load`).
  """
  validate_gpu_inputs(x_partial_TD, residual_TD, weight_D)
  n = 1 if axis_name is None else lax.axis_size(axis_name)
  if n > 1 and interpret is not None:
    raise ValueError(f"interpret={interpret!r}: GPU interpret mode has no semaphores, so {KERNEL_NAME} "
                     f"runs there only without communication (axis {axis_name!r} has {n} devices)")
  if interpret is True:
    interpret = plgpu.InterpretGPUParams()
  t, d = x_partial_TD.shape
  pad = -d % _LANES
  if pad:
    x_partial_TD, residual_TD = (jnp.pad(a, ((0, 0), (0, pad))) for a in (x_partial_TD, residual_TD))
    weight_D = jnp.pad(weight_D, (0, pad))
  grid = min(t, MAX_CTAS) if n > 1 else t  # spin-waiting CTAs must all be resident
  out = jax.ShapeDtypeStruct((t, d + pad), x_partial_TD.dtype)
  out_type, scratch = (out, out), ()
  if n > 1:
    out_type += (jax.ShapeDtypeStruct((n, t, d + pad), x_partial_TD.dtype),)  # receive buffer
    scratch = (plgpu.SemaphoreType.REGULAR((2,)),)  # per CTA: entry, data
  body = functools.partial(_kernel, n=n, axis=axis_name if n > 1 else None, t=t, grid=grid, d_true=d,
                           eps=float(eps))
  body = functools.update_wrapper(body, _kernel)
  body.__name__ = KERNEL_NAME  # the Mosaic module and kernel are named after the body
  normed, new_residual, *_ = plgpu.kernel(
      body, out_type=out_type, scratch_types=scratch, grid=(grid,), grid_names=("cta",),
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      interpret=interpret,
  )(x_partial_TD, residual_TD, weight_D)
  return (normed[:, :d], new_residual[:, :d]) if pad else (normed, new_residual)
