"""Opt-1 on NVIDIA Hopper (H100/H200): one Mosaic GPU kernel that all-reduces the tp partials by
peer-to-peer NVLink copies, adds the residual and applies RMSNorm.

A grid of G CTAs, one warpgroup (128 threads) each; CTA g owns the rows g, g+G, g+2G, ...
With n > 1 devices G = min(T, SMs) (`resident_ctas`): every CTA is resident, so no spin-wait can
starve a CTA that was never scheduled; with n = 1, G = T. Per CTA, on every device (n > 1):

    1. barrier      not in the production protocol (why below); only in the benchmarks' variant
                    entry_barrier=True (the original protocol): signal this CTA's `entry` semaphore
                    on every peer, wait for n−1 signals
    2. push         my partial rows into slot `me` of every peer's receive buffer and of my own.
                    Production (push="tma"): B rows at a time, TMA-load each row GMEM → SMEM
                    (mbarrier), then one elected thread bulk-copies it SMEM → GMEM of each device
                    (`copy_smem_to_gmem` to a `remote_ref`: one contiguous cp.async.bulk per row
                    and device, no registers); the B slots (B·D·itemsize ≤ 160 of 227 KiB) are
                    refilled once read. The benchmarks' variant push="st": per-thread registers →
                    16-byte st.global.
    3. wait         signal `data` on every peer (a warpgroup bar.sync, then red.release.sys by the
                    same elected thread that issued the bulk copies and, before it, waited for
                    their writes: cp.async.bulk.wait_group 0, not .read; an async op's completion
                    carries an implicit generic-async proxy fence, so the release covers the rows —
                    the pattern jax's own Mosaic GPU collective matmul uses), wait for n−1
                    (fence.acquire.sys)
    4. reduce+norm  per row, in 1024-column chunks: acc = Σ_j slot[j] in the fixed order
                    j = 0..n−1 in fp32, so every device gets bit-identical results;
                    h = residual + acc → new_residual; Σh² over the row → inv_rms;
                    normed = h · inv_rms · weight

Why phase 1 is not needed: jaxlib launches a Mosaic GPU kernel that uses XLA's collective metadata
(as every `remote_ref` does) right after XLA's multi-GPU barrier on the same stream, unless the
kernel's `plgpu.CompilerParams(skip_device_barrier=True)` (not set here — the chained variant,
fused_allreduce_rmsnorm_gpu_chained.py, sets it and orders the peers through a persistent
workspace). That barrier kernel ends on a device only once every peer has reached it, i.e. has
finished all its earlier stream work: its previous call (which read its receive buffer) and the
zero-init of this call's semaphores (`plgpu.alloc_semaphore`'s documentation relies on the same
guarantee). So no peer still touches what we write; the entry barrier, whose zeroed semaphore needs
that barrier anyway, adds nothing.

A row lives in registers in phase 4 (D/128 fp32 values per thread, in the `WG_STRIDED` layout:
thread i holds the 16-byte vectors i, i+128, ...); the 128-thread sum of squares is Mosaic's warp
shuffle + SMEM reduction. `wait` uses `decrement`, so the semaphores end every call at zero. With
n = 1 (axis None or a 1-device axis) phases 1–3 vanish and the kernel is the fused residual add +
RMSNorm; only that path runs in GPU interpret mode (interpret mode has no semaphores).

D that is not a multiple of 128 is zero-padded by the wrapper (zeros add nothing to Σh²; the mean
divides by the true D) and the outputs are sliced back. Never uses NVLink multicast.

The input limits, the grid, the padding, phase 2 by bulk copies and phase 4 are shared with the chained
kernel through `fused_allreduce_rmsnorm_gpu_common.py`; this module holds the standalone protocol.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_common import (KERNEL_NAME, add_rmsnorm_rows, chunks, communicating_grid,
                                                                load, pad_lanes, push_rows_tma, stage_scratch,
                                                                validate_gpu_inputs)

PUSH_MODES = ("tma", "st")  # phase 2's protocols: production's first, the other for benchmarks/


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


def _peer_barrier(sem, me, n: int, axis: str) -> None:
  """Signal this CTA's `sem` on every peer and wait for theirs; `sem` ends at zero."""
  for k in range(1, n):
    pl.semaphore_signal(sem, 1, device_id={axis: lax.rem(me + k, n)})
  pl.semaphore_wait(sem, n - 1)


def _push_rows(x_ref, recv_ref, rows, me, n: int, axis: str, row_chunks) -> None:
  """Phase 2: my partial rows into slot `me` of every device's receive buffer (mine included)."""
  @rows
  def _(row):
    xs = [load(x_ref.at[row, pl.ds(c0, width)], x_ref.dtype.itemsize) for c0, width in row_chunks]
    for k in range(n):  # k = 0: my own slot
      dst = recv_ref if k == 0 else plgpu.remote_ref(recv_ref, {axis: lax.rem(me + k, n)})
      for (c0, width), x in zip(row_chunks, xs):
        dst.at[me, row, pl.ds(c0, width)][...] = x


