"""What the Mosaic GPU kernels share (`index_scores_mgpu.py`, `sparse_mla_mgpu.py`, `fp8_grouped_matmul_mgpu.py`): the
shared-memory layout of a wgmma operand, and their `interpret=` argument."""

from __future__ import annotations

import jax.numpy as jnp


def operand_transforms(plgpu, dtype, minor: int):
  """Tiling + the widest swizzle a [rows, minor] operand of `dtype` takes (wgmma reads it from shared memory).
  `plgpu`: `jax.experimental.pallas.mosaic_gpu`, which the kernels import only when they build a call."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor * bits)
  return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def interpret_params(plgpu, interpret):
  """A kernel's `interpret=` as `plgpu.kernel` takes it: True → Pallas's GPU interpreter with its defaults, a
  `plgpu.InterpretGPUParams` as given (the tests' race detection), False / None → compiled (None)."""
  return (plgpu.InterpretGPUParams() if interpret is True else interpret) or None


CLUSTER_FENCES_PTX = "fence.proxy.async.shared::cluster;\n\tfence.acq_rel.cluster;"


def cluster_fences(plgpu):
  """`fence.proxy.async.shared::cluster` then `fence.acq_rel.cluster`, from every thread that calls it: its
  generic-proxy stores into any CTA of the cluster's shared memory (`plgpu.cluster_ref`) ordered before the
  async-proxy reads there (wgmma, TMA) that a later cluster-barrier arrival releases, at the cluster's scope.
  `plgpu.commit_smem`'s proxy fence names shared::cta only, and a `ClusterBarrier` arrival releases at the CTA's
  scope. Call it before `commit_smem`: a `ClusterBarrier` arrival comes from one or two threads of the warpgroup, so
  every storing thread's fences must precede the warpgroup barrier those threads pass (`commit_smem` ends with it)."""
  from jax._src.lib.mlir import ir  # noqa: PLC0415 (Mosaic GPU's MLIR, as inline_mgpu bodies use it)
  from jax._src.lib.mlir.dialects import llvm  # noqa: PLC0415

  @plgpu.inline_mgpu()
  def fences(ctx):
    del ctx
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [], CLUSTER_FENCES_PTX, "", has_side_effects=True)

  fences()  # (the decorator returns the wrapper: only a call binds it into the kernel)
