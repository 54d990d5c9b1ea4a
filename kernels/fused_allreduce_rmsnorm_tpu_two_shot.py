"""Opt-1 on TPU, large T: the two-shot (reduce-scatter + all-gather) form of the fused kernel in
`fused_allreduce_rmsnorm_tpu.py`, with the residual add and RMSNorm done between the two shots.

Rows are processed in blocks of `B = two_shot_rows(...)` rows, a multiple of n·sublanes. Block row
range j·B/n … (j+1)·B/n is chunk j, owned by device j (RMSNorm needs whole rows, so chunks are row
ranges). For each block, on every device `me`:

    1. barrier         as the one-shot: every peer is inside this block, done with the last one
    2. reduce-scatter  remote-DMA chunk p of my partial block into slot `me` of peer p's `part`
                       buffer (VMEM [n, B/n, D]); copy my own chunk into my slot; wait
    3. reduce+norm     acc = Σ_j part[j] in the fixed order j = 0..n−1 (fp32), h = residual + acc,
                       normed = rmsnorm(h)·weight, only for my B/n rows (the one-shot's order, so
                       new_residual is bit-identical to it; the row mean may round differently)
    4. all-gather      write (normed, h) of my chunk into slot `me` of `gath` (VMEM [n, 2, B/n, D]),
                       remote-DMA that slot to every peer; wait; copy the n slots into the out block

Bytes each device sends per block: (n−1)/n·B·D partials + 2·(n−1)/n·B·D finished rows (normed and
new_residual), about 3·(n−1)/n·B·D against the one-shot's (n−1)·B·D: less for n ≥ 4. Every device
ends with rows computed once, by their owner, so outputs are bit-identical across devices.
The barrier runs every block although, after the first, the gather round already keeps peers
within one block of each other: it is one signal round and keeps the argument the one-shot's.
The two shots use separate receive semaphores: a fast peer's gather DMA may land while its
reduce-scatter DMA to me is still counting, and DMA semaphores count bytes, not copies.
T smaller than one block (n·sublanes rows) is zero-padded to it; partial last blocks read
unspecified rows past T, which stay in their own rows and are never written back.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu_common import VMEM_BUDGET, VMEM_LIMIT, barrier, rmsnorm

KERNEL_NAME = "fused_allreduce_rmsnorm_tpu_two_shot"
_COLLECTIVE_ID = 8  # its own barrier, apart from the one-shot's


def sublanes(itemsize: int) -> int:
  """Rows of one native VMEM tile: 8 for 32-bit, 16 for bf16 (two rows packed per sublane)."""
  return 8 * max(1, 4 // itemsize)


def two_shot_rows(t: int, d: int, n: int, itemsize: int) -> int:
  """Rows per block: a multiple of n·sublanes, so every chunk is whole tiles at a tile-aligned
  offset, within the VMEM budget, and no larger than T (no block overhangs the whole array)."""
  unit = n * sublanes(itemsize)
  per_row = d * itemsize * (1 + 2 + 2 * 2 + 2 * 2)  # part, gath, 2 in + 2 out (double-buffered)
  fit = max(unit, VMEM_BUDGET // per_row // unit * unit)
  return max(unit, min(fit, t // unit * unit))


def _push_to_peers(src_of, dst_ref, send_sems, recv_sems, me, n: int, axis: str) -> None:
  """Remote-DMA `src_of(peer)` into slot `me` of `dst_ref` on every peer, then wait for my sends
  and for the n−1 slots the peers push into mine."""
  copies = []
  for k in range(1, n):
    peer = lax.rem(me + k, n)
    copy = pltpu.make_async_remote_copy(src_ref=src_of(peer), dst_ref=dst_ref.at[me], send_sem=send_sems.at[k],
                                        recv_sem=recv_sems.at[me], device_id={axis: peer})
    copy.start()
    copies.append(copy)
  for copy in copies:
    copy.wait_send()
  for k in range(1, n):  # a descriptor with the incoming shape, used only to wait on slot `src`
    src = lax.rem(me + k, n)
    pltpu.make_async_remote_copy(src_ref=dst_ref.at[src], dst_ref=dst_ref.at[src], send_sem=send_sems.at[0],
                                 recv_sem=recv_sems.at[src], device_id={axis: src}).wait_recv()


def _kernel(x_ref, res_ref, w_ref, normed_ref, new_res_ref, part_ref, gath_ref, send_sems, rs_sems, ag_sems, *,
            n: int, axis: str, eps: float):
  c = part_ref.shape[1]
  me = lax.axis_index(axis)
  chunk = lambda j: pl.ds(pl.multiple_of(j * c, c), c)  # noqa: E731
  barrier(me, n, axis)
  part_ref[me] = x_ref[chunk(me), :]
  _push_to_peers(lambda peer: x_ref.at[chunk(peer)], part_ref, send_sems, rs_sems, me, n, axis)
  acc = part_ref[0].astype(jnp.float32)
  for j in range(1, n):
    acc = acc + part_ref[j].astype(jnp.float32)
  h = res_ref[chunk(me), :].astype(jnp.float32) + acc
  gath_ref[me, 0] = rmsnorm(h, w_ref, eps).astype(gath_ref.dtype)
  gath_ref[me, 1] = h.astype(gath_ref.dtype)
  _push_to_peers(lambda peer: gath_ref.at[me], gath_ref, send_sems, ag_sems, me, n, axis)
  for j in range(n):
    normed_ref[pl.ds(j * c, c), :] = gath_ref[j, 0]
    new_res_ref[pl.ds(j * c, c), :] = gath_ref[j, 1]


def fused_allreduce_rmsnorm_tpu_two_shot(x_partial_TD, residual_TD, weight_D, eps: float, *, axis_name: str,
                                         interpret=None):
  """(normed, new_residual) by reduce-scatter + all-gather over `axis_name` (size ≥ 2)."""
  t, d = x_partial_TD.shape
  n = lax.axis_size(axis_name)
  if n < 2:
    raise ValueError(f"the two-shot kernel needs ≥ 2 devices on {axis_name!r}, got {n}")
  dtype = x_partial_TD.dtype
  rows = two_shot_rows(t, d, n, dtype.itemsize)
  pad = max(0, rows - t)  # only when T < n·sublanes: a few rows, so the block never overhangs T
  x, res = (jnp.pad(a, ((0, pad), (0, 0))) for a in (x_partial_TD, residual_TD))
  row_block = pl.BlockSpec((rows, d), lambda i: (i, 0))
  out_shape = jax.ShapeDtypeStruct((t + pad, d), dtype)
  normed, new_res = pl.pallas_call(
      functools.partial(_kernel, n=n, axis=axis_name, eps=eps),
      grid=(pl.cdiv(t + pad, rows),),
      in_specs=[row_block, row_block, pl.BlockSpec((1, d), lambda i: (0, 0))],
      out_specs=(row_block, row_block),
      out_shape=(out_shape, out_shape),
      scratch_shapes=[pltpu.VMEM((n, rows // n, d), dtype), pltpu.VMEM((n, 2, rows // n, d), dtype),
                      pltpu.SemaphoreType.DMA((n,)), pltpu.SemaphoreType.DMA((n,)), pltpu.SemaphoreType.DMA((n,))],
      # "arbitrary": blocks run in order on one core; every device walks the blocks in lockstep.
      compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=VMEM_LIMIT,
                                           collective_id=_COLLECTIVE_ID, has_side_effects=True),
      interpret=interpret,
      name=KERNEL_NAME,
  )(x, res, weight_D.reshape(1, d))
  return (normed[:t], new_res[:t]) if pad else (normed, new_res)