def _kernel(x_ref, res_ref, w_ref, normed_ref, new_res_ref, *rest, n: int, axis: str | None, t: int,
            grid: int, d_true: int, eps: float, push: str, entry_barrier: bool):
  row_chunks = chunks(x_ref.shape[1])
  rows = pl.loop(lax.axis_index("cta"), t, step=grid)
  if n == 1:
    slots = [x_ref]
  else:
    recv_ref, sems, *stage_bars = rest
    me = lax.axis_index(axis)
    if entry_barrier:
      _peer_barrier(sems.at[1], me, n, axis)
    if push == "tma":
      push_rows_tma(x_ref, recv_ref, *stage_bars, me, n, axis, t, grid)
    else:
      _push_rows(x_ref, recv_ref, rows, me, n, axis, row_chunks)
    _peer_barrier(sems.at[0], me, n, axis)
    slots = [recv_ref.at[j] for j in range(n)]
  add_rmsnorm_rows(slots, res_ref, w_ref, normed_ref, new_res_ref, rows, row_chunks, d_true, eps)


def _scratch(n: int, t: int, d: int, grid: int, dtype, push: str, entry_barrier: bool) -> tuple:
  """Per CTA: the semaphores (data[, entry]); with push="tma" also B row slots in SMEM + barriers."""
  if n == 1:
    return ()
  sems = (plgpu.SemaphoreType.REGULAR((2 if entry_barrier else 1,)),)
  return sems if push == "st" else sems + stage_scratch(t, d, grid, dtype)


def fused_allreduce_rmsnorm_gpu(x_partial_TD, residual_TD, weight_D, eps: float, *, axis_name: str | None,
                                interpret=None):
  """(normed, new_residual) [T, D] in x's dtype, inside `shard_map` on Hopper GPUs.

  axis_name None or a 1-device axis: no communication, the fused add + RMSNorm only; that path
  also runs in GPU interpret mode (`interpret=plgpu.InterpretGPUParams(...)`; True means the
  default params — the generic `pallas_call` interpreter cannot run `plgpu.load`).
  """
  return with_protocol(x_partial_TD, residual_TD, weight_D, eps, axis_name=axis_name, interpret=interpret,
                        push=PUSH_MODES[0], entry_barrier=False)


def with_protocol(x_partial_TD, residual_TD, weight_D, eps: float, *, axis_name: str | None, interpret,
                   push: str, entry_barrier: bool):
  """`fused_allreduce_rmsnorm_gpu` with its n > 1 protocol chosen (module docstring): push in
  PUSH_MODES, entry_barrier. The public wrapper runs the production one ("tma", False);
  benchmarks/fused_allreduce_rmsnorm.py times the others ("st" + True is the original protocol) and
  tests/test_fused_allreduce_rmsnorm_gpu.py lowers and runs each."""
  validate_gpu_inputs(x_partial_TD, residual_TD, weight_D)
  if push not in PUSH_MODES:
    raise ValueError(f"push={push!r} is not one of {PUSH_MODES}")
  if not isinstance(entry_barrier, bool):
    raise ValueError(f"entry_barrier={entry_barrier!r} must be a bool")
  n = 1 if axis_name is None else lax.axis_size(axis_name)
  if n > 1 and interpret is not None:
    raise ValueError(f"interpret={interpret!r}: GPU interpret mode has no semaphores, so {KERNEL_NAME} "
                     f"runs there only without communication (axis {axis_name!r} has {n} devices)")
  if interpret is True:
    interpret = plgpu.InterpretGPUParams()
  t, d = x_partial_TD.shape
  x_partial_TD, residual_TD, weight_D = pad_lanes(x_partial_TD, residual_TD, weight_D)
  pad = x_partial_TD.shape[1] - d
  grid = communicating_grid(t) if n > 1 else t
  out = jax.ShapeDtypeStruct((t, d + pad), x_partial_TD.dtype)
  out_type = (out, out) + ((jax.ShapeDtypeStruct((n, t, d + pad), out.dtype),) if n > 1 else ())  # + receive
  scratch = _scratch(n, t, d + pad, grid, jnp.dtype(out.dtype), push, entry_barrier)
  body = functools.partial(_kernel, n=n, axis=axis_name if n > 1 else None, t=t, grid=grid, d_true=d,
                           eps=float(eps), push=push, entry_barrier=entry_barrier)
  body = functools.update_wrapper(body, _kernel)
  body.__name__ = KERNEL_NAME  # the Mosaic module and kernel are named after the body
  normed, new_residual, *_ = plgpu.kernel(
      body, out_type=out_type, scratch_types=scratch, grid=(grid,), grid_names=("cta",),
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      interpret=interpret,
  )(x_partial_TD, residual_TD, weight_D)
  return (normed[:, :d], new_residual[:, :d]) if pad else (normed, new_residual)
