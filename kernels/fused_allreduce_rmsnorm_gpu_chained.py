"""Opt-1 on Hopper without XLA's per-kernel device barrier: a persistent workspace for a chain of
fused all-reduce + residual + RMSNorm calls inside one jitted program (the k draft steps of a round).

Why: jaxlib runs XLA's multi-GPU barrier before every Mosaic kernel that talks to peers, and at decode
sizes it costs about as much as the kernel itself (benchmarks/RESULTS.md, "Opt-1 on two H200s, this
session"). The barrier is what makes the default protocol safe: every call gets fresh, zero-initialised
semaphores and receive buffers, and no peer can write into them before their owner got there. A chain
can skip it (`CompilerParams(skip_device_barrier=True)`) if the memory peers write into is initialised
once and the protocol itself keeps peers from overwriting what is still being read:

    ws = gpu_workspace(axis, T, D, dtype)      # one sync kernel, behind XLA's barrier
    normed, h = fused_allreduce_rmsnorm_gpu_chained(x, r, w, eps, axis_name=axis, workspace=ws)
    ...                                         # any number of calls, same T, D and dtype: no barrier

The workspace: two `jax.Ref`s, mutated in place by the kernels (XLA threads them as aliased
operands, which also orders the calls on each device's stream). G = CTAs, n = devices:

    recv      [2, n, T, D]     receive buffers, one per call parity: slot j holds device j's partials
    counters  int32 [≥ G·(n+1)] flags[g, j] = counters[g·n + j]: calls in which device j's rows of
                               CTA g have landed here; epoch[g] = counters[G·n + g]: calls CTA g has
                               completed on this device

The sync kernel (`gpu_workspace`) allocates both, zeroes the counters (recv needs no zeroing: a slot
is read only after its call's rows landed) and exchanges one signal with every peer through a
scratch semaphore. XLA zeroes that semaphore and runs its barrier before the kernel, as for any
standalone call.

Call c = epoch[g] + 1 of CTA g on every device: push my rows into slot `me` of recv[c % 2] on every
device (TMA bulk copies, as the standalone protocol), wait for the writes, signal flags[g, me] on
every peer (`red.release.sys`), wait until flags[g, j] ≥ c for every peer j (monotonic: nothing to
reset, and a peer one call ahead cannot be mistaken for this call), reduce + norm from recv[c % 2],
store epoch[g] = c. Why it is safe without the barrier:

  - a peer writes recv[c % 2] again only in call c + 2, which it starts after finishing c + 1,
    which needs my c + 1 signal, which I send after my call c — its reads — has completed;
  - a peer's first write into my workspace follows its sync wait, which follows my zeroing
    (released with my sync signal);
  - every write a peer makes into my workspace in call c precedes (release) its call-c signal,
    which I wait for in call c; the sync kernel waits for its own exchange too: once my last call
    returns, no peer writes into my memory again, so XLA may free or reuse it.

The chain must not be copied by XLA between its kernels (a copy of the counters on my stream could
land after a peer's signal and erase it): `workspace_copies` finds copies of the workspace in a
compiled program, and the GPU tests assert there are none (the refs stay in place).
Needs a 1-D mesh over `axis` (the peers are addressed by their rank in the collective metadata).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_common import (KERNEL_NAME, LANES, add_rmsnorm_rows, chunks,
                                                                communicating_grid, pad_lanes, push_rows_tma,
                                                                stage_scratch, validate_gpu_inputs)

CHAINED_KERNEL_NAME = f"{KERNEL_NAME}_chained"
SYNC_KERNEL_NAME = f"{KERNEL_NAME}_sync"


# Same-shape calls in a program from which chaining them pays: a chain costs a sync kernel and one
# XLA barrier up front, then saves that barrier on every call; two calls do not repay it, three do
# (benchmarks/RESULTS.md, "Opt-1 on two H200s, this session", the short chains).
CHAIN_MIN_CALLS = 3
# Rows up to which calls are chained: decode and verification sizes. The workspace holds 2·n·T·D
# activations for the whole program (a standalone call's n·T·D receive buffer lives for the call).
CHAIN_MAX_ROWS = 256


class GpuWorkspace(NamedTuple):
  """What `gpu_workspace` returns: the refs (module docstring) and the static shape they serve."""
  recv: jax.Ref
  counters: jax.Ref
  axis: str
  rows: int
  cols: int  # D padded to a multiple of 128
  dtype: jnp.dtype


def _counters_size(grid: int, n: int) -> int:
  """flags [G, n] then epoch [G], int32, padded to whole 128-lane rows (one zeroing store each)."""
  return pl.cdiv(grid * (n + 1), LANES) * LANES


def _i32(value: int) -> ir.Value:
  return arith.constant(ir.IntegerType.get_signless(32), value)


def _peer(rank: ir.Value, k: int, n: int) -> ir.Value:
  return arith.remui(arith.addi(rank, _i32(k)), _i32(n))


def _exchange(n: int):
  """flags_n = flags[g], epoch_1 = epoch[g]: signal this call's rows to every peer (flags_n[rank]
  += 1 there, red.release.sys from the thread that issued and waited for the bulk copies, after a
  warpgroup barrier), then wait until flags_n[j] ≥ epoch + 1 for every peer j (poll
  ld.relaxed.sys, then fence.acquire.sys)."""
  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def exchange(ctx, flags_n, epoch_1):
    i32 = ir.IntegerType.get_signless(32)
    rank = ctx.device_id()
    call = arith.addi(memref.load(epoch_1, [arith.constant(ir.IndexType.get(), 0)]), _i32(1))
    mgpu_utils.warpgroup_barrier()
    for k in range(1, n):
      remote = mgpu_utils.memref_ptr(ctx.to_remote(flags_n, _peer(rank, k, n)))
      mgpu_utils.SemaphoreRef(mgpu_utils.getelementptr(remote, [rank], i32)).signal(1)
    for k in range(1, n):
      local = mgpu_utils.getelementptr(mgpu_utils.memref_ptr(flags_n), [_peer(rank, k, n)], i32)
      mgpu_utils.SemaphoreRef(local).wait(call, decrement=False)
  return exchange


def _check_mesh(axis_name: str) -> int:
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.axis_names != (axis_name,):
    raise ValueError(f"{CHAINED_KERNEL_NAME} needs a 1-D mesh over axis {axis_name!r} (peers are addressed by "
                     f"rank); the mesh has axes {mesh.axis_names}")
  n = lax.axis_size(axis_name)
  if n < 2:
    raise ValueError(f"{CHAINED_KERNEL_NAME} is for tp ≥ 2; axis {axis_name!r} has {n} device (use "
                     f"fused_allreduce_rmsnorm_gpu, which needs no communication there)")
  return n


def _sync_kernel(counters_ref, recv_ref, sem, *, n: int, axis: str):
  """Zero the counters (recv needs none: a slot is read only after its call's rows landed), then
  exchange a signal with every peer through a scratch semaphore: XLA zeroes it and runs its device
  barrier before this kernel, and the exchange is waited for, so no write is left in flight.
  A peer's first chained call follows its wait here, which follows my zeroing (released)."""
  del recv_ref  # an output only: allocated here, written by the chain
  zeros = jnp.zeros((LANES,), jnp.int32)
  for start in range(0, counters_ref.shape[0], LANES):
    counters_ref[pl.ds(start, LANES)] = zeros
  me = lax.axis_index(axis)
  for k in range(1, n):
    pl.semaphore_signal(sem, 1, device_id={axis: lax.rem(me + k, n)})
  pl.semaphore_wait(sem, n - 1)


def gpu_workspace(axis_name: str, rows: int, cols: int, dtype) -> GpuWorkspace:
  """A workspace for chained calls on [rows, cols] activations of `dtype`: allocated, zeroed and
  synchronised across the axis by one kernel behind XLA's barrier. Call inside `shard_map`, once
  per jitted program that chains the calls."""
  n = _check_mesh(axis_name)
  if rows < 1 or cols < 1:
    raise ValueError(f"workspace shape ({rows}, {cols}) must be positive")
  dtype, padded, grid = jnp.dtype(dtype), cols + (-cols % LANES), communicating_grid(rows)
  body = functools.partial(_sync_kernel, n=n, axis=axis_name)
  body = functools.update_wrapper(body, _sync_kernel)
  body.__name__ = SYNC_KERNEL_NAME
  counters, recv = plgpu.kernel(
      body, out_type=(jax.ShapeDtypeStruct((_counters_size(grid, n),), jnp.int32),
                      jax.ShapeDtypeStruct((2, n, rows, padded), dtype)),
      scratch_types=(plgpu.SemaphoreType.REGULAR,), grid=(1,), grid_names=("cta",),
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
  )()
  return GpuWorkspace(recv=jax.new_ref(recv), counters=jax.new_ref(counters), axis=axis_name, rows=rows,
                      cols=padded, dtype=dtype)


def workspace_for_chain(impl: str, axis_name: str | None, axis_size: int, calls: int, rows: int, cols: int,
                        dtype) -> GpuWorkspace | None:
  """The workspace that `calls` same-shape [rows, cols] calls of one program share, or None where
  chaining does not apply or pay: impl other than "pallas_gpu", fewer than 2 devices, fewer than
  CHAIN_MIN_CALLS calls, more than CHAIN_MAX_ROWS rows. Call inside `shard_map`."""
  if impl != "pallas_gpu" or axis_name is None or axis_size < 2:
    return None
  if calls < CHAIN_MIN_CALLS or rows > CHAIN_MAX_ROWS:
    return None
  return gpu_workspace(axis_name, rows, cols, dtype)


def _kernel(x_ref, res_ref, w_ref, recv_ref, counters_ref, normed_ref, new_res_ref, stage, bars, *, n: int,
            axis: str, t: int, grid: int, d_true: int, eps: float):
  cta = lax.axis_index("cta")
  epoch_at = grid * n + cta
  call = counters_ref[epoch_at] + 1
  parity = lax.rem(call, 2)
  push_rows_tma(x_ref, recv_ref, stage, bars, lax.axis_index(axis), n, axis, t, grid, lead=(parity,))
  _exchange(n)(counters_ref.at[pl.ds(cta * n, n)], counters_ref.at[pl.ds(epoch_at, 1)])
  rows = pl.loop(cta, t, step=grid)
  slots = [recv_ref.at[parity, j] for j in range(n)]
  add_rmsnorm_rows(slots, res_ref, w_ref, normed_ref, new_res_ref, rows, chunks(x_ref.shape[1]), d_true, eps)
  counters_ref[epoch_at] = call


def _check_workspace(ws: GpuWorkspace, axis_name: str, x_partial_TD, padded: int) -> None:
  if not isinstance(ws, GpuWorkspace):
    raise TypeError(f"workspace must be a GpuWorkspace from gpu_workspace(), got {type(ws).__name__}")
  got = (axis_name, x_partial_TD.shape[0], padded, jnp.dtype(x_partial_TD.dtype))
  want = (ws.axis, ws.rows, ws.cols, ws.dtype)
  if got != want:
    raise ValueError(f"workspace is for (axis, T, padded D, dtype) = {want}; this call has {got}")


def fused_allreduce_rmsnorm_gpu_chained(x_partial_TD, residual_TD, weight_D, eps: float, *, axis_name: str,
                                        workspace: GpuWorkspace):
  """(normed, new_residual) as `fused_allreduce_rmsnorm_gpu`, without XLA's device barrier: the
  workspace's protocol (module docstring) orders the peers. Inside `shard_map`, on Hopper GPUs."""
  validate_gpu_inputs(x_partial_TD, residual_TD, weight_D)
  n = _check_mesh(axis_name)
  t, d = x_partial_TD.shape
  x_partial_TD, residual_TD, weight_D = pad_lanes(x_partial_TD, residual_TD, weight_D)
  padded = x_partial_TD.shape[1]
  _check_workspace(workspace, axis_name, x_partial_TD, padded)
  grid = communicating_grid(t)
  out = jax.ShapeDtypeStruct((t, padded), x_partial_TD.dtype)
  body = functools.partial(_kernel, n=n, axis=axis_name, t=t, grid=grid, d_true=d, eps=float(eps))
  body = functools.update_wrapper(body, _kernel)
  body.__name__ = CHAINED_KERNEL_NAME
  normed, new_residual = plgpu.kernel(
      body, out_type=(out, out), scratch_types=stage_scratch(t, padded, grid, jnp.dtype(out.dtype)),
      grid=(grid,), grid_names=("cta",),
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, skip_device_barrier=True),
  )(x_partial_TD, residual_TD, weight_D, workspace.recv, workspace.counters)
  return (normed[:, :d], new_residual[:, :d]) if padded != d else (normed, new_residual)


def workspace_copies(compiled_hlo: str, ws_shapes: list[str]) -> list[str]:
  """The `copy` instructions of a compiled (optimised) HLO module whose shape is one of
  `ws_shapes` (e.g. "s32[1,2]"): a copy of the workspace between chained kernels breaks the
  protocol (module docstring)."""
  copies = [line.strip() for line in compiled_hlo.splitlines() if " copy(" in line or "copy-start(" in line]
  return [line for line in copies if any(f"= {shape}" in line or f"{shape}{{" in line for shape in ws_shapes)]
