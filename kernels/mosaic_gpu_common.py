"""What the Mosaic GPU kernels share (`index_scores_mgpu.py`, `sparse_mla_mgpu.py`): the shared-memory layout of a
wgmma operand."""

from __future__ import annotations

import jax.numpy as jnp


def operand_transforms(plgpu, dtype, minor: int):
  """Tiling + the widest swizzle a [rows, minor] operand of `dtype` takes (wgmma reads it from shared memory).
  `plgpu`: `jax.experimental.pallas.mosaic_gpu`, which the kernels import only when they build a call."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor * bits)
  return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)
