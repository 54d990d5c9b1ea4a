"""Opt-1 on TPU: one Mosaic kernel that all-reduces the tp partials by remote DMA, adds the
residual and applies RMSNorm, so the reduced sum never round-trips HBM.

Rows are processed in blocks of `block_rows` (a grid over T). For each block, on every device:

    1. barrier      signal every peer, wait for n−1 signals: all peers are inside this block, so
                    they have finished reading their receive buffer for the previous block
    2. push         remote-DMA my partial block into slot `me` of every peer's receive buffer
                    (VMEM [n, rows, D]); copy it into my own slot
    3. wait         my n−1 sends, and the n−1 incoming slots
    4. reduce+norm  acc = Σ_j slot[j] in the fixed order j = 0..n−1 (fp32), so every device gets
                    bit-identical results; h = residual + acc; out = rmsnorm(h) · weight

One-shot per block: each device sends (n−1)·rows·D elements and receives as many; for the decode
sizes (T ≤ 256 rows of D = 7168) that is one to four blocks and the latency is one DMA round.
Signals from a peer already in the next block can only arrive after every peer signalled this
block (it passed this block's barrier), so counting semaphores keep the barrier exact.
For large T, `algorithm="two_shot"` runs the reduce-scatter + all-gather form instead
(`fused_allreduce_rmsnorm_tpu_two_shot.py`), which sends 3/n as many bytes. The barrier, the VMEM
budget and the norm expression both forms use are in `fused_allreduce_rmsnorm_tpu_common.py`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu_common import VMEM_BUDGET, VMEM_LIMIT, barrier, rmsnorm
from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu_two_shot import fused_allreduce_rmsnorm_tpu_two_shot

KERNEL_NAME = "fused_allreduce_rmsnorm_tpu"
ALGORITHMS = ("one_shot", "two_shot")
_COLLECTIVE_ID = 7  # kernels with the same communication pattern may share an id


def block_rows(t: int, d: int, n: int, itemsize: int) -> int:
  """Rows per block: all of T when it fits the VMEM budget, else the largest multiple of 8 that does."""
  per_row = d * (n * itemsize + 2 * 3 * itemsize + 2 * 2 * itemsize)  # recv slots, 3 in, 2 out (x2 buffers)
  fit = max(8, (VMEM_BUDGET // per_row) // 8 * 8)
  return t if t <= fit else fit


def _exchange(x_ref, recv_ref, send_sems, recv_sems, me, n: int, axis: str) -> None:
  """Phases 2–3: every device ends with all n partial blocks in `recv_ref`."""
  copies = []
  for k in range(1, n):
    peer = lax.rem(me + k, n)
    copy = pltpu.make_async_remote_copy(src_ref=x_ref, dst_ref=recv_ref.at[me], send_sem=send_sems.at[k],
                                        recv_sem=recv_sems.at[me], device_id={axis: peer})
    copy.start()
    copies.append(copy)
  recv_ref[me] = x_ref[...]
  for copy in copies:
    copy.wait_send()
  for k in range(1, n):  # a descriptor with the incoming shape, used only to wait on slot `src`
    src = lax.rem(me + k, n)
    pltpu.make_async_remote_copy(src_ref=x_ref, dst_ref=recv_ref.at[src], send_sem=send_sems.at[0],
                                 recv_sem=recv_sems.at[src], device_id={axis: src}).wait_recv()


def _kernel(x_ref, res_ref, w_ref, normed_ref, new_res_ref, *scratch, n: int, axis: str | None, eps: float):
  if n > 1:
    recv_ref, send_sems, recv_sems = scratch
    me = lax.axis_index(axis)
    barrier(me, n, axis)
    _exchange(x_ref, recv_ref, send_sems, recv_sems, me, n, axis)
    acc = recv_ref[0].astype(jnp.float32)
    for j in range(1, n):
      acc = acc + recv_ref[j].astype(jnp.float32)
  else:
    acc = x_ref[...].astype(jnp.float32)
  h = res_ref[...].astype(jnp.float32) + acc
  new_res_ref[...] = h.astype(new_res_ref.dtype)
  normed_ref[...] = rmsnorm(h, w_ref, eps).astype(normed_ref.dtype)


def fused_allreduce_rmsnorm_tpu(x_partial_TD, residual_TD, weight_D, eps: float, *, axis_name: str | None,
                                interpret=None, algorithm: str = "one_shot"):
  """(normed, new_residual) on TPU (or TPU interpret mode: `interpret=pltpu.InterpretParams(...)`).

  algorithm: "one_shot" (this module) or "two_shot" (reduce-scatter + all-gather, for large T;
  `fused_allreduce_rmsnorm_tpu_two_shot.py`). With one device there is nothing to reduce and both
  are this module's local add + norm.
  """
  if algorithm not in ALGORITHMS:
    raise ValueError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
  t, d = x_partial_TD.shape
  n = 1 if axis_name is None else lax.axis_size(axis_name)
  if algorithm == "two_shot" and n > 1:
    return fused_allreduce_rmsnorm_tpu_two_shot(x_partial_TD, residual_TD, weight_D, eps, axis_name=axis_name,
                                                interpret=interpret)
  rows = block_rows(t, d, n, x_partial_TD.dtype.itemsize)
  row_block = pl.BlockSpec((rows, d), lambda i: (i, 0))
  scratch = []
  if n > 1:
    scratch = [pltpu.VMEM((n, rows, d), x_partial_TD.dtype), pltpu.SemaphoreType.DMA((n,)),
               pltpu.SemaphoreType.DMA((n,))]
  params = dict(collective_id=_COLLECTIVE_ID, has_side_effects=True) if n > 1 else {}
  kernel = functools.partial(_kernel, n=n, axis=axis_name, eps=eps)
  out_shape = jax.ShapeDtypeStruct((t, d), x_partial_TD.dtype)
  return pl.pallas_call(
      kernel,
      grid=(pl.cdiv(t, rows),),
      in_specs=[row_block, row_block, pl.BlockSpec((1, d), lambda i: (0, 0))],
      out_specs=(row_block, row_block),
      out_shape=(out_shape, out_shape),
      scratch_shapes=scratch,
      # "arbitrary": blocks run in order on one core; every device walks the blocks in lockstep.
      compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=VMEM_LIMIT,
                                           **params),
      interpret=interpret,
      name=KERNEL_NAME,
  )(x_partial_TD, residual_TD, weight_D.reshape(1, d))
