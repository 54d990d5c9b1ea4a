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
